//! The device tables a plan owns and fills on the stream: the upload of a group table and its
//! tensor maps (every plan), the tables of a device-sized plan ([`ScheduledTables`]), and the copy
//! of device-resident alphas into a group table ([`AlphaField`]). Below the architectures'
//! plans (`sm90/`, `sm100/`), which use it, and the public plans (`plan.rs`, `moe.rs`).

use crate::driver::copy::{copy_strided, StridedCopy};
use crate::error::{Error, Result};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
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

/// The device tables of a device-sized plan (`crate::moe`), allocated once: the group table and
/// tensor maps the host uploads, and the work list, its length and the status word that the
/// scheduling kernel writes on the device.
pub(crate) struct ScheduledTables {
    groups: CudaSlice<u8>,
    maps: CudaSlice<u8>,
    work: CudaSlice<u8>,
    work_len: CudaSlice<u32>,
    status: CudaSlice<u32>,
}

/// The device addresses of a plan's [`ScheduledTables`] on one stream.
pub(crate) struct ScheduledAddresses {
    pub groups: u64,
    pub maps: u64,
    pub work: u64,
    pub work_len: u64,
    pub status: u64,
}

impl ScheduledTables {
    /// Zeroed tables of `group_bytes`, `map_bytes` and `work_bytes` on `stream`.
    pub fn new(stream: &Arc<CudaStream>, group_bytes: usize, map_bytes: usize, work_bytes: usize) -> Result<Self> {
        let d = |e| Error::driver("allocating the plan's device tables", e);
        Ok(ScheduledTables {
            groups: stream.alloc_zeros::<u8>(group_bytes).map_err(d)?,
            maps: stream.alloc_zeros::<u8>(map_bytes).map_err(d)?,
            work: stream.alloc_zeros::<u8>(work_bytes).map_err(d)?,
            work_len: stream.alloc_zeros::<u32>(1).map_err(d)?,
            status: stream.alloc_zeros::<u32>(1).map_err(d)?,
        })
    }

    /// Their addresses for work on `stream`.
    pub fn addresses(&mut self, stream: &CudaStream) -> ScheduledAddresses {
        ScheduledAddresses {
            groups: self.groups.device_ptr_mut(stream).0,
            maps: self.maps.device_ptr(stream).0,
            work: self.work.device_ptr_mut(stream).0,
            work_len: self.work_len.device_ptr_mut(stream).0,
            status: self.status.device_ptr_mut(stream).0,
        }
    }

    /// Uploads the group table's size-independent fields and the tensor maps on `stream`.
    pub fn upload<G: bytemuck::Pod, M: bytemuck::Pod>(
        &mut self,
        stream: &Arc<CudaStream>,
        groups: &[G],
        maps: &[M],
    ) -> Result<()> {
        upload_tables(stream, groups, &mut self.groups, maps, &mut self.maps)
    }

    /// The status word (sticky bits the scheduler ORs in).
    pub fn status(&self) -> &CudaSlice<u32> {
        &self.status
    }

    /// Zeroes the status word on `stream`.
    pub fn clear_status(&mut self, stream: &Arc<CudaStream>) -> Result<()> {
        stream.memset_zeros(&mut self.status).map_err(|e| Error::driver("clearing the plan's status word", e))
    }
}
