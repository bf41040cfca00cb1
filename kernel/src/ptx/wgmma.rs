//! Hopper warpgroup MMA (`wgmma`, sm_90a): D(64×N, f32) += A(64×16, f16, registers) · B(16×N, f16, smem).
//!
//! Every instruction here is `.sync.aligned`: all 128 threads of the warpgroup (4 consecutive warps,
//! the first a multiple of 4) execute it together, under warpgroup-uniform control flow.
//!
//! The accumulators are registers that the tensor core writes asynchronously: between an `mma` and
//! the `wait_group` that covers it they must not be read or written. [`wait_group_fenced`] takes the
//! accumulator array through the wait so that the compiler cannot move uses of it above the wait.
//!
//! On the host every width maps to the model's one `wgmma` (N = 2 · accumulator registers): a new
//! width is one more `define_mma!` line.

#[cfg(target_arch = "nvptx64")]
use core::arch::asm;

/// A shared-memory matrix descriptor for wgmma (64-bit; PTX ISA §9.7.15.5.1.2.2), built by
/// `nvfp4_gemm_abi::sm90::WgmmaDesc`.
pub type SmemDesc = u64;

/// `wgmma.fence.sync.aligned;` (PTX ISA 8.0, sm_90a): orders register writes to A fragments and
/// accumulators before the next `mma_async`. Whole warpgroup.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub fn fence() {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: no operands.
    unsafe {
        asm!("wgmma.fence.sync.aligned;", options(nostack))
    };
    #[cfg(not(target_arch = "nvptx64"))]
    super::model::wgmma::fence();
}

/// `wgmma.commit_group.sync.aligned;` (PTX ISA 8.0, sm_90a): closes the group of this warpgroup's
/// uncommitted `mma_async`s. Whole warpgroup.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub fn commit_group() {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: no operands.
    unsafe {
        asm!("wgmma.commit_group.sync.aligned;", options(nostack))
    };
    #[cfg(not(target_arch = "nvptx64"))]
    super::model::wgmma::commit_group();
}

macro_rules! define_mma {
    ($(#[$doc:meta])* $name:ident, $wait:ident, $n:literal, $acc:literal, $first:literal $(, $i:literal)*) => {
        $(#[$doc])*
        ///
        /// PTX (ISA 8.0, sm_90a):
        /// `wgmma.mma_async.sync.aligned.m64nNk16.f32.f16.f16 {d..}, {a0..a3}, b_desc, p, 1, 1, 0;`
        /// with `p = scale_d != 0` (false: D = A·B, ignoring the old D). A is the thread's fragment:
        /// `a[0]` = rows (16w+g, cols 2q,2q+1), `a[1]` = row 16w+g+8, `a[2]` = row 16w+g cols
        /// 2q+8,2q+9, `a[3]` = row 16w+g+8 cols 2q+8,2q+9 (w warp, g = lane/4, q = lane%4).
        /// B is K-major (transpose-b = 0).
        ///
        /// # Safety
        /// Whole warpgroup, converged; `b` must describe valid shared memory that stays unchanged
        /// until a `wait_group` covers this MMA; a [`fence`] must precede the first MMA after the
        /// registers were written.
        #[inline(always)]
        #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
        pub unsafe fn $name(acc: &mut [f32; $acc], a: [u32; 4], b: SmemDesc, scale_d: u32) {
            #[cfg(not(target_arch = "nvptx64"))]
            // SAFETY: the model checks the descriptor; the caller's contract as above.
            unsafe { super::model::wgmma::mma_f16(acc, a, b, scale_d != 0) };
            #[cfg(target_arch = "nvptx64")]
            // SAFETY: the caller upholds this function's contract (see `# Safety`).
            unsafe {
                asm!(
                    "{{",
                    ".reg .pred p;",
                    "setp.ne.b32 p, {sd}, 0;",
                    concat!("wgmma.mma_async.sync.aligned.m64n", $n, "k16.f32.f16.f16 {{{", stringify!($first), "}",
                            $(", {", stringify!($i), "}",)* "}}, {{{a0}, {a1}, {a2}, {a3}}}, {b}, p, 1, 1, 0;"),
                    "}}",
                    inout(reg32) acc[$first], $(inout(reg32) acc[$i],)*
                    a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
                    b = in(reg64) b, sd = in(reg32) scale_d, options(nostack));
            }
        }

        /// `wgmma.wait_group.sync.aligned N;` (PTX ISA 8.0, sm_90a), with the accumulator array as
        /// an in/out operand: waits until at most `N` committed groups are pending, and keeps
        /// the compiler from touching `acc` across the wait. Whole warpgroup.
        #[inline(always)]
        #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
        pub fn $wait<const N: u32>(acc: &mut [f32; $acc]) {
            #[cfg(not(target_arch = "nvptx64"))]
            super::model::wgmma::wait_group(N, acc);
            #[cfg(target_arch = "nvptx64")]
            // SAFETY: waiting has no effect beyond ordering.
            unsafe {
                asm!(concat!("wgmma.wait_group.sync.aligned {n}; // {", stringify!($first), "}" $(, " {", stringify!($i), "}")*),
                     inout(reg32) acc[$first], $(inout(reg32) acc[$i],)* n = const N, options(nostack));
            }
        }
    };
}

define_mma!(/// m64n128k16, 64 f32 accumulators per thread.
    mma_m64n128k16, wait_group_fenced_n128, 128, 64, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17,
    18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45,
    46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63);
