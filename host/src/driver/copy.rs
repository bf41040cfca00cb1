//! Strided device-to-device copies (`cuMemcpy2DAsync`), which cudarc's safe layer lacks.

use crate::error::{Error, Result};
use cudarc::driver::{sys, CudaStream};

/// One strided copy: `rows` rows of `width` bytes, row `r` from `src + r · src_pitch` to
/// `dst + r · dst_pitch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StridedCopy {
    /// Device address of the first source row.
    pub src: u64,
    /// Bytes from one source row to the next (at least `width`).
    pub src_pitch: usize,
    /// Device address of the first destination row.
    pub dst: u64,
    /// Bytes from one destination row to the next (at least `width`).
    pub dst_pitch: usize,
    /// Bytes per row.
    pub width: usize,
    /// Rows.
    pub rows: usize,
}

/// Enqueues `copy` on `stream` (`cuMemcpy2DAsync`, both sides device memory): ordered after the
/// work before it in the stream and before the work after it, asynchronous to the host, and
/// recorded as a copy node when the stream is being captured into a graph.
///
/// # Safety
/// Both sides must be device memory of `stream`'s context, valid for what the copy touches until
/// it completes, and must not overlap.
pub unsafe fn copy_strided(stream: &CudaStream, copy: StridedCopy) -> Result<()> {
    if copy.rows == 0 || copy.width == 0 {
        return Ok(());
    }
    let params = sys::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        srcHost: std::ptr::null(),
        srcDevice: copy.src,
        srcArray: std::ptr::null_mut(),
        srcPitch: copy.src_pitch,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        dstHost: std::ptr::null_mut(),
        dstDevice: copy.dst,
        dstArray: std::ptr::null_mut(),
        dstPitch: copy.dst_pitch,
        WidthInBytes: copy.width,
        Height: copy.rows,
    };
    // SAFETY: `params` is a complete description of device-to-device rows (the caller's
    // contract for the memory), alive for the call, which reads it before it returns.
    unsafe { sys::cuMemcpy2DAsync_v2(&params, stream.cu_stream()) }
        .result()
        .map_err(|e| Error::driver("copying with a stride", e))
}
