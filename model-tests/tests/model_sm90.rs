//! The sm_90a kernels in the model.

use nvfp4_format::InputDistribution::Competition;
use nvfp4_gemm::OutputType;
use nvfp4_gemm_model_tests::*;

#[test]
fn model_sm90_smoke() {
    let g = groups(&z(&[96], &[136], &[320]), Competition, 1);
    run_and_check("sm90 smoke", &g, OutputType::F16, &ModelRun::default(), |o, r| run_sm90(o, 2, r));
}
