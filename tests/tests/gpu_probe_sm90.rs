//! The hardware probes (`diag/kernel/src/probe.rs`) on the H200 and in the device model, in this one
//! process, with the same inputs: TMA boxes (the GEMM's token and weight maps, 128B/64B/no
//! swizzle, out-of-bounds rows, columns and negative coordinates; raw shared-memory bytes),
//! mbarrier phases with transaction bytes announced before and after the copies land, a
//! 2-CTA cluster ping-pong through remote arrivals, and `wgmma m64n16k16`/`m64n128k16` register
//! fragments. Every output must be identical bit for bit: this is what makes the Hopper parts of
//! the model hardware-checked (docs/model.md). Ignored unless asked for (they need an sm_90a GPU);
//! `model-tests/tests/model_probe.rs` checks the model's side against the ISA in CI.

use nvfp4_gemm::Arch;
use nvfp4_gemm_diag::probe::*;
use nvfp4_gemm_model_tests::ModelTarget;
use nvfp4_gemm_tests::gpu_or_skip;

/// Compares what the GPU and the model wrote for one probe; prints the verdict and returns the
/// failure, if any.
fn verdict(what: &str, gpu: Result<Vec<u8>, String>, model: Result<Vec<u8>, String>) -> Option<String> {
    let r = match (gpu, model) {
        (Ok(g), Ok(m)) => compare_bytes(what, "H200", &g, "model", &m).map(|()| g.len()),
        (Err(e), _) => Err(format!("{what}: on the H200: {e}")),
        (_, Err(e)) => Err(format!("{what}: {e}")),
    };
    match r {
        Ok(bytes) => {
            println!("{what}: identical ({bytes} bytes)");
            None
        }
        Err(e) => {
            println!("MISMATCH {e}");
            Some(e)
        }
    }
}

fn finish(test: &str, failures: Vec<String>) {
    assert!(failures.is_empty(), "{test}: {} probe(s) differ:\n{}", failures.len(), failures.join("\n"));
}

#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_probe_tma_matches_the_model() {
    let Some(gpu) = gpu_or_skip("gpu_probe_tma_matches_the_model", Arch::Sm90a) else {
        return;
    };
    let hw = GpuTarget::new(&gpu).expect("loading the diagnostic kernels");
    let failures = tma_cases()
        .iter()
        .filter_map(|c| verdict(c.name, run_tma(&hw, c), run_tma(&ModelTarget::default(), c)))
        .collect();
    finish("gpu_probe_tma_matches_the_model", failures);
}

#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_probe_sync_matches_the_model() {
    let Some(gpu) = gpu_or_skip("gpu_probe_sync_matches_the_model", Arch::Sm90a) else {
        return;
    };
    let hw = GpuTarget::new(&gpu).expect("loading the diagnostic kernels");
    let failures =
        verdict("sync probe (ring, gather, cluster ping-pong)", run_sync(&hw), run_sync(&ModelTarget::default()));
    finish("gpu_probe_sync_matches_the_model", failures.into_iter().collect());
}

#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_probe_wgmma_matches_the_model() {
    let Some(gpu) = gpu_or_skip("gpu_probe_wgmma_matches_the_model", Arch::Sm90a) else {
        return;
    };
    let hw = GpuTarget::new(&gpu).expect("loading the diagnostic kernels");
    let failures = wgmma_cases()
        .iter()
        .filter_map(|c| verdict(c.name, run_wgmma(&hw, c), run_wgmma(&ModelTarget::default(), c)))
        .collect();
    finish("gpu_probe_wgmma_matches_the_model", failures);
}
