//! Shared memory: the dynamic (launch-sized) window and 32-bit `.shared::cta` addresses.

#[cfg(target_arch = "nvptx64")]
use core::arch::asm;

/// A `.shared::cta` address (32 bits), as mbarrier, TMA, wgmma and tcgen05 operands take it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(transparent)]
pub struct SmemAddr(pub u32);

impl SmemAddr {
    /// The address `bytes` further on.
    #[inline(always)]
    pub const fn add(self, bytes: u32) -> Self {
        SmemAddr(self.0 + bytes)
    }

    /// The same address, as a value LLVM cannot see through: an empty `asm!` that is not `pure`,
    /// so it is neither hoisted out of a loop nor merged with another copy. Each copy of a loop
    /// unrolled over the stages of a ring adds an opaque zero (`SmemAddr(0).opaque().0`) to its
    /// offsets; otherwise LLVM hoists every copy's `base + constant` (weights, scales,
    /// descriptors) out of the loop, and each holds a register through it (which made ptxas
    /// serialize the wgmma pipeline). ptxas still sees the zero and folds the constants into the
    /// shared loads' immediate offsets and the descriptors. Emits no instruction.
    #[inline(always)]
    pub fn opaque(self) -> Self {
        #[cfg(target_arch = "nvptx64")]
        let a = {
            let mut a = self.0;
            // SAFETY: a comment only: no instruction, no memory access.
            unsafe { asm!("/* opaque {a} */", a = inout(reg32) a, options(nomem, nostack, preserves_flags)) };
            a
        };
        #[cfg(not(target_arch = "nvptx64"))]
        let a = self.0;
        SmemAddr(a)
    }
}

#[cfg(target_arch = "nvptx64")]
/// Alignment carrier for the dynamic window: `.extern .shared .align 1024`, what the 128-byte
/// swizzle patterns of TMA, wgmma and tcgen05 need (they repeat every 1024 bytes).
#[repr(C, align(1024))]
struct Align1024([u8; 1024]);

/// Generic pointer to the start of the dynamic shared memory (`extern __shared__`). Device only:
/// the model has no generic pointers into shared memory.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn dynamic_ptr() -> *mut u8 {
    // The intrinsic only names the `.extern .shared` symbol; its size is set at launch.
    core::intrinsics::gpu::gpu_launch_sized_workgroup_mem::<Align1024>() as *mut u8
}

/// `.shared::cta` address of the start of the dynamic shared memory (1024-byte aligned).
///
/// PTX: `cvta.to.shared.u64 d, p;` (PTX ISA 2.0).
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub fn dynamic_base() -> SmemAddr {
    #[cfg(target_arch = "nvptx64")]
    let s = {
        let s: u64;
        // SAFETY: address arithmetic only.
        unsafe {
            asm!("cvta.to.shared.u64 {s}, {p};", s = out(reg64) s, p = in(reg64) dynamic_ptr() as u64,
                 options(pure, nomem, nostack));
        }
        s
    };
    #[cfg(not(target_arch = "nvptx64"))]
    let s = super::model::smem::dynamic_base() as u64;
    SmemAddr(s as u32)
}

/// `ld.shared.u32 d, [a];`
///
/// # Safety
/// `a` must be a 4-byte aligned address inside this CTA's shared memory.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn ld_u32(a: SmemAddr) -> u32 {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: the caller upholds this function's contract (see `# Safety`).
    let v = unsafe {
        let v: u32;
        asm!("ld.shared.u32 {v}, [{a}];", v = out(reg32) v, a = in(reg32) a.0, options(readonly, nostack));
        v
    };
    #[cfg(not(target_arch = "nvptx64"))]
    let v = super::model::smem::ld_u32(a.0);
    v
}

/// `st.shared.u32 [a], v;`
///
/// # Safety
/// `a` must be a 4-byte aligned address inside this CTA's shared memory that no other thread
/// accesses concurrently.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn st_u32(a: SmemAddr, v: u32) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: the caller upholds this function's contract (see `# Safety`).
    unsafe {
        asm!("st.shared.u32 [{a}], {v};", a = in(reg32) a.0, v = in(reg32) v, options(nostack))
    };
    #[cfg(not(target_arch = "nvptx64"))]
    super::model::smem::st_u32(a.0, v);
}

/// `ld.shared.v2.u32 {d0, d1}, [a];`
///
/// # Safety
/// `a` must be an 8-byte aligned address inside this CTA's shared memory.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn ld_v2_u32(a: SmemAddr) -> [u32; 2] {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: the caller upholds this function's contract (see `# Safety`).
    let v = unsafe {
        let (x, y): (u32, u32);
        asm!("ld.shared.v2.u32 {{{x}, {y}}}, [{a}];", x = out(reg32) x, y = out(reg32) y, a = in(reg32) a.0,
             options(readonly, nostack));
        [x, y]
    };
    #[cfg(not(target_arch = "nvptx64"))]
    let v = super::model::smem::ld_v2_u32(a.0);
    v
}

/// `ld.shared.v4.u32 {d0, d1, d2, d3}, [a];`
///
/// # Safety
/// `a` must be a 16-byte aligned address inside this CTA's shared memory.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn ld_v4_u32(a: SmemAddr) -> [u32; 4] {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: the caller upholds this function's contract (see `# Safety`).
    let v = unsafe {
        let (x, y, z, u): (u32, u32, u32, u32);
        asm!("ld.shared.v4.u32 {{{x}, {y}, {z}, {u}}}, [{a}];", x = out(reg32) x, y = out(reg32) y, z = out(reg32) z,
             u = out(reg32) u, a = in(reg32) a.0, options(readonly, nostack));
        [x, y, z, u]
    };
    #[cfg(not(target_arch = "nvptx64"))]
    let v = super::model::smem::ld_v4_u32(a.0);
    v
}

/// `stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [a], {r0, r1, r2, r3};` (PTX ISA 7.8, sm_90;
/// §9.7.14.5.16): the warp stores four 8 × 8 matrices of 16-bit elements, transposed. Register
/// `rj` of lane `l` holds row `l / 4`, columns `2 (l % 4)` (low half) and `+ 1` of matrix `j` —
/// the layout of an m64nNk16 accumulator pair rounded to f16x2 — and lane `8 j + i` gives the
/// address of the 16 bytes that receive *column* `i` of matrix `j` (its 8 rows in order). The
/// whole warp, converged.
///
/// # Safety
/// Every lane's `a` must be a 16-byte aligned address inside this CTA's shared memory that no
/// other thread accesses concurrently.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn stmatrix_x4_trans(a: SmemAddr, r: [u32; 4]) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: the caller upholds this function's contract (see `# Safety`).
    unsafe {
        asm!("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [{a}], {{{r0}, {r1}, {r2}, {r3}}};", a = in(reg32) a.0,
             r0 = in(reg32) r[0], r1 = in(reg32) r[1], r2 = in(reg32) r[2], r3 = in(reg32) r[3], options(nostack))
    };
    #[cfg(not(target_arch = "nvptx64"))]
    super::model::smem::stmatrix_x4(a.0, r, true);
}
