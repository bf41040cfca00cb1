//! Blackwell tensor memory and the `tcgen05` instructions the kernels use (PTX ISA 9.0 §9.7.16).
//!
//! - TMEM (§9.7.16.1): per SM 128 lanes × 512 columns of 32-bit cells; an address is
//!   `lane << 16 | column` (§9.7.16.1.1). Unwritten cells hold a NaN pattern.
//! - Allocation (§9.7.16.1.2, §9.7.16.7.1): one warp, `nCols` a power of two in 32..=512, never
//!   more than the CTA's previous allocation, blocked while the columns are not free, none after
//!   `relinquish_alloc_permit`; everything freed before the CTA exits. The model places an
//!   allocation at a naturally aligned free range, by default the highest one, so that the base
//!   column is non-zero whenever fewer than 512 columns are requested.
//! - `tcgen05.ld.16x256b.xN` + `wait::ld` (§9.7.16.8.3, §9.7.16.8.1): a warp reads lanes of its
//!   quarter only (warp `w % 4` → lanes `32·(w%4) ..`); with `q = lane/4`, `p = lane%4`, register
//!   `4j`/`4j+1` = lane `L0+q`, columns `C0+8j+2p`, `+1`, and `4j+2`/`4j+3` = the same of lane
//!   `L0+q+8` (cross-checked with CuTe `Copy_Traits<SM100_TMEM_LOAD_16dp256b1x>`). Synchronous in the model
//!   (the wrapper waits in the same statement): reading a cell an in-flight operation writes is a
//!   hazard.
//! - `tcgen05.cp.cta_group::1.32x128b.warpx4` (§9.7.16.9.2): 32 rows × 16 bytes from shared
//!   memory (descriptor, no swizzle: row `r` at `start + (r/8)·SBO + (r%8)·16`, the K-major
//!   canonical layout of §9.7.16.3.3 with one 16-byte column) to TMEM columns `c..c+4`, row `r`
//!   into lane `r` of each of the four 32-lane quarters (`.warpx4`).
//! - `tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.scale_vec::4X` (§9.7.16.10.9.1): D (128 ×
//!   N, f32, lane m / column n: Layout D, §9.7.16.10.5.4) (+)= Σ over K = 64 of (A·SFA)(B·SFB).
//!   Instruction descriptor: Table 44 (§9.7.16.4.2); operands: shared-memory descriptors (Table
//!   40, §9.7.16.4.1) over K-major tiles of e2m1 packed two per byte (§9.7.16.10.4.6; element `2i`
//!   in the low nibble) in the canonical layouts of §9.7.16.3.3, evaluated from that table
//!   (`canonical_k_major_unit`: the layout's strides, then CuTe's `Swizzle<B,4,3>` of the
//!   absolute address, base offset 0) independently of the TMA's [`Swizzle::apply`]; a unit test
//!   checks that the two agree for every swizzle mode. Scale factors (§9.7.16.10.7, 4X: SFA_ID =
//!   SFB_ID = 0): the scale of row `32g + r`, K block `s` is byte `s` of the cell at lane `r` of
//!   every 32-lane quarter (they must be duplicated to all four, §9.7.16.10.7), column `c + g` —
//!   CuTe's `tmem_sf_frg` in its 4×1 duplicated mode gives the same cells, N = 256 included
//!   (checked by `model-tests/tests/model_probe_sm100.rs` against an image built from its
//!   strides). The model checks that the four copies of every row agree and reads quarter 0's.
//!   Computed when it completes; the sum of 64 exact products and the accumulator is rounded once
//!   to f32.
//! - Ordering (§9.7.16.6.2): operations complete in any order except `cp → mma`, `mma → mma`
//!   (same accumulator and shape) and everything before a `commit`. A `cp` into cells an earlier,
//!   still in-flight MMA reads is therefore a hazard (mma → cp is not ordered).
//! - `tcgen05.commit...mbarrier::arrive::one{.multicast::cluster}` (§9.7.16.12.1): one arrive-on,
//!   after all of the thread's earlier `mma`/`cp` have completed, on the barrier at `bar`'s offset
//!   in each CTA of the mask (or at `bar`).
//!
//! Strict mode ([`crate::LaunchConfig::strict`], on by default) also rejects what the ISA allows
//! but no hardware-proven kernel uses (`strict_operand`, `strict_scale_source`, `strict_columns`,
//! `strict_written`; docs/model.md §3).
//!
//! Not modelled (a loud error): `cta_group::2`, other shapes and kinds, M ≠ 128, K = 96, sparse,
//! transpose, SF IDs ≠ 0, UE8M0 scales (legal with `scale_vec::4X`, Table 55), the
//! 128B-with-32B-atom swizzle, non-zero base offsets, the absolute LBO mode, `tcgen05.st`,
//! `tcgen05.shift`, `32x32b` loads.

use crate::error::{ErrorKind, ModelError};
use crate::exec::{check_published, instr, tc_issue, Block, Flow, TcOrder, TmemPlacement, World};
use crate::mbarrier::{arrive_on, check_visible, tc_add};
use crate::smem::{check_async_read, check_thread_write, cluster_target, cta_offset, mark_read};
use crate::sync::{collective, require_arch, Coll, Outcome, Scope};
use crate::tensor_map::Swizzle;
use crate::Arch;
use std::panic::Location;

const LANES: usize = 128;
const COLS: usize = 512;
/// What unwritten TMEM cells hold (a NaN).
pub const TMEM_UNWRITTEN: u32 = 0x7FBA_DBAD;

/// One SM's tensor memory.
pub(crate) struct Tmem {
    pub cells: Vec<u32>,
    pub writer: Vec<u32>,
    pub readers: Vec<u16>,
    /// Whether a `tcgen05.cp` or MMA wrote the cell since its columns were last allocated (a
    /// fresh allocation holds whatever the previous owner left).
    pub written: Vec<bool>,
    /// Owner CTA of each 32-column unit.
    pub owner: [Option<usize>; 16],
}

impl Tmem {
    pub(crate) fn new() -> Self {
        Tmem {
            cells: vec![TMEM_UNWRITTEN; LANES * COLS],
            writer: vec![0; LANES * COLS],
            readers: vec![0; LANES * COLS],
            written: vec![false; LANES * COLS],
            owner: [None; 16],
        }
    }
}

fn cell(lane: u32, col: u32) -> usize {
    lane as usize * COLS + col as usize
}

/// An allocation waiting for free columns.
pub(crate) struct PendingAlloc {
    cta: usize,
    members: Vec<usize>,
    dst_off: u32,
    ncols: u32,
}

/// An asynchronous tcgen05 operation.
pub(crate) enum Op {
    Cp { sm: usize, cta: usize, col: u32, rows: Vec<[u32; 4]> },
    Mma(Box<Mma>),
    Commit { bars: Vec<(usize, u32)> },
}

pub(crate) struct Mma {
    sm: usize,
    cta: usize,
    d_col: u32,
    n: u32,
    a_units: Vec<u32>,
    b_units: Vec<u32>,
    sfa_col: u32,
    sfb_col: u32,
    accumulate: bool,
    neg_a: bool,
    neg_b: bool,
}

impl Op {
    pub(crate) fn touches_cta(&self, c: usize) -> bool {
        match self {
            Op::Cp { cta, .. } => *cta == c,
            Op::Mma(m) => m.cta == c,
            Op::Commit { bars } => bars.iter().any(|b| b.0 == c),
        }
    }
}

fn sm_of(w: &World, me: usize) -> (usize, usize) {
    let cta = w.threads[me].cta;
    (cta, w.ctas[cta].sm)
}

/// Checks that columns `col .. col + n` belong to CTA `cta`.
fn check_owned(w: &World, cta: usize, col: u32, n: u32) -> Result<(), String> {
    let sm = w.ctas[cta].sm;
    if col as usize + n as usize > COLS {
        return Err(format!("columns {col}..{} exceed the 512 TMEM columns", col + n));
    }
    for c in col..col + n {
        if w.sms[sm].owner[c as usize / 32] != Some(cta) {
            return Err(format!("TMEM column {c} is not allocated by CTA {cta}"));
        }
    }
    Ok(())
}

fn try_alloc(w: &mut World, cta: usize, ncols: u32) -> Option<u32> {
    let sm = w.ctas[cta].sm;
    let units = (ncols / 32) as usize;
    let free: Vec<usize> = (0..16 / units)
        .map(|i| i * units)
        .filter(|&b| w.sms[sm].owner[b..b + units].iter().all(|o| o.is_none()))
        .collect();
    let base = match w.cfg.tmem_placement {
        TmemPlacement::Highest => *free.last()?,
        TmemPlacement::Lowest => *free.first()?,
    };
    for o in &mut w.sms[sm].owner[base..base + units] {
        *o = Some(cta);
    }
    for lane in 0..LANES as u32 {
        for c in (base * 32) as u32..((base + units) * 32) as u32 {
            w.sms[sm].written[cell(lane, c)] = false;
        }
    }
    w.ctas[cta].tmem_allocs.push((base as u32 * 32, ncols));
    Some(base as u32 * 32)
}

fn write_slot(w: &mut World, cta: usize, off: u32, v: u32) -> Result<(), String> {
    check_thread_write(w, cta, off, 4)?;
    w.ctas[cta].smem.data[off as usize..off as usize + 4].copy_from_slice(&v.to_le_bytes());
    Ok(())
}

/// Grants waiting allocations whose columns became free (called by the scheduler).
pub(crate) fn retry_pending_allocs(w: &mut World) -> Result<(), ModelError> {
    let mut i = 0;
    while i < w.pending_allocs.len() {
        let (cta, ncols) = (w.pending_allocs[i].cta, w.pending_allocs[i].ncols);
        if let Some(col) = try_alloc(w, cta, ncols) {
            let p = w.pending_allocs.remove(i);
            write_slot(w, cta, p.dst_off, col).map_err(|m| w.err(ErrorKind::Hazard, format!("tcgen05.alloc: {m}")))?;
            for t in p.members {
                w.threads[t].coll_out = Some(Vec::new());
                w.wake(t);
            }
        } else {
            i += 1;
        }
    }
    Ok(())
}

pub(crate) fn complete_collective(
    w: &mut World,
    me: usize,
    mem: &[usize],
    key: &Coll,
    _inputs: Vec<Vec<u32>>,
) -> Result<Outcome, ModelError> {
    let (cta, sm) = sm_of(w, me);
    let none = || Outcome::Outputs(vec![Vec::new(); mem.len()]);
    let inv = |w: &World, m: String| w.err_at(me, ErrorKind::InvalidOperand, m);
    match *key {
        Coll::TmemAlloc { dst, ncols } => {
            if !ncols.is_power_of_two() || !(32..=512).contains(&ncols) {
                return Err(inv(w, format!("nCols {ncols} is not a power of two in 32..=512")));
            }
            if w.ctas[cta].tmem_relinquished {
                return Err(inv(w, "tcgen05.alloc after tcgen05.relinquish_alloc_permit".into()));
            }
            if let Some(last) = w.ctas[cta].tmem_last_ncols {
                if ncols > last {
                    return Err(inv(w, format!("nCols {ncols} exceeds the CTA's previous allocation of {last}")));
                }
            }
            w.ctas[cta].tmem_last_ncols = Some(ncols);
            let off = cta_offset(w, dst, 4, 4).map_err(|m| inv(w, m))?;
            match try_alloc(w, cta, ncols) {
                Some(col) => {
                    write_slot(w, cta, off, col).map_err(|m| w.err_at(me, ErrorKind::Hazard, m))?;
                    Ok(none())
                }
                None => {
                    let others = w.sms[sm].owner.iter().any(|o| o.is_some_and(|c| c != cta));
                    if !others {
                        return Err(w.err_at(
                            me,
                            ErrorKind::Deadlock,
                            format!("{ncols} columns can never be allocated: the CTA itself holds the rest"),
                        ));
                    }
                    w.pending_allocs.push(PendingAlloc { cta, members: mem.to_vec(), dst_off: off, ncols });
                    Ok(Outcome::Wait(Block::TmemAlloc { ncols }))
                }
            }
        }
        Coll::TmemDealloc { taddr, ncols } => {
            let (lane, col) = (taddr >> 16, taddr & 0xFFFF);
            let Some(pos) = w.ctas[cta].tmem_allocs.iter().position(|&a| a == (col, ncols)) else {
                return Err(inv(w, format!("taddr {taddr:#x} / nCols {ncols} is not an allocation of this CTA")));
            };
            if lane != 0 {
                return Err(inv(w, format!("taddr {taddr:#x} has a non-zero lane")));
            }
            for l in 0..LANES as u32 {
                for c in col..col + ncols {
                    let i = cell(l, c);
                    if w.sms[sm].writer[i] != 0 || w.sms[sm].readers[i] != 0 {
                        return Err(w.err_at(
                            me,
                            ErrorKind::Hazard,
                            format!("deallocates TMEM column {c} while an in-flight tcgen05 operation uses it"),
                        ));
                    }
                }
            }
            w.ctas[cta].tmem_allocs.remove(pos);
            for u in col / 32..(col + ncols) / 32 {
                w.sms[sm].owner[u as usize] = None;
            }
            Ok(none())
        }
        Coll::TmemRelinquish => {
            w.ctas[cta].tmem_relinquished = true;
            Ok(none())
        }
        Coll::TmemLd16x256b { taddr, num } => {
            let (l0, c0) = (taddr >> 16, taddr & 0xFFFF);
            let quarter = (w.threads[me].tid / 32) % 4;
            if l0 < 32 * quarter || l0 + 16 > 32 * quarter + 32 {
                return Err(inv(
                    w,
                    format!(
                        "lanes {l0}..{} are outside warp {}'s TMEM lanes {}..{} (PTX ISA 9.0 §9.7.16.8.1)",
                        l0 + 16,
                        w.threads[me].tid / 32,
                        32 * quarter,
                        32 * quarter + 32
                    ),
                ));
            }
            check_owned(w, cta, c0, 8 * num).map_err(|m| inv(w, m))?;
            for l in l0..l0 + 16 {
                for c in c0..c0 + 8 * num {
                    let wr = w.sms[sm].writer[cell(l, c)];
                    if wr != 0 {
                        let d = crate::smem::op_desc(w, wr);
                        return Err(w.err_at(
                            me,
                            ErrorKind::Hazard,
                            format!("reads TMEM lane {l} column {c}, which in-flight {d} writes"),
                        ));
                    }
                }
            }
            if w.cfg.strict {
                strict_written(w, sm, l0..l0 + 16, c0..c0 + 8 * num)
                    .map_err(|m| strict_error(w, me, "tcgen05.ld.16x256b", m))?;
            }
            let cells = &w.sms[sm].cells;
            let outs = mem
                .iter()
                .map(|&t| {
                    let lane = w.threads[t].tid % 32;
                    let (q, p) = (lane / 4, lane % 4);
                    let mut r = Vec::with_capacity(4 * num as usize);
                    for j in 0..num {
                        let col = c0 + 8 * j + 2 * p;
                        r.push(cells[cell(l0 + q, col)]);
                        r.push(cells[cell(l0 + q, col + 1)]);
                        r.push(cells[cell(l0 + q + 8, col)]);
                        r.push(cells[cell(l0 + q + 8, col + 1)]);
                    }
                    r
                })
                .collect();
            Ok(Outcome::Outputs(outs))
        }
        _ => unreachable!("not a tcgen05 collective"),
    }
}

fn warp_instr(name: &'static str, site: &'static Location<'static>, key: Coll) -> Vec<u32> {
    instr(name, site, true, move |w, me| {
        require_arch(w, me, Arch::Sm100a)?;
        if !matches!(key, Coll::TmemRelinquish) {
            tc_issue(w, me, name)?;
        }
        collective(w, me, Scope::Warp, key.clone(), u32::MAX, Vec::new())
    })
}

/// `tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [dst], ncols;` One full warp.
#[track_caller]
pub fn alloc(dst: u32, ncols: u32) {
    warp_instr(
        "tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32",
        Location::caller(),
        Coll::TmemAlloc { dst, ncols },
    );
}

/// `tcgen05.dealloc.cta_group::1.sync.aligned.b32 taddr, ncols;` One full warp.
#[track_caller]
pub fn dealloc(taddr: u32, ncols: u32) {
    warp_instr("tcgen05.dealloc.cta_group::1.sync.aligned.b32", Location::caller(), Coll::TmemDealloc { taddr, ncols });
}

/// `tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;` One full warp.
#[track_caller]
pub fn relinquish_alloc_permit() {
    warp_instr("tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned", Location::caller(), Coll::TmemRelinquish);
}

/// `tcgen05.ld.sync.aligned.16x256b.xN.b32 {r..}, [taddr]; tcgen05.wait::ld.sync.aligned;` with
/// N = `num` (a power of two up to 32): `4·num` registers per lane. One full warp.
#[track_caller]
pub fn ld_16x256b(taddr: u32, num: u32) -> Vec<u32> {
    let site = Location::caller();
    if !num.is_power_of_two() || num > 32 {
        crate::exec::raise(ErrorKind::InvalidOperand, site, "tcgen05.ld.16x256b", format!(".x{num} is not x1..x32"));
    }
    warp_instr("tcgen05.ld.sync.aligned.16x256b", site, Coll::TmemLd16x256b { taddr, num })
}

/// `tcgen05.ld.sync.aligned.16x256b.x16.b32` + `tcgen05.wait::ld.sync.aligned` (64 registers).
#[track_caller]
pub fn ld_16x256b_x16(taddr: u32) -> [u32; 64] {
    let v = ld_16x256b(taddr, 16);
    v.try_into().expect("64 registers")
}

/// A decoded tcgen05 shared-memory descriptor (Table 40, §9.7.16.4.1).
#[derive(Clone, Copy, Debug)]
struct Desc {
    start: u32,
    lbo: u32,
    sbo: u32,
    swizzle: Swizzle,
}

fn decode_desc(d: u64) -> Result<Desc, (ErrorKind, String)> {
    let field = |s: u32| (((d >> s) & 0x3FFF) as u32) << 4;
    if (d >> 46) & 7 != 1 {
        return Err((ErrorKind::InvalidOperand, format!("descriptor {d:#x}: bits 46-48 must be 0b001")));
    }
    if d & (0x3 << 14 | 0x3 << 30 | 0xFF << 53) != 0 {
        return Err((ErrorKind::InvalidOperand, format!("descriptor {d:#x} sets reserved bits")));
    }
    if (d >> 49) & 7 != 0 {
        return Err((ErrorKind::Unimplemented, format!("descriptor {d:#x}: a non-zero base offset is not modelled")));
    }
    if (d >> 52) & 1 != 0 {
        return Err((ErrorKind::InvalidOperand, format!("descriptor {d:#x}: the absolute LBO mode is sm_103a only")));
    }
    let swizzle = match d >> 61 {
        0 => Swizzle::None,
        2 => Swizzle::B128,
        4 => Swizzle::B64,
        6 => Swizzle::B32,
        1 => return Err((ErrorKind::Unimplemented, "the 128-byte swizzle with 32-byte atoms is not modelled".into())),
        c => return Err((ErrorKind::InvalidOperand, format!("swizzle code {c} is invalid"))),
    };
    Ok(Desc { start: field(0), lbo: field(16), sbo: field(32), swizzle })
}

/// A K-major canonical layout of PTX ISA 9.0 §9.7.16.3.3 ("Canonical Layouts"), in 16-byte units
/// `T`: `Swizzle<B,4,3> o ((8,m),(T,2k)):((rT,SBO),(1,U))`. `r` (the row stride of one 8-row core
/// matrix) and `B` are 1 and 0 without swizzle, 2/1, 4/2 and 8/3 for the 32, 64 and 128-byte
/// swizzles; `U`, the step between the two 16-byte units of a row's K = 64 slice, is LBO without
/// swizzle and one unit (`T`) with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CanonicalKMajor {
    /// Row stride inside an 8-row group, in 16-byte units.
    row_units: u32,
    /// `B` of `Swizzle<B,4,3>`.
    swizzle_bits: u32,
}

/// The table row of §9.7.16.3.3 for a descriptor's swizzle mode (K-major).
fn canonical_k_major(s: Swizzle) -> CanonicalKMajor {
    match s {
        Swizzle::None => CanonicalKMajor { row_units: 1, swizzle_bits: 0 },
        Swizzle::B32 => CanonicalKMajor { row_units: 2, swizzle_bits: 1 },
        Swizzle::B64 => CanonicalKMajor { row_units: 4, swizzle_bits: 2 },
        Swizzle::B128 => CanonicalKMajor { row_units: 8, swizzle_bits: 3 },
    }
}

/// CuTe's `Swizzle<B, M, S>` (the functor §9.7.16.3.3 names) applied to a byte address: the `B`
/// bits at `M + S` are XORed into the `B` bits at `M`.
const fn cute_swizzle(b: u32, m: u32, s: u32, x: u32) -> u32 {
    let yyy = ((1 << b) - 1) << (m + s);
    x ^ ((x & yyy) >> s)
}

/// Shared address of 16-byte unit `u` (along K) of row `r` of a K-major operand: the canonical
/// layout of §9.7.16.3.3 evaluated at `(r, u)` from the descriptor's start, SBO and LBO, then
/// swizzled as an absolute address (base offset 0, which the descriptor decode requires). Written
/// from the ISA's table, not from the TMA's [`Swizzle::apply`]; `tests::canonical_layout_reads_what_the_tma_wrote`
/// checks that the two agree.
fn canonical_k_major_unit(d: &Desc, r: u32, u: u32) -> u32 {
    let c = canonical_k_major(d.swizzle);
    let unit_step = if d.swizzle == Swizzle::None { d.lbo } else { 16 };
    let offset = (r % 8) * c.row_units * 16 + (r / 8) * d.sbo + u * unit_step;
    cute_swizzle(c.swizzle_bits, 4, 3, d.start + offset)
}

/// A rule of strict mode: why a value the ISA allows is rejected, with its source.
fn strict_error(w: &World, me: usize, what: &str, rule: String) -> ModelError {
    w.err_at(
        me,
        ErrorKind::InvalidOperand,
        format!(
            "{what}: {rule} (strict mode: a value no hardware-proven kernel uses; LaunchConfig::strict = false \
             applies the PTX ISA's rules only)"
        ),
    )
}

/// Strict mode, a swizzled K-major MMA operand descriptor:
/// - LBO 0 (the seed, which ran on a B200) or 16 bytes (field 1: CUTLASS `make_umma_desc<K>`; PTX
///   ISA 9.0 §9.7.16.3.3: "1 (assumed)"); the ISA says the field is not used for these layouts,
///   so any value would pass unnoticed otherwise;
/// - SBO = 8 rows × the swizzle span (1024 bytes for 128B: 8-row groups packed densely, the seed's
///   and CUTLASS's `Layout_K_SW128_Atom` tiles);
/// - the start address inside the first row of a pattern-aligned atom, at a multiple of 32 bytes
///   (the atom start plus `32·k` for K step `k`: the seed's and CUTLASS's `DescriptorIterator`).
fn strict_operand(d: &Desc) -> Result<(), String> {
    if d.swizzle == Swizzle::None {
        return Ok(());
    }
    if d.lbo != 0 && d.lbo != 16 {
        return Err(format!(
            "LBO {} bytes in a swizzled K-major descriptor: hardware-proven kernels write 0 (the seed) or 16 (CUTLASS)",
            d.lbo
        ));
    }
    let span = d.swizzle.span();
    if d.sbo != 8 * span {
        return Err(format!(
            "SBO {} bytes: {:?} tiles of hardware-proven kernels use 8 × {span} = {}",
            d.sbo,
            d.swizzle,
            8 * span
        ));
    }
    let inside = d.start % d.swizzle.repeat();
    if inside >= span || inside % 32 != 0 {
        return Err(format!(
            "start address {:#x} is {inside} bytes into its {}-byte swizzle atom: hardware-proven kernels start at the \
             atom plus 32·k (k < {})",
            d.start,
            d.swizzle.repeat(),
            span / 32
        ));
    }
    Ok(())
}

/// Strict mode, the source descriptor of `tcgen05.cp.32x128b.warpx4`: LBO 0 and SBO 128 (32 rows of
/// 16 bytes packed densely: the seed's and GN's scale descriptor; CUTLASS's 512-byte scale-factor
/// atom has the same rows). With one 16-byte column the ISA gives LBO no meaning.
fn strict_scale_source(d: &Desc) -> Result<(), String> {
    if d.lbo != 0 {
        return Err(format!("LBO {} bytes in the scale-copy descriptor: the seed writes 0", d.lbo));
    }
    if d.sbo != 128 {
        return Err(format!("SBO {} bytes in the scale-copy descriptor: 32 dense 16-byte rows have SBO 128", d.sbo));
    }
    Ok(())
}

/// Strict mode, TMEM contents: every cell of `lanes × cols` was written (by `tcgen05.cp` or an
/// MMA) since its columns were allocated. Unwritten TMEM holds whatever its previous owner left;
/// the seed and CUTLASS read only the scales they copied and the accumulator their MMAs wrote
/// (and an MMA with `enable-input-d` only an accumulator an earlier MMA wrote).
fn strict_written(w: &World, sm: usize, lanes: std::ops::Range<u32>, cols: std::ops::Range<u32>) -> Result<(), String> {
    for l in lanes {
        for c in cols.clone() {
            if !w.sms[sm].written[cell(l, c)] {
                return Err(format!("TMEM lane {l} column {c} was not written since its allocation"));
            }
        }
    }
    Ok(())
}

/// Strict mode, TMEM columns: scale factors (a `tcgen05.cp` destination, the MMA's `[sfa]`,
/// `[sfb]`) at a multiple of 4 columns (the seed's plan, BLOCK_N + 4k and SFA + 16 + 4k or + 8k;
/// CUTLASS's SFA right after the accumulators and SFB right after SFA, one group of 4 or 8 columns
/// per MMA's K block, `tmem_sf_frg`), and the accumulator at a multiple of 32 (an allocation
/// granule, §9.7.16.7.1: the seed and CUTLASS place it at the allocation base).
fn strict_columns(what: &str, col: u32, multiple: u32) -> Result<(), String> {
    if col % multiple != 0 {
        return Err(format!("{what} at TMEM column {col}, not a multiple of {multiple}"));
    }
    Ok(())
}

/// Resolves, checks and marks the shared-memory units of a K-major operand of `rows` rows and
/// `units` 16-byte units per row; returns their offsets (row-major).
#[allow(clippy::too_many_arguments)]
fn operand_units(
    w: &mut World,
    me: usize,
    cta: usize,
    d: &Desc,
    rows: u32,
    units: u32,
    what: &str,
    reads: &mut Vec<(usize, u32, u32)>,
) -> Result<Vec<u32>, ModelError> {
    if d.swizzle != Swizzle::None && 16 * units > d.swizzle.span() {
        return Err(w.err_at(me, ErrorKind::Unimplemented, format!("{what}: a K extent wider than the swizzle span")));
    }
    let mut offs = Vec::with_capacity((rows * units) as usize);
    for r in 0..rows {
        for u in 0..units {
            let addr = canonical_k_major_unit(d, r, u);
            let off = cta_offset(w, addr, 16, 16)
                .map_err(|m| w.err_at(me, ErrorKind::InvalidOperand, format!("{what} row {r}: {m}")))?;
            check_async_read(w, cta, off, 16).map_err(|m| w.err_at(me, ErrorKind::Hazard, format!("{what}: {m}")))?;
            check_published(w, &[me], cta, off, 16)
                .map_err(|m| w.err_at(me, ErrorKind::Hazard, format!("{what}: {m}")))?;
            offs.push(off);
        }
    }
    for &off in &offs {
        mark_read(w, cta, off, 16);
        reads.push((cta, off, 16));
    }
    Ok(offs)
}

fn push(w: &mut World, me: usize, id: u32, what: String, deps: Vec<u32>, reads: Vec<(usize, u32, u32)>, op: Op) {
    let site = w.threads[me].site;
    w.push_op(crate::asyncop::AsyncOp {
        id,
        issuer: me,
        site,
        what,
        deps,
        smem_reads: reads,
        kind: crate::asyncop::OpKind::Tcgen05(op),
    });
}

/// In-flight tcgen05 operations of thread `me` that `pred` selects.
fn own_ops(w: &World, me: usize, pred: impl Fn(&Op) -> bool) -> Vec<u32> {
    w.ops
        .iter()
        .filter(|o| o.issuer == me && matches!(&o.kind, crate::asyncop::OpKind::Tcgen05(op) if pred(op)))
        .map(|o| o.id)
        .collect()
}

/// `tcgen05.cp.cta_group::1.32x128b.warpx4 [taddr], s_desc;` One thread; asynchronous.
///
/// # Safety
/// None beyond the model's checks (kept `unsafe` like the device wrapper).
#[track_caller]
pub unsafe fn cp_32x128b_warpx4(taddr: u32, s_desc: u64) {
    instr("tcgen05.cp.cta_group::1.32x128b.warpx4", Location::caller(), true, |w, me| {
        require_arch(w, me, Arch::Sm100a)?;
        tc_issue(w, me, "tcgen05.cp")?;
        let (cta, sm) = sm_of(w, me);
        let d = decode_desc(s_desc).map_err(|(k, m)| w.err_at(me, k, m))?;
        if d.swizzle != Swizzle::None {
            return Err(w.err_at(me, ErrorKind::Unimplemented, "a swizzled tcgen05.cp source is not modelled"));
        }
        let (lane, col) = (taddr >> 16, taddr & 0xFFFF);
        if lane != 0 {
            return Err(w.err_at(
                me,
                ErrorKind::Unimplemented,
                format!("taddr {taddr:#x}: .warpx4 with a non-zero lane"),
            ));
        }
        check_owned(w, cta, col, 4).map_err(|m| w.err_at(me, ErrorKind::InvalidOperand, m))?;
        if w.cfg.strict {
            strict_scale_source(&d).map_err(|m| strict_error(w, me, "tcgen05.cp source", m))?;
            strict_columns("scale factors", col, 4).map_err(|m| strict_error(w, me, "tcgen05.cp", m))?;
        }
        let mut reads = Vec::new();
        let offs = operand_units(w, me, cta, &d, 32, 1, "tcgen05.cp source", &mut reads)?;
        for l in 0..LANES as u32 {
            for c in col..col + 4 {
                let i = cell(l, c);
                if w.sms[sm].readers[i] != 0 {
                    return Err(w.err_at(
                        me,
                        ErrorKind::Hazard,
                        format!(
                            "overwrites TMEM lane {l} column {c}, which an in-flight tcgen05.mma still reads \
                             (mma -> cp is not ordered, PTX ISA 9.0 §9.7.16.6.2)"
                        ),
                    ));
                }
                if w.sms[sm].writer[i] != 0 {
                    let o = crate::smem::op_desc(w, w.sms[sm].writer[i]);
                    return Err(w.err_at(
                        me,
                        ErrorKind::Hazard,
                        format!("writes TMEM lane {l} column {c}, which in-flight {o} also writes (cp -> cp is not ordered)"),
                    ));
                }
            }
        }
        let data = &w.ctas[cta].smem.data;
        let rows: Vec<[u32; 4]> = offs
            .iter()
            .map(|&o| {
                std::array::from_fn(|k| {
                    let b = o as usize + 4 * k;
                    u32::from_le_bytes([data[b], data[b + 1], data[b + 2], data[b + 3]])
                })
            })
            .collect();
        let id = w.op_id();
        for l in 0..LANES as u32 {
            for c in col..col + 4 {
                w.sms[sm].writer[cell(l, c)] = id;
            }
        }
        let what = format!("tcgen05.cp.32x128b.warpx4 smem dyn+{:#x} -> TMEM columns {col}..{}", offs[0], col + 4);
        push(w, me, id, what, Vec::new(), reads, Op::Cp { sm, cta, col, rows });
        Ok(Flow::Done(()))
    })
}

fn decode_e2m1(nib: u8) -> f64 {
    const MAG: [f64; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    let m = MAG[(nib & 7) as usize];
    if nib & 8 != 0 {
        -m
    } else {
        m
    }
}

/// UE4M3: 4 exponent bits (bias 7), 3 mantissa bits, no sign; 0x7F is NaN.
fn decode_ue4m3(b: u8) -> Result<f64, String> {
    if b & 0x80 != 0 {
        return Err(format!("scale byte {b:#04x} has bit 7 set, which UE4M3 does not have"));
    }
    let (e, m) = ((b >> 3) as i32, (b & 7) as f64);
    Ok(if e == 15 && m == 7.0 {
        f64::NAN
    } else if e == 0 {
        m / 8.0 * 2f64.powi(-6)
    } else {
        (1.0 + m / 8.0) * 2f64.powi(e - 7)
    })
}

/// `tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.scale_vec::4X [d], a_desc, b_desc, idesc,
/// [sfa], [sfb], enable_input_d;` One thread; asynchronous.
///
/// # Safety
/// None beyond the model's checks (kept `unsafe` like the device wrapper).
#[track_caller]
#[allow(clippy::too_many_arguments)]
pub unsafe fn mma_mxf4nvf4_4x(d: u32, a_desc: u64, b_desc: u64, idesc: u32, sfa: u32, sfb: u32, enable_input_d: bool) {
    instr("tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.scale_vec::4X", Location::caller(), true, |w, me| {
        require_arch(w, me, Arch::Sm100a)?;
        tc_issue(w, me, "tcgen05.mma")?;
        let (cta, sm) = sm_of(w, me);
        let bad = |w: &World, k: ErrorKind, m: String| w.err_at(me, k, format!("idesc {idesc:#010x}: {m}"));
        // Table 44 (kind::mxf4nvf4).
        let bits = |lo: u32, n: u32| (idesc >> lo) & ((1 << n) - 1);
        if bits(0, 2) != 0 || bits(3, 1) != 0 || bits(6, 1) != 0 || bits(12, 1) != 0 || bits(24, 3) != 0 {
            return Err(bad(w, ErrorKind::InvalidOperand, "reserved bits set".into()));
        }
        if bits(2, 1) != 0 {
            return Err(bad(w, ErrorKind::Unimplemented, "sparse MMA is not modelled".into()));
        }
        if bits(4, 2) != 0 || bits(29, 2) != 0 {
            return Err(bad(
                w,
                ErrorKind::InvalidOperand,
                "scale_vec::4X needs SFA_ID = SFB_ID = 0 (§9.7.16.10.7)".into(),
            ));
        }
        if bits(7, 3) != 1 || bits(10, 2) != 1 {
            return Err(bad(w, ErrorKind::InvalidOperand, "A and B types must be E2M1 (1)".into()));
        }
        if bits(15, 1) != 0 || bits(16, 1) != 0 {
            return Err(bad(w, ErrorKind::InvalidOperand, "kind::mxf4nvf4 has no transpose".into()));
        }
        if bits(23, 1) != 0 {
            return Err(bad(
                w,
                ErrorKind::Unimplemented,
                "UE8M0 scales with scale_vec::4X (allowed by Table 55) are not modelled".into(),
            ));
        }
        if bits(31, 1) != 0 {
            return Err(bad(w, ErrorKind::Unimplemented, "K = 96 is not modelled".into()));
        }
        let n = bits(17, 6) << 3;
        let m = bits(27, 2) << 7;
        if m != 128 {
            return Err(bad(w, ErrorKind::Unimplemented, format!("M = {m}: only M = 128 (cta_group::1) is modelled")));
        }
        if n == 0 || n > 256 {
            return Err(bad(w, ErrorKind::InvalidOperand, format!("N = {n} outside 8..=256")));
        }
        let (neg_a, neg_b) = (bits(13, 1) != 0, bits(14, 1) != 0);
        let inv = |w: &World, msg: String| w.err_at(me, ErrorKind::InvalidOperand, msg);
        for (name, t) in [("d", d), ("sfa", sfa), ("sfb", sfb)] {
            if t >> 16 != 0 {
                return Err(w.err_at(me, ErrorKind::Unimplemented, format!("[{name}] {t:#x} with a non-zero lane")));
            }
        }
        let (d_col, sfa_col, sfb_col) = (d & 0xFFFF, sfa & 0xFFFF, sfb & 0xFFFF);
        let sfb_cols = n.div_ceil(32);
        check_owned(w, cta, d_col, n).map_err(|e| inv(w, format!("[d]: {e}")))?;
        check_owned(w, cta, sfa_col, 4).map_err(|e| inv(w, format!("[sfa]: {e}")))?;
        check_owned(w, cta, sfb_col, sfb_cols).map_err(|e| inv(w, format!("[sfb]: {e}")))?;
        let ad = decode_desc(a_desc).map_err(|(k, e)| w.err_at(me, k, format!("a_desc: {e}")))?;
        let bd = decode_desc(b_desc).map_err(|(k, e)| w.err_at(me, k, format!("b_desc: {e}")))?;
        if w.cfg.strict {
            let mma = "tcgen05.mma";
            strict_operand(&ad).map_err(|m| strict_error(w, me, &format!("{mma} a_desc {a_desc:#x}"), m))?;
            strict_operand(&bd).map_err(|m| strict_error(w, me, &format!("{mma} b_desc {b_desc:#x}"), m))?;
            strict_columns("the accumulator [d]", d_col, 32).map_err(|m| strict_error(w, me, mma, m))?;
            strict_columns("SFA [sfa]", sfa_col, 4).map_err(|m| strict_error(w, me, mma, m))?;
            strict_columns("SFB [sfb]", sfb_col, 4).map_err(|m| strict_error(w, me, mma, m))?;
        }
        let mut reads = Vec::new();
        let a_units = operand_units(w, me, cta, &ad, 128, 2, "A operand", &mut reads)?;
        let b_units = operand_units(w, me, cta, &bd, n, 2, "B operand", &mut reads)?;
        // TMEM: scale cells may only be pending from this thread's cp (cp -> mma is pipelined);
        // the accumulator only from this thread's MMAs on the same accumulator and shape.
        let own_cps = own_ops(w, me, |o| matches!(o, Op::Cp { .. }));
        let same_acc =
            own_ops(w, me, |o| matches!(o, Op::Mma(x) if x.d_col == d_col && x.n == n && x.sm == sm && x.cta == cta));
        for (name, col, ncol) in [("SFA", sfa_col, 4), ("SFB", sfb_col, sfb_cols)] {
            for l in 0..LANES as u32 {
                for c in col..col + ncol {
                    let wr = w.sms[sm].writer[cell(l, c)];
                    if wr != 0 && !own_cps.contains(&wr) {
                        let o = crate::smem::op_desc(w, wr);
                        return Err(w.err_at(
                            me,
                            ErrorKind::Hazard,
                            format!("{name} TMEM lane {l} column {c} is being written by in-flight {o}, not ordered before this MMA"),
                        ));
                    }
                }
            }
        }
        for l in 0..LANES as u32 {
            for c in d_col..d_col + n {
                let i = cell(l, c);
                let wr = w.sms[sm].writer[i];
                if (wr != 0 && !same_acc.contains(&wr)) || w.sms[sm].readers[i] != 0 {
                    return Err(w.err_at(
                        me,
                        ErrorKind::Hazard,
                        format!("accumulator TMEM lane {l} column {c} is used by another in-flight operation"),
                    ));
                }
            }
        }
        let id = w.op_id();
        for l in 0..LANES as u32 {
            for c in d_col..d_col + n {
                w.sms[sm].writer[cell(l, c)] = id;
            }
            for c in (sfa_col..sfa_col + 4).chain(sfb_col..sfb_col + sfb_cols) {
                w.sms[sm].readers[cell(l, c)] += 1;
            }
        }
        let mut deps = own_cps;
        deps.extend(same_acc);
        let what = format!(
            "tcgen05.mma mxf4nvf4 4X M=128 N={n} D cols {d_col}.. A dyn+{:#x} B dyn+{:#x} SFA col {sfa_col} SFB col {sfb_col}{}",
            a_units[0],
            b_units[0],
            if enable_input_d { " (accumulate)" } else { "" }
        );
        let op =
            Mma { sm, cta, d_col, n, a_units, b_units, sfa_col, sfb_col, accumulate: enable_input_d, neg_a, neg_b };
        push(w, me, id, what, deps, reads, Op::Mma(Box::new(op)));
        Ok(Flow::Done(()))
    })
}

fn commit_impl(name: &'static str, site: &'static Location<'static>, bar: u32, mask: Option<u16>) {
    instr(name, site, true, |w, me| {
        require_arch(w, me, Arch::Sm100a)?;
        let inv = |w: &World, m: String| w.err_at(me, ErrorKind::InvalidOperand, m);
        let (bar_cta, off) = cluster_target(w, me, bar, 8, 8).map_err(|m| inv(w, m))?;
        let bars: Vec<(usize, u32)> = match mask {
            None => vec![(bar_cta, off)],
            Some(mask) => {
                if mask == 0 || (mask as u32) >> w.cfg.cluster != 0 {
                    return Err(inv(w, format!("ctaMask {mask:#x} names CTAs outside a cluster of {}", w.cfg.cluster)));
                }
                let c = w.threads[me].cta;
                (0..w.cfg.cluster)
                    .filter(|r| mask >> r & 1 == 1)
                    .map(|r| (w.cta_of_rank(c, r).expect("rank"), off))
                    .collect()
            }
        };
        for &(c, o) in &bars {
            check_visible(w, c, o, "tcgen05.commit").map_err(|m| inv(w, m))?;
        }
        let deps = own_ops(w, me, |o| !matches!(o, Op::Commit { .. }));
        let id = w.op_id();
        let what =
            format!("{name} -> mbarrier dyn+{off:#x} of CTA(s) {:?}", bars.iter().map(|b| b.0).collect::<Vec<_>>());
        push(w, me, id, what, deps, Vec::new(), Op::Commit { bars });
        Ok(Flow::Done(()))
    })
}

/// `tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [bar];` One thread.
#[track_caller]
pub fn commit(bar: u32) {
    commit_impl("tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64", Location::caller(), bar, None)
}

/// `tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.multicast::cluster.b64 [bar],
/// ctaMask;` One thread.
#[track_caller]
pub fn commit_multicast(bar: u32, cta_mask: u16) {
    commit_impl(
        "tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.multicast::cluster.b64",
        Location::caller(),
        bar,
        Some(cta_mask),
    )
}

/// Completion of a tcgen05 operation (called by the scheduler).
pub(crate) fn complete_op(w: &mut World, id: u32, what: &str, op: Op) -> Result<(), ModelError> {
    match op {
        Op::Cp { sm, col, rows, .. } => {
            for (r, words) in rows.iter().enumerate() {
                for quarter in 0..4 {
                    let lane = (32 * quarter + r) as u32;
                    for (k, &v) in words.iter().enumerate() {
                        let i = cell(lane, col + k as u32);
                        w.sms[sm].cells[i] = v;
                        w.sms[sm].written[i] = true;
                        if w.sms[sm].writer[i] == id {
                            w.sms[sm].writer[i] = 0;
                        }
                    }
                }
            }
            Ok(())
        }
        Op::Commit { bars } => {
            for (c, o) in bars {
                // A commit's arrival orders the waiter after the committed operations.
                let order = TcOrder { via: what.to_string(), from: vec![usize::MAX], unfenced_by: None };
                tc_add(w, c, o, Some(order));
                arrive_on(w, c, o, 1)
                    .map_err(|m| w.err(ErrorKind::InvalidOperand, format!("completing #{id} {what}: {m}")))?;
            }
            Ok(())
        }
        Op::Mma(m) => {
            let fail =
                |w: &World, msg: String| w.err(ErrorKind::InvalidOperand, format!("completing #{id} {what}: {msg}"));
            let sfb_cols = m.n.div_ceil(32);
            if w.cfg.strict {
                let read = |col, n| strict_written(w, m.sm, 0..LANES as u32, col..col + n);
                let mut checks = vec![("SFA", read(m.sfa_col, 4)), ("SFB", read(m.sfb_col, sfb_cols))];
                if m.accumulate {
                    checks.push(("the accumulator (enable-input-d)", read(m.d_col, m.n)));
                }
                for (part, r) in checks {
                    if let Err(e) = r {
                        return Err(w.err(
                            ErrorKind::InvalidOperand,
                            format!(
                                "completing #{id} {what}: {part}: {e} (strict mode: a value no hardware-proven kernel \
                                 uses; LaunchConfig::strict = false applies the PTX ISA's rules only)"
                            ),
                        ));
                    }
                }
            }
            let tm = &w.sms[m.sm];
            // Scale factors: row r's copy in quarter p is the cell (32p + r % 32, col + r / 32).
            let scale = |col: u32, row: u32, quarter: u32| tm.cells[cell(32 * quarter + row % 32, col + row / 32)];
            for row in 0..128 {
                let v = scale(m.sfa_col, row, 0);
                if (1..4).any(|p| scale(m.sfa_col, row, p) != v) {
                    return Err(fail(
                        w,
                        format!("SFA of row {row} is not duplicated to all four 32-lane partitions (§9.7.16.10.7)"),
                    ));
                }
            }
            for col in 0..m.n {
                let v = scale(m.sfb_col, col, 0);
                if (1..4).any(|p| scale(m.sfb_col, col, p) != v) {
                    return Err(fail(
                        w,
                        format!("SFB of column {col} is not duplicated to all four 32-lane partitions (§9.7.16.10.7)"),
                    ));
                }
            }
            let dec = |bytes: &[u8], units: &[u32], r: usize, neg: bool| -> [f64; 64] {
                std::array::from_fn(|k| {
                    let off = units[2 * r + k / 32] as usize + (k % 32) / 2;
                    let b = bytes[off];
                    let v = decode_e2m1(if k % 2 == 0 { b & 0xF } else { b >> 4 });
                    if neg {
                        -v
                    } else {
                        v
                    }
                })
            };
            let smem = &w.ctas[m.cta].smem.data;
            let mut sa = vec![[0f64; 4]; 128];
            for (row, s) in sa.iter_mut().enumerate() {
                let word = scale(m.sfa_col, row as u32, 0);
                for (blk, x) in s.iter_mut().enumerate() {
                    *x = decode_ue4m3((word >> (8 * blk)) as u8).map_err(|e| fail(w, format!("SFA row {row}: {e}")))?;
                }
            }
            let mut sb = vec![[0f64; 4]; m.n as usize];
            for (col, s) in sb.iter_mut().enumerate() {
                let word = scale(m.sfb_col, col as u32, 0);
                for (blk, x) in s.iter_mut().enumerate() {
                    *x = decode_ue4m3((word >> (8 * blk)) as u8)
                        .map_err(|e| fail(w, format!("SFB column {col}: {e}")))?;
                }
            }
            let a: Vec<[f64; 64]> = (0..128).map(|r| dec(smem, &m.a_units, r, m.neg_a)).collect();
            let b: Vec<[f64; 64]> = (0..m.n as usize).map(|r| dec(smem, &m.b_units, r, m.neg_b)).collect();
            let _ = sfb_cols;
            let mut out = vec![0u32; 128 * m.n as usize];
            for row in 0..128 {
                for col in 0..m.n as usize {
                    let mut s = if m.accumulate {
                        f32::from_bits(tm.cells[cell(row as u32, m.d_col + col as u32)]) as f64
                    } else {
                        0.0
                    };
                    for k in 0..64 {
                        s += a[row][k] * sa[row][k / 16] * b[col][k] * sb[col][k / 16];
                    }
                    out[row * m.n as usize + col] = (s as f32).to_bits();
                }
            }
            let tm = &mut w.sms[m.sm];
            for row in 0..128u32 {
                for col in 0..m.n {
                    let i = cell(row, m.d_col + col);
                    tm.cells[i] = out[(row * m.n + col) as usize];
                    tm.written[i] = true;
                    if tm.writer[i] == id {
                        tm.writer[i] = 0;
                    }
                }
                for c in (m.sfa_col..m.sfa_col + 4).chain(m.sfb_col..m.sfb_col + m.n.div_ceil(32)) {
                    tm.readers[cell(row, c)] -= 1;
                }
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor_map::{decode, encode_tiled, gather_box, ElementType, Interleave, OobFill};

    /// For every swizzle mode: a box the TMA placed in shared memory (`gather_box`, which moves
    /// 16-byte chunks with [`Swizzle::apply`]) read back through the MMA's canonical layout
    /// (`canonical_k_major_unit`, from the §9.7.16.3.3 table) at every K = 64 step of the row, at
    /// several pattern-aligned destinations: every 16-byte unit must be the global bytes of its
    /// row and K position. Without swizzle the box is one 16-byte unit wide (the scale blocks
    /// `tcgen05.cp` reads); the 128-byte mode runs with both byte and packed 4-bit elements.
    #[test]
    fn canonical_layout_reads_what_the_tma_wrote() {
        let modes = [
            (Swizzle::None, ElementType::U8, 16u32),
            (Swizzle::B32, ElementType::U8, 32),
            (Swizzle::B64, ElementType::U8, 64),
            (Swizzle::B128, ElementType::U8, 128),
            (Swizzle::B128, ElementType::U4x16Align8, 128),
        ];
        for (swizzle, element, row_bytes) in modes {
            let rows = 24u32;
            let stride = row_bytes as u64 + 48;
            let mut backing = vec![0u128; (rows as usize * stride as usize).div_ceil(16)];
            let base = backing.as_mut_ptr() as u64;
            // SAFETY: `backing` holds `rows · stride` bytes.
            let global = unsafe { std::slice::from_raw_parts_mut(base as *mut u8, rows as usize * stride as usize) };
            for (i, b) in global.iter_mut().enumerate() {
                *b = ((i * 131 + i / 251) % 253) as u8 + 1;
            }
            let elems = row_bytes * 8 / element.bits();
            let map = encode_tiled(
                element,
                2,
                base,
                &[elems as u64, rows as u64],
                &[stride],
                &[elems, rows],
                &[1, 1],
                Interleave::None,
                swizzle,
                OobFill::Zero,
            )
            .expect("a valid map");
            let desc = decode(&map).expect("the model's map");
            let repeat = swizzle.repeat().max(16);
            for dst in [0x400, 0x400 + repeat, 0x8000 + 3 * repeat] {
                // SAFETY: the map describes `backing`.
                let img = unsafe { gather_box(&desc, &[0, 0], dst) }.expect("box");
                let (steps, units) = if swizzle == Swizzle::None { (1, 1) } else { (row_bytes / 32, 2) };
                for k in 0..steps {
                    let lbo = if swizzle == Swizzle::None { 0 } else { 16 };
                    let d = Desc { start: dst + 32 * k, lbo, sbo: 8 * row_bytes, swizzle };
                    for r in 0..rows {
                        for u in 0..units {
                            let at = (canonical_k_major_unit(&d, r, u) - dst) as usize;
                            let logical = (r as u64 * stride) as usize + (32 * k + 16 * u) as usize;
                            assert_eq!(
                                img[at..at + 16],
                                global[logical..logical + 16],
                                "{swizzle:?} {element:?} destination {dst:#x}, K step {k}, row {r}, unit {u}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// The table's `Swizzle<B,4,3>` is the TMA's address-bit swizzle for every address of a
    /// pattern repeat (the two are written separately; this is where they meet bit for bit).
    #[test]
    fn cute_swizzle_matches_the_tma_swizzle() {
        for s in [Swizzle::None, Swizzle::B32, Swizzle::B64, Swizzle::B128] {
            let b = canonical_k_major(s).swizzle_bits;
            for addr in (0..4 * 1024).step_by(16) {
                assert_eq!(cute_swizzle(b, 4, 3, addr), s.apply(addr), "{s:?} {addr:#x}");
            }
        }
    }

    /// Strict mode's descriptor rules accept exactly the seed's and CUTLASS's values.
    #[test]
    fn strict_operand_rules() {
        let d = |start, lbo, sbo, swizzle| Desc { start, lbo, sbo, swizzle };
        for k in 0..4 {
            assert_eq!(strict_operand(&d(0x8000 + 32 * k, 0, 1024, Swizzle::B128)), Ok(()));
            assert_eq!(strict_operand(&d(0x8000 + 32 * k, 16, 1024, Swizzle::B128)), Ok(()));
        }
        assert!(strict_operand(&d(0x8000, 4096, 1024, Swizzle::B128)).is_err());
        assert!(strict_operand(&d(0x8000, 0, 1040, Swizzle::B128)).is_err());
        assert!(strict_operand(&d(0x8080, 0, 1024, Swizzle::B128)).is_err());
        assert!(strict_operand(&d(0x8010, 0, 1024, Swizzle::B128)).is_err());
        assert_eq!(strict_operand(&d(0x8000 + 32, 0, 512, Swizzle::B64)), Ok(()));
        assert!(strict_operand(&d(0x8000 + 64, 0, 512, Swizzle::B64)).is_err());
        assert_eq!(strict_scale_source(&d(0x8000, 0, 128, Swizzle::None)), Ok(()));
        assert!(strict_scale_source(&d(0x8000, 16, 128, Swizzle::None)).is_err());
        assert!(strict_scale_source(&d(0x8000, 0, 144, Swizzle::None)).is_err());
        assert_eq!(strict_columns("x", 148, 4), Ok(()));
        assert!(strict_columns("x", 149, 4).is_err());
        assert!(strict_columns("x", 16, 32).is_err());
    }
}
