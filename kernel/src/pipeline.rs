//! The pipeline vocabulary both GEMM kernels are written in: a ring of `STAGES` buffers, each
//! with a *full* mbarrier (the producer's data has landed) and an *empty* mbarrier (the consumers
//! are done with it), walked in the same order by every producer and consumer.
//!
//! Each side keeps its own [`Position`] (stage index and the parity of the current round). A
//! waiter asks "has the phase of this parity completed?":
//! - the consumer waits for round `r` of `full[s]`: parity `r % 2`;
//! - the producer waits for the consumers' release of round `r - 1` of `empty[s]`: parity
//!   `(r - 1) % 2`, which on a fresh barrier (round 0) passes at once.
//!
//! Those parities live here and nowhere else. The barriers of a ring lie in two arrays of
//! consecutive 8-byte mbarriers ([`Barriers`]); where they lie is the kernel's shared-memory
//! layout (`nvfp4_gemm_abi`).
//!
//! Usage: the producer `acquire`s a stage (waits until it is free), announces and issues its
//! copies on `stage.full`, and `commit`s (moves on); after its last stage it `drain`s (waits for
//! the release of every stage it filled, so that no arrival is still in flight when the CTA
//! exits). The consumer `wait`s for a stage (and moves on), reads it, and `release`s it (or
//! hands `stage.empty` to an asynchronous arrive such as `tcgen05.commit`).

use crate::ptx::mbarrier::Mbarrier;
use crate::ptx::smem::SmemAddr;
use nvfp4_gemm_abi::launch::MBARRIER_BYTES;

/// An array of consecutive mbarriers, one per stage, starting at `first`.
#[derive(Clone, Copy, Debug)]
pub struct Barriers {
    first: SmemAddr,
}

impl Barriers {
    /// The array whose barrier 0 is at `first` (8-byte aligned).
    #[inline(always)]
    pub fn at(first: SmemAddr) -> Self {
        Self { first }
    }

    /// Barrier `s`.
    #[inline(always)]
    pub fn get(self, s: u32) -> Mbarrier {
        Mbarrier(self.first.add(MBARRIER_BYTES * s))
    }
}

/// Which threads' memory operations a producer's wait acquires: its own CTA's, or the cluster's
/// (for releases that arrive from other CTAs of the cluster).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// `mbarrier.try_wait` with the default CTA scope.
    Cta,
    /// `mbarrier.try_wait.acquire.cluster`.
    Cluster,
}

/// Position in a ring of `STAGES` stages: the stage index and the parity of its current round.
#[derive(Clone, Copy, Debug)]
struct Position<const STAGES: u32> {
    stage: u32,
    phase: u32,
}

impl<const STAGES: u32> Position<STAGES> {
    const START: Self = Position { stage: 0, phase: 0 };

    /// The next stage, flipping the phase after the last one.
    #[inline(always)]
    fn advance(&mut self) {
        self.stage += 1;
        if self.stage == STAGES {
            self.stage = 0;
            self.phase ^= 1;
        }
    }
}

/// One stage handed out by the ring: its index (for the kernel's buffer offsets) and its two
/// barriers.
#[derive(Clone, Copy, Debug)]
pub struct Stage {
    /// Stage index, `0..STAGES`.
    pub index: u32,
    /// Completes when the stage's data has landed (the producer's copies complete on it).
    pub full: Mbarrier,
    /// Completes when the consumers are done with the stage.
    pub empty: Mbarrier,
}

impl Stage {
    /// Consumer: this thread is done with the stage (one arrival on `empty`).
    #[inline(always)]
    pub fn release(self) {
        self.empty.arrive();
    }
}

/// The producer's side of a ring.
pub struct Producer<const STAGES: u32> {
    position: Position<STAGES>,
    full: Barriers,
    empty: Barriers,
    scope: Scope,
}

impl<const STAGES: u32> Producer<STAGES> {
    /// A producer at stage 0, round 0, that waits on `empty` with `scope`.
    #[inline(always)]
    pub fn new(full: Barriers, empty: Barriers, scope: Scope) -> Self {
        Self { position: Position::START, full, empty, scope }
    }

    /// Waits until the consumers have released the stage at this position from its previous
    /// round (round 0 passes at once) and returns it. Follow with the copies, then [`Self::commit`].
    #[inline(always)]
    pub fn acquire(&self) -> Stage {
        let Position { stage, phase } = self.position;
        let empty = self.empty.get(stage);
        match self.scope {
            Scope::Cta => empty.wait(phase ^ 1),
            Scope::Cluster => empty.wait_cluster(phase ^ 1),
        }
        Stage { index: stage, full: self.full.get(stage), empty }
    }

    /// The copies of `stage` (from [`Self::acquire`]) are issued: moves to the next stage.
    #[inline(always)]
    pub fn commit(&mut self, stage: Stage) {
        let _ = stage;
        self.position.advance();
    }

    /// The producer's tail: waits for the release of every stage (the last `STAGES` it filled,
    /// or the fresh phase of those it never reached), so that no arrival on them is in flight
    /// when the CTA exits.
    #[inline(always)]
    pub fn drain(mut self) {
        for _ in 0..STAGES {
            let stage = self.acquire();
            self.commit(stage);
        }
    }
}

/// The consumer's side of a ring.
pub struct Consumer<const STAGES: u32> {
    position: Position<STAGES>,
    full: Barriers,
    empty: Barriers,
}

impl<const STAGES: u32> Consumer<STAGES> {
    /// A consumer at stage 0, round 0.
    #[inline(always)]
    pub fn new(full: Barriers, empty: Barriers) -> Self {
        Self { position: Position::START, full, empty }
    }

    /// Waits until the stage at this position is full, returns it and moves to the next stage.
    /// The caller releases it ([`Stage::release`], or an asynchronous arrive on `stage.empty`)
    /// once it is done reading it.
    #[inline(always)]
    pub fn wait(&mut self) -> Stage {
        let Position { stage, phase } = self.position;
        let full = self.full.get(stage);
        full.wait(phase);
        self.position.advance();
        Stage { index: stage, full, empty: self.empty.get(stage) }
    }

    /// The index of the stage [`Self::wait`] returns next.
    #[inline(always)]
    pub fn next_index(&self) -> u32 {
        self.position.stage
    }

    /// [`Self::wait`] for a caller that already knows the ring's position: `stage` must be
    /// [`Self::next_index`]. A loop unrolled over the ring passes each copy's index as a
    /// constant, so that the stage's barriers, buffer offsets and the next position fold into
    /// immediates instead of being computed from the index at run time.
    #[inline(always)]
    pub fn wait_at(&mut self, stage: u32) -> Stage {
        debug_assert!(stage == self.position.stage, "wait_at: not the ring's next stage");
        // The same position, now a constant for the compiler.
        self.position.stage = stage;
        self.wait()
    }
}
