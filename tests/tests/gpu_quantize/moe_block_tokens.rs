//! The MoE block's own kernels on the GPU (`Quantizer::quantize_grouped_gather_views`,
//! `Quantizer::activate_grouped_views`) against the CPU, bit for bit: gathers of repeated and
//! permuted tokens with and without the router weight, every activation gated and not, f16 and
//! bf16, W4A4 (the CPU quantizer of the CPU rows, one global scale or one per group) and W4A16
//! (the rows), a contiguous layout with an empty group, a one-row group and rows of no group, and
//! a masked one; the activation also on enough rows for its one-thread-per-block kernel. Outputs
//! are poisoned first; bytes of no group's rows must still be poison.

use super::{cpu_quantize, GUARD_BYTE};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use nvfp4_format::SplitMix64;
use nvfp4_gemm::moe::GroupRows;
use nvfp4_gemm::moe_block::{BlockOutput, GatherInputs, GlobalScale, KernelActivation as Activation};
use nvfp4_gemm::problem::BufferView;
use nvfp4_gemm::quantize::Quantizer;
use nvfp4_gemm::{MoeProblem, OutputType, TokenLayout};
use nvfp4_gemm_abi::moe::block::activate_parts;
use nvfp4_gemm_abi::quantize::half_to_f64;
use nvfp4_gemm_abi::scale_layout::{blocked_offset, rest_k};
use nvfp4_gemm_tests::require_any_gpu;
use std::sync::Arc;

const POISON: u8 = 0xA5;

/// Device copies of host bytes, kept alive for the test.
struct Buffers {
    stream: Arc<CudaStream>,
    held: Vec<CudaSlice<u8>>,
}

impl Buffers {
    /// A device copy of `bytes` (at least 16), as a view of `len` elements, and its index.
    fn put(&mut self, bytes: &[u8], len: usize) -> (BufferView, usize) {
        let mut host = bytes.to_vec();
        host.resize(bytes.len().max(16), GUARD_BYTE);
        let buf = self.stream.clone_htod(&host).unwrap();
        let ptr = buf.device_ptr(&self.stream).0;
        self.held.push(buf);
        (BufferView { ptr, len }, self.held.len() - 1)
    }

    fn get(&self, i: usize, len: usize) -> Vec<u8> {
        self.stream.synchronize().unwrap();
        self.stream.clone_dtoh(&self.held[i]).unwrap()[..len].to_vec()
    }
}

fn round(v: f64, bf16: bool) -> u16 {
    if bf16 {
        nvfp4_format::codec::f64_to_bf16(v).to_bits()
    } else {
        nvfp4_format::codec::f64_to_f16(v).to_bits()
    }
}

fn halves(rng: &mut SplitMix64, len: usize, scale: f64, bf16: bool) -> Vec<u16> {
    (0..len)
        .map(|_| match rng.below(16) {
            0 => 0,
            1 => 0x8000,
            2 => round(1000.0 * scale * rng.normal(), bf16),
            _ => round(scale * rng.normal(), bf16),
        })
        .collect()
}

fn bytes16(v: &[u16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn bytes32<T: Copy>(v: &[T], f: impl Fn(T) -> [u8; 4]) -> Vec<u8> {
    v.iter().flat_map(|&x| f(x)).collect()
}

/// Global scales that differ from group to group, around `s`.
fn per_group(s: f32, groups: usize) -> Vec<f32> {
    (0..groups).map(|g| s * (1.0 + 0.37 * g as f32)).collect()
}

/// The expected output bytes: W4A4 `(values, scales)` of each group's rows quantized by the CPU
/// (with the group's global scale),
/// W4A16 `(rows, [])`; bytes of no group's rows poison.
fn expected(
    p: &MoeProblem,
    groups: &[GroupRows],
    want: &dyn Fn(usize) -> Vec<u16>,
    g: Option<&[f32]>,
    bf16: bool,
) -> (Vec<u8>, Vec<u8>) {
    let (k, rows) = (p.k(), p.token_rows());
    match g {
        Some(g) => {
            let a = p.a_sizes();
            let (mut v, mut s) = (vec![POISON; a.values], vec![POISON; a.scales]);
            let rk = rest_k(k as u32);
            for (group, gr) in groups.iter().enumerate().filter(|(_, gr)| gr.rows > 0) {
                let (first, m) = (gr.first as usize, gr.rows as usize);
                let bits: Vec<u16> = (first..first + m).flat_map(want).collect();
                let q = cpu_quantize(&bits, m, k, if g.len() == 1 { g[0] } else { g[group] }, bf16);
                v[first * k / 2..(first + m) * k / 2].copy_from_slice(q.values());
                for i in 0..m as u32 {
                    for j in 0..(k / 16) as u32 {
                        s[blocked_offset(gr.scale_first + i, j, rk)] = q.scales()[blocked_offset(i, j, rk)];
                    }
                }
            }
            (v, s)
        }
        None => {
            let mut v = vec![POISON; 2 * rows * k];
            for gr in groups {
                for r in gr.first as usize..(gr.first + gr.rows) as usize {
                    v[2 * r * k..2 * (r + 1) * k].copy_from_slice(&bytes16(&want(r)));
                }
            }
            (v, vec![])
        }
    }
}

fn layouts(k: usize) -> Vec<(MoeProblem, Vec<u32>)> {
    vec![
        (
            MoeProblem::new(4, 64, k, TokenLayout::Contiguous { max_tokens: 300 }, OutputType::Bf16).unwrap(),
            vec![3, 3, 140, 141, 290],
        ),
        (MoeProblem::new(3, 64, k, TokenLayout::Masked { max_rows: 40 }, OutputType::Bf16).unwrap(), vec![40, 0, 17]),
    ]
}

/// Runs one call's outputs poisoned and compares; returns a failure line or `None`.
fn compare(b: &Buffers, out: (usize, usize), want: &(Vec<u8>, Vec<u8>), what: &str) -> Option<String> {
    let got = b.get(out.0, want.0.len());
    if let Some(i) = got.iter().zip(&want.0).position(|(a, w)| a != w) {
        return Some(format!("{what}: output byte {i}: got {:#04x}, want {:#04x}", got[i], want.0[i]));
    }
    let got = b.get(out.1, want.1.len());
    if let Some(i) = got.iter().zip(&want.1).position(|(a, w)| a != w) {
        return Some(format!("{what}: scale byte {i}: got {:#04x}, want {:#04x}", got[i], want.1[i]));
    }
    None
}

/// Allocates the poisoned outputs of a call and its `BlockOutput`: W4A4 with one global scale
/// (`g` of length 1) or one per group (uploaded), W4A16 for `None`.
fn outputs(b: &mut Buffers, p: &MoeProblem, g: Option<&[f32]>) -> (BlockOutput, (usize, usize)) {
    match g {
        Some(g) => {
            let a = p.a_sizes();
            let (values, iv) = b.put(&vec![POISON; a.values], a.values);
            let (scales, is) = b.put(&vec![POISON; a.scales], a.scales);
            let global_scale = match g {
                [one] => GlobalScale::Tensor(*one),
                each => GlobalScale::PerGroup(b.put(&bytes32(each, f32::to_le_bytes), each.len()).0),
            };
            (BlockOutput::Nvfp4 { values, scales, global_scale, workspace: None }, (iv, is))
        }
        None => {
            let n = p.token_rows() * p.k();
            let (dense, i) = b.put(&vec![POISON; 2 * n], n);
            (BlockOutput::Dense(dense), (i, i))
        }
    }
}

#[test]
#[ignore = "needs an sm_90a or sm_100a GPU"]
fn gpu_moe_gather_quantize_matches_cpu() {
    let gpu = require_any_gpu();
    let stream = gpu.context().default_stream();
    let q = Quantizer::new(&gpu).unwrap();
    let mut b = Buffers { stream: stream.clone(), held: vec![] };
    let mut rng = SplitMix64::new(0x6A7E);
    let mut failures = vec![];
    for (p, sizes) in layouts(256) {
        let (groups, _) = p.group_rows(&sizes).unwrap();
        let (rows, k) = (p.token_rows(), p.k());
        for bf16 in [false, true] {
            for weighted in [false, true] {
                for g in [Some(vec![0.37f32]), Some(per_group(0.37, p.groups())), None] {
                    let g = g.as_deref();
                    let tokens = 1 + rng.below(rows as u64) as usize;
                    let x = halves(&mut rng, tokens * k, 1.0, bf16);
                    let mut row_token: Vec<u32> = (0..rows).map(|_| rng.below(tokens as u64) as u32).collect();
                    row_token[rows / 2] = tokens as u32 + 3; // reads zeros
                    let row_weight: Vec<f32> = (0..rows).map(|_| rng.next_f64() as f32 * 1.5 - 0.25).collect();
                    let want =
                        |r: usize| -> Vec<u16> {
                            let t = row_token[r] as usize;
                            if t >= tokens {
                                return vec![0; k];
                            }
                            x[t * k..(t + 1) * k]
                                .iter()
                                .map(|&v| {
                                    if weighted {
                                        round(half_to_f64(v, bf16) * row_weight[r] as f64, bf16)
                                    } else {
                                        v
                                    }
                                })
                                .collect()
                        };
                    let inputs = GatherInputs {
                        x: b.put(&bytes16(&x), tokens * k).0,
                        tokens,
                        row_token: Some(b.put(&bytes32(&row_token, u32::to_le_bytes), rows).0),
                        row_weight: weighted.then(|| b.put(&bytes32(&row_weight, f32::to_le_bytes), rows).0),
                        sizes: b.put(&bytes32(&sizes, u32::to_le_bytes), sizes.len()).0,
                    };
                    let (out, idx) = outputs(&mut b, &p, g);
                    // SAFETY: every view is a live device buffer of its length.
                    unsafe { q.quantize_grouped_gather_views(&stream, &p, bf16, &inputs, out) }.unwrap();
                    let what = format!("{:?} bf16={bf16} weighted={weighted} global={g:?} tokens={tokens}", p.layout());
                    let line = compare(&b, idx, &expected(&p, &groups, &want, g, bf16), &what);
                    println!("CASE {what}: {}", line.as_deref().unwrap_or("ok"));
                    failures.extend(line);
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
#[ignore = "needs an sm_90a or sm_100a GPU"]
fn gpu_moe_activate_matches_cpu() {
    let gpu = require_any_gpu();
    let stream = gpu.context().default_stream();
    let q = Quantizer::new(&gpu).unwrap();
    let mut b = Buffers { stream: stream.clone(), held: vec![] };
    let mut rng = SplitMix64::new(0xAC7);
    let mut failures = vec![];
    // Few blocks of 16 outputs (`moe_activate`), then many (`moe_activate_blocks` under W4A4:
    // 1,100 rows of 256 blocks), the latter in half the W4A4 combinations.
    let mut cases: Vec<_> = layouts(192).into_iter().map(|l| (l, false)).collect();
    let many = MoeProblem::new(4, 64, 4096, TokenLayout::Contiguous { max_tokens: 1100 }, OutputType::Bf16).unwrap();
    cases.push(((many, vec![5, 5, 400, 401, 1090]), true));
    for ((p, sizes), whole_blocks) in cases {
        let (groups, _) = p.group_rows(&sizes).unwrap();
        let (rows, inter) = (p.token_rows(), p.k());
        for act in [Activation::Silu, Activation::GeluTanh, Activation::Relu2] {
            for gated in [true, false] {
                for bf16 in [false, true] {
                    if whole_blocks && gated == bf16 {
                        continue;
                    }
                    for g in [Some(vec![0.05f32]), Some(per_group(0.05, p.groups())), None] {
                        let parts = activate_parts(rows as u32, inter as u32, g.is_some());
                        if whole_blocks && parts != 1 {
                            continue;
                        }
                        assert_eq!(parts == 1, whole_blocks, "{rows} rows of {inter}: {parts} threads per block");
                        let g = g.as_deref();
                        let n1 = if gated { 2 * inter } else { inter };
                        let h = halves(&mut rng, rows * n1, 3.0, bf16);
                        let want = |r: usize| -> Vec<u16> {
                            (0..inter)
                                .map(|j| {
                                    let a = act.apply(half_to_f64(h[r * n1 + j], bf16) as f32);
                                    let z = if gated { a * half_to_f64(h[r * n1 + inter + j], bf16) } else { a };
                                    round(z, bf16)
                                })
                                .collect()
                        };
                        let hv = b.put(&bytes16(&h), rows * n1).0;
                        let sv = b.put(&bytes32(&sizes, u32::to_le_bytes), sizes.len()).0;
                        let (out, idx) = outputs(&mut b, &p, g);
                        // SAFETY: every view is a live device buffer of its length.
                        unsafe { q.activate_grouped_views(&stream, &p, act, gated, bf16, hv, sv, out, usize::MAX) }
                            .unwrap();
                        let what =
                            format!("{:?} {act:?} gated={gated} bf16={bf16} global={g:?} parts={parts}", p.layout());
                        let line = compare(&b, idx, &expected(&p, &groups, &want, g, bf16), &what);
                        println!("CASE {what}: {}", line.as_deref().unwrap_or("ok"));
                        failures.extend(line);
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
