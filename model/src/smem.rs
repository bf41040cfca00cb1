//! Shared memory: each CTA's dynamic window, the `.shared::cta` / `.shared::cluster` address
//! spaces, and the per-byte "in flight" marks that turn a race with an asynchronous operation into
//! a reported hazard.
//!
//! Address spaces (PTX ISA 9.0 §5.1.7, "Shared State Space"): a `.shared::cta` address of this
//! model lies in `[smem_base, smem_base + dynamic_smem)` (the base is non-zero, so address 0 is
//! never valid). A `.shared::cta` address is also a valid `.shared::cluster` address of the
//! executing CTA. `mapa` ([`crate::cluster::map_shared`]) returns the model's `.shared::cluster`
//! form `0x1000_0000 | rank << 20 | cta_address`, which only instructions that take
//! `.shared::cluster` operands accept.
//!
//! Every byte carries: the id of the in-flight asynchronous operation that will write it (TMA,
//! bulk copy), the number of in-flight operations that read it (wgmma, tcgen05.mma, tcgen05.cp),
//! and whether it belongs to an mbarrier object (which only mbarrier instructions may touch,
//! PTX ISA 9.0 §9.7.13.15.8).

use crate::error::{ErrorKind, ModelError};
use crate::exec::{check_ordered, check_read_before, instr, Flow, World};
use std::panic::Location;

/// Tag of the model's `.shared::cluster` addresses produced by `mapa`.
pub(crate) const CLUSTER_TAG: u32 = 0x1000_0000;
const CLUSTER_TAG_MASK: u32 = 0xF000_0000;

/// One CTA's dynamic shared memory and its marks.
pub(crate) struct Smem {
    pub data: Vec<u8>,
    pub writer: Vec<u32>,
    pub readers: Vec<u16>,
    pub mbar: Vec<bool>,
    /// Per byte, the thread (index + 1; 0: none) whose `st.shared` wrote it last and that store's
    /// sequence number in the thread (`exec::Published`); allocated at the CTA's first store.
    pub generic: Option<Vec<(u32, u32)>>,
    /// Per byte, the thread (index + 1; 0: none) whose `ld.shared` read it last and that load's
    /// sequence number in the thread; allocated at the CTA's first load. Reset where an
    /// asynchronous operation writes (ordered by its barrier, like `generic`).
    pub last_read: Option<Vec<(u32, u32)>>,
}

impl Smem {
    pub(crate) fn new(size: u32, fill: u8) -> Self {
        let n = size as usize;
        // Uninitialized shared memory reads as a recognizable pattern (`LaunchConfig::smem_fill`),
        // not zeros.
        Smem {
            data: vec![fill; n],
            writer: vec![0; n],
            readers: vec![0; n],
            mbar: vec![false; n],
            generic: None,
            last_read: None,
        }
    }
}

/// Offset in the dynamic window of a `.shared::cta` address range, checked for bounds and
/// alignment.
pub(crate) fn cta_offset(w: &World, addr: u32, len: u32, align: u32) -> Result<u32, String> {
    let base = w.cfg.smem_base;
    if addr & CLUSTER_TAG_MASK == CLUSTER_TAG {
        return Err(format!(
            "{addr:#x} is a .shared::cluster address (from mapa); this operand is a .shared::cta address"
        ));
    }
    if addr < base || addr as u64 + len as u64 > base as u64 + w.cfg.dynamic_smem as u64 {
        return Err(format!(
            "{addr:#x}..+{len} is outside the CTA's shared window {base:#x}..{:#x}",
            base + w.cfg.dynamic_smem
        ));
    }
    if addr % align != 0 {
        return Err(format!("{addr:#x} is not {align}-byte aligned"));
    }
    Ok(addr - base)
}

/// CTA and offset of a `.shared::cluster` address used by thread `me`.
pub(crate) fn cluster_target(w: &World, me: usize, addr: u32, len: u32, align: u32) -> Result<(usize, u32), String> {
    let cta = w.threads[me].cta;
    if addr & CLUSTER_TAG_MASK == CLUSTER_TAG {
        let rank = (addr >> 20) & 0xFF;
        let target = w
            .cta_of_rank(cta, rank)
            .ok_or_else(|| format!("{addr:#x} names cluster rank {rank}, but clusters have {} CTAs", w.cfg.cluster))?;
        let off = cta_offset(w, addr & 0xF_FFFF, len, align)?;
        Ok((target, off))
    } else {
        Ok((cta, cta_offset(w, addr, len, align)?))
    }
}

/// `mapa`: the `.shared::cluster` address of `addr` in the CTA of rank `rank`.
pub(crate) fn mapa(w: &World, me: usize, addr: u32, rank: u32) -> Result<u32, String> {
    let (_, off) = cluster_target(w, me, addr, 1, 1)?;
    if rank >= w.cfg.cluster {
        return Err(format!("rank {rank} is not in a cluster of {} CTAs", w.cfg.cluster));
    }
    Ok(CLUSTER_TAG | rank << 20 | (w.cfg.smem_base + off))
}

/// Describes in-flight operation `id` for hazard messages.
pub(crate) fn op_desc(w: &World, id: u32) -> String {
    match w.ops.iter().find(|o| o.id == id) {
        Some(o) => format!("#{} {} (issued at {}:{})", o.id, o.what, o.site.file(), o.site.line()),
        None => format!("#{id}"),
    }
}

fn first_reader_op(w: &World, cta: usize, off: u32, len: u32) -> String {
    for o in &w.ops {
        if o.smem_reads.iter().any(|&(c, o2, l)| c == cta && o2 < off + len && off < o2 + l) {
            return op_desc(w, o.id);
        }
    }
    "an in-flight operation".into()
}

/// Checks that a thread (generic proxy) may read `len` bytes at `off` of CTA `cta`.
pub(crate) fn check_thread_read(w: &World, cta: usize, off: u32, len: u32) -> Result<(), String> {
    let s = &w.ctas[cta].smem;
    for i in off..off + len {
        if s.mbar[i as usize] {
            return Err(format!("dyn+{i:#x} belongs to an mbarrier object; only mbarrier instructions may access it"));
        }
        let wr = s.writer[i as usize];
        if wr != 0 {
            return Err(format!(
                "reads dyn+{i:#x}, which in-flight {} has not written yet (read before the barrier phase completed?)",
                op_desc(w, wr)
            ));
        }
    }
    Ok(())
}

/// Checks that a thread may write `len` bytes at `off` of CTA `cta`.
pub(crate) fn check_thread_write(w: &World, cta: usize, off: u32, len: u32) -> Result<(), String> {
    check_thread_read(w, cta, off, len)?;
    let s = &w.ctas[cta].smem;
    for i in off..off + len {
        if s.readers[i as usize] != 0 {
            return Err(format!(
                "writes dyn+{i:#x}, which {} still reads (overwritten before the operation completed)",
                first_reader_op(w, cta, i, 1)
            ));
        }
    }
    Ok(())
}

/// Checks that an asynchronous operation may read the range (no in-flight writer).
pub(crate) fn check_async_read(w: &World, cta: usize, off: u32, len: u32) -> Result<(), String> {
    let s = &w.ctas[cta].smem;
    for i in off..off + len {
        if s.mbar[i as usize] {
            return Err(format!("reads dyn+{i:#x}, which belongs to an mbarrier object"));
        }
        let wr = s.writer[i as usize];
        if wr != 0 {
            return Err(format!(
                "reads dyn+{i:#x}, which in-flight {} has not written yet (issued before its barrier phase completed?)",
                op_desc(w, wr)
            ));
        }
    }
    Ok(())
}

/// Checks that an asynchronous operation may write the range (no in-flight reader or writer).
pub(crate) fn check_async_write(w: &World, cta: usize, off: u32, len: u32) -> Result<(), String> {
    let s = &w.ctas[cta].smem;
    for i in off..off + len {
        if s.mbar[i as usize] {
            return Err(format!("writes dyn+{i:#x}, which belongs to an mbarrier object"));
        }
        let wr = s.writer[i as usize];
        if wr != 0 {
            return Err(format!("writes dyn+{i:#x}, which in-flight {} also writes", op_desc(w, wr)));
        }
        if s.readers[i as usize] != 0 {
            return Err(format!(
                "writes dyn+{i:#x}, which {} still reads (stage refilled before the reader completed?)",
                first_reader_op(w, cta, i, 1)
            ));
        }
    }
    Ok(())
}

pub(crate) fn mark_write(w: &mut World, cta: usize, off: u32, len: u32, id: u32) {
    let s = &mut w.ctas[cta].smem;
    s.writer[off as usize..(off + len) as usize].fill(id);
    // An asynchronous copy's bytes are ordered by its barrier, not by a thread's fences.
    if let Some(g) = &mut s.generic {
        g[off as usize..(off + len) as usize].fill((0, 0));
    }
    if let Some(r) = &mut s.last_read {
        r[off as usize..(off + len) as usize].fill((0, 0));
    }
}

pub(crate) fn mark_read(w: &mut World, cta: usize, off: u32, len: u32) {
    for r in &mut w.ctas[cta].smem.readers[off as usize..(off + len) as usize] {
        *r += 1;
    }
}

pub(crate) fn unmark_read(w: &mut World, cta: usize, off: u32, len: u32) {
    for r in &mut w.ctas[cta].smem.readers[off as usize..(off + len) as usize] {
        *r -= 1;
    }
}

fn load<const N: usize>(name: &'static str, site: &'static Location<'static>, addr: u32) -> [u32; N] {
    instr(name, site, false, |w, me| {
        let len = 4 * N as u32;
        let cta = w.threads[me].cta;
        let off = cta_offset(w, addr, len, len).map_err(|m| w.err_at(me, ErrorKind::InvalidOperand, m))?;
        check_thread_read(w, cta, off, len).map_err(|m| w.err_at(me, ErrorKind::Hazard, m))?;
        check_ordered(w, me, cta, off, len, "reads").map_err(|m| w.err_at(me, ErrorKind::Hazard, m))?;
        w.threads[me].ld_seq += 1;
        let mark = (me as u32 + 1, w.threads[me].ld_seq);
        let s = &mut w.ctas[cta].smem;
        stamp(&mut s.last_read, s.data.len(), off, len, mark);
        let d = &w.ctas[cta].smem.data;
        Ok(Flow::Done(std::array::from_fn(|i| {
            let o = off as usize + 4 * i;
            u32::from_le_bytes([d[o], d[o + 1], d[o + 2], d[o + 3]])
        })))
    })
}

fn store<const N: usize>(name: &'static str, site: &'static Location<'static>, addr: u32, v: [u32; N]) {
    instr(name, site, false, |w: &mut World, me| -> Result<Flow<()>, ModelError> {
        let len = 4 * N as u32;
        let cta = w.threads[me].cta;
        let off = cta_offset(w, addr, len, len).map_err(|m| w.err_at(me, ErrorKind::InvalidOperand, m))?;
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        thread_store(w, me, cta, off, &bytes).map_err(|m| w.err_at(me, ErrorKind::Hazard, m))?;
        Ok(Flow::Done(()))
    })
}

/// Writes `bytes` at `off` of CTA `cta` as a `st.shared` of thread `t`: checked against in-flight
/// asynchronous operations and other threads' unordered stores, then marked as the thread's
/// store (its next sequence number, for the ordering and proxy checks).
fn thread_store(w: &mut World, t: usize, cta: usize, off: u32, bytes: &[u8]) -> Result<(), String> {
    let len = bytes.len() as u32;
    check_thread_write(w, cta, off, len)?;
    check_ordered(w, t, cta, off, len, "writes")?;
    check_read_before(w, t, cta, off, len)?;
    w.ctas[cta].smem.data[off as usize..(off + len) as usize].copy_from_slice(bytes);
    w.threads[t].st_seq += 1;
    let mark = (t as u32 + 1, w.threads[t].st_seq);
    let s = &mut w.ctas[cta].smem;
    stamp(&mut s.generic, s.data.len(), off, len, mark);
    Ok(())
}

/// Marks bytes `off .. off + len` of a CTA's `size`-byte window with `mark` (a thread's access:
/// index + 1, sequence number), allocating the marks at their first use.
fn stamp(marks: &mut Option<Vec<(u32, u32)>>, size: usize, off: u32, len: u32, mark: (u32, u32)) {
    marks.get_or_insert_with(|| vec![(0, 0); size])[off as usize..(off + len) as usize].fill(mark);
}

/// `.shared::cta` address of the start of the dynamic shared memory (`cvta.to.shared` of the
/// `extern .shared` window, PTX ISA 9.0 §5.1.7): the launch's non-zero `smem_base`.
#[track_caller]
pub fn dynamic_base() -> u32 {
    instr("cvta.to.shared", Location::caller(), false, |w, _| Ok(Flow::Done(w.cfg.smem_base)))
}

/// `ld.shared.u32 d, [a];`
#[track_caller]
pub fn ld_u32(a: u32) -> u32 {
    load::<1>("ld.shared.u32", Location::caller(), a)[0]
}

/// `ld.shared.v2.u32 {d0, d1}, [a];` (8-byte aligned).
#[track_caller]
pub fn ld_v2_u32(a: u32) -> [u32; 2] {
    load::<2>("ld.shared.v2.u32", Location::caller(), a)
}

/// `ld.shared.v4.u32 {d0, d1, d2, d3}, [a];` (16-byte aligned).
#[track_caller]
pub fn ld_v4_u32(a: u32) -> [u32; 4] {
    load::<4>("ld.shared.v4.u32", Location::caller(), a)
}

/// `st.shared.u32 [a], v;`
#[track_caller]
pub fn st_u32(a: u32, v: u32) {
    store::<1>("st.shared.u32", Location::caller(), a, [v])
}

/// `st.shared.v2.u32 [a], {v0, v1};` (8-byte aligned).
#[track_caller]
pub fn st_v2_u32(a: u32, v: [u32; 2]) {
    store::<2>("st.shared.v2.u32", Location::caller(), a, v)
}

/// `st.shared.v4.u32 [a], {v0..v3};` (16-byte aligned).
#[track_caller]
pub fn st_v4_u32(a: u32, v: [u32; 4]) {
    store::<4>("st.shared.v4.u32", Location::caller(), a, v)
}

/// `stmatrix.sync.aligned.m8n8.x4{.trans}.shared.b16 [a], {r0, r1, r2, r3};` (PTX ISA 9.0
/// §9.7.14.5.16, sm_90): the warp stores four 8 × 8 matrices of 16-bit elements. Register `rj` of
/// lane `l` holds row `l / 4`, columns `2 (l % 4)` (low half) and `+ 1` (high half) of matrix
/// `j`; lane `8 j + i` gives the 16-byte aligned address of stored row `i` of matrix `j`. With
/// `.trans` a stored row is a column of the registers' matrix (column-major store). A warp
/// collective: every lane executes it, converged.
#[track_caller]
pub fn stmatrix_x4(a: u32, r: [u32; 4], trans: bool) {
    let name = if trans {
        "stmatrix.sync.aligned.m8n8.x4.trans.shared.b16"
    } else {
        "stmatrix.sync.aligned.m8n8.x4.shared.b16"
    };
    instr(name, Location::caller(), true, move |w, me| {
        let input = vec![a, r[0], r[1], r[2], r[3]];
        Ok(
            match crate::sync::collective(
                w,
                me,
                crate::sync::Scope::Warp,
                crate::sync::Coll::StMatrixX4 { trans },
                u32::MAX,
                input,
            )? {
                Flow::Done(_) => Flow::Done(()),
                Flow::Block(b) => Flow::Block(b),
            },
        )
    })
}

/// Completes a warp's `stmatrix .x4`: `inputs[l]` is lane `l`'s `[address, r0, r1, r2, r3]`. Each
/// stored row is a thread store of the lane that gave its address (for the proxy checks).
pub(crate) fn complete_stmatrix_x4(
    w: &mut World,
    me: usize,
    mem: &[usize],
    trans: bool,
    inputs: &[Vec<u32>],
) -> Result<(), ModelError> {
    let half = |lane: usize, j: usize, h: usize| (inputs[lane][1 + j] >> (16 * h)) as u16;
    for j in 0..4 {
        for i in 0..8 {
            let provider = 8 * j + i;
            let addr = inputs[provider][0];
            // Element `e` of stored row `i`: (row i, column e) of the matrix, or (row e, column i)
            // with `.trans`.
            let bytes: Vec<u8> = (0..8)
                .flat_map(|e| {
                    let (row, col) = if trans { (e, i) } else { (i, e) };
                    half(4 * row + col / 2, j, col % 2).to_le_bytes()
                })
                .collect();
            let t = mem[provider];
            let cta = w.threads[t].cta;
            let off = cta_offset(w, addr, 16, 16)
                .map_err(|m| w.err_at(me, ErrorKind::InvalidOperand, format!("lane {provider}: {m}")))?;
            thread_store(w, t, cta, off, &bytes)
                .map_err(|m| w.err_at(me, ErrorKind::Hazard, format!("lane {provider}: {m}")))?;
        }
    }
    Ok(())
}
