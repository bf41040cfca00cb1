//! Stores to global memory that plain Rust writes do not give: a predicated `st.global` without
//! a branch around it.
//!
//! A Rust `if cond { *p = v }` compiles to a branch; with the epilogue's bounds-checked stores,
//! ptxas emitted each as a divergent branch region (`BSSY`/`BSYNC`/`BRA`) around a generic `ST.E`,
//! about a dozen instructions per store with the address arithmetic.

#[cfg(target_arch = "nvptx64")]
use core::arch::asm;

/// `@p st.global.v4.u32 [a], {v0, v1, v2, v3};` with `p = pred` (PTX ISA 1.0 `st`,
/// `cvta.to.global`; every target): stores 16 bytes at `a` where `pred` holds, as one predicated
/// instruction. Any thread.
///
/// # Safety
/// Where `pred` is true, `a` must be a 16-byte aligned generic address of global memory, valid
/// for writes, that no other thread accesses concurrently. Where it is false, `a` is not used.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn st_v4_u32_if(a: *mut u32, v: [u32; 4], pred: bool) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: the caller upholds this function's contract (see `# Safety`).
    unsafe {
        asm!(
            "{{",
            ".reg .pred p;",
            ".reg .u64 g;",
            "setp.ne.u32 p, {c}, 0;",
            "cvta.to.global.u64 g, {a};",
            "@p st.global.v4.u32 [g], {{{v0}, {v1}, {v2}, {v3}}};",
            "}}",
            c = in(reg32) pred as u32,
            a = in(reg64) a as u64,
            v0 = in(reg32) v[0],
            v1 = in(reg32) v[1],
            v2 = in(reg32) v[2],
            v3 = in(reg32) v[3],
            options(nostack)
        )
    };
    #[cfg(not(target_arch = "nvptx64"))]
    if pred {
        // SAFETY: as above. (Global memory is host memory in the model, untracked: docs/model.md §6.)
        unsafe { (a as *mut [u32; 4]).write_unaligned(v) };
    }
}
