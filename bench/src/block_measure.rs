//! The whole-expert-block rows on the GPU (`Bench::block_layer`): per layer, random experts drawn
//! once on the host (in parallel); per precision ONE `ExpertBlock` planned for the largest token
//! count, checked once at a few tokens against the CPU reference
//! (`nvfp4_format::moe_block::reference`, which decodes only the experts the check's routing
//! touches), then every token count timed on it — events around one `ExpertBlock::run` after an
//! L2 flush, median of `--iters` — and its output read back (it must be finite); then the same
//! call captured in a CUDA graph, replayed once over a poisoned output (it must write the direct
//! call's output bit for bit) and timed likewise. The block is
//! dropped, and the device synchronized, before the next precision's is made, so that one
//! layer's weights at a time are on the device.

use crate::block::{
    floor_us, random_experts, routing, targets, BlockLayer, BlockPrecision, BlockRow, BlockRun, ACTIVATION_SALT,
    CHECK_BOUND, CHECK_SALT,
};
use crate::inputs::random_bf16;
use crate::measure::{drv, stats, Bench, Result};
use crate::options::Options;
use crate::report::Environment;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaSlice, CudaStream};
use half::bf16;
use nvfp4_format::checkpoint::LoadedExperts;
use nvfp4_format::moe_block::{reference, round_output_as};
use nvfp4_gemm::moe_block::{
    Activation, ActivationPlacement, BlockOptions, BlockPlan, BlockShape, Dense16, ExpertBlock, Precision, TopkIds,
    TopkWeights,
};
use std::sync::Arc;
use std::time::Instant;

/// Maps a library error to a message naming the call.
fn lib(during: &'static str) -> impl Fn(nvfp4_gemm::Error) -> String {
    move |e| format!("{during}: {e}")
}

/// Warm-up calls before a row's timed samples (each after an L2 flush, as the samples).
const WARMUP: usize = 3;

/// One call's inputs and output on the device.
struct Call {
    tokens: usize,
    x: CudaSlice<bf16>,
    ids: CudaSlice<i32>,
    weights: CudaSlice<f32>,
    y: CudaSlice<bf16>,
}

impl Call {
    /// Activations (magnitudes 0.5–2, random signs) and a routing of `tokens` tokens, uploaded;
    /// `y` filled with NaN. Returns the host copies of the activations and the routing too.
    fn new(
        stream: &Arc<CudaStream>,
        layer: &BlockLayer,
        tokens: usize,
        seed: u64,
    ) -> Result<(Call, Vec<bf16>, crate::block::BlockRouting)> {
        let x = random_bf16(tokens * layer.hidden, seed ^ ACTIVATION_SALT ^ tokens as u64);
        let r = routing(tokens, layer.experts, layer.top_k, seed);
        let up = drv("uploading a call's inputs");
        let call = Call {
            tokens,
            x: stream.clone_htod(&x).map_err(&up)?,
            ids: stream.clone_htod(&r.ids).map_err(&up)?,
            weights: stream.clone_htod(&r.weights).map_err(&up)?,
            y: stream.clone_htod(&vec![bf16::NAN; tokens * layer.hidden]).map_err(&up)?,
        };
        Ok((call, x, r))
    }

    fn run(&mut self, block: &mut ExpertBlock, stream: &Arc<CudaStream>) -> Result<()> {
        let (ids, weights) = (TopkIds::I32(&self.ids), TopkWeights::F32(&self.weights));
        block.run(stream, &self.x, self.tokens, ids, weights, &mut self.y).map_err(lib("ExpertBlock::run"))
    }

    /// `y` on the host.
    fn output(&self, stream: &Arc<CudaStream>) -> Result<Vec<bf16>> {
        stream.clone_dtoh(&self.y).map_err(drv("downloading the block's output"))
    }
}

fn norm(v: impl Iterator<Item = f64>) -> f64 {
    v.map(|x| x * x).sum::<f64>().sqrt()
}

impl Bench {
    /// Every `--block-precision` of `layer` ([`BlockRun`] each): the experts drawn once, then
    /// per precision a block planned, checked and timed at every `--block-tokens` count, and
    /// freed. `step` is called before each phase.
    pub fn block_layer(
        &mut self,
        layer: &BlockLayer,
        o: &Options,
        env: &Environment,
        step: &mut dyn FnMut(&str),
    ) -> Result<Vec<BlockRun>> {
        step(&format!("drawing {} experts' weights ({:.2} GB)", layer.experts, layer.weight_bytes() as f64 / 1e9));
        let experts = random_experts(layer.experts, layer.hidden, layer.intermediate, o.seed);
        let mut runs = vec![];
        for &precision in &o.block.precisions {
            runs.push(self.block_run(layer, &experts, precision, o, env, step)?);
        }
        Ok(runs)
    }

    fn block_run(
        &mut self,
        layer: &BlockLayer,
        experts: &LoadedExperts,
        precision: BlockPrecision,
        o: &Options,
        env: &Environment,
        step: &mut dyn FnMut(&str),
    ) -> Result<BlockRun> {
        let p = precision.name();
        step(&format!(
            "{p}: planning the block (weights uploaded{})",
            if precision == BlockPrecision::W4a16 { ", prepacked on the GPU" } else { "" }
        ));
        // A stream of its own (the default stream cannot capture), cudarc's event tracking off.
        let stream = self.moe_stream()?;
        let max_tokens = o.block.tokens.iter().copied().chain([o.block.check_tokens]).max().unwrap_or(1);
        let shape = BlockShape {
            first_expert: 0,
            experts: layer.experts,
            hidden: layer.hidden,
            intermediate: layer.intermediate,
            top_k: layer.top_k,
            max_tokens,
        };
        let (kind, activation) = match precision {
            BlockPrecision::W4a4 => (Precision::W4a4, ActivationPlacement::Kernel),
            BlockPrecision::W4a4Epilogue => (Precision::W4a4, ActivationPlacement::FirstGemmEpilogue),
            BlockPrecision::W4a16 => (Precision::W4a16, ActivationPlacement::Kernel),
        };
        let options = BlockOptions::new(Activation::Silu, kind, Dense16::Bf16);
        let started = Instant::now();
        let plan = BlockPlan { activation, schedulers: o.block.schedulers, dequantization: o.block.dequantization };
        let mut block = ExpertBlock::with_plan(&self.gpu, &stream, shape, options, experts, plan)
            .map_err(lib("ExpertBlock::with_plan"))?;
        // Whatever the plans allocated on other streams is in place before this stream uses it.
        self.gpu.context().synchronize().map_err(drv("planning the block"))?;
        let build_s = started.elapsed().as_secs_f64();

        let (check, mut check_passed) = if o.check {
            step(&format!("{p}: checking {} tokens against the CPU reference", o.block.check_tokens));
            let (text, passed) = self.block_check(&mut block, &stream, layer, experts, &options, o)?;
            (Some(text), passed)
        } else {
            (None, true)
        };

        let mut rows = vec![];
        for &tokens in &o.block.tokens {
            step(&format!("{p}: T = {tokens}"));
            let (mut call, _, r) = Call::new(&stream, layer, tokens, o.seed)?;
            let samples = self.timer.each(WARMUP, o.iters, true, &mut || call.run(&mut block, &stream))?;
            let us = stats(&samples, "ExpertBlock::run")?;
            stream.synchronize().map_err(drv("running the block"))?;
            let direct = call.output(&stream)?;
            let finite = direct.iter().all(|v| v.is_finite());
            // The same call captured once, replayed over a poisoned output.
            stream
                .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                .map_err(drv("beginning the capture"))?;
            let captured = call.run(&mut block, &stream);
            let graph = stream.end_capture(CUgraphInstantiate_flags(0)).map_err(drv("ending the capture"));
            captured?;
            let graph = graph?.ok_or("the capture made no graph")?;
            stream.memcpy_htod(&vec![bf16::NAN; call.y.len()], &mut call.y).map_err(drv("poisoning y"))?;
            graph.launch().map_err(drv("replaying the block's graph"))?;
            let replayed = call.output(&stream)?;
            let graph_same =
                direct.len() == replayed.len() && direct.iter().zip(&replayed).all(|(a, b)| a.to_bits() == b.to_bits());
            let samples = self
                .timer
                .each(WARMUP, o.iters, true, &mut || graph.launch().map_err(drv("replaying the block's graph")))?;
            let graph_us = stats(&samples, "the block's graph replay")?;
            drop(graph);
            check_passed &= finite && graph_same;
            let touched = r.touched(layer.experts);
            let floor_bytes = layer.floor_bytes(tokens, touched);
            let floor = floor_us(floor_bytes, env.copy_tb_s);
            let of_floor = floor / graph_us.median;
            rows.push(BlockRow {
                tokens,
                touched,
                floor_bytes,
                floor_us: floor,
                us,
                graph_us,
                graph_same,
                of_floor,
                finite,
                targets: targets(tokens, Some(of_floor), None, None),
            });
        }
        drop(block);
        stream.synchronize().map_err(drv("freeing the block"))?;
        Ok(BlockRun {
            layer: *layer,
            spec: layer.to_spec(),
            precision,
            max_tokens,
            weight_bytes: layer.weight_bytes(),
            build_s,
            check,
            check_passed,
            rows,
        })
    }

    /// One call on `--block-check-tokens` tokens (their own routing and activations; `y`
    /// poisoned with NaN) against the CPU reference rounded to bf16: every output finite and
    /// `‖got − ref‖ ≤ CHECK_BOUND · ‖ref‖`. Returns the check's line and whether it passed.
    fn block_check(
        &mut self,
        block: &mut ExpertBlock,
        stream: &Arc<CudaStream>,
        layer: &BlockLayer,
        experts: &LoadedExperts,
        options: &BlockOptions,
        o: &Options,
    ) -> Result<(String, bool)> {
        let tokens = o.block.check_tokens;
        let (mut call, x, r) = Call::new(stream, layer, tokens, o.seed ^ CHECK_SALT)?;
        call.run(block, stream)?;
        stream.synchronize().map_err(drv("running the checked call"))?;
        let got = call.output(stream)?;
        let x64: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
        let want =
            reference(&x64, layer.hidden, &r.reference(), experts, options).map_err(|e| format!("reference: {e}"))?;
        let want = round_output_as(&want, Dense16::Bf16);
        let non_finite = got.iter().filter(|v| !v.is_finite()).count();
        let err = norm(got.iter().zip(&want).map(|(g, w)| g.to_f64() - w));
        let scale = norm(want.iter().copied());
        let rel = err / scale.max(f64::MIN_POSITIVE);
        let passed = non_finite == 0 && scale > 0.0 && rel <= CHECK_BOUND;
        let text = format!(
            "{}: T = {tokens} ({} experts touched) against nvfp4_format::moe_block::reference, ‖got − ref‖ / ‖ref‖ = {rel:.2e} (bound {CHECK_BOUND:.0e}){}",
            if passed { "PASS" } else { "FAIL" },
            r.touched(layer.experts),
            if non_finite > 0 { format!(", {non_finite} non-finite outputs") } else { String::new() }
        );
        Ok((text, passed))
    }
}
