//! `mempool::pool` on the cases of DPDK's `mempool_perf_autotest`: cache 0 and 512, get/put
//! bulk 1, 4 and 32, `keep` 128, on one core and on two cores (each core gets and puts its own
//! objects through its own cache, as DPDK's test does). One iteration is one keep cycle per
//! core: get 128 objects in chunks of `bulk`, put them back in chunks of `bulk`; throughput is
//! objects got and returned (128 per core per iteration).
//!
//! Cache-less pools are also measured with RTS and HTS free rings (`mempool/cache0-rts/...`,
//! DPDK's `ring_mt_rts` and `ring_mt_hts` mempool ops): the contended case the ring modes are
//! for.

use std::time::Instant;

use benches::{config, pin_bench_thread, two_core_wall, two_cores};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use mempool::pool::{ObjId, Pool, PoolConfig};
use mempool::ring::SyncType;
use perf::pool_perf::{CACHE_MAX, DPDK_MAX_KEEP, OBJ_SIZE, POOL_LCORES, keep_cycle};

const KEEP: usize = 128;
const BULKS: [usize; 3] = [1, 4, 32];

/// DPDK's `MEMPOOL_SIZE` for two lcores.
const POOL_SIZE: u32 = (POOL_LCORES * (DPDK_MAX_KEEP + CACHE_MAX as usize) - 1) as u32;

fn pool(cache: u32, ring: SyncType) -> std::sync::Arc<Pool> {
    Pool::new(
        PoolConfig::new("bench", OBJ_SIZE, POOL_SIZE)
            .cache_size(cache)
            .ring_sync(ring),
    )
    .expect("pool")
}

/// The group name: `mempool/cache{N}` for the default Multi ring, `mempool/cache{N}-{mode}`
/// otherwise.
fn group(cache: u32, ring: SyncType, cores: &str) -> String {
    match ring {
        SyncType::Multi => format!("mempool/cache{cache}/{cores}"),
        _ => format!("mempool/cache{cache}-{ring}/{cores}"),
    }
}

fn one_core(c: &mut Criterion, cache: u32, ring: SyncType) {
    pin_bench_thread();
    let pool = pool(cache, ring);
    let mut g = c.benchmark_group(group(cache, ring, "1core"));
    g.throughput(Throughput::Elements(KEEP as u64));
    for bulk in BULKS {
        g.bench_with_input(BenchmarkId::new("bulk", bulk), &bulk, |b, &bulk| {
            let mut port = pool.cache();
            let mut table = vec![ObjId::default(); KEEP];
            b.iter(|| keep_cycle(&mut port, &mut table, bulk).expect("pool sized for the bench"))
        });
    }
    g.finish();
}

fn two_core(c: &mut Criterion, cache: u32, ring: SyncType) {
    let Some(cpus) = two_cores() else { return };
    let pool = pool(cache, ring);
    let mut g = c.benchmark_group(group(cache, ring, "2core"));
    g.throughput(Throughput::Elements(2 * KEEP as u64));
    for bulk in BULKS {
        g.bench_with_input(BenchmarkId::new("bulk", bulk), &bulk, |b, &bulk| {
            b.iter_custom(|iters| {
                let worker = |barrier: &perf::harness::SpinBarrier| {
                    let mut port = pool.cache();
                    let mut table = vec![ObjId::default(); KEEP];
                    barrier.wait();
                    let t0 = Instant::now();
                    for _ in 0..iters {
                        keep_cycle(&mut port, &mut table, bulk).expect("pool sized for the bench");
                    }
                    (t0, Instant::now())
                };
                two_core_wall(cpus, worker, worker)
            })
        });
    }
    g.finish();
}

fn no_cache(c: &mut Criterion) {
    one_core(c, 0, SyncType::Multi);
    two_core(c, 0, SyncType::Multi);
}

fn no_cache_rts_hts(c: &mut Criterion) {
    for ring in [SyncType::Rts, SyncType::Hts] {
        one_core(c, 0, ring);
        two_core(c, 0, ring);
    }
}

fn cache_512(c: &mut Criterion) {
    one_core(c, CACHE_MAX, SyncType::Multi);
    two_core(c, CACHE_MAX, SyncType::Multi);
}

criterion_group! {
    name = pools;
    config = config();
    targets = no_cache, no_cache_rts_hts, cache_512
}
criterion_main!(pools);
