//! wgmma m64nNk16 f16/bf16 → f32: fragment layouts and B descriptors against a naive matmul,
//! async groups.

use nvfp4_gemm_model::*;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

const K: usize = 16;

fn f16(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

#[derive(Clone, Copy, Debug)]
enum Layout {
    /// K-major, 128-byte swizzle: rows of 128 bytes, 8-row groups 1024 apart (LBO unused).
    Sw128,
    /// K-major, 64-byte swizzle: rows of 64 bytes, 8-row groups 512 apart.
    Sw64,
    /// K-major, no swizzle: 8x16-byte core matrices, LBO 128 along K, SBO 256 along N.
    Interleave,
}

/// Byte offset of B[k][n] inside the tile (tile 1024-aligned), from the ISA's canonical layouts
/// and its swizzle tables (§5.5.7: 16-byte chunk `c` of 128-byte line `i` lands at `c ^ (i % 8)`
/// for 128B, `c ^ (i % 4)` for 64B).
fn b_offset(l: Layout, n: usize, k: usize) -> usize {
    match l {
        Layout::Sw128 => {
            let o = (n / 8) * 1024 + (n % 8) * 128 + 2 * k;
            let (line, chunk) = (o / 128, (o % 128) / 16);
            line * 128 + (chunk ^ (line % 8)) * 16 + o % 16
        }
        Layout::Sw64 => {
            let o = (n / 8) * 512 + (n % 8) * 64 + 2 * k;
            let (line, chunk) = (o / 128, (o % 128) / 16);
            line * 128 + (chunk ^ (line % 4)) * 16 + o % 16
        }
        Layout::Interleave => (n / 8) * 256 + (k / 8) * 128 + (n % 8) * 16 + (k % 8) * 2,
    }
}

/// The descriptor of PTX ISA 9.0 §9.7.15.5.1.2.2 written out.
fn desc(l: Layout, start: u32) -> u64 {
    let (lbo, sbo, swz) = match l {
        Layout::Sw128 => (16u64, 1024u64, 1u64),
        Layout::Sw64 => (16, 512, 2),
        Layout::Interleave => (128, 256, 0),
    };
    ((start as u64 & 0x3FFFF) >> 4) | (lbo >> 4) << 16 | (sbo >> 4) << 32 | swz << 62
}

/// Runs D = A0·B0 (+ A1·B1 if `two`) on one warpgroup with N = 32 and returns D (64 x 32).
fn run(l: Layout, a: &[[f32; K]; 64], b: &[Vec<[f32; K]>], two_groups: bool, seed: u64) -> Vec<f32> {
    run_typed(l, a, b, two_groups, seed, false)
}

fn bf16(x: f32) -> u16 {
    half::bf16::from_f32(x).to_bits()
}

/// [`run`] with f16 (`bf16` false) or bf16 operands (`wgmma ... .f32.bf16.bf16`).
fn run_typed(l: Layout, a: &[[f32; K]; 64], b: &[Vec<[f32; K]>], two_groups: bool, seed: u64, bf: bool) -> Vec<f32> {
    const N: usize = 32;
    let f16 = if bf { bf16 } else { f16 };
    let mma = if bf { wgmma::mma_bf16 } else { wgmma::mma_f16 };
    let tile_bytes = 4096usize;
    let mut img = vec![0u8; tile_bytes * b.len()];
    for (t, bt) in b.iter().enumerate() {
        for (n, row) in bt.iter().enumerate() {
            for (k, &v) in row.iter().enumerate() {
                let o = t * tile_bytes + b_offset(l, n, k);
                img[o..o + 2].copy_from_slice(&f16(v).to_le_bytes());
            }
        }
    }
    let words: Vec<u32> = img.chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
    let d: Vec<AtomicU32> = (0..64 * N).map(|_| AtomicU32::new(0)).collect();
    let sched = Schedule { seed, completion: Completion::Random, ..Schedule::default() };
    launch(&LaunchConfig::new(Arch::Sm90a, 1, 128, 16384).with_schedule(sched), || {
        let base = smem::dynamic_base();
        let tid = sreg::tid_x();
        let tiles = base + 1024;
        for i in (tid as usize..words.len()).step_by(128) {
            smem::st_u32(tiles + 4 * i as u32, words[i]);
        }
        // B is written by threads (generic proxy) and read by wgmma (async proxy).
        fence::proxy_async();
        barrier::sync_all();
        let (w, g, q) = (tid as usize / 32, (tid as usize % 32) / 4, tid as usize % 4);
        let frag = |a: &[[f32; K]; 64]| {
            let pair = |r: usize, c: usize| (f16(a[r][c + 1]) as u32) << 16 | f16(a[r][c]) as u32;
            [
                pair(16 * w + g, 2 * q),
                pair(16 * w + g + 8, 2 * q),
                pair(16 * w + g, 2 * q + 8),
                pair(16 * w + g + 8, 2 * q + 8),
            ]
        };
        let mut acc = [0f32; N / 2];
        wgmma::fence();
        unsafe { mma(&mut acc, frag(a), desc(l, tiles), false) };
        if two_groups {
            wgmma::commit_group();
            let a1: [[f32; K]; 64] = std::array::from_fn(|r| std::array::from_fn(|k| a[r][k] - 1.0));
            unsafe { mma(&mut acc, frag(&a1), desc(l, tiles + tile_bytes as u32), true) };
            wgmma::commit_group();
            wgmma::wait_group(1, &mut acc);
            // The newest group may still be in flight: the registers are not the result yet.
            assert!(acc.iter().all(|v| v.to_bits() == wgmma::ACC_POISON));
        } else {
            wgmma::commit_group();
        }
        wgmma::wait_group(0, &mut acc);
        for (i, &v) in acc.iter().enumerate() {
            let row = 16 * w + g + 8 * ((i / 2) % 2);
            let col = 8 * (i / 4) + 2 * q + i % 2;
            d[row * N + col].store(v.to_bits(), Relaxed);
        }
    })
    .unwrap();
    d.iter().map(|x| f32::from_bits(x.load(Relaxed))).collect()
}

fn small(i: usize, j: usize, m: usize) -> f32 {
    ((i * 7 + j * 3 + m) % 9) as f32 - 4.0
}

#[test]
fn fragments_and_descriptors_match_a_naive_matmul() {
    let a: [[f32; K]; 64] = std::array::from_fn(|r| std::array::from_fn(|k| small(r, k, 1)));
    let b0: Vec<[f32; K]> = (0..32).map(|n| std::array::from_fn(|k| small(n, k, 5) * 0.5)).collect();
    for l in [Layout::Sw128, Layout::Sw64, Layout::Interleave] {
        let d = run(l, &a, std::slice::from_ref(&b0), false, 3);
        for r in 0..64 {
            for n in 0..32 {
                let want: f32 = (0..K).map(|k| a[r][k] * b0[n][k]).sum();
                assert_eq!(d[r * 32 + n], want, "{l:?} D[{r}][{n}]");
            }
        }
    }
}

/// bf16 operands whose values f16 cannot hold (2⁻¹¹⁰ · small integers, and subnormal bf16
/// elements 2⁻¹²⁷ times powers of two up to 2¹²⁶): read as bf16, exactly.
#[test]
fn bf16_operands_are_read_as_bf16() {
    let a: [[f32; K]; 64] = std::array::from_fn(|r| std::array::from_fn(|k| small(r, k, 1) * 2f32.powi(-110)));
    let b0: Vec<[f32; K]> = (0..32).map(|n| std::array::from_fn(|k| small(n, k, 5) * 2f32.powi(100))).collect();
    let d = run_typed(Layout::Sw128, &a, std::slice::from_ref(&b0), false, 4, true);
    for r in 0..64 {
        for n in 0..32 {
            let want: f32 = (0..K).map(|k| a[r][k] * b0[n][k]).sum();
            assert_eq!(d[r * 32 + n], want, "D[{r}][{n}]");
        }
    }
    let tiny: [[f32; K]; 64] =
        std::array::from_fn(|r| std::array::from_fn(|k| if (r + k) % 3 == 0 { 2f32.powi(-127) } else { 0.0 }));
    let big: Vec<[f32; K]> = (0..32).map(|n| std::array::from_fn(|k| 2f32.powi(100 + ((n + k) % 20) as i32))).collect();
    let d = run_typed(Layout::Interleave, &tiny, std::slice::from_ref(&big), false, 5, true);
    for r in 0..64 {
        for n in 0..32 {
            let want: f32 = (0..K).map(|k| tiny[r][k] * big[n][k]).sum();
            assert_eq!(d[r * 32 + n], want, "D[{r}][{n}]");
        }
    }
}

#[test]
fn chained_groups_complete_in_order() {
    let a: [[f32; K]; 64] = std::array::from_fn(|r| std::array::from_fn(|k| small(r, k, 2)));
    let b0: Vec<[f32; K]> = (0..32).map(|n| std::array::from_fn(|k| small(n, k, 3))).collect();
    let b1: Vec<[f32; K]> = (0..32).map(|n| std::array::from_fn(|k| small(n, k, 4))).collect();
    for seed in 0..3 {
        let d = run(Layout::Sw128, &a, &[b0.clone(), b1.clone()], true, seed);
        for r in 0..64 {
            for n in 0..32 {
                let want: f32 = (0..K).map(|k| a[r][k] * b0[n][k] + (a[r][k] - 1.0) * b1[n][k]).sum();
                assert_eq!(d[r * 32 + n], want, "D[{r}][{n}]");
            }
        }
    }
}

#[test]
fn overwriting_b_before_the_group_completes_is_a_hazard() {
    let e = launch(&LaunchConfig::new(Arch::Sm90a, 1, 128, 8192), || {
        let base = smem::dynamic_base();
        let tile = base + 1024;
        let mut acc = [0f32; 16];
        wgmma::fence();
        unsafe { wgmma::mma_f16(&mut acc, [0; 4], desc(Layout::Sw128, tile), false) };
        wgmma::commit_group();
        // Missing wait_group before the stage is refilled.
        smem::st_u32(tile, 0);
    })
    .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Hazard, "{e}");
    assert!(e.message.contains("still reads"), "{e}");
}

#[test]
fn mma_without_fence_is_reported() {
    let e = launch(&LaunchConfig::new(Arch::Sm90a, 1, 128, 8192), || {
        let tile = smem::dynamic_base() + 1024;
        let mut acc = [0f32; 16];
        unsafe { wgmma::mma_f16(&mut acc, [0; 4], desc(Layout::Sw128, tile), false) };
    })
    .unwrap_err();
    assert!(e.message.contains("wgmma.fence"), "{e}");
}

/// A B tile written by threads reaches wgmma (the async proxy) only through `fence.proxy.async`
/// in the writers and a barrier to the issuing threads: without the fence, or with the producer's
/// arrival before its stores, the read is a hazard — whatever the interleaving, since the model
/// tracks which fenced stores each thread is ordered after (`exec::Published`).
#[test]
fn operands_written_by_threads_need_a_proxy_fence_and_a_barrier() {
    // 0: correct; 1: no fence (bar.sync only); 2: a producer warp arrives before its stores;
    // 3: the producer warp in the right order.
    let run = |fault: u32, seed: u64| {
        let sched = Schedule { seed, completion: Completion::Random, ..Schedule::default() };
        launch(&LaunchConfig::new(Arch::Sm90a, 1, 160, 8192).with_schedule(sched), || {
            let base = smem::dynamic_base();
            let (bar, tile) = (base, base + 1024);
            let tid = sreg::tid_x();
            if tid == 0 {
                mbarrier::init(bar, 1);
                fence::mbarrier_init();
            }
            match fault {
                0 | 1 => {
                    if tid < 128 {
                        for i in (tid..1024).step_by(128) {
                            smem::st_u32(tile + 4 * i, 0x3C00_3C00);
                        }
                        if fault == 0 {
                            fence::proxy_async();
                        }
                    }
                    barrier::sync_all();
                }
                _ => {
                    barrier::sync_all();
                    if tid >= 128 {
                        let lane = tid - 128;
                        if fault == 2 && lane == 0 {
                            mbarrier::arrive(bar);
                        }
                        for i in (lane..1024).step_by(32) {
                            smem::st_u32(tile + 4 * i, 0x3C00_3C00);
                        }
                        fence::proxy_async();
                        warp::sync(u32::MAX);
                        if fault == 3 && lane == 0 {
                            mbarrier::arrive(bar);
                        }
                        return;
                    }
                    while !mbarrier::try_wait(bar, 0) {}
                }
            }
            if tid < 128 {
                let mut acc = [0f32; 16];
                wgmma::fence();
                unsafe { wgmma::mma_f16(&mut acc, [0x3C00_3C00; 4], desc(Layout::Sw128, tile), false) };
                wgmma::commit_group();
                wgmma::wait_group(0, &mut acc);
                assert!(acc.iter().all(|&v| v == 16.0), "{acc:?}");
            }
        })
    };
    for seed in 0..3 {
        run(0, seed).unwrap();
        run(3, seed).unwrap();
        for fault in [1, 2] {
            let e = run(fault, seed).unwrap_err();
            assert_eq!(e.kind, ErrorKind::Hazard, "fault {fault}: {e}");
            assert!(e.message.contains("fence.proxy.async and a barrier"), "fault {fault}: {e}");
        }
    }
}
