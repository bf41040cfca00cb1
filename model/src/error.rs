//! What a failed launch reports.

use std::fmt;

/// The class of a model failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Every live thread waits and no asynchronous operation is left to complete.
    Deadlock,
    /// A memory hazard: a thread or an asynchronous operation touched bytes (shared memory) or
    /// cells (tensor memory) that an in-flight asynchronous operation writes or reads.
    Hazard,
    /// Lanes of a warp (or warps of a warpgroup) reached different collective instructions, or
    /// the same one with different uniform operands.
    Divergence,
    /// An operand the ISA forbids (misaligned, out of range, wrong state space, wrong state).
    InvalidOperand,
    /// An operand value or combination the model does not implement (never guessed).
    Unimplemented,
    /// Something allocated or in flight when a CTA exited (TMEM, asynchronous operations).
    ResourceLeak,
    /// The kernel executed `trap`.
    Trap,
    /// The kernel code panicked (for example an arithmetic overflow).
    Panic,
}

/// A failed launch: what happened, where, and the state of every barrier, warp and in-flight
/// asynchronous operation at that moment.
#[derive(Clone, Debug)]
pub struct ModelError {
    /// The class.
    pub kind: ErrorKind,
    /// One paragraph: the instruction, the thread, the call site, the offending operand or bytes.
    pub message: String,
    /// The machine state when it was detected (barriers, warps, in-flight operations).
    pub report: String,
}

impl fmt::Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}\n{}", self.kind, self.message, self.report)
    }
}

impl std::error::Error for ModelError {}
