//! The device tables a plan owns and fills on the stream: the upload of a group table and its
//! tensor maps (every plan), and the copy of device-resident alphas into a group table
//! ([`AlphaField`]). Below the architectures' plans (`sm90/`, `sm100/`, `device_sizes.rs`), which
//! use it, and the public plans (`plan.rs`, `moe.rs`).

use crate::driver::copy::{copy_strided, StridedCopy};
use crate::error::{Error, Result};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtrMut};
use std::sync::Arc;

/// Copies a plan's parameter tables to the device on `stream`: the group table and the tensor
/// maps (both plain data from the abi). Every plan's upload ends with this.
pub(crate) fn upload_tables<G: bytemuck::Pod, M: bytemuck::Pod>(
    stream: &Arc<CudaStream>,
    groups: &[G],
    groups_dst: &mut CudaSlice<u8>,
    maps: &[M],
    maps_dst: &mut CudaSlice<u8>,
) -> Result<()> {
    let d = |e| Error::driver("uploading the call's parameters", e);
    stream.memcpy_htod(bytemuck::cast_slice::<_, u8>(groups), groups_dst).map_err(d)?;
    stream.memcpy_htod(bytemuck::cast_slice::<_, u8>(maps), maps_dst).map_err(d)?;
    Ok(())
}

/// Where each group's alpha lies in an architecture's group table: entries of `stride` bytes, the
/// `f32` at byte `offset` of each (the abi's `GroupParams` and its `GROUP_ALPHA_OFFSET`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AlphaField {
    /// Bytes per entry.
    pub stride: usize,
    /// Byte offset of the `f32` alpha in an entry.
    pub offset: usize,
}

impl AlphaField {
    /// The alphas of a table of `G` entries, each with its alpha at byte `offset`.
    pub const fn of<G>(offset: usize) -> AlphaField {
        assert!(offset + size_of::<f32>() <= size_of::<G>());
        AlphaField { stride: size_of::<G>(), offset }
    }

    /// Enqueues on `stream` the copy of `groups` `f32`s at the device address `alphas` into the
    /// alphas of entries `0 .. groups` of `table`: one strided device-to-device copy, ordered
    /// after the table's upload and before the launches enqueued after it, capturable, with no
    /// host synchronization.
    ///
    /// # Safety
    /// `alphas` must be device memory of at least `groups` `f32`s in `stream`'s context, alive
    /// until the copy completes and not overlapping `table`.
    pub unsafe fn copy(self, stream: &CudaStream, table: &mut CudaSlice<u8>, alphas: u64, groups: usize) -> Result<()> {
        // The plans allocate a table entry per group: anything else is a bug here, not input.
        assert!(groups * self.stride <= table.len(), "{groups} alphas for a table of {} bytes", table.len());
        let (dst, _written) = table.device_ptr_mut(stream);
        let copy = StridedCopy {
            src: alphas,
            src_pitch: size_of::<f32>(),
            dst: dst + self.offset as u64,
            dst_pitch: self.stride,
            width: size_of::<f32>(),
            rows: groups,
        };
        // SAFETY: the caller's contract for `alphas`; each destination row is one f32 inside one
        // of the table's entries (checked above), and the table is plain device memory.
        unsafe { copy_strided(stream, copy) }
    }
}
