//! The work list both GEMM kernels walk, and the tables their [`KernelParams`] point at.

use crate::ptx::{sreg, tma};
use core::marker::PhantomData;
use nvfp4_gemm_abi::tensor_map::TensorMap;
use nvfp4_gemm_abi::work::{KernelParams, WorkItem};

/// This CTA's walk through the work list: items `ctaid, ctaid + nctaid, ...`, and typed reads of
/// the group table (`G`: the architecture's `GroupParams`) and the tensor-map table. Every role
/// of a CTA makes the same walk, so their pipeline positions advance in lockstep.
pub struct WorkCursor<'a, G> {
    params: &'a KernelParams,
    /// Items in the list: `work_len`, or the length a scheduling kernel wrote on the device
    /// (at most `work_len`, the list's capacity).
    len: u32,
    next: u32,
    stride: u32,
    group: PhantomData<G>,
}

impl<'a, G: Copy> WorkCursor<'a, G> {
    /// Starts at this CTA's first item.
    #[inline(always)]
    pub fn new(params: &'a KernelParams) -> Self {
        let len = if params.work_len_device == 0 {
            params.work_len
        } else {
            // SAFETY: a non-zero `work_len_device` is the address of the plan's `u32` work length,
            // written by the scheduling kernel earlier in the stream.
            let device = unsafe { *(params.work_len_device as *const u32) };
            if device < params.work_len {
                device
            } else {
                params.work_len
            }
        };
        Self { params, len, next: sreg::ctaid_x(), stride: sreg::nctaid_x(), group: PhantomData }
    }

    /// Items this walk covers (the list's length as read at the start).
    #[inline(always)]
    pub fn work_len(&self) -> u32 {
        self.len
    }

    /// The index of the next item, if any, and moves past it.
    #[inline(always)]
    pub fn next_index(&mut self) -> Option<u32> {
        let i = self.peek_index()?;
        self.next += self.stride;
        Some(i)
    }

    /// The next item that is not a hole ([`WorkItem::HOLE`]), if any, and moves past it.
    ///
    /// # Safety
    /// The list is valid device memory of at least `work_len` items.
    #[inline(always)]
    pub unsafe fn next_item(&mut self) -> Option<WorkItem> {
        while let Some(i) = self.next_index() {
            // SAFETY: `i < work_len`, the caller's contract.
            let t = unsafe { self.item(i) };
            if !t.is_hole() {
                return Some(t);
            }
        }
        None
    }

    /// The index the following [`Self::next_index`] will return, if any.
    #[inline(always)]
    pub fn peek_index(&self) -> Option<u32> {
        if self.next < self.len {
            Some(self.next)
        } else {
            None
        }
    }

    /// Work item `i` of the list.
    ///
    /// # Safety
    /// `i < work_len`, and the list is valid device memory.
    #[inline(always)]
    pub unsafe fn item(&self, i: u32) -> WorkItem {
        // SAFETY: the caller's contract.
        unsafe { *(self.params.work as *const WorkItem).add(i as usize) }
    }

    /// The parameters of group `g`.
    ///
    /// # Safety
    /// `g` must index the group table, which must hold `G`s.
    #[inline(always)]
    pub unsafe fn group(&self, g: u32) -> G {
        // SAFETY: the caller's contract.
        unsafe { *(self.params.groups as *const G).add(g as usize) }
    }

    /// Entry `index` of the tensor-map table, acquired for this thread's TMA
    /// ([`tma::acquire_tensormap`]): the host rewrites entries between launches, so every map a
    /// thread takes from the table is acquired before its first prefetch or copy.
    #[inline(always)]
    pub fn tensor_map(&self, index: usize) -> *const TensorMap {
        let map = (self.params.tensor_maps as *const TensorMap).wrapping_add(index);
        tma::acquire_tensormap(map);
        map
    }
}
