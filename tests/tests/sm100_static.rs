//! Static checks of the committed sm_100a PTX (`host/kernels/sm_100a.ptx`, written by
//! `cargo xtask build-ptx`), on the CPU: there is no B200 to run the kernels on, so this is what
//! can be asserted without one.
//!
//! For each GEMM entry point: the module targets PTX ISA 8.7 / sm_100a; every instruction family
//! the kernel needs is present (block-scaled MMA, scale copies, commits, TMEM loads and waits,
//! alloc/dealloc, TMA tensor and bulk copies, mbarrier waits, fences); the cluster variant also
//! multicasts A and commits across the cluster; the kernel uses no local memory and calls no
//! function (a surviving bounds check would be a call to a panic routine); and the immediates the
//! abi crate encodes (instruction descriptor, descriptor high bits, barrier offsets) appear.

use nvfp4_gemm_abi::sm100::params::{KernelLayout, KERNELS};

const PTX: &str = include_str!("../../host/kernels/sm_100a.ptx");

/// The text of `.entry name` up to the next `.entry`/`.func` header (asm blocks contain `}` in
/// column 0, so the first closing brace is not the end of the function).
fn entry(name: &str) -> &'static str {
    let header = format!(".entry {name}(");
    let start = PTX.find(&header).unwrap_or_else(|| panic!("no .entry {name} in sm_100a.ptx"));
    let rest = &PTX[start + header.len()..];
    let end = [rest.find(".entry "), rest.find(".func ")].into_iter().flatten().min().unwrap_or(rest.len());
    &rest[..end]
}

/// Instruction lines (not comments) of an entry.
fn instructions(body: &str) -> impl Iterator<Item = &str> {
    body.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with("//"))
}

fn count(body: &str, opcode_prefix: &str) -> usize {
    instructions(body).filter(|l| l.starts_with(opcode_prefix)).count()
}

fn assert_has(kernel: &KernelLayout, body: &str, opcode_prefix: &str, at_least: usize) {
    let n = count(body, opcode_prefix);
    assert!(
        n >= at_least,
        "{}: `{opcode_prefix}` appears {n} times, expected at least {at_least}",
        kernel.kernel_name()
    );
}

#[test]
fn module_targets_ptx_8_7_and_sm_100a() {
    let head: Vec<&str> = PTX.lines().map(str::trim).filter(|l| l.starts_with('.')).take(3).collect();
    assert_eq!(head, [".version 8.7", ".target sm_100a", ".address_size 64"]);
}

#[test]
fn every_variant_has_an_entry_point() {
    for k in KERNELS {
        assert!(!entry(k.kernel_name()).is_empty());
    }
}

#[test]
fn gemm_entries_contain_the_tcgen05_pipeline() {
    for k in KERNELS {
        let body = entry(k.kernel_name());
        // Main loop: 4 K=64 MMAs per stage (unrolled), and per step one SFA copy plus one SFB copy
        // per 128 rows of B.
        assert_eq!(
            count(body, "tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.scale_vec::4X "),
            4,
            "{}",
            k.kernel_name()
        );
        assert_eq!(
            count(body, "tcgen05.cp.cta_group::1.32x128b.warpx4 "),
            4 * (1 + k.config().tmem_plan().sfb_blocks() as usize),
            "{}",
            k.kernel_name()
        );
        assert_has(&k, body, "tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 ", 2);
        // Epilogue.
        assert_has(&k, body, "tcgen05.ld.sync.aligned.16x256b.x16.b32 ", 1);
        assert_eq!(count(body, "tcgen05.ld."), count(body, "tcgen05.wait::ld.sync.aligned;"), "{}", k.kernel_name());
        // TMEM lifetime.
        assert_eq!(count(body, "tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 "), 1);
        assert_eq!(count(body, "tcgen05.dealloc.cta_group::1.sync.aligned.b32 "), 1);
        assert_eq!(count(body, "tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;"), 1);
        assert_has(&k, body, "tcgen05.fence::before_thread_sync;", 2);
        assert_has(&k, body, "tcgen05.fence::after_thread_sync;", 3);
        // Producers: tensor boxes for both map ranks, scale bulk copies, with L2 hints.
        assert_has(&k, body, "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.", 1);
        assert_has(&k, body, "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.", 1);
        assert_has(&k, body, "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint ", 2);
        assert_has(&k, body, "mbarrier.arrive.expect_tx.shared::cta.b64 ", 2);
        assert_has(&k, body, "mbarrier.try_wait.parity.shared::cta.b64 ", 4);
        assert_has(&k, body, "mbarrier.init.shared::cta.b64 ", 4);
        assert_has(&k, body, "fence.mbarrier_init.release.cluster;", 1);
        // Roles: one elected lane per single-thread role, each followed by a warp reconvergence.
        assert_eq!(count(body, "elect.sync "), 3, "{}", k.kernel_name());
        assert_eq!(count(body, "bar.warp.sync "), 3, "{}", k.kernel_name());
        assert_eq!(count(body, "bar.sync "), 2, "{}", k.kernel_name());
    }
}

#[test]
fn only_the_cluster_variant_multicasts() {
    for k in KERNELS {
        let body = entry(k.kernel_name());
        let clustered = k.config().multicast_a();
        let multicast_loads = count(body, "cp.async.bulk.tensor.")
            - instructions(body).filter(|l| l.starts_with("cp.async.bulk.tensor.") && !l.contains("multicast")).count();
        let multicast_commits =
            count(body, "tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.multicast::cluster.b64 ");
        let cluster_barriers = count(body, "barrier.cluster.arrive.release.aligned;");
        if clustered {
            // 2D and 3D multicast of A by rank 0; the MMA completion commit to rank 0; cluster
            // barriers after setup and before exit; remote addresses through mapa.
            assert_eq!(multicast_loads, 2, "{}", k.kernel_name());
            assert_eq!(multicast_commits, 1, "{}", k.kernel_name());
            assert_eq!(cluster_barriers, 2, "{}", k.kernel_name());
            assert_has(&k, body, "mapa.shared::cluster.u32 ", 2);
            assert_has(&k, body, "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 ", 1);
        } else {
            assert_eq!((multicast_loads, multicast_commits, cluster_barriers), (0, 0, 0), "{}", k.kernel_name());
        }
    }
}

#[test]
fn no_local_memory_and_no_calls() {
    for k in KERNELS {
        let body = entry(k.kernel_name());
        assert!(!body.contains(".local"), "{} uses local memory", k.kernel_name());
        assert!(!body.contains("__local_depot"), "{} has a stack frame", k.kernel_name());
        assert_eq!(count(body, "call"), 0, "{} calls a function (panic path?)", k.kernel_name());
    }
}

/// The abi's encodings reach the PTX as immediates: instruction descriptor, the high bits of the
/// operand and scale descriptors, the accumulator barrier offsets and the TMEM allocation.
#[test]
fn abi_constants_appear_as_immediates() {
    for k in KERNELS {
        let body = entry(k.kernel_name());
        let idesc = k.config().instr_descriptor().to_bits();
        assert!(body.contains(&format!(", {idesc};")), "{}: idesc {idesc:#x}", k.kernel_name());
        // (addr >> 4) | 0x4000_4040_0000_0000 and | 0x0000_4008_0000_0000 (docs/sm100.md §2).
        assert!(body.contains(&format!("{}", 0x4000_4040_0000_0000u64)), "{}", k.kernel_name());
        assert!(body.contains(&format!("{}", 0x0000_4008_0000_0000u64)), "{}", k.kernel_name());
        for offset in [k.config().accumulator_full_barrier_offset(), k.config().accumulator_empty_barrier_offset()] {
            assert!(body.contains(&format!("{offset}")), "{}: barrier offset {offset}", k.kernel_name());
        }
        assert!(body.contains(&format!("{}", k.config().tmem_allocated_columns())), "{}", k.kernel_name());
    }
}

#[test]
fn early_kernels_wait_before_they_branch_or_touch_memory() {
    const { assert!(nvfp4_gemm_abi::moe::STARTS_EARLY) };
    for name in nvfp4_gemm_abi::moe::EARLY_KERNELS {
        nvfp4_gemm_tests::ptx_text::waits_then_releases(PTX, name).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}
