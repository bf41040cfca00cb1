//! A functional model of the sm_90a / sm_100a device subset that the NVFP4 GEMM kernels use,
//! written from the PTX ISA (version 9.0 section numbers), so that the kernels' own code can run
//! on the CPU in `cargo test`.
//!
//! [`launch`] runs a grid: one OS thread per GPU thread, one running at a time under a seeded
//! scheduler, so that a run is reproducible and a deadlock is detected exactly. The kernel body
//! reaches the device only through this crate's instructions, grouped like the kernel crate's
//! `ptx` wrappers: [`sreg`], [`smem`], [`barrier`], [`cluster`], [`fence`], [`mbarrier`], [`tma`],
//! [`warp`], [`wgmma`], [`tcgen05`], [`convert`]. Each takes the device operands as raw values
//! (32-bit shared addresses, 64-bit generic pointers and descriptors), so that a host build of a
//! `ptx` wrapper is one call. Global memory is host memory. [`tensor_map::encode_tiled`] replaces
//! the driver's `cuTensorMapEncodeTiled`.
//!
//! Failures ([`ModelError`]) carry the machine state: every mbarrier, named barrier, warp (where
//! each lane is) and in-flight asynchronous operation. See `README.md` for what is and is not
//! modelled.

mod asyncop;
pub mod convert;
mod error;
mod exec;
pub mod mbarrier;
mod rng;
pub mod smem;
mod sync;
pub mod tcgen05;
pub mod tensor_map;
pub mod wgmma;

pub use error::{ErrorKind, ModelError};
pub use exec::{launch, Arch, Completion, LaunchConfig, RunStats, Schedule, TmemPlacement};

/// Special registers (PTX ISA 9.0 §10) and `trap`.
pub mod sreg {
    pub use crate::sync::{
        cluster_ctarank, cluster_nctarank, clusterid_x, ctaid_x, globaltimer, lane_id, nclusterid_x, nctaid_x, ntid_x,
        tid_x, trap, warp_id,
    };
}

/// CTA-level named barriers (`bar.sync`, PTX ISA 9.0 §9.7.13.1), and the grid-dependency controls
/// (`griddepcontrol`, "Parallel Synchronization and Communication Instructions: griddepcontrol").
pub mod barrier {
    pub use crate::sync::{
        bar_arrive as arrive, bar_sync as sync, bar_sync_all as sync_all,
        griddepcontrol_launch_dependents as grid_launch_dependents, griddepcontrol_wait as grid_dependency_wait,
    };
}

/// Cluster barrier and distributed shared memory addresses (PTX ISA 9.0 §9.7.13.3, §9.7.9.23).
pub mod cluster {
    pub use crate::sync::{cluster_arrive as arrive, cluster_sync as sync, cluster_wait as wait, map_shared};
}

/// Fences: recorded in [`RunStats::fences`]; `fence.mbarrier_init` also makes the thread's
/// initialized barriers usable by asynchronous operations and other CTAs, and
/// `fence.proxy.async` its `st.shared`s readable by asynchronous operations of the threads a
/// later release reaches.
pub mod fence {
    pub use crate::sync::{
        fence_mbarrier_init as mbarrier_init, fence_proxy_async as proxy_async,
        tcgen05_fence_after_thread_sync as tcgen05_after_thread_sync,
        tcgen05_fence_before_thread_sync as tcgen05_before_thread_sync,
    };
}

/// Warp collectives (PTX ISA 9.0 §9.7.13.14 `elect.sync`, §9.7.13.2 `bar.warp.sync`, §9.7.9.6
/// `shfl.sync`) and register reallocation (§9.7.19.9 `setmaxnreg`).
pub mod warp {
    pub use crate::sync::{
        elect_one, elect_sync, setmaxnreg_dec, setmaxnreg_inc, shfl_idx, shfl_up_down, shfl_xor, warp_sync as sync,
    };
}

/// TMA tensor copies and bulk copies global → shared (PTX ISA 9.0 §9.7.9.25), asynchronous.
pub mod tma {
    pub use crate::asyncop::{
        load_1d, load_1d_hint, load_2d, load_2d_hint, load_2d_multicast, load_3d_hint, load_3d_multicast,
    };
    pub use crate::sync::{acquire_tensormap, prefetch_tensormap};
}
