//! A fixed chain of kernel launches as one CUDA graph (`cuGraphCreate`, `cuGraphAddKernelNode`,
//! `cuGraphInstantiateWithFlags`, `cuGraphLaunch`): one driver call per replay instead of one per
//! kernel. Kernel nodes copy their parameter values when added, so a graph serves every call whose
//! parameters are the same (a plan's are: they hold the addresses of its own tables).

use crate::driver::launch::{LaunchGeometry, Params, Start};
use crate::driver::module::Kernel;
use crate::error::{Error, Result};
use cudarc::driver::{sys, CudaStream};
use std::ffi::c_void;

/// An instantiated graph of kernels that run one after the other.
pub struct KernelChain {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

// SAFETY: the driver's graph handles may be used from any thread; a `KernelChain` is only launched
// through `&mut` owners (one launch at a time) and destroyed once.
unsafe impl Send for KernelChain {}

fn check(what: &'static str, r: sys::CUresult) -> Result<()> {
    r.result().map_err(|e| Error::driver(what, e))
}

impl KernelChain {
    /// A graph of `kernels` in order, each after the previous one (with [`Start::Early`], through
    /// a programmatic edge: it may start once the previous kernel's CTAs have all executed
    /// `griddepcontrol.launch_dependents` or exited), each taking one parameter struct `P` by
    /// value (its bytes in [`Params`]). Only kernels without clusters (`geometry.cluster == 1`).
    ///
    /// # Safety
    /// Each function must take exactly the one parameter struct whose bytes it is given; the
    /// addresses in the parameters
    /// must stay valid for every launch of the chain; a kernel marked [`Start::Early`] must wait
    /// (`griddepcontrol.wait`) before it reads what the previous one writes.
    pub unsafe fn new(kernels: &[(&Kernel, LaunchGeometry, Start, Params)]) -> Result<KernelChain> {
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        check("creating a graph", unsafe { sys::cuGraphCreate(&mut graph, 0) })?;
        let mut chain = KernelChain { graph, exec: std::ptr::null_mut() };
        let mut previous: Option<sys::CUgraphNode> = None;
        for (f, geometry, start, params) in kernels {
            if geometry.cluster != 1 {
                return Err(Error::driver(
                    "adding a kernel node",
                    sys::CUresult::CUDA_ERROR_NOT_SUPPORTED.result().unwrap_err(),
                ));
            }
            let mut args = [params.as_ptr().cast_mut().cast::<c_void>()];
            // SAFETY: zero is a valid bit pattern of the plain-data node parameters.
            let mut node_params: sys::CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
            node_params.func = f.raw();
            node_params.gridDimX = geometry.grid;
            node_params.gridDimY = 1;
            node_params.gridDimZ = 1;
            node_params.blockDimX = geometry.block;
            node_params.blockDimY = 1;
            node_params.blockDimZ = 1;
            node_params.sharedMemBytes = geometry.smem_bytes;
            node_params.kernelParams = args.as_mut_ptr();
            let mut node: sys::CUgraphNode = std::ptr::null_mut();
            // SAFETY: `args` points at the parameter's bytes for the call (the driver copies them).
            check("adding a kernel node", unsafe {
                sys::cuGraphAddKernelNode_v2(&mut node, chain.graph, std::ptr::null(), 0, &node_params)
            })?;
            if let Some(prev) = previous {
                let mut edge = sys::CUgraphEdgeData { from_port: 0, to_port: 0, type_: 0, reserved: [0; 5] };
                if *start == Start::Early {
                    edge.from_port = sys::CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC as u8;
                    edge.type_ = sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8;
                }
                // SAFETY: two nodes of this graph; one edge described by `edge`.
                check("adding a graph edge", unsafe {
                    sys::cuGraphAddDependencies_v2(chain.graph, &prev, &node, &edge, 1)
                })?;
            }
            previous = Some(node);
        }
        // SAFETY: out-pointer to the chain's field; the graph is complete.
        check("instantiating a graph", unsafe { sys::cuGraphInstantiateWithFlags(&mut chain.exec, chain.graph, 0) })?;
        Ok(chain)
    }

    /// Launches the chain on `stream`.
    ///
    /// # Safety
    /// The parameters' addresses must be valid (the contract of [`KernelChain::new`]).
    pub unsafe fn launch(&mut self, stream: &CudaStream) -> Result<()> {
        // SAFETY: an instantiated graph and a live stream.
        check("launching a graph", unsafe { sys::cuGraphLaunch(self.exec, stream.cu_stream()) })
    }
}

impl Drop for KernelChain {
    fn drop(&mut self) {
        // SAFETY: handles created by `new`, destroyed once; errors cannot be reported from drop.
        unsafe {
            if !self.exec.is_null() {
                let _ = sys::cuGraphExecDestroy(self.exec);
            }
            let _ = sys::cuGraphDestroy(self.graph);
        }
    }
}

/// True when `stream` is being captured into a graph (then kernels are launched one by one, so
/// that they become part of the caller's graph).
pub fn is_capturing(stream: &CudaStream) -> Result<bool> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: out-pointer to a local; a live stream.
    check("querying the stream's capture status", unsafe {
        sys::cuStreamIsCapturing(stream.cu_stream(), &mut status)
    })?;
    Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}
