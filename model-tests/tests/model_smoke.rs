//! The toolchain smoke kernels (`diag/kernel/src/smoke.rs`) in the device model, with the checks the
//! H200 smoke test (`tests/tests/gpu_smoke.rs`, `nvfp4_gemm_diag::smoke`) applies on hardware: the
//! cluster + mbarrier + DSMEM + 128B-swizzled TMA kernel (on both architectures), and the TMEM
//! allocation kernel (sm_100a), whose address must be read back, not assumed.

use nvfp4_gemm::driver::tensor_map::TiledMapEncoder;
use nvfp4_gemm_diag_abi::smoke::{
    self, SmokeParams, SMOKE_CLUSTER, SMOKE_THREADS, SMOKE_TMA_COLS, SMOKE_TMA_ROWS, SMOKE_WORDS_PER_THREAD,
};
use nvfp4_gemm_diag_kernel::smoke::{smoke_tma_cluster, smoke_tmem};
use nvfp4_gemm_model_tests::*;

#[test]
fn model_sm90_and_sm100_smoke_tma_cluster() {
    let geom = smoke::launch();
    let n = (geom.grid * SMOKE_TMA_ROWS * SMOKE_TMA_COLS) as usize;
    let input: Vec<u8> = (0..n).map(|i| (i.wrapping_mul(131) % 251) as u8 + 1).collect();
    for arch in [Arch::Sm90a, Arch::Sm100a] {
        let src = DeviceBuf::from_bytes(&input);
        let tile_out = DeviceBuf::from_bytes(&vec![0xAA; n]);
        let words_n = (geom.grid * SMOKE_THREADS * SMOKE_WORDS_PER_THREAD) as usize;
        let words = DeviceBuf::from_bytes(&vec![0xEF; 4 * words_n]);
        let map = ModelEncoder.encode(&smoke::tile_map(), src.addr()).expect("map");
        let maps = [map];
        let p = SmokeParams { map: maps.as_ptr() as u64, tile_out: tile_out.addr(), words: words.addr() };
        let cfg = launch_config(arch, geom, 1, &ModelRun::default());
        // SAFETY: the buffers have the sizes the kernel's contract asks for.
        nvfp4_gemm_model::launch(&cfg, || unsafe { smoke_tma_cluster(p) }).unwrap_or_else(|e| panic!("{arch:?}: {e}"));
        assert_eq!(tile_out.bytes(), &input[..], "{arch:?}: the swizzled tile did not round-trip");
        let w: Vec<u32> = words.bytes().chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
        for (t, c) in w.chunks(SMOKE_WORDS_PER_THREAD as usize).enumerate() {
            let cta = t as u32 / SMOKE_THREADS;
            assert_eq!(c, [cta % SMOKE_CLUSTER, SMOKE_CLUSTER, 1, 0xC0DE], "{arch:?}: thread {t}");
        }
    }
}

/// Two CTAs per SM allocating 32 columns each: the allocator's placement decides the addresses,
/// and the kernel reports what it read back.
#[test]
fn model_n128_smoke_tmem_reads_the_address_back() {
    for (placement, expected) in [(TmemPlacement::Highest, [480, 448]), (TmemPlacement::Lowest, [0, 32])] {
        let out = DeviceBuf::zeroed(8);
        let geom = nvfp4_gemm_abi::launch::LaunchGeometry { grid: 2, block: 32, cluster: 1, smem_bytes: 16 };
        let run = ModelRun { tmem: placement, ..ModelRun::default() };
        let cfg = launch_config(Arch::Sm100a, geom, 2, &run);
        let p = out.addr() as usize;
        // SAFETY: `out` holds one word per CTA.
        nvfp4_gemm_model::launch(&cfg, || unsafe { smoke_tmem(p as *mut u32) }).unwrap_or_else(|e| panic!("{e}"));
        let got: Vec<u32> = out.bytes().chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
        assert_eq!(got.len(), 2);
        let mut cols = [got[0] & 0xFFFF, got[1] & 0xFFFF];
        cols.sort_unstable();
        let mut want = expected;
        want.sort_unstable();
        assert_eq!(cols, want, "{placement:?}: {got:x?}");
    }
}
