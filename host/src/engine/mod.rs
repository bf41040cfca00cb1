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
//! A plan keeps [`TABLE_SETS`] table sets, each with the signature (the addresses and alphas its
//! tables encode) of the call it was uploaded for. A call whose signature one of them holds
//! launches over that set only: buffers a program passes again (PyTorch's caching allocator hands
//! out the same addresses step after step) cost the launch alone. Otherwise the least recently
//! used set gets the call: the mirror is patched and copied to it with one `cuMemcpyHtoDAsync`
//! from pageable memory on the call's stream: the driver stages that much data at the call and
//! returns without waiting for the device (CUDA Driver API, "API synchronization behavior"), and
//! stream order keeps the kernels of earlier calls ahead of the copy. (docs/engine.md §2: on an
//! H100 the copy adds under a microsecond between the launches on the device, where a copy from
//! pinned memory, which goes through a copy engine, added 7–15 µs.)
//!
//! Launches whose parameters do not depend on the call (host-sized sm_90a plans: they point at
//! the plan's own tables) run as one CUDA graph per table set, one driver call. Inside a caller's
//! stream capture the launches (and the upload, from a pinned buffer) become nodes of the
//! caller's graph; that graph then keeps reading the table set it captured, so the set is
//! *retired* (kept, never written again); the next call outside capture that finds fewer than
//! [`TABLE_SETS`] live sets allocates [`TABLE_SETS`] more, so that the new-tensor rotation a
//! program had before a capture still finds its tables after it.

mod tables;

pub(crate) use tables::AlphaField;

use crate::device::{Arch, Gpu};
use crate::driver::graph::{is_capturing, KernelChain};
use crate::driver::launch::{launch_raw, set_max_dynamic_smem, LaunchGeometry, Params, Start};
use crate::driver::module::Kernel;
use crate::driver::tensor_map::{DriverEncoder, TiledMapEncoder};
use crate::error::{Error, Result};
use crate::host_timing::{mark, step};
use crate::problem::OutputType;
use crate::summary::{KernelLaunch, PlanSummary};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtrMut, SyncOnDrop};
use nvfp4_gemm_abi::tensor_map::TensorMap;
use nvfp4_gemm_abi::work::KernelParams;
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

impl Tables {
    /// The parameters of a GEMM (or the sm_90a dequantization) over this memory: work list
    /// `list` of at most `capacity` items, `work_len_device` the device address of its length
    /// where a scheduler writes it (0: the list holds `capacity` items), `groups` groups, C of
    /// type `output`. Every architecture's kernels take these [`KernelParams`].
    pub fn kernel_params(
        &self,
        list: usize,
        capacity: u32,
        work_len_device: u64,
        groups: usize,
        output: OutputType,
    ) -> KernelParams {
        KernelParams {
            groups: self.groups,
            tensor_maps: self.maps,
            work: self.work[list],
            work_len: capacity,
            group_count: groups as u32,
            out_bf16: (output == OutputType::Bf16) as u32,
            reserved: 0,
            work_len_device,
            epilogue: Default::default(),
        }
    }
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

    /// Encodes the maps no call changes (over plan memory at `at`, never over the table set
    /// itself: every set of a plan holds the same fixed maps), and the maps over a call's buffers
    /// with a placeholder address ([`PLACEHOLDER_BASE`]) that [`Layout::encode_call`] replaces.
    /// `maps` has [`Memory::maps`] entries, zeroed.
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

/// How many table sets a plan keeps (each with the call it holds the tables of).
pub const TABLE_SETS: usize = crate::rules::CALLS_KEPT;

/// Which call's tables each table set holds (the signature of its last upload, see
/// [`Layout::signature`], with where its alphas came from), and which set a call uses: the one
/// holding the call's signature, else the least recently used set that no captured graph reads.
/// Pure, so that the rule "upload exactly when no set holds the call's signature" is tested
/// without a GPU.
#[derive(Debug, Default)]
pub(crate) struct Sets {
    current: Vec<u64>,
    sets: Vec<SetState>,
    tick: u64,
}

#[derive(Debug, Default)]
struct SetState {
    held: Vec<u64>,
    valid: bool,
    used: u64,
    retired: bool,
}

/// The set a call uses ([`Sets::pick`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pick {
    /// This set holds the call's tables.
    Holds(usize),
    /// The call uploads its tables into this set.
    Upload(usize),
    /// Every set is retired: the plan needs new ones.
    NoSet,
}

impl Sets {
    /// `n` sets holding nothing known.
    #[cfg(test)]
    pub fn with(n: usize) -> Sets {
        let mut s = Sets::default();
        s.add(n);
        s
    }

    /// `n` more sets, holding nothing known.
    pub fn add(&mut self, n: usize) {
        self.sets.extend((0..n).map(|_| SetState::default()));
    }

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

    /// The set the current call uses (now its most recently used).
    pub fn pick(&mut self) -> Pick {
        self.tick += 1;
        let live = |s: &&mut SetState| !s.retired;
        let pick = match self.sets.iter_mut().position(|s| !s.retired && s.valid && s.held == self.current) {
            Some(i) => Pick::Holds(i),
            None => match self.sets.iter_mut().enumerate().filter(|(_, s)| live(s)).min_by_key(|(_, s)| s.used) {
                Some((i, _)) => Pick::Upload(i),
                None => Pick::NoSet,
            },
        };
        if let Pick::Holds(i) | Pick::Upload(i) = pick {
            self.sets[i].used = self.tick;
        }
        pick
    }

    /// Set `i` is being rewritten: it holds nothing known until [`Sets::done`].
    pub fn begin(&mut self, i: usize) {
        self.sets[i].valid = false;
    }

    /// Set `i` now holds the current call's tables.
    pub fn done(&mut self, i: usize) {
        let s = &mut self.sets[i];
        s.held.clone_from(&self.current);
        s.valid = true;
    }

    /// Set `i` is read by a captured graph: never picked again.
    pub fn retire(&mut self, i: usize) {
        self.sets[i].retired = true;
    }

    /// Sets no captured graph reads.
    pub fn live(&self) -> usize {
        self.sets.iter().filter(|s| !s.retired).count()
    }
}

/// A table set on the device: where its tables are, and (for call-independent launches) the
/// plan's launches over it as one CUDA graph.
struct TableSet {
    at: Tables,
    /// Which block of [`Engine::blocks`] holds it.
    block: usize,
    graph: Option<KernelChain>,
}

/// A call [`Engine::prepare`]d: its table set, and whether the preparation uploaded it and
/// ran inside a capture ([`Engine::launch`] finishes what both imply).
#[derive(Clone, Copy, Debug)]
#[must_use = "a prepared call is launched by `Engine::launch`"]
pub(crate) struct Prepared {
    set: usize,
    upload: bool,
    capturing: bool,
}

/// A plan on a device: its layout, kernels and memory (see the module's docs).
pub(crate) struct Engine<L: Layout> {
    /// What runs.
    pub layout: L,
    /// Each kernel the launches name, loaded, with its name.
    functions: Vec<(&'static str, Kernel)>,
    fixed: Fixed,
    /// The memory of the table sets, [`TABLE_SETS`] sets a block (sets a captured graph reads
    /// stay in theirs, never written again, freed with the plan).
    blocks: Vec<CudaSlice<u8>>,
    /// Each table set's addresses and graph.
    tables: Vec<TableSet>,
    /// Which call each set holds.
    sets: Sets,
    mirror: Mirror<L::Group>,
    /// The launches' scratch list.
    launches: Vec<Launch>,
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
            blocks: vec![],
            tables: vec![],
            sets: Sets::default(),
            mirror: Mirror::new(memory.groups, memory.maps),
            launches: vec![],
            capture: CaptureStaging::default(),
            summary: summary(&layout),
            layout,
        };
        let mut launches = vec![];
        engine.layout.launches(None, &Tables::default(), &mut launches);
        for l in &launches {
            if !engine.functions.iter().any(|(name, _)| *name == l.kernel) {
                engine.functions.push((l.kernel, gpu.function(l.kernel)?));
            }
            set_max_dynamic_smem(function(&engine.functions, l.kernel), l.geometry.smem_bytes)?;
        }
        engine.add_sets(&stream)?;
        engine.capture.prepare(engine.mirror.bytes().len())?;
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

    /// The sm_90a token workspace (16 bytes where the layout has none).
    pub fn workspace_mut(&mut self) -> &mut CudaSlice<u8> {
        &mut self.fixed.workspace
    }

    /// Zeroes the status word on `stream`.
    pub fn clear_status(&mut self, stream: &Arc<CudaStream>) -> Result<()> {
        stream.memset_zeros(&mut self.fixed.status).map_err(|e| Error::driver("clearing the plan's status word", e))
    }

    /// [`TABLE_SETS`] more table sets in one new block (zeroed), with their graphs where the
    /// launches do not depend on the call. The fixed maps are encoded into the mirror (the same
    /// for every set: [`Layout::encode_fixed`]).
    fn add_sets(&mut self, stream: &Arc<CudaStream>) -> Result<()> {
        // Each set 256-byte aligned (maps need 64; the group table follows them in the set).
        let stride = self.mirror.bytes().len().max(16).next_multiple_of(256);
        let mut block = stream
            .alloc_zeros::<u8>(stride * TABLE_SETS)
            .map_err(|e| Error::driver("allocating the plan's tables", e))?;
        let base = block.device_ptr_mut(stream).0;
        let f = &mut self.fixed;
        let work_len = f.work_len.device_ptr_mut(stream).0;
        let [w0, w1] = &mut f.work;
        let common = Tables {
            maps: 0,
            groups: 0,
            work: [w0.device_ptr_mut(stream).0, w1.device_ptr_mut(stream).0],
            work_len: [work_len, work_len + 4],
            status: f.status.device_ptr_mut(stream).0,
            ranks: f.ranks.device_ptr_mut(stream).0,
            workspace: f.workspace.device_ptr_mut(stream).0,
        };
        let index = self.blocks.len();
        self.blocks.push(block);
        if index == 0 {
            // The maps no call changes (the next upload of each set writes the rest).
            self.layout.encode_fixed(&DriverEncoder, &common, self.mirror.maps_mut())?;
        }
        for i in 0..TABLE_SETS {
            let maps = base + (i * stride) as u64;
            let at = Tables { maps, groups: maps + self.mirror.groups_offset() as u64, ..common };
            let graph = if self.layout.call_independent_launches() {
                self.launches.clear();
                self.layout.launches(None, &at, &mut self.launches);
                let functions = &self.functions;
                let kernels: Vec<(&Kernel, LaunchGeometry, Start, Params)> = self
                    .launches
                    .iter()
                    .map(|l| (function(functions, l.kernel), l.geometry, l.start, l.params))
                    .collect();
                // SAFETY: the launches' parameters point at this set and the plan's memory,
                // which live as long as the graph (both freed with the plan).
                (!kernels.is_empty()).then(|| unsafe { KernelChain::new(&kernels) }).transpose()?
            } else {
                None
            };
            self.tables.push(TableSet { at, block: index, graph });
        }
        self.sets.add(TABLE_SETS);
        Ok(())
    }

    /// Runs `call` (validated by the caller against the plan's problem) on `stream`, its alphas
    /// from `alphas`: over the table set holding the call's signature, else uploads the tables
    /// into the least recently used set; copies device alphas into them, and launches.
    ///
    /// # Safety
    /// Every buffer of `call` (and device alphas) must be device memory of the lengths validated,
    /// alive until the work enqueued now completes.
    pub unsafe fn run(&mut self, stream_arc: &Arc<CudaStream>, call: &L::Call, alphas: Alphas) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe {
            let prepared = self.prepare(stream_arc, call, alphas)?;
            self.launch(stream_arc, call, prepared, &[])
        }
    }

    /// [`Engine::run`]'s first half: the tables for `call` (a set that holds them, else an
    /// upload) and its device alphas, on `stream`; [`Engine::launch`] enqueues its launches.
    /// Between the two the caller may launch work that reads or writes the set's tables
    /// ([`Engine::tables_of`]), such as a launch the layout lists first, run inside another
    /// kernel (`MoePlan::prepare_scheduled`).
    ///
    /// # Safety
    /// As [`Engine::run`].
    pub unsafe fn prepare(&mut self, stream_arc: &Arc<CudaStream>, call: &L::Call, alphas: Alphas) -> Result<Prepared> {
        let stream: &CudaStream = stream_arc;
        let capturing = is_capturing(stream)?;
        if !capturing {
            // A capture used the staging buffer: the next capture's, allocated outside capture.
            self.capture.prepare(self.mirror.bytes().len())?;
            // A capture retired a set: as many live sets as before it, allocated outside capture.
            if self.sets.live() < TABLE_SETS {
                self.add_sets(stream_arc)?;
            }
        }
        mark(step::CAPTURE);
        self.layout.signature(call, self.sets.start(alphas));
        let (i, upload) = match self.sets.pick() {
            Pick::Holds(i) => (i, false),
            Pick::Upload(i) => (i, true),
            Pick::NoSet => {
                if capturing {
                    return Err(Error::Capture(
                        "every table set of the plan belongs to a graph captured earlier and new ones \
                         cannot be allocated inside a capture: call the plan once outside capture first"
                            .into(),
                    ));
                }
                self.add_sets(stream_arc)?;
                match self.sets.pick() {
                    Pick::Upload(i) => (i, true),
                    other => unreachable!("new sets hold nothing: {other:?}"),
                }
            }
        };
        let at = self.tables[i].at;
        mark(step::PICK);
        // Where cudarc orders memory between streams, the plan's memory is ordered like the
        // caller's buffers: its guards wait for other streams now and record this stream's use
        // when dropped, after the upload (and `launch` holds them again over the launches).
        let held = Held::plan_memory(stream, &mut self.fixed, &mut self.blocks[self.tables[i].block]);
        mark(step::GUARDS);
        if upload {
            self.sets.begin(i);
            let (groups, maps) = self.mirror.parts_mut();
            self.layout.encode_call(&DriverEncoder, call, &at, groups, maps)?;
            mark(step::ENCODE);
            // SAFETY: `at.maps` is set `i`, as long as the mirror.
            unsafe {
                if capturing {
                    self.capture.upload(stream_arc, self.mirror.bytes(), at.maps)?;
                } else {
                    copy_htod(stream, at.maps, self.mirror.bytes())?;
                }
            }
            self.sets.done(i);
            mark(step::UPLOAD);
        }
        if let Alphas::Device(src) = alphas {
            // SAFETY: the caller's contract for `src` (one f32 per group, validated); the group
            // table is this plan's.
            unsafe { self.layout.alpha_field().copy(stream, at.groups, src, self.mirror.groups())? };
        }
        drop(held);
        Ok(Prepared { set: i, upload, capturing })
    }

    /// The memory a prepared call's launches read and write.
    pub fn tables_of(&self, prepared: &Prepared) -> Tables {
        self.tables[prepared.set].at
    }

    /// [`Engine::run`]'s second half: enqueues the launches of `call` (the call `prepared` was
    /// prepared for, on the same stream) after the leading ones named in `skip` (which the caller
    /// ran its own way; a layout whose launches one graph serves is launched whole, `skip` empty).
    ///
    /// # Safety
    /// As [`Engine::run`]; the skipped launches' work must be enqueued already.
    pub unsafe fn launch(
        &mut self,
        stream_arc: &Arc<CudaStream>,
        call: &L::Call,
        prepared: Prepared,
        skip: &[&str],
    ) -> Result<()> {
        let stream: &CudaStream = stream_arc;
        let Prepared { set: i, upload, capturing } = prepared;
        let at = self.tables[i].at;
        let held = Held::plan_memory(stream, &mut self.fixed, &mut self.blocks[self.tables[i].block]);
        // SAFETY: the tables hold this call's buffers (uploaded now, or by an earlier call with the
        // same signature) and every other address is the plan's own memory.
        unsafe {
            match &mut self.tables[i].graph {
                Some(graph) if !capturing && skip.is_empty() => graph.launch(stream)?,
                _ => {
                    self.launches.clear();
                    self.layout.launches(Some(call), &at, &mut self.launches);
                    let first = self.launches.iter().take(skip.len()).map(|l| l.kernel);
                    assert!(first.eq(skip.iter().copied()), "the launches the caller ran are the layout's first");
                    for l in &self.launches[skip.len()..] {
                        launch_raw(function(&self.functions, l.kernel), stream, l.geometry, l.start, &l.params)?;
                    }
                }
            }
        }
        mark(step::LAUNCH);
        drop(held);
        if capturing {
            // The caller's graph reads this set (and the staging it was uploaded from) at every
            // replay: keep both, write neither again. Nothing is freed or destroyed inside a
            // capture (the driver refuses it there, and the refusal invalidates the capture).
            self.sets.retire(i);
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

    /// Guards over a plan's memory on `stream`: its fixed buffers and the block of the set used.
    fn plan_memory(stream: &'a CudaStream, fixed: &'a mut Fixed, block: &'a mut CudaSlice<u8>) -> Held<'a> {
        let mut held = Held::new(stream);
        if held.managing {
            for s in fixed.work.iter_mut().chain([&mut fixed.workspace, block]) {
                held.hold(s.device_ptr_mut(stream).1);
            }
            for s in [&mut fixed.work_len, &mut fixed.status, &mut fixed.ranks] {
                held.hold(s.device_ptr_mut(stream).1);
            }
        }
        held
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

#[cfg(test)]
mod tests {
    use super::{Alphas, Pick, Sets, TABLE_SETS};

    /// The call with signature `sig`: the set it uses, uploading (marked done) when asked.
    fn call(sets: &mut Sets, sig: u64) -> Pick {
        sets.start(Alphas::Host).push(sig);
        let pick = sets.pick();
        if let Pick::Upload(i) = pick {
            sets.begin(i);
            sets.done(i);
        }
        pick
    }

    #[test]
    fn rotating_buffers_within_the_sets_upload_once_each() {
        let mut sets = Sets::with(TABLE_SETS);
        for round in 0..3 {
            for sig in 0..TABLE_SETS as u64 {
                let pick = call(&mut sets, sig);
                match round {
                    0 => assert!(matches!(pick, Pick::Upload(_)), "{pick:?}"),
                    _ => assert!(matches!(pick, Pick::Holds(_)), "round {round}, signature {sig}: {pick:?}"),
                }
            }
        }
        // The same signature with device alphas is another call.
        sets.start(Alphas::Device(0)).push(0);
        assert!(matches!(sets.pick(), Pick::Upload(_)));
    }

    #[test]
    fn one_more_set_of_buffers_than_sets_uploads_every_call() {
        let mut sets = Sets::with(TABLE_SETS);
        for round in 0..3 {
            for sig in 0..=TABLE_SETS as u64 {
                let pick = call(&mut sets, sig);
                assert!(matches!(pick, Pick::Upload(_)), "round {round}, signature {sig}: {pick:?}");
            }
        }
    }

    #[test]
    fn retired_sets_are_never_picked_and_new_ones_are_asked_for() {
        let mut sets = Sets::with(2);
        let Pick::Upload(first) = call(&mut sets, 7) else { panic!("an empty set") };
        sets.retire(first);
        // The signature the retired set holds is uploaded again, into the other set.
        let Pick::Upload(second) = call(&mut sets, 7) else { panic!("an upload") };
        assert_ne!(first, second);
        assert_eq!(call(&mut sets, 7), Pick::Holds(second));
        sets.retire(second);
        assert_eq!(call(&mut sets, 7), Pick::NoSet);
        sets.add(1);
        assert_eq!(call(&mut sets, 7), Pick::Upload(2));
    }

    #[test]
    fn sets_added_after_a_capture_keep_a_full_rotation_resident() {
        // A capture retires the set it used; the engine then adds TABLE_SETS more (outside
        // capture) when fewer than TABLE_SETS are live, and a rotation of TABLE_SETS buffers
        // uploads once per buffer again, as before the capture.
        let mut sets = Sets::with(TABLE_SETS);
        let Pick::Upload(captured) = call(&mut sets, 100) else { panic!("an empty set") };
        sets.retire(captured);
        sets.retire(captured);
        assert_eq!(sets.live(), TABLE_SETS - 1);
        sets.add(TABLE_SETS);
        assert_eq!(sets.live(), 2 * TABLE_SETS - 1);
        for round in 0..3 {
            for sig in 0..TABLE_SETS as u64 {
                let i = match (round, call(&mut sets, sig)) {
                    (0, Pick::Upload(i)) => i,
                    (1.., Pick::Holds(i)) => i,
                    (_, pick) => panic!("round {round}, signature {sig}: {pick:?}"),
                };
                assert_ne!(i, captured, "the captured set was picked");
            }
        }
        // Without the added sets, the same rotation misses every time.
        let mut short = Sets::with(TABLE_SETS);
        let Pick::Upload(c) = call(&mut short, 100) else { panic!("an empty set") };
        short.retire(c);
        for sig in 0..2 * TABLE_SETS as u64 {
            assert!(matches!(call(&mut short, sig % TABLE_SETS as u64), Pick::Upload(_)));
        }
    }

    #[test]
    fn a_set_being_rewritten_holds_nothing() {
        let mut sets = Sets::with(1);
        call(&mut sets, 1);
        assert_eq!(call(&mut sets, 1), Pick::Holds(0));
        sets.start(Alphas::Host).push(2);
        assert_eq!(sets.pick(), Pick::Upload(0));
        sets.begin(0);
        // The upload failed before `done`: neither signature is held.
        sets.start(Alphas::Host).push(1);
        assert_eq!(sets.pick(), Pick::Upload(0));
    }
}
