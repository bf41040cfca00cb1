//! Hopper warpgroup MMA (PTX ISA 9.0 §9.7.15): `wgmma.mma_async.sync.aligned.m64nNk16.f32.f16.f16`
//! and `.f32.bf16.bf16` with A from registers and B from a shared-memory descriptor,
//! `wgmma.fence`, `commit_group`, `wait_group`.
//!
//! - All four warps of the warpgroup meet at every `wgmma` instruction (`.sync.aligned`,
//!   §9.7.15.1), with identical descriptor and scale-d operands.
//! - Register fragments (§9.7.15.5.1.1.1, Figures 148/149; cross-checked with CuTe
//!   `ALayout_64x16` / `CLayout_64xN`): thread `t` of the warpgroup, `w = t/32`, `g = (t%32)/4`,
//!   `q = t%4`. A: `a0` = A[16w+g][2q, 2q+1], `a1` = A[16w+g+8][2q, 2q+1], `a2` = A[16w+g][2q+8,
//!   2q+9], `a3` = A[16w+g+8][2q+8, 2q+9] (lower k in the low half). D register `i` = D[16w + g +
//!   8·((i/2)%2)][8·(i/4) + 2q + i%2].
//! - B (K-major, transpose-b = 0) is read through the matrix descriptor (§9.7.15.5.1.2.2: start
//!   bits 0–13, LBO 16–29, SBO 32–45, base offset 49–51, swizzle 62–63 = none/128B/64B/32B, each
//!   address field `(x & 0x3FFFF) >> 4`) in the canonical K-major layouts of §9.7.15.5.1.2.1.3:
//!   swizzled `((8,m),(T,2k)):((S/16·T, SBO),(1,T))` under `Swizzle<log2(S/16),4,3>` of the
//!   absolute address (base offset 0: the pattern starts on its repeat boundary), and
//!   no-swizzle `((8,m),(T,2k)):((1T,SBO),(1,LBO))`.
//! - Asynchrony (§9.7.15.7): the product is computed when all lanes have arrived, but the
//!   accumulator registers receive it only at the `wait_group` that covers its group; until then
//!   they hold a NaN poison (so reading them early shows), and the B bytes stay marked as read
//!   until the group completes (so overwriting the stage early is a hazard). A group completes
//!   when the scheduler chooses, after the group before it. An `mma_async` needs a `wgmma.fence`
//!   since the thread's last `wait_group` (§9.7.15.7.1).
//! - Numerics: products are exact; the sum of the 16 products and the accumulator is computed in
//!   f64 and rounded once to f32 (hardware truncates differently; exact for small integers).

use crate::error::{ErrorKind, ModelError};
use crate::exec::{check_published, instr, Block, Flow, World};
use crate::smem::{check_async_read, cta_offset, mark_read};
use crate::sync::{collective, require_arch, Coll, Meeting, Outcome, Scope};
use crate::tensor_map::Swizzle;
use crate::Arch;
use std::panic::Location;

/// Bits of the poison written into accumulator registers of an in-flight wgmma.
pub const ACC_POISON: u32 = 0x7FC0_DEAD;

/// A warpgroup's wgmma state.
#[derive(Default)]
pub(crate) struct WgState {
    pub meeting: Option<Meeting>,
    /// Sequence number of the group the next `mma_async` joins.
    pub next_group: u64,
    /// Committed groups in flight: `(sequence, op id)`, oldest first.
    pub pending: Vec<(u64, u32)>,
    /// Shared-memory reads of the MMAs not yet committed.
    pub uncommitted_reads: Vec<(usize, u32, u32)>,
    pub waiters: Vec<usize>,
}

/// A thread's accumulator registers that an in-flight wgmma will write.
pub(crate) struct AccPending {
    pub ptr: usize,
    pub group: u64,
    pub value: Vec<f32>,
}

fn group_done(wg: &WgState, seq: u64) -> bool {
    seq < wg.next_group && !wg.pending.iter().any(|p| p.0 == seq)
}

/// Completion of a committed group (called by the scheduler).
pub(crate) fn complete_group(w: &mut World, wg: usize, id: u32) {
    w.wgs[wg].pending.retain(|p| p.1 != id);
    let left = w.wgs[wg].pending.len() as u32;
    let waiters = std::mem::take(&mut w.wgs[wg].waiters);
    for t in waiters {
        match w.threads[t].block {
            Some(Block::WgmmaWait { n, .. }) if left <= n => {
                w.threads[t].coll_out = Some(Vec::new());
                w.wake(t);
            }
            _ => w.wgs[wg].waiters.push(t),
        }
    }
}

/// A decoded wgmma matrix descriptor (§9.7.15.5.1.2.2).
#[derive(Clone, Copy, Debug)]
struct Desc {
    start: u32,
    lbo: u32,
    sbo: u32,
    swizzle: Swizzle,
}

fn decode_desc(d: u64) -> Result<Desc, String> {
    let field = |s: u32| (((d >> s) & 0x3FFF) as u32) << 4;
    let reserved = d & (0x3 << 14 | 0x3 << 30 | 0x7 << 46 | 0x3FF << 52);
    if reserved != 0 {
        return Err(format!("descriptor {d:#x} sets bits outside the fields of PTX ISA 9.0 §9.7.15.5.1.2.2"));
    }
    let base_offset = (d >> 49) & 7;
    if base_offset != 0 {
        return Err(format!("descriptor {d:#x}: a non-zero base offset is not modelled"));
    }
    let swizzle = match d >> 62 {
        0 => Swizzle::None,
        1 => Swizzle::B128,
        2 => Swizzle::B64,
        _ => Swizzle::B32,
    };
    Ok(Desc { start: field(0), lbo: field(16), sbo: field(32), swizzle })
}

/// Shared address of the 16-byte unit holding B[k = 8·kc ..][n] (K-major, f16: T = 8 elements).
fn b_unit(d: &Desc, n: u32, kc: u32) -> u32 {
    match d.swizzle {
        Swizzle::None => d.start + (n / 8) * d.sbo + (n % 8) * 16 + kc * d.lbo,
        s => s.apply(d.start + (n / 8) * d.sbo + (n % 8) * s.span() + kc * 16),
    }
}

/// The A/B element type of a `wgmma.mma_async` (PTX ISA 9.0 §9.7.15.5.1: `.atype` = `.btype` =
/// `.f16` or `.bf16` with an `.f32` accumulator; both 16 bits, so fragments and shared-memory
/// layouts are the same).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WgmmaType {
    /// `.f16`.
    F16,
    /// `.bf16`.
    Bf16,
}

impl WgmmaType {
    /// The value of a 16-bit element (exact in f64).
    fn value(self, bits: u16) -> f64 {
        match self {
            WgmmaType::F16 => half::f16::from_bits(bits).to_f64(),
            WgmmaType::Bf16 => half::bf16::from_bits(bits).to_f64(),
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            WgmmaType::F16 => "wgmma.mma_async.sync.aligned.m64nNk16.f32.f16.f16",
            WgmmaType::Bf16 => "wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16",
        }
    }
}

pub(crate) fn complete_collective(
    w: &mut World,
    me: usize,
    mem: &[usize],
    key: &Coll,
    inputs: Vec<Vec<u32>>,
) -> Result<Outcome, ModelError> {
    let wg = w.wg_of(me);
    match *key {
        Coll::WgFence => Ok(Outcome::Outputs(vec![Vec::new(); mem.len()])),
        Coll::WgCommit => {
            let id = w.op_id();
            let deps = w.wgs[wg].pending.last().map(|p| vec![p.1]).unwrap_or_default();
            let seq = w.wgs[wg].next_group;
            w.wgs[wg].next_group += 1;
            w.wgs[wg].pending.push((seq, id));
            let smem_reads = std::mem::take(&mut w.wgs[wg].uncommitted_reads);
            let site = w.threads[me].site;
            w.push_op(crate::asyncop::AsyncOp {
                id,
                issuer: me,
                site,
                what: format!("wgmma group {seq} of warpgroup {}", w.threads[me].tid / 128),
                deps,
                smem_reads,
                kind: crate::asyncop::OpKind::WgmmaGroup { wg },
            });
            Ok(Outcome::Outputs(vec![Vec::new(); mem.len()]))
        }
        Coll::WgWait { n } => {
            if w.wgs[wg].pending.len() as u32 <= n {
                Ok(Outcome::Outputs(vec![Vec::new(); mem.len()]))
            } else {
                Ok(Outcome::Wait(Block::WgmmaWait { wg, n }))
            }
        }
        Coll::WgMma { n, b_desc, scale_d, ty } => {
            let d = decode_desc(b_desc).map_err(|m| w.err_at(me, ErrorKind::Unimplemented, m))?;
            let cta = w.threads[me].cta;
            // Read B (16 x n) and check / mark its bytes.
            let mut b = vec![0f64; 16 * n as usize];
            for col in 0..n {
                for kc in 0..2 {
                    let addr = b_unit(&d, col, kc);
                    let off = cta_offset(w, addr, 16, 16).map_err(|m| {
                        w.err_at(me, ErrorKind::InvalidOperand, format!("B descriptor {b_desc:#x}, n {col}: {m}"))
                    })?;
                    check_async_read(w, cta, off, 16)
                        .map_err(|m| w.err_at(me, ErrorKind::Hazard, format!("B operand: {m}")))?;
                    check_published(w, mem, cta, off, 16)
                        .map_err(|m| w.err_at(me, ErrorKind::Hazard, format!("B operand: {m}")))?;
                    let bytes = &w.ctas[cta].smem.data;
                    for e in 0..8 {
                        let o = off as usize + 2 * e as usize;
                        b[((8 * kc + e) * n + col) as usize] = ty.value(u16::from_le_bytes([bytes[o], bytes[o + 1]]));
                    }
                    mark_read(w, cta, off, 16);
                    w.wgs[wg].uncommitted_reads.push((cta, off, 16));
                }
            }
            // A (64 x 16) from the fragments.
            let mut a = [[0f64; 16]; 64];
            for (t, inp) in inputs.iter().enumerate() {
                let (wq, g, q) = (t as u32 / 32, (t as u32 % 32) / 4, t as u32 % 4);
                let place = |a: &mut [[f64; 16]; 64], reg: u32, row: u32, col: u32| {
                    a[row as usize][col as usize] = ty.value(reg as u16);
                    a[row as usize][col as usize + 1] = ty.value((reg >> 16) as u16);
                };
                place(&mut a, inp[0], 16 * wq + g, 2 * q);
                place(&mut a, inp[1], 16 * wq + g + 8, 2 * q);
                place(&mut a, inp[2], 16 * wq + g, 2 * q + 8);
                place(&mut a, inp[3], 16 * wq + g + 8, 2 * q + 8);
            }
            let outs = inputs
                .iter()
                .enumerate()
                .map(|(t, inp)| {
                    let (wq, g, q) = (t as u32 / 32, (t as u32 % 32) / 4, t as u32 % 4);
                    (0..n / 2)
                        .map(|i| {
                            let row = (16 * wq + g + 8 * ((i / 2) % 2)) as usize;
                            let col = 8 * (i / 4) + 2 * q + i % 2;
                            let mut s = if scale_d { f32::from_bits(inp[4 + i as usize]) as f64 } else { 0.0 };
                            for k in 0..16 {
                                s += a[row][k] * b[k * n as usize + col as usize];
                            }
                            (s as f32).to_bits()
                        })
                        .collect()
                })
                .collect();
            Ok(Outcome::Outputs(outs))
        }
        _ => unreachable!("not a wgmma collective"),
    }
}

fn wg_instr(name: &'static str, site: &'static Location<'static>, key: Coll, input: Vec<u32>) -> Vec<u32> {
    instr(name, site, true, move |w, me| {
        require_arch(w, me, Arch::Sm90a)?;
        collective(w, me, Scope::Warpgroup, key.clone(), u32::MAX, input.clone())
    })
}

/// `wgmma.fence.sync.aligned;` (§9.7.15.7.1). Whole warpgroup.
#[track_caller]
pub fn fence() {
    wg_instr("wgmma.fence.sync.aligned", Location::caller(), Coll::WgFence, Vec::new());
    crate::exec::instr("wgmma.fence.sync.aligned", Location::caller(), false, |w, me| {
        w.threads[me].wgmma_fenced = true;
        Ok(Flow::Done(()))
    });
}

/// `wgmma.commit_group.sync.aligned;` (§9.7.15.7.2): the warpgroup's uncommitted MMAs become a
/// group (possibly empty). Whole warpgroup.
#[track_caller]
pub fn commit_group() {
    wg_instr("wgmma.commit_group.sync.aligned", Location::caller(), Coll::WgCommit, Vec::new());
}

/// `wgmma.mma_async.sync.aligned.m64nNk16.f32.f16.f16 {acc}, {a0..a3}, b_desc, p, 1, 1, 0;` with
/// N = `2·acc.len()` and `p = scale_d` (false: D = A·B). Whole warpgroup.
///
/// # Safety
/// The descriptor must describe valid shared memory of this CTA (checked by the model).
#[track_caller]
pub unsafe fn mma_f16(acc: &mut [f32], a: [u32; 4], b_desc: u64, scale_d: bool) {
    // SAFETY: the caller's contract.
    unsafe { mma(acc, a, b_desc, scale_d, WgmmaType::F16, Location::caller()) }
}

/// [`mma_f16`] with bf16 A and B: `wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16`.
///
/// # Safety
/// As [`mma_f16`].
#[track_caller]
pub unsafe fn mma_bf16(acc: &mut [f32], a: [u32; 4], b_desc: u64, scale_d: bool) {
    // SAFETY: the caller's contract.
    unsafe { mma(acc, a, b_desc, scale_d, WgmmaType::Bf16, Location::caller()) }
}

/// # Safety
/// As [`mma_f16`].
unsafe fn mma(
    acc: &mut [f32],
    a: [u32; 4],
    b_desc: u64,
    scale_d: bool,
    ty: WgmmaType,
    site: &'static Location<'static>,
) {
    let n = 2 * acc.len() as u32;
    let ptr = acc.as_ptr() as usize;
    // This thread's accumulator input: the in-flight value if an MMA on these registers is
    // pending (in-order accumulator chaining), else the registers.
    let mut input = a.to_vec();
    let prior: Option<Vec<f32>> = crate::exec::instr("wgmma.mma_async (issue)", site, false, |w, me| {
        require_arch(w, me, Arch::Sm90a)?;
        if n == 0 || n % 8 != 0 || n > 256 {
            return Err(w.err_at(me, ErrorKind::InvalidOperand, format!("N = {n} outside 8..=256 step 8")));
        }
        if !w.threads[me].wgmma_fenced {
            return Err(w.err_at(
                me,
                ErrorKind::InvalidOperand,
                "wgmma.mma_async without a wgmma.fence since the thread's last wait_group (PTX ISA 9.0 §9.7.15.7.1)",
            ));
        }
        Ok(Flow::Done(w.threads[me].acc.iter().find(|p| p.ptr == ptr).map(|p| p.value.clone())))
    });
    let acc_in: Vec<f32> = prior.unwrap_or_else(|| acc.to_vec());
    if acc_in.iter().any(|v| v.to_bits() == ACC_POISON) && scale_d {
        crate::exec::raise(
            ErrorKind::Hazard,
            site,
            "wgmma.mma_async",
            "accumulates into registers still holding an in-flight wgmma result not covered by wait_group".into(),
        );
    }
    input.extend(acc_in.iter().map(|v| v.to_bits()));
    let out = wg_instr(ty.suffix(), site, Coll::WgMma { n, b_desc, scale_d, ty }, input);
    crate::exec::instr("wgmma.mma_async (registers)", site, false, |w, me| {
        let wg = w.wg_of(me);
        let group = w.wgs[wg].next_group;
        let value: Vec<f32> = out.iter().map(|&b| f32::from_bits(b)).collect();
        let th = &mut w.threads[me];
        th.acc.retain(|p| p.ptr != ptr);
        th.acc.push(AccPending { ptr, group, value });
        Ok(Flow::Done(()))
    });
    acc.fill(f32::from_bits(ACC_POISON));
}

/// `wgmma.wait_group.sync.aligned n;` (§9.7.15.7.3): waits until at most `n` committed groups
/// of the warpgroup are pending; then the registers `acc` receive the results of every completed
/// MMA on them. Whole warpgroup.
#[track_caller]
pub fn wait_group(n: u32, acc: &mut [f32]) {
    let site = Location::caller();
    wg_instr("wgmma.wait_group.sync.aligned", site, Coll::WgWait { n }, Vec::new());
    let ptr = acc.as_ptr() as usize;
    let done = crate::exec::instr("wgmma.wait_group (registers)", site, false, |w, me| {
        let wg = w.wg_of(me);
        w.threads[me].wgmma_fenced = false;
        let pos = w.threads[me].acc.iter().position(|p| p.ptr == ptr);
        Ok(Flow::Done(match pos {
            Some(i) if group_done(&w.wgs[wg], w.threads[me].acc[i].group) => Some(w.threads[me].acc.remove(i).value),
            _ => None,
        }))
    });
    if let Some(v) = done {
        acc.copy_from_slice(&v);
    }
}
