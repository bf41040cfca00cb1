//! Threads, barriers, collectives, mbarriers, bulk copies, deadlock and hazard reports.

use nvfp4_gemm_model::*;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

fn cfg(grid: u32, block: u32, smem: u32) -> LaunchConfig {
    LaunchConfig::new(Arch::Sm90a, grid, block, smem)
}

fn seeds() -> impl Iterator<Item = Schedule> {
    [Completion::InOrder, Completion::Reversed, Completion::Random].into_iter().enumerate().map(|(i, c)| Schedule {
        seed: 7 + i as u64,
        completion: c,
        eager_permille: 100 * i as u32,
        ..Schedule::default()
    })
}

#[test]
fn special_registers_shared_memory_and_bar_sync() {
    let out: Vec<AtomicU32> = (0..2 * 64).map(|_| AtomicU32::new(0)).collect();
    for s in seeds() {
        launch(&cfg(2, 64, 1024).with_schedule(s), || {
            let base = smem::dynamic_base();
            assert_ne!(base, 0, "address 0 must never be a valid shared address");
            let tid = sreg::tid_x();
            smem::st_u32(base + 4 * tid, tid * 10 + sreg::ctaid_x());
            barrier::sync_all();
            let other = smem::ld_u32(base + 4 * ((tid + 1) % 64));
            out[(sreg::ctaid_x() * 64 + tid) as usize].store(other, Relaxed);
            assert_eq!(sreg::warp_id(), tid / 32);
            assert_eq!(sreg::lane_id(), tid % 32);
        })
        .unwrap();
        for cta in 0..2 {
            for t in 0..64 {
                assert_eq!(out[cta * 64 + t].load(Relaxed), ((t as u32 + 1) % 64) * 10 + cta as u32);
            }
        }
    }
}

/// A grid of more threads than the model runs at once (12,288) goes in waves: every CTA runs
/// once, sees its own `%ctaid.x` and the whole grid's `%nctaid.x`, and its CTA barrier and shared
/// memory are its own.
#[test]
fn a_large_grid_runs_in_waves() {
    let (grid, block) = (14u32, 1024u32); // two waves: 12 CTAs, then 2
    let seen: Vec<AtomicU32> = (0..grid).map(|_| AtomicU32::new(0)).collect();
    let stats = launch(&cfg(grid, block, 1024), || {
        let base = smem::dynamic_base();
        let (tid, cta) = (sreg::tid_x(), sreg::ctaid_x());
        assert_eq!(sreg::nctaid_x(), grid);
        if tid == 0 {
            smem::st_u32(base, cta);
        }
        barrier::sync_all();
        assert_eq!(smem::ld_u32(base), cta, "CTA {cta} reads another CTA's shared memory");
        seen[cta as usize].fetch_add(1, Relaxed);
    })
    .unwrap();
    assert!(seen.iter().all(|c| c.load(Relaxed) == block), "{seen:?}");
    assert!(stats.instructions > 0);
}

/// `bar.arrive` does not wait; `bar.sync` on the same barrier waits for the arrivals, and sees
/// the shared-memory stores made before them. Warp 0 produces rounds, warp 1 consumes them, with
/// two barriers in opposite directions (the handshake the sm90 kernels' skewed warpgroups use).
#[test]
fn bar_arrive_releases_bar_sync_in_rounds() {
    let got: Vec<AtomicU32> = (0..8).map(|_| AtomicU32::new(0)).collect();
    for s in seeds() {
        launch(&cfg(1, 64, 1024).with_schedule(s), || {
            let base = smem::dynamic_base();
            let warp = sreg::tid_x() / 32;
            for round in 0..8u32 {
                if warp == 0 {
                    if round > 0 {
                        barrier::sync(2, 64); // warp 1 has read the previous round
                    }
                    smem::st_u32(base + 4 * sreg::lane_id(), round * 100 + sreg::lane_id());
                    barrier::arrive(1, 64);
                } else {
                    barrier::sync(1, 64);
                    let v = smem::ld_u32(base + 4 * sreg::lane_id());
                    if sreg::lane_id() == 3 {
                        got[round as usize].store(v, Relaxed);
                    }
                    barrier::arrive(2, 64);
                }
            }
            if warp == 0 {
                barrier::sync(2, 64);
            }
        })
        .unwrap();
        assert!(got.iter().enumerate().all(|(r, v)| v.load(Relaxed) == r as u32 * 100 + 3), "{got:?}");
    }
}

/// A thread that arrives twice in one phase of a barrier is reported (the hardware would count
/// it twice and release the waiters early), and so is a CTA that exits with arrivals pending.
#[test]
fn bar_arrive_twice_and_unfinished_phases_are_reported() {
    let e = launch(&cfg(1, 64, 1024), || {
        if sreg::tid_x() < 32 {
            barrier::arrive(1, 64);
            barrier::arrive(1, 64);
        } else {
            barrier::sync(1, 64);
        }
    })
    .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Divergence, "{e}");
    assert!(e.message.contains("already arrived"), "{e}");
    let e = launch(&cfg(1, 64, 1024), || {
        if sreg::tid_x() < 32 {
            barrier::arrive(1, 64);
        }
    })
    .unwrap_err();
    assert_eq!(e.kind, ErrorKind::ResourceLeak, "{e}");
    assert!(e.message.contains("named barrier 1"), "{e}");
}

#[test]
fn warp_collectives() {
    let elected = AtomicU32::new(0);
    let sums: Vec<AtomicU32> = (0..64).map(|_| AtomicU32::new(0)).collect();
    launch(&cfg(1, 64, 1024), || {
        if warp::elect_one() {
            elected.fetch_add(1, Relaxed);
        }
        let lane = sreg::lane_id();
        // Butterfly sum over the warp.
        let mut v = lane;
        for m in [16, 8, 4, 2, 1] {
            v += warp::shfl_xor(v, m);
        }
        sums[sreg::tid_x() as usize].store(v, Relaxed);
        assert_eq!(warp::shfl_idx(lane * 3, 5), 15);
        warp::sync(u32::MAX);
    })
    .unwrap();
    assert_eq!(elected.load(Relaxed), 2, "one elected lane per warp");
    assert!(sums.iter().all(|s| s.load(Relaxed) == 496));
}

#[test]
fn divergent_collective_is_reported() {
    let e = launch(&cfg(1, 32, 1024), || {
        if sreg::lane_id() < 16 {
            warp::sync(u32::MAX);
        } else {
            let _ = warp::elect_one();
        }
    })
    .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Divergence, "{e}");
    assert!(e.message.contains("Elect") || e.message.contains("WarpSync"), "{e}");
}

#[test]
fn mbarrier_phases_and_parity() {
    launch(&cfg(1, 32, 1024), || {
        let bar = smem::dynamic_base();
        if sreg::tid_x() == 0 {
            mbarrier::init(bar, 32);
            fence::mbarrier_init();
        }
        barrier::sync_all();
        // A fresh barrier: parity 1 (the phase "before" phase 0) counts as complete.
        assert!(mbarrier::try_wait(bar, 1));
        for round in 0..3u32 {
            mbarrier::arrive(bar);
            while !mbarrier::try_wait(bar, round & 1) {}
        }
    })
    .unwrap();
}

/// A two-stage ring: one producer thread fills stages with bulk copies (transaction bytes), one
/// consumer warp sums them and releases each stage; every completion order gives the same sums.
#[test]
fn producer_consumer_ring_over_mbarriers() {
    const STAGES: u32 = 2;
    const ROUNDS: u32 = 6;
    const BYTES: u32 = 128;
    let src: Vec<u32> = (0..ROUNDS * BYTES / 4).map(|i| i * 7 + 1).collect();
    let src_ptr = src.as_ptr() as u64;
    let sums: Vec<AtomicU32> = (0..ROUNDS).map(|_| AtomicU32::new(0)).collect();
    for s in seeds() {
        for x in &sums {
            x.store(0, Relaxed);
        }
        let stats = launch(&cfg(1, 64, 4096).with_schedule(s), || {
            let base = smem::dynamic_base();
            let full = |s: u32| base + 8 * s;
            let empty = |s: u32| base + 64 + 8 * s;
            let data = |s: u32| base + 1024 + BYTES * s;
            let tid = sreg::tid_x();
            if tid == 0 {
                for s in 0..STAGES {
                    mbarrier::init(full(s), 1);
                    mbarrier::init(empty(s), 32);
                }
                fence::mbarrier_init();
            }
            barrier::sync_all();
            if tid / 32 == 0 {
                if tid == 0 {
                    for r in 0..ROUNDS {
                        let (st, ph) = (r % STAGES, (r / STAGES) & 1);
                        while !mbarrier::try_wait(empty(st), ph ^ 1) {}
                        mbarrier::arrive_expect_tx(full(st), BYTES);
                        unsafe { tma::load_1d(data(st), src_ptr + (r * BYTES) as u64, BYTES, full(st)) };
                    }
                }
            } else {
                let lane = sreg::lane_id();
                for r in 0..ROUNDS {
                    let (st, ph) = (r % STAGES, (r / STAGES) & 1);
                    while !mbarrier::try_wait(full(st), ph) {}
                    let v = smem::ld_u32(data(st) + 4 * lane);
                    sums[r as usize].fetch_add(v, Relaxed);
                    mbarrier::arrive(empty(st));
                }
            }
        })
        .unwrap();
        assert!(stats.async_completed == ROUNDS as u64, "{stats:?}");
        for r in 0..ROUNDS {
            let want: u32 = src[(r * 32) as usize..(r * 32 + 32) as usize].iter().sum();
            assert_eq!(sums[r as usize].load(Relaxed), want, "round {r} with {s:?}");
        }
    }
}

#[test]
fn wrong_parity_deadlocks_with_a_report() {
    let e = launch(&cfg(1, 64, 1024), || {
        let bar = smem::dynamic_base();
        if sreg::tid_x() == 0 {
            mbarrier::init(bar, 1);
            fence::mbarrier_init();
        }
        barrier::sync_all();
        if sreg::tid_x() == 0 {
            mbarrier::arrive(bar);
        }
        // Phase 0 completes with thread 0's arrival; phase 1 never does (nobody arrives again).
        while !mbarrier::try_wait(bar, 0) {}
        while !mbarrier::try_wait(bar, 1) {}
    })
    .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Deadlock, "{e}");
    assert!(e.report.contains("phase 1 (parity 1), pending arrivals 1/1"), "{}", e.report);
    assert!(e.report.contains("warp 0 lanes 0-31: waits in `mbarrier.try_wait"), "{}", e.report);
    assert!(e.report.contains("basics.rs"), "the report names the call site: {}", e.report);
}

#[test]
fn read_before_the_copy_lands_is_a_hazard() {
    let src = vec![1u32; 64];
    let p = src.as_ptr() as u64;
    let e = launch(&cfg(1, 32, 2048), || {
        let base = smem::dynamic_base();
        if sreg::tid_x() == 0 {
            mbarrier::init(base, 1);
            fence::mbarrier_init();
            mbarrier::arrive_expect_tx(base, 256);
            unsafe { tma::load_1d(base + 1024, p, 256, base) };
            // Missing wait.
            let _ = smem::ld_u32(base + 1024 + 16);
        }
    })
    .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Hazard, "{e}");
    assert!(e.message.contains("has not written yet"), "{e}");
    assert!(e.report.contains("in flight:") && e.report.contains("cp.async.bulk"), "{}", e.report);
}

#[test]
fn tx_count_may_go_negative_before_the_expect() {
    let src = vec![3u32; 64];
    let p = src.as_ptr() as u64;
    launch(&cfg(1, 32, 2048).with_schedule(Schedule { eager_permille: 1000, ..Schedule::default() }), || {
        let base = smem::dynamic_base();
        if sreg::tid_x() == 0 {
            mbarrier::init(base, 1);
            fence::mbarrier_init();
            unsafe { tma::load_1d(base + 1024, p, 256, base) };
            // Let the copy land first (eager completion), then announce it.
            let _ = mbarrier::try_wait(base, 1);
            mbarrier::arrive_expect_tx(base, 256);
            while !mbarrier::try_wait(base, 0) {}
            assert_eq!(smem::ld_u32(base + 1024), 3);
        }
    })
    .unwrap();
}

#[test]
fn missing_fence_mbarrier_init_is_reported() {
    let src = vec![0u32; 64];
    let p = src.as_ptr() as u64;
    let e = launch(&cfg(1, 32, 2048), || {
        let base = smem::dynamic_base();
        if sreg::tid_x() == 0 {
            mbarrier::init(base, 1);
            unsafe { tma::load_1d(base + 1024, p, 256, base) };
        }
    })
    .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidOperand);
    assert!(e.message.contains("fence.mbarrier_init"), "{e}");
}

#[test]
fn cluster_barrier_mapa_and_remote_arrive() {
    let seen: Vec<AtomicU32> = (0..4).map(|_| AtomicU32::new(0)).collect();
    for s in seeds() {
        launch(&cfg(4, 64, 1024).with_cluster(2).with_schedule(s), || {
            let bar = smem::dynamic_base();
            let (rank, n) = (sreg::cluster_ctarank(), sreg::cluster_nctarank());
            if sreg::tid_x() == 0 {
                mbarrier::init(bar, 1);
                fence::mbarrier_init();
            }
            cluster::sync();
            if sreg::tid_x() == 0 {
                let remote = cluster::map_shared(bar, (rank + 1) % n);
                assert_ne!(remote, bar);
                mbarrier::arrive_cluster(remote);
            }
            while !mbarrier::try_wait_cluster(bar, 0) {}
            if sreg::tid_x() == 0 {
                seen[sreg::ctaid_x() as usize].store(1 + rank, Relaxed);
            }
            cluster::sync();
        })
        .unwrap();
        assert_eq!(seen.iter().map(|s| s.load(Relaxed)).collect::<Vec<_>>(), [1, 2, 1, 2]);
    }
}

#[test]
fn a_cluster_address_is_not_a_cta_address() {
    let e = launch(&cfg(2, 32, 1024).with_cluster(2), || {
        let a = cluster::map_shared(smem::dynamic_base(), 1);
        let _ = smem::ld_u32(a);
    })
    .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidOperand);
    assert!(e.message.contains(".shared::cluster address"), "{e}");
}

#[test]
fn trap_and_panic_end_the_launch() {
    let e = launch(&cfg(1, 32, 1024), || {
        if sreg::tid_x() == 3 {
            sreg::trap();
        }
        barrier::sync_all();
    })
    .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Trap);
    let e = launch(&cfg(1, 32, 1024), || {
        let x = std::hint::black_box(u32::MAX);
        if sreg::tid_x() == 0 {
            let _ = x.checked_add(1).expect("overflow in the kernel");
        }
    })
    .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Panic);
    assert!(e.message.contains("overflow in the kernel"));
}

/// `setmaxnreg` moves registers within the CTA's pool (what it was launched with): a producer
/// warpgroup giving back 168 − 40 lets two consumer warpgroups rise to 232 (exactly the pool,
/// whatever order they run in), but with the producer at 48 the consumers' 232 exceed the pool
/// and the last `inc` waits forever: a deadlock report, where the GPU hangs.
#[test]
fn setmaxnreg_moves_registers_within_the_cta_pool() {
    let run = |producer: u32, seed: Schedule| {
        let mut c = cfg(1, 384, 1024);
        c.registers = 168;
        c.schedule = seed;
        launch(&c, move || {
            if sreg::tid_x() < 128 {
                if producer == 40 {
                    warp::setmaxnreg_dec(40);
                } else {
                    warp::setmaxnreg_dec(48);
                }
            } else {
                warp::setmaxnreg_inc(232);
            }
        })
    };
    for s in seeds() {
        run(40, s).unwrap();
    }
    let e = run(48, Schedule::default()).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Deadlock, "{e}");
    assert!(e.report.contains("setmaxnreg.inc to 232 registers per thread"), "{}", e.report);
    // A launch with no register count (0) is not checked: the model has nothing to compare with.
    let mut c = cfg(1, 64, 1024);
    c.registers = 0;
    launch(&c, || warp::setmaxnreg_inc(256)).unwrap();
}

/// Programmatic dependent launch: a launch that may start before its predecessor ends must not
/// copy what the predecessor writes before `griddepcontrol.wait`; other memory it may.
#[test]
fn reading_the_predecessors_output_before_griddepcontrol_wait_is_a_hazard() {
    let produced = vec![7u32; 64];
    let other = vec![9u32; 64];
    let (p, q) = (produced.as_ptr() as u64, other.as_ptr() as u64);
    let run = |wait_first: bool| {
        let mut c = cfg(1, 32, 2048);
        c.predecessor_writes = vec![(p, 256)];
        launch(&c, move || {
            let base = smem::dynamic_base();
            if sreg::tid_x() == 0 {
                mbarrier::init(base, 1);
                fence::mbarrier_init();
                mbarrier::arrive_expect_tx(base, 512);
                // Memory the predecessor does not write: fine before the wait.
                unsafe { tma::load_1d(base + 1024, q, 256, base) };
                if wait_first {
                    barrier::grid_dependency_wait();
                }
                unsafe { tma::load_1d(base + 1280, p, 256, base) };
                while !mbarrier::try_wait(base, 0) {}
            }
        })
    };
    run(true).unwrap();
    let e = run(false).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Hazard, "{e}");
    assert!(e.message.contains("before this thread executed griddepcontrol.wait"), "{e}");
}

/// `stmatrix .x4` and `.x4.trans`: lane `l`'s register `j` holds (row `l / 4`, columns `2 (l % 4)`
/// and `+ 1`) of matrix `j`, lane `8 j + i` addresses stored row `i` of matrix `j`; with `.trans`
/// stored row `i` is column `i`. Rows are placed out of order (row `i` of matrix `j` at slot
/// `(7 − i) + 8 j`) so that the addresses, not the lane order, decide where a row lands.
#[test]
fn stmatrix_stores_rows_or_columns_where_the_lanes_point() {
    // Element (j, row, col) of the register matrices: a distinct 16-bit value.
    let elem = |j: u32, row: u32, col: u32| (0x100 * j + 0x10 * row + col) as u16;
    for trans in [false, true] {
        let out: Vec<AtomicU32> = (0..4 * 8 * 4).map(|_| AtomicU32::new(0)).collect();
        for s in seeds() {
            launch(&cfg(1, 32, 1024).with_schedule(s), || {
                let base = smem::dynamic_base();
                let l = sreg::lane_id();
                let (row, c0) = (l / 4, 2 * (l % 4));
                let r: [u32; 4] = std::array::from_fn(|j| {
                    elem(j as u32, row, c0) as u32 | (elem(j as u32, row, c0 + 1) as u32) << 16
                });
                let (j, i) = (l / 8, l % 8);
                smem::stmatrix_x4(base + 16 * ((7 - i) + 8 * j), r, trans);
                // Each lane reads back the slot it addressed.
                let v = smem::ld_v4_u32(base + 16 * ((7 - i) + 8 * j));
                for (w, x) in v.iter().enumerate() {
                    out[(4 * l) as usize + w].store(*x, Relaxed);
                }
            })
            .unwrap();
            for l in 0..32u32 {
                let (j, i) = (l / 8, l % 8);
                for e in 0..8u32 {
                    let word = out[(4 * l + e / 2) as usize].load(Relaxed);
                    let got = (word >> (16 * (e % 2))) as u16;
                    let want = if trans { elem(j, e, i) } else { elem(j, i, e) };
                    assert_eq!(got, want, "trans {trans}, matrix {j}, stored row {i}, element {e}");
                }
            }
        }
    }
}

/// A thread's `st.shared` read or overwritten by another thread, or a thread's `ld.shared`
/// followed by another thread's store to the same bytes, with no barrier between them, is a data
/// race: the model reports it at the second access, whatever the schedule. (The tests order the
/// two accesses in time through a host atomic, which the model's memory ordering does not see.)
/// Ordered by `bar.sync` or by an mbarrier arrival and wait, the same accesses pass.
#[test]
fn shared_memory_races_between_threads_are_reported() {
    // (first access by warp 0, second by warp 1): store then load, load then store.
    for (store_first, what) in [(true, "reads"), (false, "write-after-read")] {
        for s in seeds() {
            let first_done = AtomicU32::new(0);
            let e = launch(&cfg(1, 64, 1024).with_schedule(s), || {
                let base = smem::dynamic_base();
                let tid = sreg::tid_x();
                let access = |store: bool| {
                    if store {
                        smem::st_u32(base, 7);
                    } else {
                        let _ = smem::ld_u32(base);
                    }
                };
                if tid == 0 {
                    access(store_first);
                    first_done.store(1, Relaxed);
                } else if tid == 32 {
                    // A model instruction per poll (a load of a word nobody writes), so that the
                    // scheduler runs warp 0.
                    while first_done.load(Relaxed) == 0 {
                        let _ = smem::ld_u32(base + 512);
                    }
                    access(!store_first);
                }
            })
            .unwrap_err();
            assert_eq!(e.kind, ErrorKind::Hazard, "{e}");
            assert!(e.message.contains("data race") && e.message.contains(what), "{e}");
        }
    }
    // Two warps write the same word: whichever comes second is reported.
    let e = launch(&cfg(1, 64, 1024), || {
        if sreg::tid_x() % 32 == 0 {
            smem::st_u32(smem::dynamic_base(), sreg::tid_x());
        }
    })
    .unwrap_err();
    assert!(e.kind == ErrorKind::Hazard && e.message.contains("writes"), "{e}");
    // Ordered by bar.sync, then by an mbarrier arrival (release) and wait (acquire).
    let got = AtomicU32::new(0);
    for s in seeds() {
        launch(&cfg(1, 64, 1024).with_schedule(s), || {
            let base = smem::dynamic_base();
            let tid = sreg::tid_x();
            if tid == 0 {
                smem::st_u32(base + 64, 5);
                mbarrier::init(base, 1);
            }
            barrier::sync_all();
            if tid == 32 {
                assert_eq!(smem::ld_u32(base + 64), 5);
                smem::st_u32(base + 64, 6);
                mbarrier::arrive(base);
            } else if tid == 0 {
                while !mbarrier::try_wait(base, 0) {}
                got.store(smem::ld_u32(base + 64), Relaxed);
            }
        })
        .unwrap();
        assert_eq!(got.load(Relaxed), 6);
    }
}
