//! The sm_100a hardware probes (`diag/kernel/src/probe_sm100.rs`): their cases, inputs and outputs, run
//! on any [`ProbeTarget`] — the first B200 ([`super::GpuTarget`]) or the device model — with the
//! same bytes, so that `tests/tests/gpu_probe_sm100.rs` can compare the two byte for byte and
//! `model-tests/tests/model_probe_sm100.rs` can compare the model's outputs with expectations
//! written from the ISA and CuTe.
//!
//! Every value a case sends is built from the GEMM's own encodings (`nvfp4_gemm_abi::sm100`:
//! tensor maps, descriptors, TMEM plan, instruction descriptor), plus per case at most one of the
//! variants the model's strict mode rejects (an LBO the ISA calls unused, scale columns off the
//! 4-column grid); those cases run in the model under the ISA's rules only ([`ModelRules::Isa`]),
//! so that the B200 says whether strict mode may be relaxed.
//!
//! Also here: [`plan_tensor_maps`], every sm_100a tensor map the library's plans build, for the
//! driver's encoder (`tests/tests/gpu_tensor_maps_sm100.rs`) and the model's
//! (`model-tests/tests/model_tensor_maps.rs`).

use super::{compare_bytes, element_bytes, pattern, ModelRules, ProbeKernel, ProbeTarget};
use nvfp4_gemm::layout::{Fp4Map, Sm100DeviceLayout, Sm100Layout};
use nvfp4_gemm::moe::{MoeProblem, TokenLayout};
use nvfp4_gemm::problem::{GroupShape, OutputType, Problem};
use nvfp4_gemm_abi::scale_layout::{self, BLOCK_BYTES};
use nvfp4_gemm_abi::sm100::config::BLOCK_M;
use nvfp4_gemm_abi::sm100::scale::scale_block_offset;
use nvfp4_gemm_abi::sm100::{Fp4MapLayout, Fp4TensorMap, KernelConfig};
use nvfp4_gemm_abi::tensor_map::{TensorMap, TensorMapDataType, TiledMap};
pub use nvfp4_gemm_diag_abi::probe::sm100::*;
use std::ops::Range;

/// UE4M3 codes of the probes' scales: 0.5, 1, 2 and 4 (exponent bias 7, no mantissa), so that
/// every product and partial sum is exact in f32 whatever the tensor core's summation order.
pub const SCALE_CODES: [(u8, f64); 4] = [(0x30, 0.5), (0x38, 1.0), (0x40, 2.0), (0x48, 4.0)];

/// The value of an e2m1 code (PTX ISA 9.0 §9.7.16.10.4.6; sign in bit 3).
pub fn e2m1_value(code: u8) -> f64 {
    const MAGNITUDE: [f64; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    let m = MAGNITUDE[(code & 7) as usize];
    if code & 8 != 0 {
        -m
    } else {
        m
    }
}

/// The e2m1 code of element `(row, k)` of a probe operand (`salt` tells A from B): every code,
/// both signs.
pub fn operand_code(row: u32, k: u32, salt: u32) -> u8 {
    ((row * 7 + k * 3 + salt * 5 + row * k / 11) % 16) as u8
}

/// The index into [`SCALE_CODES`] of the scale of `(row, 16-value block kb)` of a probe operand.
pub fn scale_index(row: u32, kb: u32, salt: u32) -> usize {
    ((row + 3 * kb + salt + row / 32) % 4) as usize
}

/// `rows × k` e2m1 values packed two per byte (element `2i` in the low nibble), row-major: the
/// global memory image the FP4 maps describe.
pub fn packed_operand(rows: u32, k: u32, salt: u32) -> Vec<u8> {
    (0..rows)
        .flat_map(|r| (0..k / 2).map(move |i| operand_code(r, 2 * i, salt) | operand_code(r, 2 * i + 1, salt) << 4))
        .collect()
}

/// `rows × k` scales in the 128x4 blocked layout (`nvfp4_gemm_abi::scale_layout`), rows padded to
/// 128 with code 1.0.
pub fn blocked_scales(rows: u32, k: u32, salt: u32) -> Vec<u8> {
    let rest_k = scale_layout::rest_k(k);
    let mut out = vec![SCALE_CODES[1].0; scale_layout::blocked_bytes(rows, k)];
    for r in 0..rows {
        for kb in 0..k / 16 {
            out[scale_layout::blocked_offset(r, kb, rest_k)] = SCALE_CODES[scale_index(r, kb, salt)].0;
        }
    }
    out
}

/// The tensor map of a `rows × k` FP4 operand with `box_rows`-row boxes, in the given shape.
pub fn fp4_map(layout: Fp4MapLayout, rows: u32, k: u32, box_rows: u32) -> Result<Fp4Map, String> {
    let m = match layout {
        Fp4MapLayout::Chunked3d => Fp4TensorMap::chunked_3d(rows, k, box_rows),
        Fp4MapLayout::Flat2d => Fp4TensorMap::flat_2d(rows, k, box_rows),
    };
    Fp4Map::new(m, 0, "probe").map_err(|e| e.to_string())
}

/// `map` encoded by `t` over the tensor at `base`.
pub fn encode_fp4<T: ProbeTarget>(t: &T, map: &Fp4Map, base: u64) -> Result<TensorMap, String> {
    match map {
        Fp4Map::Rank2(m) => t.encode(m, base),
        Fp4Map::Rank3(m) => t.encode(m, base),
    }
}

/// The TMEM cell (lane, column relative to the load's first column) that register `reg` of lane
/// `lane` holds after `tcgen05.ld.16x256b` by warp `warp` of its 16-lane half `half` (PTX ISA 9.0
/// §9.7.16.8.3, cross-checked with CuTe's `SM100_TMEM_LOAD_16dp256b1x`): with `q = lane/4`,
/// `p = lane%4`, registers `4j, 4j+1` are lane `L0+q`, columns `8j+2p, +1`, registers `4j+2,
/// 4j+3` the same columns of lane `L0+q+8`, where `L0 = 32·warp + 16·half`.
pub const fn ld_16x256b_cell(warp: u32, half: u32, lane: u32, reg: u32) -> (u32, u32) {
    let (q, p, j) = (lane / 4, lane % 4, reg / 4);
    let row = 32 * warp + 16 * half + q + if reg % 4 >= 2 { 8 } else { 0 };
    (row, 8 * j + 2 * p + reg % 2)
}

/// The 128 × 128 cells (`[lane][column]`) of one 128-column chunk a probe read with
/// `read_chunk`, from the words it wrote for that chunk (by warp, half, lane, register).
pub fn chunk_cells(words: &[u32]) -> Vec<[u32; 128]> {
    let mut cells = vec![[0u32; 128]; 128];
    for warp in 0..4 {
        for half in 0..2 {
            for lane in 0..32 {
                for reg in 0..64 {
                    let (row, col) = ld_16x256b_cell(warp, half, lane, reg);
                    cells[row as usize][col as usize] = words[(((warp * 2 + half) * 32 + lane) * 64 + reg) as usize];
                }
            }
        }
    }
    cells
}

/// The little-endian words of `bytes`.
pub fn words(bytes: &[u8]) -> Vec<u32> {
    bytes.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes"))).collect()
}

/// A named byte range of a probe's output, so that a difference says which part differs.
pub type Section = (String, Range<usize>);

/// `Err` listing every section whose bytes differ between `a` (what `a_name` wrote) and `b`.
pub fn compare_sections(
    what: &str,
    a_name: &str,
    a: &[u8],
    b_name: &str,
    b: &[u8],
    sections: &[Section],
) -> Result<(), String> {
    if a.len() != b.len() {
        return Err(format!("{what}: {a_name} wrote {} bytes, {b_name} {}", a.len(), b.len()));
    }
    let differing: Vec<String> = sections
        .iter()
        .filter_map(|(name, r)| {
            compare_bytes(&format!("{what} [{name}]"), a_name, &a[r.clone()], b_name, &b[r.clone()]).err()
        })
        .collect();
    if differing.is_empty() {
        Ok(())
    } else {
        Err(differing.join("\n"))
    }
}

/// One case of `tmem_probe`.
#[derive(Clone, Copy, Debug)]
pub struct TmemCase {
    /// Its name in reports.
    pub name: &'static str,
    /// The copies' column shift (0: the 4-column grid).
    pub shift: u32,
    /// LBO of the copies' source descriptors (0: the seed's).
    pub lbo: u32,
}

impl TmemCase {
    /// The model's rules for this case: strict on the seed's grid and LBO.
    pub fn rules(&self) -> ModelRules {
        if self.shift % 4 == 0 && self.lbo == 0 {
            ModelRules::Strict
        } else {
            ModelRules::Isa
        }
    }

    /// The [`TMEM_PROBE_BLOCKS`] 512-byte blocks the probe copies (no byte repeats within a
    /// block's row, no zero).
    pub fn blocks(&self) -> Vec<u8> {
        pattern((TMEM_PROBE_BLOCKS * BLOCK_BYTES) as usize, 5)
    }

    /// Output sections: the window's registers, the status word.
    pub fn sections(&self) -> Vec<Section> {
        let regs = (4 * 4 * LD_WORDS_PER_WARP_CHUNK) as usize;
        vec![("TMEM window".into(), 0..regs), ("status".into(), regs..regs + 4)]
    }
}

/// The cases of `tmem_probe`: the GEMM's copies (4-column grid, LBO 0), CUTLASS's LBO, and the
/// copies shifted off the grid by 1, 2 and 3 columns (strict mode rejects all but the first).
pub fn tmem_cases() -> Vec<TmemCase> {
    vec![
        TmemCase { name: "scale copies on the 4-column grid, LBO 0 (the GEMM's)", shift: 0, lbo: 0 },
        TmemCase { name: "scale copies with LBO 16 (CUTLASS's field 1)", shift: 0, lbo: 16 },
        TmemCase { name: "scale copies shifted by 1 column", shift: 1, lbo: 0 },
        TmemCase { name: "scale copies shifted by 2 columns", shift: 2, lbo: 0 },
        TmemCase { name: "scale copies shifted by 3 columns, LBO 16", shift: 3, lbo: 16 },
    ]
}

/// Runs one `tmem_probe` case: every warp's registers of the window, then the status word.
pub fn run_tmem<T: ProbeTarget>(t: &T, case: &TmemCase) -> Result<Vec<u8>, String> {
    let blocks = t.upload(&case.blocks())?;
    let out = t.upload(&vec![0xEE; TMEM_PROBE_OUT_BYTES as usize])?;
    let mut args = [0u32; 8];
    args[TMEM_ARG_SHIFT] = case.shift;
    args[TMEM_ARG_LBO] = case.lbo;
    let params = ProbeParams { map: 0, input: t.addr(&blocks), input2: 0, out: t.addr(&out), args };
    t.launch(ProbeKernel::Tmem, tmem_probe_launch(), params, case.rules())?;
    t.download(&out)
}

/// One case of `umma_probe`.
#[derive(Clone, Copy, Debug)]
pub struct UmmaCase {
    /// Its name in reports.
    pub name: &'static str,
    /// N: 128 or 256.
    pub n: u32,
    /// K of both operands in global memory.
    pub k: u32,
    /// The box's first K value (a multiple of 256).
    pub k0: u32,
    /// The maps' shape (both operands).
    pub layout: Fp4MapLayout,
    /// Rows of A in global memory (the box's rows past them are zero-filled).
    pub a_rows: u32,
    /// Rows of B in global memory.
    pub b_rows: u32,
    /// LBO of the operand descriptors (0: the seed's).
    pub operand_lbo: u32,
    /// LBO of the scale-copy descriptors (0: the seed's).
    pub scale_lbo: u32,
    /// Columns added to every scale column of the GEMM's plan.
    pub scale_shift: u32,
}

impl UmmaCase {
    /// The K = 64 steps: the box's valid K values, at most 4.
    pub fn steps(&self) -> u32 {
        ((self.k - self.k0) / 64).min(UMMA_PROBE_MAX_STEPS)
    }

    /// The model's rules: strict with the seed's or CUTLASS's operand LBO, the seed's scale LBO
    /// and the 4-column grid.
    pub fn rules(&self) -> ModelRules {
        if (self.operand_lbo == 0 || self.operand_lbo == 16) && self.scale_lbo == 0 && self.scale_shift % 4 == 0 {
            ModelRules::Strict
        } else {
            ModelRules::Isa
        }
    }

    /// A (salt 0) or B (salt 1) in global memory.
    pub fn values(&self, salt: u32) -> Vec<u8> {
        packed_operand(if salt == 0 { self.a_rows } else { self.b_rows }, self.k, salt)
    }

    /// The steps' scale blocks of A (salt 0, one run for 128 rows) or B (salt 1, one run per 128
    /// rows of N), cut from the operand's blocked scale buffer as the GEMM's bulk copies cut them.
    pub fn stage_scales(&self, salt: u32) -> Vec<u8> {
        let (rows, blocks) = if salt == 0 { (self.a_rows, 1) } else { (self.b_rows, self.n / 128) };
        let all = blocked_scales(rows.max(128 * blocks), self.k, salt);
        let rest_k = scale_layout::rest_k(self.k);
        let run = (self.steps() * BLOCK_BYTES) as usize;
        (0..blocks)
            .flat_map(|b| {
                let at = scale_block_offset(128 * b, self.k0, rest_k);
                all[at..at + run].to_vec()
            })
            .collect()
    }

    /// The two maps: A with 128-row boxes, B with N-row boxes.
    pub fn maps(&self) -> Result<(Fp4Map, Fp4Map), String> {
        Ok((fp4_map(self.layout, self.a_rows, self.k, BLOCK_M)?, fp4_map(self.layout, self.b_rows, self.k, self.n)?))
    }

    /// Output sections: the A tile, the B tile, the accumulator, the status word.
    pub fn sections(&self) -> Vec<Section> {
        let a = (128 * UMMA_PROBE_ROW_BYTES) as usize;
        let b = a + (self.n * UMMA_PROBE_ROW_BYTES) as usize;
        let end = umma_probe_out_bytes(self.n) as usize;
        vec![
            ("A tile in shared memory".into(), 0..a),
            ("B tile in shared memory".into(), a..b),
            ("accumulator".into(), b..end - 4),
            ("status".into(), end - 4..end),
        ]
    }
}

/// The cases of `umma_probe`: both tile widths with the GEMM's 3D map (at the first and the second
/// K chunk), its 2D map (boxes 4×, 4/3× and 4/5× wider than what is left of K, the 3D map's image),
/// rows of A and B past the tensor; then the variants strict mode rejects: CUTLASS's operand
/// LBO (accepted), an LBO the ISA calls unused, a scale-copy LBO, scale columns off the grid.
pub fn umma_cases() -> Vec<UmmaCase> {
    let base = UmmaCase {
        name: "",
        n: 128,
        k: 256,
        k0: 0,
        layout: Fp4MapLayout::Chunked3d,
        a_rows: 128,
        b_rows: 128,
        operand_lbo: 0,
        scale_lbo: 0,
        scale_shift: 0,
    };
    vec![
        UmmaCase { name: "N = 128, 3D map, K = 256: 4 steps, the GEMM's encodings", ..base },
        UmmaCase {
            name: "N = 256, 3D map, K = 512, box at K 256 (z = 1): 4 steps",
            n: 256,
            k: 512,
            k0: 256,
            b_rows: 256,
            ..base
        },
        UmmaCase {
            name: "N = 128, 2D map, K = 64 (box 4x wider than K): 1 step, A rows 100..128 zero-filled",
            k: 64,
            layout: Fp4MapLayout::Flat2d,
            a_rows: 100,
            ..base
        },
        UmmaCase {
            name: "N = 256, 2D map, K = 192 (box wider than K): 3 steps, B rows 200..256 zero-filled",
            n: 256,
            k: 192,
            layout: Fp4MapLayout::Flat2d,
            b_rows: 200,
            ..base
        },
        UmmaCase {
            name: "N = 128, 2D map, K = 320, box at K 256 (64 values left): 1 step",
            k: 320,
            k0: 256,
            layout: Fp4MapLayout::Flat2d,
            ..base
        },
        UmmaCase { name: "N = 128, 2D map, K = 256 (the 3D map's image)", layout: Fp4MapLayout::Flat2d, ..base },
        UmmaCase { name: "N = 128, operand LBO 16 (CUTLASS's field 1)", operand_lbo: 16, ..base },
        UmmaCase { name: "N = 128, operand LBO 4096 (the ISA: not used)", operand_lbo: 4096, ..base },
        UmmaCase { name: "N = 256, scale-copy LBO 16", n: 256, b_rows: 256, scale_lbo: 16, ..base },
        UmmaCase { name: "N = 128, scale columns shifted by 1", scale_shift: 1, ..base },
        UmmaCase { name: "N = 256, scale columns shifted by 2", n: 256, b_rows: 256, scale_shift: 2, ..base },
    ]
}

/// Runs one `umma_probe` case: the A and B tiles as they lay in shared memory, the accumulator
/// registers (by warp, chunk, half, lane, register), the status word.
pub fn run_umma<T: ProbeTarget>(t: &T, case: &UmmaCase) -> Result<Vec<u8>, String> {
    let (map_a, map_b) = case.maps()?;
    let a = t.upload(&case.values(0))?;
    let b = t.upload(&case.values(1))?;
    let mut table = encode_fp4(t, &map_a, t.addr(&a))?.0.to_vec();
    table.extend(encode_fp4(t, &map_b, t.addr(&b))?.0);
    let maps = t.upload(&table)?;
    let sfa = t.upload(&case.stage_scales(0))?;
    let sfb = t.upload(&case.stage_scales(1))?;
    let out = t.upload(&vec![0xEE; umma_probe_out_bytes(case.n) as usize])?;
    let mut args = [0u32; 8];
    args[UMMA_ARG_N] = case.n;
    args[UMMA_ARG_STEPS] = case.steps();
    args[UMMA_ARG_MAP_RANK] = map_a.rank();
    args[UMMA_ARG_K0] = case.k0;
    args[UMMA_ARG_OPERAND_LBO] = case.operand_lbo;
    args[UMMA_ARG_SCALE_LBO] = case.scale_lbo;
    args[UMMA_ARG_SCALE_SHIFT] = case.scale_shift;
    let params = ProbeParams { map: t.addr(&maps), input: t.addr(&sfa), input2: t.addr(&sfb), out: t.addr(&out), args };
    t.launch(ProbeKernel::Umma, umma_probe_launch(), params, case.rules())?;
    t.download(&out)
}

/// One case of `tma4_multicast_probe`.
#[derive(Clone, Copy, Debug)]
pub struct MulticastCase {
    /// Its name in reports.
    pub name: &'static str,
    /// The map's shape.
    pub layout: Fp4MapLayout,
    /// Rows of the tensor.
    pub rows: u32,
    /// K of the tensor.
    pub k: u32,
    /// Rows of the box.
    pub box_rows: u32,
    /// The box's first row.
    pub row0: u32,
    /// The box's first K value (a multiple of 256).
    pub k0: u32,
}

impl MulticastCase {
    /// The map.
    pub fn map(&self) -> Result<Fp4Map, String> {
        fp4_map(self.layout, self.rows, self.k, self.box_rows)
    }

    /// Bytes of the box.
    pub fn box_bytes(&self) -> u32 {
        self.box_rows * UMMA_PROBE_ROW_BYTES
    }

    /// Output sections: per CTA, its box and its log words.
    pub fn sections(&self) -> Vec<Section> {
        let (bx, cta) = (self.box_bytes() as usize, multicast_probe_cta_bytes(self.box_bytes()) as usize);
        (0..MULTICAST_PROBE_CLUSTER as usize)
            .flat_map(|r| {
                [(format!("CTA {r} box"), r * cta..r * cta + bx), (format!("CTA {r} log"), r * cta + bx..(r + 1) * cta)]
            })
            .collect()
    }
}

/// The cases of `tma4_multicast_probe`: the GEMM's A multicast with the 3D map (rows past the
/// tensor, the second K chunk) and with the 2D map (a box wider than K; a K tail).
pub fn multicast_cases() -> Vec<MulticastCase> {
    let c = |name, layout, rows, k, row0, k0| MulticastCase { name, layout, rows, k, box_rows: BLOCK_M, row0, k0 };
    vec![
        c(
            "3D map, K = 512, rows 128..256 of 200 (56 zero-filled), K chunk 1",
            Fp4MapLayout::Chunked3d,
            200,
            512,
            128,
            256,
        ),
        c("2D map, K = 192 (box wider than K), rows 0..128", Fp4MapLayout::Flat2d, 128, 192, 0, 0),
        c("2D map, K = 320, rows 0..128 of 64, box at K 256", Fp4MapLayout::Flat2d, 64, 320, 0, 256),
    ]
}

/// Runs one `tma4_multicast_probe` case: per CTA, its box and its log words.
pub fn run_multicast<T: ProbeTarget>(t: &T, case: &MulticastCase) -> Result<Vec<u8>, String> {
    let map = case.map()?;
    let values = t.upload(&packed_operand(case.rows, case.k, 2))?;
    let maps = t.upload(&encode_fp4(t, &map, t.addr(&values))?.0)?;
    let cta = multicast_probe_cta_bytes(case.box_bytes());
    let out = t.upload(&vec![0xEE; (MULTICAST_PROBE_CLUSTER * cta) as usize])?;
    let coords = match map {
        Fp4Map::Rank2(_) => [case.k0, case.row0, 0],
        Fp4Map::Rank3(_) => [0, case.row0, case.k0 / 256],
    };
    let mut args = [0u32; 8];
    args[MULTICAST_ARG_MAP_RANK] = map.rank();
    args[MULTICAST_ARG_C0] = coords[0];
    args[MULTICAST_ARG_C1] = coords[1];
    args[MULTICAST_ARG_C2] = coords[2];
    args[MULTICAST_ARG_BOX_BYTES] = case.box_bytes();
    let params = ProbeParams { map: t.addr(&maps), input: 0, input2: 0, out: t.addr(&out), args };
    t.launch(ProbeKernel::Tma4Multicast, multicast_probe_launch(), params, ModelRules::Strict)?;
    t.download(&out)
}

/// Every sm_100a tensor map the library's plans build, named: the A and B maps of problems that
/// reach each map shape — the 3D map (K % 256 == 0) and the 2D map (K tails, boxes wider than K:
/// K = 64, 128, 192), 128-row boxes for A and 128-wide B, 256-row boxes for the 256-wide B whose
/// A the cluster kernel multicasts, fewer rows than a box — and the device-sized MoE plan's
/// token-tensor and weight maps. The plans compute them without a driver; only their encoding
/// needs one.
pub fn plan_tensor_maps() -> Vec<(String, Fp4Map)> {
    let shapes = [
        (8, 128, 64),
        (100, 136, 128),
        (130, 264, 192),
        (200, 128, 320),
        (128, 256, 256),
        (248, 4096, 7168),
        (40, 4096, 2112),
        (130, 4096, 2048),
        (9, 4352, 2048),
    ];
    let groups: Vec<GroupShape> = shapes.iter().map(|&(m, n, k)| GroupShape::new(m, n, k)).collect();
    let problem = Problem::new(groups, OutputType::F16).expect("a valid problem");
    let resident = |k: nvfp4_gemm_abi::sm100::params::KernelLayout| {
        let c: KernelConfig = k.config();
        c.resident_ctas(148, c.max_ctas_per_sm(), 37)
    };
    let layout = Sm100Layout::new(&problem, resident).expect("the plan");
    let mut maps = vec![];
    for (g, &(m, n, k)) in shapes.iter().enumerate() {
        if let Some((a, b)) = layout.operand_maps(g).expect("maps") {
            maps.push((format!("group ({m}, {n}, {k}) A"), a));
            maps.push((format!("group ({m}, {n}, {k}) B ({}-row box)", layout.block_n[g].get()), b));
        }
    }
    for (n, k) in [(256, 320), (4096, 2048)] {
        let moe = MoeProblem::new(4, n, k, TokenLayout::Contiguous { max_tokens: 300 }, OutputType::Bf16)
            .expect("a valid MoE problem");
        let (a, b) = Sm100DeviceLayout::new(&moe, resident).expect("the MoE plan").maps().expect("maps");
        maps.push((format!("MoE (N {n}, K {k}) token tensor A"), a));
        maps.push((format!("MoE (N {n}, K {k}) weights B"), b));
    }
    maps
}

/// The map of the same bytes with 8-bit elements: dimension 0 and the box's innermost extent
/// halved (two e2m1 values per byte). Its boxes must land exactly as the FP4 map's do; the byte
/// path is what the H200's TMA has checked (docs/model.md §5).
pub fn byte_twin(map: &Fp4Map) -> Fp4Map {
    fn halve<const R: usize>(mut m: TiledMap<R>) -> TiledMap<R> {
        m.element = TensorMapDataType::U8;
        m.dims[0] /= 2;
        m.box_dims[0] /= 2;
        m
    }
    match *map {
        Fp4Map::Rank2(m) => Fp4Map::Rank2(halve(m)),
        Fp4Map::Rank3(m) => Fp4Map::Rank3(halve(m)),
    }
}

/// Bytes of global memory a map spans from its base: the last element's offset plus one row.
pub fn tensor_bytes(map: &Fp4Map) -> u64 {
    fn span<const R: usize>(m: &TiledMap<R>) -> u64 {
        let bits = if m.element == TensorMapDataType::U4x16Align8B { 4 } else { 8 * element_bytes(m.element) as u64 };
        (1..R).map(|i| (m.dims[i] - 1) * m.strides_bytes[i - 1]).sum::<u64>() + (m.dims[0] * bits).div_ceil(8)
    }
    match map {
        Fp4Map::Rank2(m) => span(m),
        Fp4Map::Rank3(m) => span(m),
    }
}
