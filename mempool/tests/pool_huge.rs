//! Pools on 2 MiB hugepages. The success path needs reserved pages: with too few it prints why
//! it skipped and returns; reserve some to run it (`echo 64 > /proc/sys/vm/nr_hugepages` as
//! root, and set it back to 0 afterwards). The shortage path runs only where no page is free.
#![cfg(not(loom))]

use std::fs;

use mempool::memory::{Backend, HugePolicy, MemError};
use mempool::pool::{ObjId, Pool, PoolConfig, PoolError};

const HUGE: usize = 2 << 20;

/// 2 MiB pages available to a new reservation (free minus reserved), 0 if unknown.
fn free_pages() -> u64 {
    let dir = "/sys/kernel/mm/hugepages/hugepages-2048kB";
    let read = |f: &str| -> Option<u64> {
        fs::read_to_string(format!("{dir}/{f}"))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    read("free_hugepages")
        .zip(read("resv_hugepages"))
        .map_or(0, |(free, resv)| free.saturating_sub(resv))
}

/// 2048 x 2047 bytes: just under 4 MiB, two hugepages.
fn cfg(name: &str, shareable: bool) -> PoolConfig {
    PoolConfig::new(name, 2048, 2047)
        .cache_size(512)
        .shareable(shareable)
        .huge(HugePolicy::Require)
}

#[test]
fn pool_on_hugepages_is_one_chunk_of_whole_pages() {
    let free = free_pages();
    if free < 4 {
        println!(
            "skipped: need 4 free 2 MiB hugepages, {free} available \
             (echo 64 > /proc/sys/vm/nr_hugepages)"
        );
        return;
    }
    for shareable in [false, true] {
        let p = Pool::new(cfg("huge-pool", shareable)).expect("4 pages are free");
        let region = p.region();
        assert!(region.backend().is_huge());
        assert_eq!(region.backend() == Backend::HugeMemfd, shareable);
        assert_eq!((region.page_size(), region.len()), (HUGE, 2 * HUGE));
        let chunks: Vec<_> = p.chunks().collect();
        assert_eq!(chunks.len(), 1);
        assert_eq!(chunks[0].addr % HUGE, 0);
        let mut c = p.cache();
        let mut all = vec![ObjId::default(); 2047];
        c.get_bulk(&mut all).unwrap();
        for &id in &all {
            assert!(chunks[0].contains(p.addr(id).as_ptr() as usize, 2048));
        }
        // SAFETY: from `p`, once.
        unsafe { c.put_bulk(&all) };
    }
}

#[test]
fn require_without_free_hugepages_is_a_clear_error() {
    if free_pages() != 0 {
        println!("skipped: hugepages are free, the shortage path cannot be provoked");
        return;
    }
    let err = Pool::new(cfg("no-huge-pool", false)).unwrap_err();
    let msg = err.to_string();
    match err {
        PoolError::Memory {
            source: MemError::HugepageShortage { .. } | MemError::HugepagesUnsupported { .. },
            ..
        } => {}
        other => panic!("expected a hugepage error, got {other:?}"),
    }
    assert!(
        msg.starts_with("pool 'no-huge-pool': allocating the object memory failed"),
        "{msg}"
    );
    // Auto falls back to normal pages.
    let p = Pool::new(cfg("fallback-pool", false).huge(HugePolicy::Auto)).unwrap();
    assert!(!p.region().backend().is_huge());
}
