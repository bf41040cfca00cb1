//! Warp-level primitives: electing one lane, and reconverging a warp.

use core::arch::asm;

/// `elect.sync _|p, 0xffffffff;` (PTX ISA 8.0, sm_90): true in exactly one lane of the warp (the
/// hardware picks it), false in the others. The whole warp must execute it, converged; a role that
/// needs one issuing thread (TMA, `tcgen05.mma`, `tcgen05.cp`, `tcgen05.commit`) runs under
/// `if elect_one() { .. }` and then reconverges with [`sync`].
#[inline(always)]
pub fn elect_one() -> bool {
    let elected: u32;
    // SAFETY: a full-warp collective with no memory effects; call sites are warp-uniform.
    unsafe {
        asm!(
            "{{",
            ".reg .pred p;",
            "elect.sync _|p, 0xffffffff;",
            "selp.u32 {e}, 1, 0, p;",
            "}}",
            e = out(reg32) elected,
            options(nostack));
    }
    elected != 0
}

/// `bar.warp.sync 0xffffffff;` (PTX ISA 6.0, sm_70; `__syncwarp()`): waits until every lane of the
/// warp has reached it, so that the warp runs converged again after a branch only some lanes
/// took (for example the elected lane's role loop) and before a `.aligned` instruction.
#[inline(always)]
pub fn sync() {
    // SAFETY: every lane of the warp reaches this call.
    unsafe { asm!("bar.warp.sync 0xffffffff;", options(nostack)) };
}
