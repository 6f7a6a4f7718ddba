//! Quick throughput sanity check in the shape of DPDK's `ring_perf_autotest`; not a benchmark
//! (those live in `benches/`) and it asserts nothing about speed.
//!
//! ```text
//! cargo test -p mempool --release --test ring_perf_sanity -- --ignored --nocapture
//! ```
//!
//! Prints, like DPDK 22.11's `ring_perf_autotest`, TSC cycles: per enqueue+dequeue *call pair*
//! on one thread, and for a producer and a consumer pinned to CPUs 0 and 1, per element measured
//! on each side and summed over both sides. Compare with
//! `DPDK_TEST=ring_perf_autotest dpdk-test --no-huge -m 512 -l 0,1 --no-pci` on the same host.
#![cfg(all(target_os = "linux", target_arch = "x86_64", not(loom)))]

use std::hint::black_box;
use std::thread;

use mempool::ring::{Consumer, Producer, Ring, SyncMode};

const RING_SIZE: usize = 4096;
const ELEMENTS: u64 = 1 << 25;

fn tsc() -> u64 {
    // SAFETY: RDTSC has no preconditions on x86_64.
    unsafe { core::arch::x86_64::_rdtsc() }
}

fn pin(cpu: usize) {
    // SAFETY: `set` is a plain bit set owned by this frame; the call affects only this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
    }
}

fn one_thread<P: SyncMode, C: SyncMode>(label: &str, bulk: usize) {
    let (mut tx, mut rx) = Ring::<usize>::with_capacity::<P, C>(RING_SIZE).unwrap();
    let src: Vec<usize> = (0..bulk).collect();
    let mut dst = vec![0usize; bulk];
    let iters = ELEMENTS / bulk as u64;
    let t = tsc();
    for _ in 0..iters {
        if bulk == 1 {
            tx.enqueue(black_box(1)).unwrap();
            black_box(rx.dequeue());
        } else {
            assert_eq!(tx.enqueue_bulk(black_box(&src)), bulk);
            assert_eq!(rx.dequeue_bulk(black_box(&mut dst)), bulk);
        }
    }
    let per_pair = (tsc() - t) as f64 / iters as f64;
    println!("{label}: one thread, bulk (size: {bulk}): {per_pair:.2} cycles per call pair");
}

fn two_cores<P: SyncMode, C: SyncMode>(label: &str, bulk: usize) {
    let (tx, rx): (Producer<usize, P>, Consumer<usize, C>) =
        Ring::<usize>::with_capacity::<P, C>(RING_SIZE).unwrap();
    let iters = ELEMENTS / bulk as u64;
    let per_elem = |start: u64| (tsc() - start) as f64 / (iters * bulk as u64) as f64;
    let (p, c) = thread::scope(|s| {
        let p = s.spawn(move || {
            pin(0);
            let mut tx = tx;
            let src: Vec<usize> = (0..bulk).collect();
            let t = tsc();
            for _ in 0..iters {
                while tx.enqueue_bulk(&src) == 0 {
                    std::hint::spin_loop();
                }
            }
            per_elem(t)
        });
        let c = s.spawn(move || {
            pin(1);
            let mut rx = rx;
            let mut dst = vec![0usize; bulk];
            let t = tsc();
            for _ in 0..iters {
                while rx.dequeue_bulk(&mut dst) == 0 {
                    std::hint::spin_loop();
                }
                black_box(&dst);
            }
            per_elem(t)
        });
        (p.join().unwrap(), c.join().unwrap())
    });
    println!(
        "{label}: two cores, bulk (size: {bulk}): {:.2} cycles per element, summed",
        p + c
    );
}

#[test]
#[ignore = "throughput printout; run explicitly in release"]
fn ring_perf_sanity() {
    use mempool::ring::{Multi, Single};
    for bulk in [1, 8, 32] {
        one_thread::<Single, Single>("SP/SC", bulk);
        one_thread::<Multi, Multi>("MP/MC", bulk);
    }
    for bulk in [8, 32] {
        two_cores::<Single, Single>("SP/SC", bulk);
        two_cores::<Multi, Multi>("MP/MC", bulk);
    }
}
