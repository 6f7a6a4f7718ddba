//! The process-global registry of shareable regions: lookup by address,
//! containment, independence of the returned fd, and removal on drop.

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

use mempool::memory::{Region, RegionConfig, registry, set_notice_sink};

fn quiet(_: &str) {}

fn shared(name: &str, len: usize) -> Region {
    set_notice_sink(quiet);
    Region::new(&RegionConfig::new(name, len).shareable(true).no_huge())
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn inode(fd: &OwnedFd) -> u64 {
    File::from(fd.try_clone().expect("dup"))
        .metadata()
        .expect("fstat")
        .ino()
}

#[test]
fn find_returns_a_dup_and_the_offset() {
    let r = shared("reg-find", 16 * 4096);
    let base = r.as_ptr() as usize;
    let s = registry::find(base + 5000, 100).expect("inside a live shareable region");
    assert_eq!(s.region_base, base);
    assert_eq!(s.region_len, r.len());
    assert_eq!(s.page_size, 4096);
    assert_eq!(s.offset, 5000);
    assert_eq!(s.region_id, r.id());
    let own = r.share_handle().expect("handle").fd;
    assert_ne!(
        s.fd.as_raw_fd(),
        own.as_raw_fd(),
        "must be a dup, not the region's fd"
    );
    assert_eq!(inode(&s.fd), inode(&own.try_clone_to_owned().expect("dup")));
}

#[test]
fn find_requires_the_whole_range_inside_one_region() {
    let r = shared("reg-bounds", 4 * 4096);
    let base = r.as_ptr() as usize;
    let end = base + r.len();
    assert!(registry::find(base, r.len()).is_some());
    assert!(registry::find(end - 1, 1).is_some());
    assert!(registry::find(end - 1, 2).is_none(), "crosses the end");
    // Another test's region may start right at `end` (tests run in parallel and mmap places
    // regions next to each other): then the lookup finds that one, never this one.
    assert!(
        registry::find(end, 0).is_none_or(|s| s.region_id != r.id()),
        "one past the end"
    );
    assert!(
        registry::find(base - 1, 2).is_none(),
        "starts before the base"
    );
    assert!(
        registry::find(base + 8, usize::MAX).is_none(),
        "overflowing length"
    );
}

#[test]
fn anonymous_regions_are_not_listed() {
    set_notice_sink(quiet);
    let r = Region::new(&RegionConfig::new("reg-anon", 4096).no_huge()).expect("anon");
    assert!(registry::find(r.as_ptr() as usize, 1).is_none());
}

#[test]
fn two_regions_are_told_apart() {
    let a = shared("reg-a", 4096);
    let b = shared("reg-b", 4096);
    let fa = registry::find(a.as_ptr() as usize + 1, 1).expect("a");
    let fb = registry::find(b.as_ptr() as usize + 1, 1).expect("b");
    assert_eq!((fa.region_id, fb.region_id), (a.id(), b.id()));
    assert_ne!(inode(&fa.fd), inode(&fb.fd));
}

#[test]
fn dropped_regions_are_gone_but_a_dup_keeps_the_memory() {
    let r = shared("reg-drop", 2 * 4096);
    let addr = r.as_ptr() as usize + 4096;
    // SAFETY: inside the live region, which nobody else uses.
    unsafe { (addr as *mut u8).write(0xa5) };
    let kept = registry::find(addr, 1).expect("live");
    let id = r.id();
    drop(r);
    // Compare ids: a region created meanwhile by a parallel test may reuse
    // the address range.
    assert_ne!(
        registry::find(addr, 1).map(|s| s.region_id),
        Some(id),
        "found after drop"
    );
    // The dup outlives the region: the memfd's pages are still there.
    let again = Region::from_shared(kept.fd, kept.region_len, kept.page_size, "reg-drop-again")
        .expect("map the dup");
    // SAFETY: inside the live mapping `again`.
    let byte = unsafe { again.as_ptr().add(kept.offset).read() };
    assert_eq!(byte, 0xa5);
    // A region mapped from a peer's fd is shareable too, so it is listed.
    let s = registry::find(again.as_ptr() as usize, again.len()).expect("listed");
    assert_eq!(s.region_id, again.id());
}
