//! The hardware probes (`diag/kernel/src/probe.rs`, sm_90a; [`sm100`] for
//! `diag/kernel/src/probe_sm100.rs`):
//! their cases, inputs and outputs, run on any [`ProbeTarget`] — the GPU ([`GpuTarget`]) or the
//! CPU model of the device (`model-tests`' `ModelTarget`) — so that the same probe, with the same
//! inputs, runs on both and the outputs can be compared bit for bit
//! (`tests/tests/gpu_probe_sm90.rs`, `gpu_probe_sm100.rs`), and the model's outputs can be
//! compared with expectations written from the ISA text (`model-tests/tests/model_probe.rs`,
//! `model_probe_sm100.rs`).
//!
//! Every probe returns the raw bytes its kernel wrote, status word included
//! ([`PROBE_OK`] when every wait completed).

use crate::DiagKernels;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use half::f16;
use nvfp4_gemm::driver::launch::{launch, set_max_dynamic_smem};
use nvfp4_gemm::driver::tensor_map;
use nvfp4_gemm::{Arch, Gpu};
use nvfp4_gemm_abi::launch::LaunchGeometry;
use nvfp4_gemm_abi::sm90::{token_map_with_box, weight_map, CHUNK_K, K_STEPS_PER_CHUNK};
use nvfp4_gemm_abi::tensor_map::{TensorMap, TensorMapDataType, TensorMapSwizzle, TiledMap, L2_PROMOTION};
pub use nvfp4_gemm_diag_abi::probe::*;
use std::sync::Arc;

pub mod sm100;

/// The probe kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeKernel {
    /// `tma_probe`.
    Tma,
    /// `sync_probe`.
    Sync,
    /// `wgmma_probe_n16`.
    WgmmaN16,
    /// `wgmma_probe_n128`.
    WgmmaN128,
    /// `tmem_probe` (sm_100a).
    Tmem,
    /// `umma_probe` (sm_100a).
    Umma,
    /// `tma4_multicast_probe` (sm_100a).
    Tma4Multicast,
}

impl ProbeKernel {
    /// The exported name.
    pub const fn name(self) -> &'static str {
        match self {
            ProbeKernel::Tma => "tma_probe",
            ProbeKernel::Sync => "sync_probe",
            ProbeKernel::WgmmaN16 => "wgmma_probe_n16",
            ProbeKernel::WgmmaN128 => "wgmma_probe_n128",
            ProbeKernel::Tmem => "tmem_probe",
            ProbeKernel::Umma => "umma_probe",
            ProbeKernel::Tma4Multicast => "tma4_multicast_probe",
        }
    }

    /// The architecture it is compiled for.
    pub const fn arch(self) -> Arch {
        match self {
            ProbeKernel::Tma | ProbeKernel::Sync | ProbeKernel::WgmmaN16 | ProbeKernel::WgmmaN128 => Arch::Sm90a,
            ProbeKernel::Tmem | ProbeKernel::Umma | ProbeKernel::Tma4Multicast => Arch::Sm100a,
        }
    }
}

/// Which of the device model's rules a probe case is held to (the GPU ignores it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelRules {
    /// The model's strict mode (its default): values no hardware-proven kernel uses are errors.
    Strict,
    /// The PTX ISA's rules only: for the cases that try, on hardware, exactly the values strict
    /// mode rejects.
    Isa,
}

/// Where a probe runs: buffers, tensor maps, launches. Errors are messages (a driver error, or
/// the model's report).
pub trait ProbeTarget {
    /// A buffer of "device" memory.
    type Buf;
    /// A copy of `bytes` (at least 16 bytes are allocated), 128-byte aligned.
    fn upload(&self, bytes: &[u8]) -> Result<Self::Buf, String>;
    /// The buffer's device address.
    fn addr(&self, buf: &Self::Buf) -> u64;
    /// The buffer's contents (as many bytes as were uploaded).
    fn download(&self, buf: &Self::Buf) -> Result<Vec<u8>, String>;
    /// The tensor map of `map` over the tensor at `base`.
    fn encode<const R: usize>(&self, map: &TiledMap<R>, base: u64) -> Result<TensorMap, String>;
    /// Launches `kernel` and waits for it; the model applies `rules`.
    fn launch(
        &self,
        kernel: ProbeKernel,
        geometry: LaunchGeometry,
        params: ProbeParams,
        rules: ModelRules,
    ) -> Result<(), String>;
}

/// The bytes of a test pattern that never contains 0 (so a zero-filled byte is never mistaken
/// for data).
pub fn pattern(len: usize, seed: usize) -> Vec<u8> {
    (0..len).map(|i| ((i.wrapping_mul(131) + i / 509 + seed * 17) % 251) as u8 + 1).collect()
}

/// Bytes of one element of a map's type (the probes use `U8` and `F16`).
pub fn element_bytes(t: TensorMapDataType) -> u32 {
    match t {
        TensorMapDataType::U8 => 1,
        TensorMapDataType::F16 => 2,
        TensorMapDataType::U4x16Align8B => panic!("the probes do not use packed 4-bit maps"),
    }
}

/// One case of `tma_probe`: a 2D map, the box's coordinates, and a bulk copy.
#[derive(Clone, Copy, Debug)]
pub struct TmaCase {
    /// Its name in reports.
    pub name: &'static str,
    /// The map (over [`TmaCase::global`]).
    pub map: TiledMap<2>,
    /// The box's innermost coordinate (elements) and row.
    pub coords: [i32; 2],
    /// Bytes of the bulk copy after the box (a multiple of 16, may be 0).
    pub bulk_bytes: u32,
    /// Announce the bytes after issuing the copies (the tx-count goes negative first).
    pub copies_first: bool,
}

impl TmaCase {
    /// Bytes of the box in shared memory.
    pub fn box_bytes(&self) -> u32 {
        self.map.box_dims[0] * element_bytes(self.map.element) * self.map.box_dims[1]
    }

    /// Bytes of the box's rows.
    pub fn row_bytes(&self) -> u32 {
        self.map.box_dims[0] * element_bytes(self.map.element)
    }

    /// The tensor in global memory: `dims[1]` rows of `strides_bytes[0]` bytes.
    pub fn global(&self) -> Vec<u8> {
        pattern((self.map.dims[1] * self.map.strides_bytes[0]) as usize, 1)
    }

    /// The bulk copy's source.
    pub fn bulk_source(&self) -> Vec<u8> {
        pattern(self.bulk_bytes as usize, 2)
    }
}

/// The cases of `tma_probe`: the sm_90a GEMM's token map (f16, 128-byte swizzle, boxes of
/// 64 × 16 and 64 × 128, rows past M) and weight map (u8, 64-byte swizzle, 64 × 128, rows past
/// N), each with a bulk copy like the weight scales'; boxes off every edge (inner dimension and
/// negative coordinates too) with every swizzle the kernels use and none.
pub fn tma_cases() -> Vec<TmaCase> {
    let map = |element, dims: [u64; 2], stride: u64, box_dims, swizzle| TiledMap {
        element,
        dims,
        strides_bytes: [stride, 0],
        box_dims,
        swizzle,
        l2_promotion: L2_PROMOTION,
    };
    vec![
        TmaCase {
            name: "token map f16 sw128 box 64x16, rows 40..48 past M = 40",
            map: token_map_with_box(40, 192, 16),
            coords: [128, 32],
            bulk_bytes: 512,
            copies_first: false,
        },
        TmaCase {
            name: "token map f16 sw128 box 64x128, rows 100..128 past M = 100, bytes announced after the copies",
            map: token_map_with_box(100, 128, 128),
            coords: [64, 0],
            bulk_bytes: 512,
            copies_first: true,
        },
        TmaCase {
            name: "weight map u8 sw64 box 64x128, rows 200..256 past N = 200",
            map: weight_map(200, 256),
            coords: [64, 128],
            bulk_bytes: 1024,
            copies_first: false,
        },
        TmaCase {
            name: "weight map u8 sw64 box 64x128, in bounds, no bulk copy",
            map: weight_map(256, 512),
            coords: [192, 0],
            bulk_bytes: 0,
            copies_first: true,
        },
        TmaCase {
            name: "f16 sw128 box 64x16 at (-8, 12) over 40 x 24: left, right and bottom out of bounds",
            map: map(TensorMapDataType::F16, [40, 24], 80, [64, 16], TensorMapSwizzle::B128),
            coords: [-8, 12],
            bulk_bytes: 0,
            copies_first: false,
        },
        TmaCase {
            name: "u8 no swizzle box 48x20 at (160, 40) over 200 x 50",
            map: map(TensorMapDataType::U8, [200, 50], 208, [48, 20], TensorMapSwizzle::None),
            coords: [160, 40],
            bulk_bytes: 32,
            copies_first: false,
        },
        TmaCase {
            name: "f16 sw64 box 32x24 at (64, 16) over 80 x 30",
            map: map(TensorMapDataType::F16, [80, 30], 160, [32, 24], TensorMapSwizzle::B64),
            coords: [64, 16],
            bulk_bytes: 16,
            copies_first: true,
        },
        TmaCase {
            name: "f16 no swizzle box 16x64 at (40, -10) over 50 x 70",
            map: map(TensorMapDataType::F16, [50, 70], 112, [16, 64], TensorMapSwizzle::None),
            coords: [40, -10],
            bulk_bytes: 0,
            copies_first: false,
        },
    ]
}

/// Runs one `tma_probe` case: the box bytes as they lay in shared memory, the bulk bytes, the
/// status word.
pub fn run_tma<T: ProbeTarget>(t: &T, case: &TmaCase) -> Result<Vec<u8>, String> {
    let box_bytes = case.box_bytes();
    assert!(box_bytes + case.bulk_bytes <= TMA_PROBE_MAX_BYTES, "{}: too large", case.name);
    let global = t.upload(&case.global())?;
    let bulk = t.upload(&case.bulk_source())?;
    let map = t.encode(&case.map, t.addr(&global))?;
    let maps = t.upload(&map.0)?;
    let out = t.upload(&vec![0xEE; (box_bytes + case.bulk_bytes + 4) as usize])?;
    let mut args = [0u32; 8];
    args[TMA_ARG_C0] = case.coords[0] as u32;
    args[TMA_ARG_C1] = case.coords[1] as u32;
    args[TMA_ARG_BOX_BYTES] = box_bytes;
    args[TMA_ARG_BULK_BYTES] = case.bulk_bytes;
    args[TMA_ARG_COPIES_FIRST] = case.copies_first as u32;
    let params = ProbeParams { map: t.addr(&maps), input: t.addr(&bulk), input2: 0, out: t.addr(&out), args };
    t.launch(ProbeKernel::Tma, tma_probe_launch(), params, ModelRules::Strict)?;
    t.download(&out)
}

/// The sources of `sync_probe`'s ring copies, `SYNC_RING_BYTES` per round.
pub fn sync_ring_source() -> Vec<u8> {
    pattern((SYNC_RING_ROUNDS * SYNC_RING_BYTES) as usize, 3)
}

/// Runs `sync_probe`: `SYNC_LOG_WORDS` words per CTA, little-endian.
pub fn run_sync<T: ProbeTarget>(t: &T) -> Result<Vec<u8>, String> {
    let ring = t.upload(&sync_ring_source())?;
    let mailbox = t.upload(&vec![0; 4 * SYNC_MAILBOX_WORDS as usize])?;
    let out = t.upload(&vec![0xEE; (4 * SYNC_LOG_WORDS * SYNC_PROBE_CTAS) as usize])?;
    let params =
        ProbeParams { map: 0, input: t.addr(&ring), input2: t.addr(&mailbox), out: t.addr(&out), args: [0; 8] };
    t.launch(ProbeKernel::Sync, sync_probe_launch(), params, ModelRules::Strict)?;
    t.download(&out)
}

/// One case of `wgmma_probe_n16` / `wgmma_probe_n128`.
#[derive(Clone, Copy, Debug)]
pub struct WgmmaCase {
    /// Its name in reports.
    pub name: &'static str,
    /// The wgmma N: 16 or 128.
    pub n: u32,
    /// 64-wide K chunks (1 or 2): `4 · chunks` chained k-steps.
    pub chunks: u32,
    /// Rows of B in global memory (≤ `n`; the box's rows past them are zero-filled).
    pub b_rows: u32,
    /// `scale-d` of the first MMA (false: the initial accumulators are ignored).
    pub scale_d_first: bool,
    /// A's values are small integers times `2^a_exponent` (−16: many are f16 subnormals).
    pub a_exponent: i32,
}

/// The cases of the wgmma probes: both widths the sm_90a kernel uses, one and two chunks (one
/// commit group per chunk, as the kernel does), B rows past the token count, `scale-d` 0, and
/// subnormal A values like the decoded weights' (down to 2⁻¹⁷ there).
pub fn wgmma_cases() -> Vec<WgmmaCase> {
    let c = |name, n, chunks, b_rows, scale_d_first, a_exponent| WgmmaCase {
        name,
        n,
        chunks,
        b_rows,
        scale_d_first,
        a_exponent,
    };
    vec![
        c("m64n128k16, 8 k-steps in 2 groups", 128, 2, 128, true, 0),
        c("m64n128k16, 4 k-steps, B rows 100..128 zero-filled", 128, 1, 100, true, 0),
        c("m64n16k16, 8 k-steps in 2 groups", 16, 2, 16, true, 0),
        c("m64n16k16, scale-d 0 first, subnormal A, B rows 9..16 zero-filled", 16, 2, 9, false, -16),
    ]
}

impl WgmmaCase {
    /// The kernel.
    pub fn kernel(&self) -> ProbeKernel {
        match self.n {
            16 => ProbeKernel::WgmmaN16,
            128 => ProbeKernel::WgmmaN128,
            n => panic!("no wgmma probe of width {n}"),
        }
    }

    /// k-steps (of 16).
    pub fn k_steps(&self) -> u32 {
        self.chunks * K_STEPS_PER_CHUNK
    }

    /// K of the product.
    pub fn k(&self) -> u32 {
        self.chunks * CHUNK_K
    }

    /// The A fragment registers: `[k-step][thread][4]` words, each two f16 (low half first),
    /// small integers times `2^a_exponent`.
    pub fn a_fragments(&self) -> Vec<u32> {
        let scale = 2f32.powi(self.a_exponent);
        let half = |s: u32, t: u32, r: u32, h: u32| {
            let v = ((s * 7 + t * 13 + t / 7 + r * 5 + h * 3) % 9) as i32 - 4;
            f16::from_f32(v as f32 * scale).to_bits() as u32
        };
        let mut w = vec![];
        for s in 0..self.k_steps() {
            for t in 0..WGMMA_PROBE_THREADS {
                for r in 0..4 {
                    w.push(half(s, t, r, 0) | half(s, t, r, 1) << 16);
                }
            }
        }
        w
    }

    /// B as it lies in global memory: `b_rows` rows of `k()` f16 bits (multiples of 1/4 in
    /// [−3/4, 3/4]).
    pub fn b_matrix(&self) -> Vec<u16> {
        let k = self.k();
        (0..self.b_rows * k)
            .map(|i| {
                let (n, kk) = (i / k, i % k);
                let v = ((n * 5 + kk * 3 + (n * kk) / 7) % 7) as i32 - 3;
                f16::from_f32(v as f32 * 0.25).to_bits()
            })
            .collect()
    }

    /// The map of B: the GEMM's token map with `n`-row boxes.
    pub fn map(&self) -> TiledMap<2> {
        token_map_with_box(self.b_rows, self.k(), self.n)
    }

    /// The accumulators before the first MMA: `n / 2` small integers per thread.
    pub fn initial_accumulators(&self) -> Vec<f32> {
        (0..WGMMA_PROBE_THREADS * self.n / 2).map(|i| ((i * 3 + i / 64) % 11) as f32 - 5.0).collect()
    }
}

/// Runs one wgmma probe case: `n / 2` f32 accumulators per thread (by thread), the status word.
pub fn run_wgmma<T: ProbeTarget>(t: &T, case: &WgmmaCase) -> Result<Vec<u8>, String> {
    let b: Vec<u8> = case.b_matrix().iter().flat_map(|x| x.to_le_bytes()).collect();
    let b = t.upload(&b)?;
    let a: Vec<u8> = case.a_fragments().iter().flat_map(|x| x.to_le_bytes()).collect();
    let a = t.upload(&a)?;
    let init: Vec<u8> = case.initial_accumulators().iter().flat_map(|x| x.to_le_bytes()).collect();
    let init = t.upload(&init)?;
    let map = t.encode(&case.map(), t.addr(&b))?;
    let maps = t.upload(&map.0)?;
    let out = t.upload(&vec![0xEE; (4 * (WGMMA_PROBE_THREADS * case.n / 2 + 1)) as usize])?;
    let mut args = [0u32; 8];
    args[WGMMA_ARG_CHUNKS] = case.chunks;
    args[WGMMA_ARG_SCALE_D_FIRST] = case.scale_d_first as u32;
    let params = ProbeParams { map: t.addr(&maps), input: t.addr(&a), input2: t.addr(&init), out: t.addr(&out), args };
    t.launch(case.kernel(), wgmma_probe_launch(case.n), params, ModelRules::Strict)?;
    t.download(&out)
}

/// `Err` naming the first differing byte (and word), how many bytes differ, when `a` and `b`
/// (what `a_name` and `b_name` produced) are not identical.
pub fn compare_bytes(what: &str, a_name: &str, a: &[u8], b_name: &str, b: &[u8]) -> Result<(), String> {
    if a.len() != b.len() {
        return Err(format!("{what}: {a_name} wrote {} bytes, {b_name} {}", a.len(), b.len()));
    }
    let Some(first) = a.iter().zip(b).position(|(x, y)| x != y) else {
        return Ok(());
    };
    let differing = a.iter().zip(b).filter(|(x, y)| x != y).count();
    let w = first / 4 * 4;
    let word = |v: &[u8]| v.get(w..w + 4).map(|c| format!("{:#010x}", u32::from_le_bytes(c.try_into().unwrap())));
    Err(format!(
        "{what}: {differing} of {} bytes differ; first at byte {first}: {a_name} {:#04x}, {b_name} {:#04x} \
         (word {}: {a_name} {}, {b_name} {})",
        a.len(),
        a[first],
        b[first],
        first / 4,
        word(a).unwrap_or_default(),
        word(b).unwrap_or_default()
    ))
}

/// The GPU as a [`ProbeTarget`] (its default stream, the diagnostic kernels loaded into its
/// context).
pub struct GpuTarget {
    kernels: DiagKernels,
    stream: Arc<CudaStream>,
}

impl GpuTarget {
    /// Probes on `gpu`: loads the diagnostic module of its architecture.
    pub fn new(gpu: &Gpu) -> nvfp4_gemm::Result<Self> {
        Ok(GpuTarget { kernels: DiagKernels::load(gpu)?, stream: gpu.context().default_stream() })
    }
}

impl ProbeTarget for GpuTarget {
    type Buf = (CudaSlice<u8>, usize);

    fn upload(&self, bytes: &[u8]) -> Result<Self::Buf, String> {
        let mut padded = bytes.to_vec();
        padded.resize(bytes.len().max(16), 0);
        let b = self.stream.clone_htod(&padded).map_err(|e| format!("upload: {e}"))?;
        Ok((b, bytes.len()))
    }

    fn addr(&self, buf: &Self::Buf) -> u64 {
        let (ptr, _sync) = buf.0.device_ptr(&self.stream);
        ptr
    }

    fn download(&self, buf: &Self::Buf) -> Result<Vec<u8>, String> {
        let mut v = self.stream.clone_dtoh(&buf.0).map_err(|e| format!("download: {e}"))?;
        v.truncate(buf.1);
        Ok(v)
    }

    fn encode<const R: usize>(&self, map: &TiledMap<R>, base: u64) -> Result<TensorMap, String> {
        tensor_map::encode(map, base).map_err(|e| e.to_string())
    }

    fn launch(
        &self,
        kernel: ProbeKernel,
        geometry: LaunchGeometry,
        params: ProbeParams,
        _: ModelRules,
    ) -> Result<(), String> {
        let f = self.kernels.function(kernel.name()).map_err(|e| e.to_string())?;
        set_max_dynamic_smem(&f, geometry.smem_bytes).map_err(|e| e.to_string())?;
        // SAFETY: every probe kernel takes one `ProbeParams`; the runners above allocate the
        // buffers its contract asks for.
        unsafe { launch(&f, &self.stream, geometry, &params) }.map_err(|e| e.to_string())?;
        self.stream.synchronize().map_err(|e| format!("{}: {e}", kernel.name()))
    }
}
