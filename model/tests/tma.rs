//! TMA tensor copies: layouts, swizzle patterns against the ISA tables, out-of-bounds fill, packed
//! 4-bit elements, multicast.

use nvfp4_gemm_model::tensor_map::{encode_tiled, ElementType, Interleave, OobFill, Swizzle};
use nvfp4_gemm_model::*;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

/// The destination patterns of PTX ISA 9.0 §5.5.7 (each cell a 16-byte chunk; one row of the table
/// is 128 bytes; the pattern starts at a 1024 / 512 / 256-byte aligned address). Cell `j` of row
/// `i` holds the logical chunk `TABLE[i][j]`.
const SW128: [[u8; 8]; 8] = [
    [0, 1, 2, 3, 4, 5, 6, 7],
    [1, 0, 3, 2, 5, 4, 7, 6],
    [2, 3, 0, 1, 6, 7, 4, 5],
    [3, 2, 1, 0, 7, 6, 5, 4],
    [4, 5, 6, 7, 0, 1, 2, 3],
    [5, 4, 7, 6, 1, 0, 3, 2],
    [6, 7, 4, 5, 2, 3, 0, 1],
    [7, 6, 5, 4, 3, 2, 1, 0],
];
const SW64: [[u8; 8]; 4] =
    [[0, 1, 2, 3, 4, 5, 6, 7], [1, 0, 3, 2, 5, 4, 7, 6], [2, 3, 0, 1, 6, 7, 4, 5], [3, 2, 1, 0, 7, 6, 5, 4]];
const SW32: [[u8; 8]; 2] = [[0, 1, 2, 3, 4, 5, 6, 7], [1, 0, 3, 2, 5, 4, 7, 6]];

fn table(s: Swizzle) -> &'static [[u8; 8]] {
    match s {
        Swizzle::B128 => &SW128,
        Swizzle::B64 => &SW64,
        Swizzle::B32 => &SW32,
        Swizzle::None => &SW32[..1],
    }
}

/// Where logical byte `o` of a box lands, from the ISA table.
fn table_position(s: Swizzle, o: usize) -> usize {
    let t = table(s);
    let (line, chunk) = (o / 128, (o % 128) / 16);
    let row = &t[line % t.len()];
    let j = row.iter().position(|&c| c as usize == chunk).unwrap();
    line * 128 + j * 16 + o % 16
}

/// Loads one box with one thread and copies the shared image back out.
fn run_box(map: &[u8; 128], coords: Vec<i32>, bytes: u32, cfg: LaunchConfig) -> Vec<u8> {
    let out: Vec<AtomicU8> = (0..bytes).map(|_| AtomicU8::new(0xEE)).collect();
    let map_ptr = map.as_ptr() as u64;
    launch(&cfg, || {
        let base = smem::dynamic_base();
        let (bar, dst) = (base, base + 1024);
        if sreg::tid_x() == 0 {
            mbarrier::init(bar, 1);
            fence::mbarrier_init();
        }
        // Without this barrier the model reports other threads polling an uninitialized barrier.
        barrier::sync_all();
        if sreg::tid_x() == 0 {
            mbarrier::arrive_expect_tx(bar, bytes);
            tma::acquire_tensormap(map_ptr);
            unsafe {
                match coords.len() {
                    2 => tma::load_2d(dst, map_ptr, coords[0], coords[1], bar),
                    _ => tma::load_3d_hint(dst, map_ptr, [coords[0], coords[1], coords[2]], bar, 0),
                }
            }
        }
        while !mbarrier::try_wait(bar, 0) {}
        let mut i = sreg::tid_x() * 4;
        while i < bytes {
            let v = smem::ld_u32(dst + i).to_le_bytes();
            for k in 0..4 {
                out[(i + k) as usize].store(v[k as usize], Relaxed);
            }
            i += 4 * sreg::ntid_x();
        }
    })
    .unwrap();
    out.iter().map(|b| b.load(Relaxed)).collect()
}

#[repr(C, align(128))]
struct Map([u8; 128]);

#[test]
fn swizzle_patterns_match_the_isa_tables() {
    for (s, row) in [(Swizzle::B128, 128u32), (Swizzle::B64, 64), (Swizzle::B32, 32), (Swizzle::None, 64)] {
        let rows = 32u32;
        let g: Vec<u8> = (0..row * rows * 2).map(|i| (i * 7 + i / 251) as u8).collect();
        let map = Map(encode_tiled(
            ElementType::U8,
            2,
            g.as_ptr() as u64,
            &[row as u64, 2 * rows as u64],
            &[row as u64],
            &[row, rows],
            &[1, 1],
            Interleave::None,
            s,
            OobFill::Zero,
        )
        .unwrap());
        let img = run_box(&map.0, vec![0, rows as i32], row * rows, LaunchConfig::new(Arch::Sm90a, 1, 64, 8192));
        for o in 0..(row * rows) as usize {
            let want = g[(row * rows) as usize + o];
            assert_eq!(img[table_position(s, o)], want, "{s:?}: logical byte {o}");
        }
    }
}

#[test]
fn out_of_bounds_elements_are_zero() {
    // A 96 x 50 tensor of u16 (row pitch 256 bytes); a 32 x 16 box at (-8, 40) hangs off the
    // left and the bottom.
    let (w, h) = (96u64, 50u64);
    let g: Vec<u16> = (0..128 * h).map(|i| i as u16 + 1).collect();
    let map = Map(encode_tiled(
        ElementType::U16,
        2,
        g.as_ptr() as u64,
        &[w, h],
        &[256],
        &[32, 16],
        &[1, 1],
        Interleave::None,
        Swizzle::None,
        OobFill::Zero,
    )
    .unwrap());
    let img = run_box(&map.0, vec![-8, 40], 32 * 16 * 2, LaunchConfig::new(Arch::Sm90a, 1, 32, 4096));
    for r in 0..16i64 {
        for c in 0..32i64 {
            let (gx, gy) = (c - 8, 40 + r);
            let want = if gx >= 0 && gy < h as i64 { g[(gy * 128 + gx) as usize] } else { 0 };
            let o = ((r * 32 + c) * 2) as usize;
            assert_eq!(u16::from_le_bytes([img[o], img[o + 1]]), want, "row {r} col {c}");
        }
    }
}

/// The seed's 3D FP4 map: dims {256, rows, K/256}, strides {K/2, 128} bytes, box {256, R, 1}.
#[test]
fn packed_fp4_3d_box_with_128b_swizzle() {
    let (rows, k) = (64u64, 512u64);
    let g: Vec<u8> = (0..rows * k / 2).map(|i| (i * 13 + 5) as u8).collect();
    let map = Map(encode_tiled(
        ElementType::U4x16Align8,
        3,
        g.as_ptr() as u64,
        &[256, rows, k / 256],
        &[k / 2, 128],
        &[256, 32, 1],
        &[1, 1, 1],
        Interleave::None,
        Swizzle::B128,
        OobFill::Zero,
    )
    .unwrap());
    // Rows 32..64, K block 1 (values 256..512 = bytes 128..256 of each row).
    let img = run_box(&map.0, vec![0, 32, 1], 32 * 128, LaunchConfig::new(Arch::Sm100a, 1, 64, 8192));
    for r in 0..32usize {
        for b in 0..128usize {
            let want = g[(32 + r) * (k as usize / 2) + 128 + b];
            assert_eq!(img[table_position(Swizzle::B128, r * 128 + b)], want, "row {r} byte {b}");
        }
    }
}

#[test]
fn encoder_rejects_what_the_driver_rejects_or_the_model_lacks() {
    let e = |dims: &[u64], strides: &[u64], boxd: &[u32], s| {
        encode_tiled(
            ElementType::U8,
            dims.len(),
            0x1000,
            dims,
            strides,
            boxd,
            &vec![1; dims.len()],
            Interleave::None,
            s,
            OobFill::Zero,
        )
    };
    assert!(e(&[128, 8], &[128], &[128, 8], Swizzle::B128).is_ok());
    assert!(e(&[128, 8], &[120], &[128, 8], Swizzle::B128).unwrap_err().contains("multiple of 16"));
    assert!(e(&[128, 8], &[128], &[8, 8], Swizzle::None).unwrap_err().contains("16 bytes"));
    assert!(e(&[256, 8], &[256], &[256, 8], Swizzle::B128).unwrap_err().contains("exceeds"));
    assert!(e(&[128, 8], &[128], &[64, 8], Swizzle::B128).unwrap_err().contains("not modelled"));
    assert!(e(&[128, 8], &[128], &[128, 300], Swizzle::None).unwrap_err().contains("1..=256"));
}

/// A map of `g` as 8 rows of 128 bytes whose one box is the whole tensor (no swizzle).
fn whole_128x8(g: &[u8]) -> Map {
    Map(encode_tiled(
        ElementType::U8,
        2,
        g.as_ptr() as u64,
        &[128, 8],
        &[128],
        &[128, 8],
        &[1, 1],
        Interleave::None,
        Swizzle::None,
        OobFill::Zero,
    )
    .unwrap())
}

#[test]
fn multicast_lands_in_every_masked_cta() {
    let g: Vec<u8> = (0..128 * 8).map(|i| i as u8).collect();
    let map = whole_128x8(&g);
    let mp = map.0.as_ptr() as u64;
    let ok: Vec<AtomicU8> = (0..4).map(|_| AtomicU8::new(0)).collect();
    launch(&LaunchConfig::new(Arch::Sm90a, 4, 32, 4096).with_cluster(2), || {
        let base = smem::dynamic_base();
        let (bar, dst) = (base, base + 1024);
        if sreg::tid_x() == 0 {
            mbarrier::init(bar, 1);
            fence::mbarrier_init();
            mbarrier::arrive_expect_tx(bar, 1024);
        }
        cluster::sync();
        if sreg::tid_x() == 0 && sreg::cluster_ctarank() == 0 {
            let me = sreg::cluster_ctarank();
            tma::acquire_tensormap(mp);
            unsafe {
                tma::load_2d_multicast(cluster::map_shared(dst, me), mp, 0, 0, cluster::map_shared(bar, me), 0b11)
            };
        }
        while !mbarrier::try_wait_cluster(bar, 0) {}
        if sreg::tid_x() == 0 {
            let v = smem::ld_u32(dst + 4 * 100);
            ok[sreg::ctaid_x() as usize].store((v == u32::from_le_bytes([144, 145, 146, 147])) as u8, Relaxed);
        }
        cluster::sync();
    })
    .unwrap();
    assert!(ok.iter().all(|o| o.load(Relaxed) == 1));
}

#[test]
fn refilling_a_stage_that_is_still_being_written_is_a_hazard() {
    let g = vec![0u8; 128 * 8];
    let map = whole_128x8(&g);
    let mp = map.0.as_ptr() as u64;
    let e = launch(&LaunchConfig::new(Arch::Sm90a, 1, 32, 4096), || {
        let base = smem::dynamic_base();
        if sreg::tid_x() == 0 {
            mbarrier::init(base, 1);
            fence::mbarrier_init();
            mbarrier::arrive_expect_tx(base, 2048);
            tma::acquire_tensormap(mp);
            unsafe {
                tma::load_2d(base + 1024, mp, 0, 0, base);
                tma::load_2d(base + 1024, mp, 0, 0, base);
            }
        }
    })
    .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Hazard, "{e}");
    assert!(e.message.contains("also writes"), "{e}");
}

#[test]
fn a_copy_through_a_map_this_thread_has_not_acquired_is_a_hazard() {
    let g = vec![0u8; 128 * 8];
    let map = whole_128x8(&g);
    let mp = map.0.as_ptr() as u64;
    let e = launch(&LaunchConfig::new(Arch::Sm90a, 1, 32, 4096), || {
        let base = smem::dynamic_base();
        // Another thread's acquire does not cover thread 0's copy.
        if sreg::tid_x() == 1 {
            tma::acquire_tensormap(mp);
        }
        if sreg::tid_x() == 0 {
            mbarrier::init(base, 1);
            fence::mbarrier_init();
            mbarrier::arrive_expect_tx(base, 1024);
            tma::prefetch_tensormap(mp);
            unsafe { tma::load_2d(base + 1024, mp, 0, 0, base) };
        }
    })
    .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Hazard, "{e}");
    assert!(e.message.contains("has not acquired"), "{e}");
}
