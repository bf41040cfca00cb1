//! NVFP4 block-scaled grouped GEMM for NVIDIA Hopper (sm_90a) and Blackwell (sm_100a).
#![warn(missing_docs)]

pub mod device;
pub mod driver;
pub mod error;
pub mod smoke;

pub use device::{driver_present, Arch, Gpu};
pub use error::{Error, Result};
