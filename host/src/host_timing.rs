//! Where a plan call's host time goes, for measuring builds (feature `host-timing`, off by
//! default and in every shipped build): a call of [`crate::GemmPlan::run`] or
//! [`crate::MoePlan::run`] marks the end of each of its steps, and [`take`] returns the mean
//! nanoseconds per call of each step since the last `take`. Without the feature every function
//! here is empty and inlined away.
//!
//! The steps, in call order: reading the caller's buffers (addresses and lengths), the checks
//! against the problem (lengths, alignment, overlaps), the capture query, the table-set lookup by
//! the call's signature, the stream-ordering guards, encoding the tables, their upload, the
//! launches, and the guards' release.

/// The marked steps, in call order.
pub const STEPS: [&str; 9] = ["read", "check", "capture", "pick", "guards", "encode", "upload", "launch", "release"];

/// Step indices (into [`STEPS`]).
pub(crate) mod step {
    pub const READ: usize = 0;
    pub const CHECK: usize = 1;
    pub const CAPTURE: usize = 2;
    pub const PICK: usize = 3;
    pub const GUARDS: usize = 4;
    pub const ENCODE: usize = 5;
    pub const UPLOAD: usize = 6;
    pub const LAUNCH: usize = 7;
    pub const RELEASE: usize = 8;
}

#[cfg(feature = "host-timing")]
mod imp {
    use super::STEPS;
    use std::cell::Cell;
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    use std::time::Instant;

    static TOTAL_NS: [AtomicU64; STEPS.len()] = [const { AtomicU64::new(0) }; STEPS.len()];
    static CALLS: AtomicU64 = AtomicU64::new(0);
    thread_local! {
        static LAST: Cell<Option<Instant>> = const { Cell::new(None) };
    }

    pub fn start() {
        CALLS.fetch_add(1, Relaxed);
        LAST.set(Some(Instant::now()));
    }

    pub fn mark(step: usize) {
        let now = Instant::now();
        if let Some(last) = LAST.get() {
            TOTAL_NS[step].fetch_add((now - last).as_nanos() as u64, Relaxed);
        }
        LAST.set(Some(now));
    }

    pub fn take() -> Option<(u64, Vec<(&'static str, f64)>)> {
        let calls = CALLS.swap(0, Relaxed);
        let per = |t: &AtomicU64| t.swap(0, Relaxed) as f64 / calls.max(1) as f64;
        Some((calls, STEPS.iter().zip(&TOTAL_NS).map(|(s, t)| (*s, per(t))).collect()))
    }
}

#[cfg(not(feature = "host-timing"))]
mod imp {
    #[inline(always)]
    pub fn start() {}
    #[inline(always)]
    pub fn mark(_step: usize) {}
    pub fn take() -> Option<(u64, Vec<(&'static str, f64)>)> {
        None
    }
}

/// Starts a call's marks.
#[inline(always)]
pub(crate) fn start() {
    imp::start()
}

/// Marks the end of `step` (the time since the previous mark or [`start`]).
#[inline(always)]
pub(crate) fn mark(step: usize) {
    imp::mark(step)
}

/// The calls since the last `take` and each step's mean nanoseconds per call, then zeroes them;
/// `None` in a build without the feature `host-timing`.
pub fn take() -> Option<(u64, Vec<(&'static str, f64)>)> {
    imp::take()
}
