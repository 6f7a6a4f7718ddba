//! `mempool::ring` on the cases of DPDK's `ring_perf_autotest`: SP/SC, MP/MC, and both sides
//! RTS or HTS, single and bulk 8/32/128, on one core (enqueue then dequeue on the same thread)
//! and on two cores (producer on CPU 0, consumer on CPU 1). Throughput is in elements: one
//! element is one enqueue plus one dequeue on one core, one element transferred on two cores.
//!
//! ```text
//! cargo bench -p benches --bench ring -- rts/      # one mode
//! ```

use std::hint::black_box;
use std::time::Instant;

use benches::{config, pin_bench_thread, two_core_wall, two_cores};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use crossbeam_utils::CachePadded;
use mempool::ring::{Hts, Multi, Ring, Rts, Single, SyncMode};
use perf::harness::{Backoff, CpuPair};

const RING_SIZE: usize = 4096;
const BATCHES: [usize; 3] = [8, 32, 128];

fn one_core<P: SyncMode, C: SyncMode>(c: &mut Criterion, mode: &str) {
    pin_bench_thread();
    let (mut tx, mut rx) = Ring::<u64>::with_capacity::<P, C>(RING_SIZE).expect("ring");
    let mut g = c.benchmark_group(format!("ring/{mode}/1core"));
    g.throughput(Throughput::Elements(1));
    g.bench_function("single", |b| {
        b.iter(|| {
            let _ = tx.enqueue(black_box(7));
            black_box(rx.dequeue())
        })
    });
    for batch in BATCHES {
        g.throughput(Throughput::Elements(batch as u64));
        g.bench_with_input(BenchmarkId::new("bulk", batch), &batch, |b, &n| {
            let mut buf = vec![0u64; n];
            b.iter(|| {
                let moved = tx.enqueue_bulk(black_box(&buf));
                black_box(moved + rx.dequeue_bulk(&mut buf))
            })
        });
    }
    g.finish();
}

/// Moves `iters` bulks of `batch` elements from CPU 0 to CPU 1; returns the wall time.
fn two_core_pass<P: SyncMode, C: SyncMode>(
    cpus: CpuPair,
    batch: usize,
    iters: u64,
) -> std::time::Duration {
    let (tx, rx) = Ring::<u64>::with_capacity::<P, C>(RING_SIZE).expect("ring");
    two_core_wall(
        cpus,
        move |barrier| {
            // Own padded allocation per handle, made by its own thread: see
            // `perf::ring_perf` (false sharing of the two cursors otherwise).
            let mut tx = Box::new(CachePadded::new(tx));
            let tx = &mut **tx;
            let buf = vec![0u64; batch];
            barrier.wait();
            let t0 = Instant::now();
            for _ in 0..iters {
                let mut backoff = Backoff::measuring();
                while tx.enqueue_bulk(&buf) == 0 {
                    backoff.snooze();
                }
            }
            (t0, Instant::now())
        },
        move |barrier| {
            let mut rx = Box::new(CachePadded::new(rx));
            let rx = &mut **rx;
            let mut buf = vec![0u64; batch];
            barrier.wait();
            let t0 = Instant::now();
            for _ in 0..iters {
                let mut backoff = Backoff::measuring();
                while rx.dequeue_bulk(&mut buf) == 0 {
                    backoff.snooze();
                }
            }
            black_box(&buf);
            (t0, Instant::now())
        },
    )
}

fn two_core<P: SyncMode, C: SyncMode>(c: &mut Criterion, mode: &str) {
    let Some(cpus) = two_cores() else { return };
    let mut g = c.benchmark_group(format!("ring/{mode}/2core"));
    for batch in BATCHES {
        g.throughput(Throughput::Elements(batch as u64));
        g.bench_with_input(BenchmarkId::new("bulk", batch), &batch, |b, &n| {
            b.iter_custom(|iters| two_core_pass::<P, C>(cpus, n, iters))
        });
    }
    g.finish();
}

fn spsc(c: &mut Criterion) {
    one_core::<Single, Single>(c, "spsc");
    two_core::<Single, Single>(c, "spsc");
}

fn mpmc(c: &mut Criterion) {
    one_core::<Multi, Multi>(c, "mpmc");
    two_core::<Multi, Multi>(c, "mpmc");
}

fn rts(c: &mut Criterion) {
    one_core::<Rts, Rts>(c, "rts");
    two_core::<Rts, Rts>(c, "rts");
}

fn hts(c: &mut Criterion) {
    one_core::<Hts, Hts>(c, "hts");
    two_core::<Hts, Hts>(c, "hts");
}

criterion_group! {
    name = rings;
    config = config();
    targets = spsc, mpmc, rts, hts
}
criterion_main!(rings);
