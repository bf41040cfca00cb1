//! Hopper warpgroup MMA (`wgmma`, sm_90a): D(64×N, f32) += A(64×16, f16 or bf16, registers) ·
//! B(16×N, the same type, smem).
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

/// The accumulator registers of one thread: 64 f32, enough for `m64n128k16`. Narrower widths use
/// the first `N / 2`. One array for every width lets ptxas give all widths the same registers; the
/// wgmma register analysis is per function, and with one array per width it serializes the MMAs
/// (C7512, which `cargo xtask build-ptx` treats as an error).
pub type Accumulators = [f32; 64];

/// One `mma_async` wrapper: `$name`, operands of type `$ty` (`"f16"` or `"bf16"`), the model's
/// `$model` on the host (see [`define_mma`]).
macro_rules! mma_fn {
    ($(#[$doc:meta])* $name:ident, $ty:literal, $model:ident, $n:literal, $acc:literal, $first:literal $(, $i:literal)*) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// Whole warpgroup, converged; `b` must describe valid shared memory that stays unchanged
        /// until a `wait_group` covers this MMA; a [`fence`] must precede the first MMA after the
        /// registers were written.
        #[inline(always)]
        #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
        pub unsafe fn $name(acc: &mut Accumulators, a: [u32; 4], b: SmemDesc, scale_d: u32) {
            #[cfg(not(target_arch = "nvptx64"))]
            // SAFETY: the model checks the descriptor; the caller's contract as above.
            unsafe { super::model::wgmma::$model(&mut acc[..$acc], a, b, scale_d != 0) };
            // The descriptor goes in as two 32-bit halves joined inside the asm: its high word is a
            // constant of the tile and only the low word moves from MMA to MMA, so ptxas keeps
            // one 32-bit add per MMA instead of a 64-bit add with carry.
            #[cfg(target_arch = "nvptx64")]
            let (b_lo, b_hi) = (b as u32, (b >> 32) as u32);
            #[cfg(target_arch = "nvptx64")]
            // SAFETY: the caller upholds this function's contract (see `# Safety`).
            unsafe {
                asm!(
                    "{{",
                    ".reg .pred p;",
                    ".reg .b64 desc;",
                    "setp.ne.b32 p, {sd}, 0;",
                    "mov.b64 desc, {{{b_lo}, {b_hi}}};",
                    concat!("wgmma.mma_async.sync.aligned.m64n", $n, "k16.f32.", $ty, ".", $ty, " {{{", stringify!($first), "}",
                            $(", {", stringify!($i), "}",)* "}}, {{{a0}, {a1}, {a2}, {a3}}}, desc, p, 1, 1, 0;"),
                    "}}",
                    inout(reg32) acc[$first], $(inout(reg32) acc[$i],)*
                    a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
                    b_lo = in(reg32) b_lo, b_hi = in(reg32) b_hi, sd = in(reg32) scale_d, options(nostack));
            }
        }
    };
}

macro_rules! define_mma {
    ($(#[$doc:meta])* $name:ident, $name_bf16:ident, $wait:ident, $n:literal, $acc:literal, $first:literal $(, $i:literal)*) => {
        mma_fn!(
            $(#[$doc])*
            ///
            /// PTX (ISA 8.0, sm_90a):
            /// `wgmma.mma_async.sync.aligned.m64nNk16.f32.f16.f16 {d..}, {a0..a3}, b_desc, p, 1, 1, 0;`
            /// with `p = scale_d != 0` (false: D = A·B, ignoring the old D). A is the thread's fragment:
            /// `a[0]` = rows (16w+g, cols 2q,2q+1), `a[1]` = row 16w+g+8, `a[2]` = row 16w+g cols
            /// 2q+8,2q+9, `a[3]` = row 16w+g+8 cols 2q+8,2q+9 (w warp, g = lane/4, q = lane%4).
            /// B is K-major (transpose-b = 0).
            $name, "f16", mma_f16, $n, $acc, $first $(, $i)*);
        mma_fn!(
            #[doc = concat!("[`", stringify!($name), "`] with bf16 A and B: `wgmma.mma_async.sync.aligned.m64n", $n,
                            "k16.f32.bf16.bf16` (the same fragments and descriptors: both types are 16 bits).")]
            $name_bf16, "bf16", mma_bf16, $n, $acc, $first $(, $i)*);

        /// `wgmma.wait_group.sync.aligned N;` (PTX ISA 8.0, sm_90a), with the accumulator array as
        /// an in/out operand: waits until at most `N` committed groups are pending, and keeps
        /// the compiler from touching `acc` across the wait. Whole warpgroup.
        #[inline(always)]
        #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
        pub fn $wait<const N: u32>(acc: &mut Accumulators) {
            #[cfg(not(target_arch = "nvptx64"))]
            super::model::wgmma::wait_group(N, &mut acc[..$acc]);
            #[cfg(target_arch = "nvptx64")]
            // SAFETY: waiting has no effect beyond ordering.
            unsafe {
                asm!(concat!("wgmma.wait_group.sync.aligned {n}; // {", stringify!($first), "}" $(, " {", stringify!($i), "}")*),
                     inout(reg32) acc[$first], $(inout(reg32) acc[$i],)* n = const N, options(nostack));
            }
        }
    };
}

define_mma!(/// m64n16k16, 8 f32 accumulators per thread (the first 8 of the array).
    mma_m64n16k16, mma_m64n16k16_bf16, wait_group_fenced_n16, 16, 8, 0, 1, 2, 3, 4, 5, 6, 7);
define_mma!(/// m64n64k16, 32 f32 accumulators per thread (the first 32 of the array).
    mma_m64n64k16, mma_m64n64k16_bf16, wait_group_fenced_n64, 64, 32, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18,
    19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31);
define_mma!(/// m64n128k16, 64 f32 accumulators per thread.
    mma_m64n128k16, mma_m64n128k16_bf16, wait_group_fenced_n128, 128, 64, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17,
    18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45,
    46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63);

/// One wgmma width `m64nNk16`, so that kernel code can be generic over N.
pub trait MmaShape {
    /// The N of the instruction; the first `N / 2` accumulators of the array are used.
    const N: u32;
    /// `mma_async` of this width (see [`mma_m64n128k16`]).
    ///
    /// # Safety
    /// As [`mma_m64n128k16`].
    unsafe fn mma(acc: &mut Accumulators, a: [u32; 4], b: SmemDesc, scale_d: u32);
    /// `mma_async` of this width with bf16 A and B (see [`mma_m64n128k16_bf16`]).
    ///
    /// # Safety
    /// As [`mma_m64n128k16`].
    unsafe fn mma_bf16(acc: &mut Accumulators, a: [u32; 4], b: SmemDesc, scale_d: u32);
    /// `wait_group W` with this width's accumulators fenced (see [`wait_group_fenced_n128`]).
    fn wait<const W: u32>(acc: &mut Accumulators);
}

macro_rules! shape {
    ($ty:ident, $n:literal, $mma:ident, $mma_bf16:ident, $wait:ident) => {
        #[doc = concat!("`wgmma m64n", stringify!($n), "k16`.")]
        pub struct $ty;
        impl MmaShape for $ty {
            const N: u32 = $n;
            #[inline(always)]
            unsafe fn mma(acc: &mut Accumulators, a: [u32; 4], b: SmemDesc, scale_d: u32) {
                // SAFETY: the caller upholds the contract of the wrapper (the same).
                unsafe { $mma(acc, a, b, scale_d) }
            }
            #[inline(always)]
            unsafe fn mma_bf16(acc: &mut Accumulators, a: [u32; 4], b: SmemDesc, scale_d: u32) {
                // SAFETY: the caller upholds the contract of the wrapper (the same).
                unsafe { $mma_bf16(acc, a, b, scale_d) }
            }
            #[inline(always)]
            fn wait<const W: u32>(acc: &mut Accumulators) {
                $wait::<W>(acc)
            }
        }
    };
}

shape!(N16, 16, mma_m64n16k16, mma_m64n16k16_bf16, wait_group_fenced_n16);
shape!(N64, 64, mma_m64n64k16, mma_m64n64k16_bf16, wait_group_fenced_n64);
shape!(N128, 128, mma_m64n128k16, mma_m64n128k16_bf16, wait_group_fenced_n128);
