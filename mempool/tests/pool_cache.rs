//! Per-lcore cache semantics, checked exactly through `in_ring`, `available`, the cache length
//! and the counters: refill with `size + remaining`, the remainder fallback, flush at 1.5 x
//! size down to size, bypass of large requests, LIFO order, all-or-nothing failures, stranded
//! objects, and flush on drop.
#![cfg(not(loom))]

use std::sync::Arc;

use mempool::pool::{Empty, ObjId, PUBLISH_EVERY, Pool, PoolCache, PoolConfig, PoolStats};

fn pool(count: u32, cache_size: u32) -> Arc<Pool> {
    Pool::new(
        PoolConfig::new("cache-test", 64, count)
            .cache_size(cache_size)
            .no_huge(),
    )
    .expect("pool")
}

/// The pool's totals with `c`'s counters published first (caches publish every
/// `PUBLISH_EVERY` operations); also checks that the cache's own view agrees.
fn stats(p: &Pool, c: &mut PoolCache) -> PoolStats {
    c.publish_stats();
    let s = p.stats();
    assert_eq!(s.cache_hits, c.stats().cache_hits);
    s
}

fn ids(n: usize) -> Vec<ObjId> {
    vec![ObjId::default(); n]
}

#[test]
fn refill_takes_size_plus_remaining() {
    let p = pool(64, 8);
    let mut c = p.cache();
    assert_eq!((c.size(), c.flush_threshold()), (8, 12));
    let mut out = ids(3);
    c.get_bulk(&mut out).unwrap();
    // 8 + 3 from the ring, 3 handed out, 8 kept.
    assert_eq!((c.len(), p.in_ring()), (8, 64 - 11));
    let s = stats(&p, &mut c);
    assert_eq!((s.gets, s.cache_hits, s.refills), (3, 0, 1));
    // The next 8 are hits; no ring access.
    let mut eight = ids(8);
    c.get_bulk(&mut eight).unwrap();
    assert_eq!((c.len(), p.in_ring()), (0, 53));
    let s = stats(&p, &mut c);
    assert_eq!((s.gets, s.cache_hits, s.refills), (11, 8, 1));
    // Cached objects count as available.
    c.publish_stats();
    assert_eq!((p.available(), p.in_use()), (53, 11));
    // SAFETY: all ids came from `p`, each put once.
    unsafe {
        c.put_bulk(&out);
        c.put_bulk(&eight);
    }
}

#[test]
fn partial_hit_serves_the_cache_first() {
    let p = pool(64, 8);
    let mut c = p.cache();
    let mut two = ids(2);
    p.get_bulk(&mut two).unwrap();
    // SAFETY: from `p`, put once.
    unsafe { c.put_bulk(&two) };
    assert_eq!((c.len(), p.in_ring()), (2, 62));
    let mut five = ids(5);
    c.get_bulk(&mut five).unwrap();
    // The 2 cached objects come first, then 3 of a refill of 8 + 3.
    assert_eq!(&five[..2], &two[..]);
    assert_eq!((c.len(), p.in_ring()), (8, 62 - 11));
    let s = stats(&p, &mut c);
    assert_eq!((s.cache_hits, s.refills), (2, 1));
    // SAFETY: from `p`, put once.
    unsafe { c.put_bulk(&five) };
}

#[test]
fn refill_failure_falls_back_to_the_remainder() {
    let p = pool(16, 8);
    let mut c = p.cache();
    let mut held = ids(10);
    p.get_bulk(&mut held).unwrap();
    assert_eq!(p.in_ring(), 6);
    // A refill needs 8 + 3 = 11 > 6: only the 3 are dequeued, the cache stays empty.
    let mut three = ids(3);
    c.get_bulk(&mut three).unwrap();
    assert_eq!((c.len(), p.in_ring()), (0, 3));
    assert_eq!(stats(&p, &mut c).refills, 0);
    // 4 > 3: fails, nothing taken.
    let mut four = ids(4);
    assert_eq!(
        c.get_bulk(&mut four),
        Err(Empty {
            requested: 4,
            available: 3
        })
    );
    assert_eq!((c.len(), p.in_ring(), stats(&p, &mut c).empty), (0, 3, 1));
    // Cache holds 2, ring 3: 2 cached + 2 from the ring.
    // SAFETY: from `p`, put once.
    unsafe { c.put_bulk(&three[..2]) };
    c.get_bulk(&mut four).unwrap();
    assert_eq!((c.len(), p.in_ring()), (0, 1));
    // Cache holds 2, ring 1: a request for 4 fails and leaves both as they were.
    // SAFETY: from `p`, put once.
    unsafe { c.put_bulk(&four[..2]) };
    let err = c.get_bulk(&mut ids(4)).unwrap_err();
    assert_eq!((err.requested, err.available), (4, 3));
    assert_eq!((c.len(), p.in_ring(), stats(&p, &mut c).empty), (2, 1, 2));
    // Everything comes back.
    // SAFETY: every object still out, once.
    unsafe {
        c.put_bulk(&four[2..]);
        c.put(three[2]);
        p.put_bulk(&held);
    }
    drop(c);
    assert_eq!(p.in_ring(), 16);
}

#[test]
fn flush_at_threshold_keeps_size() {
    let p = pool(64, 8);
    let mut c = p.cache();
    let mut held = ids(20);
    p.get_bulk(&mut held).unwrap();
    assert_eq!(p.in_ring(), 44);
    // 11 puts stay below the threshold of 12.
    for &id in &held[..11] {
        // SAFETY: from `p`, put once.
        unsafe { c.put(id) };
    }
    assert_eq!(
        (c.len(), p.in_ring(), stats(&p, &mut c).flushes),
        (11, 44, 0)
    );
    // The 12th reaches it: the 4 above size go to the ring, 8 stay.
    // SAFETY: from `p`, put once.
    unsafe { c.put(held[11]) };
    assert_eq!(
        (c.len(), p.in_ring(), stats(&p, &mut c).flushes),
        (8, 48, 1)
    );
    // A bulk that jumps past the threshold flushes everything above size at once: 8 + 7 = 15.
    // SAFETY: from `p`, put once.
    unsafe { c.put_bulk(&held[12..19]) };
    assert_eq!(
        (c.len(), p.in_ring(), stats(&p, &mut c).flushes),
        (8, 55, 2)
    );
    // The cache keeps the oldest 8 (flush returns the top): held[0..8].
    let mut eight = ids(8);
    c.get_bulk(&mut eight).unwrap();
    assert_eq!(&eight[..], &held[..8]);
    assert_eq!(stats(&p, &mut c).puts, 19);
    // SAFETY: from `p`, put once.
    unsafe {
        c.put_bulk(&eight);
        c.put(held[19]);
    }
}

#[test]
fn large_requests_bypass_the_cache() {
    let p = pool(64, 8);
    let mut c = p.cache();
    let mut nine = ids(9);
    c.get_bulk(&mut nine).unwrap();
    // 9 > size: straight from the ring, no refill.
    assert_eq!(
        (c.len(), p.in_ring(), stats(&p, &mut c).refills),
        (0, 55, 0)
    );
    // SAFETY: from `p`, put once.
    unsafe { c.put_bulk(&nine) };
    assert_eq!(
        (c.len(), p.in_ring(), stats(&p, &mut c).flushes),
        (0, 64, 0)
    );
    // With 5 cached, a request for 20 takes the 5 and 15 from the ring.
    let mut five = ids(5);
    p.get_bulk(&mut five).unwrap();
    // SAFETY: from `p`, put once.
    unsafe { c.put_bulk(&five) };
    let mut twenty = ids(20);
    c.get_bulk(&mut twenty).unwrap();
    assert_eq!(&twenty[..5], &five[..]);
    assert_eq!((c.len(), p.in_ring()), (0, 44));
    // SAFETY: from `p`, put once.
    unsafe { c.put_bulk(&twenty) };
}

#[test]
fn gets_are_lifo() {
    let p = pool(64, 8);
    let mut c = p.cache();
    let mut abc = ids(3);
    p.get_bulk(&mut abc).unwrap();
    for &id in &abc {
        // SAFETY: from `p`, put once.
        unsafe { c.put(id) };
    }
    assert_eq!(c.get().unwrap(), abc[2]);
    let mut two = ids(2);
    c.get_bulk(&mut two).unwrap();
    assert_eq!(
        two,
        [abc[0], abc[1]],
        "the top of the stack, in stack order"
    );
    let s = stats(&p, &mut c);
    assert_eq!((s.cache_hits, s.refills), (3, 0));
    // SAFETY: from `p`, put once.
    unsafe {
        c.put_bulk(&two);
        c.put(abc[2]);
    }
}

#[test]
fn drop_and_flush_return_everything() {
    let p = pool(64, 16);
    let mut c = p.cache();
    let id = c.get().unwrap();
    assert_eq!((c.len(), p.in_ring()), (16, 47));
    c.flush();
    assert_eq!((c.len(), p.in_ring(), p.available()), (0, 63, 63));
    // SAFETY: from `p`, put once.
    unsafe { c.put(id) };
    assert_eq!(p.caches(), 1);
    drop(c);
    assert_eq!((p.in_ring(), p.caches()), (64, 0));
    // The dropped cache's counters survive in the totals.
    let s = p.stats();
    assert_eq!((s.gets, s.puts, s.refills), (1, 1, 1));
}

#[test]
fn cache_of_size_zero_is_a_cacheless_port() {
    let p = pool(8, 4);
    let mut c = p.cache_with_size(0).unwrap();
    let mut three = ids(3);
    c.get_bulk(&mut three).unwrap();
    assert_eq!((c.len(), p.in_ring()), (0, 5));
    // SAFETY: from `p`, put once.
    unsafe { c.put_bulk(&three) };
    assert_eq!((c.len(), p.in_ring()), (0, 8));
    assert!(c.get_bulk(&mut ids(9)).is_err());
    let s = stats(&p, &mut c);
    assert_eq!((s.gets, s.puts, s.cache_hits, s.empty), (3, 3, 0, 1));
}

#[test]
fn size_one_cache_holds_one_object() {
    let p = pool(8, 1);
    let mut c = p.cache();
    let mut two = ids(2);
    p.get_bulk(&mut two).unwrap();
    // SAFETY: from `p`, put once each.
    unsafe {
        c.put(two[0]);
        assert_eq!(c.len(), 1);
        c.put(two[1]);
    }
    assert_eq!((c.len(), p.in_ring()), (1, 7));
}

#[test]
fn objects_strand_in_other_caches() {
    let p = pool(12, 8);
    let mut a = p.cache();
    let mut b = p.cache();
    // a refills 8 + 1 and keeps 8; b sees only the 3 left in the ring.
    let id = a.get().unwrap();
    assert_eq!(p.in_ring(), 3);
    let err = b.get_bulk(&mut ids(4)).unwrap_err();
    assert_eq!((err.requested, err.available), (4, 3));
    a.publish_stats();
    assert_eq!(
        p.available(),
        11,
        "stranded objects still count as available"
    );
    a.flush();
    b.get_bulk(&mut ids(4))
        .map(drop)
        .unwrap_or_else(|e| panic!("{e}"));
    // `b` now owns 4 objects it never returns; dropping everything still balances the books.
    let _ = id;
    drop((a, b));
    assert_eq!(p.stats().gets, 5);
}

#[test]
fn stats_sum_live_dropped_and_cacheless() {
    let p = pool(256, 32);
    let mut live = p.cache();
    {
        let mut gone = p.cache();
        let mut x = ids(10);
        gone.get_bulk(&mut x).unwrap();
        // SAFETY: from `p`, put once.
        unsafe { gone.put_bulk(&x) };
    }
    let mut y = ids(7);
    live.get_bulk(&mut y).unwrap();
    let z = p.get().unwrap();
    let _ = p.get_bulk(&mut ids(1000));
    live.publish_stats();
    let s = p.stats();
    assert_eq!((s.gets, s.puts, s.empty), (10 + 7 + 1, 10, 1));
    assert_eq!((p.in_use(), p.caches()), (8, 1));
    // SAFETY: from `p`, put once.
    unsafe {
        live.put_bulk(&y);
        p.put(z);
    }
    live.publish_stats();
    assert_eq!(p.in_use(), 0);
}

#[test]
fn counters_are_published_every_64_operations() {
    let p = pool(256, 32);
    let mut c = p.cache();
    let mut one = ids(1);
    // Operation 1 refills; it and the next ones are not published yet.
    for _ in 0..PUBLISH_EVERY - 1 {
        c.get_bulk(&mut one).unwrap();
        // SAFETY: from `p`, put back at once.
        unsafe { c.put_bulk(&one) };
    }
    // 2 x 63 = 126 operations: published once, at the 64th.
    let s = p.stats();
    assert_eq!((s.gets, s.puts), (32, 32), "as of the 64th operation");
    assert_eq!(
        (c.stats().gets, c.stats().puts),
        (63, 63),
        "the cache's own view is exact"
    );
    // Two more reach the 128th operation.
    c.get_bulk(&mut one).unwrap();
    // SAFETY: as above.
    unsafe { c.put_bulk(&one) };
    assert_eq!((p.stats().gets, p.stats().puts), (64, 64));
    // Flush and drop publish too.
    c.get_bulk(&mut one).unwrap();
    c.flush();
    assert_eq!(p.stats().gets, 65);
    // SAFETY: as above.
    unsafe { c.put_bulk(&one) };
    drop(c);
    assert_eq!(p.stats().puts, 65);
}
