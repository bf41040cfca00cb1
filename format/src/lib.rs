//! NVFP4 on the CPU: everything the grouped GEMM library needs on the host side except the
//! device itself.
//!
//! * [`codec`]: e2m1 (values) and e4m3fn (block scales) encode / decode, packing two e2m1 codes
//!   per byte (element `2j` in the LOW nibble of byte `j`), and correctly rounded `f64 → f16 / bf16`.
//! * [`layout`]: block scales in the plain `[rows, K/16]` layout and the 128x4 blocked layout the
//!   device consumes (the offset formula is [`nvfp4_gemm_abi::scale_layout`]'s), and how the
//!   competition's "reordered" tensor relates to it.
//! * [`Nvfp4Matrix`]: packed values + blocked scales + fp32 global scale, with dequantization.
//! * [`quantize()`]: NVIDIA's two-level recipe (global scale `amax / (6·448)`, e4m3 block scales per
//!   16 values, e2m1 values, round to nearest even), for `f32`, `f64`, `f16` and `bf16` input.
//! * [`generate`]: seeded inputs, the competition's distribution and a full-range one.
//! * [`reference`](mod@reference): the CPU reference grouped GEMM `C_g = alpha_g · A_g · B_gᵀ` (exact products,
//!   `f64` accumulation, one rounding to fp16 or bf16), parallel with rayon.
//! * [`checkpoint`]: MoE expert weights from ModelOpt and compressed-tensors safetensors
//!   checkpoints, each scale convention named, prepared once at load (docs/checkpoints.md).
//! * [`moe_block`]: the fp64 reference of a whole MoE expert block (routing, W13, activation, W2,
//!   weighted combine), quantizing and rounding where the block does (docs/moe-block.md).
//! * [`compare()`]: `|got − ref| ≤ atol + rtol·|ref|` per element, the worst element and the
//!   normalized error `‖got − ref‖ / ‖ref‖`.
//!
//! # Example
//!
//! Quantize two small matrices, run the reference and compare a (here: simulated) result:
//!
//! ```
//! use nvfp4_format::{compare, quantize, reference_grouped_gemm, Group, SplitMix64, Tolerance};
//!
//! let (m, n, k) = (8, 16, 128);
//! let mut rng = SplitMix64::new(42);
//! let a: Vec<f32> = (0..m * k).map(|_| rng.normal() as f32).collect();
//! let b: Vec<f32> = (0..n * k).map(|_| rng.normal() as f32).collect();
//!
//! let qa = quantize(&a, m, k)?;
//! let qb = quantize(&b, n, k)?;
//! assert_eq!(qa.values().len(), m * k / 2); // two e2m1 values per byte
//! // e4m3 scales, one per 16 values: 8 scale columns = two 128x4 blocks (rows zero-padded to 128).
//! assert_eq!(qa.scales().len(), 2 * 512);
//!
//! // alpha = 1: the reference multiplies by both global scales itself.
//! let groups = vec![Group::new(qa, qb, 1.0)?];
//! let reference = reference_grouped_gemm(&groups)?;
//! assert_eq!((reference[0].rows, reference[0].cols), (m, n));
//!
//! // A kernel's fp16 output (one `Vec<f16>` per group, row-major) would go here.
//! let mut got: Vec<Vec<half::f16>> = reference.iter().map(|c| c.data.clone()).collect();
//! let report = compare(&got, &reference, Tolerance::COMPETITION)?;
//! assert!(report.passed(), "{report}");
//! got[0][5] = half::f16::NAN;
//! let report = compare(&got, &reference, Tolerance::COMPETITION)?;
//! assert!(!report.passed());
//! println!("{report}"); // FAIL: 1/128 elements outside ...; worst: group 0 row 0 col 5: got NaN ...
//!
//! // The quantized product approximates the f32 product.
//! let exact: f32 = (0..k).map(|c| a[c] * b[c]).sum();
//! let approx = reference[0].get(0, 0).to_f32();
//! assert!((exact - approx).abs() < 0.25 * (k as f32).sqrt());
//! # Ok::<(), nvfp4_format::FormatError>(())
//! ```
//!
//! # Which fp8 / fp4 code, and why
//!
//! Encoding uses two small crates rather than hand-written code: [`float8`] (0.7; `F8E4M3`, a
//! port of NVIDIA's `cuda_fp8.hpp` host conversion with finite saturation, depending only on
//! `half`) for e4m3fn, and [`float4`] (0.2; `F4E2M1`, a port of `cuda_fp4.hpp`, no dependencies)
//! for e2m1. Both were checked against an independent oracle (a brute-force nearest-value search
//! over the values defined from the bit layouts, ties to the even code, saturating) on every
//! `f16` and `bf16` value, every midpoint between neighbouring codes and the `f32` ulps around it,
//! both signs, zeros, subnormals, ±∞ and NaN; and, against an oracle that counts the midpoints
//! passed, on all 2^32 `f32` inputs (two `#[ignore]`d tests:
//! `cargo test -p nvfp4-format --release -- --ignored`). They agree everywhere. Those checks are
//! this crate's tests (`codec::tests`), so a regression in either crate fails them. Neither crate
//! has the 128x4 layout, NVFP4 matrices or a quantizer, which are written here. Decoding uses 16-
//! and 256-entry tables (the latter built at compile time by `float8`).
//!
//! `half` is used for the `f16` / `bf16` types, but not for rounding `f64` results: its
//! `f16::from_f64` goes through `f32` on F16C CPUs (two roundings) and its `bf16::from_f64` ignores
//! the low 32 mantissa bits, so [`codec::f64_to_f16`] and [`codec::f64_to_bf16`] are written here
//! (one rounding, tested against a brute-force oracle).

pub mod checkpoint;
pub mod codec;
pub mod compare;
pub mod error;
pub mod generate;
pub mod layout;
pub mod matrix;
pub mod moe_block;
pub mod quantize;
pub mod reference;
pub mod rng;

pub use codec::HostFloat;
pub use compare::{compare, Comparison, Element, Tolerance};
pub use error::FormatError;
pub use generate::{random_groups, random_matrix, GroupShape, InputDistribution};
pub use matrix::Nvfp4Matrix;
pub use quantize::{global_scale_for_amax, quantize, quantize_with_global_scale};
pub use reference::{
    reference_grouped_gemm, reference_grouped_gemm_as, reference_grouped_gemm_bf16, reference_grouped_gemm_f64, Group,
    GroupOutput, GEMM_K_MULTIPLE,
};
pub use rng::SplitMix64;
