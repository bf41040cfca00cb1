//! End-to-end smoke kernels: they prove that the toolchain (rustc NVPTX → PTX → ptxas), the host's
//! tensor-map encoding and cluster launch, and this crate's `ptx` wrappers work together on hardware.
//!
//! `smoke_tma_cluster` (both architectures), launched as clusters of 2 CTAs of 128 threads:
//! 1. thread 0 initialises two mbarriers (`full`: TMA completion; `peer`: one remote arrival);
//! 2. cluster barrier, so both CTAs' barriers exist before anyone arrives on them;
//! 3. thread 0 loads the CTA's 64×128-byte tile of a `u8` matrix with a 2D TMA (128-byte swizzle)
//!    completing on `full`, and arrives on the *other* CTA's `peer` barrier through DSMEM;
//! 4. all threads wait on both, then copy the tile back to global memory, undoing the swizzle
//!    (so the host checks the swizzle pattern the GEMM kernels rely on), and write
//!    `[cluster rank, cluster size, peer-ok, 0xC0DE]` per thread.

use crate::ptx::{cluster, fence, mbarrier::Mbarrier, smem, sreg, tma};
use nvfp4_gemm_diag_abi::smoke::{SmokeParams, SMOKE_TMA_COLS, SMOKE_TMA_ROWS, SMOKE_WORDS_PER_THREAD};

/// See the module docs. `p.map` is a 2D `u8` tensor map (inner dim 128 bytes, box 128×64,
/// 128-byte swizzle) over `gridDim.x * 64` rows; `p.tile_out` has the same shape; `p.words` holds
/// 4 words per thread.
///
/// # Safety
/// Launched as `nvfp4_gemm_diag_abi::smoke::launch` says, with `p` pointing at buffers of those sizes.
#[crate::ptx::kernel]
pub unsafe fn smoke_tma_cluster(p: SmokeParams) {
    let map = p.map as *const tma::TensorMap;
    let tile_out = p.tile_out as *mut u8;
    let words = p.words as *mut u32;
    // SAFETY: the caller upholds this function's contract (see `# Safety`).
    unsafe {
        let base = smem::dynamic_base();
        let full = Mbarrier(base);
        let peer = Mbarrier(base.add(8));
        let tile = base.add(1024);
        let tid = sreg::tid_x();
        let rank = sreg::cluster_ctarank();
        let nrank = sreg::cluster_nctarank();
        let cta = sreg::ctaid_x();

        if tid == 0 {
            tma::acquire_tensormap(map);
            tma::prefetch_tensormap(map);
            full.init(1);
            peer.init(1);
            fence::mbarrier_init();
        }
        cluster::sync();

        if tid == 0 {
            full.arrive_expect_tx(SMOKE_TMA_ROWS * SMOKE_TMA_COLS);
            tma::load_2d(tile, map, 0, (cta * SMOKE_TMA_ROWS) as i32, full);
            peer.arrive_cluster(if rank + 1 == nrank { 0 } else { rank + 1 });
        }
        full.wait(0);
        while !peer.try_wait_cluster(0) {}

        // Thread t copies half a row: row t/2, bytes 64*(t%2) .. +64, reading the swizzled image.
        let row = tid / 2;
        let out_row = tile_out.add(((cta * SMOKE_TMA_ROWS + row) * SMOKE_TMA_COLS) as usize) as *mut u32;
        let mut c = (tid % 2) * 64;
        while c < (tid % 2) * 64 + 64 {
            let chunk = (c / 16) ^ (row % 8);
            let v = smem::ld_u32(tile.add(row * 128 + chunk * 16 + c % 16));
            *out_row.add((c / 4) as usize) = v;
            c += 4;
        }

        let w = words.add(((cta * sreg::ntid_x() + tid) * SMOKE_WORDS_PER_THREAD) as usize);
        *w = rank;
        *w.add(1) = nrank;
        *w.add(2) = 1;
        *w.add(3) = 0xC0DE;
        // Nobody leaves while the peer could still arrive on our barrier.
        cluster::sync();
    }
}

/// sm_100a only: one warp allocates 32 TMEM columns, reads the address back, relinquishes the
/// allocation permit and frees them; thread 0 writes the address to `out[ctaid]`. Assembled for
/// sm_100a by ptxas; there is no B200 here to run it.
///
/// # Safety
/// `out` must hold one word per CTA; one warp or more per CTA.
#[cfg(any(arch_sm100, not(target_arch = "nvptx64")))]
#[crate::ptx::kernel]
pub unsafe fn smoke_tmem(out: *mut u32) {
    // SAFETY: the caller upholds this function's contract (see `# Safety`).
    unsafe {
        use crate::ptx::{barrier, tcgen05};
        let slot = smem::dynamic_base();
        let warp = sreg::warp_id();
        if warp == 0 {
            tcgen05::alloc(slot, 32);
            tcgen05::relinquish_alloc_permit();
        }
        barrier::sync_all();
        let taddr = smem::ld_u32(slot);
        if sreg::tid_x() == 0 {
            *out.add(sreg::ctaid_x() as usize) = taddr;
        }
        if warp == 0 {
            tcgen05::dealloc(taddr, 32);
        }
    }
}
