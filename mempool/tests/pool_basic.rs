//! Pool creation, addressing and the cache-less path: config validation, ids and addresses,
//! memory chunks, all-or-nothing bulk gets, exhaustion and recovery, owned handles.
#![cfg(not(loom))]

use std::collections::HashSet;
use std::sync::Arc;

use mempool::pool::{
    CACHE_MAX_SIZE, Empty, FLUSH_THRESHOLD_MULTIPLIER, ObjId, Pool, PoolConfig, PoolError,
    flush_threshold,
};
use mempool::ring::SyncType;

fn pool(name: &str, obj_size: usize, count: u32) -> Arc<Pool> {
    Pool::new(PoolConfig::new(name, obj_size, count).no_huge()).expect("pool")
}

/// Takes every object of a cache-less pool, one by one.
fn drain(pool: &Pool) -> Vec<ObjId> {
    let mut ids = Vec::new();
    while let Ok(id) = pool.get() {
        ids.push(id);
    }
    ids
}

#[test]
fn constants_match_dpdk() {
    assert_eq!(CACHE_MAX_SIZE, 512);
    assert_eq!(FLUSH_THRESHOLD_MULTIPLIER, 1.5);
    for size in 0..=CACHE_MAX_SIZE {
        assert_eq!(
            flush_threshold(size),
            (f64::from(size) * FLUSH_THRESHOLD_MULTIPLIER) as u32
        );
    }
}

#[test]
fn cache_larger_than_max_is_rejected() {
    let err = Pool::new(PoolConfig::new("big-cache", 64, 10_000).cache_size(513)).unwrap_err();
    assert!(
        matches!(
            err,
            PoolError::CacheTooLarge {
                cache_size: 513,
                max: 512,
                ..
            }
        ),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("'big-cache'") && msg.contains("at most 512"),
        "{msg}"
    );
}

#[test]
fn cache_flush_threshold_must_fit_in_count() {
    // 1.5 x 100 = 150 > 149.
    let err = Pool::new(PoolConfig::new("tight", 64, 149).cache_size(100)).unwrap_err();
    match &err {
        PoolError::CacheTooLargeForCount {
            cache_size,
            threshold,
            count,
            max_cache,
            ..
        } => assert_eq!(
            (*cache_size, *threshold, *count, *max_cache),
            (100, 150, 149, 99)
        ),
        other => panic!("unexpected error {other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("at least 150") && msg.contains("at most 99"),
        "{msg}"
    );
    // Exactly at the threshold is accepted, as in rte_mempool_create.
    let ok = Pool::new(PoolConfig::new("tight", 64, 150).cache_size(100).no_huge()).unwrap();
    assert_eq!(ok.cache_size(), 100);
}

#[test]
fn bad_configs_say_what_is_wrong() {
    let cases = [
        (PoolConfig::new("", 64, 8), "name is empty"),
        (PoolConfig::new("z", 0, 8), "obj_size is 0"),
        (PoolConfig::new("z", 64, 0), "count is 0"),
        (PoolConfig::new("z", 64, 8).align(48), "power of two"),
        (PoolConfig::new("z", 64, 8).align(8192), "power of two"),
        (PoolConfig::new("z", usize::MAX / 4, 8), "address space"),
        (
            PoolConfig::new("z", 64, 8).ring_sync(SyncType::Single),
            "use multi, rts or hts",
        ),
        (
            PoolConfig::new("z", 64, (1 << 29) + 1).ring_sync(SyncType::Rts),
            "limit of an RTS free ring",
        ),
    ];
    for (cfg, needle) in cases {
        let err = Pool::new(cfg.clone()).unwrap_err();
        assert!(
            matches!(err, PoolError::InvalidConfig { .. }),
            "{cfg:?}: {err:?}"
        );
        assert!(err.to_string().contains(needle), "{cfg:?}: {err}");
    }
    let p = pool("z", 64, 100);
    assert!(matches!(
        p.cache_with_size(600).unwrap_err(),
        PoolError::CacheTooLarge { .. }
    ));
    // 67 + 33 = 100 fits, 68 + 34 = 102 does not.
    assert!(p.cache_with_size(67).is_ok());
    assert!(matches!(
        p.cache_with_size(68).unwrap_err(),
        PoolError::CacheTooLargeForCount { threshold: 102, .. }
    ));
}

#[test]
fn default_cache_size_fits_small_pools() {
    assert_eq!(PoolConfig::new("a", 64, 100_000).cache_size, 256);
    assert_eq!(PoolConfig::new("a", 64, 100).cache_size, 67);
    assert_eq!(pool("small", 64, 3).cache_size(), 2);
}

#[test]
fn objects_are_aligned_distinct_and_inside_the_chunks() {
    for (obj_size, align) in [(1, 1), (100, 64), (2048, 64), (24, 8), (4000, 4096)] {
        let p = Pool::new(
            PoolConfig::new("layout", obj_size, 257)
                .align(align)
                .no_huge(),
        )
        .unwrap();
        assert!(p.stride() >= obj_size && p.stride().is_multiple_of(align));
        let chunks: Vec<_> = p.chunks().collect();
        assert_eq!(chunks.len(), 1);
        let region = p.region();
        assert_eq!(
            (chunks[0].addr, chunks[0].len),
            (region.as_ptr() as usize, region.len())
        );
        let ids = drain(&p);
        assert_eq!(ids.len(), 257);
        let mut seen = HashSet::new();
        for &id in &ids {
            let a = p.addr(id).as_ptr() as usize;
            assert!(
                a.is_multiple_of(align),
                "object {id} at {a:#x} not aligned to {align}"
            );
            assert!(chunks.iter().any(|c| c.contains(a, obj_size)));
            assert_eq!(p.id_of(a as *const u8), Some(id));
            assert_eq!(p.id_containing((a + obj_size - 1) as *const u8), Some(id));
            assert!(seen.insert(id.index()));
        }
        // Objects do not overlap: sorted addresses are at least obj_size apart.
        let mut addrs: Vec<usize> = ids.iter().map(|&id| p.addr(id).as_ptr() as usize).collect();
        addrs.sort_unstable();
        assert!(addrs.windows(2).all(|w| w[1] - w[0] >= obj_size));
        // SAFETY: every id came from `p` and is put back once.
        unsafe { p.put_bulk(&ids) };
        assert_eq!(p.available(), 257);
    }
}

#[test]
fn id_of_rejects_foreign_and_interior_pointers() {
    let p = pool("ids", 100, 16);
    let other = pool("other", 100, 16);
    let id = p.get().unwrap();
    let a = p.addr(id).as_ptr();
    assert_eq!(p.id_of(a), Some(id));
    // Interior and padding pointers are not object starts.
    assert_eq!(p.id_of(a.wrapping_add(1)), None);
    assert_eq!(p.id_containing(a.wrapping_add(99)), Some(id));
    assert_eq!(p.id_containing(a.wrapping_add(100)), None, "padding");
    // Before the first object, past the last one, another pool, the stack, null.
    let first = p.chunks().next().unwrap().addr as *const u8;
    assert_eq!(p.id_of(first.wrapping_sub(1)), None);
    let end = p
        .addr(p.id_of(a).unwrap())
        .as_ptr()
        .wrapping_add(16 * p.stride());
    assert_eq!(p.id_of(end), None);
    let oid = other.get().unwrap();
    assert_eq!(p.id_of(other.addr(oid).as_ptr()), None);
    let local = 0u8;
    assert_eq!(p.id_of(&local), None);
    assert_eq!(p.id_of(std::ptr::null()), None);
    // SAFETY: each id goes back to its own pool once.
    unsafe {
        p.put(id);
        other.put(oid);
    }
}

#[test]
#[should_panic(expected = "out of range")]
fn addr_of_an_id_out_of_range_panics() {
    let big = pool("big", 8, 64);
    let small = pool("small", 8, 4);
    let ids = drain(&big);
    let _ = small.addr(ids[40]);
}

#[test]
fn bulk_get_is_all_or_nothing() {
    let p = pool("bulk", 64, 10);
    let mut seven = [ObjId::default(); 7];
    p.get_bulk(&mut seven).unwrap();
    assert_eq!(p.available(), 3);
    let mut four = [ObjId::default(); 4];
    let err = p.get_bulk(&mut four).unwrap_err();
    assert_eq!(
        err,
        Empty {
            requested: 4,
            available: 3
        }
    );
    let msg = err.to_string();
    assert!(
        msg.contains("4 objects requested") && msg.contains("3 available"),
        "{msg}"
    );
    assert!(
        msg.contains("make the pool larger or return objects"),
        "{msg}"
    );
    assert_eq!(
        four,
        [ObjId::default(); 4],
        "a failed bulk leaves `out` alone"
    );
    assert_eq!(p.available(), 3, "nothing taken");
    let s = p.stats();
    assert_eq!((s.gets, s.empty, s.puts), (7, 1, 0));
    // Larger than the whole pool.
    let mut many = vec![ObjId::default(); 11];
    assert_eq!(p.get_bulk(&mut many).unwrap_err().requested, 11);
    // Empty requests succeed and count nothing.
    p.get_bulk(&mut []).unwrap();
    assert_eq!(p.stats().empty, 2);
    // SAFETY: ids from `p`, returned once.
    unsafe { p.put_bulk(&seven) };
    assert_eq!((p.available(), p.in_use(), p.stats().puts), (10, 0, 7));
}

#[test]
fn exhaustion_and_recovery() {
    let p = pool("exhaust", 32, 100);
    for round in 0..3 {
        let ids = drain(&p);
        assert_eq!(ids.len(), 100, "round {round}");
        let unique: HashSet<_> = ids.iter().map(|id| id.index()).collect();
        assert_eq!(unique.len(), 100);
        assert!(ids.iter().all(|id| id.index() < 100));
        assert_eq!((p.available(), p.in_use()), (0, 100));
        assert!(p.get().is_err());
        // Return half, take them again, then return everything.
        // SAFETY: ids from `p`, each returned once.
        unsafe { p.put_bulk(&ids[..50]) };
        let again = drain(&p);
        assert_eq!(again.len(), 50);
        // SAFETY: as above.
        unsafe {
            p.put_bulk(&again);
            p.put_bulk(&ids[50..]);
        }
        assert_eq!(p.available(), 100);
    }
    // Per round: each of the two drains ends with one failed get, plus the explicit one.
    let s = p.stats();
    assert_eq!((s.gets, s.puts, s.empty), (450, 450, 9));
}

#[test]
fn owned_handle_returns_its_object_on_drop() {
    let p = pool("owned", 256, 4);
    let mut boxes: Vec<_> = (0..4).map(|_| p.get_owned().unwrap()).collect();
    assert!(p.get_owned().is_err());
    for (i, b) in boxes.iter_mut().enumerate() {
        assert_eq!(b.len(), 256);
        assert_eq!(b.as_ptr(), p.addr(b.id()));
        b.as_mut_slice().fill(i as u8);
    }
    for (i, b) in boxes.iter().enumerate() {
        assert!(b.iter().all(|&x| x == i as u8), "objects overlap");
    }
    let id = boxes[2].id();
    drop(boxes.remove(2));
    assert_eq!(p.available(), 1);
    let again = p.get_owned().unwrap();
    assert_eq!(again.id(), id);
    assert!(
        again.iter().all(|&x| x == 2),
        "a put does not touch the bytes"
    );
    // into_raw / from_raw round trip keeps the object allocated.
    let raw = again.into_raw();
    assert_eq!(p.available(), 0);
    // SAFETY: `raw` came from `into_raw` of a box of `p`.
    drop(unsafe { mempool::pool::PoolBox::from_raw(Arc::clone(&p), raw) });
    assert_eq!(p.available(), 1);
    // The box keeps the pool alive.
    let weak = Arc::downgrade(&p);
    let b = p.get_owned().unwrap();
    drop(boxes);
    drop(p);
    assert!(weak.upgrade().is_some());
    drop(b);
    assert!(weak.upgrade().is_none());
}

#[test]
fn shareable_pool_lives_in_a_memfd_region() {
    let p = Pool::new(
        PoolConfig::new("shared-objs", 2048, 64)
            .shareable(true)
            .no_huge(),
    )
    .unwrap();
    let region = p.region();
    assert!(region.share_handle().is_some());
    let id = p.get().unwrap();
    let a = p.addr(id).as_ptr() as usize;
    assert!(region.contains(a, 2048));
    let found = mempool::memory::registry::find(a, 2048).expect("registered");
    assert_eq!(found.region_id, region.id());
    // SAFETY: from `p`, once.
    unsafe { p.put(id) };
}

#[test]
fn ring_modes_of_a_pool() {
    for sync in [SyncType::Multi, SyncType::Rts, SyncType::Hts] {
        let p = Pool::new(PoolConfig::new("modes", 64, 100).ring_sync(sync).no_huge()).unwrap();
        assert_eq!(p.ring_sync(), sync);
        let mut all = vec![ObjId::default(); 100];
        p.get_bulk(&mut all).unwrap();
        assert!(p.get().is_err(), "{sync}: a 101st object");
        // SAFETY: every id came from `p` and goes back once.
        unsafe { p.put_bulk(&all) };
        assert_eq!(p.in_ring(), 100, "{sync}");
    }
}
