//! The MoE block's routing and combine kernels on the GPU (`moe_route`, `moe_combine`;
//! docs/moe-block.md, "The GPU block"): [`BlockKernels`] launches them over device buffers given
//! as addresses and lengths, after checking every argument ([`route_params`],
//! [`combine_params`]). Nothing is allocated, nothing but the outputs is written and the host
//! never synchronizes, so both calls can be captured in a CUDA graph.
//!
//! Routing writes the contiguous layout [`crate::MoePlan`] reads (`offsets[E + 1]`, rows sorted
//! by expert, each expert's rows in slot order), the row of each slot and the token of each row,
//! with one CTA (`moe_route`) or, for more than `ROUTE_MULTI_CTA_ABOVE` slots, three launches
//! over chunks of slots (`moe_route_count`, `moe_route_scan`, `moe_route_scatter`, which need a
//! scratch buffer of [`route_scratch_len`] u32; [`route_chunks`] picks); the combine sums each token's rows of the second GEMM's output back into `y`.

use cudarc::driver::CudaStream;
use nvfp4_gemm_abi::moe_block::{
    self as abi, CombineParams, RouteParams, COMBINE_H_MULTIPLE, ROUTE_MAX_CHUNKS, ROUTE_MAX_EXPERTS, ROUTE_MAX_SLOTS,
};

use crate::device::Gpu;
use crate::driver::launch::launch_with;
use crate::driver::module::Kernel;
use crate::error::{invalid, Result};
use crate::moe::{AFTER_GEMM_START, CHAIN_START};
use crate::overlap::{self, Span};
use crate::problem::{BufferView, BUFFER_ALIGN};

/// The element type of `topk_ids`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdType {
    /// int32.
    I32,
    /// int64.
    I64,
}

/// The element type of `topk_weights`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightType {
    /// f32.
    F32,
    /// bf16.
    Bf16,
}

impl WeightType {
    fn bytes(self) -> u64 {
        match self {
            WeightType::F32 => 4,
            WeightType::Bf16 => 2,
        }
    }
}

/// The router's choice for `tokens` tokens: `topk_ids` and `topk_weights` are `tokens x top_k`;
/// the rank's local experts are the global ids `first_expert .. first_expert + experts`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Routing {
    /// Tokens `T` (0 allowed).
    pub tokens: usize,
    /// Slots per token (≥ 1).
    pub top_k: usize,
    /// The global id of local expert 0.
    pub first_expert: i64,
    /// Local experts `E` (1 ..= 4096).
    pub experts: usize,
}

/// `moe_route`'s buffers; every length in elements.
#[derive(Clone, Copy, Debug)]
pub struct RouteViews {
    /// `topk_ids`: `T · top_k` elements of `ids_type`.
    pub ids: BufferView,
    /// Their type.
    pub ids_type: IdType,
    /// `topk_weights` (`T · top_k` elements of `weights_type`): needed only with `row_weight`.
    pub weights: Option<BufferView>,
    /// Their type.
    pub weights_type: WeightType,
    /// Output: `E + 1` u32.
    pub offsets: BufferView,
    /// Output: `T · top_k` u32, each slot's sorted row or `u32::MAX` (not local).
    pub slot_row: BufferView,
    /// Output: `T · top_k` u32, each sorted row's token (rows below `offsets[E]` written).
    pub row_token: BufferView,
    /// Output (optional): `T · top_k` f32, each sorted row's router weight.
    pub row_weight: Option<BufferView>,
    /// Scratch of the multi-CTA path: exactly [`route_scratch_len`] u32 (`chunks · E`); empty
    /// (any address) on the one-CTA path.
    pub scratch: BufferView,
}

/// `moe_combine`'s buffers; every length in elements.
#[derive(Clone, Copy, Debug)]
pub struct CombineViews {
    /// The second GEMM's output in sorted rows, `R x H` f16 (bf16 with `bf16`), `R ≥ T · top_k`.
    pub o: BufferView,
    /// `T · top_k` u32 from routing.
    pub slot_row: BufferView,
    /// `topk_weights` (`T · top_k` elements of `weights_type`), or `None`: every weight is 1
    /// (the router weight was applied at the input).
    pub weights: Option<BufferView>,
    /// Their type.
    pub weights_type: WeightType,
    /// Output: `T x H`, the type of `o`.
    pub y: BufferView,
    /// `o` and `y` are bf16 (else f16).
    pub bf16: bool,
}

const ROUTE: &str = "moe_route";
const ROUTE_COUNT: &str = "moe_route_count";
const ROUTE_SCAN: &str = "moe_route_scan";
const ROUTE_SCATTER: &str = "moe_route_scatter";
const COMBINE: &str = "moe_combine";

fn check_view(call: &'static str, field: &'static str, v: BufferView, len: usize) -> Result<()> {
    if v.len != len {
        return Err(invalid(call, field, format!("has {} elements; exactly {len} are needed", v.len)));
    }
    if len > 0 && v.ptr % BUFFER_ALIGN != 0 {
        return Err(invalid(call, field, format!("address {:#x} is not {BUFFER_ALIGN}-byte aligned", v.ptr)));
    }
    Ok(())
}

fn slots(call: &'static str, tokens: usize, top_k: usize) -> Result<usize> {
    if top_k == 0 {
        return Err(invalid(call, "top_k", "must be at least 1"));
    }
    match tokens.checked_mul(top_k) {
        Some(s) if (s as u64) < ROUTE_MAX_SLOTS => Ok(s),
        _ => Err(invalid(
            call,
            "tokens",
            format!("{tokens} × {top_k} slots: at most {} are supported", ROUTE_MAX_SLOTS - 1),
        )),
    }
}

/// The routing path [`route_params`] takes for `r`: 0 for the one-CTA `moe_route`, else the
/// multi-CTA path's chunk count (`nvfp4_gemm_abi::moe_block::route_chunks`: more than 4096
/// slots).
pub fn route_chunks(r: Routing) -> u32 {
    let experts = r.experts.min(ROUTE_MAX_EXPERTS as usize) as u32;
    abi::route_chunks(r.tokens.saturating_mul(r.top_k) as u64, experts)
}

/// The u32 elements of [`RouteViews::scratch`] that routing `r` needs: `chunks · E` on the
/// multi-CTA path, 0 on the one-CTA path. It never decreases as the tokens grow, so a buffer
/// for the most tokens serves every smaller routing (cut to this length).
pub fn route_scratch_len(r: Routing) -> usize {
    let experts = r.experts.min(ROUTE_MAX_EXPERTS as usize) as u32;
    abi::route_scratch_words(route_chunks(r), experts) as usize
}

/// Checks the routing kernels' arguments and returns their parameters, on the path
/// [`route_chunks`] picks. Errors ([`crate::Error::InvalidArgument`]): `top_k` 0; `experts` 0 or
/// above 4096; `T · top_k` at or above 2³¹; a buffer of the wrong length (`scratch` included) or
/// (when not empty) not 16-byte aligned; `row_weight` without `weights`.
/// [`crate::Error::Overlap`]: an output (`scratch` included) sharing a byte with another buffer.
pub fn route_params(r: Routing, v: RouteViews) -> Result<RouteParams> {
    route_params_on(r, v, route_chunks(r))
}

/// As [`route_params`], on the path `chunks` names: 0 the one-CTA `moe_route`, 1 ..= 128 the
/// multi-CTA path over that many chunks (`scratch` then `chunks · E` u32). Both paths write the
/// same outputs; tests run each on the same routing. Errors: as [`route_params`], and `chunks`
/// above 128.
pub fn route_params_on(r: Routing, v: RouteViews, chunks: u32) -> Result<RouteParams> {
    let s = slots(ROUTE, r.tokens, r.top_k)?;
    if r.experts == 0 || r.experts > ROUTE_MAX_EXPERTS as usize {
        return Err(invalid(ROUTE, "experts", format!("{}: must be 1 ..= {ROUTE_MAX_EXPERTS}", r.experts)));
    }
    if chunks > ROUTE_MAX_CHUNKS {
        return Err(invalid(ROUTE, "chunks", format!("{chunks}: at most {ROUTE_MAX_CHUNKS}")));
    }
    check_view(ROUTE, "scratch", v.scratch, abi::route_scratch_words(chunks, r.experts as u32) as usize)?;
    check_view(ROUTE, "ids", v.ids, s)?;
    check_view(ROUTE, "offsets", v.offsets, r.experts + 1)?;
    check_view(ROUTE, "slot_row", v.slot_row, s)?;
    check_view(ROUTE, "row_token", v.row_token, s)?;
    let weights = match (v.row_weight, v.weights) {
        (Some(rw), Some(w)) => {
            check_view(ROUTE, "row_weight", rw, s)?;
            check_view(ROUTE, "weights", w, s)?;
            Some((rw, w))
        }
        (Some(_), None) => return Err(invalid(ROUTE, "weights", "`row_weight` needs the router weights")),
        (None, _) => None,
    };
    let id_bytes = if v.ids_type == IdType::I64 { 8 } else { 4 };
    let none = BufferView { ptr: 0, len: 0 };
    let mut spans = [
        Span::new(0, v.ids, id_bytes, false),
        Span::new(1, weights.map_or(none, |w| w.1), v.weights_type.bytes(), false),
        Span::new(2, v.offsets, 4, true),
        Span::new(3, v.slot_row, 4, true),
        Span::new(4, v.row_token, 4, true),
        Span::new(5, weights.map_or(none, |w| w.0), 4, true),
        Span::new(6, v.scratch, 4, true),
    ];
    overlap::check(
        ROUTE,
        &mut spans,
        overlap::fields(&["ids", "weights", "offsets", "slot_row", "row_token", "row_weight", "scratch"]),
    )?;
    Ok(RouteParams {
        ids: v.ids.ptr,
        weights: weights.map_or(0, |w| w.1.ptr),
        offsets: v.offsets.ptr,
        slot_row: v.slot_row.ptr,
        row_token: v.row_token.ptr,
        row_weight: weights.map_or(0, |w| w.0.ptr),
        counts: if chunks == 0 { 0 } else { v.scratch.ptr },
        first_expert: r.first_expert,
        tokens: r.tokens as u32,
        top_k: r.top_k as u32,
        experts: r.experts as u32,
        ids_i64: u32::from(v.ids_type == IdType::I64),
        weights_bf16: u32::from(v.weights_type == WeightType::Bf16),
        chunks,
        chunk_slots: abi::route_chunk_slots(s as u64, chunks),
        pad: 0,
    })
}

/// Checks `moe_combine`'s arguments for `tokens x top_k` slots and hidden size `hidden`, and
/// returns its parameters, or `None` for `tokens = 0` (nothing to launch). Errors
/// ([`crate::Error::InvalidArgument`]): `top_k` 0; `hidden` not a positive multiple of 64; `o` not a
/// whole number of rows or fewer than `T · top_k` of them (every routed row must fit); a buffer
/// of the wrong length or not 16-byte aligned; sizes beyond the kernel's 32-bit indexing.
/// [`crate::Error::Overlap`]: `y` sharing a byte with another buffer.
pub fn combine_params(tokens: usize, top_k: usize, hidden: usize, v: CombineViews) -> Result<Option<CombineParams>> {
    let s = slots(COMBINE, tokens, top_k)?;
    if hidden == 0 || hidden % COMBINE_H_MULTIPLE as usize != 0 || hidden > u32::MAX as usize {
        return Err(invalid(
            COMBINE,
            "hidden",
            format!("{hidden}: must be a positive multiple of {COMBINE_H_MULTIPLE}"),
        ));
    }
    if tokens == 0 {
        return Ok(None);
    }
    let rows = v.o.len / hidden;
    if v.o.len % hidden != 0 || rows < s {
        return Err(invalid(
            COMBINE,
            "o",
            format!("has {} elements; whole rows of {hidden}, at least {s} of them, are needed", v.o.len),
        ));
    }
    let rows = u32::try_from(rows).map_err(|_| invalid(COMBINE, "o", format!("{rows} rows: too many")))?;
    check_view(COMBINE, "o", v.o, v.o.len)?;
    check_view(COMBINE, "slot_row", v.slot_row, s)?;
    if let Some(w) = v.weights {
        check_view(COMBINE, "weights", w, s)?;
    }
    let y_len = tokens.checked_mul(hidden).ok_or_else(|| invalid(COMBINE, "y", "too large"))?;
    check_view(COMBINE, "y", v.y, y_len)?;
    let none = BufferView { ptr: 0, len: 0 };
    let mut spans = [
        Span::new(0, v.o, 2, false),
        Span::new(1, v.slot_row, 4, false),
        Span::new(2, v.weights.unwrap_or(none), v.weights_type.bytes(), false),
        Span::new(3, v.y, 2, true),
    ];
    overlap::check(COMBINE, &mut spans, overlap::fields(&["o", "slot_row", "weights", "y"]))?;
    Ok(Some(CombineParams {
        o: v.o.ptr,
        slot_row: v.slot_row.ptr,
        weights: v.weights.map_or(0, |w| w.ptr),
        y: v.y.ptr,
        tokens: tokens as u32,
        top_k: top_k as u32,
        hidden: hidden as u32,
        rows,
        bf16: u32::from(v.bf16),
        weights_bf16: u32::from(v.weights_type == WeightType::Bf16),
    }))
}

/// Resident combine CTAs per SM the grid is sized for (the threads grid-stride beyond).
pub const COMBINE_CTAS_PER_SM: u32 = 8;

/// The routing and combine kernels of a [`Gpu`] (both architectures), looked up once.
#[derive(Debug)]
pub struct BlockKernels {
    route: Kernel,
    route_count: Kernel,
    route_scan: Kernel,
    route_scatter: Kernel,
    combine: Kernel,
    max_ctas: u32,
}

impl BlockKernels {
    /// Looks up the kernels in `gpu`'s image.
    pub fn new(gpu: &Gpu) -> Result<BlockKernels> {
        Ok(BlockKernels {
            route: gpu.function(ROUTE)?,
            route_count: gpu.function(ROUTE_COUNT)?,
            route_scan: gpu.function(ROUTE_SCAN)?,
            route_scatter: gpu.function(ROUTE_SCATTER)?,
            combine: gpu.function(COMBINE)?,
            max_ctas: gpu.sm_count().max(1) * COMBINE_CTAS_PER_SM,
        })
    }

    /// Routes on `stream` on the path [`route_chunks`] picks: one launch, or three in stream
    /// order for more than 4096 slots (also for `T = 0`, which writes `offsets` as zeros).
    /// Errors (before any launch): as [`route_params`].
    ///
    /// # Safety
    /// As [`crate::GemmPlan::run_views`], for every buffer: each view is live device memory of
    /// its length, kept alive until the launches complete.
    pub unsafe fn route(&self, stream: &CudaStream, routing: Routing, views: RouteViews) -> Result<()> {
        let params = route_params(routing, views)?;
        // SAFETY: the caller's contract; `route_params` checked the arguments.
        unsafe { self.launch_route(stream, &params) }
    }

    /// As [`BlockKernels::route`], on the path `chunks` names ([`route_params_on`]).
    ///
    /// # Safety
    /// As [`BlockKernels::route`].
    pub unsafe fn route_on(&self, stream: &CudaStream, routing: Routing, views: RouteViews, chunks: u32) -> Result<()> {
        let params = route_params_on(routing, views, chunks)?;
        // SAFETY: the caller's contract; `route_params_on` checked the arguments.
        unsafe { self.launch_route(stream, &params) }
    }

    /// # Safety
    /// `params` from [`route_params_on`], its buffers live until the launches complete.
    unsafe fn launch_route(&self, stream: &CudaStream, params: &RouteParams) -> Result<()> {
        // SAFETY: `route_params_on` checked the lengths, alignment and disjointness the kernels
        // rely on (their `# Safety`); the caller's contract for the memory. The three launches of
        // the multi-CTA path run in stream order, each reading what the one before wrote after
        // its wait (`CHAIN_START`).
        unsafe {
            if params.chunks == 0 {
                return launch_with(&self.route, stream, abi::route_launch(), CHAIN_START, params);
            }
            launch_with(&self.route_count, stream, abi::route_chunk_launch(params.chunks), CHAIN_START, params)?;
            launch_with(&self.route_scan, stream, abi::route_launch(), CHAIN_START, params)?;
            launch_with(&self.route_scatter, stream, abi::route_chunk_launch(params.chunks), CHAIN_START, params)
        }
    }

    /// Combines on `stream` (no launch for `T = 0`). Errors (before any launch): as
    /// [`combine_params`].
    ///
    /// # Safety
    /// As [`BlockKernels::route`].
    pub unsafe fn combine(
        &self,
        stream: &CudaStream,
        tokens: usize,
        top_k: usize,
        hidden: usize,
        views: CombineViews,
    ) -> Result<()> {
        let Some(params) = combine_params(tokens, top_k, hidden, views)? else { return Ok(()) };
        let geometry = abi::combine_launch(abi::combine_items(params.tokens, params.hidden), self.max_ctas);
        // SAFETY: as in `route`.
        unsafe { launch_with(&self.combine, stream, geometry, AFTER_GEMM_START, &params) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    fn view(ptr: u64, len: usize) -> BufferView {
        BufferView { ptr, len }
    }

    fn routing() -> Routing {
        Routing { tokens: 3, top_k: 2, first_expert: 4, experts: 5 }
    }

    fn route_views() -> RouteViews {
        RouteViews {
            ids: view(0x1000, 6),
            ids_type: IdType::I32,
            weights: Some(view(0x2000, 6)),
            weights_type: WeightType::F32,
            offsets: view(0x3000, 6),
            slot_row: view(0x4000, 6),
            row_token: view(0x5000, 6),
            row_weight: Some(view(0x6000, 6)),
            scratch: view(0, 0),
        }
    }

    fn combine_views() -> CombineViews {
        CombineViews {
            o: view(0x10000, 6 * 64),
            slot_row: view(0x20000, 6),
            weights: None,
            weights_type: WeightType::Bf16,
            y: view(0x30000, 3 * 64),
            bf16: true,
        }
    }

    fn field(r: Result<impl std::fmt::Debug>) -> &'static str {
        match r {
            Err(Error::InvalidArgument { field, .. }) => field,
            Err(Error::Overlap { output, .. }) => output.field,
            other => panic!("not an argument error: {other:?}"),
        }
    }

    #[test]
    fn route_arguments() {
        let p = route_params(routing(), route_views()).unwrap();
        assert_eq!((p.tokens, p.top_k, p.experts, p.first_expert, p.row_weight), (3, 2, 5, 4, 0x6000));
        assert_eq!(
            route_params(Routing { top_k: 0, ..routing() }, route_views()).map(|_| ()).unwrap_err().to_string(),
            "moe_route: `top_k`: must be at least 1"
        );
        assert_eq!(field(route_params(Routing { experts: 0, ..routing() }, route_views())), "experts");
        assert_eq!(field(route_params(Routing { experts: 4097, ..routing() }, route_views())), "experts");
        assert_eq!(field(route_params(Routing { tokens: 1 << 30, top_k: 2, ..routing() }, route_views())), "tokens");
        assert_eq!(field(route_params(routing(), RouteViews { ids: view(0x1000, 5), ..route_views() })), "ids");
        assert_eq!(field(route_params(routing(), RouteViews { offsets: view(0x3000, 5), ..route_views() })), "offsets");
        assert_eq!(
            field(route_params(routing(), RouteViews { slot_row: view(0x4004, 6), ..route_views() })),
            "slot_row"
        );
        assert_eq!(field(route_params(routing(), RouteViews { weights: None, ..route_views() })), "weights");
        assert_eq!(
            field(route_params(routing(), RouteViews { row_token: view(0x3008, 6), ..route_views() })),
            "row_token"
        );
        let p = route_params(routing(), RouteViews { weights: None, row_weight: None, ..route_views() }).unwrap();
        assert_eq!((p.weights, p.row_weight), (0, 0));
        // T = 0 routes (offsets are written); empty views need no address.
        let empty = RouteViews {
            ids: view(0, 0),
            slot_row: view(0, 0),
            row_token: view(0, 0),
            row_weight: None,
            ..route_views()
        };
        assert!(route_params(Routing { tokens: 0, ..routing() }, empty).is_ok());
    }

    #[test]
    fn route_paths_and_scratch() {
        let p = route_params(routing(), route_views()).unwrap();
        assert_eq!((p.chunks, p.chunk_slots, p.counts), (0, 0, 0));
        // Forced multi-CTA path: 3 chunks of 2 slots, 3 · 5 scratch words.
        let forced = RouteViews { scratch: view(0x7000, 15), ..route_views() };
        let p = route_params_on(routing(), forced, 3).unwrap();
        assert_eq!((p.chunks, p.chunk_slots, p.counts), (3, 2, 0x7000));
        assert_eq!(field(route_params_on(routing(), route_views(), 3)), "scratch");
        assert_eq!(field(route_params_on(routing(), RouteViews { scratch: view(0x7000, 16), ..forced }, 3)), "scratch");
        assert_eq!(field(route_params_on(routing(), RouteViews { scratch: view(0x7004, 15), ..forced }, 3)), "scratch");
        assert_eq!(field(route_params_on(routing(), RouteViews { scratch: view(0x1000, 15), ..forced }, 3)), "scratch");
        let e = route_params_on(routing(), RouteViews { scratch: view(0x5010, 15), ..forced }, 3).unwrap_err();
        assert!(matches!(e, Error::Overlap { .. }), "{e}");
        // The one-CTA path: an empty scratch at any address.
        assert!(route_params_on(routing(), RouteViews { scratch: view(0x6000, 0), ..forced }, 0).is_ok());
        assert_eq!(field(route_params_on(routing(), forced, 129)), "chunks");
        assert!(route_params_on(routing(), RouteViews { scratch: view(0x7000, 5 * 128), ..forced }, 128).is_ok());

        // The path route_params picks: more than 4096 slots.
        let r = Routing { tokens: 512, top_k: 8, first_expert: 0, experts: 64 };
        assert_eq!((route_chunks(r), route_scratch_len(r)), (0, 0));
        let r = Routing { tokens: 513, ..r };
        assert_eq!((route_chunks(r), route_scratch_len(r)), (5, 5 * 64));
        let n = r.tokens * r.top_k;
        let big = |scratch| RouteViews {
            ids: view(0x10_0000, n),
            weights: None,
            offsets: view(0x20_0000, 65),
            slot_row: view(0x30_0000, n),
            row_token: view(0x40_0000, n),
            row_weight: None,
            scratch,
            ..route_views()
        };
        let p = route_params(r, big(view(0x50_0000, 320))).unwrap();
        assert_eq!((p.chunks, p.chunk_slots, p.counts), (5, 821, 0x50_0000));
        assert_eq!(field(route_params(r, big(view(0, 0)))), "scratch");
        let e = route_params(r, big(view(0x30_0000 + 4 * 4096, 320))).map(|_| ()).unwrap_err();
        assert!(matches!(e, Error::Overlap { .. }), "{e}");
        assert_eq!(route_scratch_len(Routing { tokens: 1 << 20, top_k: 8, first_expert: 0, experts: 4096 }), 1 << 16);
    }

    #[test]
    fn combine_arguments() {
        let p = combine_params(3, 2, 64, combine_views()).unwrap().unwrap();
        assert_eq!((p.rows, p.weights, p.bf16), (6, 0, 1));
        assert!(combine_params(0, 2, 64, combine_views()).unwrap().is_none());
        assert_eq!(field(combine_params(3, 0, 64, combine_views())), "top_k");
        assert_eq!(field(combine_params(3, 2, 96, combine_views())), "hidden");
        assert_eq!(field(combine_params(3, 2, 64, CombineViews { o: view(0x10000, 5 * 64), ..combine_views() })), "o");
        assert_eq!(
            field(combine_params(3, 2, 64, CombineViews { o: view(0x10000, 6 * 64 + 8), ..combine_views() })),
            "o"
        );
        assert_eq!(field(combine_params(3, 2, 64, CombineViews { o: view(0x10008, 6 * 64), ..combine_views() })), "o");
        assert_eq!(field(combine_params(3, 2, 64, CombineViews { y: view(0x30000, 2 * 64), ..combine_views() })), "y");
        assert_eq!(field(combine_params(3, 2, 64, CombineViews { y: view(0x10010, 3 * 64), ..combine_views() })), "y");
        assert_eq!(
            field(combine_params(3, 2, 64, CombineViews { weights: Some(view(0x40000, 5)), ..combine_views() })),
            "weights"
        );
        let p = combine_params(3, 2, 64, CombineViews { weights: Some(view(0x40000, 6)), ..combine_views() })
            .unwrap()
            .unwrap();
        assert_eq!((p.weights, p.weights_bf16), (0x40000, 1));
    }
}
