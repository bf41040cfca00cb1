//! A device buffer between guard bytes, for GPU tests that must show a kernel writes its output
//! and nothing around it: the body is poisoned before each run, the guards must stay as written.

use cudarc::driver::{CudaSlice, CudaStream, CudaViewMut, DevicePtr};
use nvfp4_gemm::problem::BufferView;
use std::sync::Arc;

/// Guard bytes before and after the body (a multiple of 16, so the body stays 16-byte aligned).
pub const GUARD: usize = 256;
/// What the guards hold.
pub const GUARD_BYTE: u8 = 0xE7;
/// Two poisons for two runs, so that a byte left unwritten cannot pass by luck.
pub const POISONS: [u8; 2] = [0xA5, 0x5A];

/// `len` bytes of device memory between [`GUARD`]-byte guards.
pub struct Guarded {
    buf: CudaSlice<u8>,
    len: usize,
}

impl Guarded {
    /// A zeroed body and zeroed guards (write them with [`Guarded::poison`] or [`Guarded::input`]).
    pub fn new(stream: &Arc<CudaStream>, len: usize) -> Guarded {
        Guarded { buf: stream.alloc_zeros::<u8>(len + 2 * GUARD).unwrap(), len }
    }

    /// A guarded copy of `bytes` (an input whose neighbours a kernel must not read into outputs).
    pub fn input(stream: &Arc<CudaStream>, bytes: &[u8]) -> Guarded {
        let mut g = Guarded::new(stream, bytes.len());
        let mut host = vec![GUARD_BYTE; bytes.len() + 2 * GUARD];
        host[GUARD..GUARD + bytes.len()].copy_from_slice(bytes);
        stream.memcpy_htod(&host, &mut g.buf).unwrap();
        g
    }

    /// Guards [`GUARD_BYTE`], the body `poison`.
    pub fn poison(&mut self, stream: &Arc<CudaStream>, poison: u8) {
        let mut host = vec![GUARD_BYTE; self.len + 2 * GUARD];
        host[GUARD..GUARD + self.len].fill(poison);
        stream.memcpy_htod(&host, &mut self.buf).unwrap();
    }

    /// The body, as a typed output of a call.
    pub fn body_mut(&mut self) -> CudaViewMut<'_, u8> {
        self.buf.slice_mut(GUARD..GUARD + self.len)
    }

    /// The body as a view of `elements` elements.
    pub fn view(&self, stream: &Arc<CudaStream>, elements: usize) -> BufferView {
        BufferView { ptr: self.buf.device_ptr(stream).0 + GUARD as u64, len: elements }
    }

    /// The body; panics (naming `what`) if a guard byte changed.
    pub fn body(&self, stream: &Arc<CudaStream>, what: &str) -> Vec<u8> {
        let (body, bad) = self.read(stream);
        assert_eq!(bad, 0, "{what}: guard bytes written");
        body
    }

    /// The body, and the number of guard bytes that changed.
    pub fn read(&self, stream: &Arc<CudaStream>) -> (Vec<u8>, usize) {
        let host = stream.clone_dtoh(&self.buf).unwrap();
        let bad = host[..GUARD].iter().chain(&host[GUARD + self.len..]).filter(|&&b| b != GUARD_BYTE).count();
        (host[GUARD..GUARD + self.len].to_vec(), bad)
    }
}
