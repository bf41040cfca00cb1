//! The sm_100a hardware probes (`diag/kernel/src/probe_sm100.rs`) on a B200 and in the device model, in
//! this one process, with the same inputs — the first thing to run on a B200 (docs/sm100.md):
//! - `tmem_probe`: `tcgen05.alloc`, 33 `tcgen05.cp.32x128b.warpx4` of scale blocks (the GEMM's
//!   4-column grid and LBO, CUTLASS's LBO, copies shifted 1–3 columns off the grid), every warp's
//!   `tcgen05.ld.16x256b` of a 128 × 128 window;
//! - `umma_probe`: FP4 TMA boxes through 2D and 3D `16U4_ALIGN8B` maps (boxes wider than K, rows
//!   past the tensor), scale copies, 1–4 exact `tcgen05.mma ... mxf4nvf4.block_scale.scale_vec::4X`
//!   with N = 128 and 256, and the variants the model's strict mode rejects (operand LBO 4096,
//!   scale-copy LBO 16, scale columns off the grid): the tiles in shared memory and the
//!   accumulator;
//! - `tma4_multicast_probe`: a 4-CTA cluster, rank 0's FP4 box multicast to all, each CTA's
//!   `tcgen05.commit ... multicast::cluster` arriving on rank 0's barrier.
//!
//! Every output must be identical byte for byte; a difference names the case and each differing
//! part (tile, accumulator, status, a CTA's box or log) with its first differing byte. Agreement
//! makes the tcgen05 parts of the model hardware-checked (docs/model.md §5); a variant case that
//! agrees says strict mode may accept that value. Without an sm_100 GPU the tests print why they
//! skip; `model-tests/tests/model_probe_sm100.rs` checks the model's side in CI.

use nvfp4_gemm::Arch;
use nvfp4_gemm_diag::probe::sm100::*;
use nvfp4_gemm_diag::probe::{GpuTarget, ModelRules, ProbeTarget};
use nvfp4_gemm_model_tests::ModelTarget;
use nvfp4_gemm_tests::gpu_or_skip;

/// One case on the B200 and in the model: `None` when identical, else the report (printed too).
fn b200_against_model(
    name: &str,
    rules: ModelRules,
    sections: &[Section],
    gpu: Result<Vec<u8>, String>,
    model: Result<Vec<u8>, String>,
) -> Option<String> {
    let what = match rules {
        ModelRules::Strict => name.to_string(),
        ModelRules::Isa => format!("{name} (model under the ISA's rules only)"),
    };
    let result = match (gpu, model) {
        (Ok(g), Ok(m)) => compare_sections(&what, "B200", &g, "model", &m, sections).map(|()| g.len()),
        (Err(e), _) => Err(format!("{what}: on the B200: {e}")),
        (_, Err(e)) => Err(format!("{what}: {e}")),
    };
    match result {
        Ok(bytes) => {
            println!("{what}: identical ({bytes} bytes)");
            None
        }
        Err(e) => {
            println!("DIFFERS {e}");
            Some(e)
        }
    }
}

/// A probe case, as the comparison needs it.
trait Case {
    /// Its name, the model's rules for it, its output sections.
    fn info(&self) -> (&'static str, ModelRules, Vec<Section>);
    /// Runs it on `t`.
    fn run<T: ProbeTarget>(&self, t: &T) -> Result<Vec<u8>, String>;
}

impl Case for TmemCase {
    fn info(&self) -> (&'static str, ModelRules, Vec<Section>) {
        (self.name, self.rules(), self.sections())
    }
    fn run<T: ProbeTarget>(&self, t: &T) -> Result<Vec<u8>, String> {
        run_tmem(t, self)
    }
}

impl Case for UmmaCase {
    fn info(&self) -> (&'static str, ModelRules, Vec<Section>) {
        (self.name, self.rules(), self.sections())
    }
    fn run<T: ProbeTarget>(&self, t: &T) -> Result<Vec<u8>, String> {
        run_umma(t, self)
    }
}

impl Case for MulticastCase {
    fn info(&self) -> (&'static str, ModelRules, Vec<Section>) {
        (self.name, ModelRules::Strict, self.sections())
    }
    fn run<T: ProbeTarget>(&self, t: &T) -> Result<Vec<u8>, String> {
        run_multicast(t, self)
    }
}

/// Runs every case on the B200 and in the model, prints each verdict, and fails with every
/// difference.
fn compare_every_case<C: Case>(test: &str, cases: &[C]) {
    let Some(device) = gpu_or_skip(test, Arch::Sm100a) else {
        return;
    };
    let hw = GpuTarget::new(&device).expect("loading the diagnostic kernels");
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|c| {
            let (name, rules, sections) = c.info();
            b200_against_model(name, rules, &sections, c.run(&hw), c.run(&ModelTarget::default()))
        })
        .collect();
    assert!(failures.is_empty(), "{test}: {} case(s) differ:\n{}", failures.len(), failures.join("\n"));
}

#[test]
#[ignore = "needs an sm_100a GPU"]
fn gpu_probe_sm100_tmem_copies_match_the_model() {
    compare_every_case("gpu_probe_sm100_tmem_copies_match_the_model", &tmem_cases());
}

#[test]
#[ignore = "needs an sm_100a GPU"]
fn gpu_probe_sm100_mma_and_fp4_tma_match_the_model() {
    compare_every_case("gpu_probe_sm100_mma_and_fp4_tma_match_the_model", &umma_cases());
}

#[test]
#[ignore = "needs an sm_100a GPU"]
fn gpu_probe_sm100_cluster_multicast_matches_the_model() {
    compare_every_case("gpu_probe_sm100_cluster_multicast_matches_the_model", &multicast_cases());
}
