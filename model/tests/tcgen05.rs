//! tcgen05: TMEM allocation, scale copies, the block-scaled NVFP4 MMA against a naive product,
//! TMEM loads, commit; and the hazards of the Blackwell pipeline.

use nvfp4_gemm_model::*;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

const N: u32 = 64;
const ALLOC: u32 = 256;

/// e2m1 magnitudes by code (sign in bit 3).
const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
/// UE4M3 codes of 0.5, 1, 2, 4 (exponent bias 7, no mantissa bits).
const SCALES: [(u8, f32); 4] = [(0x30, 0.5), (0x38, 1.0), (0x40, 2.0), (0x48, 4.0)];

fn code(r: usize, k: usize, salt: usize) -> u8 {
    ((r * 5 + k * 3 + salt + r * k / 7) % 16) as u8
}

fn value(c: u8) -> f32 {
    let m = E2M1[(c & 7) as usize];
    if c & 8 != 0 {
        -m
    } else {
        m
    }
}

/// A K-major 128-byte-swizzled tile of `rows` x 64 e2m1 values (one K = 64 step, 32 bytes per row)
/// at a 1024-aligned address: byte `kb` of row `r` at line-swizzled `(r/8)·1024 + (r%8)·128 + kb`.
fn operand_image(rows: usize, salt: usize) -> Vec<u8> {
    let mut img = vec![0u8; rows.div_ceil(8) * 1024];
    for r in 0..rows {
        for kb in 0..32 {
            let o = (r / 8) * 1024 + (r % 8) * 128 + kb;
            let (line, chunk) = (o / 128, (o % 128) / 16);
            let p = line * 128 + (chunk ^ (line % 8)) * 16 + o % 16;
            img[p] = code(r, 2 * kb, salt) | code(r, 2 * kb + 1, salt) << 4;
        }
    }
    img
}

fn scale(r: usize, blk: usize, salt: usize) -> (u8, f32) {
    SCALES[(r + 3 * blk + salt) % 4]
}

/// A 512-byte block of the 128x4 scale layout: scale `j` of row `r` at `(r%32)·16 + (r/32)·4 + j`.
fn scale_image(rows: usize, salt: usize) -> Vec<u8> {
    let mut img = vec![0x38u8; 512];
    for r in 0..rows {
        for j in 0..4 {
            img[(r % 32) * 16 + (r / 32) * 4 + j] = scale(r, j, salt).0;
        }
    }
    img
}

fn smem_desc(addr: u32, sbo: u32, swizzle: u64) -> u64 {
    ((addr as u64 & 0x3FFFF) >> 4) | ((sbo as u64) >> 4) << 32 | 1 << 46 | swizzle << 61
}

const IDESC: u32 = (1 << 7) | (1 << 10) | ((N >> 3) << 17) | ((128 >> 7) << 27);

struct Layout {
    a: u32,
    b: u32,
    sfa: u32,
    sfb: u32,
    bar: u32,
    slot: u32,
}

const L: Layout = Layout { a: 1024, b: 1024 + 16384, sfa: 1024 + 24576, sfb: 1024 + 24576 + 512, bar: 64, slot: 0 };

/// The kernel: warp 0 allocates; thread 0 copies scales, issues the MMA and commits; four warps read
/// D back. `fault` injects a bug (1–6, see the tests).
fn kernel(words: &[u32], d: &[AtomicU32], base_col: &AtomicU32, fault: u32) {
    let base = smem::dynamic_base();
    let tid = sreg::tid_x();
    let warp = tid / 32;
    for i in (tid as usize..words.len()).step_by(128) {
        smem::st_u32(base + L.a + 4 * i as u32, words[i]);
    }
    // The operands were written by threads (generic proxy); the MMA and the scale copies read
    // them through the async proxy.
    fence::proxy_async();
    if warp == 0 {
        tcgen05::alloc(base + L.slot, ALLOC);
        tcgen05::relinquish_alloc_permit();
    }
    if tid == 0 {
        mbarrier::init(base + L.bar, 1);
        fence::mbarrier_init();
    }
    fence::tcgen05_before_thread_sync();
    barrier::sync_all();
    fence::tcgen05_after_thread_sync();
    let tmem = smem::ld_u32(base + L.slot);
    let (acc, sfa, sfb) = (tmem, tmem + N, tmem + N + 4);
    if tid == 0 {
        base_col.store(tmem, Relaxed);
        unsafe {
            tcgen05::cp_32x128b_warpx4(sfa, smem_desc(base + L.sfa, 128, 0));
            tcgen05::cp_32x128b_warpx4(sfb, smem_desc(base + L.sfb, 128, 0));
            let (a, b) = (smem_desc(base + L.a, 1024, 2), smem_desc(base + L.b, 1024, 2));
            tcgen05::mma_mxf4nvf4_4x(acc, a, b, IDESC, sfa, sfb, false);
            if fault == 4 {
                // A stage released at MMA issue rather than completion: the refill overwrites
                // operand bytes the MMA has not read yet.
                let src = words.as_ptr() as u64;
                tma::load_1d(base + L.a, src, 1024, base + L.bar);
            }
            if fault == 1 {
                // The seed's pattern: rewrite the scale columns while the MMA may still read them.
                tcgen05::cp_32x128b_warpx4(sfa, smem_desc(base + L.sfa, 128, 0));
            }
        }
        if fault != 2 {
            tcgen05::commit(base + L.bar);
        }
    }
    if fault != 3 {
        while !mbarrier::try_wait(base + L.bar, 0) {}
    }
    if fault != 5 {
        fence::tcgen05_after_thread_sync();
    }
    for half in 0..2 {
        let lane0 = 32 * warp + 16 * half;
        let r = tcgen05::ld_16x256b(acc + (lane0 << 16), N / 8);
        let lane = sreg::lane_id();
        let (q, p) = (lane / 4, lane % 4);
        for j in 0..N / 8 {
            for (i, (row, col)) in
                [(q, 2 * p), (q, 2 * p + 1), (q + 8, 2 * p), (q + 8, 2 * p + 1)].into_iter().enumerate()
            {
                d[((lane0 + row) * N + 8 * j + col) as usize].store(r[(4 * j) as usize + i], Relaxed);
            }
        }
    }
    if fault != 6 {
        fence::tcgen05_before_thread_sync();
    }
    barrier::sync_all();
    if warp == 0 {
        fence::tcgen05_after_thread_sync();
        tcgen05::dealloc(tmem, ALLOC);
    }
}

fn image() -> Vec<u32> {
    let mut img = operand_image(128, 0);
    img.extend(operand_image(N as usize, 1));
    img.resize((L.sfa - L.a) as usize, 0);
    img.extend(scale_image(128, 2));
    img.extend(scale_image(N as usize, 3));
    img.chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect()
}

fn cfg(s: Schedule) -> LaunchConfig {
    LaunchConfig::new(Arch::Sm100a, 1, 128, 32768).with_schedule(s)
}

#[test]
fn block_scaled_mma_matches_a_naive_product() {
    let words = image();
    let d: Vec<AtomicU32> = (0..128 * N).map(|_| AtomicU32::new(0)).collect();
    let base_col = AtomicU32::new(0);
    for (seed, completion) in [(1, Completion::InOrder), (2, Completion::Reversed), (3, Completion::Random)] {
        launch(&cfg(Schedule { seed, completion, ..Schedule::default() }), || kernel(&words, &d, &base_col, 0))
            .unwrap();
        assert_eq!(base_col.load(Relaxed), 512 - ALLOC, "the allocator hands out a non-zero base column");
        for m in 0..128usize {
            for n in 0..N as usize {
                let want: f32 = (0..64)
                    .map(|k| {
                        value(code(m, k, 0)) * scale(m, k / 16, 2).1 * value(code(n, k, 1)) * scale(n, k / 16, 3).1
                    })
                    .sum();
                assert_eq!(f32::from_bits(d[m * N as usize + n].load(Relaxed)), want, "D[{m}][{n}]");
            }
        }
    }
}

#[test]
fn rewriting_scales_under_an_in_flight_mma_is_a_hazard() {
    let words = image();
    let d: Vec<AtomicU32> = (0..128 * N).map(|_| AtomicU32::new(0)).collect();
    let e = launch(&cfg(Schedule::default()), || kernel(&words, &d, &AtomicU32::new(0), 1)).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Hazard, "{e}");
    assert!(e.message.contains("mma -> cp is not ordered"), "{e}");
}

#[test]
fn refilling_a_stage_under_an_in_flight_mma_is_a_hazard() {
    let words = image();
    let d: Vec<AtomicU32> = (0..128 * N).map(|_| AtomicU32::new(0)).collect();
    let e = launch(&cfg(Schedule::default()), || kernel(&words, &d, &AtomicU32::new(0), 4)).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Hazard, "{e}");
    assert!(e.message.contains("still reads") && e.message.contains("tcgen05.mma"), "{e}");
}

#[test]
fn a_missing_commit_deadlocks() {
    let words = image();
    let d: Vec<AtomicU32> = (0..128 * N).map(|_| AtomicU32::new(0)).collect();
    let e = launch(&cfg(Schedule::default()), || kernel(&words, &d, &AtomicU32::new(0), 2)).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Deadlock, "{e}");
    assert!(e.report.contains("pending arrivals 1/1"), "{}", e.report);
}

#[test]
fn reading_the_accumulator_without_waiting_is_a_hazard() {
    let words = image();
    let d: Vec<AtomicU32> = (0..128 * N).map(|_| AtomicU32::new(0)).collect();
    let e = launch(&cfg(Schedule::default()), || kernel(&words, &d, &AtomicU32::new(0), 3)).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Hazard, "{e}");
    assert!(e.message.contains("reads TMEM"), "{e}");
}

/// Cross-thread tcgen05 order (PTX ISA 9.0 §9.7.16.6): reading the accumulator after the wait on
/// the commit's barrier without `tcgen05.fence::after_thread_sync` (fault 5), and freeing TMEM
/// after a `bar.sync` whose other threads loaded from it without `before_thread_sync` (fault 6).
#[test]
fn missing_tcgen05_fences_are_hazards() {
    let words = image();
    let d: Vec<AtomicU32> = (0..128 * N).map(|_| AtomicU32::new(0)).collect();
    let e = launch(&cfg(Schedule::default()), || kernel(&words, &d, &AtomicU32::new(0), 5)).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Hazard, "{e}");
    assert!(e.message.contains("tcgen05.ld") && e.message.contains("without tcgen05.fence::after_thread_sync"), "{e}");
    let e = launch(&cfg(Schedule::default()), || kernel(&words, &d, &AtomicU32::new(0), 6)).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Hazard, "{e}");
    assert!(e.message.contains("tcgen05.dealloc") && e.message.contains("before_thread_sync"), "{e}");
}

#[test]
fn base_zero_placement_is_available() {
    let words = image();
    let d: Vec<AtomicU32> = (0..128 * N).map(|_| AtomicU32::new(0)).collect();
    let base_col = AtomicU32::new(99);
    let mut c = cfg(Schedule::default());
    c.tmem_placement = TmemPlacement::Lowest;
    launch(&c, || kernel(&words, &d, &base_col, 0)).unwrap();
    assert_eq!(base_col.load(Relaxed), 0);
}

#[test]
fn tmem_leak_and_lane_quarters_are_checked() {
    let e = launch(&cfg(Schedule::default()), || {
        if sreg::tid_x() / 32 == 0 {
            tcgen05::alloc(smem::dynamic_base(), 32);
        }
    })
    .unwrap_err();
    assert_eq!(e.kind, ErrorKind::ResourceLeak, "{e}");
    let e = launch(&cfg(Schedule::default()), || {
        let slot = smem::dynamic_base();
        if sreg::tid_x() / 32 == 1 {
            tcgen05::alloc(slot, 32);
            let t = smem::ld_u32(slot);
            // Warp 1 may only read lanes 32..63.
            let _ = tcgen05::ld_16x256b(t, 1);
        }
    })
    .unwrap_err();
    assert!(e.message.contains("outside warp 1's TMEM lanes 32..64"), "{e}");
}

/// Strict mode: a TMEM load of cells no `tcgen05.cp` or MMA wrote since the allocation is an
/// error (what a previous owner left is not data); under the ISA's rules only it reads them.
#[test]
fn strict_mode_rejects_reading_unwritten_tmem() {
    let body = || {
        let slot = smem::dynamic_base();
        if sreg::tid_x() / 32 == 0 {
            tcgen05::alloc(slot, 32);
            let t = smem::ld_u32(slot);
            let _ = tcgen05::ld_16x256b(t, 1);
            tcgen05::dealloc(t, 32);
        }
    };
    let e = launch(&cfg(Schedule::default()), body).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidOperand, "{e}");
    assert!(e.message.contains("was not written since its allocation") && e.message.contains("strict mode"), "{e}");
    let mut isa_only = cfg(Schedule::default());
    isa_only.strict = false;
    launch(&isa_only, body).unwrap();
}
