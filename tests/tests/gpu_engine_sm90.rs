//! The plan engine's contract on the GPU (docs/engine.md): one plan serves any tensors of its
//! shapes — every call with new buffers computes what a fresh plan computes on them, bit for bit,
//! and writes only its own C — without allocating device memory; a call captured into a CUDA
//! graph with buffers the plan has not seen replays with its own tables while later calls use
//! others; a second capture before a call outside capture is refused, writing nothing. For
//! host-sized plans (NVFP4 and W4A16 tokens) and a device-sized one.

use cudarc::driver::{CudaSlice, CudaStream};
use half::f16;
use nvfp4_format::{Group, GroupShape, InputDistribution};
use nvfp4_gemm::moe::{MoeArgs, MoePlan, MoeProblem, TokenLayout};
use nvfp4_gemm::{Arch, DeviceGroup, Error, GemmPlan, Gpu, GroupArgs, Nvfp4Operand, Output, OutputType, Problem};
use nvfp4_gemm_tests::moe::{capture, with_capture_stream};
use nvfp4_gemm_tests::{gpu_or_skip, make_groups};
use std::sync::Arc;

/// A NaN no kernel writes: an element still holding it was not written.
const POISON: u16 = 0x7E01;

/// Groups of several tile heights and one without tokens.
fn shapes() -> Vec<GroupShape> {
    vec![
        GroupShape::new(40, 256, 512),
        GroupShape::new(0, 128, 256),
        GroupShape::new(130, 136, 192),
        GroupShape::new(7, 512, 256),
    ]
}

/// One input set on the device and its C buffers (poisoned).
struct Set {
    groups: Vec<DeviceGroup>,
    c: Vec<CudaSlice<f16>>,
}

impl Set {
    fn new(stream: &Arc<CudaStream>, groups: &[Group]) -> Set {
        let c = groups
            .iter()
            .map(|g| stream.clone_htod(&vec![f16::from_bits(POISON); (g.m() * g.n()).max(16)]).unwrap())
            .collect();
        Set { groups: groups.iter().map(|g| DeviceGroup::upload(stream, g).unwrap()).collect(), c }
    }

    fn poison(&mut self, stream: &Arc<CudaStream>) {
        for c in &mut self.c {
            stream.memcpy_htod(&vec![f16::from_bits(POISON); c.len()], c).unwrap();
        }
    }

    fn run(&mut self, plan: &mut GemmPlan, stream: &Arc<CudaStream>) -> nvfp4_gemm::Result<()> {
        let mut args: Vec<GroupArgs> =
            self.groups.iter().zip(self.c.iter_mut()).map(|(d, c)| d.args(Output::F16(c))).collect();
        plan.run(stream, &mut args)
    }

    fn bits(&self, stream: &Arc<CudaStream>) -> Vec<Vec<u16>> {
        self.c.iter().map(|c| stream.clone_dtoh(c).unwrap().iter().map(|x| x.to_bits()).collect()).collect()
    }

    fn untouched(&self, stream: &Arc<CudaStream>) -> bool {
        self.bits(stream).iter().all(|c| c.iter().all(|&x| x == POISON))
    }
}

/// What a fresh plan of `problem` writes on `set`.
fn fresh(gpu: &Gpu, stream: &Arc<CudaStream>, problem: &Problem, set: &mut Set) -> Vec<Vec<u16>> {
    set.poison(stream);
    set.run(&mut GemmPlan::new(gpu, problem.clone()).unwrap(), stream).unwrap();
    let bits = set.bits(stream);
    set.poison(stream);
    bits
}

/// Free device memory (bytes) after the device is idle.
fn free_memory(gpu: &Gpu) -> usize {
    gpu.context().synchronize().unwrap();
    let mut free = 0usize;
    let mut total = 0usize;
    // SAFETY: out-pointers to locals; the context is current (the synchronize bound it).
    unsafe { cudarc::driver::sys::cuMemGetInfo_v2(&mut free, &mut total) }.result().unwrap();
    free
}

/// Seventeen input sets through one plan, one more than the table sets a plan keeps (16), so
/// that every call uploads into a set an earlier call's kernels read (the case where a stale
/// tensor map would show): each call's outputs bit for bit a fresh plan's on the same set, only
/// the call's own C written; free device memory unchanged across the calls.
#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_engine_new_tensors_every_call() {
    let Some(gpu) = gpu_or_skip("gpu_engine_new_tensors_every_call", Arch::Sm90a) else { return };
    let stream = gpu.context().default_stream();
    let problem = Problem::new(shapes(), OutputType::F16).unwrap();
    let mut sets: Vec<Set> =
        (0..17).map(|s| Set::new(&stream, &make_groups(&shapes(), InputDistribution::Competition, 0xE0 + s))).collect();
    let want: Vec<Vec<Vec<u16>>> = sets.iter_mut().map(|set| fresh(&gpu, &stream, &problem, set)).collect();
    let mut plan = GemmPlan::new(&gpu, problem.clone()).unwrap();
    sets[0].run(&mut plan, &stream).unwrap();
    let before = free_memory(&gpu);
    for round in 0..3 {
        for i in 0..sets.len() {
            sets[i].poison(&stream);
            sets[i].run(&mut plan, &stream).unwrap();
            assert_eq!(sets[i].bits(&stream), want[i], "round {round}, set {i}");
            for (j, other) in sets.iter().enumerate() {
                if j != i {
                    assert!(other.untouched(&stream), "round {round}: the call on set {i} wrote set {j}'s C");
                }
            }
            sets[i].poison(&stream);
        }
    }
    let after = free_memory(&gpu);
    assert_eq!(before, after, "calls with new tensors allocated device memory");
    println!("CASE gpu_engine_new_tensors_every_call: 51 calls on 17 sets, bit for bit a fresh plan's, {before} bytes free before and after");
}

/// A call captured with buffers the plan never saw (an upload inside the capture): the graph's
/// replays write their C, bit for bit a fresh plan's, also after later calls on other buffers
/// (which get new tables); a second capture before a call outside capture is refused and
/// captures nothing.
#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_engine_captures_keep_their_tables() {
    let Some(gpu) = gpu_or_skip("gpu_engine_captures_keep_their_tables", Arch::Sm90a) else { return };
    with_capture_stream(&gpu, |stream| {
        let problem = Problem::new(shapes(), OutputType::F16).unwrap();
        let mut sets: Vec<Set> = (0..3)
            .map(|s| Set::new(stream, &make_groups(&shapes(), InputDistribution::Competition, 0xCA0 + s)))
            .collect();
        let want: Vec<Vec<Vec<u16>>> = sets.iter_mut().map(|set| fresh(&gpu, stream, &problem, set)).collect();
        let mut plan = GemmPlan::new(&gpu, problem.clone()).unwrap();
        sets[0].run(&mut plan, stream).unwrap();
        stream.synchronize().unwrap();
        sets[0].poison(stream);
        // Set 1 was never seen: its tables are uploaded inside the capture.
        let (graph, r) = capture(stream, || sets[1].run(&mut plan, stream));
        r.unwrap();
        stream.synchronize().unwrap();
        assert!(sets[1].untouched(stream), "capturing ran the call");
        // A second capture before any call outside capture: refused, nothing captured.
        let (empty, r) = capture(stream, || sets[2].run(&mut plan, stream));
        assert!(matches!(r, Err(Error::Capture(_))), "{r:?}");
        empty.launch().unwrap();
        stream.synchronize().unwrap();
        assert!(sets[2].untouched(stream), "a refused capture wrote C");
        for round in 0..3 {
            // Calls outside capture on sets 2 and 0 (new tables), then the graph: each writes its
            // own C, bit for bit.
            for i in [2, 0] {
                sets[i].run(&mut plan, stream).unwrap();
                stream.synchronize().unwrap();
                assert_eq!(sets[i].bits(stream), want[i], "round {round}, set {i}");
                sets[i].poison(stream);
            }
            graph.launch().unwrap();
            stream.synchronize().unwrap();
            assert_eq!(sets[1].bits(stream), want[1], "round {round}: the replay");
            assert!(
                sets[0].untouched(stream) && sets[2].untouched(stream),
                "round {round}: the replay wrote another C"
            );
            sets[1].poison(stream);
        }
        println!("CASE gpu_engine_captures_keep_their_tables: 3 rounds of calls and replays, bit for bit");
    });
}

/// A device-sized plan with NVFP4 tokens: calls on new A and C buffers (16 of them, the weights
/// fixed) write what the first buffers' call wrote for the same tokens, and allocate nothing.
#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_engine_moe_new_buffers() {
    let Some(gpu) = gpu_or_skip("gpu_engine_moe_new_buffers", Arch::Sm90a) else { return };
    let stream = gpu.context().default_stream();
    let (experts, n, k, t) = (4usize, 256usize, 512usize, 96usize);
    let p = MoeProblem::new(experts, n, k, TokenLayout::Contiguous { max_tokens: t }, OutputType::F16).unwrap();
    let groups = make_groups(&vec![GroupShape::new(24, n, k); experts], InputDistribution::Competition, 0x30E);
    let weights: Vec<_> = groups.iter().map(|g| DeviceGroup::upload(&stream, g).unwrap()).collect();
    let ops: Vec<Nvfp4Operand> = weights.iter().map(|w| w.b.operand()).collect();
    let alphas: Vec<f32> = groups.iter().map(|g| g.b.global_scale()).collect();
    let offsets = stream.clone_htod(&[0u32, 24, 48, 72, 96]).unwrap();
    // The tokens: every group's A stacked in order, quantized scales laid out as the plan reads them.
    let a = p.a_sizes();
    let mut a_values = vec![0u8; a.values];
    let mut a_scales = vec![0u8; a.scales];
    let (rows, _) = p.group_rows(&[0, 24, 48, 72, 96]).unwrap();
    for (g, r) in groups.iter().zip(&rows) {
        let first = r.first as usize * k / 2;
        a_values[first..first + g.a.values().len()].copy_from_slice(g.a.values());
        let s = r.scale_first as usize * k / 16;
        a_scales[s..s + g.a.scales().len()].copy_from_slice(g.a.scales());
    }
    let sets: Vec<(CudaSlice<u8>, CudaSlice<u8>)> =
        (0..16).map(|_| (stream.clone_htod(&a_values).unwrap(), stream.clone_htod(&a_scales).unwrap())).collect();
    let mut cs: Vec<CudaSlice<f16>> =
        (0..16).map(|_| stream.clone_htod(&vec![f16::from_bits(POISON); p.c_elements()]).unwrap()).collect();
    let mut plan = MoePlan::new(&gpu, p.clone()).unwrap();
    let run = |plan: &mut MoePlan, i: usize, c: &mut CudaSlice<f16>| {
        let (v, s) = &sets[i];
        let mut args = MoeArgs {
            sizes: &offsets,
            a: Nvfp4Operand { values: v, scales: s }.into(),
            weights: &ops,
            alphas: &alphas,
            c: Output::F16(c),
        };
        plan.run(&stream, &mut args).unwrap();
    };
    run(&mut plan, 0, &mut cs[0]);
    let want: Vec<u16> = stream.clone_dtoh(&cs[0]).unwrap().iter().map(|x| x.to_bits()).collect();
    assert!(want.iter().all(|&x| x != POISON), "the first call left C unwritten");
    let before = free_memory(&gpu);
    for round in 0..2 {
        for (i, c) in cs.iter_mut().enumerate() {
            stream.memcpy_htod(&vec![f16::from_bits(POISON); c.len()], c).unwrap();
            run(&mut plan, i, c);
            let got: Vec<u16> = stream.clone_dtoh(c).unwrap().iter().map(|x| x.to_bits()).collect();
            assert_eq!(got, want, "round {round}, buffers {i}");
        }
    }
    assert_eq!(before, free_memory(&gpu), "calls with new buffers allocated device memory");
    println!("CASE gpu_engine_moe_new_buffers: 32 calls on 16 buffer sets, bit for bit the first");
}
