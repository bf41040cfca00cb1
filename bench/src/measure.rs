//! The measurements on the GPU: the ceilings (copy bandwidth, bf16 tensor rate, TMA bandwidth from
//! L2 and DRAM), and per shape the correctness check, the competition-style and kernel-only
//! timings, the host overhead and the cuBLAS baseline ([`crate::cublas`]) on the inputs of [`crate::inputs`]. Every device call's
//! error is returned, never unwrapped.

use crate::cublas::{baseline, gemm_bf16, load_cublas};
use crate::inputs::{device_set, fast_operands, operands_of, random_bf16, run_set, run_stacked_set, stacked_sets};
use crate::options::{Flush, Options};
use crate::report::{Environment, ShapeResult, W4a16Result};
use crate::stats::Stats;
use cudarc::cublas::CudaBlas;
use cudarc::driver::{sys, CudaEvent, CudaSlice, CudaStream, DriverError};
use half::{bf16, f16};
use nvfp4_format::{compare, reference_grouped_gemm_f64, GroupOutput, InputDistribution, Tolerance};
use nvfp4_gemm::{GemmPlan, Gpu, OutputType, PlanOptions, Problem};
use nvfp4_gemm_cli::spec::NamedShapes;
use nvfp4_gemm_diag::ceiling::{TmaBandwidth, TmaBandwidthCase, TmaBox};
use std::sync::Arc;
use std::time::Instant;

/// Errors are messages: this is a program, not a library.
pub type Result<T> = std::result::Result<T, String>;

/// Maps a driver error to a message naming what was being done.
pub(crate) fn drv(during: &'static str) -> impl Fn(DriverError) -> String {
    move |e| format!("CUDA error while {during}: {e}")
}

/// f16 NaN written into C before the checked run: an element the kernel never wrote fails.
pub(crate) const POISON: u16 = 0x7FFF;

/// Device-side timing: events on the bench's stream and the L2 flush buffer.
pub(crate) struct Timer {
    /// Private: the stream moves only with its flush kernel ([`Timer::move_to`]).
    stream: Arc<CudaStream>,
    /// With `--flush read`: the TMA bandwidth kernel over the whole flush buffer (declared before
    /// the buffer, so it is dropped first).
    reader: Option<TmaBandwidth>,
    flush: CudaSlice<u8>,
}

impl Timer {
    /// `flush` (`--flush`): a memset of the buffer, or the TMA bandwidth kernel reading it.
    fn new(gpu: &Gpu, stream: Arc<CudaStream>, bytes: usize, flush: Flush) -> Result<Timer> {
        let buffer = stream.alloc_zeros::<u8>(bytes).map_err(drv("allocating the L2 flush buffer"))?;
        let reader = Self::reader(gpu, &stream, &buffer, flush)?;
        Ok(Timer { stream, reader, flush: buffer })
    }

    /// With `Flush::Read`, the TMA bandwidth kernel reading all of `buffer`, launched on `stream`.
    fn reader(
        gpu: &Gpu,
        stream: &Arc<CudaStream>,
        buffer: &CudaSlice<u8>,
        flush: Flush,
    ) -> Result<Option<TmaBandwidth>> {
        match flush {
            Flush::Write => Ok(None),
            Flush::Read => {
                let (grid, bytes) = (gpu.sm_count(), buffer.len() as u64);
                let case = TmaBandwidthCase::sized(TmaBox::WeightU8, 4, bytes, bytes, grid);
                let k = TmaBandwidth::new(gpu, stream, buffer, case, grid)
                    .map_err(|e| format!("--flush read needs the TMA bandwidth kernel: {e}"))?;
                Ok(Some(k))
            }
        }
    }

    /// The stream the timer times and flushes on.
    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Times (and flushes) on `stream` from now on. The reading flush kernel is made again for
    /// it: left on the old stream it would run unordered with the timed calls, beside them (the
    /// MoE rows measured ~20% slower with `--flush read` that way).
    pub(crate) fn move_to(&mut self, gpu: &Gpu, stream: Arc<CudaStream>) -> Result<()> {
        let flush = if self.reader.is_some() { Flush::Read } else { Flush::Write };
        self.reader = None;
        self.reader = Self::reader(gpu, &stream, &self.flush, flush)?;
        self.stream = stream;
        Ok(())
    }

    /// Flushes the L2 (the buffer is ≥ 256 MiB, several times the 60 MB L2): writes the whole
    /// buffer, or reads it ([`Flush`]).
    fn flush_l2(&mut self) -> Result<()> {
        match &self.reader {
            None => self.stream.memset_zeros(&mut self.flush).map_err(drv("flushing L2")),
            Some(k) => k.launch().map_err(|e| format!("flushing L2 (reading): {e}")),
        }
    }

    fn event(&self) -> Result<CudaEvent> {
        self.stream.context().new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)).map_err(drv("creating an event"))
    }

    /// Runs `f` `warmup` times untimed, then `iters` times between a pair of events each (all
    /// events made beforehand, so the timed region holds only `f`), the L2 flushed before each when
    /// `flush`. Returns µs per iteration.
    pub(crate) fn each(
        &mut self,
        warmup: usize,
        iters: usize,
        flush: bool,
        f: &mut dyn FnMut() -> Result<()>,
    ) -> Result<Vec<f64>> {
        for _ in 0..warmup {
            if flush {
                self.flush_l2()?;
            }
            f()?;
        }
        let events: Vec<(CudaEvent, CudaEvent)> =
            (0..iters).map(|_| Ok((self.event()?, self.event()?))).collect::<Result<_>>()?;
        for (start, end) in &events {
            if flush {
                self.flush_l2()?;
            }
            start.record(&self.stream).map_err(drv("recording an event"))?;
            f()?;
            end.record(&self.stream).map_err(drv("recording an event"))?;
        }
        self.stream.synchronize().map_err(drv("waiting for the timed work"))?;
        events
            .iter()
            .map(|(s, e)| s.elapsed_ms(e).map(|ms| f64::from(ms) * 1e3).map_err(drv("reading an event")))
            .collect()
    }

    /// Times `f(0)`, …, `f(count - 1)` as [`Timer::each`] does (L2 flushed before each sample),
    /// alternated: [`ROUNDS`] rounds of `iters.div_ceil(ROUNDS)` samples of each in turn, one
    /// warm-up call per round each. Returns each one's samples (µs). Alternated, the columns see
    /// the same clock: on the H200 a GEMM's speed drifts by up to ~10% over seconds
    /// (`bench/results/h200-2026-12-02-s19-moe-drift.txt`), which columns timed one after the
    /// other would show as a ratio between them. The warm-up also makes the first timed call of
    /// a round one on the same tensors as the call before it, where that is what `f` times.
    pub(crate) fn rounds(
        &mut self,
        iters: usize,
        count: usize,
        f: &mut dyn FnMut(usize) -> Result<()>,
    ) -> Result<Vec<Vec<f64>>> {
        let per = iters.div_ceil(ROUNDS);
        let mut samples = vec![Vec::with_capacity(per * ROUNDS); count];
        for _ in 0..ROUNDS {
            for (which, t) in samples.iter_mut().enumerate() {
                t.extend(self.each(1, per, true, &mut || f(which))?);
            }
        }
        Ok(samples)
    }
}

/// Rounds of alternated timing ([`Timer::rounds`]).
pub(crate) const ROUNDS: usize = 5;

/// A W4A16 activation type of the bench: `f16` or `bf16`.
pub(crate) trait W4a16Activation:
    nvfp4_gemm::quantize::DenseFloat + nvfp4_format::HostFloat + cudarc::driver::ValidAsZeroBits + Unpin
{
}
impl W4a16Activation for f16 {}
impl W4a16Activation for half::bf16 {}

/// `m`'s elements with their block scales applied (no global scale) as `A` (exact: at most 6
/// significant bits, magnitudes in [2⁻¹⁰, 2688]).
pub(crate) fn block_scaled<A: W4a16Activation>(m: &nvfp4_format::Nvfp4Matrix) -> Vec<A> {
    m.dequantize_block_scaled().into_iter().map(|x| A::from_f64(x.into())).collect()
}

/// The statistics of `samples`, or an error naming `what` when none is valid.
pub(crate) fn stats(samples: &[f64], what: &str) -> Result<Stats> {
    Stats::of(samples).ok_or_else(|| format!("{what}: no valid samples"))
}

/// The GPU, its stream, the timer and (when it loads) cuBLAS.
pub struct Bench {
    pub(crate) gpu: Gpu,
    pub(crate) timer: Timer,
    blas: std::result::Result<CudaBlas, String>,
    /// The stream of the MoE rows, once made ([`crate::moe_measure`]).
    pub(crate) moe_stream: Option<Arc<CudaStream>>,
}

/// Host-clock µs per call over `batches` batches of `calls` calls (synchronized between batches,
/// never inside one). `f` gets the call's number, counted over the warm-up call (0) and every
/// batch, so that `f(i)` on set `i % sets` never repeats the set of the call before it.
pub(crate) fn host_overhead(
    stream: &Arc<CudaStream>,
    batches: usize,
    calls: usize,
    f: &mut dyn FnMut(usize) -> Result<()>,
) -> Result<Vec<f64>> {
    f(0)?; // warm-up
    let mut samples = Vec::with_capacity(batches);
    let mut call = 1;
    for _ in 0..batches {
        stream.synchronize().map_err(drv("synchronizing"))?;
        let t = Instant::now();
        for _ in 0..calls {
            f(call)?;
            call += 1;
        }
        samples.push(t.elapsed().as_secs_f64() * 1e6 / calls as f64);
    }
    stream.synchronize().map_err(drv("synchronizing"))?;
    Ok(samples)
}

/// In a measuring build (feature `host-timing`), where `run`'s host time went per step since the
/// last take; nothing otherwise.
pub(crate) fn print_host_steps(shape: &str, what: &str) {
    if let Some((calls, steps)) = nvfp4_gemm::host_timing::take() {
        let total: f64 = steps.iter().map(|(_, ns)| ns).sum();
        let parts: Vec<String> = steps.iter().map(|(s, ns)| format!("{s} {:.2}", ns / 1e3)).collect();
        eprintln!(
            "host-timing {shape} {what}: {calls} calls, µs per call: {} (sum {:.2})",
            parts.join(", "),
            total / 1e3
        );
    }
}

/// Whether two f16 device buffers hold the same bits (NaNs and signed zeros included).
pub(crate) fn same_bits(stream: &Arc<CudaStream>, a: &CudaSlice<f16>, b: &CudaSlice<f16>) -> Result<bool> {
    let a = stream.clone_dtoh(a).map_err(drv("downloading C"))?;
    let b = stream.clone_dtoh(b).map_err(drv("downloading C"))?;
    Ok(a.len() == b.len() && a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()))
}

impl Bench {
    /// Opens GPU 0, allocates the flush buffer and tries to load cuBLAS (unless `baseline` is off).
    pub fn new(o: &Options) -> Result<Bench> {
        if !nvfp4_gemm::driver_present() {
            return Err("no usable GPU: no NVIDIA driver on this machine (libcuda.so.1 could not be loaded)".into());
        }
        let gpu = Gpu::new(0).map_err(|e| format!("no usable GPU: {e}"))?;
        let stream = gpu.context().default_stream();
        let timer = Timer::new(&gpu, stream.clone(), o.flush_bytes, o.flush)?;
        let blas = if o.baseline { load_cublas(&stream) } else { Err("disabled with --no-baseline".into()) };
        Ok(Bench { gpu, timer, blas, moe_stream: None })
    }

    /// One line about the device.
    pub fn device(&self) -> String {
        format!("{} ({}, {} SMs)", self.gpu.name(), self.gpu.arch().name(), self.gpu.sm_count())
    }

    /// `loaded` or `unavailable: <why>`.
    pub fn cublas_status(&self) -> String {
        match &self.blas {
            Ok(_) => "loaded".into(),
            Err(why) => format!("unavailable: {why}"),
        }
    }

    fn stream(&self) -> Arc<CudaStream> {
        self.timer.stream().clone()
    }

    /// Measures the ceilings: a 1 GiB device-to-device copy (median of 20), with cuBLAS an 8192³
    /// bf16 GEMM on random data (median of 10), and the TMA ceilings ([`crate::ceiling`]; on a
    /// failure they are left out with the reason, like the tensor rate).
    pub fn environment(&mut self, o: &Options) -> Result<Environment> {
        let stream = self.stream();
        let copy_bytes = 1usize << 30;
        let src = stream.alloc_zeros::<u8>(copy_bytes).map_err(drv("allocating the copy buffers"))?;
        let mut dst = stream.alloc_zeros::<u8>(copy_bytes).map_err(drv("allocating the copy buffers"))?;
        let t = self.timer.each(3, 20, false, &mut || stream.memcpy_dtod(&src, &mut dst).map_err(drv("copying")))?;
        let copy_tb_s = 2.0 * copy_bytes as f64 / (stats(&t, "copy")?.median * 1e-6) / 1e12;
        drop((src, dst));
        let (tensor_tflops, cublas) = match self.tensor_rate() {
            Ok(rate) => (rate, self.cublas_status()),
            Err(e) => (None, format!("loaded, but the tensor-rate GEMM failed: {e}")),
        };
        let (tma, tma_note) = match crate::ceiling::measure(&self.gpu, &mut self.timer) {
            Ok(tma) => (tma, "measured".to_owned()),
            Err(e) => (vec![], format!("unavailable: {e}")),
        };
        Ok(Environment {
            device: self.device(),
            copy_tb_s,
            copy_bytes,
            tensor_tflops,
            cublas,
            flush_bytes: o.flush_bytes,
            tma,
            tma_note,
        })
    }

    /// bf16 TFLOP/s of an 8192³ cuBLAS GEMM on random data (median of 10 after 3 warm-ups);
    /// `None` without cuBLAS.
    fn tensor_rate(&mut self) -> Result<Option<f64>> {
        let Ok(blas) = &self.blas else { return Ok(None) };
        let stream = self.stream();
        let n = 8192;
        let a = stream.clone_htod(&random_bf16(n * n, 77)).map_err(drv("uploading"))?;
        let b = stream.clone_htod(&random_bf16(n * n, 78)).map_err(drv("uploading"))?;
        let mut c = stream.alloc_zeros::<bf16>(n * n).map_err(drv("allocating"))?;
        let t = self.timer.each(3, 10, false, &mut || gemm_bf16(blas, &stream, (n, n, n), 1.0, &a, &b, &mut c))?;
        Ok(Some(2.0 * (n as f64).powi(3) / (stats(&t, "tensor rate")?.median * 1e-6) / 1e12))
    }

    /// W4A16 on `groups` (`--w4a16`): each group's A with its block scales applied as
    /// activations of type `A` (exact), its B prepacked for them (once); checked once against
    /// `reference` (the same as the W4A4 row's). Then, on [`Options::rotating_sets`] sets of
    /// activations and C (set 0 the checked one, the others device copies of its activations,
    /// each with its own C): kernel-only (set 0 every call) and the harness's way with new
    /// tensors (the next set every call; the plan's tables hold the activations' addresses, so
    /// each call uploads them), alternated; the host time per call, same and new tensors; and
    /// every set's C must equal set 0's bit for bit.
    fn w4a16<A: W4a16Activation>(
        &mut self,
        groups: &[nvfp4_format::Group],
        reference: Option<&[GroupOutput<f64>]>,
        o: &Options,
        env: &Environment,
    ) -> Result<W4a16Result> {
        use nvfp4_gemm::w4a16::{activations_of, prepack};
        use nvfp4_gemm::{GemmPlan, GroupArgs, Nvfp4Operand, Output, TokenKind};
        /// One set of activations and C (one buffer per group each).
        struct Set<A> {
            activations: Vec<CudaSlice<A>>,
            c: Vec<CudaSlice<f16>>,
        }
        let stream = self.stream();
        let lib = |during: &'static str| move |e: nvfp4_gemm::Error| format!("W4A16 {during}: {e}");
        let shapes: Vec<nvfp4_gemm::GroupShape> =
            groups.iter().map(|g| nvfp4_gemm::GroupShape::new(g.m(), g.n(), g.k())).collect();
        let kind = activations_of::<A>();
        let problem = Problem::with_tokens(shapes, OutputType::F16, TokenKind::Dense(kind)).map_err(lib("problem"))?;
        let mut plan = GemmPlan::new(&self.gpu, problem).map_err(lib("planning"))?;
        let up = |b: &[u8]| if b.is_empty() { stream.alloc_zeros::<u8>(16) } else { stream.clone_htod(b) };
        let mut weights = vec![];
        let mut set0 = Set { activations: vec![], c: vec![] };
        for g in groups {
            let act = block_scaled::<A>(&g.a);
            let w = prepack(&g.b, kind).map_err(lib("prepack"))?;
            let act = if act.is_empty() { stream.alloc_zeros::<A>(8) } else { stream.clone_htod(&act) };
            set0.activations.push(act.map_err(drv("uploading"))?);
            weights.push((up(&w.values).map_err(drv("uploading"))?, up(&w.scales).map_err(drv("uploading"))?));
        }
        let c_of = |stream: &Arc<CudaStream>| -> Result<Vec<CudaSlice<f16>>> {
            groups
                .iter()
                .map(|g| stream.alloc_zeros::<f16>((g.m() * g.n()).max(16)))
                .collect::<std::result::Result<_, _>>()
                .map_err(drv("allocating C"))
        };
        set0.c = c_of(&stream)?;
        let mut sets = vec![set0];
        for _ in 1..o.rotating_sets() {
            let activations = sets[0]
                .activations
                .iter()
                .map(|a| stream.clone_dtod(a))
                .collect::<std::result::Result<_, _>>()
                .map_err(drv("copying the activations"))?;
            sets.push(Set { activations, c: c_of(&stream)? });
        }
        let alphas: Vec<f32> = groups.iter().map(nvfp4_format::Group::effective_alpha_f32).collect();
        let mut run = |set: &mut Set<A>| {
            let mut views: Vec<_> = set.c.iter_mut().zip(groups).map(|(c, g)| c.slice_mut(0..g.m() * g.n())).collect();
            let mut args: Vec<GroupArgs> = set
                .activations
                .iter()
                .zip(&weights)
                .zip(views.iter_mut())
                .zip(&alphas)
                .map(|(((a, (v, s)), c), &alpha)| GroupArgs {
                    a: A::tokens(a),
                    b: Nvfp4Operand { values: v, scales: s },
                    c: Output::F16(c),
                    alpha,
                })
                .collect();
            plan.run(&stream, &mut args).map_err(lib("run"))
        };
        let download = |c: &[CudaSlice<f16>]| -> Result<Vec<Vec<f16>>> {
            c.iter()
                .zip(groups)
                .map(|(c, g)| {
                    let mut h = stream.clone_dtoh(c).map_err(drv("downloading C"))?;
                    h.truncate(g.m() * g.n());
                    Ok(h)
                })
                .collect()
        };
        let check = match reference {
            None => None,
            Some(reference) => {
                for c in sets[0].c.iter_mut() {
                    stream.memcpy_htod(&vec![f16::from_bits(POISON); c.len()], c).map_err(drv("poisoning C"))?;
                }
                run(&mut sets[0])?;
                stream.synchronize().map_err(drv("running W4A16"))?;
                let got = download(&sets[0].c)?;
                let expected: Vec<GroupOutput<f16>> = reference.iter().map(GroupOutput::rounded).collect();
                Some(compare(&got, &expected, Tolerance::COMPETITION).map_err(|e| e.to_string())?.to_string())
            }
        };
        let n = sets.len();
        let mut next = 0;
        let t = self.timer.rounds(o.iters, 2, &mut |which| match which {
            0 => run(&mut sets[0]),
            _ => {
                next += 1;
                run(&mut sets[next % n])
            }
        })?;
        let (batches, calls) = (o.host_batches, o.host_calls);
        let cached = host_overhead(&stream, batches, calls, &mut |_| run(&mut sets[0]))?;
        let rotating = host_overhead(&stream, batches, calls, &mut |i| run(&mut sets[i % n]))?;
        // Every set once more (sets 1.., then 0: each call with new tensors), so that every C
        // was written; the same activations must give the same C.
        for set in sets.iter_mut().skip(1) {
            run(set)?;
        }
        run(&mut sets[0])?;
        stream.synchronize().map_err(drv("running W4A16"))?;
        let want = download(&sets[0].c)?;
        for (i, set) in sets.iter().enumerate().skip(1) {
            let got = download(&set.c)?;
            let same = got.iter().flatten().map(|x| x.to_bits()).eq(want.iter().flatten().map(|x| x.to_bits()));
            if !same {
                return Err(format!("W4A16: input set {i} (a copy of set 0's activations) gave another C than set 0"));
            }
        }
        drop(sets);
        let bytes: f64 = groups
            .iter()
            .map(|g| {
                let (m, n, k) = (g.m(), g.n(), g.k());
                let scales = nvfp4_format::layout::blocked_len(n, k).unwrap_or(0);
                (2 * m * k + n * k / 2 + scales + 2 * m * n) as f64
            })
            .sum();
        Ok(W4a16Result {
            activations: format!("{kind:?}").to_lowercase(),
            kernel: plan.summary().launches.last().map_or("", |l| l.kernel).to_owned(),
            check,
            kernel_us: stats(&t[0], "W4A16 kernel-only")?,
            harness_new_us: stats(&t[1], "W4A16 with new tensors")?,
            host_cached_us: stats(&cached, "W4A16 host overhead")?,
            host_rotating_us: stats(&rotating, "W4A16 host overhead")?,
            floor_bytes_us: bytes / (env.copy_tb_s * 1e12) * 1e6,
        })
    }

    /// Everything for one problem. `step` is called before each phase with its name.
    pub fn shape(
        &mut self,
        named: &NamedShapes,
        o: &Options,
        env: &Environment,
        step: &mut dyn FnMut(&str),
    ) -> Result<ShapeResult> {
        let stream = self.stream();
        let problem = Problem::new(named.shapes.clone(), OutputType::F16).map_err(|e| e.to_string())?;
        let (flops, bytes) = (problem.flops(), problem.bytes());
        // `NVFP4_GEMM_SM90_KERNEL` names the sm_90a GEMM kernel every plan of the run uses.
        let options = std::env::var("NVFP4_GEMM_SM90_KERNEL")
            .map_or_else(|_| PlanOptions::default(), |k| PlanOptions::default().with_sm90_kernel(k));
        let mut plan = GemmPlan::with_options(&self.gpu, problem, options).map_err(|e| format!("planning: {e}"))?;
        let kernel = plan.summary().kernel.clone();

        step("generating and uploading inputs");
        // `rotating_sets` sets: the competition timing takes the first `--sets`, the
        // measurements with new tensors every call all of them.
        let n_sets = o.rotating_sets();
        let groups = nvfp4_format::random_groups(&named.shapes, InputDistribution::Competition, o.seed)
            .map_err(|e| e.to_string())?;
        let set0 = operands_of(&groups);
        let mut sets = vec![device_set(&stream, &set0, &groups)?];
        drop(set0);
        for s in 1..n_sets {
            let seed = o.seed.wrapping_add(0x1000 * s as u64);
            let host = fast_operands(&named.shapes, seed)?;
            sets.push(device_set(&stream, &host, &groups)?);
        }
        stream.synchronize().map_err(drv("uploading inputs"))?;

        step("checking against the CPU reference");
        let reference =
            if o.check { Some(reference_grouped_gemm_f64(&groups).map_err(|e| e.to_string())?) } else { None };
        let (check, check_passed) = match &reference {
            None => (None, true),
            Some(reference) => {
                for c in sets[0].c.iter_mut() {
                    let poison = vec![f16::from_bits(POISON); c.len()];
                    stream.memcpy_htod(&poison, c).map_err(drv("poisoning C"))?;
                }
                run_set(&mut plan, &stream, &mut sets[0])?;
                stream.synchronize().map_err(drv("running the checked call"))?;
                let got: Vec<Vec<f16>> = sets[0]
                    .c
                    .iter()
                    .zip(&groups)
                    .map(|(c, g)| {
                        let mut h = stream.clone_dtoh(c).map_err(drv("downloading C"))?;
                        h.truncate(g.m() * g.n());
                        Ok(h)
                    })
                    .collect::<Result<_>>()?;
                let cmp = compare(
                    &got,
                    &reference.iter().map(GroupOutput::rounded).collect::<Vec<GroupOutput<f16>>>(),
                    Tolerance::COMPETITION,
                )
                .map_err(|e| e.to_string())?;
                (Some(cmp.to_string()), cmp.passed())
            }
        };

        step("competition timing");
        let competition = o.sets;
        let t = self.timer.each(1, o.reps, true, &mut || {
            for set in sets[..competition].iter_mut() {
                run_set(&mut plan, &stream, set)?;
            }
            Ok(())
        })?;
        let competition_us = stats(&t, "competition")?.scaled(1.0 / competition as f64);

        step("kernel-only and new-tensor timing, alternated");
        // Kernel-only: set 0 every call (the plan's tables current). New tensors: the next set
        // every call (the tables patched and uploaded), as the GPU MODE harness times a call.
        let mut next = 0;
        let t = self.timer.rounds(o.iters, 2, &mut |which| match which {
            0 => run_set(&mut plan, &stream, &mut sets[0]),
            _ => {
                next += 1;
                run_set(&mut plan, &stream, &mut sets[next % n_sets])
            }
        })?;
        let kernel_us = stats(&t[0], "kernel-only")?;
        let harness_new_us = stats(&t[1], "new tensors")?;

        step("host overhead");
        let _ = nvfp4_gemm::host_timing::take();
        let cached =
            host_overhead(&stream, o.host_batches, o.host_calls, &mut |_| run_set(&mut plan, &stream, &mut sets[0]))?;
        print_host_steps(&named.name, "same tensors");
        let rotating = host_overhead(&stream, o.host_batches, o.host_calls, &mut |i| {
            run_set(&mut plan, &stream, &mut sets[i % n_sets])
        })?;
        print_host_steps(&named.name, "new tensors");

        step("stacked buffers: copying and checking every set");
        // Each set copied into one buffer per operand; one `run_stacked` call on the copy must
        // write C bit for bit as one `run` call on the set. The per-group sets go as they are
        // copied.
        let mut stacked = stacked_sets(&mut plan, &stream, sets)?;

        step("stacked buffers: host overhead, kernel-only and new-tensor timing");
        let stacked_us = host_overhead(&stream, o.host_batches, o.host_calls, &mut |_| {
            run_stacked_set(&mut plan, &stream, &mut stacked[0])
        })?;
        let stacked_new_us = host_overhead(&stream, o.host_batches, o.host_calls, &mut |i| {
            run_stacked_set(&mut plan, &stream, &mut stacked[i % n_sets])
        })?;
        let mut next = 0;
        let t = self.timer.rounds(o.iters, 2, &mut |which| match which {
            0 => run_stacked_set(&mut plan, &stream, &mut stacked[0]),
            _ => {
                next += 1;
                run_stacked_set(&mut plan, &stream, &mut stacked[next % n_sets])
            }
        })?;
        let kernel_stacked_us = stats(&t[0], "stacked kernel-only")?;
        let harness_stacked_new_us = stats(&t[1], "stacked, new tensors")?;
        drop(stacked);

        let w4a16 = if o.w4a16 {
            step("W4A16");
            vec![
                self.w4a16::<f16>(&groups, reference.as_deref(), o, env)?,
                self.w4a16::<half::bf16>(&groups, reference.as_deref(), o, env)?,
            ]
        } else {
            vec![]
        };

        step("cuBLAS baseline");
        let (cublas_us, cublas_note) = match &self.blas {
            Err(why) => (None, format!("baseline unavailable: {why}")),
            Ok(blas) => match baseline(blas, &mut self.timer, &stream, &groups, reference.as_deref(), o.iters) {
                Ok((t, note)) => (Some(t), note),
                Err(e) => (None, format!("baseline failed: {e}")),
            },
        };

        let floor_bytes_us = bytes / (env.copy_tb_s * 1e12) * 1e6;
        let floor_flops_us = env.tensor_tflops.map(|r| flops / (r * 1e12) * 1e6);
        // A failed W4A16 check fails the shape.
        let check_passed = check_passed && w4a16.iter().all(|w| w.check.as_ref().is_none_or(|c| c.starts_with("PASS")));
        Ok(ShapeResult {
            name: named.name.clone(),
            spec: named.to_spec(),
            groups: named.shapes.len(),
            flops,
            bytes,
            kernel,
            check,
            check_passed,
            competition_us,
            kernel_us,
            host_cached_us: stats(&cached, "host overhead")?,
            host_rotating_us: stats(&rotating, "host overhead")?,
            host_stacked_us: stats(&stacked_us, "host overhead")?,
            rotating_sets: n_sets,
            harness_new_us,
            kernel_stacked_us,
            harness_stacked_new_us,
            host_stacked_new_us: stats(&stacked_new_us, "host overhead")?,
            cublas_us,
            cublas_note,
            floor_bytes_us,
            floor_flops_us,
            w4a16,
        })
    }
}
