//! Runs the end-to-end smoke kernel (`smoke_tma_cluster`, see `diag/kernel/src/smoke.rs`): a
//! diagnostic that the toolchain, tensor-map encoding, cluster launch, mbarriers and TMA work on
//! this device.

use crate::{driver_error, DiagKernels};
use cudarc::driver::DevicePtr;
use nvfp4_gemm::driver::launch::{launch, set_max_dynamic_smem};
use nvfp4_gemm::driver::tensor_map;
use nvfp4_gemm::{Gpu, Result};
use nvfp4_gemm_diag_abi::smoke::{self, *};

/// What the smoke run found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmokeReport {
    /// CTAs launched (clusters of [`SMOKE_CLUSTER`]).
    pub ctas: u32,
    /// Tile bytes that came back different from the input (0 = TMA + swizzle + copy-back correct).
    pub tile_mismatches: usize,
    /// Threads whose status words were wrong (cluster rank/size, peer arrival, marker).
    pub word_mismatches: usize,
}

impl SmokeReport {
    /// True when every byte and word came back as expected.
    pub fn passed(&self) -> bool {
        self.tile_mismatches == 0 && self.word_mismatches == 0
    }
}

/// Launches the smoke kernel on 4 CTAs (2 clusters of 2) and checks everything it wrote.
pub fn run_smoke(gpu: &Gpu) -> Result<SmokeReport> {
    let geom = smoke::launch();
    let ctas = geom.grid;
    let rows = ctas * SMOKE_TMA_ROWS;
    let n = (rows * SMOKE_TMA_COLS) as usize;
    let input: Vec<u8> = (0..n).map(|i| (i.wrapping_mul(131) % 251) as u8 + 1).collect();
    let stream = gpu.context().default_stream();
    let d = |e| driver_error("running the smoke test", e);
    let src = stream.clone_htod(&input).map_err(d)?;
    let tile_out = stream.clone_htod(&vec![0xAAu8; n]).map_err(d)?;
    let words_n = (ctas * SMOKE_THREADS * SMOKE_WORDS_PER_THREAD) as usize;
    let words = stream.clone_htod(&vec![0xDEAD_BEEFu32; words_n]).map_err(d)?;

    let (src_ptr, _g0) = src.device_ptr(&stream);
    let map = tensor_map::encode(&smoke::tile_map(), src_ptr)?;
    let maps = stream.clone_htod(&map.0).map_err(d)?;

    let f = DiagKernels::load(gpu)?.function("smoke_tma_cluster")?;
    set_max_dynamic_smem(&f, geom.smem_bytes)?;
    {
        let (map, _g1) = maps.device_ptr(&stream);
        let (tile_out, _g2) = tile_out.device_ptr(&stream);
        let (words, _g3) = words.device_ptr(&stream);
        // SAFETY: `smoke_tma_cluster` takes one `SmokeParams`; the buffers have the sizes it needs.
        unsafe { launch(&f, &stream, geom, &SmokeParams { map, tile_out, words })? };
    }
    stream.synchronize().map_err(d)?;
    let tile = stream.clone_dtoh(&tile_out).map_err(d)?;
    let w = stream.clone_dtoh(&words).map_err(d)?;
    let tile_mismatches = tile.iter().zip(&input).filter(|(a, b)| a != b).count();
    let word_mismatches = w
        .chunks(SMOKE_WORDS_PER_THREAD as usize)
        .enumerate()
        .filter(|(t, c)| {
            let cta = *t as u32 / SMOKE_THREADS;
            c != &[cta % SMOKE_CLUSTER, SMOKE_CLUSTER, 1, 0xC0DE]
        })
        .count();
    Ok(SmokeReport { ctas, tile_mismatches, word_mismatches })
}
