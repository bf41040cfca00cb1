//! Overlapping buffers are refused before any launch, and nothing is written: a call whose output
//! shares bytes with an input or another output (`GemmPlan::run`, `GemmPlan::run_stacked`,
//! `MoePlan::run`, the quantizer's three calls) is an `Error::Overlap` naming both buffers, and
//! every byte of device memory the call could reach reads back bit for bit as before. Valid
//! calls on the same memory (with inputs sharing bytes) run, so the refusals are the rule's.
//!
//! Every buffer lies in one device allocation (the arena), addressed through plain views (an
//! address and a length, as a caller holding raw pointers passes them), filled with a known
//! pattern and the operands' bytes, and read back whole after each call.

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop};
use half::f16;
use nvfp4_format::{GroupShape, InputDistribution, Tolerance};
use nvfp4_gemm::moe::{MoeArgs, MoePlan, MoeProblem, TokenLayout};
use nvfp4_gemm::quantize::{Nvfp4OperandMut, Nvfp4Sizes, Quantizer};
use nvfp4_gemm::{
    Arch, BufferName, Error, GemmPlan, GroupArgs, Nvfp4Operand, Output, OutputType, Problem, StackedArgs,
};
use nvfp4_gemm_tests::{gpu_or_skip, make_groups};
use std::marker::PhantomData;
use std::sync::Arc;

/// A view of `len` elements at a device address: what a caller with raw pointers passes.
struct Raw<T> {
    ptr: u64,
    len: usize,
    stream: Arc<CudaStream>,
    element: PhantomData<T>,
}

impl<T> DeviceSlice<T> for Raw<T> {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl<T> DevicePtr<T> for Raw<T> {
    fn device_ptr<'a>(&'a self, _stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Sync(None))
    }
}

impl<T> DevicePtrMut<T> for Raw<T> {
    fn device_ptr_mut<'a>(&'a mut self, _stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Sync(None))
    }
}

/// One device allocation holding every buffer of a test, and its expected contents.
struct Arena {
    stream: Arc<CudaStream>,
    buf: CudaSlice<u8>,
    base: u64,
    host: Vec<u8>,
    next: usize,
}

impl Arena {
    /// `bytes` of device memory, filled with a pattern (no byte a kernel would write by chance).
    fn new(stream: &Arc<CudaStream>, bytes: usize) -> Arena {
        let host: Vec<u8> = (0..bytes).map(|i| (i * 131 % 251) as u8 ^ 0x5A).collect();
        let buf = stream.clone_htod(&host).unwrap();
        let base = buf.device_ptr(stream).0;
        Arena { stream: stream.clone(), buf, base, host, next: 0 }
    }

    /// Byte offset of a new region of `bytes`, 256-byte aligned with a 256-byte gap before it.
    fn reserve(&mut self, bytes: usize) -> usize {
        let at = (self.next + 256).next_multiple_of(256);
        self.next = at + bytes;
        assert!(self.next <= self.host.len(), "arena too small");
        at
    }

    /// A new region holding `bytes` (written to the device).
    fn put(&mut self, bytes: &[u8]) -> usize {
        let at = self.reserve(bytes.len());
        self.host[at..at + bytes.len()].copy_from_slice(bytes);
        self.upload();
        at
    }

    fn upload(&mut self) {
        self.stream.memcpy_htod(&self.host, &mut self.buf).unwrap();
    }

    /// A view of `len` elements of `T` at byte offset `at`.
    fn view<T>(&self, at: usize, len: usize) -> Raw<T> {
        Raw { ptr: self.base + at as u64, len, stream: self.stream.clone(), element: PhantomData }
    }

    /// The device bytes now.
    fn read(&self) -> Vec<u8> {
        self.stream.synchronize().unwrap();
        self.stream.clone_dtoh(&self.buf).unwrap()
    }

    /// Every byte as it was uploaded.
    fn assert_untouched(&self, what: &str) {
        let now = self.read();
        let changed = now.iter().zip(&self.host).filter(|(a, b)| a != b).count();
        assert_eq!(changed, 0, "{what}: {changed} bytes written by a refused call");
    }
}

fn overlap(r: nvfp4_gemm::Result<()>) -> (&'static str, BufferName, BufferName) {
    match r {
        Err(Error::Overlap { call, output, other }) => (call, output, other),
        other => panic!("expected Error::Overlap, got {other:?}"),
    }
}

fn name(group: Option<usize>, field: &'static str) -> BufferName {
    BufferName { group, field }
}

/// Where one group's buffers lie in the arena (byte offsets).
#[derive(Clone, Copy)]
struct Placed {
    a: (usize, usize),
    b: (usize, usize),
    c: usize,
}

/// `GemmPlan::run` with group 0's C laid over its own B values (the case: 16 KiB each),
/// over group 1's C, and over group 1's A scales: each refused, nothing written. Then the valid
/// layout runs, matches the reference and writes nothing but C.
#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_run_refuses_overlapping_outputs() {
    let test = "gpu_run_refuses_overlapping_outputs";
    let Some(gpu) = gpu_or_skip(test, Arch::Sm90a) else { return };
    let stream = gpu.context().default_stream();
    let shapes = vec![GroupShape::new(32, 256, 128), GroupShape::new(24, 136, 192)];
    assert_eq!((shapes[0].m * shapes[0].n * 2, shapes[0].n * shapes[0].k / 2), (16384, 16384));
    let groups = make_groups(&shapes, InputDistribution::Competition, 31);
    let mut arena = Arena::new(&stream, 1 << 20);
    let placed: Vec<Placed> = groups
        .iter()
        .zip(&shapes)
        .map(|(g, s)| Placed {
            a: (arena.put(g.a.values()), arena.put(g.a.scales())),
            b: (arena.put(g.b.values()), arena.put(g.b.scales())),
            c: arena.reserve(2 * s.m * s.n),
        })
        .collect();
    let mut plan = GemmPlan::new(&gpu, Problem::new(shapes.clone(), OutputType::F16).unwrap()).unwrap();
    // Group g's C at byte offset `cs[g]`.
    let call = |plan: &mut GemmPlan, cs: [usize; 2]| {
        let views: Vec<_> = placed
            .iter()
            .zip(&shapes)
            .map(|(p, s)| {
                let a = (arena.view::<u8>(p.a.0, s.m * s.k / 2), arena.view::<u8>(p.a.1, groups_scales(s.m, s.k)));
                let b = (arena.view::<u8>(p.b.0, s.n * s.k / 2), arena.view::<u8>(p.b.1, groups_scales(s.n, s.k)));
                (a, b)
            })
            .collect();
        let mut c: Vec<Raw<f16>> = cs.iter().zip(&shapes).map(|(&at, s)| arena.view(at, s.m * s.n)).collect();
        let mut args: Vec<GroupArgs> = views
            .iter()
            .zip(c.iter_mut())
            .zip(&groups)
            .map(|(((a, b), c), g)| GroupArgs {
                a: Nvfp4Operand { values: &a.0, scales: &a.1 }.into(),
                b: Nvfp4Operand { values: &b.0, scales: &b.1 },
                c: Output::F16(c),
                alpha: g.effective_alpha_f32(),
            })
            .collect();
        plan.run(&stream, &mut args)
    };
    let cases = [
        ("C over its own B values", [placed[0].b.0, placed[1].c], name(Some(0), "c"), name(Some(0), "b.values")),
        ("C over another group's C", [placed[0].c, placed[0].c + 4096], name(Some(1), "c"), name(Some(0), "c")),
        (
            "C into another group's A scales",
            [placed[1].a.1 - 256, placed[1].c],
            name(Some(0), "c"),
            name(Some(1), "a.scales"),
        ),
    ];
    for (what, cs, output, other) in cases {
        assert_eq!(overlap(call(&mut plan, cs)), ("run", output, other), "{what}");
        arena.assert_untouched(what);
    }
    // The valid call: C written, the reference matched, nothing else touched.
    call(&mut plan, [placed[0].c, placed[1].c]).unwrap();
    let now = arena.read();
    let got: Vec<Vec<f16>> = placed
        .iter()
        .zip(&shapes)
        .map(|(p, s)| {
            let bytes = &now[p.c..p.c + 2 * s.m * s.n];
            bytes.chunks(2).map(|b| f16::from_le_bytes([b[0], b[1]])).collect()
        })
        .collect();
    let cmp =
        nvfp4_format::compare(&got, &nvfp4_format::reference_grouped_gemm(&groups).unwrap(), Tolerance::COMPETITION)
            .unwrap();
    println!("CASE {test} {cmp}");
    assert!(cmp.passed(), "{cmp}");
    let outside_c = |i: usize| !placed.iter().zip(&shapes).any(|(p, s)| (p.c..p.c + 2 * s.m * s.n).contains(&i));
    assert!((0..now.len()).filter(|&i| outside_c(i)).all(|i| now[i] == arena.host[i]), "written outside C");
}

/// Bytes of a blocked scale tensor of `rows x k`.
fn groups_scales(rows: usize, k: usize) -> usize {
    Nvfp4Sizes::of(rows, k).unwrap().scales
}

/// `GemmPlan::run_stacked`: C overlapping A's stacked values (inside them, or by their last 16
/// bytes) is refused naming the groups' parts, nothing written; C right after them, with every
/// operand in one stretch of memory, runs and writes only C.
#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_run_stacked_refuses_overlapping_outputs() {
    let test = "gpu_run_stacked_refuses_overlapping_outputs";
    let Some(gpu) = gpu_or_skip(test, Arch::Sm90a) else { return };
    let stream = gpu.context().default_stream();
    let shapes = vec![GroupShape::new(24, 136, 192), GroupShape::new(0, 256, 128), GroupShape::new(40, 512, 256)];
    let groups = make_groups(&shapes, InputDistribution::Competition, 32);
    let problem = Problem::new(shapes.clone(), OutputType::F16).unwrap();
    let at = problem.stacked_offsets();
    let total = at[shapes.len()];
    let mut arena = Arena::new(&stream, 1 << 20);
    let cat = |part: fn(&nvfp4_format::Group) -> &[u8]| -> Vec<u8> { groups.iter().flat_map(part).copied().collect() };
    // The operands back to back, A's values last: B scales, B values, A scales, A values.
    let operands = [cat(|g| g.b.scales()), cat(|g| g.b.values()), cat(|g| g.a.scales()), cat(|g| g.a.values())];
    let start = arena.reserve(operands.iter().map(Vec::len).sum::<usize>() + 2 * total.c_elements);
    let mut offsets = vec![];
    let mut next = start;
    for bytes in &operands {
        assert_eq!(bytes.len() % 16, 0);
        arena.host[next..next + bytes.len()].copy_from_slice(bytes);
        offsets.push(next);
        next += bytes.len();
    }
    arena.upload();
    let (a_values_at, a_values_end) = (offsets[3], next);
    let alphas: Vec<f32> = groups.iter().map(|g| g.effective_alpha_f32()).collect();
    let mut plan = GemmPlan::new(&gpu, problem.clone()).unwrap();
    let call = |plan: &mut GemmPlan, c_at: usize| {
        let lens = [total.b_scales, total.b_values, total.a_scales, total.a_values];
        let v: Vec<Raw<u8>> = offsets.iter().zip(lens).map(|(&o, len)| arena.view(o, len)).collect();
        let mut c: Raw<f16> = arena.view(c_at, total.c_elements);
        let mut args = StackedArgs {
            a: Nvfp4Operand { values: &v[3], scales: &v[2] }.into(),
            b: Nvfp4Operand { values: &v[1], scales: &v[0] },
            c: Output::F16(&mut c),
            alphas: &alphas,
        };
        plan.run_stacked(&stream, &mut args)
    };
    // C from 64 bytes into group 2's part of A's values, and over its last 16 bytes: group 0's
    // part of C overlaps group 2's part of A's values.
    for (what, c_at) in [("inside", a_values_at + at[2].a_values + 64), ("over the end", a_values_end - 16)] {
        assert_eq!(
            overlap(call(&mut plan, c_at)),
            ("run_stacked", name(Some(0), "c"), name(Some(2), "a.values")),
            "{what}"
        );
        arena.assert_untouched(what);
    }
    // Touching: runs, writes C, nothing else.
    call(&mut plan, a_values_end).unwrap();
    let now = arena.read();
    let c_end = a_values_end + 2 * total.c_elements;
    assert!(now[a_values_end..c_end] != arena.host[a_values_end..c_end], "C not written");
    assert!(now[..a_values_end] == arena.host[..a_values_end] && now[c_end..] == arena.host[c_end..]);
}

/// `MoePlan::run`: C over a weight's scales, over A's values, over the sizes: refused, nothing
/// written; every expert sharing one weight tensor is allowed and runs.
#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_moe_run_refuses_overlapping_outputs() {
    let test = "gpu_moe_run_refuses_overlapping_outputs";
    let Some(gpu) = gpu_or_skip(test, Arch::Sm90a) else { return };
    let stream = gpu.context().default_stream();
    let p = MoeProblem::new(2, 128, 256, TokenLayout::Contiguous { max_tokens: 64 }, OutputType::F16).unwrap();
    let mut arena = Arena::new(&stream, 1 << 20);
    let sizes_at = arena.put(&u32_bytes(&[0, 24, 64]));
    let (a, b) = (p.a_sizes(), p.b_sizes());
    // Finite scales (0x38: 1.0 in e4m3) and values: a valid call computes finite numbers.
    let a_at = (arena.put(&vec![0x11; a.values]), arena.put(&vec![0x38; a.scales]));
    let w_at: Vec<(usize, usize)> =
        (0..2).map(|_| (arena.put(&vec![0x22; b.values]), arena.put(&vec![0x38; b.scales]))).collect();
    let c_at = arena.reserve(2 * p.c_elements());
    let mut plan = MoePlan::new(&gpu, p.clone()).unwrap();
    let alphas = [1.0f32, 0.5];
    let call = |plan: &mut MoePlan, c: usize, weights: &[(usize, usize)]| {
        let sizes: Raw<u32> = arena.view(sizes_at, p.sizes_len());
        let (av, asc) = (arena.view::<u8>(a_at.0, a.values), arena.view::<u8>(a_at.1, a.scales));
        let w: Vec<(Raw<u8>, Raw<u8>)> =
            weights.iter().map(|&(v, s)| (arena.view(v, b.values), arena.view(s, b.scales))).collect();
        let ops: Vec<Nvfp4Operand> = w.iter().map(|(v, s)| Nvfp4Operand { values: v, scales: s }).collect();
        let mut c: Raw<f16> = arena.view(c, p.c_elements());
        let mut args = MoeArgs {
            sizes: &sizes,
            a: Nvfp4Operand { values: &av, scales: &asc }.into(),
            weights: &ops,
            alphas: &alphas,
            c: Output::F16(&mut c),
        };
        plan.run(&stream, &mut args)
    };
    let cases = [
        ("C over a weight's scales", w_at[1].1 - 256, name(Some(1), "b.scales")),
        ("C over A's values", a_at.0 + 512, name(None, "a.values")),
        ("C over the sizes", sizes_at, name(None, "sizes")),
    ];
    for (what, c, other) in cases {
        assert_eq!(overlap(call(&mut plan, c, &w_at)), ("moe run", name(None, "c"), other), "{what}");
        arena.assert_untouched(what);
    }
    call(&mut plan, c_at, &[w_at[0], w_at[0]]).unwrap();
    let now = arena.read();
    let c_end = c_at + 2 * p.c_elements();
    assert!(now[c_at..c_end] != arena.host[c_at..c_end], "C not written");
    assert!(now[..c_at] == arena.host[..c_at] && now[c_end..] == arena.host[c_end..], "written outside C");
    assert!(plan.read_status(&stream).unwrap().is_ok());
}

fn u32_bytes(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The quantizer's three calls: an output over the input, over the other output, over the
/// sizes: refused, nothing written; the dequantizer's two inputs may share memory.
#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_quantizer_refuses_overlapping_outputs() {
    let test = "gpu_quantizer_refuses_overlapping_outputs";
    let Some(gpu) = gpu_or_skip(test, Arch::Sm90a) else { return };
    let stream = gpu.context().default_stream();
    let q = Quantizer::new(&gpu).unwrap();
    let (rows, k) = (130, 128);
    let s = Nvfp4Sizes::of(rows, k).unwrap();
    let p = MoeProblem::new(2, 128, k, TokenLayout::Masked { max_rows: 65 }, OutputType::F16).unwrap();
    assert_eq!(p.token_rows(), rows);
    let mut arena = Arena::new(&stream, 1 << 20);
    let input_at = arena.put(&vec![0x3C; 2 * rows * k]); // f16 0x3C3C, about 1.06
    let values_at = arena.reserve(s.values);
    let scales_at = arena.reserve(s.scales);
    let sizes_at = arena.put(&u32_bytes(&[3, 65]));
    let out_at = arena.reserve(2 * rows * k);
    let grouped_scales_at = arena.reserve(p.a_sizes().scales);
    let quantize = |input: usize, values: usize, scales: usize| {
        let x: Raw<f16> = arena.view(input, rows * k);
        let (mut v, mut sc) = (arena.view::<u8>(values, s.values), arena.view::<u8>(scales, s.scales));
        q.quantize(&stream, &x, rows, k, 0.01, Nvfp4OperandMut { values: &mut v, scales: &mut sc })
    };
    assert_eq!(
        overlap(quantize(input_at, input_at + 1024, scales_at)),
        ("quantize", name(None, "values"), name(None, "input"))
    );
    arena.assert_untouched("quantize: values over the input");
    assert_eq!(
        overlap(quantize(input_at, values_at, values_at + 256)),
        ("quantize", name(None, "scales"), name(None, "values"))
    );
    arena.assert_untouched("quantize: scales over the values");
    let dequantize = |values: usize, scales: usize, output: usize| {
        let (v, sc) = (arena.view::<u8>(values, s.values), arena.view::<u8>(scales, s.scales));
        let mut out: Raw<f16> = arena.view(output, rows * k);
        q.dequantize(&stream, Nvfp4Operand { values: &v, scales: &sc }, rows, k, 0.01, &mut out)
    };
    assert_eq!(
        overlap(dequantize(values_at, scales_at, scales_at - 256)),
        ("dequantize", name(None, "output"), name(None, "scales"))
    );
    arena.assert_untouched("dequantize: output over the scales");
    let grouped = |sizes: usize, scales: usize| {
        let x: Raw<f16> = arena.view(input_at, rows * k);
        let sz: Raw<u32> = arena.view(sizes, 2);
        let (mut v, mut sc) = (arena.view::<u8>(values_at, s.values), arena.view::<u8>(scales, p.a_sizes().scales));
        q.quantize_grouped(&stream, &x, &p, &sz, 0.01, Nvfp4OperandMut { values: &mut v, scales: &mut sc })
    };
    assert_eq!(
        overlap(grouped(sizes_at, sizes_at - 16)),
        ("quantize_grouped", name(None, "scales"), name(None, "sizes"))
    );
    arena.assert_untouched("quantize_grouped: scales over the sizes");
    // Valid calls on the same memory run: the dequantizer's inputs overlapping each other too.
    quantize(input_at, values_at, scales_at).unwrap();
    dequantize(values_at, values_at, out_at).unwrap();
    grouped(sizes_at, grouped_scales_at).unwrap();
    stream.synchronize().unwrap();
}
