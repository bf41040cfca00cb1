//! mbarrier objects (PTX ISA 9.0 §9.7.13.15).
//!
//! State (§9.7.13.15.2): current phase, pending arrivals, expected arrivals, tx-count. The phase
//! completes when the pending arrivals and the tx-count are both zero (§9.7.13.15.6); then the
//! phase advances and the pending count is reset to the expected count. expect-tx raises the
//! tx-count, complete-tx (from asynchronous copies) lowers it (§9.7.13.15.5.1/.2): it may go
//! negative when bytes land before they were announced. `try_wait.parity p` is true when the phase
//! of parity `p` — the current one or the one before (§9.7.13.15.16) — has completed, i.e. when the
//! current phase's parity differs from `p`; a fresh barrier passes parity 1 at once.
//!
//! The model also enforces: the object is initialized before use and touched only by mbarrier
//! instructions; an arrival never exceeds the pending count; the tx-count stays within
//! ±(2^20 − 1) (§9.7.13.15.2); asynchronous operations and other CTAs use a barrier only after
//! the initializing thread's `fence.mbarrier_init` (§9.7.13.4, the fence that makes
//! `mbarrier.init` visible to the async proxy and the cluster).

use crate::error::{ErrorKind, ModelError};
use crate::exec::{
    instr, pub_contribution, pub_learn, tc_contribution, tc_ordered_after, Block, Flow, Published, TcOrder, World,
};
use crate::smem::{check_thread_write, cluster_target, cta_offset};
use std::panic::Location;

const MAX_COUNT: i64 = (1 << 20) - 1;

/// One mbarrier object.
pub(crate) struct Mbar {
    pub expected: u32,
    pub pending: u32,
    pub tx: i64,
    pub phase: u64,
    pub waiters: Vec<usize>,
    /// The initializing thread has executed `fence.mbarrier_init` since the init.
    pub fenced: bool,
    pub init_by: usize,
    /// tcgen05 order carried by the arrivals of the current phase, and of the last completed
    /// phase of each parity (see `exec::TcOrder`).
    pub tc_open: Option<TcOrder>,
    pub tc_done: [Option<TcOrder>; 2],
    /// Published shared-memory stores carried by the arrivals of the current phase, and of the
    /// last completed phase of each parity (`exec::Published`).
    pub pub_open: Published,
    pub pub_done: [Published; 2],
}

fn get(w: &mut World, cta: usize, off: u32) -> Result<&mut Mbar, String> {
    let base = w.cfg.smem_base;
    if w.ctas[cta].exited {
        return Err(format!("the mbarrier at {:#x} belongs to CTA {cta}, which has exited", base + off));
    }
    w.ctas[cta]
        .barriers
        .get_mut(&off)
        .ok_or_else(|| format!("no mbarrier was initialized at {:#x} in CTA {cta}", base + off))
}

fn maybe_complete(w: &mut World, cta: usize, off: u32) {
    let b = w.ctas[cta].barriers.get_mut(&off).expect("exists");
    if b.pending == 0 && b.tx == 0 {
        b.tc_done[(b.phase & 1) as usize] = b.tc_open.take();
        b.pub_done[(b.phase & 1) as usize] = std::mem::take(&mut b.pub_open);
        b.phase += 1;
        b.pending = b.expected;
        let waiters = std::mem::take(&mut b.waiters);
        for t in waiters {
            w.wake(t);
        }
    }
}

/// Adds `order` to what the current phase of the barrier carries (before the arrival that may
/// complete it).
pub(crate) fn tc_add(w: &mut World, cta: usize, off: u32, order: Option<TcOrder>) {
    if let Some(b) = w.ctas[cta].barriers.get_mut(&off) {
        let old = b.tc_open.take();
        b.tc_open = TcOrder::merge(old, order);
    }
}

/// A thread's arrival: its tcgen05 order goes into the phase.
fn tc_arrive(w: &mut World, me: usize, cta: usize, off: u32) {
    let via = format!("mbarrier {:#x} of CTA {cta}", w.cfg.smem_base + off);
    let order = tc_contribution(w, me, &via);
    tc_add(w, cta, off, order);
    // The arrival releases the thread's published shared-memory stores too.
    let published = pub_contribution(w, me);
    if let Some(b) = w.ctas[cta].barriers.get_mut(&off) {
        b.pub_open.merge(&published);
    }
}

/// An arrive-on operation with count `count` (§9.7.13.15.7).
pub(crate) fn arrive_on(w: &mut World, cta: usize, off: u32, count: u32) -> Result<(), String> {
    let base = w.cfg.smem_base;
    let b = get(w, cta, off)?;
    if count > b.pending {
        return Err(format!(
            "arrival on mbarrier {:#x} of CTA {cta} exceeds the pending count ({} of {} left in phase {})",
            base + off,
            b.pending,
            b.expected,
            b.phase
        ));
    }
    b.pending -= count;
    maybe_complete(w, cta, off);
    Ok(())
}

fn tx_add(w: &mut World, cta: usize, off: u32, delta: i64) -> Result<(), String> {
    let base = w.cfg.smem_base;
    let b = get(w, cta, off)?;
    let tx = b.tx + delta;
    if tx.abs() > MAX_COUNT {
        return Err(format!("tx-count of mbarrier {:#x} would be {tx}, outside ±(2^20-1)", base + off));
    }
    b.tx = tx;
    maybe_complete(w, cta, off);
    Ok(())
}

/// expect-tx (§9.7.13.15.5.1).
pub(crate) fn expect_tx(w: &mut World, cta: usize, off: u32, bytes: u32) -> Result<(), String> {
    tx_add(w, cta, off, bytes as i64)
}

/// complete-tx (§9.7.13.15.5.2), from an asynchronous operation.
pub(crate) fn complete_tx(w: &mut World, cta: usize, off: u32, bytes: u32) -> Result<(), String> {
    tx_add(w, cta, off, -(bytes as i64))
}

/// Checks that an asynchronous operation or another CTA may use the barrier.
pub(crate) fn check_visible(w: &mut World, cta: usize, off: u32, user: &str) -> Result<(), String> {
    let base = w.cfg.smem_base;
    let b = get(w, cta, off)?;
    if !b.fenced {
        return Err(format!(
            "{user} uses mbarrier {:#x} of CTA {cta}, but its initializing thread has not executed \
             fence.mbarrier_init since mbarrier.init (PTX ISA 9.0 §9.7.13.4)",
            base + off
        ));
    }
    Ok(())
}

/// Marks the barriers initialized by `t` visible (`fence.mbarrier_init`).
pub(crate) fn fence_init(w: &mut World, t: usize) {
    for cta in &mut w.ctas {
        for b in cta.barriers.values_mut() {
            if b.init_by == t {
                b.fenced = true;
            }
        }
    }
}

fn local(w: &World, me: usize, addr: u32) -> Result<(usize, u32), ModelError> {
    let cta = w.threads[me].cta;
    let off = cta_offset(w, addr, 8, 8).map_err(|m| w.err_at(me, ErrorKind::InvalidOperand, m))?;
    Ok((cta, off))
}

/// `mbarrier.init.shared::cta.b64 [a], count;` (§9.7.13.15.9).
#[track_caller]
pub fn init(a: u32, count: u32) {
    instr("mbarrier.init.shared::cta.b64", Location::caller(), true, |w, me| {
        let (cta, off) = local(w, me, a)?;
        if count == 0 || count as i64 > MAX_COUNT {
            return Err(w.err_at(me, ErrorKind::InvalidOperand, format!("count {count} outside 1..=2^20-1")));
        }
        if let Some(b) = w.ctas[cta].barriers.get(&off) {
            if !b.waiters.is_empty() || b.tx != 0 || b.pending != b.expected {
                return Err(w.err_at(
                    me,
                    ErrorKind::InvalidOperand,
                    format!(
                        "re-initializes mbarrier {a:#x} while it is in use (phase {}, pending {}, tx {})",
                        b.phase, b.pending, b.tx
                    ),
                ));
            }
        } else {
            check_thread_write(w, cta, off, 8).map_err(|m| w.err_at(me, ErrorKind::InvalidOperand, m))?;
        }
        w.ctas[cta].smem.mbar[off as usize..off as usize + 8].fill(true);
        w.ctas[cta].barriers.insert(
            off,
            Mbar {
                expected: count,
                pending: count,
                tx: 0,
                phase: 0,
                waiters: Vec::new(),
                fenced: false,
                init_by: me,
                tc_open: None,
                tc_done: [None, None],
                pub_open: Published::default(),
                pub_done: [Published::default(), Published::default()],
            },
        );
        Ok(Flow::Done(()))
    })
}

/// `mbarrier.arrive.shared::cta.b64 _, [a];` (§9.7.13.15.13): one arrival, release at CTA scope.
#[track_caller]
pub fn arrive(a: u32) {
    instr("mbarrier.arrive.shared::cta.b64", Location::caller(), true, |w, me| {
        let (cta, off) = local(w, me, a)?;
        tc_arrive(w, me, cta, off);
        arrive_on(w, cta, off, 1).map_err(|m| w.err_at(me, ErrorKind::InvalidOperand, m))?;
        Ok(Flow::Done(()))
    })
}

/// `mbarrier.arrive.expect_tx.shared::cta.b64 _, [a], bytes;` (§9.7.13.15.13): expect-tx of
/// `bytes`, then one arrival.
#[track_caller]
pub fn arrive_expect_tx(a: u32, bytes: u32) {
    instr("mbarrier.arrive.expect_tx.shared::cta.b64", Location::caller(), true, |w, me| {
        let (cta, off) = local(w, me, a)?;
        expect_tx(w, cta, off, bytes).map_err(|m| w.err_at(me, ErrorKind::InvalidOperand, m))?;
        tc_arrive(w, me, cta, off);
        arrive_on(w, cta, off, 1).map_err(|m| w.err_at(me, ErrorKind::InvalidOperand, m))?;
        Ok(Flow::Done(()))
    })
}

/// `mbarrier.expect_tx.shared::cta.b64 [a], bytes;` (§9.7.13.15.11): expect-tx without arriving.
#[track_caller]
pub fn expect_tx_only(a: u32, bytes: u32) {
    instr("mbarrier.expect_tx.shared::cta.b64", Location::caller(), true, |w, me| {
        let (cta, off) = local(w, me, a)?;
        expect_tx(w, cta, off, bytes).map_err(|m| w.err_at(me, ErrorKind::InvalidOperand, m))?;
        Ok(Flow::Done(()))
    })
}

/// `mbarrier.arrive.release.cluster.shared::cluster.b64 _, [a];` (§9.7.13.15.13): one arrival on
/// the barrier at the `.shared::cluster` address `a` (possibly another CTA's, from `mapa`).
#[track_caller]
pub fn arrive_cluster(a: u32) {
    instr("mbarrier.arrive.release.cluster.shared::cluster.b64", Location::caller(), true, |w, me| {
        let (cta, off) = cluster_target(w, me, a, 8, 8).map_err(|m| w.err_at(me, ErrorKind::InvalidOperand, m))?;
        if cta != w.threads[me].cta {
            check_visible(w, cta, off, "a remote arrive").map_err(|m| w.err_at(me, ErrorKind::InvalidOperand, m))?;
        }
        tc_arrive(w, me, cta, off);
        arrive_on(w, cta, off, 1).map_err(|m| w.err_at(me, ErrorKind::InvalidOperand, m))?;
        Ok(Flow::Done(()))
    })
}

fn try_wait_impl(name: &'static str, site: &'static Location<'static>, a: u32, parity: u32) -> bool {
    let mut attempted = false;
    instr(name, site, true, move |w, me| {
        let (cta, off) = local(w, me, a)?;
        if parity > 1 {
            return Err(w.err_at(me, ErrorKind::InvalidOperand, format!("phaseParity {parity} is not 0 or 1")));
        }
        let (phase, tc, published) = match get(w, cta, off) {
            Ok(b) => (b.phase, b.tc_done[parity as usize].clone(), b.pub_done[parity as usize].clone()),
            Err(m) => return Err(w.err_at(me, ErrorKind::InvalidOperand, m)),
        };
        let done = (phase & 1) as u32 != parity;
        if done {
            // The completed phase of this parity orders the thread after its arrivals' tcgen05
            // operations and their published shared-memory stores.
            tc_ordered_after(w, me, tc);
            pub_learn(w, me, &published);
        }
        if done || attempted {
            return Ok(Flow::Done(done));
        }
        // The hardware may suspend the thread before answering false; the model suspends it until
        // the barrier changes phase (or the launch deadlocks).
        attempted = true;
        Ok(Flow::Block(Block::Mbarrier { cta, off, parity }))
    })
}

/// `mbarrier.try_wait.parity.shared::cta.b64 p, [a], parity;` (§9.7.13.15.16; acquire, CTA scope).
#[track_caller]
pub fn try_wait(a: u32, parity: u32) -> bool {
    try_wait_impl("mbarrier.try_wait.parity.shared::cta.b64", Location::caller(), a, parity)
}

/// `mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [a], parity;` (§9.7.13.15.16).
#[track_caller]
pub fn try_wait_cluster(a: u32, parity: u32) -> bool {
    try_wait_impl("mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64", Location::caller(), a, parity)
}
