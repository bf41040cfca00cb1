//! The whole MoE expert block in the device model: the chain of kernels
//! `nvfp4_gemm::moe_block::ExpertBlock::run_views` launches — `moe_route`, the gather into
//! expert-sorted rows (`nvfp4_quantize_grouped`, quantizing under W4A4; on sm_90a, in the cases
//! that ask for it, `sm90_quantize_schedule`: the same loop with both GEMMs' schedulers in its
//! first two CTAs), the first device-sized grouped GEMM (its scheduler unless it ran there, then
//! its GEMM),
//! `moe_activate` (requantizing under W4A4), the second device-sized GEMM and `moe_combine` — in
//! that order, on buffers that flow from one
//! launch to the next (the model's device addresses are host addresses), with the parameters,
//! launch geometries and tables the library's own planning code computes (`route_params`,
//! `gather_params`, `activate_params`, `combine_params`, `Sm100DeviceLayout`,
//! `Sm90DeviceLayout`). sm_100a runs W4A4 (its one precision), sm_90a W4A4 and W4A16.
//!
//! Checked after the whole chain ran:
//! - `y` against the contract's fp64 reference (`nvfp4_format::moe_block::reference`, rounded
//!   once to the output type) within the block's normalized tolerance (docs/moe-block.md §5),
//!   tokens with no local slot exactly +0;
//! - every step on the inputs the step before it wrote: the routing against a stable CPU sort;
//!   the gathered and the activated tokens bit for bit against the CPU quantizer (W4A4) or the
//!   16-bit rows (W4A16); each GEMM's rows within the GEMM tests' tolerance against fp64
//!   products of the operand the device wrote; the combine bit for bit against its `f32`
//!   statement (`abi::moe_block::combine_sum`); what the schedulers wrote (status, and on sm_100a
//!   the work list against the host-built one);
//! - every buffer the chain writes poisoned before the run (NaN patterns) and guarded on both
//!   sides: the guards, the bytes a call does not own (rows of no group, entries past `T · top_k`)
//!   and the inputs `x`, `topk_ids`, `topk_weights` unchanged.
//!
//! Nothing here has run on a B200: on sm_100a the result is the device model's reading of the
//! PTX ISA (docs/model.md), not hardware.

use nvfp4_format::checkpoint::{ExpertWeights, LoadedExperts, PlainWeight};
use nvfp4_format::codec::{e2m1_to_f32, e4m3_to_f32, f64_to_bf16, f64_to_f16};
use nvfp4_format::moe_block::{reference, round_output_as, Routing as RouterOutput};
use nvfp4_format::{quantize_with_global_scale, random_matrix, InputDistribution, SplitMix64, Tolerance};
use nvfp4_gemm::moe::{
    validate_moe_buffers, ActivatedOutput, GlobalScale, GroupRows, MoeBuffers, MoeOptions, MoeTokens,
};
use nvfp4_gemm::moe_block::COMBINE_CTAS_PER_SM;
use nvfp4_gemm::moe_block::{
    activate_params, combine_params, gather_params, interleave_w13, route_params, Activation, BlockOptions,
    BlockOutput, CombineViews, Dense16, GatherInputs, IdType, KernelActivation, Precision, RouteViews, RouterWeightAt,
    Routing, WeightType,
};
use nvfp4_gemm::problem::BufferView;
use nvfp4_gemm::quantize::CTAS_PER_SM;
use nvfp4_gemm::w4a16::{prepack, Activations, WeightStack};
use nvfp4_gemm::{MoeProblem, OutputType, TokenKind, TokenLayout};
use nvfp4_gemm_abi::launch::LaunchGeometry;
use nvfp4_gemm_abi::moe::block::activated;
use nvfp4_gemm_abi::moe::sm90::{quantize_schedule_launch, QuantizeScheduleParams};
use nvfp4_gemm_abi::moe_block::{combine_items, combine_launch, combine_sum, route_launch, NOT_LOCAL};
use nvfp4_gemm_abi::quantize::{half_to_f64, launch as convert_launch};
use nvfp4_gemm_abi::scale_layout::{blocked_offset, rest_k};
use nvfp4_gemm_kernel::activate::{moe_activate, moe_activate_blocks};
use nvfp4_gemm_kernel::moe_block::{moe_combine, moe_route};
use nvfp4_gemm_kernel::quantize_grouped::nvfp4_quantize_grouped;
use nvfp4_gemm_kernel::sm90::schedule::sm90_quantize_schedule;
use nvfp4_gemm_model_tests::*;

/// The bound on `‖y − ref‖ / ‖ref‖` over a call's output: the GPU block tests' (`gpu_moe_sm90`,
/// module `block`), for what docs/moe-block.md §5 lets a block do differently (f32 accumulation
/// and alphas, the f32 activation, the f32 combine, each moving a 16-bit or quantized
/// intermediate by one step at times).
const BLOCK_TOLERANCE: f64 = 2e-2;

/// Guard bytes on each side of every buffer the chain writes (a multiple of 16, so that the
/// buffer stays 16-byte aligned).
const GUARD_BYTES: usize = 128;
/// 16-bit poison: NaN in f16 and bf16.
const NAN16: [u8; 2] = 0x7FFFu16.to_le_bytes();
/// 32-bit poison: NaN as f32 (`row_weight`), far past any row as an index.
const NAN32: [u8; 4] = 0x7FFF_FFFFu32.to_le_bytes();
/// NVFP4 poison: an e4m3 NaN as a scale (and 6, −6 as values). Bit 7 clear: the sm_100a MMA
/// reads the scale rows past a group's rows in its last 128-row block (their products are
/// discarded) as UE4M3, which has no sign bit, and the model stops at a scale with bit 7 set.
const NAN_FP4: [u8; 1] = [0x7F];

/// A "device" buffer of `bytes` between two guards, all of it filled with a poison pattern
/// before the run.
struct Guarded {
    buf: DeviceBuf,
    bytes: usize,
    pattern: &'static [u8],
}

impl Guarded {
    fn new(bytes: usize, pattern: &'static [u8]) -> Guarded {
        assert_eq!(bytes % pattern.len(), 0);
        let fill: Vec<u8> = pattern.iter().copied().cycle().take(bytes + 2 * GUARD_BYTES).collect();
        Guarded { buf: DeviceBuf::from_bytes(&fill), bytes, pattern }
    }

    /// `elements` from the buffer's start (past the leading guard).
    fn view(&self, elements: usize) -> BufferView {
        BufferView { ptr: self.buf.addr() + GUARD_BYTES as u64, len: elements }
    }

    fn bytes(&self) -> &[u8] {
        &self.buf.bytes()[GUARD_BYTES..GUARD_BYTES + self.bytes]
    }

    fn u16s(&self) -> Vec<u16> {
        self.bytes().chunks_exact(2).map(|p| u16::from_le_bytes([p[0], p[1]])).collect()
    }

    fn u32s(&self) -> Vec<u32> {
        self.bytes().chunks_exact(4).map(|p| u32::from_le_bytes(p.try_into().unwrap())).collect()
    }

    /// The buffer's bytes as they were before the run.
    fn poison(&self) -> Vec<u8> {
        self.pattern.iter().copied().cycle().take(self.bytes).collect()
    }

    fn check_guards(&self, what: &str) {
        let all = self.buf.bytes();
        let end = GUARD_BYTES + self.bytes;
        let intact = |guard: &[u8]| guard.iter().zip(self.pattern.iter().cycle()).all(|(a, b)| a == b);
        assert!(intact(&all[..GUARD_BYTES]) && intact(&all[end..]), "{what}: a guard byte was written");
    }
}

/// The bytes `got` must equal, `want`, the first difference described.
fn same_bytes(what: &str, got: &[u8], want: &[u8], unit: usize) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!("{what}: byte {i} (element {}): got {:#04x}, want {:#04x}", i / unit, got[i], want[i]);
    }
}

/// The device: the architecture, its SMs, and on sm_100a the resident CTAs of each GEMM variant
/// (what the library asks the occupancy calculator).
#[derive(Clone, Copy, Debug)]
enum Device {
    Sm100 { sms: u32, residency: Residency },
    Sm90 { sms: u32 },
}

impl Device {
    fn arch(self) -> nvfp4_gemm::Arch {
        match self {
            Device::Sm100 { .. } => nvfp4_gemm::Arch::Sm100a,
            Device::Sm90 { .. } => nvfp4_gemm::Arch::Sm90a,
        }
    }

    fn sms(self) -> u32 {
        match self {
            Device::Sm100 { sms, .. } | Device::Sm90 { sms } => sms,
        }
    }
}

/// One block: the device, the options, the shape (`BlockShape`'s fields) and the router's
/// types.
#[derive(Clone, Copy, Debug)]
struct Case {
    device: Device,
    options: BlockOptions,
    first_expert: usize,
    experts: usize,
    hidden: usize,
    inter: usize,
    top_k: usize,
    max_tokens: usize,
    ids_i64: bool,
    weights_bf16: bool,
    run: ModelRun,
    /// Also run the first GEMM with the activation in its epilogue (sm_90a W4A4) and compare.
    fused: bool,
    /// sm_90a: the GEMMs' general kernel runs a group's last tile 64 wide (`MoeOptions::tail64`).
    tail64: bool,
    /// sm_90a: both GEMMs' schedulers in the quantization's launch (`sm90_quantize_schedule`,
    /// `SchedulerPlacement::InQuantization`), else each its own launch.
    in_quantization: bool,
    /// sm_90a W4A4: the gather and the activation write the GEMMs' f16 token workspaces, the
    /// GEMMs launch no dequantization (`TokenDequantization::InQuantizers`; with
    /// `in_quantization`).
    in_quantizers: bool,
}

impl Case {
    fn bf16(&self) -> bool {
        self.options.dtype == Dense16::Bf16
    }

    fn gated(&self) -> bool {
        self.options.activation.gated()
    }

    fn n1(&self) -> usize {
        if self.gated() {
            2 * self.inter
        } else {
            self.inter
        }
    }

    fn w4a4(&self) -> bool {
        self.options.precision == Precision::W4a4
    }
}

/// `v` rounded once to the block's 16-bit type, as bits.
fn round(v: f64, dtype: Dense16) -> u16 {
    match dtype {
        Dense16::F16 => f64_to_f16(v).to_bits(),
        Dense16::Bf16 => f64_to_bf16(v).to_bits(),
    }
}

/// `c`'s local experts as the checkpoint loader returns them: random weights (competition
/// distribution) with a global scale of their own, and each expert's two input scales (the
/// reference reads each expert's own).
fn experts(c: &Case, rng: &mut SplitMix64) -> LoadedExperts {
    let weight = |rows: usize, k: usize, g: f32, rng: &mut SplitMix64| {
        let m = random_matrix(rows, k, InputDistribution::Competition, rng).unwrap();
        PlainWeight { global_scale: g, ..PlainWeight::from(&m) }
    };
    // Input scales of each expert's own, as a calibrated checkpoint has them: the gather and the
    // activation quantize a row with its expert's (`GlobalScale::PerGroup`).
    let input_scales = |e: usize| ((0.02 * (1.0 + 0.25 * e as f64)) as f32, (0.01 * (1.0 + 0.4 * e as f64)) as f32);
    let experts = (0..c.experts)
        .map(|e| ExpertWeights {
            expert: c.first_expert + e,
            w13: weight(c.n1(), c.hidden, (0.02 + 0.002 * e as f64) as f32, rng),
            w2: weight(c.hidden, c.inter, (0.04 + 0.004 * e as f64) as f32, rng),
            w13_input_scale: input_scales(e).0,
            w2_input_scale: input_scales(e).1,
        })
        .collect();
    LoadedExperts { first_expert: c.first_expert, experts }
}

/// A GEMM's token quantizers' global scales, one per expert, on the "device" (as `ExpertBlock`
/// uploads them) and on the host.
struct Scales {
    host: Vec<f32>,
    device: DeviceBuf,
}

impl Scales {
    fn new(host: Vec<f32>) -> Scales {
        let device = DeviceBuf::from_bytes(&host.iter().flat_map(|s| s.to_le_bytes()).collect::<Vec<u8>>());
        Scales { host, device }
    }

    fn global_scale(&self) -> GlobalScale {
        GlobalScale::PerGroup(self.device.view(self.host.len()))
    }
}

/// One GEMM's weights of every local expert, stacked as `ExpertBlock` uploads them (values and
/// blocked scales of each expert back to back; W4A16: prepacked, bit for bit what its GPU
/// prepack writes), each expert's alpha, and each expert's block-scaled elements for the checks.
struct Weights {
    values: DeviceBuf,
    scales: DeviceBuf,
    per_values: usize,
    per_scales: usize,
    alphas: Vec<f32>,
    /// `e2m1 · e4m3` of every element (exact), `rows x k` per expert.
    exact: Vec<Vec<f64>>,
}

impl Weights {
    fn upload(weights: &[&PlainWeight], alphas: Vec<f32>, w4a16: Option<Activations>) -> Weights {
        let (rows, k) = (weights[0].rows, weights[0].k);
        let sizes = WeightStack { experts: weights.len(), rows, k }.sizes().unwrap();
        let (mut values, mut scales, mut exact) = (vec![], vec![], vec![]);
        for w in weights {
            let m = w.to_matrix().unwrap();
            exact.push(m.dequantize_block_scaled().into_iter().map(f64::from).collect());
            match w4a16 {
                None => {
                    values.extend_from_slice(m.values());
                    scales.extend_from_slice(m.scales());
                }
                Some(activations) => {
                    let p = prepack(&m, activations).unwrap();
                    values.extend_from_slice(&p.values);
                    scales.extend_from_slice(&p.scales);
                }
            }
        }
        assert_eq!((values.len(), scales.len()), (sizes.values, sizes.scales));
        let n = weights.len();
        Weights {
            values: DeviceBuf::from_bytes(&values),
            scales: DeviceBuf::from_bytes(&scales),
            per_values: sizes.values / n,
            per_scales: sizes.scales / n,
            alphas,
            exact,
        }
    }

    /// Each expert's operand: views into the stacks.
    fn views(&self) -> Vec<(BufferView, BufferView)> {
        (0..self.alphas.len())
            .map(|e| {
                (
                    BufferView { ptr: self.values.addr() + (e * self.per_values) as u64, len: self.per_values },
                    BufferView { ptr: self.scales.addr() + (e * self.per_scales) as u64, len: self.per_scales },
                )
            })
            .collect()
    }
}

/// A block planned as `ExpertBlock::new` plans it: the experts, the two GEMMs' problems, the
/// weights on the device, the quantizers' input scales.
struct Planned {
    case: Case,
    loaded: LoadedExperts,
    p1: MoeProblem,
    p2: MoeProblem,
    w13: Weights,
    w2: Weights,
    input_scales: (Scales, Scales),
    /// The first GEMM with the activation in its epilogue and its interleaved W13 (sm_90a W4A4
    /// cases that check it against the activation kernel).
    fused: Option<(MoeProblem, Weights)>,
}

impl Planned {
    fn new(case: Case, rng: &mut SplitMix64) -> Planned {
        let c = &case;
        let loaded = experts(c, rng);
        let input_scales = if c.w4a4() {
            (Scales::new(loaded.w13_input_scales()), Scales::new(loaded.w2_input_scales()))
        } else {
            (Scales::new(vec![1.0; c.experts]), Scales::new(vec![1.0; c.experts]))
        };
        let rows = c.max_tokens * c.top_k;
        let (output, activations) = match c.options.dtype {
            Dense16::F16 => (OutputType::F16, Activations::F16),
            Dense16::Bf16 => (OutputType::Bf16, Activations::Bf16),
        };
        let tokens = if c.w4a4() { TokenKind::Nvfp4 } else { TokenKind::Dense(activations) };
        let layout = TokenLayout::Contiguous { max_tokens: rows };
        let p1 = MoeProblem::new(c.experts, c.n1(), c.hidden, layout, output).unwrap().with_tokens(tokens);
        let p2 = MoeProblem::new(c.experts, c.hidden, c.inter, layout, output).unwrap().with_tokens(tokens);
        let prepacked = (!c.w4a4()).then_some(activations);
        // Each expert's alpha: its weight's global scale times its own input scale (W4A4; W4A16
        // reads no input scale), as `ExpertBlock::new` computes them.
        let input = |s: f32| if c.w4a4() { s } else { 1.0 };
        let w13: Vec<&PlainWeight> = loaded.experts.iter().map(|x| &x.w13).collect();
        let w2: Vec<&PlainWeight> = loaded.experts.iter().map(|x| &x.w2).collect();
        let a13: Vec<f32> = loaded.experts.iter().map(|x| x.w13.global_scale * input(x.w13_input_scale)).collect();
        let a2 = loaded.experts.iter().map(|x| x.w2.global_scale * input(x.w2_input_scale)).collect();
        let fused = c.fused.then(|| {
            let p = p1.clone().with_activation_epilogue(kernel_activation(c.options.activation), c.gated()).unwrap();
            let interleaved: Vec<PlainWeight> = loaded
                .experts
                .iter()
                .map(|x| if c.gated() { interleave_w13(&x.w13, c.inter) } else { x.w13.clone() })
                .collect();
            let refs: Vec<&PlainWeight> = interleaved.iter().collect();
            (p, Weights::upload(&refs, a13.clone(), None))
        });
        let w13 = Weights::upload(&w13, a13, prepacked);
        let w2 = Weights::upload(&w2, a2, prepacked);
        Planned { case, loaded, p1, p2, w13, w2, input_scales, fused }
    }
}

/// A GEMM's token operand: NVFP4 values and blocked scales, or 16-bit rows.
enum Tokens {
    Nvfp4 { values: Guarded, scales: Guarded },
    Dense(Guarded),
}

impl Tokens {
    fn new(p: &MoeProblem, w4a4: bool) -> Tokens {
        if w4a4 {
            let a = p.a_sizes();
            Tokens::Nvfp4 { values: Guarded::new(a.values, &NAN_FP4), scales: Guarded::new(a.scales, &NAN_FP4) }
        } else {
            Tokens::Dense(Guarded::new(2 * p.token_rows() * p.k(), &NAN16))
        }
    }

    /// The view the gather or the activation writes (`ExpertBlock`'s `Tokens::out`), with the
    /// GEMM's token workspace when it is theirs to write.
    fn out(&self, p: &MoeProblem, global_scale: GlobalScale, workspace: Option<BufferView>) -> BlockOutput {
        match self {
            Tokens::Nvfp4 { values, scales } => {
                let a = p.a_sizes();
                BlockOutput::Nvfp4 {
                    values: values.view(a.values),
                    scales: scales.view(a.scales),
                    global_scale,
                    workspace,
                }
            }
            Tokens::Dense(d) => BlockOutput::Dense(d.view(p.token_rows() * p.k())),
        }
    }

    /// The operand the GEMM reads.
    fn operand(&self, p: &MoeProblem) -> MoeTokens {
        match self {
            Tokens::Nvfp4 { values, scales } => {
                let a = p.a_sizes();
                MoeTokens::Nvfp4 { values: values.view(a.values), scales: scales.view(a.scales) }
            }
            Tokens::Dense(d) => {
                let TokenKind::Dense(kind) = p.tokens() else { unreachable!("a W4A16 problem") };
                MoeTokens::Dense { activations: d.view(p.token_rows() * p.k()), kind }
            }
        }
    }

    fn check_guards(&self, what: &str) {
        match self {
            Tokens::Nvfp4 { values, scales } => {
                values.check_guards(&format!("{what} values"));
                scales.check_guards(&format!("{what} scales"));
            }
            Tokens::Dense(d) => d.check_guards(what),
        }
    }

    /// Row `r`'s operand values as the GEMM multiplies them (`e2m1 · e4m3`, or the 16-bit
    /// values), exact; `scale_row` is the row's scale row (`scale_first + i`).
    fn row(&self, r: usize, scale_row: u32, k: usize, bf16: bool) -> Vec<f64> {
        match self {
            Tokens::Nvfp4 { values, scales } => {
                let (v, s, rk) = (values.bytes(), scales.bytes(), rest_k(k as u32));
                (0..k)
                    .map(|c| {
                        let byte = v[r * k / 2 + c / 2];
                        let code = if c % 2 == 0 { byte & 0xF } else { byte >> 4 };
                        let scale = s[blocked_offset(scale_row, (c / 16) as u32, rk)];
                        e2m1_to_f32(code) as f64 * e4m3_to_f32(scale) as f64
                    })
                    .collect()
            }
            Tokens::Dense(d) => d.u16s()[r * k..(r + 1) * k].iter().map(|&b| half_to_f64(b, bf16)).collect(),
        }
    }
}

/// Checks a token operand the gather or the activation wrote: each row of a group is `row(r)`
/// (16-bit bits) — quantized by the CPU quantizer with its group's entry of `global_scales` into
/// the row's values and its scale row (W4A4), or as it is (W4A16) — and every other byte still
/// poison.
fn check_tokens(
    what: &str,
    tokens: &Tokens,
    p: &MoeProblem,
    groups: &[GroupRows],
    row: impl Fn(usize) -> Vec<u16>,
    global_scales: &[f32],
    bf16: bool,
) {
    let k = p.k();
    match tokens {
        Tokens::Nvfp4 { values, scales } => {
            let (mut want_v, mut want_s, rk) = (values.poison(), scales.poison(), rest_k(k as u32));
            for (g, scale) in groups.iter().zip(global_scales) {
                for i in 0..g.rows {
                    let r = (g.first + i) as usize;
                    let v: Vec<f64> = row(r).iter().map(|&b| half_to_f64(b, bf16)).collect();
                    let q = quantize_with_global_scale(&v, 1, k, *scale).unwrap();
                    want_v[r * k / 2..(r + 1) * k / 2].copy_from_slice(q.values());
                    for j in 0..(k / 16) as u32 {
                        want_s[blocked_offset(g.scale_first + i, j, rk)] = q.scales()[blocked_offset(0, j, rk)];
                    }
                }
            }
            same_bytes(&format!("{what} values"), values.bytes(), &want_v, k / 2);
            same_bytes(&format!("{what} scales"), scales.bytes(), &want_s, 1);
        }
        Tokens::Dense(d) => {
            let mut want = d.poison();
            for g in groups {
                for r in g.first as usize..(g.first + g.rows) as usize {
                    let bytes: Vec<u8> = row(r).iter().flat_map(|b| b.to_le_bytes()).collect();
                    want[2 * r * k..2 * (r + 1) * k].copy_from_slice(&bytes);
                }
            }
            same_bytes(what, d.bytes(), &want, 2 * k);
        }
    }
}

/// Checks a GEMM's output `c` (`token_rows x n`): each row of group `g` within the GEMM tests'
/// tolerance of `alpha_g · Σ_k a · w` in fp64 (`a` the operand the device wrote, `w` the
/// weights' block-scaled elements) rounded to the output type, every other row still poison.
/// Returns the elements not equal to the rounded product (one step apart near a rounding
/// boundary, as accumulation order allows).
#[allow(clippy::too_many_arguments)]
fn check_gemm(
    what: &str,
    c: &Guarded,
    n: usize,
    k: usize,
    groups: &[GroupRows],
    tokens: &Tokens,
    weights: &Weights,
    dtype: Dense16,
) -> usize {
    let bf16 = dtype == Dense16::Bf16;
    let tol = if bf16 { BF16_TOLERANCE } else { Tolerance::COMPETITION };
    let got = c.u16s();
    let mut owned = vec![false; got.len() / n];
    let mut inexact = 0;
    for (e, g) in groups.iter().enumerate() {
        for i in 0..g.rows {
            let r = (g.first + i) as usize;
            owned[r] = true;
            let a = tokens.row(r, g.scale_first + i, k, bf16);
            for (col, w) in weights.exact[e].chunks_exact(k).enumerate() {
                let sum: f64 = a.iter().zip(w).map(|(x, y)| x * y).sum();
                let want = half_to_f64(round(sum * weights.alphas[e] as f64, dtype), bf16);
                let have = half_to_f64(got[r * n + col], bf16);
                assert!(
                    tol.accepts(have, want),
                    "{what}: expert {e} row {r} column {col}: got {have}, want {want} ({tol:?})"
                );
                inexact += (have != want) as usize;
            }
        }
    }
    for (r, _) in owned.iter().enumerate().filter(|(_, o)| !**o) {
        assert!(
            got[r * n..(r + 1) * n].iter().all(|&b| b == u16::from_le_bytes(NAN16)),
            "{what}: row {r} of no group was written"
        );
    }
    inexact
}

/// What one call did, for the report.
struct Outcome {
    normalized: f64,
    worst_element: f64,
    y_inexact: usize,
    gemm_inexact: [usize; 2],
    kernels: Vec<String>,
}

/// Random router outputs for `tokens` tokens: ids over the local range widened on both sides
/// (other ranks' experts below and above it) and −1, the last local expert never chosen, token 0
/// routed twice to the first local expert; weights in [0.1, 1] (exactly bf16 values with bf16
/// weights).
fn router(c: &Case, tokens: usize, rng: &mut SplitMix64) -> RouterOutput {
    let (first, e) = (c.first_expert as i64, c.experts as i64);
    let mut ids: Vec<i64> = (0..tokens * c.top_k)
        .map(|_| match rng.below(8) {
            0 => -1,
            1 => first - 1 - rng.below(2) as i64,
            2 => first + e + rng.below(3) as i64,
            _ => first + rng.below(e as u64 - 1) as i64,
        })
        .collect();
    if tokens > 0 && c.top_k > 1 {
        ids[0] = first;
        ids[1] = first;
    }
    let weights = (0..tokens * c.top_k)
        .map(|_| {
            let w = (0.1 + 0.9 * rng.next_f64()) as f32;
            if c.weights_bf16 {
                half::bf16::from_f32(w).to_f32()
            } else {
                w
            }
        })
        .collect();
    RouterOutput { ids, weights, top_k: c.top_k }
}

/// Runs a kernel of the block in the model.
fn launch_kernel<P: Copy + Sync>(
    what: &str,
    name: &str,
    c: &Case,
    geometry: LaunchGeometry,
    entry: unsafe fn(P),
    params: P,
) -> String {
    let cfg = launch_config(model_arch(c.device.arch()), geometry, 1, &c.run);
    // SAFETY: the parameters are what the library's checks return for live buffers of this test
    // that outlive the launch; the model checks every device access.
    let stats = nvfp4_gemm_model::launch(&cfg, || unsafe { entry(params) })
        .unwrap_or_else(|e| panic!("{what}: {name} failed in the model: {e}"));
    format!("{name} grid {} ({} model instructions)", geometry.grid, stats.instructions)
}

/// Runs a device-sized GEMM of the chain in the model on `buffers` (validated as `MoePlan::run`
/// validates them) and checks what its scheduler wrote for the device's `offsets`.
/// One GEMM of the chain; `slots` (T · top_k) bounds its routed rows, as the block tells its plans.
/// With `prepared` (sm_90a: its scheduler ran in `sm90_quantize_schedule`), the launches after
/// the scheduler.
fn run_gemm(
    what: &str,
    c: &Case,
    p: &MoeProblem,
    buffers: &MoeBuffers,
    groups: &[GroupRows],
    slots: usize,
    prepared: Option<Sm90Prepared>,
) -> Vec<String> {
    validate_moe_buffers(p, buffers).unwrap_or_else(|e| panic!("{what}: {e}"));
    let launched = match c.device {
        Device::Sm90 { .. } if prepared.is_some() => {
            let prepared = prepared.unwrap();
            let (launched, outcome, _) =
                prepared.run_after_scheduler(vec![], &c.run).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(outcome.status, 0, "{what}: status word");
            decode_alone(what, p, slots, &launched);
            launched
        }
        Device::Sm100 { residency, .. } => {
            let (launched, outcome, layout) =
                run_sm100_moe_on(p, buffers, residency, &c.run).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(outcome.status, 0, "{what}: status word");
            let expected = expected_device_list(&layout, p, groups);
            assert!(outcome.work == expected, "{what}: the device list differs from the host-built one");
            for (e, (g, r)) in outcome.groups.iter().zip(groups).enumerate() {
                assert_eq!((g.m, g.token_row), (r.rows, r.first), "{what}: expert {e}");
            }
            launched
        }
        Device::Sm90 { sms } => {
            let (launched, outcome, _) = run_sm90_moe_routed(p, buffers, sms, &sm90_options(c), Some(slots), &c.run)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(outcome.status, 0, "{what}: status word");
            decode_alone(what, p, slots, &launched);
            launched
        }
    };
    launched
        .iter()
        .map(|l| format!("{} grid {} ({} model instructions)", l.kernel, l.geometry.grid, l.stats.instructions))
        .collect()
}

/// The block's options for its sm_90a GEMM plans in this case.
fn sm90_options(c: &Case) -> MoeOptions {
    MoeOptions { tail64: c.tail64, spans192: !c.tail64, caller_dequantizes: c.in_quantizers, ..MoeOptions::default() }
}

/// At most 16 routed rows: the GEMMs launch their decode kernel alone (as `MoePlan` is told).
fn decode_alone(what: &str, p: &MoeProblem, slots: usize, launched: &[Launched]) {
    if slots <= 16 && p.activation_epilogue().is_none() {
        let gemms: Vec<_> = launched.iter().map(|l| l.kernel).filter(|k| k.contains("gemm")).collect();
        assert!(gemms.iter().all(|k| k.ends_with("_decode")), "{what}: {slots} rows launched {gemms:?}");
    }
}

fn kernel_activation(a: Activation) -> KernelActivation {
    match a {
        Activation::Silu => KernelActivation::Silu,
        Activation::GeluTanh => KernelActivation::GeluTanh,
        Activation::Relu2 => KernelActivation::Relu2,
    }
}

/// One call of the block on `tokens` random tokens: the chain in the model, then every check.
fn call(b: &Planned, tokens: usize, rng: &mut SplitMix64) -> Outcome {
    let c = &b.case;
    let what = format!("{:?} {:?} T={tokens}", c.device.arch(), c.options);
    let (e, h, top_k, dtype, bf16) = (c.experts, c.hidden, c.top_k, c.options.dtype, c.bf16());
    let (n1, inter, rows, slots) = (c.n1(), c.inter, c.max_tokens * top_k, tokens * top_k);
    let at_input = c.options.router_weight_at == RouterWeightAt::Input;
    let (p1, p2) = (&b.p1, &b.p2);

    // The caller's inputs: x (token 2 all zeros), ids and weights.
    let x: Vec<u16> = (0..tokens * h).map(|i| if i / h == 2 { 0 } else { round(rng.normal(), dtype) }).collect();
    let routed = router(c, tokens, rng);
    let x_bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let id_bytes: Vec<u8> = if c.ids_i64 {
        routed.ids.iter().flat_map(|v| v.to_le_bytes()).collect()
    } else {
        routed.ids.iter().flat_map(|&v| (v as i32).to_le_bytes()).collect()
    };
    let weight_bytes: Vec<u8> = if c.weights_bf16 {
        routed.weights.iter().flat_map(|&w| half::bf16::from_f32(w).to_bits().to_le_bytes()).collect()
    } else {
        routed.weights.iter().flat_map(|w| w.to_le_bytes()).collect()
    };
    let (x_buf, ids_buf, w_buf) =
        (DeviceBuf::from_bytes(&x_bytes), DeviceBuf::from_bytes(&id_bytes), DeviceBuf::from_bytes(&weight_bytes));
    let (ids_type, weights_type) = (
        if c.ids_i64 { IdType::I64 } else { IdType::I32 },
        if c.weights_bf16 { WeightType::Bf16 } else { WeightType::F32 },
    );

    // The block's buffers, as `ExpertBlock::new` sizes them, poisoned; and the output.
    let offsets = Guarded::new(4 * (e + 1), &NAN32);
    let (slot_row, row_token, row_weight) = (
        Guarded::new(4 * rows.max(4), &NAN32),
        Guarded::new(4 * rows.max(4), &NAN32),
        Guarded::new(4 * rows.max(4), &NAN32),
    );
    let a = Tokens::new(p1, c.w4a4());
    let hb = Guarded::new(2 * rows * n1, &NAN16);
    let z = Tokens::new(p2, c.w4a4());
    let o = Guarded::new(2 * rows * h, &NAN16);
    let y = Guarded::new(2 * tokens * h, &NAN16);
    let (s13, s2) = (&b.input_scales.0, &b.input_scales.1);
    let sms = c.device.sms();
    let mut kernels = vec![];

    // Route, then gather (+ quantize): `run_views`' first two launches.
    let routing = Routing { tokens, top_k, first_expert: c.first_expert as i64, experts: e };
    let route = RouteViews {
        ids: ids_buf.view(slots),
        ids_type,
        weights: at_input.then_some(w_buf.view(slots)),
        weights_type,
        offsets: offsets.view(e + 1),
        slot_row: slot_row.view(slots),
        row_token: row_token.view(slots),
        row_weight: at_input.then(|| row_weight.view(slots)),
        // The chain's routings are small: the one-CTA path, no scratch.
        scratch: BufferView { ptr: 0, len: 0 },
    };
    let params = route_params(routing, route).unwrap_or_else(|err| panic!("{what}: {err}"));
    kernels.push(launch_kernel(&what, "moe_route", c, route_launch(), moe_route, params));
    let gather = GatherInputs {
        x: x_buf.view(tokens * h),
        tokens,
        row_token: Some(row_token.view(p1.token_rows())),
        row_weight: at_input.then(|| row_weight.view(p1.token_rows())),
        sizes: offsets.view(e + 1),
    };

    // Both GEMMs' calls (the block's buffers; the sizes are read on the device).
    let gemm1 = MoeBuffers {
        sizes: offsets.view(e + 1),
        a: a.operand(p1),
        weights: b.w13.views(),
        alphas: b.w13.alphas.clone(),
        c: hb.view(rows * n1),
        c_type: p1.output(),
        activated: None,
    };
    let gemm2 = MoeBuffers {
        sizes: offsets.view(e + 1),
        a: z.operand(p2),
        weights: b.w2.views(),
        alphas: b.w2.alphas.clone(),
        c: o.view(rows * h),
        c_type: p2.output(),
        activated: None,
    };
    // With the schedulers in the quantization's launch (sm_90a) the block prepares both calls
    // and runs their schedulers there.
    let mut prepared = match c.device {
        Device::Sm90 { sms } if c.in_quantization => {
            let prepare = |p: &MoeProblem, buffers: &MoeBuffers| {
                validate_moe_buffers(p, buffers).unwrap_or_else(|e| panic!("{what}: {e}"));
                Sm90Prepared::routed(p, buffers, sms, &sm90_options(c), Some(slots))
            };
            Some((prepare(p1, &gemm1), prepare(p2, &gemm2)))
        }
        _ => None,
    };
    // With the dequantization in the quantizers, each GEMM's workspace (poisoned) is written by
    // the kernel that quantizes its tokens.
    assert!(!c.in_quantizers || prepared.is_some(), "{what}: in_quantizers runs the prepared calls");
    let workspaces = match &mut prepared {
        Some((one, two)) if c.in_quantizers => (Some(one.poisoned_workspace(0xA5)), Some(two.poisoned_workspace(0xA5))),
        _ => (None, None),
    };
    let (params, items) = gather_params(p1, bf16, &gather, a.out(p1, s13.global_scale(), workspaces.0))
        .unwrap_or_else(|err| panic!("{what}: {err}"));
    let (prepared1, prepared2) = match prepared {
        Some((one, two)) => {
            let schedules = [one.schedule_params(), two.schedule_params()];
            let geometry = quantize_schedule_launch(items, sms, p1.groups() as u32);
            let params = QuantizeScheduleParams { quantize: params, schedules };
            kernels.push(launch_kernel(&what, "sm90_quantize_schedule", c, geometry, sm90_quantize_schedule, params));
            (Some(one), Some(two))
        }
        None => {
            let geometry = convert_launch(items, sms * CTAS_PER_SM);
            kernels.push(launch_kernel(&what, "nvfp4_quantize_grouped", c, geometry, nvfp4_quantize_grouped, params));
            (None, None)
        }
    };

    // The device's offsets decide the GEMMs' groups (the schedulers read them on the device;
    // the checks need them on the host).
    let device_offsets = offsets.u32s();
    let (groups1, status) = p1.group_rows(&device_offsets).unwrap();
    assert!(status.is_ok(), "{what}: offsets {device_offsets:?} beyond the bound");
    let (groups2, _) = p2.group_rows(&device_offsets).unwrap();

    // First GEMM: A x W13 -> h.
    kernels.extend(run_gemm(&format!("{what}: first GEMM"), c, p1, &gemm1, &groups1, slots, prepared1));

    // Activation (+ requantization).
    let (params, items, parts) = activate_params(
        p2,
        kernel_activation(c.options.activation),
        c.gated(),
        bf16,
        hb.view(rows * n1),
        offsets.view(e + 1),
        z.out(p2, s2.global_scale(), workspaces.1),
        usize::MAX,
    )
    .unwrap_or_else(|err| panic!("{what}: {err}"));
    let geometry = convert_launch(items, sms * CTAS_PER_SM);
    kernels.push(if parts == 1 {
        launch_kernel(&what, "moe_activate_blocks", c, geometry, moe_activate_blocks, params)
    } else {
        launch_kernel(&what, "moe_activate", c, geometry, moe_activate, params)
    });

    // The first GEMM again with the activation in its epilogue (interleaved W13): its `z` must
    // be the activation kernel's, byte for byte, poison included.
    if let Some((pf, w13f)) = &b.fused {
        let zf = Tokens::new(p2, true);
        let Tokens::Nvfp4 { values, scales } = &zf else { unreachable!("W4A4") };
        let zs = p2.a_sizes();
        let fused = MoeBuffers {
            sizes: offsets.view(e + 1),
            a: a.operand(p1),
            weights: w13f.views(),
            alphas: w13f.alphas.clone(),
            c: BufferView { ptr: hb.view(0).ptr, len: 0 },
            c_type: p1.output(),
            activated: Some(ActivatedOutput {
                values: values.view(zs.values),
                scales: scales.view(zs.scales),
                global_scale: s2.global_scale(),
            }),
        };
        // Its own plan, which dequantizes the tokens itself.
        kernels.extend(run_gemm(
            &format!("{what}: first GEMM, activation epilogue"),
            &Case { in_quantizers: false, ..*c },
            pf,
            &fused,
            &groups1,
            slots,
            None,
        ));
        let (Tokens::Nvfp4 { values: zv, scales: zsc }, Tokens::Nvfp4 { values: fv, scales: fs }) = (&z, &zf) else {
            unreachable!("W4A4")
        };
        same_bytes(&format!("{what}: fused z values"), fv.bytes(), zv.bytes(), inter / 2);
        same_bytes(&format!("{what}: fused z scales"), fs.bytes(), zsc.bytes(), 1);
        zf.check_guards(&format!("{what}: fused Z"));
    }

    // Second GEMM: Z x W2 -> o.
    kernels.extend(run_gemm(&format!("{what}: second GEMM"), c, p2, &gemm2, &groups2, slots, prepared2));

    // Combine (no launch for T = 0).
    let views = CombineViews {
        o: o.view(rows * h),
        slot_row: slot_row.view(slots),
        weights: (!at_input).then_some(w_buf.view(slots)),
        weights_type,
        y: y.view(tokens * h),
        bf16,
    };
    if let Some(params) = combine_params(tokens, top_k, h, views).unwrap_or_else(|err| panic!("{what}: {err}")) {
        let geometry = combine_launch(combine_items(params.tokens, params.hidden), sms * COMBINE_CTAS_PER_SM);
        kernels.push(launch_kernel(&what, "moe_combine", c, geometry, moe_combine, params));
    }

    // Routing: a stable CPU sort of the local slots by expert.
    let local = |id: i64| {
        let d = id - c.first_expert as i64;
        (0..e as i64).contains(&d).then_some(d as usize)
    };
    let mut order: Vec<usize> = (0..slots).filter(|&s| local(routed.ids[s]).is_some()).collect();
    order.sort_by_key(|&s| local(routed.ids[s]));
    let mut want_offsets = vec![0u32; e + 1];
    for &s in &order {
        want_offsets[local(routed.ids[s]).unwrap() + 1] += 1;
    }
    for i in 0..e {
        want_offsets[i + 1] += want_offsets[i];
    }
    assert_eq!(device_offsets, want_offsets, "{what}: offsets");
    assert_eq!(want_offsets[e], want_offsets[e - 1], "{what}: the last local expert has no token");
    let poison32 = u32::from_le_bytes(NAN32);
    let mut want_slot_row = vec![poison32; rows.max(4)];
    want_slot_row[..slots].fill(NOT_LOCAL);
    let (mut want_row_token, mut want_row_weight) = (vec![poison32; rows.max(4)], vec![poison32; rows.max(4)]);
    for (r, &s) in order.iter().enumerate() {
        want_slot_row[s] = r as u32;
        want_row_token[r] = (s / top_k) as u32;
        if at_input {
            want_row_weight[r] = routed.weights[s].to_bits();
        }
    }
    assert_eq!(slot_row.u32s(), want_slot_row, "{what}: slot_row (entries past T · top_k poisoned)");
    assert_eq!(row_token.u32s(), want_row_token, "{what}: row_token (rows past offsets[E] poisoned)");
    assert_eq!(row_weight.u32s(), want_row_weight, "{what}: row_weight");

    // Gather: each sorted row is its token's row (times its weight, at the input), quantized.
    let gathered = |r: usize| -> Vec<u16> {
        let s = order[r];
        let row = &x[s / top_k * h..(s / top_k + 1) * h];
        if at_input {
            let w = routed.weights[s] as f64;
            row.iter().map(|&v| round(half_to_f64(v, bf16) * w, dtype)).collect()
        } else {
            row.to_vec()
        }
    };
    check_tokens(&format!("{what}: gathered tokens"), &a, p1, &groups1, gathered, &s13.host, bf16);

    // First GEMM on the tokens the device wrote.
    let inexact1 = check_gemm(&format!("{what}: h"), &hb, n1, h, &groups1, &a, &b.w13, dtype);

    // Activation of the h the device wrote, exactly as the contract's step 4 with the kernel's
    // f32 activation (`abi::moe::block::activated`), then quantized.
    let hv = hb.u16s();
    let act = kernel_activation(c.options.activation);
    let activated_row = |r: usize| -> Vec<u16> {
        (0..inter)
            .map(|j| {
                let up = c.gated().then(|| hv[r * n1 + inter + j]);
                round(activated(act, hv[r * n1 + j], up, bf16), dtype)
            })
            .collect()
    };
    check_tokens(&format!("{what}: activated tokens"), &z, p2, &groups2, activated_row, &s2.host, bf16);

    // Second GEMM on the tokens the device wrote.
    let inexact2 = check_gemm(&format!("{what}: o"), &o, h, inter, &groups2, &z, &b.w2, dtype);

    // Combine of the o the device wrote.
    let (ov, yv, sr) = (o.u16s(), y.u16s(), slot_row.u32s());
    for t in 0..tokens {
        let slot_rows = &sr[t * top_k..(t + 1) * top_k];
        let weight = |k: usize| if at_input { 1.0 } else { routed.weights[t * top_k + k] };
        for col in 0..h {
            let sum = combine_sum(slot_rows, rows as u32, weight, |r| ov[r as usize * h + col], bf16);
            let want = if bf16 { half::bf16::from_f32(sum).to_bits() } else { half::f16::from_f32(sum).to_bits() };
            assert_eq!(yv[t * h + col], want, "{what}: y[{t}, {col}] (f32 sum {sum:e})");
        }
    }

    // Nothing outside the outputs was written.
    for (name, g) in [("offsets", &offsets), ("slot_row", &slot_row), ("row_token", &row_token)] {
        g.check_guards(&format!("{what}: {name}"));
    }
    for (name, g) in [("row_weight", &row_weight), ("h", &hb), ("o", &o), ("y", &y)] {
        g.check_guards(&format!("{what}: {name}"));
    }
    a.check_guards(&format!("{what}: A"));
    z.check_guards(&format!("{what}: Z"));
    assert_eq!(x_buf.bytes(), &x_bytes[..], "{what}: x was written");
    assert_eq!(ids_buf.bytes(), &id_bytes[..], "{what}: topk_ids were written");
    assert_eq!(w_buf.bytes(), &weight_bytes[..], "{what}: topk_weights were written");

    // The whole block against the contract.
    let x64: Vec<f64> = x.iter().map(|&v| half_to_f64(v, bf16)).collect();
    let want = round_output_as(&reference(&x64, h, &routed, &b.loaded, &c.options).unwrap(), dtype);
    let got: Vec<f64> = yv.iter().map(|&v| half_to_f64(v, bf16)).collect();
    assert!(got.iter().all(|v| v.is_finite()), "{what}: a non-finite output");
    for t in 0..tokens {
        if (0..top_k).all(|k| local(routed.ids[t * top_k + k]).is_none()) {
            assert!(yv[t * h..(t + 1) * h].iter().all(|&v| v == 0), "{what}: token {t} has no local slot: +0");
        }
    }
    let norm = |v: &mut dyn Iterator<Item = f64>| v.fold(0.0, |s, x| s + x * x).sqrt();
    let err = norm(&mut got.iter().zip(&want).map(|(g, w)| g - w));
    let scale = norm(&mut want.iter().copied());
    let normalized = if scale == 0.0 { err } else { err / scale };
    assert!(normalized <= BLOCK_TOLERANCE, "{what}: ‖y − ref‖ / ‖ref‖ = {normalized:e}");
    let largest = want.iter().fold(0f64, |m, v| m.max(v.abs()));
    let worst = got.iter().zip(&want).fold(0f64, |m, (g, w)| m.max((g - w).abs()));
    Outcome {
        normalized,
        worst_element: if largest == 0.0 { worst } else { worst / largest },
        y_inexact: got.iter().zip(&want).filter(|(g, w)| g != w).count(),
        gemm_inexact: [inexact1, inexact2],
        kernels,
    }
}

/// Plans `case` and runs the block on each token count, printing what each call gave and the
/// largest normalized error.
fn run_case(name: &str, case: Case, token_counts: &[usize], seed: u64) {
    assert!(token_counts.iter().all(|&t| t <= case.max_tokens));
    let mut rng = SplitMix64::new(seed);
    let planned = Planned::new(case, &mut rng);
    let mut worst = 0f64;
    for &tokens in token_counts {
        let t = std::time::Instant::now();
        let r = call(&planned, tokens, &mut rng);
        worst = worst.max(r.normalized);
        println!(
            "{name} T={tokens}: ‖y − ref‖/‖ref‖ = {:.3e}, worst |y − ref| / max|ref| = {:.3e}, {} of {} y \
             elements differ from the rounded reference, GEMM elements one step off: {:?}; {:.2?} ({})",
            r.normalized,
            r.worst_element,
            r.y_inexact,
            tokens * case.hidden,
            r.gemm_inexact,
            t.elapsed(),
            r.kernels.join(", ")
        );
    }
    println!("{name}: worst ‖y − ref‖/‖ref‖ {worst:.3e} (bound {BLOCK_TOLERANCE:e})");
}

/// B200: 148 SMs, one CTA of the 6-stage 128-wide GEMM per SM (what its occupancy gives).
const B200: Device = Device::Sm100 { sms: 148, residency: Residency::deep(148) };

/// 8 local experts from global id 4 (ids −1, 1..3 and 12..14 are not local; the last local
/// expert gets no token), top-3, H = 256, I = 128, at most 40 tokens; int32 ids and f32 weights,
/// the router weight at the combine.
fn case(device: Device, activation: Activation, precision: Precision, dtype: Dense16) -> Case {
    Case {
        device,
        options: BlockOptions::new(activation, precision, dtype),
        first_expert: 4,
        experts: 8,
        hidden: 256,
        inter: 128,
        top_k: 3,
        max_tokens: 40,
        ids_i64: false,
        weights_bf16: false,
        run: ModelRun::default(),
        fused: false,
        tail64: false,
        in_quantization: false,
        in_quantizers: false,
    }
}

/// sm_100a, gated silu on a B200's residency (the 128-wide 6-stage GEMM): bf16 with the router
/// weight at the combine for T = 0, 1, 17 and the bound 40; f16 with the weight at the input,
/// int64 ids and bf16 weights.
#[test]
fn model_moe_block_chain_sm100_silu() {
    let c = case(B200, Activation::Silu, Precision::W4a4, Dense16::Bf16);
    run_case("sm100 silu bf16", c, &[0, 1, 17, 40], 1);
    let c = Case {
        options: c.options.with_router_weight_at(RouterWeightAt::Input),
        ids_i64: true,
        weights_bf16: true,
        ..case(B200, Activation::Silu, Precision::W4a4, Dense16::F16)
    };
    run_case("sm100 silu f16 at input", c, &[13], 2);
}

/// sm_100a, relu2 (not gated: W13 is W1 alone) on one SM with two 3-stage GEMM CTAs (the
/// shallow variant; the quantizer's, activation's and combine's threads stride over many
/// items), shared memory starting as NaN and completions in a random order: f16 with the router
/// weight at the input, int64 ids and bf16 weights, 5 local experts from global id 2, top-2,
/// H = 128, I = 64; then bf16 with the weight at the combine.
#[test]
fn model_moe_block_chain_sm100_relu2() {
    let device = Device::Sm100 { sms: 1, residency: Residency::shallow(1) };
    let c = Case {
        options: BlockOptions::new(Activation::Relu2, Precision::W4a4, Dense16::F16)
            .with_router_weight_at(RouterWeightAt::Input),
        first_expert: 2,
        experts: 5,
        hidden: 128,
        inter: 64,
        top_k: 2,
        max_tokens: 24,
        ids_i64: true,
        weights_bf16: true,
        run: ModelRun { smem_fill: 0xFF, ..ModelRun::ordered(Completion::Random, 7) },
        ..case(device, Activation::Relu2, Precision::W4a4, Dense16::F16)
    };
    run_case("sm100 relu2 f16 at input", c, &[1, 9, 24], 3);
    let c = Case { options: BlockOptions::new(Activation::Relu2, Precision::W4a4, Dense16::Bf16), ..c };
    run_case("sm100 relu2 bf16", c, &[20], 4);
}

/// sm_100a, gated gelu_tanh, bf16, on a B200's residency.
#[test]
fn model_moe_block_chain_sm100_gelu_tanh() {
    let c = Case { hidden: 128, ..case(B200, Activation::GeluTanh, Precision::W4a4, Dense16::Bf16) };
    run_case("sm100 gelu_tanh bf16", c, &[7], 5);
}

/// sm_90a, W4A4 (the token dequantization, then the GEMM), gated silu, f16, 3 local experts,
/// H = 128, I = 64, on 3 SMs: T = 5 (the decode GEMM: no expert has more than 16 rows) and 32
/// (the general GEMM: the two experts that get tokens have about 30 rows each); the schedulers
/// as launches of their own, then in the quantization's launch, then also the tokens dequantized
/// by the gather and the activation into the GEMMs' workspaces (no dequantization launches).
#[test]
fn model_moe_block_chain_sm90_w4a4() {
    let device = Device::Sm90 { sms: 3 };
    let c = Case {
        experts: 3,
        hidden: 128,
        inter: 64,
        max_tokens: 32,
        fused: true,
        ..case(device, Activation::Silu, Precision::W4a4, Dense16::F16)
    };
    run_case("sm90 w4a4 silu f16", c, &[5, 32], 6);
    run_case("sm90 w4a4 silu f16, schedulers in the quantization", Case { in_quantization: true, ..c }, &[5, 32], 11);
    run_case(
        "sm90 w4a4 silu f16, schedulers in the quantization, tokens dequantized by the quantizers",
        Case { in_quantization: true, in_quantizers: true, ..c },
        &[5, 32],
        12,
    );
}

/// sm_90a, W4A4, with the first GEMM also run with the activation in its epilogue (general
/// kernels, interleaved W13) and its `z` compared byte for byte with the activation kernel's:
/// relu2 in bf16 with I = 192 (N = 192: the second 128-row weight tile has one warpgroup's slice,
/// the other past N) at T = 48 (two experts of about 70 rows: both 64-row rounds of a 128-token
/// tile), and gated gelu_tanh in bf16 with I = 128 (two tiles of two slices each) on the 64-wide
/// tail tiles (`sm90_grouped_gemm_t64`).
#[test]
fn model_moe_block_chain_sm90_w4a4_activation_epilogue() {
    let device = Device::Sm90 { sms: 2 };
    let c = Case {
        experts: 3,
        hidden: 128,
        inter: 192,
        max_tokens: 48,
        fused: true,
        in_quantization: true,
        ..case(device, Activation::Relu2, Precision::W4a4, Dense16::Bf16)
    };
    run_case("sm90 w4a4 relu2 bf16, activation epilogue", c, &[48], 9);
    let c = Case { inter: 128, ..case(device, Activation::GeluTanh, Precision::W4a4, Dense16::Bf16) };
    run_case(
        "sm90 w4a4 gelu_tanh bf16, activation epilogue",
        Case { fused: true, tail64: true, experts: 3, hidden: 128, max_tokens: 20, ..c },
        &[20],
        10,
    );
}

/// sm_90a, W4A16 (16-bit tokens, prepacked weights) on 2 SMs, H = 128, I = 64: relu2 in bf16
/// with the router weight at the input and int64 ids, gated silu in f16 at the combine.
#[test]
fn model_moe_block_chain_sm90_w4a16() {
    let device = Device::Sm90 { sms: 2 };
    let c = Case {
        options: BlockOptions::new(Activation::Relu2, Precision::W4a16, Dense16::Bf16)
            .with_router_weight_at(RouterWeightAt::Input),
        hidden: 128,
        inter: 64,
        max_tokens: 24,
        ids_i64: true,
        in_quantization: true,
        ..case(device, Activation::Relu2, Precision::W4a16, Dense16::Bf16)
    };
    run_case("sm90 w4a16 relu2 bf16 at input", c, &[24], 7);
    let c = Case {
        hidden: 128,
        inter: 64,
        max_tokens: 24,
        ..case(device, Activation::Silu, Precision::W4a16, Dense16::F16)
    };
    run_case("sm90 w4a16 silu f16", c, &[11], 8);
}
