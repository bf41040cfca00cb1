//! What both architectures' GEMM kernels walk: a host-built list of output tiles, and the kernel
//! parameters that point at it.
//!
//! A launch takes one [`KernelParams`] by value. It points at three tables the host writes to
//! device memory before the launch: the architecture's `GroupParams[group_count]`, the tensor-map
//! table (two 128-byte maps per group, see each architecture's `*_map_index`), and the launch's
//! `WorkItem[work_len]`. CTA `b` of a grid of `G` takes items `b, b + G, b + 2G, ...`, skipping
//! holes ([`WorkItem::HOLE`], sm_90a only).

/// One output tile: rows `tile_m * BLOCK_M ..` and columns `tile_n * BLOCK_N ..` of C of group
/// `group`, with the tile sizes of the kernel that walks the list.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct WorkItem {
    /// Index of the group in the problem.
    pub group: u32,
    /// Tile index along M (C's rows: tokens).
    pub tile_m: u32,
    /// Tile index along N (C's columns: weights).
    pub tile_n: u32,
}

impl WorkItem {
    /// A hole: an entry the sm_90a GEMM skips (every role of the CTA alike). The host leaves holes
    /// where a balanced list gives some CTAs fewer tiles than others, so that CTA `b` still finds
    /// its items at `b, b + G, ...` (the sm_100a kernels' lists have none).
    pub const HOLE: WorkItem = WorkItem { group: u32::MAX, tile_m: 0, tile_n: 0 };

    /// True for [`WorkItem::HOLE`].
    pub const fn is_hole(&self) -> bool {
        self.group == u32::MAX
    }
}

const _: () = assert!(core::mem::size_of::<WorkItem>() == 12);
const _: () = assert!(core::mem::align_of::<WorkItem>() == 4);

/// The parameters of every GEMM kernel of both architectures (and of the sm_90a token
/// dequantization), passed by value: 88 bytes, align 8 (no 64-byte-aligned tensor map by value).
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct KernelParams {
    /// Device address of the architecture's `GroupParams[group_count]`.
    pub groups: u64,
    /// Device address of the tensor-map table (`2 * group_count` maps of 128 bytes, 128-byte
    /// aligned).
    pub tensor_maps: u64,
    /// Device address of this launch's `WorkItem[work_len]`.
    pub work: u64,
    /// Work items in the list (for a cluster variant a multiple of the cluster size); with
    /// `work_len_device`, the list's capacity.
    pub work_len: u32,
    /// Groups in the table.
    pub group_count: u32,
    /// 1: C is bf16; 0: C is fp16.
    pub out_bf16: u32,
    /// Zero.
    pub reserved: u32,
    /// 0, or the device address of a `u32` work length written on the device (by a scheduling
    /// kernel, `crate::moe`) before the launch: the kernel walks `min(*work_len_device, work_len)`
    /// items.
    pub work_len_device: u64,
    /// The sm_90a NVFP4 GEMMs' activation epilogue (the MoE block's first GEMM,
    /// [`crate::moe::block::ActivationEpilogue`]); all zero (every other launch): C is stored.
    pub epilogue: crate::moe::block::ActivationEpilogue,
}

const _: () = assert!(core::mem::size_of::<KernelParams>() == 88);
const _: () = assert!(core::mem::align_of::<KernelParams>() == 8);

/// Index of the first operand's map of group `g` in the tensor-map table (the token operand A
/// on both architectures; the f16 token workspace on sm_90a).
pub const fn first_map_index(g: u32) -> usize {
    2 * g as usize
}

/// Index of the second operand's map of group `g` (the weight operand B).
pub const fn second_map_index(g: u32) -> usize {
    2 * g as usize + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_indices_interleave() {
        assert_eq!((first_map_index(0), second_map_index(0)), (0, 1));
        assert_eq!((first_map_index(7), second_map_index(7)), (14, 15));
    }

    #[test]
    fn bytes() {
        let w = WorkItem { group: 1, tile_m: 2, tile_n: 3 };
        assert_eq!(bytemuck::bytes_of(&w), &[1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0]);
        assert_eq!(bytemuck::bytes_of(&KernelParams::default()).len(), 88);
        assert_eq!(core::mem::offset_of!(KernelParams, epilogue), 48);
    }
}
