//! The `debug` feature's cookies: double frees, foreign objects and out-of-bounds writes panic
//! with a message naming the pool and the object, and `audit` walks the pool.
//!
//! Run with `cargo test -p mempool --features debug --test pool_debug`.
#![cfg(all(feature = "debug", not(loom)))]

use std::sync::Arc;

use mempool::pool::{
    AuditError, AuditReport, COOKIE_ALLOCATED, COOKIE_FREE, ObjId, Pool, PoolConfig,
};

fn pool(name: &str, obj_size: usize, count: u32, cache_size: u32) -> Arc<Pool> {
    Pool::new(
        PoolConfig::new(name, obj_size, count)
            .cache_size(cache_size)
            .no_huge(),
    )
    .expect("pool")
}

#[test]
#[should_panic(expected = "mempool 'df-ring': put of object 0")]
fn double_free_to_the_ring_panics() {
    let p = pool("df-ring", 64, 8, 0);
    let id = p.get().unwrap();
    // SAFETY: deliberately violated: the second put is a double free, which the debug
    // feature must catch before the ring is touched.
    unsafe {
        p.put(id);
        p.put(id);
    }
}

#[test]
#[should_panic(expected = "is already free: double free")]
fn double_free_into_a_cache_panics() {
    let p = pool("df-cache", 64, 64, 8);
    let mut c = p.cache();
    let id = c.get().unwrap();
    // SAFETY: deliberately violated (double free); the cookie check panics first.
    unsafe {
        c.put(id);
        c.put(id);
    }
}

#[test]
#[should_panic(expected = "is already free: double free")]
fn double_free_within_one_bulk_panics() {
    let p = pool("df-bulk", 64, 64, 8);
    let mut c = p.cache();
    let mut two = [ObjId::default(); 2];
    c.get_bulk(&mut two).unwrap();
    // SAFETY: deliberately violated (duplicate in one bulk); the cookie check panics first.
    unsafe { c.put_bulk(&[two[0], two[1], two[0]]) };
}

#[test]
#[should_panic(expected = "does not belong to this pool")]
fn object_of_another_pool_panics_even_in_range() {
    let a = pool("pool-a", 64, 16, 4);
    let b = pool("pool-b", 64, 16, 4);
    let id = a.get().unwrap();
    assert!(id.index() < b.count());
    let mut cache = b.cache();
    // SAFETY: deliberately violated (foreign object); the pool tag check panics first.
    unsafe { cache.put(id) };
}

#[test]
#[should_panic(expected = "mempool 'small': put of object 40")]
fn id_out_of_range_panics() {
    let big = pool("big", 8, 64, 0);
    let small = pool("small", 8, 4, 0);
    let mut ids = [ObjId::default(); 41];
    big.get_bulk(&mut ids).unwrap();
    // SAFETY: deliberately violated (foreign id, out of range); checked before any access.
    unsafe { small.put(ids[40]) };
}

#[test]
#[should_panic(expected = "does not belong to this pool")]
fn default_id_is_nobodys() {
    let p = pool("dflt", 8, 4, 0);
    let _all = p.get_owned().unwrap();
    // SAFETY: deliberately violated (placeholder id); the tag check panics first.
    unsafe { p.put(ObjId::default()) };
}

#[test]
#[should_panic(expected = "trailer cookie 0xadd2e55badbadb00 was overwritten")]
fn write_past_the_end_is_caught_on_put() {
    let p = pool("overrun", 64, 8, 0);
    let mut b = p.get_owned().unwrap();
    b.as_mut_slice().fill(0);
    let end = b.as_ptr().as_ptr().wrapping_add(64);
    // SAFETY: one byte past the object is its trailer cookie, inside the pool's region; this
    // simulates an off-by-one write (little endian: the lowest byte of the cookie).
    unsafe { end.write(0) };
    drop(b);
}

#[test]
fn audit_counts_and_finds_corruption() {
    let p = pool("audit", 100, 32, 4);
    assert_eq!(
        p.audit(),
        Ok(AuditReport {
            free: 32,
            allocated: 0
        })
    );
    let mut c = p.cache();
    let mut five = [ObjId::default(); 5];
    c.get_bulk(&mut five).unwrap();
    let boxed = p.get_owned().unwrap();
    // The count check compares with `available()`, which sees a live cache as of its last
    // publication.
    c.publish_stats();
    assert_eq!(
        p.audit(),
        Ok(AuditReport {
            free: 26,
            allocated: 6
        })
    );
    // Header cookies are DPDK's values; the word before the object is the header.
    let header = |id: ObjId| p.addr(id).as_ptr().wrapping_sub(8).cast::<u64>();
    // SAFETY: the header word of an object of `p`, inside the region, 8-aligned; nothing else
    // touches it while this single-threaded test reads it.
    unsafe {
        assert_eq!(header(five[0]).read(), COOKIE_ALLOCATED);
        assert_eq!(header(c.get().unwrap()).read(), COOKIE_ALLOCATED);
    }
    let free_id = p.id_of(p.addr(boxed.id()).as_ptr()).unwrap();
    assert_eq!(free_id, boxed.id());
    drop(boxed);
    // SAFETY: as above.
    unsafe { assert_eq!(header(free_id).read(), COOKIE_FREE) };
    // Corrupt the trailer of an allocated object: audit names it.
    let victim = five[3];
    let trailer = p.addr(victim).as_ptr().wrapping_add(104);
    // SAFETY: object size 100 rounds to 104: the trailer word, inside the region.
    unsafe { trailer.write(0xff) };
    match p.audit() {
        Err(e @ AuditError::Trailer { id, .. }) => {
            assert_eq!(id, victim);
            assert!(e.to_string().contains("object"), "{e}");
        }
        other => panic!("expected a trailer error, got {other:?}"),
    }
    // Restore the trailer, then corrupt a header (a write before the object's start).
    c.publish_stats();
    // SAFETY: as above.
    unsafe {
        trailer.write(0xad); // the cookie's lowest byte
        assert_eq!(p.audit().map(|r| r.allocated), Ok(6));
        header(five[1]).cast::<u8>().add(7).write(0);
    }
    assert!(matches!(p.audit(), Err(AuditError::Header { id, .. }) if id == five[1]));
    // Restore it so the cache and the objects can be returned cleanly.
    // SAFETY: as above.
    unsafe { header(five[1]).write(COOKIE_ALLOCATED) };
    // SAFETY: from `p`, each once (five[..] were got; the extra `c.get()` above is leaked).
    unsafe { c.put_bulk(&five) };
}
