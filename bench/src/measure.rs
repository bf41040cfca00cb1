//! The measurements on the GPU: the ceilings (copy bandwidth, bf16 tensor rate), and per shape the
//! correctness check, the competition-style and kernel-only timings, the host overhead and the
//! cuBLAS baseline. Every device call's error is returned, never unwrapped.

use crate::options::Options;
use crate::report::{Environment, ShapeResult};
use crate::stats::Stats;
use cudarc::cublas::{sys as blas_sys, CudaBlas};
use cudarc::driver::{sys, CudaEvent, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DriverError};
use half::{bf16, f16};
use nvfp4_format::{
    codec, compare, reference_grouped_gemm_f64, Group, GroupOutput, InputDistribution, SplitMix64, Tolerance,
};
use nvfp4_gemm::{GemmPlan, Gpu, GroupArgs, Nvfp4Operand, Output, OutputType, Problem};
use nvfp4_gemm_cli::spec::NamedShapes;
use rayon::prelude::*;
use std::ffi::c_void;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

/// Errors are messages: this is a program, not a library.
pub type Result<T> = std::result::Result<T, String>;

fn drv(during: &'static str) -> impl Fn(DriverError) -> String {
    move |e| format!("CUDA error while {during}: {e}")
}

/// f16 NaN written into C before the checked run: an element the kernel never wrote fails.
const POISON: u16 = 0x7FFF;

/// Device-side timing: events on the bench's stream and the L2 flush buffer.
pub struct Timer {
    stream: Arc<CudaStream>,
    flush: CudaSlice<u8>,
}

impl Timer {
    /// Writes the whole flush buffer (≥ 256 MiB, several times the 60 MB L2).
    fn flush_l2(&mut self) -> Result<()> {
        self.stream.memset_zeros(&mut self.flush).map_err(drv("flushing L2"))
    }

    fn event(&self) -> Result<CudaEvent> {
        self.stream.context().new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)).map_err(drv("creating an event"))
    }

    /// Runs `f` `warmup` times untimed, then `iters` times between a pair of events each (all
    /// events made beforehand, so the timed region holds only `f`), the L2 flushed before each when
    /// `flush`. Returns µs per iteration.
    fn each(
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
}

fn stats(samples: &[f64], what: &str) -> Result<Stats> {
    Stats::of(samples).ok_or_else(|| format!("{what}: no valid samples"))
}

/// The GPU, its stream, the timer and (when it loads) cuBLAS.
pub struct Bench {
    gpu: Gpu,
    timer: Timer,
    blas: std::result::Result<CudaBlas, String>,
}

/// Why cudarc cannot load cuBLAS, or the loaded handle. cudarc panics on a missing library or
/// symbol; the probe (handle creation and one small GEMM) runs under `catch_unwind` with a silent
/// panic hook so that a missing cuBLAS becomes a message.
fn load_cublas(stream: &Arc<CudaStream>) -> std::result::Result<CudaBlas, String> {
    // SAFETY: only tries to dlopen the library under each candidate name.
    if !unsafe { blas_sys::is_culib_present() } {
        return Err(format!(
            "cudarc found no cuBLAS under the names it tries ({}); CUDA 13 ships libcublas.so.13, which is not \
             among them: run through run-bench.sh, or put a folder with a link libcublas.so -> libcublas.so.13 on \
             LD_LIBRARY_PATH",
            cudarc::get_lib_name_candidates("cublas").join(", ")
        ));
    }
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let probe = std::panic::catch_unwind(AssertUnwindSafe(|| -> std::result::Result<CudaBlas, String> {
        let blas = CudaBlas::new(stream.clone()).map_err(|e| format!("cublasCreate failed: {e}"))?;
        let n = 64;
        let a = stream.clone_htod(&vec![bf16::ONE; n * n]).map_err(|e| e.to_string())?;
        let mut c = stream.alloc_zeros::<bf16>(n * n).map_err(|e| e.to_string())?;
        gemm_bf16(&blas, stream, (n, n, n), 1.0, &a, &a, &mut c)?;
        let host = stream.clone_dtoh(&c).map_err(|e| e.to_string())?;
        if host.iter().any(|&x| x != bf16::from_f32(n as f32)) {
            return Err("a 64x64x64 probe GEMM gave a wrong result".into());
        }
        Ok(blas)
    }));
    std::panic::set_hook(hook);
    match probe {
        Ok(r) => r,
        Err(p) => Err(format!(
            "loading cuBLAS failed: {}",
            p.downcast_ref::<String>().map(String::as_str).or(p.downcast_ref::<&str>().copied()).unwrap_or("panic")
        )),
    }
}

/// Row-major `C[m, n] = alpha · A[m, k] · B[n, k]ᵀ` with bf16 operands and output and fp32
/// accumulation (cublasGemmEx, CUBLAS_COMPUTE_32F). cuBLAS is column-major, so this asks for
/// `Cᵀ[n, m] = B · Aᵀ`: B's row-major bytes are Bᵀ column-major (op T), A's are Aᵀ (op N).
fn gemm_bf16(
    blas: &CudaBlas,
    stream: &Arc<CudaStream>,
    (m, n, k): (usize, usize, usize),
    alpha: f32,
    a: &CudaSlice<bf16>,
    b: &CudaSlice<bf16>,
    c: &mut CudaSlice<bf16>,
) -> Result<()> {
    if a.len() < m * k || b.len() < n * k || c.len() < m * n {
        return Err(format!(
            "gemm_bf16 {m}x{n}x{k}: buffers of {}, {}, {} elements are too small",
            a.len(),
            b.len(),
            c.len()
        ));
    }
    let dim = |x: usize| i32::try_from(x).map_err(|_| format!("{x} does not fit cuBLAS's int"));
    let (mi, ni, ki) = (dim(m)?, dim(n)?, dim(k)?);
    let beta = 0.0f32;
    let (a_ptr, _ra) = a.device_ptr(stream);
    let (b_ptr, _rb) = b.device_ptr(stream);
    let (c_ptr, _rc) = c.device_ptr_mut(stream);
    // SAFETY: the buffers hold at least the elements the call reads and writes (asserted above) and
    // live until the guards drop after the call is queued on the handle's stream (the same stream).
    unsafe {
        cudarc::cublas::result::gemm_ex(
            *blas.handle(),
            blas_sys::cublasOperation_t::CUBLAS_OP_T,
            blas_sys::cublasOperation_t::CUBLAS_OP_N,
            ni,
            mi,
            ki,
            &alpha as *const f32 as *const c_void,
            b_ptr as *const c_void,
            blas_sys::cudaDataType::CUDA_R_16BF,
            ki,
            a_ptr as *const c_void,
            blas_sys::cudaDataType::CUDA_R_16BF,
            ki,
            &beta as *const f32 as *const c_void,
            c_ptr as *mut c_void,
            blas_sys::cudaDataType::CUDA_R_16BF,
            ni,
            blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(|e| format!("cublasGemmEx ({m}x{n}x{k}): {e}"))
}

struct DeviceGroup {
    a_values: CudaSlice<u8>,
    a_scales: CudaSlice<u8>,
    b_values: CudaSlice<u8>,
    b_scales: CudaSlice<u8>,
}

/// One input set on the device with its own C buffers.
struct DeviceSet {
    groups: Vec<DeviceGroup>,
    c: Vec<CudaSlice<f16>>,
    alphas: Vec<f32>,
}

fn upload(stream: &Arc<CudaStream>, bytes: &[u8]) -> Result<CudaSlice<u8>> {
    if bytes.is_empty() {
        return stream.alloc_zeros::<u8>(16).map_err(drv("allocating"));
    }
    stream.clone_htod(bytes).map_err(drv("uploading inputs"))
}

/// Host bytes of one operand: packed values and blocked scales.
struct HostOperand {
    values: Vec<u8>,
    scales: Vec<u8>,
}

/// Fills `len` bytes from 8-byte words of a seeded generator, in parallel (each 64 KiB chunk its
/// own stream), mapping each word with `word`.
fn parallel_bytes(len: usize, seed: u64, word: fn(u64) -> [u8; 8]) -> Vec<u8> {
    const CHUNK: usize = 1 << 16;
    let mut out = vec![0u8; len];
    out.par_chunks_mut(CHUNK).enumerate().for_each(|(i, chunk)| {
        let mut rng = SplitMix64::new(seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        for bytes in chunk.chunks_mut(8) {
            let w = word(rng.next_u64());
            bytes.copy_from_slice(&w[..bytes.len()]);
        }
    });
    out
}

/// `count` random bf16 values with magnitudes in [0.5, 2) and random signs (never zero: a GEMM on
/// zeros runs faster than on real data).
fn random_bf16(count: usize, seed: u64) -> Vec<bf16> {
    let bytes = parallel_bytes(2 * count, seed, |x| {
        let mut w = [0u8; 8];
        for (i, pair) in w.chunks_exact_mut(2).enumerate() {
            let r = (x >> (16 * i)) as u16;
            // Sign (bit 15) and mantissa (bits 0..7) random; exponent 126 or 127 from bit 7.
            let bits = (r & 0x807F) | if r >> 7 & 1 == 1 { 0x3F80 } else { 0x3F00 };
            pair.copy_from_slice(&bits.to_le_bytes());
        }
        w
    });
    bytes.chunks_exact(2).map(|b| bf16::from_bits(u16::from_le_bytes([b[0], b[1]]))).collect()
}

/// A random operand in the competition's distribution, fast: value codes in {0..3, 8..11} (each
/// byte masked with 0b1011_1011) and every scale byte, padding included (as the competition's
/// generator leaves it), 1.0 or 2.0. Used for the extra input sets, which are timed, not checked.
fn fast_operand(rows: usize, k: usize, seed: u64) -> Result<HostOperand> {
    let scales_len = nvfp4_format::layout::blocked_len(rows, k).map_err(|e| e.to_string())?;
    Ok(HostOperand {
        values: parallel_bytes(rows * k / 2, seed, |x| (x & 0xBBBB_BBBB_BBBB_BBBB).to_le_bytes()),
        scales: parallel_bytes(scales_len, seed ^ 0x5CA1E, |x| {
            std::array::from_fn(|i| if x >> i & 1 == 1 { 0x40 } else { 0x38 })
        }),
    })
}

fn device_set(
    stream: &Arc<CudaStream>,
    operands: &[(HostOperand, HostOperand)],
    groups: &[Group],
) -> Result<DeviceSet> {
    let mut set = DeviceSet { groups: vec![], c: vec![], alphas: vec![] };
    for ((a, b), g) in operands.iter().zip(groups) {
        set.groups.push(DeviceGroup {
            a_values: upload(stream, &a.values)?,
            a_scales: upload(stream, &a.scales)?,
            b_values: upload(stream, &b.values)?,
            b_scales: upload(stream, &b.scales)?,
        });
        let len = if g.m() == 0 { 16 } else { g.m() * g.n() };
        set.c.push(stream.alloc_zeros::<f16>(len).map_err(drv("allocating C"))?);
        set.alphas.push(g.effective_alpha_f32());
    }
    Ok(set)
}

fn run_set(plan: &mut GemmPlan, stream: &Arc<CudaStream>, set: &mut DeviceSet) -> Result<()> {
    let mut args: Vec<GroupArgs> = set
        .groups
        .iter()
        .zip(set.c.iter_mut())
        .zip(&set.alphas)
        .map(|((d, c), &alpha)| GroupArgs {
            a: Nvfp4Operand { values: &d.a_values, scales: &d.a_scales },
            b: Nvfp4Operand { values: &d.b_values, scales: &d.b_scales },
            c: Output::F16(c),
            alpha,
        })
        .collect();
    plan.run(stream, &mut args).map_err(|e| format!("plan.run: {e}"))
}

/// Host-clock µs per call over `batches` batches of `calls` calls (synchronized between batches,
/// never inside one).
fn host_overhead(
    stream: &Arc<CudaStream>,
    batches: usize,
    calls: usize,
    f: &mut dyn FnMut(usize) -> Result<()>,
) -> Result<Vec<f64>> {
    f(0)?; // warm-up
    let mut samples = Vec::with_capacity(batches);
    for _ in 0..batches {
        stream.synchronize().map_err(drv("synchronizing"))?;
        let t = Instant::now();
        for i in 0..calls {
            f(i)?;
        }
        samples.push(t.elapsed().as_secs_f64() * 1e6 / calls as f64);
    }
    stream.synchronize().map_err(drv("synchronizing"))?;
    Ok(samples)
}

fn rounded<T>(reference: &[GroupOutput<f64>], round: fn(f64) -> T) -> Vec<GroupOutput<T>> {
    reference
        .iter()
        .map(|r| GroupOutput { rows: r.rows, cols: r.cols, data: r.data.iter().map(|&x| round(x)).collect() })
        .collect()
}

impl Bench {
    /// Opens GPU 0, allocates the flush buffer and tries to load cuBLAS (unless `baseline` is off).
    pub fn new(o: &Options) -> Result<Bench> {
        if !nvfp4_gemm::driver_present() {
            return Err("no usable GPU: no NVIDIA driver on this machine (libcuda.so.1 could not be loaded)".into());
        }
        let gpu = Gpu::new(0).map_err(|e| format!("no usable GPU: {e}"))?;
        let stream = gpu.context().default_stream();
        let flush = stream.alloc_zeros::<u8>(o.flush_bytes).map_err(drv("allocating the L2 flush buffer"))?;
        let blas = if o.baseline { load_cublas(&stream) } else { Err("disabled with --no-baseline".into()) };
        Ok(Bench { gpu, timer: Timer { stream, flush }, blas })
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
        self.timer.stream.clone()
    }

    /// Measures the ceilings: a 1 GiB device-to-device copy (median of 20) and, with cuBLAS, an
    /// 8192³ bf16 GEMM on random data (median of 10).
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
        Ok(Environment {
            device: self.device(),
            copy_tb_s,
            copy_bytes,
            tensor_tflops,
            cublas,
            flush_bytes: o.flush_bytes,
        })
    }

    /// bf16 TFLOP/s of an 8192³ cuBLAS GEMM on random data (median of 10 after 3 warm-ups);
    /// `None` without cuBLAS.
    fn tensor_rate(&mut self) -> Result<Option<f64>> {
        let Ok(blas) = &self.blas else { return Ok(None) };
        let stream = self.timer.stream.clone();
        let n = 8192;
        let a = stream.clone_htod(&random_bf16(n * n, 77)).map_err(drv("uploading"))?;
        let b = stream.clone_htod(&random_bf16(n * n, 78)).map_err(drv("uploading"))?;
        let mut c = stream.alloc_zeros::<bf16>(n * n).map_err(drv("allocating"))?;
        let t = self.timer.each(3, 10, false, &mut || gemm_bf16(blas, &stream, (n, n, n), 1.0, &a, &b, &mut c))?;
        Ok(Some(2.0 * (n as f64).powi(3) / (stats(&t, "tensor rate")?.median * 1e-6) / 1e12))
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
        let mut plan = GemmPlan::new(&self.gpu, problem).map_err(|e| format!("planning: {e}"))?;
        let kernel = plan.summary().kernel.clone();

        step("generating and uploading inputs");
        let groups = nvfp4_format::random_groups(&named.shapes, InputDistribution::Competition, o.seed)
            .map_err(|e| e.to_string())?;
        let set0: Vec<(HostOperand, HostOperand)> = groups
            .iter()
            .map(|g| {
                let op = |m: &nvfp4_format::Nvfp4Matrix| HostOperand {
                    values: m.values().to_vec(),
                    scales: m.scales().to_vec(),
                };
                (op(&g.a), op(&g.b))
            })
            .collect();
        let mut sets = vec![device_set(&stream, &set0, &groups)?];
        drop(set0);
        for s in 1..o.sets {
            let seed = o.seed.wrapping_add(0x1000 * s as u64);
            let host: Vec<(HostOperand, HostOperand)> = named
                .shapes
                .iter()
                .enumerate()
                .map(|(g, sh)| {
                    Ok((
                        fast_operand(sh.m, sh.k, seed + 2 * g as u64)?,
                        fast_operand(sh.n, sh.k, seed + 2 * g as u64 + 1)?,
                    ))
                })
                .collect::<Result<_>>()?;
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
                let cmp = compare(&got, &rounded(reference, codec::f64_to_f16), Tolerance::COMPETITION)
                    .map_err(|e| e.to_string())?;
                (Some(cmp.to_string()), cmp.passed())
            }
        };

        step("competition timing");
        let n_sets = sets.len();
        let t = self.timer.each(1, o.reps, true, &mut || {
            for set in sets.iter_mut() {
                run_set(&mut plan, &stream, set)?;
            }
            Ok(())
        })?;
        let competition_us = stats(&t, "competition")?.scaled(1.0 / n_sets as f64);

        step("kernel-only timing");
        let t = self.timer.each(3, o.iters, true, &mut || run_set(&mut plan, &stream, &mut sets[0]))?;
        let kernel_us = stats(&t, "kernel-only")?;

        step("host overhead");
        let cached =
            host_overhead(&stream, o.host_batches, o.host_calls, &mut |_| run_set(&mut plan, &stream, &mut sets[0]))?;
        let rotating = host_overhead(&stream, o.host_batches, o.host_calls, &mut |i| {
            run_set(&mut plan, &stream, &mut sets[i % n_sets])
        })?;
        drop(sets);

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
            cublas_us,
            cublas_note,
            floor_bytes_us,
            floor_flops_us,
        })
    }
}

/// One group of the baseline: dequantized operands, C, and the GEMM's sizes.
struct BaselineGroup {
    a: CudaSlice<bf16>,
    b: CudaSlice<bf16>,
    c: CudaSlice<bf16>,
    mnk: (usize, usize, usize),
    alpha: f32,
}

/// The cuBLAS baseline on the dequantized set 0: per group `C = alpha · A · Bᵀ` in bf16 (fp32
/// accumulation), checked against the bf16-rounded reference when there is one, then timed like
/// the kernel-only measurement (events around all groups' calls, L2 flushed before each).
fn baseline(
    blas: &CudaBlas,
    timer: &mut Timer,
    stream: &Arc<CudaStream>,
    groups: &[Group],
    reference: Option<&[GroupOutput<f64>]>,
    iters: usize,
) -> Result<(Stats, String)> {
    let host: Vec<(Vec<bf16>, Vec<bf16>)> =
        groups.par_iter().map(|g| (g.a.dequantize_block_scaled_bf16(), g.b.dequantize_block_scaled_bf16())).collect();
    let mut ops = vec![];
    for ((a, b), g) in host.iter().zip(groups) {
        if g.m() == 0 {
            continue;
        }
        ops.push(BaselineGroup {
            a: stream.clone_htod(a).map_err(drv("uploading"))?,
            b: stream.clone_htod(b).map_err(drv("uploading"))?,
            c: stream.alloc_zeros::<bf16>(g.m() * g.n()).map_err(drv("allocating"))?,
            mnk: (g.m(), g.n(), g.k()),
            alpha: g.effective_alpha_f32(),
        });
    }
    drop(host);
    let run = |ops: &mut [BaselineGroup]| -> Result<()> {
        for op in ops.iter_mut() {
            gemm_bf16(blas, stream, op.mnk, op.alpha, &op.a, &op.b, &mut op.c)?;
        }
        Ok(())
    };
    run(&mut ops)?;
    stream.synchronize().map_err(drv("running cuBLAS"))?;
    let note = match reference {
        None => "not checked (--no-check)".into(),
        Some(reference) => {
            let mut got: Vec<Vec<bf16>> = vec![];
            let mut it = ops.iter();
            for g in groups {
                got.push(if g.m() == 0 {
                    vec![]
                } else {
                    stream.clone_dtoh(&it.next().expect("one per non-empty group").c).map_err(drv("downloading"))?
                });
            }
            let cmp = compare(&got, &rounded(reference, codec::f64_to_bf16), Tolerance::COMPETITION)
                .map_err(|e| e.to_string())?;
            format!("bf16 output vs bf16-rounded reference: {cmp}")
        }
    };
    let t = timer.each(3, iters, true, &mut || run(&mut ops))?;
    Ok((stats(&t, "cuBLAS")?, note))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parallel_bytes_fills_any_length_deterministically() {
        for len in [0, 1, 7, 8, 9, (1 << 16) + 3, 3 << 16] {
            let a = parallel_bytes(len, 5, |x| x.to_le_bytes());
            assert_eq!(a.len(), len);
            assert_eq!(a, parallel_bytes(len, 5, |x| x.to_le_bytes()));
        }
        let a = parallel_bytes(1 << 18, 5, |x| x.to_le_bytes());
        let b = parallel_bytes(1 << 18, 6, |x| x.to_le_bytes());
        assert_ne!(a, b);
        // Chunks are independent streams, not copies of one another.
        assert_ne!(a[..1 << 16], a[1 << 16..2 << 16]);
    }

    #[test]
    fn random_bf16_values_are_nonzero_and_bounded() {
        let v = random_bf16(100_003, 1);
        assert_eq!(v.len(), 100_003);
        assert!(v.iter().all(|x| (0.5..2.0).contains(&x.to_f32().abs())));
        let negative = v.iter().filter(|x| x.to_f32() < 0.0).count();
        assert!((40_000..60_000).contains(&negative), "{negative}");
        assert!(v.iter().any(|x| x.to_f32().abs() < 1.0) && v.iter().any(|x| x.to_f32().abs() >= 1.0));
    }

    #[test]
    fn fast_operands_follow_the_competition_distribution() {
        let op = fast_operand(200, 512, 9).unwrap();
        assert_eq!(op.values.len(), 200 * 256);
        assert_eq!(op.scales.len(), nvfp4_format::layout::blocked_len(200, 512).unwrap());
        let mut codes = [0usize; 16];
        for b in &op.values {
            codes[(b & 0xF) as usize] += 1;
            codes[(b >> 4) as usize] += 1;
        }
        for (code, &n) in codes.iter().enumerate() {
            assert_eq!(n > 0, [0, 1, 2, 3, 8, 9, 10, 11].contains(&code), "code {code}: {n}");
        }
        let ones = op.scales.iter().filter(|&&s| s == 0x38).count();
        assert_eq!(ones + op.scales.iter().filter(|&&s| s == 0x40).count(), op.scales.len());
        assert!((ones as f64 / op.scales.len() as f64 - 0.5).abs() < 0.05);
        // A matrix built from them is valid for the reference.
        let m = nvfp4_format::Nvfp4Matrix::new(200, 512, op.values, op.scales, 1.0).unwrap();
        assert!(m.dequantize().iter().all(|x| x.abs() <= 3.0));
    }
}
