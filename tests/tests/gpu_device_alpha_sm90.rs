//! Alphas read on the device (`GemmPlan::run_with_device_alphas`,
//! `run_stacked_with_device_alphas`): bit for bit the outputs of the same values passed from the
//! host, through every change of source on one plan; and inside a captured CUDA graph, new values
//! written into the device buffer between replays are what the replays use (no upload from the
//! host is involved).

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DeviceSlice, SyncOnDrop};
use half::f16;
use nvfp4_format::{random_groups, Group, GroupShape, InputDistribution};
use nvfp4_gemm::{
    Arch, DeviceGroup, Error, GemmPlan, GroupArgs, Nvfp4Operand, Output, OutputType, Problem, StackedArgs,
};
use nvfp4_gemm_tests::gpu_or_skip;
use std::sync::Arc;

/// `len` `f32`s at a device address (what a caller holding raw pointers passes), e.g. inside
/// another buffer.
struct At {
    ptr: u64,
    len: usize,
    stream: Arc<CudaStream>,
}

impl DeviceSlice<f32> for At {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl DevicePtr<f32> for At {
    fn device_ptr<'a>(&'a self, _stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Record(None))
    }
}

/// A NaN with a payload no kernel writes: any element still holding it was not written.
const POISON: u16 = 0x7E01;

/// Shapes with a group of no tokens, and groups of every sm_90a tile height.
fn shapes() -> Vec<GroupShape> {
    vec![
        GroupShape::new(24, 256, 256),
        GroupShape::new(0, 128, 128),
        GroupShape::new(130, 136, 192),
        GroupShape::new(9, 512, 512),
    ]
}

/// Each group's alpha times its own factor (signs and magnitudes differ, so a copy into the wrong
/// group's entry changes the output).
fn alphas(groups: &[Group], factors: &[f32]) -> Vec<f32> {
    groups.iter().zip(factors).map(|(g, f)| g.effective_alpha_f32() * f).collect()
}

fn bits(stream: &Arc<CudaStream>, c: &CudaSlice<f16>) -> Vec<u16> {
    stream.clone_dtoh(c).unwrap().iter().map(|x| x.to_bits()).collect()
}

fn poisoned(stream: &Arc<CudaStream>, len: usize) -> CudaSlice<f16> {
    stream.clone_htod(&vec![f16::from_bits(POISON); len.max(16)]).unwrap()
}

/// One call with per-group buffers: host `alphas`, or (`device`) the same values from a device
/// buffer. Returns every group's C, bit for bit.
fn run_groups(
    plan: &mut GemmPlan,
    stream: &Arc<CudaStream>,
    dev: &[DeviceGroup],
    alphas: &[f32],
    device: Option<&CudaSlice<f32>>,
) -> Vec<Vec<u16>> {
    let shapes = plan.problem().groups().to_vec();
    let mut cs: Vec<CudaSlice<f16>> = shapes.iter().map(|s| poisoned(stream, s.m * s.n)).collect();
    {
        let mut args: Vec<GroupArgs> = dev
            .iter()
            .zip(cs.iter_mut())
            .zip(alphas)
            .map(|((d, c), &alpha)| GroupArgs { alpha, ..d.args(Output::F16(c)) })
            .collect();
        match device {
            Some(buffer) => {
                // The host alphas in the arguments are not read: make them wrong.
                for a in args.iter_mut() {
                    a.alpha = f32::NAN;
                }
                plan.run_with_device_alphas(stream, &mut args, buffer).unwrap()
            }
            None => plan.run(stream, &mut args).unwrap(),
        }
    }
    cs.iter().map(|c| bits(stream, c)).collect()
}

#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_device_alphas_equal_host_alphas() {
    let test = "gpu_device_alphas_equal_host_alphas";
    let Some(gpu) = gpu_or_skip(test, Arch::Sm90a) else { return };
    let stream = gpu.context().default_stream();
    let shapes = shapes();
    let problem = Problem::new(shapes.clone(), OutputType::F16).unwrap();
    let groups = random_groups(&shapes, InputDistribution::Competition, 5).unwrap();
    let dev: Vec<DeviceGroup> = groups.iter().map(|g| DeviceGroup::upload(&stream, g).unwrap()).collect();
    let sets = [alphas(&groups, &[1.0, 3.0, -0.5, 2.0]), alphas(&groups, &[-2.0, 1.0, 0.25, -1.0]), vec![1.0; 4]];
    let mut plan = GemmPlan::new(&gpu, problem.clone()).unwrap();
    let mut device = stream.alloc_zeros::<f32>(shapes.len()).unwrap();
    // Host, device, device with new values, host with the values the tables were uploaded with
    // before the device copy (1.0), device, host: each must equal a fresh plan with host alphas.
    let calls = [(0, false), (0, true), (1, true), (2, false), (2, true), (1, false), (0, true)];
    for (i, &(set, from_device)) in calls.iter().enumerate() {
        let values = &sets[set];
        let want = run_groups(&mut GemmPlan::new(&gpu, problem.clone()).unwrap(), &stream, &dev, values, None);
        assert!(want[2].iter().all(|&b| b != POISON), "call {i}: the reference wrote every element");
        stream.memcpy_htod(values, &mut device).unwrap();
        let got = run_groups(&mut plan, &stream, &dev, values, from_device.then_some(&device));
        assert_eq!(got, want, "call {i}: set {set}, device alphas {from_device}");
        println!("CASE {test} call {i}: set {set}, device {from_device}: bit for bit");
    }

    // Stacked: the same outputs from the device alphas as from the host ones.
    let cat = |part: fn(&Group) -> &[u8]| -> CudaSlice<u8> {
        let bytes: Vec<u8> = groups.iter().flat_map(part).copied().collect();
        stream.clone_htod(&bytes).unwrap()
    };
    let (a_values, a_scales) = (cat(|g| g.a.values()), cat(|g| g.a.scales()));
    let (b_values, b_scales) = (cat(|g| g.b.values()), cat(|g| g.b.scales()));
    let total = problem.stacked_offsets()[shapes.len()].c_elements;
    let stacked = |plan: &mut GemmPlan, alphas: &[f32], device: Option<&CudaSlice<f32>>| -> Vec<u16> {
        let mut c = poisoned(&stream, total);
        {
            let mut args = StackedArgs {
                a: Nvfp4Operand { values: &a_values, scales: &a_scales }.into(),
                b: Nvfp4Operand { values: &b_values, scales: &b_scales },
                c: Output::F16(&mut c),
                alphas,
            };
            match device {
                Some(d) => plan.run_stacked_with_device_alphas(&stream, &mut args, d).unwrap(),
                None => plan.run_stacked(&stream, &mut args).unwrap(),
            }
        }
        bits(&stream, &c)
    };
    for set in &sets {
        let want = stacked(&mut GemmPlan::new(&gpu, problem.clone()).unwrap(), set, None);
        stream.memcpy_htod(set, &mut device).unwrap();
        assert_eq!(stacked(&mut plan, &[], Some(&device)), want, "stacked, device alphas {set:?}");
    }
    println!("CASE {test} stacked: bit for bit");

    // Wrong buffers are refused before any launch: one value too few; values inside group 0's C.
    let mut cs: Vec<CudaSlice<f16>> = shapes.iter().map(|s| poisoned(&stream, s.m * s.n)).collect();
    let c0 = cs[0].device_ptr(&stream).0;
    let mut args: Vec<GroupArgs> = dev.iter().zip(cs.iter_mut()).map(|(d, c)| d.args(Output::F16(c))).collect();
    let short = device.slice(0..shapes.len() - 1);
    let err = plan.run_with_device_alphas(&stream, &mut args, &short).unwrap_err().to_string();
    assert!(err.contains("`alphas`") && err.contains("has 3 f32 values"), "{err}");
    // 16 bytes inside group 0's C, alive for the call (which launches nothing).
    let inside_c = At { ptr: c0 + 64, len: shapes.len(), stream: stream.clone() };
    let err = plan.run_with_device_alphas(&stream, &mut args, &inside_c).unwrap_err();
    assert!(matches!(err, Error::Overlap { .. }), "{err}");
    drop(args);
    assert!(cs.iter().all(|c| bits(&stream, c).iter().all(|&b| b == POISON)), "a refused call wrote C");
}

/// One call captured into a CUDA graph after a first call outside capture: between replays only
/// the device alphas change (written on the stream), and each replay's output is bit for bit a
/// fresh plan's with those values from the host. A NaN alpha (not checked on the device) gives
/// NaN in every element of its group.
#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_device_alphas_change_between_graph_replays() {
    let test = "gpu_device_alphas_change_between_graph_replays";
    let Some(gpu) = gpu_or_skip(test, Arch::Sm90a) else { return };
    // Capture needs a stream of its own; one stream and no cross-stream events here.
    unsafe { gpu.context().disable_event_tracking() };
    let stream = gpu.context().new_stream().unwrap();
    let shapes = shapes();
    let problem = Problem::new(shapes.clone(), OutputType::F16).unwrap();
    let groups = random_groups(&shapes, InputDistribution::Competition, 9).unwrap();
    let dev: Vec<DeviceGroup> = groups.iter().map(|g| DeviceGroup::upload(&stream, g).unwrap()).collect();
    // A plan's tables are allocated and zeroed on the null stream, which this non-blocking stream
    // does not wait for (and events are not tracked): wait for them.
    let new_plan = || {
        let plan = GemmPlan::new(&gpu, problem.clone()).unwrap();
        gpu.context().synchronize().unwrap();
        plan
    };
    let mut plan = new_plan();
    let mut device = stream.clone_htod(&alphas(&groups, &[1.0; 4])).unwrap();
    let mut cs: Vec<CudaSlice<f16>> = shapes.iter().map(|s| poisoned(&stream, s.m * s.n)).collect();
    let call = |plan: &mut GemmPlan, cs: &mut [CudaSlice<f16>], device: &CudaSlice<f32>| {
        let mut args: Vec<GroupArgs> = dev.iter().zip(cs.iter_mut()).map(|(d, c)| d.args(Output::F16(c))).collect();
        plan.run_with_device_alphas(&stream, &mut args, device).unwrap();
    };
    call(&mut plan, &mut cs, &device); // outside capture: uploads the tables
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    call(&mut plan, &mut cs, &device);
    let graph = stream.end_capture(CUgraphInstantiate_flags(0)).unwrap().expect("a graph");
    let sets = [
        alphas(&groups, &[1.0, 1.0, 1.0, 1.0]),
        alphas(&groups, &[-4.0, 2.0, 0.5, 0.125]),
        alphas(&groups, &[0.0, -1.0, 3.0, -0.75]),
    ];
    let mut previous: Option<Vec<Vec<u16>>> = None;
    for (i, set) in sets.iter().enumerate() {
        for c in cs.iter_mut() {
            stream.memcpy_htod(&vec![f16::from_bits(POISON); c.len()], c).unwrap();
        }
        stream.memcpy_htod(set, &mut device).unwrap();
        graph.launch().unwrap();
        let got: Vec<Vec<u16>> = cs.iter().map(|c| bits(&stream, c)).collect();
        let want = run_groups(&mut new_plan(), &stream, &dev, set, None);
        assert_eq!(got, want, "replay {i}");
        assert_ne!(Some(&got), previous.as_ref(), "replay {i}: new alphas, same outputs");
        previous = Some(got);
        println!("CASE {test} replay {i}: bit for bit the host alphas' outputs");
    }
    let mut with_nan = sets[1].clone();
    with_nan[3] = f32::NAN;
    stream.memcpy_htod(&with_nan, &mut device).unwrap();
    graph.launch().unwrap();
    let got: Vec<Vec<u16>> = cs.iter().map(|c| bits(&stream, c)).collect();
    assert!(got[3].iter().all(|&b| f16::from_bits(b).is_nan() && b != POISON), "a NaN alpha gives NaN outputs");
    let want = run_groups(&mut new_plan(), &stream, &dev, &sets[1], None);
    assert_eq!(got[..3], want[..3], "the other groups keep their alphas");
}
