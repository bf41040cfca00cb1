//! The plan engine: the one core behind every plan ([`crate::GemmPlan`], [`crate::MoePlan`]),
//! whatever the architecture, the way sizes are known (on the host or on the device) and the
//! token operand (NVFP4, or 16-bit activations for W4A16). It owns the device memory of a plan,
//! decides from the call's signature whether the tables must be uploaded, and runs the launch
//! loop. What differs between plans is a [`Layout`]: the sizes of the tables, how a call's
//! buffers become table entries and tensor maps, and the list of launches.
//!
//! Memory of a plan:
//! - the *table set*: the tensor maps and the group table, the only memory the host writes per
//!   call. Its content is kept on the host too (the *mirror*), encoded once for what no call
//!   changes (maps over plan memory, e.g. the sm_90a token workspace) and patched per call (the
//!   group entries and the addresses of maps over the call's buffers: `cuTensorMapReplaceAddress`
//!   instead of a full encode);
//! - the *fixed* memory: work lists built on the host (uploaded once), and what kernels write
//!   (the device-sized schedule, status word, token workspace).
//!
//! A call whose signature (the addresses and alphas its tables encode) equals the last upload's
//! launches only. Otherwise the mirror is patched and copied to the table set with one
//! `cuMemcpyHtoDAsync` from pageable memory on the call's stream: the driver stages that much data
//! at the call and returns without waiting for the device (CUDA Driver API, "API synchronization
//! behavior"), and stream order keeps the kernels of earlier calls ahead of the copy, so one table
//! set serves every call. (docs/engine.md §2: on an H100 the copy adds under a microsecond
//! between the launches on the device, where a copy from pinned memory, which goes through a
//! copy engine, added 7–15 µs.)
//!
//! Launches whose parameters do not depend on the call (host-sized sm_90a plans: they point at
//! the plan's own tables) run as one CUDA graph, one driver call. Inside a caller's stream
//! capture the launches (and the upload, from a pinned buffer) become nodes of the caller's
//! graph; that graph then keeps reading the table set it captured, so the set is *retired*
//! (kept, never written again) and the next call outside capture allocates a new one.

mod tables;

pub(crate) use tables::AlphaField;

use crate::device::{Arch, Gpu};
use crate::driver::graph::{is_capturing, KernelChain};
use crate::driver::launch::{launch_raw, set_max_dynamic_smem, LaunchGeometry, Params, Start};
use crate::driver::module::Kernel;
use crate::driver::tensor_map::{DriverEncoder, TiledMapEncoder};
use crate::error::{Error, Result};
use crate::summary::{KernelLaunch, PlanSummary};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtrMut, SyncOnDrop};
use nvfp4_gemm_abi::tensor_map::TensorMap;
use std::sync::Arc;
use tables::{CaptureStaging, Mirror};

/// Device addresses of a plan's memory, for its table entries and launch parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tables {
    /// The group table (`Layout::Group` entries).
    pub groups: u64,
    /// The tensor maps.
    pub maps: u64,
    /// The work lists (host-sized: built on the host, one per launch; device-sized: the
    /// scheduler's list in `work[0]`).
    pub work: [u64; 2],
    /// The `u32` work length of each device-sized GEMM launch (sm_90a: `[decode, general]`;
    /// sm_100a: the first).
    pub work_len: [u64; 2],
    /// The `u32` status word of device-sized plans.
    pub status: u64,
    /// sm_90a device-sized: the scheduler's `u32` scratch (the LPT order's list indices).
    pub ranks: u64,
    /// sm_90a: the f16 token workspace.
    pub workspace: u64,
}

/// The memory a layout asks for, besides the table set.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Memory {
    /// Entries of the group table.
    pub groups: usize,
    /// Tensor maps.
    pub maps: usize,
    /// Each work list: its items as built on the host (`Items`) or the bytes a device scheduler
    /// fills (`Capacity`).
    pub work: [WorkList; 2],
    /// Bytes of the sm_90a token workspace (0: none).
    pub workspace_bytes: usize,
    /// `u32` words of the device scheduler's scratch (0: none).
    pub ranks: usize,
}

/// A work list's memory.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum WorkList {
    /// No list.
    #[default]
    None,
    /// A list built on the host: its bytes, uploaded once.
    Items(Vec<u8>),
    /// A list of this many bytes that a kernel writes.
    Capacity(usize),
}

/// One launch: which of the layout's kernels, its geometry, how it starts relative to the launch
/// before it, and its one parameter struct (as bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    /// The kernel's exported name.
    pub kernel: &'static str,
    /// Grid, block, cluster and dynamic shared memory.
    pub geometry: LaunchGeometry,
    /// How it starts.
    pub start: Start,
    /// The parameter struct's bytes.
    pub params: Params,
}

/// An architecture's part of a plan: everything that needs no driver call. Public (through
/// `crate::layout`) so that the device model runs the kernels on exactly these tables.
pub trait Layout {
    /// The architecture's group-table entry.
    type Group: bytemuck::Pod;
    /// A call's validated buffers.
    type Call: ?Sized;
    /// The architecture.
    const ARCH: Arch;

    /// The memory the plan owns.
    fn memory(&self) -> Memory;

    /// Encodes the maps no call changes (over plan memory at `at`), and the maps over a call's
    /// buffers with a placeholder address ([`PLACEHOLDER_BASE`]) that [`Layout::encode_call`]
    /// replaces. `maps` has [`Memory::maps`] entries, zeroed.
    fn encode_fixed<E: TiledMapEncoder>(&self, encoder: &E, at: &Tables, maps: &mut [TensorMap]) -> Result<()>;

    /// Writes every group entry for `call` and the addresses of the maps over its buffers (the
    /// other maps as [`Layout::encode_fixed`] left them).
    fn encode_call<E: TiledMapEncoder>(
        &self,
        encoder: &E,
        call: &Self::Call,
        at: &Tables,
        groups: &mut [Self::Group],
        maps: &mut [TensorMap],
    ) -> Result<()>;

    /// What the call's tables depend on, appended to `out`: two calls with the same signature
    /// have the same tables.
    fn signature(&self, call: &Self::Call, out: &mut Vec<u64>);

    /// Every launch of `call` (or, for `None`, of a call with placeholder buffers: to load the
    /// kernels and to describe the plan) over the memory at `at`, appended to `out` in order.
    fn launches(&self, call: Option<&Self::Call>, at: &Tables, out: &mut Vec<Launch>);

    /// Whether the launches' parameters are the same for every call (then one CUDA graph serves
    /// every call). Launches with clusters never run as a graph.
    fn call_independent_launches(&self) -> bool;

    /// The kernels in words, and the most output tiles a call computes.
    fn describe(&self) -> (String, usize);

    /// Where each group's alpha lies in the group table.
    fn alpha_field(&self) -> AlphaField {
        AlphaField::none()
    }
}

/// The address the maps over a call's buffers are encoded with before the call's own replaces it
/// (16-byte aligned, as the driver requires; never read: a map is patched before any launch).
pub const PLACEHOLDER_BASE: u64 = 256;

/// `layout`'s tables for `call` over the memory at `at`, with the maps encoded by `encoder`: the
/// group table and the maps an upload of the engine would hold (for the device model's tests).
#[cfg_attr(not(any(test, feature = "testing")), allow(dead_code))]
pub fn encode_tables<L: Layout, E: TiledMapEncoder>(
    layout: &L,
    encoder: &E,
    call: &L::Call,
    at: &Tables,
) -> Result<(Vec<L::Group>, Vec<TensorMap>)> {
    let memory = layout.memory();
    let mut maps = vec![TensorMap::ZERO; memory.maps];
    layout.encode_fixed(encoder, at, &mut maps)?;
    let mut groups = vec![<L::Group as bytemuck::Zeroable>::zeroed(); memory.groups];
    layout.encode_call(encoder, call, at, &mut groups, &mut maps)?;
    Ok((groups, maps))
}

/// What a plan of `layout` runs (its launches with placeholder buffers), computed without a GPU.
pub fn summary<L: Layout>(layout: &L) -> PlanSummary {
    let mut launches = vec![];
    layout.launches(None, &Tables::default(), &mut launches);
    let (kernel, tiles) = layout.describe();
    PlanSummary {
        arch: L::ARCH,
        kernel,
        tiles,
        launches: launches.iter().map(|l| KernelLaunch { kernel: l.kernel, geometry: l.geometry }).collect(),
        workspace_bytes: layout.memory().workspace_bytes,
    }
}

/// The memory of a plan besides the table set, allocated once.
struct Fixed {
    work: [CudaSlice<u8>; 2],
    work_len: CudaSlice<u32>,
    status: CudaSlice<u32>,
    ranks: CudaSlice<u32>,
    workspace: CudaSlice<u8>,
}

/// Where the alphas of a call come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Alphas {
    /// In the call's buffers (the layout writes them into the group entries).
    Host,
    /// `G` `f32`s at this device address, copied into the group table by each call after any
    /// upload (the layout's entries hold a placeholder).
    Device(u64),
}

/// Which tables the device holds: the signature of the last upload (see [`Layout::signature`]),
/// with where its alphas came from, against the current call's. Pure, so that the rule "upload
/// exactly when the signature changed" is tested without a GPU.
#[derive(Debug, Default)]
pub(crate) struct Uploads {
    held: Vec<u64>,
    current: Vec<u64>,
    valid: bool,
}

impl Uploads {
    /// The current call's signature, emptied but for where its alphas come from: for the layout
    /// to append to.
    pub fn start(&mut self, alphas: Alphas) -> &mut Vec<u64> {
        self.current.clear();
        self.current.push(match alphas {
            Alphas::Host => 0,
            Alphas::Device(_) => 1,
        });
        &mut self.current
    }

    /// Whether the current call must upload: the tables hold nothing known, or another signature.
    pub fn needed(&self) -> bool {
        !(self.valid && self.held == self.current)
    }

    /// The tables are being rewritten: they hold nothing known until [`Uploads::done`].
    pub fn begin(&mut self) {
        self.valid = false;
    }

    /// The tables now hold the current call's signature.
    pub fn done(&mut self) {
        std::mem::swap(&mut self.held, &mut self.current);
        self.valid = true;
    }

    /// The tables hold nothing known (a new set).
    pub fn forget(&mut self) {
        self.valid = false;
    }
}

/// A plan on a device: its layout, kernels and memory (see the module's docs).
pub(crate) struct Engine<L: Layout> {
    /// What runs.
    pub layout: L,
    /// Each kernel the launches name, loaded, with its name.
    functions: Vec<(&'static str, Kernel)>,
    fixed: Fixed,
    /// The current table set (`None` after a capture retired it).
    set: Option<CudaSlice<u8>>,
    /// Sets a captured graph reads: never written again, freed with the plan.
    retired: Vec<CudaSlice<u8>>,
    /// The addresses of the plan's memory with the current set.
    at: Tables,
    mirror: Mirror<L::Group>,
    /// What the table set holds.
    uploads: Uploads,
    /// The launches' scratch list.
    launches: Vec<Launch>,
    /// The launches of a layout with call-independent launches as one graph over the current
    /// set (made at the first call outside capture after the set was made).
    graph: Option<KernelChain>,
    /// The pinned buffer a captured upload copies from (the graph keeps reading it at replays).
    capture: CaptureStaging,
    summary: PlanSummary,
}

impl<L: Layout> Engine<L> {
    /// Loads `layout`'s kernels and allocates its memory (zeroed; host-built work lists
    /// uploaded) on the device's null stream, and waits for it there, so that any stream of the
    /// context finds the plan ready.
    pub fn new(gpu: &Gpu, layout: L) -> Result<Engine<L>> {
        let stream = gpu.context().default_stream();
        let d = |e| Error::driver("allocating the plan's device memory", e);
        let memory = layout.memory();
        let work = [0, 1].map(|i| match &memory.work[i] {
            WorkList::Items(items) if !items.is_empty() => stream.clone_htod(items),
            WorkList::Capacity(bytes) => stream.alloc_zeros::<u8>((*bytes).max(16)),
            _ => stream.alloc_zeros::<u8>(16),
        });
        let [w0, w1] = work;
        let fixed = Fixed {
            work: [w0.map_err(d)?, w1.map_err(d)?],
            work_len: stream.alloc_zeros::<u32>(2).map_err(d)?,
            status: stream.alloc_zeros::<u32>(1).map_err(d)?,
            ranks: stream.alloc_zeros::<u32>(memory.ranks.max(1)).map_err(d)?,
            workspace: stream.alloc_zeros::<u8>(memory.workspace_bytes.max(16)).map_err(d)?,
        };
        let mut engine = Engine {
            functions: vec![],
            fixed,
            set: None,
            retired: vec![],
            at: Tables::default(),
            mirror: Mirror::new(memory.groups, memory.maps),
            uploads: Uploads::default(),
            launches: vec![],
            graph: None,
            capture: CaptureStaging::default(),
            summary: summary(&layout),
            layout,
        };
        engine.new_set(&stream)?;
        engine.capture.prepare(engine.mirror.bytes().len())?;
        let at = engine.at;
        let mut launches = vec![];
        engine.layout.launches(None, &at, &mut launches);
        for l in &launches {
            if !engine.functions.iter().any(|(name, _)| *name == l.kernel) {
                engine.functions.push((l.kernel, gpu.function(l.kernel)?));
            }
            set_max_dynamic_smem(function(&engine.functions, l.kernel), l.geometry.smem_bytes)?;
        }
        stream.synchronize().map_err(|e| Error::driver("waiting for the plan's device memory", e))?;
        Ok(engine)
    }

    /// What a call launches.
    pub fn summary(&self) -> &PlanSummary {
        &self.summary
    }

    /// Whether a call launches anything.
    pub fn has_work(&self) -> bool {
        !self.summary.launches.is_empty()
    }

    /// The device-sized status word.
    pub fn status(&self) -> &CudaSlice<u32> {
        &self.fixed.status
    }

    /// Zeroes the status word on `stream`.
    pub fn clear_status(&mut self, stream: &Arc<CudaStream>) -> Result<()> {
        stream.memset_zeros(&mut self.fixed.status).map_err(|e| Error::driver("clearing the plan's status word", e))
    }

    /// A new table set (the current one, if any, retired by the caller first), and the
    /// addresses of the plan's memory with it.
    fn new_set(&mut self, stream: &Arc<CudaStream>) -> Result<()> {
        let mut set = stream
            .alloc_zeros::<u8>(self.mirror.bytes().len().max(16))
            .map_err(|e| Error::driver("allocating the plan's tables", e))?;
        let f = &mut self.fixed;
        let maps = set.device_ptr_mut(stream).0;
        let work_len = f.work_len.device_ptr_mut(stream).0;
        let [w0, w1] = &mut f.work;
        self.at = Tables {
            maps,
            groups: maps + self.mirror.groups_offset() as u64,
            work: [w0.device_ptr_mut(stream).0, w1.device_ptr_mut(stream).0],
            work_len: [work_len, work_len + 4],
            status: f.status.device_ptr_mut(stream).0,
            ranks: f.ranks.device_ptr_mut(stream).0,
            workspace: f.workspace.device_ptr_mut(stream).0,
        };
        self.set = Some(set);
        // The maps no call changes, over this set's memory (the next upload writes the rest).
        self.layout.encode_fixed(&DriverEncoder, &self.at, self.mirror.maps_mut())?;
        self.uploads.forget();
        self.graph = None;
        Ok(())
    }

    /// Runs `call` (validated by the caller against the plan's problem) on `stream`, its alphas
    /// from `alphas`: uploads the tables when the call's signature differs from the last upload's,
    /// copies device alphas into them, and launches.
    ///
    /// # Safety
    /// Every buffer of `call` (and device alphas) must be device memory of the lengths validated,
    /// alive until the work enqueued now completes.
    pub unsafe fn run(&mut self, stream_arc: &Arc<CudaStream>, call: &L::Call, alphas: Alphas) -> Result<()> {
        let stream: &CudaStream = stream_arc;
        let capturing = is_capturing(stream)?;
        if self.set.is_none() {
            if capturing {
                return Err(Error::Capture(
                    "the plan's tables belong to a graph captured earlier and a new set cannot be \
                     allocated inside a capture: call the plan once outside capture first"
                        .into(),
                ));
            }
            // The last set went to a captured graph: a new one, and a new staging buffer for the
            // next capture.
            self.new_set(stream_arc)?;
            self.capture.prepare(self.mirror.bytes().len())?;
        }
        self.layout.signature(call, self.uploads.start(alphas));
        let at = self.at;
        // Where cudarc orders memory between streams, the plan's memory is ordered like the
        // caller's buffers: its guards wait for other streams now and record this stream's use
        // when dropped, after the launches.
        let mut held = Held::new(stream);
        if held.managing {
            let f = &mut self.fixed;
            for s in f.work.iter_mut().chain([&mut f.workspace]).chain(self.set.iter_mut()) {
                held.hold(s.device_ptr_mut(stream).1);
            }
            for s in [&mut f.work_len, &mut f.status, &mut f.ranks] {
                held.hold(s.device_ptr_mut(stream).1);
            }
        }
        let upload = self.uploads.needed();
        if upload {
            self.uploads.begin();
            let (groups, maps) = self.mirror.parts_mut();
            self.layout.encode_call(&DriverEncoder, call, &at, groups, maps)?;
            // SAFETY: `at.maps` is the current set, as long as the mirror.
            unsafe {
                if capturing {
                    self.capture.upload(stream_arc, self.mirror.bytes(), at.maps)?;
                } else {
                    copy_htod(stream, at.maps, self.mirror.bytes())?;
                }
            }
            self.uploads.done();
        }
        if let Alphas::Device(src) = alphas {
            // SAFETY: the caller's contract for `src` (one f32 per group, validated); the group
            // table is this plan's.
            unsafe { self.layout.alpha_field().copy(stream, at.groups, src, self.mirror.groups())? };
        }
        self.launches.clear();
        self.layout.launches(Some(call), &at, &mut self.launches);
        // SAFETY: the tables hold this call's buffers (uploaded now, or by an earlier call with the
        // same signature) and every other address is the plan's own memory.
        unsafe {
            if capturing || !self.layout.call_independent_launches() {
                for l in &self.launches {
                    launch_raw(function(&self.functions, l.kernel), stream, l.geometry, l.start, &l.params)?;
                }
            } else {
                if self.graph.is_none() {
                    let functions = &self.functions;
                    let kernels: Vec<(&Kernel, LaunchGeometry, Start, Params)> = self
                        .launches
                        .iter()
                        .map(|l| (function(functions, l.kernel), l.geometry, l.start, l.params))
                        .collect();
                    self.graph = Some(KernelChain::new(&kernels)?);
                }
                self.graph.as_mut().expect("made above").launch(stream)?;
            }
        }
        drop(held);
        if capturing {
            // The caller's graph reads this set (and the staging it was uploaded from) at every
            // replay: keep both, write neither again.
            // The kernel graph over the retired set stays until the next call outside capture
            // makes a new set ([`Engine::new_set`] drops it there): destroying a graph is not
            // allowed inside a capture, and doing so would invalidate the caller's.
            self.retired.extend(self.set.take());
            if upload {
                self.capture.retire();
            }
        }
        Ok(())
    }
}

/// The loaded kernel `name` (loaded by [`Engine::new`] for every launch the layout names).
fn function<'a>(functions: &'a [(&'static str, Kernel)], name: &str) -> &'a Kernel {
    &functions.iter().find(|(n, _)| *n == name).expect("loaded by Engine::new").1
}

/// Stream-ordering guards held until a call's work is enqueued (only where cudarc manages
/// synchronization between streams; elsewhere nothing is recorded).
struct Held<'a> {
    managing: bool,
    guards: Vec<SyncOnDrop<'a>>,
}

impl<'a> Held<'a> {
    fn new(stream: &CudaStream) -> Held<'a> {
        Held { managing: stream.context().is_managing_stream_synchronization(), guards: vec![] }
    }

    fn hold(&mut self, guard: SyncOnDrop<'a>) {
        self.guards.push(guard);
    }
}

/// Enqueues on `stream` the copy of `bytes` (pageable host memory) to the device address `dst`:
/// `cuMemcpyHtoDAsync`, which stages pageable data at the call and returns without waiting for
/// the device.
///
/// # Safety
/// `dst` must be device memory of at least `bytes.len()` bytes in `stream`'s context.
unsafe fn copy_htod(stream: &CudaStream, dst: u64, bytes: &[u8]) -> Result<()> {
    // SAFETY: the caller's contract; `bytes` is read before the call returns.
    unsafe { cudarc::driver::sys::cuMemcpyHtoDAsync_v2(dst, bytes.as_ptr().cast(), bytes.len(), stream.cu_stream()) }
        .result()
        .map_err(|e| Error::driver("uploading the call's tables", e))
}

/// Stand-ins for the engine's driver-side parts, for the layouts' CPU tests.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use nvfp4_gemm_abi::tensor_map::TiledMap;

    /// Encodes a map as its base address (bytes 0..8, where the driver keeps it) and its
    /// description's debug text (from byte 8, truncated): enough to see which map went where.
    pub struct FakeEncoder;

    impl TiledMapEncoder for FakeEncoder {
        fn encode<const R: usize>(&self, map: &TiledMap<R>, base: u64) -> Result<TensorMap> {
            let mut m = TensorMap::ZERO;
            m.0[..8].copy_from_slice(&base.to_le_bytes());
            let text = format!("{map:?}");
            let n = text.len().min(120);
            m.0[8..8 + n].copy_from_slice(&text.as_bytes()[..n]);
            Ok(m)
        }

        fn replace_address(&self, map: &mut TensorMap, base: u64) -> Result<()> {
            map.0[..8].copy_from_slice(&base.to_le_bytes());
            Ok(())
        }
    }

    /// The base address of a map [`FakeEncoder`] encoded.
    pub fn base(m: &TensorMap) -> u64 {
        u64::from_le_bytes(m.0[..8].try_into().expect("8 bytes"))
    }

    /// `layout`'s launches of `call` over the memory at `at`.
    pub fn launches<L: Layout>(layout: &L, call: Option<&L::Call>, at: &Tables) -> Vec<Launch> {
        let mut out = vec![];
        layout.launches(call, at, &mut out);
        out
    }
}
