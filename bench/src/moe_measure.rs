//! The MoE rows on the GPU (`Bench::moe_shape`): for one [`MoeShape`] and its seeded routing, bf16
//! activations on the device are quantized on the GPU (`Quantizer::quantize_grouped`, contiguous
//! layout) and multiplied by every expert's NVFP4 weights in three ways, each checked once
//! against the CPU reference and then timed like the kernel-only rows:
//!
//! - (a) `GemmPlan::run`, the sizes known on the host (each group's A and C are slices of the
//!   grouped tensors / its own C);
//! - (b) `MoePlan::run`, the sizes read on the device, for each `--moe-kernels` option (its own
//!   plan);
//! - (c) a CUDA graph holding (b), captured once per option and replayed.
//!
//! (b) is also timed with new tensors every call: the first option's plan on the next of
//! `max(16, --sets)` sets of activations (device copies), offsets, NVFP4 tokens and C, the
//! weights fixed; each set's C must then equal the row's bit for bit.
//!
//! All of it runs on one stream of its own (capture needs one), with cudarc's cross-stream event
//! tracking off (as `nvfp4_gemm::moe` documents), after the other rows.

use crate::inputs::fast_operand;
use crate::measure::{drv, host_overhead, same_bits, stats, Bench, Result, W4a16Activation, POISON, ROUNDS};
use crate::moe::{exact_activations, offsets_of, MoeResult, MoeShape, MoeVariant, MoeW4a16, Routing, TorchBaseline};
use crate::options::Options;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaSlice, CudaStream, CudaView};
use half::{bf16, f16};
use nvfp4_format::{
    compare, quantize_with_global_scale, reference_grouped_gemm_f64, Comparison, Group, GroupOutput, Nvfp4Matrix,
    Tolerance,
};
use nvfp4_gemm::moe::{GroupRows, MoeArgs, MoePlan, MoeProblem, TokenLayout};
use nvfp4_gemm::quantize::Nvfp4OperandMut;
use nvfp4_gemm::quantize::Quantizer;
use nvfp4_gemm::w4a16::{activations_of, Prepacker, WeightStack};
use nvfp4_gemm::{DeviceNvfp4, GemmPlan, GroupArgs, GroupShape, Nvfp4Operand, Output, OutputType, Problem};
use std::sync::Arc;

/// The activations' global scale ([`exact_activations`] are exact NVFP4 with it).
const G_X: f32 = 1.0;

/// Maps a library error to a message naming what was being done.
fn lib(during: &'static str) -> impl Fn(nvfp4_gemm::Error) -> String {
    move |e| format!("{during}: {e}")
}

/// The device buffers one row writes.
struct Buffers {
    /// Activations `[T, K]`, sorted by expert.
    x: CudaSlice<bf16>,
    /// `offsets[E + 1]`.
    sizes: CudaSlice<u32>,
    /// The quantized tokens (grouped layout).
    a: DeviceNvfp4,
    /// C of (b) and (c), `[T, N]`.
    c_moe: CudaSlice<f16>,
    /// C of (a), one per expert (16 elements for an empty one).
    c_plan: Vec<CudaSlice<f16>>,
}

/// What the calls read.
struct Calls<'a> {
    stream: Arc<CudaStream>,
    quantizer: &'a Quantizer,
    problem: &'a MoeProblem,
    rows: &'a [GroupRows],
    weights: &'a [Nvfp4Operand<'a>],
    alphas: &'a [f32],
}

impl Calls<'_> {
    /// The rows the routing sends to the experts in all: what the MoE plans are told
    /// (`MoePlan::set_routed_rows`), as an engine tells its plan `T · top_k`.
    fn routed_rows(&self) -> usize {
        self.rows.iter().map(|r| r.rows as usize).sum()
    }

    fn quantize(&self, b: &mut Buffers) -> Result<()> {
        self.quantizer
            .quantize_grouped(&self.stream, &b.x, self.problem, &b.sizes, G_X, b.a.operand_mut())
            .map_err(lib("quantize_grouped"))
    }

    /// (a): quantize, then the host-sized plan on each group's slices of A.
    fn host_sized(&self, plan: &mut GemmPlan, b: &mut Buffers) -> Result<()> {
        self.quantize(b)?;
        let k = self.problem.k();
        let views: Vec<(CudaView<u8>, CudaView<u8>)> = self
            .rows
            .iter()
            .map(|r| {
                let (first, m, scale_first) = (r.first as usize, r.rows as usize, r.scale_first as usize);
                let values = first * k / 2;
                let scales = scale_first * k / 16;
                (
                    b.a.values.slice(values..values + m * k / 2),
                    b.a.scales.slice(scales..scales + m.div_ceil(128) * 128 * k / 16),
                )
            })
            .collect();
        let mut args: Vec<GroupArgs> = views
            .iter()
            .zip(b.c_plan.iter_mut())
            .zip(self.weights)
            .zip(self.alphas)
            .map(|(((a, c), w), &alpha)| GroupArgs {
                a: Nvfp4Operand { values: &a.0, scales: &a.1 }.into(),
                b: *w,
                c: Output::F16(c),
                alpha,
            })
            .collect();
        plan.run(&self.stream, &mut args).map_err(lib("GemmPlan::run"))
    }

    /// (b): quantize, then the plan that reads the sizes on the device.
    fn device_sized(&self, plan: &mut MoePlan, b: &mut Buffers) -> Result<()> {
        self.quantize(b)?;
        let mut args = MoeArgs {
            sizes: &b.sizes,
            a: b.a.operand().into(),
            weights: self.weights,
            alphas: self.alphas,
            c: Output::F16(&mut b.c_moe),
        };
        plan.run(&self.stream, &mut args).map_err(lib("MoePlan::run"))
    }
}

/// W4A16's inputs of a MoE row for activations of type `A`: the activations `[T, K]`, each
/// expert's weights prepacked for them (values, scales).
struct W4a16Inputs<A> {
    x: CudaSlice<A>,
    packed: Vec<(CudaSlice<u8>, CudaSlice<u8>)>,
}

impl<A: W4a16Activation> W4a16Inputs<A> {
    /// Converts `x` (exact: multiples of 1/8 below 6) and uploads it; prepacks every expert's
    /// device weights `weights` (`n × k` each) on the GPU (`w4a16::Prepacker`, bit for bit the
    /// CPU prepack: its own tests), so that the row's check covers the prepack too.
    fn new(
        stream: &Arc<CudaStream>,
        prepacker: &Prepacker,
        x: &[bf16],
        weights: &[Nvfp4Operand<'_>],
        (n, k): (usize, usize),
    ) -> Result<Self> {
        let kind = activations_of::<A>();
        let x: Vec<A> = x.iter().map(|v| A::from_f64(v.to_f64())).collect();
        let stack = WeightStack { experts: 1, rows: n, k };
        let sizes = stack.sizes().map_err(lib("W4A16 prepack"))?;
        let mut packed = Vec::with_capacity(weights.len());
        for w in weights {
            let alloc = |len| stream.alloc_zeros::<u8>(len).map_err(drv("allocating the W4A16 weights"));
            let (mut values, mut scales) = (alloc(sizes.values)?, alloc(sizes.scales)?);
            let out = Nvfp4OperandMut { values: &mut values, scales: &mut scales };
            prepacker.prepack(stream, *w, stack, kind, out).map_err(lib("W4A16 prepack"))?;
            packed.push((values, scales));
        }
        Ok(W4a16Inputs { x: stream.clone_htod(&x).map_err(drv("uploading the W4A16 activations"))?, packed })
    }
}

fn poison(stream: &Arc<CudaStream>, c: &mut CudaSlice<f16>) -> Result<()> {
    stream.memcpy_htod(&vec![f16::from_bits(POISON); c.len()], c).map_err(drv("poisoning C"))
}

/// Each group's rows of the `[T, N]` output.
fn grouped_output(stream: &Arc<CudaStream>, c: &CudaSlice<f16>, rows: &[GroupRows], n: usize) -> Result<Vec<Vec<f16>>> {
    stream.synchronize().map_err(drv("running the checked call"))?;
    let host = stream.clone_dtoh(c).map_err(drv("downloading C"))?;
    Ok(rows.iter().map(|r| host[r.first as usize * n..(r.first + r.rows) as usize * n].to_vec()).collect())
}

/// Each expert's C of a host-sized plan (its own buffer), its `rows · n` elements.
fn plan_output(stream: &Arc<CudaStream>, c: &[CudaSlice<f16>], rows: &[GroupRows], n: usize) -> Result<Vec<Vec<f16>>> {
    c.iter()
        .zip(rows)
        .map(|(c, r)| {
            let mut h = stream.clone_dtoh(c).map_err(drv("downloading C"))?;
            h.truncate(r.rows as usize * n);
            Ok(h)
        })
        .collect()
}

fn compared(got: &[Vec<f16>], reference: &[GroupOutput<f16>]) -> Result<Comparison> {
    compare(got, reference, Tolerance::COMPETITION).map_err(|e| e.to_string())
}

impl Bench {
    /// The MoE rows' stream, made on first use: the context is synchronized, cudarc's
    /// cross-stream event tracking turned off (a capturing stream may not wait on events recorded
    /// outside the capture), and the timer moved to the new stream.
    pub(crate) fn moe_stream(&mut self) -> Result<Arc<CudaStream>> {
        if let Some(s) = &self.moe_stream {
            return Ok(s.clone());
        }
        let ctx = self.gpu.context().clone();
        ctx.synchronize().map_err(drv("synchronizing before the MoE rows"))?;
        // SAFETY: from here on the bench uses one stream, this one, except for the plans' own
        // allocations on the default stream, which `moe_shape` follows with a context
        // synchronisation; nothing relies on cudarc's implicit cross-stream waits.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(drv("creating the MoE stream"))?;
        self.timer.move_to(&self.gpu, stream.clone())?;
        self.moe_stream = Some(stream.clone());
        Ok(stream)
    }

    /// W4A16 on a MoE row (`--w4a16`, [`MoeW4a16`]): a `MoePlan` of the row's problem with
    /// activations of type `A`, the first `--moe-kernels` option, on `inputs`, and the
    /// host-sized `GemmPlan` of the same W4A16 groups (each expert's rows of `inputs.x`, C the
    /// row's `c_plan`); each checked once, the `MoePlan` also as a graph replay, against
    /// `reference` (its C is the row's `c_moe`). Then timed, alternated: the `MoePlan` on the
    /// same buffers, on the next of [`Options::rotating_sets`] sets of activations (device
    /// copies of `inputs.x`), offsets and C every call, the graph replay, and the `GemmPlan`;
    /// the host time per call, same and new buffers; every set's C must equal the checked
    /// call's bit for bit.
    fn moe_w4a16<A: W4a16Activation>(
        &mut self,
        calls: &Calls<'_>,
        inputs: &W4a16Inputs<A>,
        bufs: &mut Buffers,
        reference: Option<&[GroupOutput<f16>]>,
        o: &Options,
    ) -> Result<MoeW4a16> {
        /// One rotating set: activations, offsets and C of their own.
        struct Set<A> {
            x: CudaSlice<A>,
            sizes: CudaSlice<u32>,
            c: CudaSlice<f16>,
        }
        let stream = &calls.stream;
        let options = o.moe_kernels.first().map(|(_, opt)| *opt).unwrap_or_default();
        let kind = activations_of::<A>();
        let problem = calls.problem.clone().with_tokens(nvfp4_gemm::TokenKind::Dense(kind));
        let mut plan = MoePlan::with_options(&self.gpu, problem, &options).map_err(lib("planning (W4A16 MoePlan)"))?;
        plan.set_routed_rows(Some(calls.routed_rows()));
        // The plan allocates its tables on the default stream.
        self.gpu.context().synchronize().map_err(drv("planning"))?;
        let weights: Vec<Nvfp4Operand> =
            inputs.packed.iter().map(|(values, scales)| Nvfp4Operand { values, scales }).collect();
        let run = |plan: &mut MoePlan, x: &CudaSlice<A>, sizes: &CudaSlice<u32>, c: &mut CudaSlice<f16>| {
            let mut args =
                MoeArgs { sizes, a: A::tokens(x), weights: &weights, alphas: calls.alphas, c: Output::F16(c) };
            plan.run(stream, &mut args).map_err(lib("W4A16 MoePlan::run"))
        };
        let (n, k) = (calls.problem.n(), calls.problem.k());
        let shapes: Vec<GroupShape> = calls.rows.iter().map(|r| GroupShape::new(r.rows as usize, n, k)).collect();
        let host_problem = Problem::with_tokens(shapes, OutputType::F16, nvfp4_gemm::TokenKind::Dense(kind))
            .map_err(lib("Problem (W4A16 GemmPlan)"))?;
        let mut gemm = GemmPlan::new(&self.gpu, host_problem).map_err(lib("planning (W4A16 GemmPlan)"))?;
        let host_sized = |gemm: &mut GemmPlan, c_plan: &mut [CudaSlice<f16>]| {
            let xs: Vec<CudaView<A>> = calls
                .rows
                .iter()
                .map(|r| {
                    let first = r.first as usize * k;
                    inputs.x.slice(first..first + r.rows as usize * k)
                })
                .collect();
            let mut args: Vec<GroupArgs> = xs
                .iter()
                .zip(c_plan.iter_mut())
                .zip(&weights)
                .zip(calls.alphas)
                .map(|(((x, c), w), &alpha)| GroupArgs { a: A::tokens(x), b: *w, c: Output::F16(c), alpha })
                .collect();
            gemm.run(stream, &mut args).map_err(lib("W4A16 GemmPlan::run"))
        };
        if reference.is_some() {
            poison(stream, &mut bufs.c_moe)?;
            for c in bufs.c_plan.iter_mut() {
                poison(stream, c)?;
            }
        }
        host_sized(&mut gemm, &mut bufs.c_plan)?;
        let got_plan = plan_output(stream, &bufs.c_plan, calls.rows, n)?;
        plan.clear_status(stream).map_err(lib("clearing the status"))?;
        run(&mut plan, &inputs.x, &bufs.sizes, &mut bufs.c_moe)?;
        let got = grouped_output(stream, &bufs.c_moe, calls.rows, n)?;
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(drv("beginning the capture"))?;
        let captured = run(&mut plan, &inputs.x, &bufs.sizes, &mut bufs.c_moe);
        let graph = stream.end_capture(CUgraphInstantiate_flags(0)).map_err(drv("ending the capture"));
        captured?;
        let graph = graph?.ok_or("the capture made no graph")?;
        if reference.is_some() {
            poison(stream, &mut bufs.c_moe)?;
        }
        graph.launch().map_err(drv("launching the graph"))?;
        let got_graph = grouped_output(stream, &bufs.c_moe, calls.rows, n)?;
        let status = plan.read_status(stream).map_err(lib("reading the status"))?;
        let check = match reference {
            None => None,
            Some(r) => {
                let (a, b, c) = (compared(&got_plan, r)?, compared(&got, r)?, compared(&got_graph, r)?);
                let pass = a.passed() && b.passed() && c.passed() && status.is_ok();
                Some(format!(
                    "{} W4A16 GemmPlan {a} | W4A16 MoePlan {b} | graph replay {c} | status {status}",
                    if pass { "PASS" } else { "FAIL" }
                ))
            }
        };
        let mut sets = (0..o.rotating_sets())
            .map(|_| {
                Ok(Set {
                    x: stream.clone_dtod(&inputs.x).map_err(drv("copying the W4A16 activations"))?,
                    sizes: stream.clone_dtod(&bufs.sizes).map_err(drv("copying the offsets"))?,
                    c: stream.alloc_zeros::<f16>(bufs.c_moe.len()).map_err(drv("allocating C"))?,
                })
            })
            .collect::<Result<Vec<Set<A>>>>()?;
        let rotating = sets.len();
        let mut next = 0;
        let t = self.timer.rounds(o.iters, 4, &mut |which| match which {
            0 => run(&mut plan, &inputs.x, &bufs.sizes, &mut bufs.c_moe),
            1 => {
                next += 1;
                let s = &mut sets[next % rotating];
                run(&mut plan, &s.x, &s.sizes, &mut s.c)
            }
            2 => graph.launch().map_err(drv("launching the graph")),
            _ => host_sized(&mut gemm, &mut bufs.c_plan),
        })?;
        let moe_us = stats(&t[0], "W4A16 MoePlan")?;
        let moe_new_us = stats(&t[1], "W4A16 MoePlan, new tensors")?;
        let graph_us = stats(&t[2], "W4A16 graph replay")?;
        let plan_us = stats(&t[3], "W4A16 GemmPlan")?;
        let (batches, per) = (o.host_batches, o.host_calls);
        let _ = nvfp4_gemm::host_timing::take();
        let cached =
            host_overhead(stream, batches, per, &mut |_| run(&mut plan, &inputs.x, &bufs.sizes, &mut bufs.c_moe))?;
        crate::measure::print_host_steps("W4A16 MoePlan", "same tensors");
        let new = host_overhead(stream, batches, per, &mut |i| {
            let s = &mut sets[i % rotating];
            run(&mut plan, &s.x, &s.sizes, &mut s.c)
        })?;
        crate::measure::print_host_steps("W4A16 MoePlan", "new tensors");
        // Every set once more (each call with new tensors), then the same buffers as the check:
        // the same activations and offsets must give the same C.
        for s in sets.iter_mut() {
            run(&mut plan, &s.x, &s.sizes, &mut s.c)?;
        }
        run(&mut plan, &inputs.x, &bufs.sizes, &mut bufs.c_moe)?;
        for (i, s) in sets.iter().enumerate() {
            if !same_bits(stream, &s.c, &bufs.c_moe)? {
                return Err(format!("W4A16 MoePlan: rotating set {i} (copies of the same inputs) gave another C"));
            }
        }
        drop(sets);
        let after = plan.read_status(stream).map_err(lib("reading the status"))?;
        if !after.is_ok() {
            return Err(format!("the W4A16 MoePlan status word after the timed calls: {after}"));
        }
        let activations = format!("{kind:?}").to_lowercase();
        Ok(MoeW4a16 {
            activations,
            kernel: plan.summary().kernel.clone(),
            check,
            plan_us,
            moe_us,
            graph_us,
            moe_new_us,
            host_cached_us: stats(&cached, "W4A16 host")?,
            host_new_us: stats(&new, "W4A16 host, new tensors")?,
        })
    }

    /// One MoE row (module docs). `step` is called before each phase with its name.
    pub fn moe_shape(
        &mut self,
        shape: &MoeShape,
        o: &Options,
        torch: &TorchBaseline,
        step: &mut dyn FnMut(&str),
    ) -> Result<MoeResult> {
        let stream = self.moe_stream()?;
        let ctx = self.gpu.context().clone();
        let (experts, n, k) = (shape.experts, shape.n, shape.k);

        step("generating and uploading inputs");
        let counts = shape.routing(o.seed);
        let offsets = offsets_of(&counts);
        let tokens = offsets[experts] as usize;
        if tokens == 0 {
            return Err("the routing gives no expert a token".into());
        }
        let problem = MoeProblem::new(experts, n, k, TokenLayout::Contiguous { max_tokens: tokens }, OutputType::F16)
            .map_err(lib("MoeProblem"))?;
        let (rows, expected_status) = problem.group_rows(&offsets).map_err(lib("group_rows"))?;
        if !expected_status.is_ok() {
            return Err(format!("the routing's sizes would be clamped: {expected_status}"));
        }
        let x_host = exact_activations(tokens, k, o.seed ^ 0xAC71_7A7E);
        // Expert e: competition-distributed weights (global scale 1) and its rows of the
        // activations, quantized on the CPU for the reference.
        let groups: Vec<Group> = rows
            .iter()
            .enumerate()
            .map(|(e, r)| {
                let w = fast_operand(n, k, o.seed.wrapping_add(0x10_0000 + 2 * e as u64))?;
                let b = Nvfp4Matrix::new(n, k, w.values, w.scales, 1.0).map_err(|e| e.to_string())?;
                let (first, m) = (r.first as usize, r.rows as usize);
                let a = quantize_with_global_scale(&x_host[first * k..(first + m) * k], m, k, G_X)
                    .map_err(|e| e.to_string())?;
                Group::new(a, b, 1.0).map_err(|e| e.to_string())
            })
            .collect::<Result<_>>()?;
        let w_dev: Vec<DeviceNvfp4> = groups
            .iter()
            .map(|g| DeviceNvfp4::upload(&stream, &g.b))
            .collect::<std::result::Result<_, _>>()
            .map_err(lib("uploading the weights"))?;
        let weights: Vec<Nvfp4Operand> = w_dev.iter().map(DeviceNvfp4::operand).collect();
        let alphas: Vec<f32> = groups.iter().map(Group::effective_alpha_f32).collect();
        let mut bufs = Buffers {
            x: stream.clone_htod(&x_host).map_err(drv("uploading the activations"))?,
            sizes: stream.clone_htod(&offsets).map_err(drv("uploading the offsets"))?,
            a: DeviceNvfp4::alloc_zeros_sized(&stream, problem.a_sizes()).map_err(lib("allocating A"))?,
            c_moe: stream.alloc_zeros::<f16>(problem.c_elements()).map_err(drv("allocating C"))?,
            c_plan: counts
                .iter()
                .map(|&m| stream.alloc_zeros::<f16>((m as usize * n).max(16)))
                .collect::<std::result::Result<_, _>>()
                .map_err(drv("allocating C"))?,
        };
        // W4A16's inputs (`--w4a16`), before the host activations go: the same activations as
        // f16 and bf16, the same weights prepacked on the GPU for each.
        let w4a16_inputs = if o.w4a16 {
            step("W4A16: prepacking the weights (GPU)");
            let prepacker = Prepacker::new(&self.gpu).map_err(lib("W4A16 prepack"))?;
            Some((
                W4a16Inputs::<f16>::new(&stream, &prepacker, &x_host, &weights, (n, k))?,
                W4a16Inputs::<bf16>::new(&stream, &prepacker, &x_host, &weights, (n, k))?,
            ))
        } else {
            None
        };
        drop(x_host);
        let quantizer = Quantizer::new(&self.gpu).map_err(lib("loading the quantizer"))?;
        let shapes: Vec<GroupShape> = counts.iter().map(|&m| GroupShape::new(m as usize, n, k)).collect();
        let mut gemm = GemmPlan::new(&self.gpu, Problem::new(shapes, OutputType::F16).map_err(lib("Problem"))?)
            .map_err(lib("planning (GemmPlan)"))?;
        let mut moes: Vec<MoePlan> = o
            .moe_kernels
            .iter()
            .map(|(_, options)| MoePlan::with_options(&self.gpu, problem.clone(), options))
            .collect::<std::result::Result<_, _>>()
            .map_err(lib("planning (MoePlan)"))?;
        // The plans allocate and fill their tables on the default stream.
        ctx.synchronize().map_err(drv("planning"))?;
        let plan_kernel = gemm.summary().kernel.clone();
        let calls = Calls {
            stream: stream.clone(),
            quantizer: &quantizer,
            problem: &problem,
            rows: &rows,
            weights: &weights,
            alphas: &alphas,
        };
        for moe in &mut moes {
            moe.set_routed_rows(Some(calls.routed_rows()));
        }

        step("checking against the CPU reference");
        let reference: Option<Vec<GroupOutput<f16>>> = if o.check {
            let exact = reference_grouped_gemm_f64(&groups).map_err(|e| e.to_string())?;
            Some(exact.iter().map(GroupOutput::rounded).collect())
        } else {
            None
        };
        drop(groups);
        if reference.is_some() {
            for c in bufs.c_plan.iter_mut() {
                poison(&stream, c)?;
            }
        }
        // (a) once.
        calls.host_sized(&mut gemm, &mut bufs)?;
        stream.synchronize().map_err(drv("running GemmPlan"))?;
        let got_plan = plan_output(&stream, &bufs.c_plan, &rows, n)?;
        let mut texts = vec![];
        let mut check_passed = true;
        if let Some(r) = &reference {
            let a = compared(&got_plan, r)?;
            check_passed &= a.passed();
            texts.push(format!("GemmPlan {a}"));
        }
        drop(got_plan);
        // (b) once per option (the first call uploads the plan's tables: needed before capture),
        // then (c): capture (b) once and replay it.
        let mut graphs = vec![];
        for ((name, _), moe) in o.moe_kernels.iter().zip(moes.iter_mut()) {
            if reference.is_some() {
                poison(&stream, &mut bufs.c_moe)?;
            }
            moe.clear_status(&stream).map_err(lib("clearing the status"))?;
            calls.device_sized(moe, &mut bufs)?;
            let got_moe = grouped_output(&stream, &bufs.c_moe, &rows, n)?;
            stream
                .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                .map_err(drv("beginning the capture"))?;
            let captured = calls.device_sized(moe, &mut bufs);
            let graph = stream.end_capture(CUgraphInstantiate_flags(0)).map_err(drv("ending the capture"));
            captured?;
            let graph = graph?.ok_or("the capture made no graph")?;
            if reference.is_some() {
                poison(&stream, &mut bufs.c_moe)?;
            }
            graph.launch().map_err(drv("launching the graph"))?;
            let got_graph = grouped_output(&stream, &bufs.c_moe, &rows, n)?;
            let status = moe.read_status(&stream).map_err(lib("reading the status"))?;
            if let Some(r) = &reference {
                let (b, c) = (compared(&got_moe, r)?, compared(&got_graph, r)?);
                check_passed &= b.passed() && c.passed() && status.is_ok();
                texts.push(format!("MoePlan[{name}] {b} | graph replay {c} | status {status}"));
            }
            graphs.push(graph);
        }
        let w4a16 = match &w4a16_inputs {
            None => vec![],
            Some((f16_inputs, bf16_inputs)) => {
                step("W4A16 (check, capture, timing)");
                let w = vec![
                    self.moe_w4a16(&calls, f16_inputs, &mut bufs, reference.as_deref(), o)?,
                    self.moe_w4a16(&calls, bf16_inputs, &mut bufs, reference.as_deref(), o)?,
                ];
                check_passed &= w.iter().all(|w| w.check.as_ref().is_none_or(|c| c.starts_with("PASS")));
                w
            }
        };
        let check = reference.as_ref().map(|_| texts.join(" | "));

        // The rotating sets of (b) with new tensors: the same activations (device copies) and
        // offsets, NVFP4 tokens and C of their own; the weights fixed.
        let rotating = o.rotating_sets();
        let mut sets = (0..rotating)
            .map(|_| {
                Ok(Buffers {
                    x: stream.clone_dtod(&bufs.x).map_err(drv("copying the activations"))?,
                    sizes: stream.clone_dtod(&bufs.sizes).map_err(drv("copying the offsets"))?,
                    a: DeviceNvfp4::alloc_zeros_sized(&stream, problem.a_sizes()).map_err(lib("allocating A"))?,
                    c_moe: stream.alloc_zeros::<f16>(problem.c_elements()).map_err(drv("allocating C"))?,
                    c_plan: vec![],
                })
            })
            .collect::<Result<Vec<Buffers>>>()?;

        // (a), (b), (b) with new tensors and (c) alternate in rounds, so that every column sees
        // the same clock: the H200's speed on these GEMMs drifts by up to ~10% over seconds,
        // which timed one column after the other shows as a ratio between them.
        step("timing (a) GemmPlan, (b) MoePlan, (b) with new tensors, (c) graph replay, alternated");
        let per = o.iters.div_ceil(ROUNDS);
        let (mut t_plan, mut t_moe, mut t_graph) = (vec![], vec![vec![]; moes.len()], vec![vec![]; graphs.len()]);
        let (mut t_new, mut next) = (vec![], 0);
        for _ in 0..ROUNDS {
            t_plan.extend(self.timer.each(1, per, true, &mut || calls.host_sized(&mut gemm, &mut bufs))?);
            for (moe, t) in moes.iter_mut().zip(t_moe.iter_mut()) {
                t.extend(self.timer.each(1, per, true, &mut || calls.device_sized(moe, &mut bufs))?);
            }
            t_new.extend(self.timer.each(1, per, true, &mut || {
                next += 1;
                calls.device_sized(&mut moes[0], &mut sets[next % rotating])
            })?);
            for (graph, t) in graphs.iter().zip(t_graph.iter_mut()) {
                t.extend(self.timer.each(1, per, true, &mut || graph.launch().map_err(drv("launching the graph")))?);
            }
        }
        let plan_us = stats(&t_plan, "GemmPlan")?;
        let moe_times = t_moe.iter().map(|t| stats(t, "MoePlan")).collect::<Result<Vec<_>>>()?;
        let moe_new_us = stats(&t_new, "MoePlan, new tensors")?;
        let graph_times = t_graph.iter().map(|t| stats(t, "graph replay")).collect::<Result<Vec<_>>>()?;

        step("host overhead");
        let (batches, per) = (o.host_batches, o.host_calls);
        let ha = host_overhead(&stream, batches, per, &mut |_| calls.host_sized(&mut gemm, &mut bufs))?;
        let hb = host_overhead(&stream, batches, per, &mut |_| calls.device_sized(&mut moes[0], &mut bufs))?;
        let hb_new =
            host_overhead(&stream, batches, per, &mut |i| calls.device_sized(&mut moes[0], &mut sets[i % rotating]))?;
        let hc = host_overhead(&stream, batches, per, &mut |_| graphs[0].launch().map_err(drv("launching the graph")))?;
        // Every rotating set once more (each call with new tensors), then the row's own buffers:
        // the same activations and offsets must give the same C.
        for set in sets.iter_mut() {
            calls.device_sized(&mut moes[0], set)?;
        }
        calls.device_sized(&mut moes[0], &mut bufs)?;
        for (i, set) in sets.iter().enumerate() {
            if !same_bits(&stream, &set.c_moe, &bufs.c_moe)? {
                return Err(format!("MoePlan: rotating set {i} (copies of the same inputs) gave another C"));
            }
        }
        drop(sets);
        stream.synchronize().map_err(drv("synchronizing"))?;
        for moe in &moes {
            let after = moe.read_status(&stream).map_err(lib("reading the status"))?;
            if !after.is_ok() {
                return Err(format!("the MoePlan status word after the timed calls: {after}"));
            }
        }
        drop(graphs);
        let variants: Vec<MoeVariant> = o
            .moe_kernels
            .iter()
            .zip(&moes)
            .zip(moe_times.iter().zip(&graph_times))
            .map(|(((name, _), moe), (b, c))| MoeVariant {
                name: name.clone(),
                kernel: moe.summary().kernel.clone(),
                moe_us: *b,
                graph_us: *c,
            })
            .collect();

        let routing =
            Routing { name: shape.name.clone(), spec: shape.to_spec(), experts, n, k, counts: counts.clone() };
        let (torch, torch_note) = match torch.row(&routing) {
            Ok(row) => (Some(row), String::new()),
            Err(why) => (None, why),
        };
        Ok(MoeResult {
            name: shape.name.clone(),
            spec: shape.to_spec(),
            experts,
            n,
            k,
            tokens,
            counts,
            weight_bytes: shape.weight_bytes(),
            flops: 2.0 * (tokens * n * k) as f64,
            plan_kernel,
            moe_kernel: variants[0].kernel.clone(),
            check,
            check_passed,
            plan_us,
            moe_us: variants[0].moe_us,
            graph_us: variants[0].graph_us,
            variants,
            host_us: [stats(&ha, "host (a)")?, stats(&hb, "host (b)")?, stats(&hc, "host (c)")?],
            rotating_sets: rotating,
            moe_new_us,
            host_new_us: stats(&hb_new, "host (b), new tensors")?,
            w4a16,
            torch,
            torch_note,
        })
    }
}
