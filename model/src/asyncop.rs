//! In-flight asynchronous operations (the async proxy, PTX ISA 9.0 §9.7.9.25.2 and §9.7.15.4) and
//! the TMA / bulk-copy instructions that issue them.
//!
//! An operation is issued by one thread and completes later, when the scheduler chooses
//! ([`crate::Completion`]); only then do its bytes land and its mbarrier get the complete-tx /
//! arrive-on. At issue it marks what it will write and read (shared-memory bytes, TMEM cells), so
//! that any conflicting access before completion is reported where it happens.

use crate::error::{ErrorKind, ModelError};
use crate::exec::{check_predecessor_read, instr, Flow, World};
use crate::mbarrier::{check_visible, complete_tx};
use crate::smem::{check_async_write, cluster_target, mark_write, unmark_read};
use crate::tensor_map::{decode, gather_box};
use std::panic::Location;

/// What completing an operation does.
pub(crate) enum OpKind {
    /// Bytes landing in shared memory (TMA tensor or bulk copy), at `off` in each CTA of `ctas`,
    /// then complete-tx of `tx` bytes on the barrier at `bar` in each of them.
    Copy { ctas: Vec<usize>, off: u32, image: Vec<u8>, bar: u32, tx: u32 },
    /// `tcgen05.cp`, `tcgen05.mma`, `tcgen05.commit`.
    Tcgen05(crate::tcgen05::Op),
    /// A committed wgmma group of a warpgroup.
    WgmmaGroup { wg: usize },
}

/// One in-flight operation.
pub(crate) struct AsyncOp {
    pub id: u32,
    pub issuer: usize,
    pub site: &'static Location<'static>,
    pub what: String,
    /// Operations that must complete first (the ISA's ordering guarantees).
    pub deps: Vec<u32>,
    /// Shared-memory ranges `(cta, off, len)` it reads (marked at issue).
    pub smem_reads: Vec<(usize, u32, u32)>,
    pub kind: OpKind,
}

impl AsyncOp {
    /// Whether completing it would touch CTA `cta` (its shared memory, barriers or TMEM).
    pub(crate) fn touches_cta(&self, cta: usize) -> bool {
        self.smem_reads.iter().any(|r| r.0 == cta)
            || match &self.kind {
                OpKind::Copy { ctas, .. } => ctas.contains(&cta),
                OpKind::Tcgen05(op) => op.touches_cta(cta),
                OpKind::WgmmaGroup { .. } => false,
            }
    }

    /// Completes the operation.
    pub(crate) fn complete(self, w: &mut World) -> Result<(), ModelError> {
        for &(cta, off, len) in &self.smem_reads {
            unmark_read(w, cta, off, len);
        }
        match self.kind {
            OpKind::Copy { ctas, off, image, bar, tx } => {
                for &cta in &ctas {
                    if w.ctas[cta].exited {
                        return Err(w.err(
                            ErrorKind::InvalidOperand,
                            format!("#{} {} lands in CTA {cta}, which has exited", self.id, self.what),
                        ));
                    }
                    let s = &mut w.ctas[cta].smem;
                    let r = off as usize..off as usize + image.len();
                    s.data[r.clone()].copy_from_slice(&image);
                    for m in &mut s.writer[r] {
                        if *m == self.id {
                            *m = 0;
                        }
                    }
                }
                for &cta in &ctas {
                    complete_tx(w, cta, bar, tx).map_err(|m| {
                        w.err(ErrorKind::InvalidOperand, format!("completing #{} {}: {m}", self.id, self.what))
                    })?;
                }
                Ok(())
            }
            OpKind::Tcgen05(op) => crate::tcgen05::complete_op(w, self.id, &self.what, op),
            OpKind::WgmmaGroup { wg } => {
                crate::wgmma::complete_group(w, wg, self.id);
                Ok(())
            }
        }
    }
}

/// Reads a tensor map from (host) memory.
unsafe fn read_map(map: u64) -> Result<crate::tensor_map::TensorMapDesc, String> {
    if map == 0 || map % 64 != 0 {
        return Err(format!("tensor map address {map:#x} is null or not 64-byte aligned"));
    }
    let bytes = std::ptr::read(map as usize as *const [u8; 128]);
    decode(&bytes)
}

/// Issues a copy whose `image` lands at the CTA-relative offset of `dst` in every CTA of `ctas`.
fn issue_copy(
    w: &mut World,
    me: usize,
    ctas: Vec<usize>,
    off: u32,
    image: Vec<u8>,
    bar: u32,
    what: String,
) -> Result<(), ModelError> {
    let len = image.len() as u32;
    for &cta in &ctas {
        if w.ctas[cta].exited {
            return Err(w.err_at(me, ErrorKind::InvalidOperand, format!("destination CTA {cta} has exited")));
        }
        check_visible(w, cta, bar, "an asynchronous copy").map_err(|m| w.err_at(me, ErrorKind::InvalidOperand, m))?;
        check_async_write(w, cta, off, len).map_err(|m| w.err_at(me, ErrorKind::Hazard, format!("{what}: {m}")))?;
    }
    let id = w.op_id();
    for &cta in &ctas {
        mark_write(w, cta, off, len, id);
    }
    let site = w.threads[me].site;
    w.push_op(AsyncOp {
        id,
        issuer: me,
        site,
        what,
        deps: Vec::new(),
        smem_reads: Vec::new(),
        kind: OpKind::Copy { ctas, off, image, bar, tx: len },
    });
    Ok(())
}

#[allow(clippy::too_many_arguments)]
unsafe fn tensor_load(
    name: &'static str,
    site: &'static Location<'static>,
    dst: u32,
    map: u64,
    coords: &[i32],
    bar: u32,
    multicast: Option<u16>,
) {
    instr(name, site, true, |w, me| {
        let inv = |w: &World, m: String| w.err_at(me, ErrorKind::InvalidOperand, m);
        if !w.threads[me].acquired_maps.contains(&map) {
            return Err(w.err_at(
                me,
                ErrorKind::Hazard,
                format!(
                    "{name} through the tensor map at {map:#x}, which this thread has not acquired \
                     (fence.proxy.tensormap::generic.acquire): the host writes maps before the launch, \
                     and without the acquire the TMA unit may use a stale copy"
                ),
            ));
        }
        let d = read_map(map).map_err(|m| inv(w, m))?;
        let bytes = d.box_bytes();
        // Tensor copies need a 128-byte aligned shared destination (PTX ISA 9.0 §9.7.9.25.5.1).
        let (dst_cta, off) = cluster_target(w, me, dst, bytes, 128).map_err(|m| inv(w, m))?;
        let (bar_cta, bar_off) = cluster_target(w, me, bar, 8, 8).map_err(|m| inv(w, m))?;
        let ctas = match multicast {
            None => {
                if bar_cta != dst_cta {
                    return Err(inv(w, format!("destination in CTA {dst_cta} but mbarrier in CTA {bar_cta}")));
                }
                vec![dst_cta]
            }
            Some(mask) => {
                // Bit i of ctaMask names the CTA of %cluster_ctarank i (PTX ISA 9.0 §9.7.9.25.5.2).
                if mask == 0 || (mask as u32) >> w.cfg.cluster != 0 {
                    return Err(inv(w, format!("ctaMask {mask:#x} names CTAs outside a cluster of {}", w.cfg.cluster)));
                }
                let me_cta = w.threads[me].cta;
                (0..w.cfg.cluster)
                    .filter(|r| mask >> r & 1 == 1)
                    .map(|r| w.cta_of_rank(me_cta, r).expect("in range"))
                    .collect()
            }
        };
        // The tensor's bytes (outermost extent × stride), for the early-start check.
        let span = if d.rank > 1 {
            d.dims[d.rank - 1] * d.strides[d.rank - 1]
        } else {
            (d.dims[0] * d.element.bits() as u64).div_ceil(8)
        };
        check_predecessor_read(w, me, d.base, d.base + span, name)?;
        let image =
            gather_box(&d, coords, w.cfg.smem_base + off).map_err(|m| w.err_at(me, ErrorKind::Unimplemented, m))?;
        let what = format!(
            "{name} box {:?} at {coords:?} ({bytes} B) -> dyn+{off:#x} of CTA(s) {ctas:?}, complete_tx on dyn+{bar_off:#x}",
            &d.box_dims[..d.rank]
        );
        issue_copy(w, me, ctas, off, image, bar_off, what)?;
        Ok(Flow::Done(()))
    })
}

/// `cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [map, {c0,
/// c1}], [bar];` (PTX ISA 9.0 §9.7.9.25.5.2). `map` is the address of a map from
/// [`crate::tensor_map::encode_tiled`]; the box lands at `dst` laid out and swizzled as the map
/// says (§5.5.3, §5.5.7), out-of-bounds elements zero (§5.5.3.3), and the whole box's bytes are
/// credited to `bar` when it lands.
///
/// # Safety
/// `map` must point to 128 readable bytes, and the tensor it describes must be readable memory.
#[track_caller]
pub unsafe fn load_2d(dst: u32, map: u64, c0: i32, c1: i32, bar: u32) {
    tensor_load("cp.async.bulk.tensor.2d", Location::caller(), dst, map, &[c0, c1], bar, None)
}

/// [`load_2d`] with `.L2::cache_hint` (the policy has no effect in the model).
///
/// # Safety
/// As [`load_2d`].
#[track_caller]
pub unsafe fn load_2d_hint(dst: u32, map: u64, c0: i32, c1: i32, bar: u32, _policy: u64) {
    tensor_load("cp.async.bulk.tensor.2d.L2::cache_hint", Location::caller(), dst, map, &[c0, c1], bar, None)
}

/// `cp.async.bulk.tensor.3d...L2::cache_hint` (see [`load_2d`]).
///
/// # Safety
/// As [`load_2d`].
#[track_caller]
pub unsafe fn load_3d_hint(dst: u32, map: u64, c: [i32; 3], bar: u32, _policy: u64) {
    tensor_load("cp.async.bulk.tensor.3d.L2::cache_hint", Location::caller(), dst, map, &c, bar, None)
}

/// `cp.async.bulk.tensor.2d...multicast::cluster [dst], [map, {c0, c1}], [bar], ctaMask;`: the box
/// lands at `dst`'s CTA-relative offset in every CTA whose `%cluster_ctarank` bit is set, and each
/// of those CTAs' barrier at `bar`'s offset is credited (PTX ISA 9.0 §9.7.9.25.5.2).
///
/// # Safety
/// As [`load_2d`].
#[track_caller]
pub unsafe fn load_2d_multicast(dst: u32, map: u64, c0: i32, c1: i32, bar: u32, cta_mask: u16) {
    tensor_load(
        "cp.async.bulk.tensor.2d.multicast::cluster",
        Location::caller(),
        dst,
        map,
        &[c0, c1],
        bar,
        Some(cta_mask),
    )
}

/// `cp.async.bulk.tensor.3d...multicast::cluster` (see [`load_2d_multicast`]).
///
/// # Safety
/// As [`load_2d`].
#[track_caller]
pub unsafe fn load_3d_multicast(dst: u32, map: u64, c: [i32; 3], bar: u32, cta_mask: u16) {
    tensor_load("cp.async.bulk.tensor.3d.multicast::cluster", Location::caller(), dst, map, &c, bar, Some(cta_mask))
}

unsafe fn bulk(name: &'static str, site: &'static Location<'static>, dst: u32, src: u64, bytes: u32, bar: u32) {
    instr(name, site, true, |w, me| {
        let inv = |w: &World, m: String| w.err_at(me, ErrorKind::InvalidOperand, m);
        // Size a multiple of 16, addresses 16-byte aligned (PTX ISA 9.0 §9.7.9.25.4.1).
        if bytes == 0 || bytes % 16 != 0 || src % 16 != 0 {
            return Err(inv(
                w,
                format!("size {bytes} / source {src:#x}: need a positive multiple of 16 and 16-byte alignment"),
            ));
        }
        let (cta, off) = cluster_target(w, me, dst, bytes, 16).map_err(|m| inv(w, m))?;
        let (bar_cta, bar_off) = cluster_target(w, me, bar, 8, 8).map_err(|m| inv(w, m))?;
        if bar_cta != cta {
            return Err(inv(w, format!("destination in CTA {cta} but mbarrier in CTA {bar_cta}")));
        }
        check_predecessor_read(w, me, src, src + bytes as u64, name)?;
        let mut image = vec![0u8; bytes as usize];
        std::ptr::copy_nonoverlapping(src as usize as *const u8, image.as_mut_ptr(), bytes as usize);
        let what =
            format!("{name} {bytes} B from {src:#x} -> dyn+{off:#x} of CTA {cta}, complete_tx on dyn+{bar_off:#x}");
        issue_copy(w, me, vec![cta], off, image, bar_off, what)?;
        Ok(Flow::Done(()))
    })
}

/// `cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [src], bytes, [bar];`
/// (PTX ISA 9.0 §9.7.9.25.4.1).
///
/// # Safety
/// `src .. src + bytes` must be readable memory.
#[track_caller]
pub unsafe fn load_1d(dst: u32, src: u64, bytes: u32, bar: u32) {
    bulk("cp.async.bulk", Location::caller(), dst, src, bytes, bar)
}

/// [`load_1d`] with `.L2::cache_hint` (no effect in the model).
///
/// # Safety
/// As [`load_1d`].
#[track_caller]
pub unsafe fn load_1d_hint(dst: u32, src: u64, bytes: u32, bar: u32, _policy: u64) {
    bulk("cp.async.bulk.L2::cache_hint", Location::caller(), dst, src, bytes, bar)
}
