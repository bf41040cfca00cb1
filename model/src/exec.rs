//! The launcher and the scheduler.
//!
//! Every GPU thread of the grid is an OS thread, but only one of them runs at a time: the one
//! named by `World::current`. A thread hands the turn over at synchronizing points (a failed
//! `try_wait`, a barrier, a warp collective, and — with a seeded probability — after any
//! synchronizing instruction, or every `preempt_every` model instructions). All choices (which
//! thread runs next, when and in which order in-flight asynchronous operations complete) come from
//! one seeded generator, so a run is reproducible from its [`Schedule`].
//!
//! Asynchronous operations complete lazily by default: only when no thread can run, or with the
//! probability `eager_permille` at each scheduling decision. Deadlock is exact: no thread can run
//! and nothing is in flight.

use crate::asyncop::AsyncOp;
use crate::error::{ErrorKind, ModelError};
use crate::mbarrier::Mbar;
use crate::rng::Rng;
use crate::smem::Smem;
use crate::sync::{ClusterBar, Meeting, NamedBar};
use crate::tcgen05::{PendingAlloc, Tmem};
use crate::wgmma::{AccPending, WgState};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::panic::{self, AssertUnwindSafe, Location};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::Thread;

/// The target whose instruction subset a launch may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Hopper: wgmma; no tcgen05, no TMEM.
    Sm90a,
    /// Blackwell: tcgen05 and TMEM; no wgmma.
    Sm100a,
}

/// In which order eligible in-flight asynchronous operations complete when the model completes one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completion {
    /// Oldest first.
    InOrder,
    /// Newest first (among those whose ISA ordering constraints allow it).
    Reversed,
    /// A seeded random choice.
    Random,
}

/// The seeded choices of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// Seed of every choice.
    pub seed: u64,
    /// Completion order of asynchronous operations.
    pub completion: Completion,
    /// Per scheduling decision, the probability (‰) of completing one asynchronous operation even
    /// though threads could run. 0 (the default) keeps every operation in flight as long as
    /// possible, which exposes the most hazards.
    pub eager_permille: u32,
    /// After each synchronizing instruction, the probability (‰) of handing the turn to a random
    /// runnable thread (possibly the same one).
    pub switch_permille: u32,
    /// Also switch after this many model instructions of one thread without a switch (0: never).
    pub preempt_every: u32,
}

impl Default for Schedule {
    fn default() -> Self {
        Schedule {
            seed: 1,
            completion: Completion::InOrder,
            eager_permille: 0,
            switch_permille: 250,
            preempt_every: 64,
        }
    }
}

/// Where `tcgen05.alloc` places an allocation among the legal (naturally aligned, free) column
/// ranges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TmemPlacement {
    /// The highest legal base column: non-zero whenever fewer than 512 columns are requested, so
    /// that code assuming base column 0 fails.
    Highest,
    /// The lowest (what a lone CTA on an empty SM probably gets on hardware).
    Lowest,
}

/// One launch: grid and block shape (x only, as the kernels use), cluster size, shared memory, and
/// the model's choices.
#[derive(Clone, Debug)]
pub struct LaunchConfig {
    /// Instruction subset.
    pub arch: Arch,
    /// CTAs in the grid (`%nctaid.x`).
    pub grid: u32,
    /// Threads per CTA (`%ntid.x`), a multiple of 32.
    pub block: u32,
    /// CTAs per cluster along x (1: no clusters). Must divide `grid`.
    pub cluster: u32,
    /// Dynamic shared memory per CTA, bytes.
    pub dynamic_smem: u32,
    /// CTAs that share one SM's tensor memory: CTAs `k·n .. k·n+n` (not CTAs of one cluster).
    pub ctas_per_sm: u32,
    /// `.shared::cta` address of the dynamic window (non-zero, a multiple of 1024): address 0 is
    /// never valid, so a zero address or offset mistaken for an address is caught.
    pub smem_base: u32,
    /// Stack of each modelled thread.
    pub stack_size: usize,
    /// The byte every CTA's shared memory holds before anything writes it (real shared memory
    /// starts with whatever an earlier kernel left): `0xA5` by default, a finite f16 pattern;
    /// `0xFF` makes every stale f16 and e4m3 a NaN, so that a stale value reaching a result shows.
    pub smem_fill: u8,
    /// TMEM allocation policy.
    pub tmem_placement: TmemPlacement,
    /// Strict mode (on by default): besides what the PTX ISA forbids, reject values it allows but
    /// that no hardware-proven kernel uses — descriptor fields the ISA calls unused, TMEM columns
    /// placed unlike the seed's and CUTLASS's, TMEM read before anything wrote it (each rule and
    /// its source: docs/model.md §3, `model/README.md` "Strict mode"). The hardware probes turn it
    /// off for the cases that try exactly those values on a GPU.
    pub strict: bool,
    /// The seeded choices.
    pub schedule: Schedule,
    /// Registers per thread the kernel is launched with (its `.maxnreg`), or 0 when unknown. When
    /// known, each CTA holds `registers × block` of them and `setmaxnreg` moves them between its
    /// warps: an `inc` that asks for more than the CTA's free registers waits (for a `dec`).
    pub registers: u32,
    /// Global address ranges `(start, bytes)` the launch before this one writes, when this one may
    /// start before it ends (programmatic dependent launch): a TMA or bulk copy that reads them
    /// before its thread executed `griddepcontrol.wait` is a hazard. Empty: a plain launch.
    pub predecessor_writes: Vec<(u64, u64)>,
    /// The wave this launch models of a larger grid ([`launch`]): the first CTA's `%ctaid.x` and
    /// the whole grid's `%nctaid.x`; `None` for a launch modelled in one piece.
    wave: Option<(u32, u32)>,
}

impl LaunchConfig {
    /// A launch with defaults: no clusters, one CTA per SM, shared window at 0x400, seed 1.
    pub fn new(arch: Arch, grid: u32, block: u32, dynamic_smem: u32) -> Self {
        LaunchConfig {
            arch,
            grid,
            block,
            cluster: 1,
            dynamic_smem,
            ctas_per_sm: 1,
            smem_base: 0x400,
            stack_size: 1 << 20,
            smem_fill: 0xA5,
            tmem_placement: TmemPlacement::Highest,
            strict: true,
            schedule: Schedule::default(),
            registers: 0,
            predecessor_writes: Vec::new(),
            wave: None,
        }
    }

    /// The same launch with clusters of `n` CTAs.
    pub fn with_cluster(mut self, n: u32) -> Self {
        self.cluster = n;
        self
    }

    /// `%ctaid.x` of the launch's CTA 0 (non-zero in the later waves of a large grid, see [`launch`]).
    pub(crate) fn first_cta(&self) -> u32 {
        self.wave.map_or(0, |w| w.0)
    }

    /// `%nctaid.x`: the whole grid's CTAs, of which this launch may model a wave.
    pub(crate) fn grid_ctas(&self) -> u32 {
        self.wave.map_or(self.grid, |w| w.1)
    }

    /// The same launch with another schedule.
    pub fn with_schedule(mut self, s: Schedule) -> Self {
        self.schedule = s;
        self
    }

    fn validate(&self) -> Result<(), String> {
        if self.grid == 0 || self.block == 0 || self.block % 32 != 0 || self.block > 1024 {
            return Err(format!(
                "grid {} / block {}: need grid > 0 and a block of 32..=1024 threads, a multiple of 32",
                self.grid, self.block
            ));
        }
        if self.cluster == 0 || self.cluster > 16 || self.grid % self.cluster != 0 {
            return Err(format!("cluster size {} must be in 1..=16 and divide the grid {}", self.cluster, self.grid));
        }
        if self.smem_base == 0
            || self.smem_base % 1024 != 0
            || self.smem_base as u64 + self.dynamic_smem as u64 > 0x4_0000
        {
            return Err(format!(
                "shared window {:#x} + {} bytes: the base must be a non-zero multiple of 1024 and the window below 256 KiB \
                 (descriptors address 18 bits)",
                self.smem_base, self.dynamic_smem
            ));
        }
        if self.ctas_per_sm == 0 {
            return Err("ctas_per_sm must be positive".into());
        }
        Ok(())
    }
}

/// What a successful launch did.
#[derive(Clone, Debug, Default)]
pub struct RunStats {
    /// Model instructions executed (all threads).
    pub instructions: u64,
    /// Hand-overs of the turn between threads.
    pub switches: u64,
    /// Asynchronous operations completed.
    pub async_completed: u64,
    /// Most asynchronous operations in flight at once.
    pub max_in_flight: usize,
    /// Fences executed, by PTX name (they have no effect in the model; they are counted).
    pub fences: BTreeMap<&'static str, u64>,
}

/// Why a thread does not run.
#[derive(Clone, Debug)]
pub(crate) enum Block {
    /// A `try_wait` found the phase incomplete; woken when the barrier changes phase.
    Mbarrier { cta: usize, off: u32, parity: u32 },
    /// In a warp or warpgroup collective, waiting for the other participants.
    Collective { what: String },
    /// `bar.sync id`.
    NamedBarrier { id: u32, count: u32 },
    /// `barrier.cluster.wait`.
    ClusterBarrier,
    /// `wgmma.wait_group n`: more than `n` groups of the warpgroup are pending.
    WgmmaWait { wg: usize, n: u32 },
    /// `tcgen05.alloc`: the columns are not free yet.
    TmemAlloc { ncols: u32 },
    /// `setmaxnreg.inc`: the CTA's pool has fewer free registers than the warp asks for.
    Registers { want: u32, free: u64 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Status {
    Runnable,
    Blocked,
    Exited,
}

/// What orders a thread after other threads' tcgen05 operations (PTX ISA 9.0 §9.7.16.6, the
/// tcgen05 memory consistency model): a synchronisation it completed, and the threads whose
/// tcgen05 operations (or `tcgen05.commit`s) it ordered.
#[derive(Clone, Debug)]
pub(crate) struct TcOrder {
    /// The synchronisation, for reports.
    pub via: String,
    /// Contributing threads (`usize::MAX` for a `tcgen05.commit`).
    pub from: Vec<usize>,
    /// A contributing thread that had issued tcgen05 operations since its last
    /// `tcgen05.fence::before_thread_sync` when it arrived.
    pub unfenced_by: Option<usize>,
}

impl TcOrder {
    /// The two orders combined (the first unfenced contributor kept).
    pub(crate) fn merge(a: Option<TcOrder>, b: Option<TcOrder>) -> Option<TcOrder> {
        match (a, b) {
            (None, x) | (x, None) => x,
            (Some(mut a), Some(b)) => {
                a.from.extend(b.from);
                a.unfenced_by = a.unfenced_by.or(b.unfenced_by);
                Some(a)
            }
        }
    }
}

/// Which threads' shared-memory accesses a thread is ordered after (PTX ISA 9.0 §8, the memory
/// consistency model): per accessing thread, the sequence numbers of its last `st.shared` and its
/// last `ld.shared` that a release (an mbarrier arrival, `bar.sync`, `bar.warp.sync`) passed on,
/// which order them before the acquiring thread's own loads and stores (the generic proxy), and of
/// its last `st.shared` that its `fence.proxy.async` also covered, which orders it before the
/// acquirer's asynchronous operations (§9.7.13.4) — directly or through threads that learned them
/// the same way. Only threads that accessed shared memory appear.
#[derive(Clone, Debug, Default)]
pub(crate) struct Published(pub Vec<Known>);

/// One accessing thread's entry of [`Published`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Known {
    pub thread: usize,
    /// Its last store ordered for the generic proxy.
    pub generic: u32,
    /// Its last store ordered for the async proxy (0: none).
    pub fenced: u32,
    /// Its last shared-memory load ordered before the acquirer's stores (0: none).
    pub read: u32,
}

impl Published {
    pub(crate) fn add(&mut self, k: Known) {
        match self.0.iter_mut().find(|e| e.thread == k.thread) {
            Some(e) => {
                e.generic = e.generic.max(k.generic);
                e.fenced = e.fenced.max(k.fenced);
                e.read = e.read.max(k.read);
            }
            None => self.0.push(k),
        }
    }
    pub(crate) fn merge(&mut self, o: &Published) {
        for &k in &o.0 {
            self.add(k);
        }
    }
    /// Whether store `seq` of thread `t` is ordered before this thread's asynchronous operations.
    pub(crate) fn covers(&self, t: usize, seq: u32) -> bool {
        self.0.iter().any(|k| k.thread == t && k.fenced >= seq)
    }
    /// Whether store `seq` of thread `t` is ordered before this thread's own accesses.
    pub(crate) fn covers_generic(&self, t: usize, seq: u32) -> bool {
        self.0.iter().any(|k| k.thread == t && k.generic >= seq)
    }
    /// Whether shared-memory load `seq` of thread `t` is ordered before this thread's stores.
    pub(crate) fn covers_read(&self, t: usize, seq: u32) -> bool {
        self.0.iter().any(|k| k.thread == t && k.read >= seq)
    }
}

/// What thread `me` passes on when it releases: what it learned, its own loads, and its own
/// stores — all of them for the generic proxy, those up to its last `fence.proxy.async` for the
/// async proxy.
pub(crate) fn pub_contribution(w: &World, me: usize) -> Published {
    let t = &w.threads[me];
    let mut p = t.known.clone();
    if t.st_seq > 0 || t.ld_seq > 0 {
        p.add(Known { thread: me, generic: t.st_seq, fenced: t.fenced_seq, read: t.ld_seq });
    }
    p
}

/// Checks that thread `me` may access (read, or overwrite) `len` shared bytes at `off` of CTA
/// `cta` that another thread's `st.shared` last wrote: that store must be ordered before the
/// access by a release–acquire chain (a data race otherwise, PTX ISA 9.0 §8.7). A store must also
/// come after the last other thread's load of each byte ([`check_read_before`]).
pub(crate) fn check_ordered(w: &World, me: usize, cta: usize, off: u32, len: u32, what: &str) -> Result<(), String> {
    let Some(g) = &w.ctas[cta].smem.generic else { return Ok(()) };
    match first_unordered(g, off, len, me, |t, seq| w.threads[me].known.covers_generic(t, seq)) {
        None => Ok(()),
        Some((i, t)) => Err(format!(
            "{what} dyn+{i:#x}, which thread {t} (CTA {}, tid {}) wrote with st.shared, with no barrier \
             ordering that store before this access (a data race, PTX ISA 9.0 §8.7)",
            w.threads[t].cta, w.threads[t].tid
        )),
    }
}

/// Checks that thread `me` may overwrite `len` shared bytes at `off` of CTA `cta`: the last load
/// of each byte by another thread must be ordered before this store by a release–acquire chain
/// (write-after-read; a data race otherwise, PTX ISA 9.0 §8.7). Only the last reader of a byte is
/// kept, so an earlier reader's unordered load can go unreported.
pub(crate) fn check_read_before(w: &World, me: usize, cta: usize, off: u32, len: u32) -> Result<(), String> {
    let Some(r) = &w.ctas[cta].smem.last_read else { return Ok(()) };
    match first_unordered(r, off, len, me, |t, seq| w.threads[me].known.covers_read(t, seq)) {
        None => Ok(()),
        Some((i, t)) => Err(format!(
            "writes dyn+{i:#x}, which thread {t} (CTA {}, tid {}) read with ld.shared, with no barrier ordering \
             that load before this store (write-after-read: a data race, PTX ISA 9.0 §8.7)",
            w.threads[t].cta, w.threads[t].tid
        )),
    }
}

/// The first byte of `off .. off + len` whose access mark (`(thread index + 1, its sequence
/// number)`, 0: none) names a thread other than `me` whose access `ordered(thread, seq)` denies,
/// with that thread.
fn first_unordered(
    marks: &[(u32, u32)],
    off: u32,
    len: u32,
    me: usize,
    ordered: impl Fn(usize, u32) -> bool,
) -> Option<(u32, usize)> {
    (off..off + len).find_map(|i| {
        let (who, seq) = marks[i as usize];
        let t = (who as usize).checked_sub(1)?;
        (t != me && !ordered(t, seq)).then_some((i, t))
    })
}

/// A barrier that orders each of `learners` after the memory operations of all `arrivals`
/// (`bar.sync`, `bar.warp.sync`: every participant is both; `bar.arrive`: an arrival only):
/// each learner learns what every arrival passes on.
pub(crate) fn pub_exchange(w: &mut World, arrivals: &[usize], learners: &[usize]) {
    let mut published = Published::default();
    for &t in arrivals {
        published.merge(&pub_contribution(w, t));
    }
    for &t in learners {
        pub_learn(w, t, &published);
    }
}

/// Thread `me` completed an acquire that orders it after `p`.
pub(crate) fn pub_learn(w: &mut World, me: usize, p: &Published) {
    if !p.0.is_empty() {
        w.threads[me].known.merge(p);
    }
}

/// Checks that an asynchronous read of `len` shared bytes at `off` of CTA `cta`, issued by the
/// threads `by`, comes after every `st.shared` that last wrote them through a
/// `fence.proxy.async` in the writer and a release–acquire chain to each issuing thread (or, for
/// the issuer's own stores, its own fence). Bytes last written by an asynchronous copy need
/// nothing more than the existing in-flight checks.
pub(crate) fn check_published(w: &World, by: &[usize], cta: usize, off: u32, len: u32) -> Result<(), String> {
    let Some(g) = &w.ctas[cta].smem.generic else { return Ok(()) };
    for i in off..off + len {
        let (writer, seq) = g[i as usize];
        if writer == 0 {
            continue;
        }
        let t = writer as usize - 1;
        for &r in by {
            let ok = if r == t { w.threads[t].fenced_seq >= seq } else { w.threads[r].known.covers(t, seq) };
            if !ok {
                let wt = &w.threads[t];
                return Err(format!(
                    "reads dyn+{i:#x}, which thread {t} (CTA {}, tid {}) wrote with st.shared and did not pass to thread {r} \
                     through fence.proxy.async and a barrier (a generic-proxy write reaches the async proxy only \
                     so, PTX ISA 9.0 §9.7.13.4)",
                    wt.cta, wt.tid
                ));
            }
        }
    }
    Ok(())
}

/// A modelled thread.
pub(crate) struct Th {
    pub cta: usize,
    pub tid: u32,
    pub status: Status,
    pub block: Option<Block>,
    pub site: &'static Location<'static>,
    pub op: &'static str,
    /// The result of a collective, set by whoever completed it.
    pub coll_out: Option<Vec<u32>>,
    pub since_switch: u32,
    /// `wgmma.fence` executed since the last `wgmma.wait_group` (PTX §9.7.15.7.1).
    pub wgmma_fenced: bool,
    /// In-flight wgmma accumulators of this thread, by the address of the register array.
    pub acc: Vec<AccPending>,
    /// The cluster-barrier phase this thread has arrived on and not yet waited for.
    pub cluster_arrived: Option<u64>,
    /// This thread's register budget (`LaunchConfig::registers`, then what `setmaxnreg` set).
    pub registers: u32,
    /// The thread has issued tcgen05 operations.
    pub tc_ops: bool,
    /// ... some of them since its last `tcgen05.fence::before_thread_sync`.
    pub tc_unfenced: bool,
    /// A synchronisation ordered it after other threads' tcgen05 operations, and it has not
    /// executed `tcgen05.fence::after_thread_sync` since: its next tcgen05 operation would be
    /// unordered with theirs.
    pub tc_after: Option<TcOrder>,
    /// The thread has executed `griddepcontrol.wait`.
    pub grid_waited: bool,
    /// Its `st.shared` count, and the count at its last `fence.proxy.async` ([`Published`]).
    pub st_seq: u32,
    pub fenced_seq: u32,
    /// Its `ld.shared` count ([`Published`]).
    pub ld_seq: u32,
    /// Other threads' shared-memory accesses it is ordered after.
    pub known: Published,
    /// The tensor maps it has acquired (`fence.proxy.tensormap::generic.acquire`), by address:
    /// its tensor copies may use only these.
    pub acquired_maps: Vec<u64>,
}

/// A CTA.
pub(crate) struct Cta {
    pub smem: Smem,
    pub barriers: BTreeMap<u32, Mbar>,
    pub named: Vec<NamedBar>,
    pub live_threads: u32,
    pub exited: bool,
    pub sm: usize,
    pub cluster: usize,
    pub rank: u32,
    /// TMEM allocations `(column, ncols)` of this CTA.
    pub tmem_allocs: Vec<(u32, u32)>,
    pub tmem_relinquished: bool,
    pub tmem_last_ncols: Option<u32>,
    /// Registers of the CTA's pool no thread holds (`setmaxnreg.dec` returned them).
    pub free_registers: u64,
}

/// The state of a launch. One mutex guards it; only the thread holding the turn touches it.
pub(crate) struct World {
    pub cfg: LaunchConfig,
    pub rng: Rng,
    pub threads: Vec<Th>,
    pub ctas: Vec<Cta>,
    /// One meeting slot per warp (`cta * warps + warp`).
    pub warps: Vec<Option<Meeting>>,
    /// One per warpgroup (`cta * warpgroups + wg`).
    pub wgs: Vec<WgState>,
    pub clusters: Vec<ClusterBar>,
    pub sms: Vec<Tmem>,
    pub runq: Vec<usize>,
    runq_pos: Vec<usize>,
    pub ops: Vec<AsyncOp>,
    pub next_op: u32,
    pub pending_allocs: Vec<PendingAlloc>,
    pub current: usize,
    pub error: Option<ModelError>,
    pub stats: RunStats,
    pub clock: u64,
    live: usize,
}

const NOT_QUEUED: usize = usize::MAX;

impl World {
    fn new(cfg: &LaunchConfig) -> Self {
        let warps_per_cta = (cfg.block / 32) as usize;
        let wgs_per_cta = cfg.block.div_ceil(128) as usize;
        let n = (cfg.grid * cfg.block) as usize;
        let here = Location::caller();
        let threads = (0..n)
            .map(|g| Th {
                cta: g / cfg.block as usize,
                tid: (g % cfg.block as usize) as u32,
                status: Status::Runnable,
                block: None,
                site: here,
                op: "(not started)",
                coll_out: None,
                since_switch: 0,
                wgmma_fenced: false,
                acc: Vec::new(),
                cluster_arrived: None,
                registers: cfg.registers,
                tc_ops: false,
                tc_unfenced: false,
                tc_after: None,
                grid_waited: false,
                st_seq: 0,
                fenced_seq: 0,
                ld_seq: 0,
                known: Published::default(),
                acquired_maps: Vec::new(),
            })
            .collect();
        let ctas = (0..cfg.grid as usize)
            .map(|c| Cta {
                smem: Smem::new(cfg.dynamic_smem, cfg.smem_fill),
                barriers: BTreeMap::new(),
                named: (0..16).map(|_| NamedBar::default()).collect(),
                live_threads: cfg.block,
                exited: false,
                sm: c / cfg.ctas_per_sm as usize,
                cluster: c / cfg.cluster as usize,
                rank: (c % cfg.cluster as usize) as u32,
                tmem_allocs: Vec::new(),
                tmem_relinquished: false,
                tmem_last_ncols: None,
                free_registers: 0,
            })
            .collect();
        let nsms = (cfg.grid as usize).div_ceil(cfg.ctas_per_sm as usize);
        World {
            cfg: cfg.clone(),
            rng: Rng::new(cfg.schedule.seed),
            threads,
            ctas,
            warps: (0..cfg.grid as usize * warps_per_cta).map(|_| None).collect(),
            wgs: (0..cfg.grid as usize * wgs_per_cta).map(|_| WgState::default()).collect(),
            clusters: (0..(cfg.grid / cfg.cluster) as usize).map(|_| ClusterBar::default()).collect(),
            sms: (0..nsms).map(|_| Tmem::new()).collect(),
            runq: (0..n).collect(),
            runq_pos: (0..n).collect(),
            ops: Vec::new(),
            next_op: 1,
            pending_allocs: Vec::new(),
            current: usize::MAX,
            error: None,
            stats: RunStats::default(),
            clock: 0,
            live: n,
        }
    }

    // ----- thread queue -----

    fn runq_remove(&mut self, t: usize) {
        let p = self.runq_pos[t];
        if p != NOT_QUEUED {
            let last = *self.runq.last().expect("queued");
            self.runq.swap_remove(p);
            if last != t {
                self.runq_pos[last] = p;
            }
            self.runq_pos[t] = NOT_QUEUED;
        }
    }

    /// Makes a blocked thread runnable.
    pub(crate) fn wake(&mut self, t: usize) {
        if self.threads[t].status == Status::Blocked {
            self.threads[t].status = Status::Runnable;
            self.threads[t].block = None;
            self.runq_pos[t] = self.runq.len();
            self.runq.push(t);
        }
    }

    /// Blocks thread `t` (registering it where its wake-up will come from).
    pub(crate) fn block(&mut self, t: usize, b: Block) {
        match &b {
            Block::Mbarrier { cta, off, .. } => {
                if let Some(bar) = self.ctas[*cta].barriers.get_mut(off) {
                    bar.waiters.push(t);
                }
            }
            Block::WgmmaWait { wg, .. } => self.wgs[*wg].waiters.push(t),
            _ => {}
        }
        self.threads[t].status = Status::Blocked;
        self.threads[t].block = Some(b);
        self.runq_remove(t);
    }

    // ----- geometry -----

    pub(crate) fn warps_per_cta(&self) -> usize {
        (self.cfg.block / 32) as usize
    }

    /// Global index of the warp of thread `t`.
    pub(crate) fn warp_of(&self, t: usize) -> usize {
        self.threads[t].cta * self.warps_per_cta() + (self.threads[t].tid / 32) as usize
    }

    /// Global index of the warpgroup of thread `t`.
    pub(crate) fn wg_of(&self, t: usize) -> usize {
        self.threads[t].cta * self.cfg.block.div_ceil(128) as usize + (self.threads[t].tid / 128) as usize
    }

    /// Global thread index of lane `lane` of global warp `w`.
    pub(crate) fn thread_of_warp_lane(&self, w: usize, lane: u32) -> usize {
        let wpc = self.warps_per_cta();
        (w / wpc) * self.cfg.block as usize + (w % wpc) * 32 + lane as usize
    }

    /// The CTA of rank `rank` in the cluster of CTA `cta`.
    pub(crate) fn cta_of_rank(&self, cta: usize, rank: u32) -> Option<usize> {
        if rank >= self.cfg.cluster {
            return None;
        }
        Some(self.ctas[cta].cluster * self.cfg.cluster as usize + rank as usize)
    }

    /// `"thread 37 (CTA 1, warp 1, lane 5) at src/x.rs:10"`.
    pub(crate) fn who(&self, t: usize) -> String {
        let th = &self.threads[t];
        format!(
            "thread {} (CTA {}, warp {}, lane {}) at {}:{}",
            th.tid,
            th.cta + self.cfg.first_cta() as usize,
            th.tid / 32,
            th.tid % 32,
            th.site.file(),
            th.site.line()
        )
    }

    // ----- errors -----

    /// A [`ModelError`] carrying the current machine state.
    pub(crate) fn err(&self, kind: ErrorKind, message: impl Into<String>) -> ModelError {
        ModelError { kind, message: message.into(), report: self.report() }
    }

    /// Like [`Self::err`], prefixed with the executing thread and its instruction.
    pub(crate) fn err_at(&self, t: usize, kind: ErrorKind, message: impl AsRef<str>) -> ModelError {
        let th = &self.threads[t];
        self.err(kind, format!("`{}` by {}: {}", th.op, self.who(t), message.as_ref()))
    }

    // ----- scheduling -----

    /// Chooses the thread to run next (`me`, if given, is the thread choosing; `switch` asks for a
    /// random choice even if `me` could continue). Completes asynchronous operations when nothing
    /// can run. `Ok(None)`: every thread has exited.
    fn pick_next(&mut self, me: Option<usize>, switch: bool) -> Result<Option<usize>, ModelError> {
        loop {
            crate::tcgen05::retry_pending_allocs(self)?;
            if !self.ops.is_empty() && self.rng.permille(self.cfg.schedule.eager_permille) {
                self.complete_one()?;
                crate::tcgen05::retry_pending_allocs(self)?;
            }
            if !self.runq.is_empty() {
                if let Some(me) = me {
                    if !switch && self.runq_pos[me] != NOT_QUEUED {
                        return Ok(Some(me));
                    }
                }
                let i = self.rng.below(self.runq.len());
                return Ok(Some(self.runq[i]));
            }
            if !self.ops.is_empty() {
                self.complete_one()?;
                continue;
            }
            if self.live == 0 {
                return Ok(None);
            }
            return Err(self.err(
                ErrorKind::Deadlock,
                "every live thread waits and no asynchronous operation is in flight (see where each warp waits below)",
            ));
        }
    }

    /// Completes one eligible in-flight asynchronous operation, chosen by the completion policy.
    pub(crate) fn complete_one(&mut self) -> Result<(), ModelError> {
        let eligible: Vec<usize> = (0..self.ops.len())
            .filter(|&i| self.ops[i].deps.iter().all(|d| !self.ops.iter().any(|o| o.id == *d)))
            .collect();
        if eligible.is_empty() {
            return Err(self.err(ErrorKind::Unimplemented, "internal: in-flight operations wait on each other"));
        }
        let pick = match self.cfg.schedule.completion {
            Completion::InOrder => eligible[0],
            Completion::Reversed => *eligible.last().expect("non-empty"),
            Completion::Random => eligible[self.rng.below(eligible.len())],
        };
        let op = self.ops.remove(pick);
        self.stats.async_completed += 1;
        op.complete(self)
    }

    /// Registers a new asynchronous operation (its hazard marks are already set by the caller).
    pub(crate) fn push_op(&mut self, op: AsyncOp) {
        self.ops.push(op);
        self.stats.max_in_flight = self.stats.max_in_flight.max(self.ops.len());
    }

    /// A fresh operation id.
    pub(crate) fn op_id(&mut self) -> u32 {
        let id = self.next_op;
        self.next_op += 1;
        id
    }

    fn thread_exited(&mut self, t: usize) -> Result<(), ModelError> {
        if let Some(m) = &self.warps[self.warp_of(t)] {
            let what = m.describe();
            return Err(self.err_at(
                t,
                ErrorKind::Divergence,
                format!("exited while lanes of its warp wait in `{what}`"),
            ));
        }
        self.threads[t].status = Status::Exited;
        self.threads[t].op = "(exited)";
        self.runq_remove(t);
        self.live -= 1;
        let cta = self.threads[t].cta;
        self.ctas[cta].live_threads -= 1;
        if self.ctas[cta].live_threads == 0 {
            self.ctas[cta].exited = true;
            if let Some((col, n)) = self.ctas[cta].tmem_allocs.first().copied() {
                return Err(self.err(
                    ErrorKind::ResourceLeak,
                    format!(
                        "CTA {cta} exited with TMEM columns {col}..{} still allocated; everything allocated must be \
                         deallocated before the kernel exits (PTX ISA 9.0 §9.7.16.7.1)",
                        col + n
                    ),
                ));
            }
            if let Some((id, nb)) = self.ctas[cta].named.iter().enumerate().find(|(_, nb)| nb.arrivals() > 0) {
                return Err(self.err(
                    ErrorKind::ResourceLeak,
                    format!(
                        "CTA {cta} exited with named barrier {id} in an unfinished phase ({} of {} threads arrived): \
                         a `bar.arrive` without the arrivals it was counted with",
                        nb.arrivals(),
                        nb.count
                    ),
                ));
            }
            if let Some(op) = self.ops.iter().find(|o| o.touches_cta(cta)) {
                return Err(self.err(
                    ErrorKind::ResourceLeak,
                    format!(
                        "CTA {cta} exited while asynchronous operation #{} ({}) that uses its memory was in flight",
                        op.id, op.what
                    ),
                ));
            }
        }
        Ok(())
    }

    // ----- report -----

    /// Every barrier, warp and in-flight operation, for error messages.
    pub(crate) fn report(&self) -> String {
        let mut s = String::new();
        let base = self.cfg.smem_base;
        for (c, cta) in self.ctas.iter().enumerate() {
            let _ = writeln!(
                s,
                "CTA {c} (cluster {}, rank {}){}:",
                cta.cluster,
                cta.rank,
                if cta.exited { " exited" } else { "" }
            );
            for (off, b) in &cta.barriers {
                let _ = writeln!(
                    s,
                    "  mbarrier {:#x} (dyn+{:#x}): phase {} (parity {}), pending arrivals {}/{}, tx-count {}{}",
                    base + off,
                    off,
                    b.phase,
                    b.phase & 1,
                    b.pending,
                    b.expected,
                    b.tx,
                    if b.waiters.is_empty() { String::new() } else { format!(", {} waiting", b.waiters.len()) }
                );
            }
            for (id, nb) in cta.named.iter().enumerate() {
                if nb.arrivals() > 0 {
                    let _ = writeln!(
                        s,
                        "  bar {id}: {} of {} threads arrived ({} waiting)",
                        nb.arrivals(),
                        nb.count,
                        nb.arrived.len()
                    );
                }
            }
            for (col, n) in &cta.tmem_allocs {
                let _ = writeln!(s, "  TMEM columns {col}..{} allocated", col + n);
            }
            // Warps: lanes grouped by what they do.
            let wpc = self.warps_per_cta();
            for w in 0..wpc {
                let mut groups: Vec<(String, Vec<u32>)> = Vec::new();
                for lane in 0..32 {
                    let t = c * self.cfg.block as usize + w * 32 + lane as usize;
                    let th = &self.threads[t];
                    let what = match th.status {
                        Status::Exited => "exited".to_string(),
                        Status::Runnable => {
                            format!("runnable after `{}` at {}:{}", th.op, th.site.file(), th.site.line())
                        }
                        Status::Blocked => format!(
                            "waits in `{}` ({}) at {}:{}",
                            th.op,
                            describe_block(th.block.as_ref(), base),
                            th.site.file(),
                            th.site.line()
                        ),
                    };
                    match groups.iter_mut().find(|(g, _)| *g == what) {
                        Some((_, lanes)) => lanes.push(lane),
                        None => groups.push((what, vec![lane])),
                    }
                }
                if groups.len() == 1 && groups[0].0 == "exited" {
                    continue;
                }
                for (what, lanes) in groups {
                    let _ = writeln!(s, "  warp {w} lanes {}: {what}", lane_ranges(&lanes));
                }
            }
        }
        for (i, cl) in self.clusters.iter().enumerate() {
            if cl.arrived > 0 {
                let _ = writeln!(s, "cluster {i}: barrier.cluster phase {}, {} threads arrived", cl.phase, cl.arrived);
            }
        }
        if !self.ops.is_empty() {
            let _ = writeln!(s, "in flight:");
            for op in &self.ops {
                let _ = writeln!(
                    s,
                    "  #{} {} (issued by {} at {}:{}){}",
                    op.id,
                    op.what,
                    self.threads[op.issuer].tid,
                    op.site.file(),
                    op.site.line(),
                    if op.deps.is_empty() { String::new() } else { format!(", after #{:?}", op.deps) }
                );
            }
        }
        s
    }
}

fn describe_block(b: Option<&Block>, base: u32) -> String {
    match b {
        None => "?".into(),
        Some(Block::Mbarrier { cta, off, parity }) => {
            format!("mbarrier {:#x} of CTA {cta}, phase parity {parity} not complete", base + off)
        }
        Some(Block::Collective { what }) => format!("collective `{what}`, other lanes missing"),
        Some(Block::NamedBarrier { id, count }) => format!("bar.sync {id}, {count}"),
        Some(Block::ClusterBarrier) => "barrier.cluster.wait".into(),
        Some(Block::WgmmaWait { n, .. }) => format!("wgmma.wait_group {n}"),
        Some(Block::TmemAlloc { ncols }) => format!("tcgen05.alloc of {ncols} columns"),
        Some(Block::Registers { want, free }) => {
            format!("setmaxnreg.inc to {want} registers per thread: the CTA's pool has {free} free")
        }
    }
}

fn lane_ranges(lanes: &[u32]) -> String {
    let mut out = Vec::new();
    let mut i = 0;
    while i < lanes.len() {
        let start = lanes[i];
        let mut end = start;
        while i + 1 < lanes.len() && lanes[i + 1] == end + 1 {
            i += 1;
            end = lanes[i];
        }
        out.push(if start == end { format!("{start}") } else { format!("{start}-{end}") });
        i += 1;
    }
    out.join(",")
}

// ----- the per-thread side -----

pub(crate) struct Shared {
    world: Mutex<World>,
    handles: OnceLock<Vec<Thread>>,
}

/// Unwinding payload of a thread stopped because the launch failed.
struct Aborted;

thread_local! {
    static CTX: RefCell<Option<(Arc<Shared>, usize)>> = const { RefCell::new(None) };
}

fn lock(shared: &Shared) -> MutexGuard<'_, World> {
    shared.world.lock().unwrap_or_else(|e| e.into_inner())
}

fn current() -> (Arc<Shared>, usize) {
    CTX.with(|c| c.borrow().clone()).unwrap_or_else(|| {
        panic!("a nvfp4-gemm-model instruction was executed outside a model launch (call it from the kernel closure)")
    })
}

fn wake_all(shared: &Shared) {
    if let Some(h) = shared.handles.get() {
        for t in h {
            t.unpark();
        }
    }
}

/// Records `e` (the first error wins), stops every thread, and unwinds this one.
fn fail(mut g: MutexGuard<'_, World>, shared: &Shared, e: ModelError) -> ! {
    if g.error.is_none() {
        g.error = Some(e);
    }
    drop(g);
    wake_all(shared);
    panic::resume_unwind(Box::new(Aborted))
}

/// Waits until it is `me`'s turn.
fn wait_turn(shared: &Shared, me: usize) -> MutexGuard<'_, World> {
    loop {
        let g = lock(shared);
        if g.error.is_some() {
            drop(g);
            panic::resume_unwind(Box::new(Aborted));
        }
        if g.current == me {
            return g;
        }
        drop(g);
        std::thread::park();
    }
}

/// Hands the turn to whoever the scheduler picks (maybe `me` again) and returns when it is `me`'s
/// turn again.
fn reschedule<'a>(mut g: MutexGuard<'a, World>, shared: &'a Shared, me: usize, switch: bool) -> MutexGuard<'a, World> {
    match g.pick_next(Some(me), switch) {
        Err(e) => fail(g, shared, e),
        Ok(None) => unreachable!("the scheduling thread is live"),
        Ok(Some(next)) if next == me => {
            g.threads[me].since_switch = 0;
            g
        }
        Ok(Some(next)) => {
            g.current = next;
            g.stats.switches += 1;
            g.threads[me].since_switch = 0;
            let h = shared.handles.get().expect("handles set before the start")[next].clone();
            drop(g);
            h.unpark();
            wait_turn(shared, me)
        }
    }
}

/// The outcome of one attempt at an instruction.
pub(crate) enum Flow<T> {
    /// Finished with this value.
    Done(T),
    /// Must wait: block the thread; the instruction is attempted again when it is woken.
    Block(Block),
}

/// Runs one model instruction for the calling thread: `f` is attempted (again after every
/// wake-up while it blocks). `sync` marks a synchronizing instruction (a scheduling point).
pub(crate) fn instr<T>(
    name: &'static str,
    site: &'static Location<'static>,
    sync: bool,
    mut f: impl FnMut(&mut World, usize) -> Result<Flow<T>, ModelError>,
) -> T {
    let (shared, me) = current();
    let mut g = lock(&shared);
    if g.error.is_some() {
        drop(g);
        panic::resume_unwind(Box::new(Aborted));
    }
    g.threads[me].site = site;
    g.threads[me].op = name;
    g.threads[me].since_switch += 1;
    g.clock += 1;
    g.stats.instructions += 1;
    loop {
        match f(&mut g, me) {
            Ok(Flow::Done(v)) => {
                let pe = g.cfg.schedule.preempt_every;
                let preempt = pe > 0 && g.threads[me].since_switch >= pe;
                let sp = g.cfg.schedule.switch_permille;
                if preempt || (sync && g.rng.permille(sp)) {
                    drop(reschedule(g, &shared, me, true));
                }
                return v;
            }
            Ok(Flow::Block(b)) => {
                g.block(me, b);
                g = reschedule(g, &shared, me, false);
            }
            Err(e) => fail(g, &shared, e),
        }
    }
}

/// Runs `f` on the world for the calling thread without counting an instruction (queries).
pub(crate) fn query<T>(f: impl FnOnce(&World, usize) -> T) -> T {
    let (shared, me) = current();
    let g = lock(&shared);
    f(&g, me)
}

/// Records an error raised by the calling thread (e.g. `trap`) and unwinds it.
pub(crate) fn raise(kind: ErrorKind, site: &'static Location<'static>, name: &'static str, msg: String) -> ! {
    let (shared, me) = current();
    let mut g = lock(&shared);
    g.threads[me].site = site;
    g.threads[me].op = name;
    let e = g.err_at(me, kind, msg);
    fail(g, &shared, e)
}

fn thread_exit(shared: &Shared, me: usize) {
    let mut g = lock(shared);
    if g.error.is_some() {
        return;
    }
    if let Err(e) = g.thread_exited(me) {
        g.error = Some(e);
        drop(g);
        wake_all(shared);
        return;
    }
    match g.pick_next(None, false) {
        Ok(Some(next)) => {
            g.current = next;
            g.stats.switches += 1;
            let h = shared.handles.get().expect("handles")[next].clone();
            drop(g);
            h.unpark();
        }
        Ok(None) => {}
        Err(e) => {
            g.error = Some(e);
            drop(g);
            wake_all(shared);
        }
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".into()
    }
}

/// Runs `kernel` once per thread of the grid described by `cfg`, under the model.
///
/// `kernel` is the body of every thread: it reads its coordinates from [`crate::sreg`] and touches
/// the device only through this crate's instructions; global memory is host memory (plain
/// pointers). Returns what the run did, or the first error with the machine state at that moment.
///
/// A kernel that unwinds through an `extern "C"` function aborts the process: the modelled entry
/// point must be a Rust (or `"C-unwind"`) function, because a failing launch stops every thread by
/// unwinding it.
pub fn launch<F: Fn() + Sync>(cfg: &LaunchConfig, kernel: F) -> Result<RunStats, ModelError> {
    if let Err(msg) = cfg.validate() {
        return Err(ModelError {
            kind: ErrorKind::InvalidOperand,
            message: format!("launch configuration: {msg}"),
            report: String::new(),
        });
    }
    // Each modelled thread is an OS thread (a stack, its guard and Rust's signal stack: about four
    // memory mappings), and Linux's default `vm.max_map_count` (65,530) stops a process near
    // 16,000 of them. A larger grid without clusters runs in waves of whole SMs' worth of CTAs,
    // one after the other, as a GPU runs a grid larger than it holds at once: CTAs that would
    // wait for a CTA of a later wave deadlock here as they could on hardware.
    let ctas_per_wave = (MAX_WAVE_THREADS / cfg.block) / cfg.ctas_per_sm * cfg.ctas_per_sm;
    if cfg.cluster == 1 && cfg.grid > ctas_per_wave && ctas_per_wave > 0 {
        let mut total = RunStats::default();
        let mut first = 0;
        while first < cfg.grid {
            let mut wave = cfg.clone();
            wave.grid = ctas_per_wave.min(cfg.grid - first);
            wave.wave = Some((first, cfg.grid));
            let s = launch_wave(&wave, &kernel)?;
            total.instructions += s.instructions;
            total.switches += s.switches;
            total.async_completed += s.async_completed;
            total.max_in_flight = total.max_in_flight.max(s.max_in_flight);
            for (k, v) in s.fences {
                *total.fences.entry(k).or_default() += v;
            }
            first += wave.grid;
        }
        return Ok(total);
    }
    launch_wave(cfg, &kernel)
}

/// Most modelled threads (OS threads) one wave of a launch may have (see [`launch`]).
const MAX_WAVE_THREADS: u32 = 12 * 1024;

/// [`launch`] of `cfg.grid` CTAs at once (all of them, or one wave of a larger grid).
fn launch_wave<F: Fn() + Sync>(cfg: &LaunchConfig, kernel: &F) -> Result<RunStats, ModelError> {
    let shared = Arc::new(Shared { world: Mutex::new(World::new(cfg)), handles: OnceLock::new() });
    let n = (cfg.grid * cfg.block) as usize;
    std::thread::scope(|scope| {
        let mut joins = Vec::with_capacity(n);
        for me in 0..n {
            let shared = shared.clone();
            let j = std::thread::Builder::new()
                .name(format!("model-t{me}"))
                .stack_size(cfg.stack_size)
                .spawn_scoped(scope, move || {
                    CTX.with(|c| *c.borrow_mut() = Some((shared.clone(), me)));
                    let r = panic::catch_unwind(AssertUnwindSafe(|| {
                        drop(wait_turn(&shared, me));
                        kernel();
                    }));
                    match r {
                        Ok(()) => thread_exit(&shared, me),
                        Err(p) if p.is::<Aborted>() => {}
                        Err(p) => {
                            let mut g = lock(&shared);
                            if g.error.is_none() {
                                let msg = format!("panicked: {}", panic_message(&*p));
                                let e = g.err_at(me, ErrorKind::Panic, msg);
                                g.error = Some(e);
                            }
                            drop(g);
                            wake_all(&shared);
                        }
                    }
                    CTX.with(|c| *c.borrow_mut() = None);
                })
                .expect("spawning a model thread");
            joins.push(j);
        }
        let handles: Vec<Thread> = joins.iter().map(|j| j.thread().clone()).collect();
        let _ = shared.handles.set(handles);
        {
            let mut g = lock(&shared);
            let first = g.rng.below(n);
            g.current = first;
        }
        wake_all(&shared);
        for j in joins {
            let _ = j.join();
        }
    });
    let g = lock(&shared);
    match &g.error {
        Some(e) => Err(e.clone()),
        None => Ok(g.stats.clone()),
    }
}

/// What thread `me` contributes to a synchronisation it arrives on (`via`): the order of its
/// tcgen05 operations, if it issued any.
pub(crate) fn tc_contribution(w: &World, me: usize, via: &str) -> Option<TcOrder> {
    let t = &w.threads[me];
    t.tc_ops.then(|| TcOrder {
        via: via.to_string(),
        from: vec![me],
        unfenced_by: if t.tc_unfenced { Some(me) } else { None },
    })
}

/// Thread `me` completed a synchronisation that orders it after `order`. Contributions of its own
/// warp do not count: the warp-wide tcgen05 instructions (`alloc`, `dealloc`, `ld`) are the warp's,
/// ordered by its program order.
pub(crate) fn tc_ordered_after(w: &mut World, me: usize, order: Option<TcOrder>) {
    if let Some(mut o) = order {
        let same_warp = |t: usize| {
            t != usize::MAX && w.threads[t].cta == w.threads[me].cta && w.threads[t].tid / 32 == w.threads[me].tid / 32
        };
        o.from.retain(|&t| !same_warp(t));
        if o.unfenced_by.is_some_and(same_warp) {
            o.unfenced_by = o.from.iter().copied().find(|&t| t != usize::MAX && w.threads[t].tc_unfenced);
        }
        if !o.from.is_empty() {
            let old = w.threads[me].tc_after.take();
            w.threads[me].tc_after = TcOrder::merge(old, Some(o));
        }
    }
}

/// Thread `me` issues tcgen05 operation `what`: an error when a synchronisation ordered it after
/// other threads' tcgen05 operations without the fences that make that order hold
/// (`tcgen05.fence::before_thread_sync` in the other thread before it arrived,
/// `tcgen05.fence::after_thread_sync` here after the wait; PTX ISA 9.0 §9.7.16.6).
pub(crate) fn tc_issue(w: &mut World, me: usize, what: &str) -> Result<(), ModelError> {
    if let Some(o) = w.threads[me].tc_after.clone() {
        let who = |t: usize| if t == usize::MAX { "a tcgen05.commit".to_string() } else { format!("thread {t}") };
        let mut from: Vec<usize> = o.from.clone();
        from.sort_unstable();
        from.dedup();
        let shown: Vec<String> = from.iter().take(3).map(|&t| who(t)).collect();
        let from = if from.len() > 3 {
            vec![format!("{} and {} more threads", shown.join(", "), from.len() - 3)]
        } else {
            shown
        };
        let msg = match o.unfenced_by {
            Some(t) => format!(
                "{what} is ordered after {}'s tcgen05 operations only through {}, and that thread did not execute \
                 tcgen05.fence::before_thread_sync between them and its arrival",
                who(t),
                o.via
            ),
            None => format!(
                "{what} follows {} (which orders it after tcgen05 operations of {}) without \
                 tcgen05.fence::after_thread_sync in between",
                o.via,
                from.join(", ")
            ),
        };
        return Err(w.err_at(me, ErrorKind::Hazard, msg));
    }
    w.threads[me].tc_ops = true;
    w.threads[me].tc_unfenced = true;
    Ok(())
}

/// Thread `me` reads global bytes `lo .. hi` with an asynchronous copy (`what`): a hazard when the
/// launch may overlap its predecessor (`LaunchConfig::predecessor_writes`), the range meets what
/// the predecessor writes, and the thread has not executed `griddepcontrol.wait`.
pub(crate) fn check_predecessor_read(w: &World, me: usize, lo: u64, hi: u64, what: &str) -> Result<(), ModelError> {
    if w.threads[me].grid_waited {
        return Ok(());
    }
    match w.cfg.predecessor_writes.iter().find(|&&(s, n)| lo < s + n && s < hi) {
        Some(&(s, n)) => Err(w.err_at(
            me,
            ErrorKind::Hazard,
            format!(
                "{what} reads global {lo:#x}..{hi:#x}, which the previous launch writes ({s:#x}..{:#x}), before \
                 this thread executed griddepcontrol.wait (the launch may start early)",
                s + n
            ),
        )),
        None => Ok(()),
    }
}
