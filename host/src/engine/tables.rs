//! The host side of a plan's table set: its mirror (the bytes every upload copies), the pinned
//! buffer a captured upload reads, and where each group's alpha lies (for device alphas).

use crate::driver::copy::{copy_strided, StridedCopy};
use crate::error::{Error, Result};
use cudarc::driver::{sys, CudaStream};
use nvfp4_gemm_abi::tensor_map::TensorMap;
use std::marker::PhantomData;
use std::sync::Arc;

/// The host copy of a table set: `maps` tensor maps from byte 0, then `groups` entries of `G`
/// (from a multiple of 128 bytes), in storage aligned for both.
pub(crate) struct Mirror<G> {
    storage: Vec<TensorMap>,
    maps: usize,
    groups: usize,
    _g: PhantomData<G>,
}

impl<G: bytemuck::Pod> Mirror<G> {
    /// Zeroed tables of `groups` entries and `maps` maps.
    pub fn new(groups: usize, maps: usize) -> Mirror<G> {
        let bytes = maps * size_of::<TensorMap>() + groups * size_of::<G>();
        let storage = vec![TensorMap::ZERO; bytes.div_ceil(size_of::<TensorMap>()).max(1)];
        Mirror { storage, maps, groups, _g: PhantomData }
    }

    /// Byte offset of the group table.
    pub fn groups_offset(&self) -> usize {
        self.maps * size_of::<TensorMap>()
    }

    /// Entries of the group table.
    pub fn groups(&self) -> usize {
        self.groups
    }

    /// Every byte (what an upload copies).
    pub fn bytes(&self) -> &[u8] {
        bytemuck::cast_slice(&self.storage)
    }

    /// The maps.
    pub fn maps_mut(&mut self) -> &mut [TensorMap] {
        &mut self.storage[..self.maps]
    }

    /// The group table and the maps.
    pub fn parts_mut(&mut self) -> (&mut [G], &mut [TensorMap]) {
        let (maps, rest) = self.storage.split_at_mut(self.maps);
        let groups = &mut bytemuck::cast_slice_mut::<TensorMap, u8>(rest)[..self.groups * size_of::<G>()];
        (bytemuck::cast_slice_mut(groups), maps)
    }
}

/// Page-locked host memory (`cuMemHostAlloc`), freed on drop.
struct Pinned {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: plain host memory owned by this value; the driver may read it from any thread.
unsafe impl Send for Pinned {}

impl Pinned {
    fn new(len: usize) -> Result<Pinned> {
        let mut ptr = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        unsafe { sys::cuMemHostAlloc(&mut ptr, len.max(1), 0) }
            .result()
            .map_err(|e| Error::driver("allocating the pinned buffer of captured uploads", e))?;
        Ok(Pinned { ptr: ptr.cast(), len })
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: allocated by `cuMemHostAlloc`, freed once; an error cannot be reported here.
        let _ = unsafe { sys::cuMemFreeHost(self.ptr.cast()) };
    }
}

/// The source of uploads made inside a caller's stream capture: a captured copy reads its source
/// again at every replay of the graph, so it must be memory nothing writes afterwards (pinned,
/// for a copy node). One buffer at a time serves the next capture; a capture retires it (kept
/// until the plan is dropped) and the next one allocates another.
#[derive(Default)]
pub(crate) struct CaptureStaging {
    next: Option<Pinned>,
    retired: Vec<Pinned>,
}

impl CaptureStaging {
    /// Enqueues on `stream` (being captured) the copy of `bytes` to the device address `dst`,
    /// from this staging's pinned buffer.
    ///
    /// # Safety
    /// `dst` must be device memory of at least `bytes.len()` bytes in `stream`'s context, alive
    /// while the graph may be replayed.
    pub unsafe fn upload(&mut self, stream: &Arc<CudaStream>, bytes: &[u8], dst: u64) -> Result<()> {
        let Some(pinned) = self.next.as_mut().filter(|p| p.len >= bytes.len()) else {
            return Err(Error::Capture(
                "the plan's staging buffer belongs to a graph captured earlier: call the plan once \
                 outside capture first"
                    .into(),
            ));
        };
        // SAFETY: `pinned` holds at least `bytes.len()` bytes and nothing else refers to it.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), pinned.ptr, bytes.len()) };
        // SAFETY: the caller's contract for `dst`; the source is pinned memory kept while the
        // plan lives (`retire`).
        unsafe { sys::cuMemcpyHtoDAsync_v2(dst, pinned.ptr.cast_const().cast(), bytes.len(), stream.cu_stream()) }
            .result()
            .map_err(|e| Error::driver("uploading the call's tables inside a capture", e))
    }

    /// Allocates the buffer of the next capture (of at least `len` bytes), unless there is one:
    /// outside capture, where allocating is allowed.
    pub fn prepare(&mut self, len: usize) -> Result<()> {
        if self.next.as_ref().is_none_or(|p| p.len < len) {
            self.next = Some(Pinned::new(len)?);
        }
        Ok(())
    }

    /// Keeps the buffer the last upload read, for as long as the plan lives.
    pub fn retire(&mut self) {
        self.retired.extend(self.next.take());
    }
}

/// Where each group's alpha lies in an architecture's group table: entries of `stride` bytes, the
/// `f32` at byte `offset` of each (the abi's `GroupParams` and its `GROUP_ALPHA_OFFSET`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AlphaField {
    /// Bytes per entry (0: the layout has no alphas to copy).
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

    /// A layout whose calls never take device alphas.
    pub const fn none() -> AlphaField {
        AlphaField { stride: 0, offset: 0 }
    }

    /// Enqueues on `stream` the copy of `groups` `f32`s at the device address `alphas` into the
    /// alphas of entries `0 .. groups` of the group table at `table`: one strided device-to-device
    /// copy, ordered after the table's upload and before the launches enqueued after it,
    /// capturable, with no host synchronization.
    ///
    /// # Safety
    /// `alphas` must be device memory of at least `groups` `f32`s in `stream`'s context, alive
    /// until the copy completes and not overlapping the table; `table` a group table of at least
    /// `groups` entries of this field's stride.
    pub unsafe fn copy(self, stream: &CudaStream, table: u64, alphas: u64, groups: usize) -> Result<()> {
        // The plans allow device alphas only where the layout names the field.
        assert!(self.stride > 0, "device alphas for a layout without an alpha field");
        let copy = StridedCopy {
            src: alphas,
            src_pitch: size_of::<f32>(),
            dst: table + self.offset as u64,
            dst_pitch: self.stride,
            width: size_of::<f32>(),
            rows: groups,
        };
        // SAFETY: the caller's contract; each destination row is one f32 inside one entry.
        unsafe { copy_strided(stream, copy) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirror_parts_are_where_the_offsets_say() {
        let mut m = Mirror::<[u64; 11]>::new(3, 5);
        assert_eq!(m.groups_offset(), 5 * 128);
        assert_eq!(m.bytes().len(), (5 * 128 + 3 * 88usize).div_ceil(128) * 128);
        let (groups, maps) = m.parts_mut();
        assert_eq!((groups.len(), maps.len()), (3, 5));
        groups[1][0] = 0x0102_0304_0506_0708;
        maps[4].0[127] = 9;
        let bytes = m.bytes();
        assert_eq!(bytes[5 * 128 - 1], 9);
        assert_eq!(bytes[5 * 128 + 88], 8);
        assert_eq!(bytes.as_ptr() as usize % 128, 0);
        // No maps, no groups: still one (zero) entry of storage, so an upload has a source.
        let empty = Mirror::<u32>::new(0, 0);
        assert_eq!(empty.bytes().len(), 128);
    }
}
