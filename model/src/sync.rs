//! Thread synchronization: warp and warpgroup collectives (`.sync.aligned`), named CTA barriers,
//! the cluster barrier, `mapa`, special registers, fences and `trap`.
//!
//! A collective is a meeting: each participating lane arrives with the instruction (its kind and
//! warp-uniform operands) and its own inputs; the last to arrive computes every lane's result.
//! A lane arriving at a different instruction, or with different uniform operands, while others
//! wait is a [`ErrorKind::Divergence`] error (`.aligned`: "all threads in the warp must execute
//! the same instruction", PTX ISA 9.0 §9.7.16.7.1 and §9.7.15.1).

use crate::error::{ErrorKind, ModelError};
use crate::exec::{
    instr, pub_exchange, query, raise, tc_contribution, tc_ordered_after, Block, Flow, Status, TcOrder, World,
};
use crate::smem::mapa;
use crate::wgmma::WgmmaType;
use std::panic::Location;

/// The instruction (and its uniform operands) a meeting is for.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Coll {
    Elect { mask: u32 },
    WarpSync { mask: u32 },
    Shfl { mode: ShflMode, c: u32, mask: u32 },
    TmemAlloc { dst: u32, ncols: u32 },
    TmemDealloc { taddr: u32, ncols: u32 },
    TmemRelinquish,
    TmemLd16x256b { taddr: u32, num: u32 },
    WgFence,
    WgCommit,
    WgWait { n: u32 },
    WgMma { n: u32, b_desc: u64, scale_d: bool, ty: WgmmaType },
    StMatrixX4 { trans: bool },
}

/// `shfl.sync` modes (PTX ISA 9.0 §9.7.9.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ShflMode {
    Up,
    Down,
    Bfly,
    Idx,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scope {
    Warp,
    Warpgroup,
}

/// A collective in progress.
pub(crate) struct Meeting {
    pub key: Coll,
    pub expected: u128,
    pub arrived: u128,
    pub inputs: Vec<Vec<u32>>,
    pub site: &'static Location<'static>,
}

impl Meeting {
    pub(crate) fn describe(&self) -> String {
        format!("{:?} (first lane arrived at {}:{})", self.key, self.site.file(), self.site.line())
    }
}

/// What completing a collective produced.
pub(crate) enum Outcome {
    /// Per-member results; everyone continues.
    Outputs(Vec<Vec<u32>>),
    /// Every member waits on `Block`; whoever unblocks them delivers their results.
    Wait(Block),
}

/// Members (global thread ids) of a meeting of `scope` that thread `me` joins with `mask`.
fn members(w: &World, me: usize, scope: Scope, mask: u32) -> Vec<usize> {
    match scope {
        Scope::Warp => {
            let warp = w.warp_of(me);
            (0..32).filter(|l| mask >> l & 1 == 1).map(|l| w.thread_of_warp_lane(warp, l)).collect()
        }
        Scope::Warpgroup => {
            let first = me - (w.threads[me].tid % 128) as usize;
            (first..first + 128).collect()
        }
    }
}

/// Joins (or completes) the collective `key` of `scope` with this thread's `input`.
pub(crate) fn collective(
    w: &mut World,
    me: usize,
    scope: Scope,
    key: Coll,
    mask: u32,
    input: Vec<u32>,
) -> Result<Flow<Vec<u32>>, ModelError> {
    if let Some(out) = w.threads[me].coll_out.take() {
        return Ok(Flow::Done(out));
    }
    // A warpgroup is four contiguous warps, the first of warp rank ≡ 0 (mod 4) (PTX ISA 9.0,
    // "Warpgroup" in the wgmma section); the CTA may have more warps beyond the last whole
    // warpgroup (they just cannot issue warpgroup instructions).
    if scope == Scope::Warpgroup && (w.threads[me].tid / 128 + 1) * 128 > w.cfg.block {
        return Err(w.err_at(
            me,
            ErrorKind::InvalidOperand,
            "warpgroup instruction by a warp that is not in a complete warpgroup of the CTA",
        ));
    }
    let mem = members(w, me, scope, mask);
    let Some(my_idx) = mem.iter().position(|&m| m == me) else {
        return Err(w.err_at(
            me,
            ErrorKind::InvalidOperand,
            format!("the executing lane is not in membermask {mask:#x}"),
        ));
    };
    if let Some(&gone) = mem.iter().find(|&&m| w.threads[m].status == Status::Exited) {
        let who = w.who(gone);
        return Err(w.err_at(me, ErrorKind::Divergence, format!("a participant has exited: {who}")));
    }
    let slot_idx = match scope {
        Scope::Warp => w.warp_of(me),
        Scope::Warpgroup => w.wg_of(me),
    };
    let site = w.threads[me].site;
    let slot = match scope {
        Scope::Warp => &mut w.warps[slot_idx],
        Scope::Warpgroup => &mut w.wgs[slot_idx].meeting,
    };
    let expected: u128 = mem.iter().enumerate().fold(0, |acc, (i, _)| acc | 1u128 << i);
    let m = slot.get_or_insert_with(|| Meeting {
        key: key.clone(),
        expected,
        arrived: 0,
        inputs: vec![Vec::new(); mem.len()],
        site,
    });
    if m.key != key || m.expected != expected {
        let theirs = m.describe();
        return Err(w.err_at(
            me,
            ErrorKind::Divergence,
            format!("reached {key:?} while other lanes of its {scope:?} wait in {theirs}"),
        ));
    }
    m.inputs[my_idx] = input;
    m.arrived |= 1 << my_idx;
    if m.arrived != m.expected {
        let what = format!("{key:?}");
        return Ok(Flow::Block(Block::Collective { what }));
    }
    let m = slot.take().expect("present");
    match complete(w, me, &mem, &m.key, m.inputs)? {
        Outcome::Outputs(mut outs) => {
            for (i, &t) in mem.iter().enumerate() {
                if t != me {
                    w.threads[t].coll_out = Some(std::mem::take(&mut outs[i]));
                    w.wake(t);
                }
            }
            Ok(Flow::Done(std::mem::take(&mut outs[my_idx])))
        }
        Outcome::Wait(b) => {
            for &t in &mem {
                if t != me {
                    if let Block::WgmmaWait { wg, .. } = &b {
                        w.wgs[*wg].waiters.push(t);
                    }
                    w.threads[t].block = Some(b.clone());
                }
            }
            Ok(Flow::Block(b))
        }
    }
}

fn complete(w: &mut World, me: usize, mem: &[usize], key: &Coll, inputs: Vec<Vec<u32>>) -> Result<Outcome, ModelError> {
    let n = mem.len();
    Ok(match key {
        Coll::WarpSync { .. } => {
            // `bar.warp.sync` orders memory among its threads (§9.7.13.2): each is ordered after
            // the others' published shared-memory stores.
            pub_exchange(w, mem, mem);
            Outcome::Outputs(vec![Vec::new(); n])
        }
        Coll::Elect { mask } => {
            // "Election of a leader thread happens deterministically, i.e. the same leader thread
            // is elected for the same membermask every time" (§9.7.13.14); which one is not
            // specified, so the model derives it from the seed and the mask.
            let lanes: Vec<u32> = (0..32).filter(|l| mask >> l & 1 == 1).collect();
            let h = (w.cfg.schedule.seed ^ (*mask as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
                .wrapping_mul(0xD6E8_FEB8_6659_FD93);
            let leader = lanes[((h >> 32) % lanes.len() as u64) as usize];
            Outcome::Outputs(mem.iter().map(|&t| vec![(w.threads[t].tid % 32 == leader) as u32, leader]).collect())
        }
        Coll::Shfl { mode, c, mask } => {
            // PTX ISA 9.0 §9.7.9.6 (shfl.sync), "Semantics".
            let mut src = [None; 32];
            for (i, &t) in mem.iter().enumerate() {
                src[(w.threads[t].tid % 32) as usize] = Some(inputs[i][0]);
            }
            let mut outs = Vec::with_capacity(n);
            for (i, &t) in mem.iter().enumerate() {
                let lane = w.threads[t].tid % 32;
                let b = inputs[i][1] & 0x1F;
                let cval = c & 0x1F;
                let segmask = (c >> 8) & 0x1F;
                let max_lane = (lane & segmask) | (cval & !segmask);
                let min_lane = lane & segmask;
                let (j, p) = match mode {
                    ShflMode::Up => {
                        let j = lane as i32 - b as i32;
                        (j, j >= max_lane as i32)
                    }
                    ShflMode::Down => {
                        let j = (lane + b) as i32;
                        (j, j <= max_lane as i32)
                    }
                    ShflMode::Bfly => {
                        let j = (lane ^ b) as i32;
                        (j, j <= max_lane as i32)
                    }
                    ShflMode::Idx => {
                        let j = (min_lane | (b & !segmask)) as i32;
                        (j, j <= max_lane as i32)
                    }
                };
                let j = if p { j as u32 } else { lane };
                let Some(v) = src[j as usize] else {
                    return Err(w.err_at(
                        me,
                        ErrorKind::InvalidOperand,
                        format!(
                            "lane {lane} reads lane {j}, which is not in membermask {mask:#x} (value unpredictable)"
                        ),
                    ));
                };
                outs.push(vec![v, p as u32]);
            }
            Outcome::Outputs(outs)
        }
        Coll::TmemAlloc { .. } | Coll::TmemDealloc { .. } | Coll::TmemRelinquish | Coll::TmemLd16x256b { .. } => {
            crate::tcgen05::complete_collective(w, me, mem, key, inputs)?
        }
        Coll::WgFence | Coll::WgCommit | Coll::WgWait { .. } | Coll::WgMma { .. } => {
            crate::wgmma::complete_collective(w, me, mem, key, inputs)?
        }
        Coll::StMatrixX4 { trans } => {
            crate::smem::complete_stmatrix_x4(w, me, mem, *trans, &inputs)?;
            Outcome::Outputs(vec![Vec::new(); n])
        }
    })
}

/// Named CTA barrier state: the current phase's arrivals, those that wait (`bar.sync`) and those
/// that went on (`bar.arrive`).
#[derive(Default)]
pub(crate) struct NamedBar {
    pub count: u32,
    pub arrived: Vec<usize>,
    pub arrived_only: Vec<usize>,
}

impl NamedBar {
    /// Arrivals so far in the current phase.
    pub fn arrivals(&self) -> usize {
        self.arrived.len() + self.arrived_only.len()
    }
}

/// The cluster barrier of one cluster.
#[derive(Default)]
pub(crate) struct ClusterBar {
    pub phase: u64,
    pub arrived: u32,
    pub waiters: Vec<usize>,
}

fn check_arch(w: &World, me: usize, want: crate::Arch) -> Result<(), ModelError> {
    if w.cfg.arch != want {
        return Err(w.err_at(
            me,
            ErrorKind::InvalidOperand,
            format!("instruction needs {want:?}, the launch is {:?}", w.cfg.arch),
        ));
    }
    Ok(())
}

pub(crate) fn require_arch(w: &World, me: usize, want: crate::Arch) -> Result<(), ModelError> {
    check_arch(w, me, want)
}

// ----- public instructions -----

/// `bar.sync id, threads;` (PTX ISA 9.0 §9.7.13.1): waits until `threads` threads (a multiple of
/// 32, at most the CTA) have arrived at barrier `id` (0..16). All arrivals must give the same count.
/// The model counts threads (the hardware counts each arriving warp as 32).
#[track_caller]
pub fn bar_sync(id: u32, threads: u32) {
    let mut attempted = false;
    instr("bar.sync", Location::caller(), true, move |w, me| {
        if attempted {
            return Ok(Flow::Done(()));
        }
        if named_arrive(w, me, "bar.sync", id, threads, true)? {
            return Ok(Flow::Done(()));
        }
        attempted = true;
        Ok(Flow::Block(Block::NamedBarrier { id, count: threads }))
    })
}

/// `bar.arrive id, threads;` (PTX ISA 9.0 §9.7.13.1): counts this thread at barrier `id` and goes
/// on; the phase completes when `threads` threads have arrived, releasing those that wait in
/// `bar.sync`. The waiters are ordered after the arrivals' earlier published stores and tcgen05
/// operations; the arriving thread learns nothing. A thread that arrives twice in one phase is an
/// error: the hardware would count it twice, so the phase could complete without the threads it
/// was meant to wait for.
#[track_caller]
pub fn bar_arrive(id: u32, threads: u32) {
    instr("bar.arrive", Location::caller(), true, move |w, me| {
        named_arrive(w, me, "bar.arrive", id, threads, false)?;
        Ok(Flow::Done(()))
    })
}

/// Counts `me` at named barrier `id` (waiting when `waits`); completes the phase when it is the
/// last arrival (the return value), waking the waiters.
fn named_arrive(w: &mut World, me: usize, what: &str, id: u32, threads: u32, waits: bool) -> Result<bool, ModelError> {
    if id >= 16 || threads == 0 || threads % 32 != 0 || threads > w.cfg.block {
        return Err(w.err_at(
            me,
            ErrorKind::InvalidOperand,
            format!(
                "{what} {id}, {threads}: need id < 16 and a positive multiple of 32 up to the CTA size {}",
                w.cfg.block
            ),
        ));
    }
    let cta = w.threads[me].cta;
    let nb = &mut w.ctas[cta].named[id as usize];
    if nb.arrivals() == 0 {
        nb.count = threads;
    } else if nb.count != threads {
        let c = nb.count;
        return Err(w.err_at(
            me,
            ErrorKind::Divergence,
            format!("{what} {id} with {threads} threads while others arrived with {c}"),
        ));
    }
    if nb.arrived_only.contains(&me) {
        return Err(w.err_at(
            me,
            ErrorKind::Divergence,
            format!("{what} {id}: this thread already arrived (bar.arrive) in the barrier's current phase"),
        ));
    }
    if waits {
        nb.arrived.push(me);
    } else {
        nb.arrived_only.push(me);
    }
    if nb.arrivals() as u32 != threads {
        return Ok(false);
    }
    let waiters = std::mem::take(&mut nb.arrived);
    let all: Vec<usize> = waiters.iter().copied().chain(std::mem::take(&mut nb.arrived_only)).collect();
    // Every waiter is ordered after the others' tcgen05 operations ...
    let via = format!("bar.sync {id}");
    let order = all.iter().fold(None, |o, &t| TcOrder::merge(o, tc_contribution(w, t, &via)));
    for &t in &waiters {
        tc_ordered_after(w, t, order.clone());
    }
    // ... and after their published shared-memory stores.
    pub_exchange(w, &all, &waiters);
    for t in waiters {
        if t != me {
            w.wake(t);
        }
    }
    Ok(true)
}

/// `setmaxnreg.inc.sync.aligned.u32 n;` (PTX ISA 9.0 §9.7.19.9 "setmaxnreg"): raises this
/// thread's register budget to `n`, taking the difference from the CTA's pool of registers that
/// `setmaxnreg.dec` released, and waits while the pool has too few. Modelled per thread (the
/// hardware counts warps); checked only when the launch says how many registers the kernel has
/// (`LaunchConfig::registers`), so that a request the CTA can never grant ends in a deadlock
/// report instead of a hang on the GPU.
#[track_caller]
pub fn setmaxnreg_inc(n: u32) {
    instr("setmaxnreg.inc", Location::caller(), false, move |w, me| {
        if w.cfg.registers == 0 {
            return Ok(Flow::Done(()));
        }
        let have = w.threads[me].registers;
        if n < have {
            return Err(w.err_at(
                me,
                ErrorKind::InvalidOperand,
                format!("setmaxnreg.inc to {n} registers from {have}: an increase must not lower the budget"),
            ));
        }
        let cta = w.threads[me].cta;
        let need = (n - have) as u64;
        let free = w.ctas[cta].free_registers;
        if free < need {
            return Ok(Flow::Block(Block::Registers { want: n, free }));
        }
        w.ctas[cta].free_registers -= need;
        w.threads[me].registers = n;
        Ok(Flow::Done(()))
    })
}

/// `setmaxnreg.dec.sync.aligned.u32 n;` (PTX ISA 9.0 §9.7.19.9): lowers this thread's register
/// budget to `n` and returns the rest to the CTA's pool (waking the threads an `inc` holds).
#[track_caller]
pub fn setmaxnreg_dec(n: u32) {
    instr("setmaxnreg.dec", Location::caller(), false, move |w, me| {
        if w.cfg.registers == 0 {
            return Ok(Flow::Done(()));
        }
        let have = w.threads[me].registers;
        if n > have {
            return Err(w.err_at(
                me,
                ErrorKind::InvalidOperand,
                format!("setmaxnreg.dec to {n} registers from {have}: a decrease must not raise the budget"),
            ));
        }
        let cta = w.threads[me].cta;
        w.ctas[cta].free_registers += (have - n) as u64;
        w.threads[me].registers = n;
        let waiting: Vec<usize> = (0..w.threads.len())
            .filter(|&t| w.threads[t].cta == cta && matches!(w.threads[t].block, Some(Block::Registers { .. })))
            .collect();
        for t in waiting {
            w.wake(t);
        }
        Ok(Flow::Done(()))
    })
}

/// `griddepcontrol.wait;` (PTX ISA, "Parallel Synchronization and Communication Instructions:
/// griddepcontrol"): waits until the grids this one depends on programmatically have completed and
/// their memory is visible. The model runs launches one after another, so they always have; it
/// records that the thread waited, so that reading what the previous launch writes before the wait
/// is caught (`LaunchConfig::predecessor_writes`), and counts it in [`crate::RunStats::fences`].
#[track_caller]
pub fn griddepcontrol_wait() {
    fence(Location::caller(), "griddepcontrol.wait", |w, me| w.threads[me].grid_waited = true)
}

/// `griddepcontrol.launch_dependents;` (PTX ISA, "Parallel Synchronization and Communication
/// Instructions: griddepcontrol"): lets a programmatically dependent grid be scheduled early.
/// Launches run one after another in the model: counted, no effect.
#[track_caller]
pub fn griddepcontrol_launch_dependents() {
    fence(Location::caller(), "griddepcontrol.launch_dependents", counted)
}

/// `bar.sync 0;` with every thread of the CTA (`__syncthreads()`).
#[track_caller]
pub fn bar_sync_all() {
    let n = query(|w, _| w.cfg.block);
    bar_sync(0, n)
}

/// `barrier.cluster.arrive.release.aligned;` (PTX ISA 9.0 §9.7.13.3).
#[track_caller]
pub fn cluster_arrive() {
    instr("barrier.cluster.arrive", Location::caller(), true, cluster_arrive_inner)
}

/// `barrier.cluster.wait.acquire.aligned;` (PTX ISA 9.0 §9.7.13.3).
#[track_caller]
pub fn cluster_wait() {
    cluster_wait_at(Location::caller())
}

/// `barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned;`: every thread of
/// every CTA of the cluster waits for all the others.
#[track_caller]
pub fn cluster_sync() {
    let site = Location::caller();
    instr("barrier.cluster.arrive", site, true, cluster_arrive_inner);
    cluster_wait_at(site);
}

fn cluster_wait_at(site: &'static Location<'static>) {
    let mut arrived_phase = None;
    instr("barrier.cluster.wait", site, true, move |w, me| cluster_wait_step(w, me, &mut arrived_phase))
}

fn cluster_arrive_inner(w: &mut World, me: usize) -> Result<Flow<()>, ModelError> {
    if w.threads[me].cluster_arrived.is_some() {
        return Err(w.err_at(me, ErrorKind::InvalidOperand, "second barrier.cluster.arrive without a wait in between"));
    }
    let cl = w.threads[me].cta / w.cfg.cluster as usize;
    let expected = w.cfg.cluster * w.cfg.block;
    let c = &mut w.clusters[cl];
    w.threads[me].cluster_arrived = Some(c.phase);
    c.arrived += 1;
    if c.arrived == expected {
        c.arrived = 0;
        c.phase += 1;
        for t in std::mem::take(&mut c.waiters) {
            w.wake(t);
        }
    }
    Ok(Flow::Done(()))
}

fn cluster_wait_step(w: &mut World, me: usize, arrived_phase: &mut Option<u64>) -> Result<Flow<()>, ModelError> {
    let p = match *arrived_phase {
        Some(p) => p,
        None => match w.threads[me].cluster_arrived.take() {
            Some(p) => {
                *arrived_phase = Some(p);
                p
            }
            None => {
                return Err(w.err_at(me, ErrorKind::InvalidOperand, "barrier.cluster.wait without a preceding arrive"))
            }
        },
    };
    let cl = w.threads[me].cta / w.cfg.cluster as usize;
    if w.clusters[cl].phase > p {
        return Ok(Flow::Done(()));
    }
    w.clusters[cl].waiters.push(me);
    Ok(Flow::Block(Block::ClusterBarrier))
}

/// `mapa.shared::cluster.u32 d, a, rank;` (PTX ISA 9.0 §9.7.9.23): the `.shared::cluster`
/// address of the variable at `a` in the CTA of cluster rank `rank`.
#[track_caller]
pub fn map_shared(a: u32, rank: u32) -> u32 {
    instr("mapa.shared::cluster.u32", Location::caller(), false, |w, me| {
        mapa(w, me, a, rank).map(Flow::Done).map_err(|m| w.err_at(me, ErrorKind::InvalidOperand, m))
    })
}

/// `elect.sync _|p, membermask;` (PTX ISA 9.0 §9.7.13.14): true in exactly one lane of
/// `membermask`. The model's leader is a seeded function of the mask (the ISA only promises the
/// same leader for the same mask).
#[track_caller]
pub fn elect_sync(membermask: u32) -> bool {
    instr("elect.sync", Location::caller(), true, |w, me| {
        Ok(match collective(w, me, Scope::Warp, Coll::Elect { mask: membermask }, membermask, Vec::new())? {
            Flow::Done(v) => Flow::Done(v[0] != 0),
            Flow::Block(b) => Flow::Block(b),
        })
    })
}

/// `elect.sync` over the full warp.
#[track_caller]
pub fn elect_one() -> bool {
    elect_sync(u32::MAX)
}

/// `bar.warp.sync membermask;` (PTX ISA 9.0 §9.7.13.2).
#[track_caller]
pub fn warp_sync(membermask: u32) {
    instr("bar.warp.sync", Location::caller(), true, |w, me| {
        Ok(match collective(w, me, Scope::Warp, Coll::WarpSync { mask: membermask }, membermask, Vec::new())? {
            Flow::Done(_) => Flow::Done(()),
            Flow::Block(b) => Flow::Block(b),
        })
    })
}

fn shfl(
    site: &'static Location<'static>,
    name: &'static str,
    mode: ShflMode,
    a: u32,
    b: u32,
    c: u32,
    mask: u32,
) -> u32 {
    instr(name, site, true, |w, me| {
        Ok(match collective(w, me, Scope::Warp, Coll::Shfl { mode, c, mask }, mask, vec![a, b])? {
            Flow::Done(v) => Flow::Done(v[0]),
            Flow::Block(b) => Flow::Block(b),
        })
    })
}

/// `shfl.sync.bfly.b32 d, a, lane_mask, 0x1f, 0xffffffff;` (PTX ISA 9.0 §9.7.9.6).
#[track_caller]
pub fn shfl_xor(a: u32, lane_mask: u32) -> u32 {
    shfl(Location::caller(), "shfl.sync.bfly.b32", ShflMode::Bfly, a, lane_mask, 0x1F, u32::MAX)
}

/// `shfl.sync.idx.b32 d, a, src_lane, 0x1f, 0xffffffff;` (PTX ISA 9.0 §9.7.9.6).
#[track_caller]
pub fn shfl_idx(a: u32, src_lane: u32) -> u32 {
    shfl(Location::caller(), "shfl.sync.idx.b32", ShflMode::Idx, a, src_lane, 0x1F, u32::MAX)
}

/// `shfl.sync.{up,down}.b32 d, a, delta, c, 0xffffffff;` with `c` = 0 for up and 0x1f for down.
#[track_caller]
pub fn shfl_up_down(a: u32, delta: u32, up: bool) -> u32 {
    let (mode, c, name) =
        if up { (ShflMode::Up, 0, "shfl.sync.up.b32") } else { (ShflMode::Down, 0x1F, "shfl.sync.down.b32") };
    shfl(Location::caller(), name, mode, a, delta, c, u32::MAX)
}

// ----- special registers (PTX ISA 9.0 §10) -----

fn sreg(f: impl FnOnce(&World, usize) -> u32) -> u32 {
    query(f)
}

/// `%tid.x` (§10.1).
pub fn tid_x() -> u32 {
    sreg(|w, me| w.threads[me].tid)
}
/// `%ntid.x` (§10.2).
pub fn ntid_x() -> u32 {
    sreg(|w, _| w.cfg.block)
}
/// `%laneid` (§10.3).
pub fn lane_id() -> u32 {
    sreg(|w, me| w.threads[me].tid % 32)
}
/// `%ctaid.x` (§10.6).
pub fn ctaid_x() -> u32 {
    sreg(|w, me| w.threads[me].cta as u32 + w.cfg.first_cta())
}
/// `%nctaid.x` (§10.7).
pub fn nctaid_x() -> u32 {
    sreg(|w, _| w.cfg.grid_ctas())
}
/// `%clusterid.x` (§10.12). (A launch in waves has no clusters: each CTA is its own cluster.)
pub fn clusterid_x() -> u32 {
    sreg(|w, me| w.ctas[w.threads[me].cta].cluster as u32 + w.cfg.first_cta())
}
/// `%nclusterid.x` (§10.13).
pub fn nclusterid_x() -> u32 {
    sreg(|w, _| w.cfg.grid_ctas() / w.cfg.cluster)
}
/// `%cluster_ctarank` (§10.16).
pub fn cluster_ctarank() -> u32 {
    sreg(|w, me| w.ctas[w.threads[me].cta].rank)
}
/// `%cluster_nctarank` (§10.17).
pub fn cluster_nctarank() -> u32 {
    sreg(|w, _| w.cfg.cluster)
}

/// Warp index in the CTA, `%tid.x / 32` broadcast from lane 0 with `shfl.sync.idx` (a full-warp
/// collective, as the kernels' `warp_id` is).
#[track_caller]
pub fn warp_id() -> u32 {
    let t = tid_x() / 32;
    shfl(Location::caller(), "shfl.sync.idx.b32", ShflMode::Idx, t, 0, 0x1F, u32::MAX)
}

/// `%globaltimer` (§10.28): the model's clock (16 ns per model instruction of any thread).
pub fn globaltimer() -> u64 {
    query(|w, _| w.clock * 16)
}

/// `trap;`: the launch fails with [`ErrorKind::Trap`].
#[track_caller]
pub fn trap() -> ! {
    raise(ErrorKind::Trap, Location::caller(), "trap", "trap executed".into())
}

/// A fence-like instruction: counted in [`crate::RunStats::fences`] under `name`, then `effect` on
/// the executing thread's state.
fn fence(site: &'static Location<'static>, name: &'static str, effect: fn(&mut World, usize)) {
    instr(name, site, true, move |w, me| {
        *w.stats.fences.entry(name).or_default() += 1;
        effect(w, me);
        Ok(Flow::Done(()))
    })
}

/// No effect beyond the count.
fn counted(_: &mut World, _: usize) {}

/// `fence.mbarrier_init.release.cluster;` (PTX ISA 9.0 §9.7.13.4): makes this thread's earlier
/// `mbarrier.init`s visible to the cluster and the async proxy (the model checks that TMA,
/// `tcgen05.commit` and remote arrivals only use barriers after it).
#[track_caller]
pub fn fence_mbarrier_init() {
    fence(Location::caller(), "fence.mbarrier_init.release.cluster", crate::mbarrier::fence_init)
}

/// `fence.proxy.async.shared::cta;` (PTX ISA 9.0 §9.7.13.4): the thread's `st.shared`s so far
/// become visible to the async proxy once a release passes them on (`exec::Published`).
#[track_caller]
pub fn fence_proxy_async() {
    fence(Location::caller(), "fence.proxy.async.shared::cta", |w, me| w.threads[me].fenced_seq = w.threads[me].st_seq)
}

/// `tcgen05.fence::before_thread_sync;` (PTX ISA 9.0 §9.7.16.11.1): recorded, no effect.
#[track_caller]
pub fn tcgen05_fence_before_thread_sync() {
    fence(Location::caller(), "tcgen05.fence::before_thread_sync", |w, me| w.threads[me].tc_unfenced = false)
}

/// `tcgen05.fence::after_thread_sync;` (PTX ISA 9.0 §9.7.16.11.1): recorded, no effect.
#[track_caller]
pub fn tcgen05_fence_after_thread_sync() {
    fence(Location::caller(), "tcgen05.fence::after_thread_sync", |w, me| {
        // Not when a contributor skipped its `before_thread_sync`: that order stays broken.
        if w.threads[me].tc_after.as_ref().is_some_and(|o| o.unfenced_by.is_none()) {
            w.threads[me].tc_after = None;
        }
    })
}

/// `fence.proxy.tensormap::generic.acquire.sys [a], 128;` (PTX ISA 9.0 §9.7.13.4): the model has
/// no descriptor cache (its copies read each map from memory), so it records the acquire and
/// checks that every tensor copy uses a map its thread acquired: on the device the host writes
/// the maps between launches, and a copy without the acquire may use a stale cached map.
#[track_caller]
pub fn acquire_tensormap(map: u64) {
    const NAME: &str = "fence.proxy.tensormap::generic.acquire";
    instr(NAME, Location::caller(), true, move |w, me| {
        *w.stats.fences.entry(NAME).or_default() += 1;
        let acquired = &mut w.threads[me].acquired_maps;
        if !acquired.contains(&map) {
            acquired.push(map);
        }
        Ok(Flow::Done(()))
    })
}

/// `prefetch.tensormap [a];`: recorded, no effect.
#[track_caller]
pub fn prefetch_tensormap(_map: u64) {
    fence(Location::caller(), "prefetch.tensormap", counted)
}
