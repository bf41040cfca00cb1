//! What a plan would run on a given architecture and SM count, without a GPU: the same planner as
//! [`GemmPlan`](crate::GemmPlan), for tools that show the choice (`nvfp4-gemm info --arch`).

use crate::device::Arch;
use crate::engine::summary;
use crate::error::Result;
use crate::problem::Problem;
use crate::summary::PlanSummary;
use crate::{sm100, sm90};

/// SMs of the GPU each architecture's kernels are tuned on: the H200 (132) and the B200 (148).
pub fn reference_sm_count(arch: Arch) -> u32 {
    match arch {
        Arch::Sm90a => 132,
        Arch::Sm100a => 148,
    }
}

/// The kernels, launches and tile count a plan of `problem` runs on an `arch` GPU with
/// `sm_count` SMs, computed on the CPU.
///
/// sm_90a: exactly what [`GemmPlan::new`](crate::GemmPlan::new) picks on such a GPU (its planner
/// needs only the SM count). sm_100a: the driver's occupancy answers are assumed, not asked: each
/// kernel at its most CTAs per SM and `sm_count / cluster size` clusters resident; a real GPU can
/// hold fewer clusters (how clusters fit into GPCs), which shortens the grid of the cluster kernel.
pub fn plan_summary(arch: Arch, sm_count: u32, problem: &Problem) -> Result<PlanSummary> {
    Ok(match arch {
        Arch::Sm90a => summary(&sm90::Sm90Layout::new(problem, sm_count)),
        Arch::Sm100a => {
            let resident = |kernel: nvfp4_gemm_abi::sm100::params::KernelLayout| {
                let c = kernel.config();
                c.resident_ctas(sm_count, c.max_ctas_per_sm(), sm_count / c.cluster_size())
            };
            summary(&sm100::Sm100Layout::new(problem, resident)?)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::{GroupShape, OutputType};

    fn problem(shapes: &[(usize, usize, usize)]) -> Problem {
        Problem::new(shapes.iter().map(|&(m, n, k)| GroupShape::new(m, n, k)).collect::<Vec<_>>(), OutputType::F16)
            .unwrap()
    }

    #[test]
    fn both_architectures_plan_without_a_gpu() {
        let p = problem(&[(128, 4096, 7168), (384, 4096, 7168)]);
        let s90 = plan_summary(Arch::Sm90a, reference_sm_count(Arch::Sm90a), &p).unwrap();
        assert_eq!(s90.arch, Arch::Sm90a);
        assert!(s90.launches.iter().any(|l| l.kernel.starts_with("sm90_grouped_gemm")), "{s90:?}");
        assert!(s90.tiles > 0);
        let s100 = plan_summary(Arch::Sm100a, reference_sm_count(Arch::Sm100a), &p).unwrap();
        assert_eq!(s100.arch, Arch::Sm100a);
        assert!(s100.launches.iter().all(|l| l.kernel.starts_with("sm100_gemm")), "{s100:?}");
        assert!(!s100.launches.is_empty());
    }

    #[test]
    fn a_problem_without_work_has_no_launches() {
        let p = problem(&[(0, 256, 128)]);
        for arch in [Arch::Sm90a, Arch::Sm100a] {
            assert!(plan_summary(arch, reference_sm_count(arch), &p).unwrap().launches.is_empty(), "{arch:?}");
        }
    }
}
