//! The sm_100a hardware probes (`diag/kernel/src/probe_sm100.rs`) in the device model, against
//! expectations that share no code with the model: the TMEM image after `tcgen05.cp` built from
//! CuTe's `tmem_sf_frg` strides, the operand tiles from the TMA's 128-byte swizzle written as
//! address bits, the accumulator from a naive product of the decoded inputs. The same probes run
//! on a B200 and are compared with the model byte for byte by `tests/tests/gpu_probe_sm100.rs`.

use nvfp4_gemm_abi::launch::LaunchGeometry;
use nvfp4_gemm_abi::scale_layout::BLOCK_BYTES;
use nvfp4_gemm_abi::sm100::Fp4MapLayout;
use nvfp4_gemm_abi::tensor_map::{TensorMap, TiledMap};
use nvfp4_gemm_diag::probe::sm100::*;
use nvfp4_gemm_diag::probe::{ModelRules, ProbeKernel, ProbeTarget};
use nvfp4_gemm_model_tests::{ModelTarget, ProbeBuf};

/// The TMEM bytes `tcgen05.cp.32x128b.warpx4` leaves for scale tiles copied block after block
/// (block `j` at 4j columns from the first copy's), `[lane][byte]` from the first copy's column
/// on, built from CuTe's `tmem_sf_frg` (CUTLASS `atom/mma_traits_sm100_frag.hpp`, the 4×1
/// "ScaleFactorDuplicated4by1" mode): in its virtual TMEM addressing (lane stride 1, byte-column
/// stride 128) the scale of row `mn = r + 32g` (`r < 32`), K block `s`, copy `rep < 4` sits at
/// `r·1 + g·512 + rep·32 + s·128`, i.e. lane `v % 128`, byte column `v / 128` (4 per 32-bit
/// column). Consecutive blocks form one 256-row tile (`g < 8`), as the MMA reads SFB for
/// N = 256. A block holds its 128 rows × 4 scales in the 128x4 layout: byte
/// `(mn%32)·16 + (mn/32)·4 + s`.
fn tmem_sf_frg_image(blocks: &[u8]) -> Vec<Vec<u8>> {
    let n_blocks = blocks.len() / BLOCK_BYTES as usize;
    let mut img = vec![vec![0u8; 16 * n_blocks]; 128];
    for tile in (0..n_blocks).step_by(2) {
        let tile_rows = if tile + 1 < n_blocks { 256 } else { 128 };
        for mn in 0..tile_rows {
            let (r, g) = (mn % 32, mn / 32);
            let block = &blocks[(tile + g / 4) * BLOCK_BYTES as usize..];
            for s in 0..4 {
                for rep in 0..4 {
                    let v = r + g * 512 + rep * 32 + s * 128;
                    img[v % 128][16 * tile + v / 128] = block[r * 16 + (g % 4) * 4 + s];
                }
            }
        }
    }
    img
}

#[test]
fn model_probe_tmem_copies_match_cute_tmem_sf_frg() {
    for case in tmem_cases() {
        let out = run_tmem(&ModelTarget::default(), &case).unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let w = words(&out);
        assert_eq!(w[w.len() - 1], PROBE_OK, "{}: status", case.name);
        let cells = chunk_cells(&w[..w.len() - 1]);
        let golden = tmem_sf_frg_image(&case.blocks());
        // The window starts this many columns after the first copy's column.
        let skip = (TMEM_PROBE_WINDOW - tmem_probe_copy_column(0, case.shift)) as usize;
        for (lane, row) in cells.iter().enumerate() {
            for (col, &cell) in row.iter().enumerate() {
                let at = 4 * (skip + col);
                let want = u32::from_le_bytes(golden[lane][at..at + 4].try_into().unwrap());
                assert_eq!(cell, want, "{}: TMEM lane {lane}, column {}", case.name, TMEM_PROBE_WINDOW as usize + col);
            }
        }
    }
}

/// Where byte `b` of row `r` of a 128-byte-swizzled box lands (PTX ISA 9.0 §5.5.7, 128B mode, as
/// address bits: the 16-byte chunk index XOR the row's index within its 8-row group).
fn swizzled_128b(r: usize, b: usize) -> usize {
    r * 128 + (((b / 16) ^ (r % 8)) * 16) + b % 16
}

/// The shared-memory image of a `box_rows` × 256-value box at `(row0, k0)` of the packed operand
/// `values` (`rows` × `k`): bytes past the tensor are zero (PTX ISA 9.0 §5.5.3.3).
fn box_image(values: &[u8], rows: u32, k: u32, box_rows: u32, row0: u32, k0: u32) -> Vec<u8> {
    let mut img = vec![0u8; box_rows as usize * 128];
    for r in 0..box_rows {
        for b in 0..128u32 {
            let (row, byte) = (row0 + r, k0 / 2 + b);
            if row < rows && byte < k / 2 {
                img[swizzled_128b(r as usize, b as usize)] = values[(row * k / 2 + byte) as usize];
            }
        }
    }
    img
}

/// The exact product the probe's MMAs compute: `Σ_k a·sa·b·sb` over the case's steps.
fn naive_product(case: &UmmaCase) -> Vec<Vec<f32>> {
    let element = |rows: u32, salt: u32, row: u32, k: u32| {
        if row < rows && k < case.k {
            e2m1_value(operand_code(row, k, salt)) * SCALE_CODES[scale_index(row, k / 16, salt)].1
        } else {
            0.0
        }
    };
    (0..128)
        .map(|m| {
            (0..case.n)
                .map(|n| {
                    let ks = case.k0..case.k0 + 64 * case.steps();
                    ks.map(|k| element(case.a_rows, 0, m, k) * element(case.b_rows, 1, n, k)).sum::<f64>() as f32
                })
                .collect()
        })
        .collect()
}

#[test]
fn model_probe_umma_tiles_and_accumulator_match_the_isa() {
    for case in umma_cases() {
        let out = run_umma(&ModelTarget::default(), &case).unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let s = case.sections();
        let want_a = box_image(&case.values(0), case.a_rows, case.k, 128, 0, case.k0);
        let want_b = box_image(&case.values(1), case.b_rows, case.k, case.n, 0, case.k0);
        assert!(out[s[0].1.clone()] == want_a[..], "{}: A tile", case.name);
        assert!(out[s[1].1.clone()] == want_b[..], "{}: B tile", case.name);
        let acc = words(&out[s[2].1.clone()]);
        let want = naive_product(&case);
        for chunk in 0..case.n / 128 {
            let per_chunk = (4 * LD_WORDS_PER_WARP_CHUNK) as usize;
            let cells = chunk_cells(&acc[chunk as usize * per_chunk..(chunk as usize + 1) * per_chunk]);
            for (m, row) in cells.iter().enumerate() {
                for (c, &cell) in row.iter().enumerate() {
                    let n = 128 * chunk as usize + c;
                    assert_eq!(f32::from_bits(cell), want[m][n], "{}: D[{m}][{n}]", case.name);
                }
            }
        }
        assert_eq!(words(&out[s[3].1.clone()]), [PROBE_OK], "{}: status", case.name);
    }
}

#[test]
fn model_probe_multicast_gives_every_cta_the_box() {
    for case in multicast_cases() {
        let out = run_multicast(&ModelTarget::default(), &case).unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let want =
            box_image(&packed_operand(case.rows, case.k, 2), case.rows, case.k, case.box_rows, case.row0, case.k0);
        let s = case.sections();
        for rank in 0..MULTICAST_PROBE_CLUSTER as usize {
            assert!(out[s[2 * rank].1.clone()] == want[..], "{}: CTA {rank}'s box", case.name);
            let gathered = if rank == 0 { PROBE_OK } else { 0 };
            assert_eq!(
                words(&out[s[2 * rank + 1].1.clone()]),
                [PROBE_OK, gathered, rank as u32, MULTICAST_PROBE_CLUSTER],
                "{}: CTA {rank}'s log",
                case.name
            );
        }
    }
}

/// The model holding every case to strict mode.
struct StrictModel(ModelTarget);

impl ProbeTarget for StrictModel {
    type Buf = ProbeBuf;
    fn upload(&self, bytes: &[u8]) -> Result<ProbeBuf, String> {
        self.0.upload(bytes)
    }
    fn addr(&self, buf: &ProbeBuf) -> u64 {
        self.0.addr(buf)
    }
    fn download(&self, buf: &ProbeBuf) -> Result<Vec<u8>, String> {
        self.0.download(buf)
    }
    fn encode<const R: usize>(&self, map: &TiledMap<R>, base: u64) -> Result<TensorMap, String> {
        self.0.encode(map, base)
    }
    fn launch(
        &self,
        kernel: ProbeKernel,
        geometry: LaunchGeometry,
        params: ProbeParams,
        _: ModelRules,
    ) -> Result<(), String> {
        self.0.launch(kernel, geometry, params, ModelRules::Strict)
    }
}

/// Every probe case the model runs under the ISA's rules only is one strict mode rejects, with a
/// message naming the rule; CUTLASS's operand LBO is accepted.
#[test]
fn model_strict_mode_rejects_exactly_the_probe_variants() {
    for case in tmem_cases() {
        let r = run_tmem(&StrictModel(ModelTarget::default()), &case);
        match case.rules() {
            ModelRules::Strict => assert!(r.is_ok(), "{}: {r:?}", case.name),
            ModelRules::Isa => {
                let e = r.expect_err(case.name);
                assert!(e.contains("strict mode") && e.contains("tcgen05.cp"), "{}: {e}", case.name);
            }
        }
    }
    for case in umma_cases() {
        let r = run_umma(&StrictModel(ModelTarget::default()), &case);
        match case.rules() {
            ModelRules::Strict => assert!(r.is_ok(), "{}: {r:?}", case.name),
            ModelRules::Isa => {
                let e = r.expect_err(case.name);
                assert!(e.contains("strict mode"), "{}: {e}", case.name);
            }
        }
    }
    let cutlass = umma_cases().into_iter().find(|c| c.operand_lbo == 16).expect("the CUTLASS LBO case");
    assert_eq!(cutlass.rules(), ModelRules::Strict);
    assert!(umma_cases().iter().any(|c| c.layout == Fp4MapLayout::Flat2d && c.k < 256), "a box wider than K");
}
