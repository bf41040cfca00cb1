//! The cuBLAS baseline: loading cuBLAS through cudarc, the row-major bf16 GEMM (also the
//! tensor-rate ceiling's), and the per-group baseline on the dequantized inputs.

use crate::measure::{drv, stats, Result, Timer};
use crate::stats::Stats;
use cudarc::cublas::{sys as blas_sys, CudaBlas};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use half::bf16;
use nvfp4_format::{compare, Group, GroupOutput, Tolerance};
use rayon::prelude::*;
use std::ffi::c_void;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

/// Why cudarc cannot load cuBLAS, or the loaded handle. cudarc panics on a missing library or
/// symbol; the probe (handle creation and one small GEMM) runs under `catch_unwind` with a silent
/// panic hook so that a missing cuBLAS becomes a message.
pub(crate) fn load_cublas(stream: &Arc<CudaStream>) -> std::result::Result<CudaBlas, String> {
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
pub(crate) fn gemm_bf16(
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
pub(crate) fn baseline(
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
            let cmp = compare(
                &got,
                &reference.iter().map(GroupOutput::rounded).collect::<Vec<GroupOutput<bf16>>>(),
                Tolerance::COMPETITION,
            )
            .map_err(|e| e.to_string())?;
            format!("bf16 output vs bf16-rounded reference: {cmp}")
        }
    };
    let t = timer.each(3, iters, true, &mut || run(&mut ops))?;
    Ok((stats(&t, "cuBLAS")?, note))
}
