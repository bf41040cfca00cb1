//! The sm_100a kernels in the model.

use nvfp4_format::InputDistribution::Competition;
use nvfp4_gemm::OutputType;
use nvfp4_gemm_model_tests::*;

#[test]
fn model_n128_deep_smoke() {
    let g = groups(&z(&[96], &[136], &[320]), Competition, 1);
    run_and_check("n128_deep smoke", &g, OutputType::F16, &ModelRun::default(), |o, r| {
        run_sm100(o, Residency::deep(2), r)
    });
}
