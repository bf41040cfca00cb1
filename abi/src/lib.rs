//! Code shared by the device kernels (`kernel/`, nvptx64) and the host library (`host/`).
//!
//! Everything here is `no_std`, free of `unsafe`, and target-agnostic, so that every encoding the
//! GPU depends on is a plain function that `cargo test` checks on the host.
//!
//! Invariant: a value that crosses the host/device boundary (kernel parameters, work-list entries,
//! descriptors) is defined once, here, with `#[repr(C)]` and a size assertion.
#![no_std]

pub mod launch;
pub mod moe;
pub mod moe_block;
pub mod quantize;
pub mod scale_layout;
pub mod sm100;
pub mod sm90;
pub mod tensor_map;
pub mod work;
