//! One grouped GEMM on an application's own context, stream and buffers, through the cudarc that
//! candle uses (see Cargo.toml). Compiled by `.ci/run`; `host/examples/from_context.rs` is the
//! runnable version.

use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use half::f16;
use nvfp4_gemm::{GemmPlan, Gpu, GroupArgs, GroupShape, Nvfp4Operand, Output, OutputType, Problem};
use std::sync::Arc;

/// One group's NVFP4 operands as the application holds them: packed values and blocked scales.
pub struct Operands {
    pub a_values: CudaSlice<u8>,
    pub a_scales: CudaSlice<u8>,
    pub b_values: CudaSlice<u8>,
    pub b_scales: CudaSlice<u8>,
    /// `alpha · g_a · g_b`: the global scales are not in the bytes.
    pub alpha: f32,
}

/// `C_g = alpha_g · A_g · B_gᵀ` for every group, enqueued on `stream` (of `ctx`).
pub fn grouped_gemm(
    ctx: Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    shapes: Vec<GroupShape>,
    groups: &[Operands],
    cs: &mut [CudaSlice<f16>],
) -> nvfp4_gemm::Result<()> {
    let gpu = Gpu::from_context(ctx)?;
    let mut plan = GemmPlan::new(&gpu, Problem::new(shapes, OutputType::F16)?)?;
    let mut args: Vec<GroupArgs> = groups
        .iter()
        .zip(cs.iter_mut())
        .map(|(g, c)| GroupArgs {
            a: Nvfp4Operand { values: &g.a_values, scales: &g.a_scales }.into(),
            b: Nvfp4Operand { values: &g.b_values, scales: &g.b_scales },
            c: Output::F16(c),
            alpha: g.alpha,
        })
        .collect();
    plan.run(stream, &mut args)
}
