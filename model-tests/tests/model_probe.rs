//! The hardware probes (`diag/kernel/src/probe.rs`, run by `nvfp4_gemm_diag::probe`) in the device model,
//! against expectations written from the PTX ISA text, not from the kernels' code or the
//! model's: the swizzle as an address-bit formula (§5.5.7), out-of-bounds zero fill (§5.5.3.3),
//! mbarrier phases, the wgmma A and D fragment figures (§9.7.15.5.1.1.1 and §9.7.15.5.1.2) and a
//! naive matmul. On the H200 the same probes must give the model's bytes exactly
//! (`tests/tests/gpu_probe_sm90.rs`).

use nvfp4_gemm_abi::tensor_map::TensorMapSwizzle;
use nvfp4_gemm_diag::probe::*;
use nvfp4_gemm_model_tests::*;

fn words(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect()
}

/// Where logical byte `o` of a box (rows laid out densely) lands in shared memory: the ISA's
/// swizzle modes XOR the 16-byte chunk index (address bits 4..) with the 128-byte line index
/// (bits 7..): 3 bits for 128B, 2 for 64B (a destination aligned to the pattern).
fn swizzled(s: TensorMapSwizzle, o: usize) -> usize {
    match s {
        TensorMapSwizzle::None => o,
        TensorMapSwizzle::B32 => o ^ (((o >> 7) & 1) << 4),
        TensorMapSwizzle::B64 => o ^ (((o >> 7) & 3) << 4),
        TensorMapSwizzle::B128 => o ^ (((o >> 7) & 7) << 4),
    }
}

#[test]
fn model_probe_tma_swizzle_oob_and_bulk_match_the_isa() {
    for case in tma_cases() {
        let got = run_tma(&ModelTarget::default(), &case).unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let global = case.global();
        let esize = element_bytes(case.map.element) as i64;
        let (row_bytes, rows) = (case.row_bytes() as usize, case.map.box_dims[1] as usize);
        let mut want = vec![0u8; case.box_bytes() as usize];
        for r in 0..rows {
            for b in 0..row_bytes {
                let (x, y) = (case.coords[0] as i64 + b as i64 / esize, case.coords[1] as i64 + r as i64);
                let inside = x >= 0 && y >= 0 && x < case.map.dims[0] as i64 && y < case.map.dims[1] as i64;
                let v = if inside {
                    global[(y * case.map.strides_bytes[0] as i64 + x * esize + b as i64 % esize) as usize]
                } else {
                    0
                };
                want[swizzled(case.map.swizzle, r * row_bytes + b)] = v;
            }
        }
        want.extend(case.bulk_source());
        want.extend(PROBE_OK.to_le_bytes());
        compare_bytes(case.name, "model", &got, "ISA", &want).unwrap();
    }
}

#[test]
fn model_probe_sync_phases_ring_gather_and_cluster_pingpong() {
    let got = words(&run_sync(&ModelTarget::default()).unwrap_or_else(|e| panic!("{e}")));
    let ring = words(&sync_ring_source());
    for cta in 0..SYNC_PROBE_CTAS {
        let log = &got[(cta * SYNC_LOG_WORDS) as usize..][..SYNC_LOG_WORDS as usize];
        let at = |i: u32| log[i as usize];
        let (rank, cl) = (cta % SYNC_PROBE_CLUSTER, cta / SYNC_PROBE_CLUSTER);
        let sregs: Vec<u32> = (0..8).map(|i| at(SYNC_LOG_SREGS + i)).collect();
        assert_eq!(
            sregs,
            [
                cta,
                SYNC_PROBE_CTAS,
                rank,
                SYNC_PROBE_CLUSTER,
                cl,
                SYNC_PROBE_CTAS / SYNC_PROBE_CLUSTER,
                SYNC_PROBE_THREADS,
                PROBE_OK
            ],
            "CTA {cta}: special registers"
        );
        // Each round reads exactly that round's copy: no stage was read early or refilled late.
        let ring_log: Vec<u32> = (0..4 * SYNC_RING_ROUNDS).map(|i| at(SYNC_LOG_RING + i)).collect();
        assert_eq!(ring_log, ring, "CTA {cta}: ring");
        assert_eq!(at(SYNC_LOG_FRESH), 1, "CTA {cta}: a fresh barrier passes parity 1");
        for r in 0..SYNC_PINGPONG_ROUNDS {
            let posted = 100 * (cl + 1) + r;
            let want = if rank == 0 { posted + 1000 } else { posted };
            assert_eq!(at(SYNC_LOG_PINGPONG + r), want, "CTA {cta}: ping-pong round {r}");
        }
        for r in 0..SYNC_GATHER_ROUNDS {
            let sum: u32 = (0..SYNC_PROBE_THREADS).map(|t| (r + 1) * 1000 + t).sum();
            for t in 0..SYNC_PROBE_THREADS {
                assert_eq!(at(SYNC_LOG_GATHER + r * SYNC_PROBE_THREADS + t), sum, "CTA {cta}: gather {r} thread {t}");
            }
        }
        for t in 0..SYNC_PROBE_THREADS {
            assert_eq!(at(SYNC_LOG_STATUS + t), PROBE_OK, "CTA {cta} thread {t}: status");
        }
    }
}

/// The sync probe under other completion orders and schedules: the same log.
#[test]
fn model_probe_sync_is_the_same_under_every_completion_order() {
    let first = run_sync(&ModelTarget::default()).unwrap();
    for (order, seed) in [(Completion::Reversed, 1), (Completion::Random, 2), (Completion::Random, 3)] {
        let run = ModelRun::ordered(order, seed);
        let got = run_sync(&ModelTarget { run }).unwrap_or_else(|e| panic!("{order:?} {seed}: {e}"));
        compare_bytes("sync probe", "default", &first, &format!("{order:?} seed {seed}"), &got).unwrap();
    }
}

fn f16(bits: u32) -> f64 {
    half::f16::from_bits(bits as u16).to_f64()
}

#[test]
fn model_probe_wgmma_fragments_match_a_naive_matmul() {
    const T: usize = WGMMA_PROBE_THREADS as usize;
    for case in wgmma_cases() {
        let got = run_wgmma(&ModelTarget::default(), &case).unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let got = words(&got);
        let (n, k) = (case.n as usize, case.k() as usize);
        let regs = n / 2;
        assert_eq!(got[T * regs], PROBE_OK, "{}: status", case.name);
        // A of each warpgroup (64 x K) from the fragment registers: the ISA's register-A figure
        // for .f16 (§9.7.15.5.1.1.1): thread (warp w of the warpgroup, lane = 4g + q) holds in
        // register r, halves h, row 16w + g + 8·(r % 2), column 2q + h + 8·(r / 2) of the k-step.
        let frags = case.a_fragments();
        let mut a = vec![vec![vec![0f64; k]; 64]; T / 128];
        for s in 0..case.k_steps() as usize {
            for t in 0..T {
                let (wg, w, g, q) = (t / 128, (t % 128) / 32, (t % 32) / 4, t % 4);
                for r in 0..4 {
                    let word = frags[(s * T + t) * 4 + r];
                    for h in 0..2 {
                        let row = 16 * w + g + 8 * (r % 2);
                        let col = 16 * s + 2 * q + h + 8 * (r / 2);
                        a[wg][row][col] = f16(word >> (16 * h));
                    }
                }
            }
        }
        let b = case.b_matrix();
        let b_at = |col: usize, kk: usize| if col < case.b_rows as usize { f16(b[col * k + kk] as u32) } else { 0.0 };
        let init = case.initial_accumulators();
        // D's register figure (§9.7.15.5.1.2, the 64xN f32 accumulator): register i of thread
        // (w, g, q) holds row 16w + g + 8·((i / 2) % 2), column 8·(i / 4) + 2q + i % 2.
        for t in 0..T {
            let (wg, w, g, q) = (t / 128, (t % 128) / 32, (t % 32) / 4, t % 4);
            for i in 0..regs {
                let (row, col) = (16 * w + g + 8 * ((i / 2) % 2), 8 * (i / 4) + 2 * q + i % 2);
                let start = if case.scale_d_first { init[t * regs + i] as f64 } else { 0.0 };
                let want = start + (0..k).map(|kk| a[wg][row][kk] * b_at(col, kk)).sum::<f64>();
                let g_val = f32::from_bits(got[t * regs + i]);
                assert_eq!(
                    g_val as f64, want,
                    "{}: thread {t} register {i} (D[{row}][{col}] of warpgroup {wg})",
                    case.name
                );
            }
        }
    }
}
