//! `sm90_grouped_gemm`: persistent, warp-specialized swap-AB GEMM over all tiles of all groups.
//!
//! CTA = 3 warpgroups (4 in `sm90_grouped_gemm_n192`; two consumer warpgroups and two producer
//! warps in the decode variant). Warpgroup 0 is the producer (two threads in different warps issue
//! the TMAs, see [`ProducerRole`]); the others are consumers, each owning 64 of the tile's 128
//! (192) weight rows. Per stage of 128 K values (256 in the decode variant, `GemmConfig::chunks`)
//! the producers load, completing on `full[stage]`:
//! - per 64-chunk, a `block_m × 64` f16 token box (128-byte swizzle) from the workspace (past K,
//!   zeros),
//! - per two chunks, a `block_n × 64`-byte box of packed weights (64-byte swizzle),
//! - the weights' scale blocks (per 128-row block of B's scales the tile's rows lie in, one
//!   contiguous 512-byte block per chunk, bulk copy).
//!
//! Consumers wait on `full[stage]`, and per chunk: load 8 bytes (16 e2m1 = one scale block) of each
//! of their two weight rows, decode to f16 and multiply by the block scale (exact), which gives the
//! A fragments of 4 wgmma k-steps; then `wgmma m64n128k16` against the token tile. After the stage
//! each consumer warp arrives on `empty[stage]` so the producer can refill it.
//! The epilogue scales by alpha, rounds once to f16/bf16, turns the tile into C's orientation in a
//! shared-memory buffer per warpgroup (`stmatrix .trans`) and copies whole token rows to C in
//! 16-byte stores, masking rows ≥ M and columns ≥ N.

use crate::pipeline::{Barriers, Consumer, Producer, Scope, Stage};
use crate::ptx::mbarrier::Mbarrier;
use crate::ptx::smem::{self, SmemAddr};
use crate::ptx::wgmma::MmaShape;
use crate::ptx::{barrier, convert, fence, gmem, sreg, tma, warp, wgmma};
use crate::work::WorkCursor;
use nvfp4_gemm_abi::scale_layout::{rest_k, BLOCK_BYTES as SCALE_BLOCK_BYTES};
use nvfp4_gemm_abi::sm90::*;

// A consumer's stage code is unrolled over at most 4 chunks; the weight fragment offsets of a
// tile are computed for the two chunks of a box.
const _: () = {
    let mut i = 0;
    while i < GemmConfig::ALL.len() {
        assert!(GemmConfig::ALL[i].chunks <= 4 && GemmConfig::ALL[i].chunks % CHUNKS_PER_BOX == 0);
        i += 1;
    }
    assert!(CHUNKS_PER_BOX == 2);
};
type Work<'a> = WorkCursor<'a, GroupParams>;

/// A compiled variant of the kernel: its configuration (tile heights, stages, shared memory) and
/// the wgmma width of its narrow tiles (`CFG.narrow`).
trait Variant {
    const CFG: GemmConfig;
    type Narrow: MmaShape;
    /// The wgmma width of its full tiles (`CFG.block_m`).
    type Wide: MmaShape;
    /// `setmaxnreg.inc` to the consumers' share ([`GemmConfig::consumer_registers`]; a constant of
    /// each variant, as the instruction takes an immediate).
    fn grow_registers() {
        warp::setmaxnreg_inc::<CONSUMER_REGISTERS>();
    }
    /// `setmaxnreg.dec` to the producer's share ([`GemmConfig::producer_registers`]).
    fn shrink_registers() {
        warp::setmaxnreg_dec::<PRODUCER_REGISTERS>();
    }
    /// Whether a consumer loads a chunk's weights and scales before decoding the previous one
    /// (their latencies overlap the decode) or just before decoding it, and reads the group's
    /// parameters again for the epilogue instead of keeping them through the K loop (registers
    /// fewer, for a variant whose consumers have less than 176).
    const EAGER_LOADS: bool = true;
}

/// 16- and 128-token tiles, 5 stages, one CTA per SM.
struct General;
impl Variant for General {
    const CFG: GemmConfig = GemmConfig::M128;
    type Narrow = wgmma::N16;
    type Wide = wgmma::N128;
}

/// 128-token tiles whose group's last tile runs 64 wide when its rows fit, 5 stages, one CTA per SM.
struct Tail64;
impl Variant for Tail64 {
    const CFG: GemmConfig = GemmConfig::M128_64;
    type Narrow = wgmma::N64;
    type Wide = wgmma::N128;
}

/// 192 weight rows (three consumer warpgroups) × 128-token tiles, the group's last tile 64 wide
/// when its rows fit, 4 stages, one CTA per SM.
struct Rows192;
impl Variant for Rows192 {
    const CFG: GemmConfig = GemmConfig::N192;
    type Narrow = wgmma::N64;
    type Wide = wgmma::N128;
    fn grow_registers() {
        warp::setmaxnreg_inc::<{ GemmConfig::N192.consumer_registers() }>();
    }
    fn shrink_registers() {
        warp::setmaxnreg_dec::<{ GemmConfig::N192.producer_registers() }>();
    }
    const EAGER_LOADS: bool = false;
}

/// 16-token tiles only, 4 stages of 256 K, two CTAs per SM.
struct Decode;
impl Variant for Decode {
    const CFG: GemmConfig = GemmConfig::M16;
    type Narrow = wgmma::N16;
    type Wide = wgmma::N16;
    const EAGER_LOADS: bool = false;
}

const _: () = assert!(GemmConfig::M128.narrow == 16 && GemmConfig::M128_64.narrow == 64);
const _: () = assert!(GemmConfig::M16.narrow == 16 && GemmConfig::M16.block_m == 16);
const _: () = {
    assert!(<General as Variant>::Wide::N == GemmConfig::M128.block_m);
    assert!(<Tail64 as Variant>::Wide::N == GemmConfig::M128_64.block_m);
    assert!(<Rows192 as Variant>::Wide::N == GemmConfig::N192.block_m);
    assert!(<Decode as Variant>::Wide::N == GemmConfig::M16.block_m);
};
const _: () = assert!(GemmConfig::N192.narrow == 64 && GemmConfig::N192.block_m == 128);

/// The CTA's dynamic shared memory as `V::CFG` lays it out.
struct Smem<V> {
    base: SmemAddr,
    variant: core::marker::PhantomData<V>,
}

impl<V: Variant> Smem<V> {
    /// Stage `s` (1024-byte aligned).
    #[inline(always)]
    fn stage(&self, s: u32) -> SmemAddr {
        self.base.add(V::CFG.stage_offset(s))
    }
    #[inline(always)]
    fn full(&self) -> Barriers {
        Barriers::at(self.base.add(V::CFG.full_barrier_offset(0)))
    }
    #[inline(always)]
    fn empty(&self) -> Barriers {
        Barriers::at(self.base.add(V::CFG.empty_barrier_offset(0)))
    }
    /// Consumer warpgroup `cw`'s epilogue buffer.
    #[inline(always)]
    fn epilogue(&self, cw: u32) -> SmemAddr {
        self.base.add(V::CFG.epilogue_buffer_offset(cw))
    }
}

/// Named barrier of consumer warpgroup 0's epilogue buffer; warpgroup `cw` uses `+ cw` (ids 1..=3;
/// 0 is the CTA barrier).
const EPILOGUE_BARRIER: u32 = 1;

/// See the module docs. Launch: `nvfp4_gemm_abi::sm90::gemm_launch(GemmConfig::M128, ..)`
/// (`THREADS` threads, `M128.dynamic_shared_memory()` bytes, a persistent grid of at most one CTA
/// per SM).
///
/// # Safety
/// `p` and the tables it points to must be what the host's sm90 plan writes for validated buffers.
#[crate::ptx::kernel]
pub unsafe fn sm90_grouped_gemm(p: KernelParams) {
    // SAFETY: the caller's contract.
    unsafe { run::<General, { GemmConfig::M128.stages }>(&p) }
}

/// The 64/128 variant: as [`sm90_grouped_gemm`] with 128-token tiles only, except that a group's
/// last tile runs `wgmma m64n64k16` when its rows fit 64. Launch:
/// `gemm_launch(GemmConfig::M128_64, ..)`.
///
/// # Safety
/// As [`sm90_grouped_gemm`], and every group's `block_m` is 128.
#[crate::ptx::kernel]
pub unsafe fn sm90_grouped_gemm_t64(p: KernelParams) {
    // SAFETY: the caller's contract.
    unsafe { run::<Tail64, { GemmConfig::M128_64.stages }>(&p) }
}

/// The 192-weight-row variant: as [`sm90_grouped_gemm_t64`] with tiles of 192 weight rows and
/// three consumer warpgroups. Launch: `gemm_launch(GemmConfig::N192, ..)`.
///
/// # Safety
/// As [`sm90_grouped_gemm_t64`].
#[crate::ptx::kernel]
pub unsafe fn sm90_grouped_gemm_n192(p: KernelParams) {
    // SAFETY: the caller's contract.
    unsafe { run::<Rows192, { GemmConfig::N192.stages }>(&p) }
}

/// The decode variant, for problems whose groups all have at most `SMALL_TILE_M` tokens. Launch:
/// `gemm_launch(GemmConfig::M16, ..)` (two CTAs per SM).
///
/// # Safety
/// As [`sm90_grouped_gemm`], and every group's `block_m` is `SMALL_TILE_M`.
#[crate::ptx::kernel]
pub unsafe fn sm90_grouped_gemm_decode(p: KernelParams) {
    // SAFETY: the caller's contract.
    unsafe { run::<Decode, { GemmConfig::M16.stages }>(&p) }
}

/// One CTA of variant `V` (`STAGES` = `V::CFG.stages`, as a const generic for the rings).
///
/// # Safety
/// As [`sm90_grouped_gemm`].
#[inline(always)]
unsafe fn run<V: Variant, const STAGES: u32>(p: &KernelParams) {
    const { assert!(V::CFG.stages == STAGES) };
    let p = *p;
    let st = Smem::<V> { base: smem::dynamic_base(), variant: core::marker::PhantomData };
    let tid = sreg::tid_x();
    if tid == 0 {
        for s in 0..STAGES {
            // SAFETY: before the CTA barrier below, nobody else touches the barriers.
            unsafe {
                st.full().get(s).init(V::CFG.full_barrier_arrivals());
                st.empty().get(s).init(V::CFG.empty_barrier_arrivals());
            }
        }
        fence::mbarrier_init();
    }
    // SAFETY: every thread of the CTA reaches it.
    unsafe { barrier::sync_all() };
    // SAFETY: one thread per producer role, every consumer thread; `p` is valid (the caller's
    // contract).
    unsafe {
        match V::CFG.consumer_thread(tid) {
            None => {
                // Registers move from the producer (two threads issue copies) to the consumers;
                // the decode variant has two producer warps only and no registers to spare.
                if V::CFG.ctas_per_sm() == 1 {
                    V::shrink_registers();
                }
                // One call per role, so that each inlined copy of `produce` has its role as a
                // constant.
                match V::CFG.producer_role(tid) {
                    Some(ProducerRole::Weights) => produce::<V, STAGES>(&st, &p, ProducerRole::Weights),
                    Some(ProducerRole::Tokens) => produce::<V, STAGES>(&st, &p, ProducerRole::Tokens),
                    None => {}
                }
            }
            Some((cw, t)) => {
                if V::CFG.ctas_per_sm() == 1 {
                    V::grow_registers();
                }
                consume::<V, STAGES>(&st, &p, cw, t);
            }
        }
    }
}

/// A producer thread (`role`, see [`ProducerRole`]): per stage, its half of the copies —
/// the weight box and the weight scale blocks, or the token chunks — with its own
/// `arrive.expect_tx` on the stage's full barrier (which counts both producers' arrivals). Both
/// walk the same work list and ring, each waiting for the consumers' release of a stage.
///
/// Every stage is loaded with all its chunks: past K, a token box lies wholly out of bounds (the
/// TMA writes zeros and credits its bytes like any box), the weight boxes' columns likewise, and
/// the stage's first scale block is copied again into each such chunk's place (finite scales for
/// the zero weights, so the chunk adds exact zeros where a consumer computes it).
///
/// # Safety
/// One thread per role in the CTA; barriers initialized; `p` valid.
#[inline(always)]
unsafe fn produce<V: Variant, const STAGES: u32>(st: &Smem<V>, p: &KernelParams, role: ProducerRole) {
    let mut work = Work::new(p);
    let mut ring = Producer::<STAGES>::new(st.full(), st.empty(), Scope::Cta);
    // The token producer has not yet waited for the token dequantization.
    let mut before_tokens = true;
    // SAFETY: the list holds `work_len` items; each names a group of the table.
    while let Some(t) = unsafe { work.next_item() } {
        // SAFETY: as above.
        let g = unsafe { work.group(t.group) };
        match role {
            ProducerRole::Weights => {
                let weight_map = work.tensor_map(weight_map_index(t.group));
                // The 128-row blocks of B's blocked scales the tile's rows lie in: one for
                // 128-row tiles.
                let (first_block, slots) = if V::CFG.block_n == BLOCK_N {
                    (t.tile_n, 1)
                } else {
                    let span = RowSpan::decode(t.tile_n);
                    (span.first_scale_block(), span.scale_blocks(g.n))
                };
                let scale_row_block = (g.b_scales as *const u8)
                    .wrapping_add(first_block as usize * rest_k(g.k) as usize * SCALE_BLOCK_BYTES as usize);
                let tx = V::CFG.weight_tx_bytes(slots);
                fill_tile(st, &mut ring, V::CFG.k_stages(g.k), tx, |buf, full, ks| {
                    let chunks = V::CFG.valid_chunks(g.k, ks);
                    // SAFETY: the map is the group's, the stage is free (acquired), the scale
                    // blocks of the valid chunks lie inside B's scale buffer (validated by the
                    // host).
                    unsafe {
                        for b in 0..V::CFG.weight_boxes() {
                            tma::load_2d(
                                buf.add(V::CFG.weight_box_offset(b)),
                                weight_map,
                                ((ks * V::CFG.weight_boxes() + b) * WEIGHT_ROW_BYTES) as i32,
                                tile_row0::<V>(t) as i32,
                                full,
                            );
                        }
                        for slot in 0..slots {
                            let first = scale_row_block
                                .add(((slot * rest_k(g.k) + ks * V::CFG.chunks) * SCALE_BLOCK_BYTES) as usize);
                            tma::load_1d(
                                buf.add(V::CFG.scale_block_offset(slot, 0)),
                                first,
                                chunks * SCALE_BLOCK_BYTES,
                                full,
                            );
                            for c in chunks..V::CFG.chunks {
                                tma::load_1d(
                                    buf.add(V::CFG.scale_block_offset(slot, c)),
                                    first,
                                    SCALE_BLOCK_BYTES,
                                    full,
                                );
                            }
                        }
                    }
                });
            }
            ProducerRole::Tokens => {
                // The group's last tile loads only its own rows, from its own map.
                let last_tile = (t.tile_m + 1) * g.block_m >= g.m;
                let (token_map, token_rows) = if last_tile {
                    (work.tensor_map(g.tail_token_map as usize), g.tail_rows)
                } else {
                    (work.tensor_map(g.token_map as usize), g.block_m)
                };
                let row = (g.token_row + t.tile_m * g.block_m) as i32;
                let tx = V::CFG.token_tx_bytes(token_rows);
                if before_tokens {
                    // The workspace is written by the token dequantization, which this grid may
                    // overlap (`GEMM_STARTS_EARLY`): wait for it before the first token load, but
                    // after reading the first item, its group and map, which the host or the
                    // scheduler wrote before the dequantization began (the weight loads start
                    // without waiting).
                    tma::prefetch_tensormap(token_map);
                    barrier::grid_dependency_wait();
                    before_tokens = false;
                }
                fill_tile(st, &mut ring, V::CFG.k_stages(g.k), tx, |buf, full, ks| {
                    // SAFETY: the map is the group's, the stage is free (acquired).
                    unsafe {
                        for c in 0..V::CFG.chunks {
                            let k = (ks * V::CFG.block_k() + c * CHUNK_K) as i32;
                            tma::load_2d(buf.add(V::CFG.token_offset(c)), token_map, k, row, full);
                        }
                    }
                });
            }
        }
    }
    if role == ProducerRole::Tokens && before_tokens {
        // A CTA without work still waits, so that this grid never ends before the
        // dequantization it overlaps (the kernels after it in the stream rely on that).
        barrier::grid_dependency_wait();
    }
}

/// A producer's pass over one tile: per stage `ks` of `stages`, wait for the consumers' release,
/// announce `tx_bytes` on the stage's full barrier, issue `copies(stage buffer, full barrier, ks)`
/// (each completing on that barrier) and move on.
#[inline(always)]
fn fill_tile<V: Variant, const STAGES: u32>(
    st: &Smem<V>,
    ring: &mut Producer<STAGES>,
    stages: u32,
    tx_bytes: u32,
    mut copies: impl FnMut(SmemAddr, Mbarrier, u32),
) {
    for ks in 0..stages {
        let stage = ring.acquire();
        stage.full.arrive_expect_tx(tx_bytes);
        copies(st.stage(stage.index), stage.full, ks);
        ring.commit(stage);
    }
}

/// The first weight row of work item `t`: its 128-row tile's, or its [`RowSpan`]'s in `N192`.
#[inline(always)]
fn tile_row0<V: Variant>(t: WorkItem) -> u32 {
    if V::CFG.block_n == BLOCK_N {
        t.tile_n * BLOCK_N
    } else {
        RowSpan::decode(t.tile_n).row0()
    }
}

/// The f16x2 pairs of 16 e2m1 values (8 bytes, `w`) times their block scale, one half of `s`
/// (`HIGH`: the upper; f16): each value comes out as `value · scale · 2⁻¹⁴`, exact in f16
/// (`convert::e4m3_bytes_to_f16x2`: multiples of 2⁻²⁴ of at most 6 significant bits, magnitudes
/// in [2⁻²⁴, 0.17], subnormal below 2⁻¹⁴); the epilogue multiplies the 2¹⁴ back in. Pair `p`
/// holds values `8·(p/4) + p%4` and that plus 4 (see `token_k_position`).
#[inline(always)]
fn dequant16<const HIGH: bool>(w: [u32; 2], s: u32) -> [u32; 8] {
    let lo = convert::e2m1x8_to_f16x2_scaled(w[0]);
    let hi = convert::e2m1x8_to_f16x2_scaled(w[1]);
    let m = convert::mul_f16x2_by_half::<HIGH>;
    [m(lo[0], s), m(lo[1], s), m(lo[2], s), m(lo[3], s), m(hi[0], s), m(hi[1], s), m(hi[2], s), m(hi[3], s)]
}

/// A consumer warpgroup (`cw`, thread `t` of 128): per tile, the K loop of decode + wgmma, then
/// the epilogue.
///
/// # Safety
/// Every thread of consumer warpgroup `cw`; barriers initialized; `p` valid.
#[inline(always)]
unsafe fn consume<V: Variant, const STAGES: u32>(st: &Smem<V>, p: &KernelParams, cw: u32, t: u32) {
    let mut work = Work::new(p);
    let mut ring = Consumer::<STAGES>::new(st.full(), st.empty());
    let bf16 = p.out_bf16 != 0;
    // SAFETY: the list holds `work_len` items; each names a group of the table.
    while let Some(tile) = unsafe { work.next_item() } {
        // SAFETY: as above.
        let g = unsafe { work.group(tile.group) };
        // One compiled copy of the tile loop per wgmma width; `tile_width` picks it (the decode
        // variant compiles the narrow width only).
        // SAFETY: as this function's.
        unsafe {
            if V::CFG.block_m == V::CFG.narrow || V::CFG.tile_width(g.m, g.block_m, tile.tile_m) == V::CFG.narrow {
                consume_tile::<V, STAGES, V::Narrow>(st, &mut ring, p, &g, tile, cw, t, bf16)
            } else {
                consume_tile::<V, STAGES, V::Wide>(st, &mut ring, p, &g, tile, cw, t, bf16)
            }
        }
    }
}

/// Expands `$body` once per listed value of `$i` (a literal), so that array indices in it are
/// constants: LLVM does not fully unroll a 64-iteration loop with branches, and an accumulator
/// array indexed by a loop variable would live in local memory.
macro_rules! unrolled {
    ($i:ident in [$($n:literal),*] $body:block) => {
        $({
            let $i: usize = $n;
            $body
        })*
    };
}

/// One tile of `S::N` tokens × 128 weights: every K stage (decode + wgmma), then the epilogue.
///
/// # Safety
/// As [`consume`]; `S::N` is the tile's `tile_width`.
#[inline(always)]
unsafe fn consume_tile<V: Variant, const STAGES: u32, S: MmaShape>(
    st: &Smem<V>,
    ring: &mut Consumer<STAGES>,
    p: &KernelParams,
    g: &GroupParams,
    tile: WorkItem,
    cw: u32,
    t: u32,
    bf16: bool,
) {
    let (warp, lane) = (t / 32, t % 32);
    let (g8, q) = (lane / 4, lane % 4);
    // The thread's two weight rows within the tile, and where their scales are: the stage's scale
    // slot and the rows within that 128-row block (a warpgroup's 64 rows never straddle one).
    let r0 = cw * WG_ROWS + 16 * warp + lane_group_row(g8);
    let r1 = r0 + 8;
    let (slot, s0) = if V::CFG.block_n == BLOCK_N {
        (0, r0)
    } else {
        let row = tile_row0::<V>(tile) + r0;
        (row / BLOCK_N - RowSpan::decode(tile.tile_n).first_scale_block(), row % BLOCK_N)
    };
    let s1 = s0 + 8;
    if V::CFG.block_n != BLOCK_N && cw >= RowSpan::decode(tile.tile_n).warpgroups {
        // The item's rows end before this warpgroup's: nothing to compute or store, but the
        // stages are released like every consumer's (the empty barriers count all of them).
        for _ in 0..V::CFG.k_stages(g.k) {
            ring.wait().release();
        }
        return;
    }
    // Stage 0's first token chunk; every other chunk's descriptor is this one advanced by its
    // offset (one addition: shared addresses stay inside the 14-bit field, `WgmmaDesc::advance`).
    let tokens0 = WgmmaDesc::k_major_sw128(st.stage(0).add(V::CFG.token_offset(0)).0);
    let mut acc: wgmma::Accumulators = [0.0; 64];
    // The stage whose last MMAs may still be reading it; released once they are known done.
    let mut pending: Option<Stage> = None;
    const { assert!(STAGES <= 8, "the unrolled ring has 8 copies") };
    let rows = FragmentRows {
        weights: [
            [weight_fragment_offset(r0, 0, q), weight_fragment_offset(r1, 0, q)],
            [weight_fragment_offset(r0, 1, q), weight_fragment_offset(r1, 1, q)],
        ],
        scales: [
            V::CFG.scale_block_offset(slot, 0) + scale_word_offset(s0),
            V::CFG.scale_block_offset(slot, 0) + scale_word_offset(s1),
        ],
        q,
    };
    let stages = V::CFG.k_stages(g.k);
    // One copy of the stage per ring index, so that every shared-memory offset, descriptor and
    // barrier of a stage is a constant (PERF.md #25: 235 → 199 instructions per stage in the
    // decode variant); a tile starts wherever the ring stands (the first pass skips the copies
    // before it) and ends after its last stage.
    let mut ks = 0;
    'tile: loop {
        unrolled!(s in [0, 1, 2, 3, 4, 5, 6, 7] {
            if (s as u32) < STAGES && ring.next_index() == s as u32 {
                if ks == stages {
                    break 'tile;
                }
                let stage = ring.wait_at(s as u32);
                // SAFETY: as this function's.
                unsafe { consume_stage::<V, S>(st, stage, rows, tokens0, &mut acc, &mut pending) };
                ks += 1;
            }
        });
    }
    S::wait::<0>(&mut acc);
    if let Some(prev) = pending {
        prev.release();
    }
    // SAFETY: the tile's group indexes the table (read again where registers are short).
    let (g, bf16) = if V::EAGER_LOADS {
        (*g, bf16)
    } else {
        (unsafe { *(p.groups as *const GroupParams).add(tile.group as usize) }, p.out_bf16 != 0)
    };
    // SAFETY: C of the group is valid for `m × n` elements (validated by the host); every thread
    // of the warpgroup stores.
    unsafe { store_tile::<V, S>(st, &acc, &g, tile, bf16) };
}

/// Where the thread's fragments lie in a stage, computed once per tile: its two weight rows'
/// 8-byte words per chunk of a weight box (offsets from the box, swizzle undone; chunk `c` of the
/// stage is chunk `c % 2` of box `c / 2`) and their scale words in chunk 0's scale block (from
/// the stage; chunk `c`'s are `c · SCALE_BLOCK_BYTES` further).
#[derive(Clone, Copy)]
struct FragmentRows {
    weights: [[u32; 2]; CHUNKS_PER_BOX as usize],
    scales: [u32; 2],
    q: u32,
}

/// One stage of a consumer's K loop: per chunk, decode the thread's weight fragments and
/// issue the warpgroup's 4 wgmma k-steps against the token chunk; the previous stage (`pending`)
/// is released once this stage's first MMAs show that its own are done, and this stage becomes
/// `pending`.
///
/// # Safety
/// As [`consume`]; `stage` is full.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
// The unrolled last chunk's look-ahead load is never read (its condition is constant false).
#[allow(unused_assignments)]
unsafe fn consume_stage<V: Variant, S: MmaShape>(
    st: &Smem<V>,
    stage: Stage,
    rows: FragmentRows,
    tokens0: WgmmaDesc,
    acc: &mut wgmma::Accumulators,
    pending: &mut Option<Stage>,
) {
    let FragmentRows { weights, scales: scale_words, q } = rows;
    // The caller's loop is unrolled over the ring, so the stage index is a constant: every
    // address below is the CTA's shared base plus a constant and the thread's offsets. The
    // offset `z` (0) is opaque to LLVM, so that it keeps those sums in this copy of the stage
    // instead of hoisting all copies' out of the loop (each would hold a register); ptxas sees
    // the zero and folds the constants into the loads' immediates and the descriptors.
    let z = SmemAddr(0).opaque().0;
    let buf = st.stage(0).add(z + V::CFG.stage_offset(stage.index));
    let load = |c: u32| {
        let wbase = buf.add(V::CFG.weight_box_offset(c / CHUNKS_PER_BOX));
        let sbase = buf.add(c * SCALE_BLOCK_BYTES);
        let w = weights[(c % CHUNKS_PER_BOX) as usize];
        // SAFETY: aligned offsets inside the stage, which is full and not yet released.
        unsafe {
            (
                [smem::ld_v2_u32(wbase.add(w[0])), smem::ld_v2_u32(wbase.add(w[1]))],
                [smem::ld_u32(sbase.add(scale_words[0])), smem::ld_u32(sbase.add(scale_words[1]))],
            )
        }
    };
    // `EAGER_LOADS`: chunk c+1's shared loads are issued before chunk c is decoded, in one basic
    // block, so their latencies overlap that decoding (the first two chunks' loads come first).
    let mut ahead = load(0);
    // Unrolled, so each chunk's A fragments live in their own registers: decoding chunk c+1
    // overlaps the MMAs of chunk c, and no fragment is rewritten while an MMA in flight may read
    // it (at most two groups are ever pending). Every chunk runs, without a branch (with one in
    // each copy of the stage, ptxas serializes the wgmma pipeline): a K tail's chunks past K are
    // zero weights under finite scales times zero tokens (see `produce`), adding exact zeros.
    unrolled!(c in [0, 1, 2, 3] {
        let c = c as u32;
        if c < V::CFG.chunks {
            let (rw, sw) = if c == 0 || V::EAGER_LOADS { ahead } else { load(c) };
            if V::EAGER_LOADS && c + 1 < V::CFG.chunks {
                ahead = load(c + 1);
            }
            // Both rows' block scales, see `dequant16`.
            let scales = convert::e4m3_bytes_to_f16x2(sw[0], sw[1], q);
            let a0 = dequant16::<false>(rw[0], scales);
            let a1 = dequant16::<true>(rw[1], scales);
            let tokens = tokens0.advance(z + V::CFG.stage_offset(stage.index) + V::CFG.token_offset(c));
            wgmma::fence();
            for j in 0..K_STEPS_PER_CHUNK as usize {
                let frag = [a0[2 * j], a1[2 * j], a0[2 * j + 1], a1[2 * j + 1]];
                // SAFETY: the whole warpgroup, converged; the token chunk stays in place until the
                // stage is released, after a wait_group covers this MMA.
                unsafe { S::mma(acc, frag, tokens.advance(TOKEN_K_STEP_BYTES * j as u32).to_bits(), 1) };
            }
            wgmma::commit_group();
            // Everything but this chunk's group is done: the previous stage is free.
            S::wait::<1>(acc);
            if c == 0 {
                if let Some(prev) = pending.take() {
                    prev.release();
                }
            }
        }
    });
    *pending = Some(stage);
}

/// What the epilogue multiplies the accumulators by before alpha: the consumers decode the weights
/// times 2⁻¹⁴ (`dequant16`).
const WEIGHT_UNSCALE: f32 = 16384.0;

/// The accumulator pair `(acc[i], acc[i + 1])` (tokens m, m + 1 of one weight) scaled by 2¹⁴ and
/// alpha and rounded once to f16x2 or bf16x2, token m in the low half (the weights were decoded
/// times 2⁻¹⁴, `dequant16`; multiplying by 2¹⁴ first is exact, so this is alpha times the unscaled
/// sum, as if decoded unscaled).
#[inline(always)]
fn round_pair(acc_i: f32, acc_i1: f32, alpha: f32, bf16: bool) -> u32 {
    let (m, m1) = (acc_i * WEIGHT_UNSCALE * alpha, acc_i1 * WEIGHT_UNSCALE * alpha);
    if bf16 {
        convert::f32x2_to_bf16x2(m, m1)
    } else {
        convert::f32x2_to_f16x2(m, m1)
    }
}

/// Writes the warpgroup's 64 × `S::N` accumulator tile to C (transposed: C is tokens × weights)
/// through its epilogue buffer, [`EPILOGUE_ROWS`] token rows at a time (a 16-token tile of the
/// decode variant in one round of 16, its buffer's height):
/// 1. each register pair rounded (`round_pair`) is one element pair of an 8 × 8 matrix (the
///    warp's weight row `g` or `g + 8`, tokens `2q, 2q + 1` of a quad) in the layout `stmatrix`
///    takes; `stmatrix .trans` stores its columns, so each stored 16 bytes are 8 weights of one
///    token row ([`epilogue_slot`]): C's orientation, with no exchange between lanes;
/// 2. after a barrier of the warpgroup, each thread copies 16-byte chunks of whole rows to C
///    (eight consecutive threads write one row's 128 bytes: full sectors), each store predicated
///    on `m < M` and `n < N` (N is a multiple of 8: a chunk lies wholly inside or outside).
/// A barrier before each round keeps the buffer until the previous round's (or tile's) copies
/// have read it.
///
/// # Safety
/// Every thread of a consumer warpgroup; `g.c` valid for `g.m × g.n` elements, 16-byte aligned
/// (validated by the host).
#[inline(always)]
unsafe fn store_tile<V: Variant, S: MmaShape>(
    st: &Smem<V>,
    acc: &wgmma::Accumulators,
    g: &GroupParams,
    tile: WorkItem,
    bf16: bool,
) {
    // A round's rows fit the buffer: tiles narrower than a round are one round of their height.
    const {
        assert!(if S::N < EPILOGUE_ROWS {
            S::N <= V::CFG.epilogue_rows()
        } else {
            V::CFG.epilogue_rows() == EPILOGUE_ROWS && S::N <= 2 * EPILOGUE_ROWS
        })
    };
    let Some((cw, t)) = V::CFG.consumer_thread(sreg::tid_x()) else { return };
    let (warp, lane) = (t / 32, t % 32);
    let buf = st.epilogue(cw);
    let bar = EPILOGUE_BARRIER + cw;
    // `stmatrix`: lane `l` addresses column (token) `l % 8` of matrix `l / 8`; matrix `j` of the
    // call for quads 2p, 2p + 1 is quad 2p + j / 2, rows `g` (j even) or `g + 8` of the warp's 16.
    let (col, j) = (lane % 8, lane / 8);
    let chunk = 2 * warp + j % 2;
    // Stored chunks hold the lane groups' weight rows, `lane_group_row(g)` for g = 0..8 (pairs
    // kept); word w of a chunk is weights `lane_group_row(2w)` and `+ 1`, so C's word k is the
    // stored word `lane_group_row(2k) / 2`.
    const W: [usize; 4] = [
        (lane_group_row(0) / 2) as usize,
        (lane_group_row(2) / 2) as usize,
        (lane_group_row(4) / 2) as usize,
        (lane_group_row(6) / 2) as usize,
    ];
    let c = g.c as *mut u16;
    let n_first = tile_row0::<V>(tile) + cw * WG_ROWS;
    let m_first = tile.tile_m * g.block_m;
    unrolled!(round in [0, 1] {
        let round = round as u32;
        // Rounds past N / 64 do not exist for narrower widths (a constant condition).
        if round * EPILOGUE_ROWS < S::N {
            // SAFETY: the 128 threads of the warpgroup, each round.
            unsafe { barrier::sync_named(bar, WARPGROUP_THREADS) };
            unrolled!(p in [0, 1, 2, 3] {
                let quad0 = 8 * round as usize + 2 * p;
                if quad0 < (S::N / 8) as usize {
                    let r: [u32; 4] = core::array::from_fn(|jj| {
                        let i = 4 * (quad0 + jj / 2) + 2 * (jj % 2);
                        round_pair(acc[i], acc[i + 1], g.alpha, bf16)
                    });
                    let row = 8 * (2 * p as u32 + j / 2) + col;
                    // SAFETY: 16-byte slots inside the warpgroup's buffer, which no other
                    // warpgroup uses and whose readers passed the barrier above.
                    unsafe { smem::stmatrix_x4_trans(buf.add(epilogue_slot(row, chunk)), r) };
                }
            });
            // SAFETY: as above.
            unsafe { barrier::sync_named(bar, WARPGROUP_THREADS) };
            unrolled!(it in [0, 1, 2, 3] {
                let idx = it as u32 * WARPGROUP_THREADS + t;
                if it as u32 * WARPGROUP_THREADS < 8 * EPILOGUE_ROWS.min(S::N - round * EPILOGUE_ROWS) {
                    let (row, k) = (idx / 8, idx % 8);
                    // SAFETY: a 16-byte slot of the buffer, written before the barrier above.
                    let v = unsafe { smem::ld_v4_u32(buf.add(epilogue_slot(row, k))) };
                    let (m, n) = (m_first + round * EPILOGUE_ROWS + row, n_first + 8 * k);
                    let at = c.wrapping_add(m as usize * g.n as usize + n as usize) as *mut u32;
                    // SAFETY: written only inside C (m < M, n < N), 16-byte aligned there.
                    unsafe { gmem::st_v4_u32_if(at, [v[W[0]], v[W[1]], v[W[2]], v[W[3]]], m < g.m && n < g.n) };
                }
            });
        }
    });
}
