//! Region creation on normal pages, policy handling, the fallback notice and
//! the `Require` shortage error. Runs on any machine: the hugepage-dependent
//! expectations are computed from sysfs at run time, so the same assertions
//! hold with 0 hugepages reserved and with a pool.

use std::fs;
use std::sync::{Mutex, MutexGuard, PoisonError};

use mempool::memory::{
    Backend, HugePolicy, MemError, Preflight, Region, RegionConfig, set_notice_sink,
};

const MIB: usize = 1 << 20;
const HUGE: usize = 2 * MIB;

static NOTICES: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn capture(line: &str) {
    NOTICES
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(line.to_owned());
}

/// Notices for one region; names are unique per test, tests run in parallel.
fn notices_for(name: &str) -> Vec<String> {
    let tag = format!("region '{name}' ");
    NOTICES
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .filter(|l| l.contains(&tag))
        .cloned()
        .collect()
}

fn region(cfg: &RegionConfig) -> Region {
    set_notice_sink(capture);
    Region::new(cfg).unwrap_or_else(|e| panic!("Region::new({cfg:?}): {e}"))
}

/// Serialises the tests of this binary that may take or count hugepages.
fn huge_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}

/// (available, total) 2 MiB hugepages, read straight from sysfs; (0, 0)
/// when the kernel has no 2 MiB pool.
fn pool_2m() -> (u64, u64) {
    let dir = "/sys/kernel/mm/hugepages/hugepages-2048kB";
    let read = |f: &str| -> u64 {
        fs::read_to_string(format!("{dir}/{f}"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    };
    let avail = read("free_hugepages").saturating_sub(read("resv_hugepages"))
        + read("nr_overcommit_hugepages").saturating_sub(read("surplus_hugepages"));
    (avail, read("nr_hugepages"))
}

/// Whether every page of the range is resident (`mincore`).
fn all_resident(r: &Region) -> bool {
    let pages = r.len().div_ceil(4096);
    let mut vec = vec![0u8; pages];
    // SAFETY: the range is the region's live mapping and `vec` holds one
    // byte per 4 KiB page of it, as mincore requires.
    let rc = unsafe { libc::mincore(r.as_ptr().cast(), r.len(), vec.as_mut_ptr()) };
    assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
    vec.iter().all(|v| v & 1 == 1)
}

/// Whether normal-page regions of `len` bytes can be mlocked here.
fn expect_locked(len: usize) -> bool {
    let pf = Preflight::gather();
    pf.cap_ipc_lock
        || match pf.memlock.soft {
            mempool::memory::Limit::Unlimited => true,
            mempool::memory::Limit::Bytes(b) => pf.locked_bytes.unwrap_or(0) + len as u64 <= b,
        }
}

/// Fills the region with a pattern and reads it back through the pointer.
fn write_read_back(r: &Region) {
    let p = r.as_ptr();
    for i in 0..r.len() {
        // SAFETY: i < len, the region is ours and not shared with anyone.
        unsafe { p.add(i).write((i % 251) as u8) };
    }
    for i in 0..r.len() {
        // SAFETY: as above.
        assert_eq!(unsafe { p.add(i).read() }, (i % 251) as u8);
    }
}

#[test]
fn anon_normal_region_is_rounded_prefaulted_and_locked() {
    let r = region(&RegionConfig::new("t-anon", 10_000).no_huge());
    assert_eq!(r.backend(), Backend::NormalAnon);
    assert_eq!(r.page_size(), 4096);
    assert_eq!(r.len(), 12_288);
    assert_eq!(r.name(), "t-anon");
    assert_eq!(r.as_ptr() as usize % 4096, 0);
    assert!(r.share_handle().is_none());
    assert!(all_resident(&r), "pages were not pre-faulted");
    assert_eq!(r.is_locked(), expect_locked(r.len()));
    write_read_back(&r);
    let n = notices_for("t-anon");
    assert_eq!(n.len(), 1, "{n:?}");
    let lock_word = if r.is_locked() {
        "anonymous, mlocked"
    } else {
        "anonymous, not mlocked"
    };
    assert!(
        n[0].starts_with(&format!(
            "mempool: region 't-anon' 12.0 KiB on 4 KiB pages ({lock_word}"
        )),
        "{}",
        n[0]
    );
}

#[test]
fn memfd_normal_region_is_shareable() {
    let r = region(
        &RegionConfig::new("t-memfd", MIB + 1)
            .shareable(true)
            .no_huge(),
    );
    assert_eq!(r.backend(), Backend::NormalMemfd);
    assert_eq!(r.len(), MIB + 4096);
    assert!(all_resident(&r));
    let h = r.share_handle().expect("shareable region has a handle");
    assert_eq!((h.len, h.page_size), (r.len(), 4096));
    let meta = fs::File::from(h.fd.try_clone_to_owned().expect("dup"))
        .metadata()
        .expect("fstat");
    assert_eq!(meta.len(), r.len() as u64);
    write_read_back(&r);
    let n = notices_for("t-memfd");
    assert!(
        n[0].contains("1.0 MiB on 4 KiB pages (memfd, shareable"),
        "{n:?}"
    );
    assert!(n[0].ends_with("; hugepages off (no_huge))"), "{n:?}");
}

#[test]
fn no_huge_never_uses_hugepages() {
    let _g = huge_lock();
    for shareable in [false, true] {
        let name = format!("t-nohuge-{shareable}");
        let r = region(
            &RegionConfig::new(&name, HUGE)
                .shareable(shareable)
                .huge(HugePolicy::Never),
        );
        assert!(!r.backend().is_huge());
        assert_eq!(r.backend().is_shareable(), shareable);
        assert_eq!(r.page_size(), 4096);
        assert!(notices_for(&name)[0].contains("hugepages off (no_huge)"));
    }
}

#[test]
fn auto_falls_back_to_normal_pages_and_says_why() {
    let _g = huge_lock();
    let (avail, total) = pool_2m();
    if avail > 64 {
        // Exhausting a big pool would allocate as much normal memory.
        println!("skipped: {avail} free hugepages is too many to force a fallback");
        return;
    }
    let wanted = avail + 1;
    let r = region(
        &RegionConfig::new("t-fallback", wanted as usize * HUGE)
            .shareable(true)
            .huge(HugePolicy::Auto),
    );
    assert_eq!(r.backend(), Backend::NormalMemfd);
    assert_eq!(r.page_size(), 4096);
    let n = notices_for("t-fallback");
    assert_eq!(n.len(), 1, "{n:?}");
    let why = if !std::path::Path::new("/sys/kernel/mm/hugepages/hugepages-2048kB").exists() {
        "no 2 MiB hugepages: cannot read".to_owned()
    } else if avail == 0 {
        format!("no free hugepages: 0 of {total} free, see `dpctl check`)")
    } else {
        format!("too few free 2 MiB hugepages: need {wanted}, {avail} of {total} free")
    };
    assert!(
        n[0].contains("on 4 KiB pages (memfd, shareable"),
        "{}",
        n[0]
    );
    assert!(n[0].contains(&why), "expected {why:?} in {:?}", n[0]);
}

#[test]
fn require_fails_with_the_numbers_when_pages_are_short() {
    let _g = huge_lock();
    let (avail, total) = pool_2m();
    let wanted = (avail + 1).max(32);
    set_notice_sink(capture);
    let cfg = RegionConfig::new("rx-pool", wanted as usize * HUGE)
        .shareable(true)
        .huge(HugePolicy::Require);
    let err = Region::new(&cfg).expect_err("more pages than are free");
    let MemError::HugepageShortage {
        name,
        wanted_pages,
        free_pages,
        page_size,
        ..
    } = &err
    else {
        panic!("expected HugepageShortage, got {err:?}");
    };
    assert_eq!(
        (name.as_str(), *wanted_pages, *free_pages, *page_size),
        ("rx-pool", wanted, avail, HUGE)
    );
    let msg = err.to_string();
    let expected = format!(
        "region 'rx-pool' needs {wanted} hugepages of 2 MiB but only {avail} are free; \
         reserve more with `echo {} > /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages` \
         (as root) or use no_huge",
        total + wanted - avail
    );
    assert_eq!(msg, expected);
    assert!(
        notices_for("rx-pool").is_empty(),
        "a failed region has no notice"
    );
    // The pool is untouched by the failed attempt.
    assert_eq!(pool_2m().0, avail);
}

#[test]
fn invalid_configs_are_rejected_with_reasons() {
    for (name, len) in [("", 4096), ("zero", 0), ("nul\0byte", 4096)] {
        let err = Region::new(&RegionConfig::new(name, len).no_huge()).expect_err(name);
        assert!(
            matches!(err, MemError::InvalidConfig { .. }),
            "{name:?}: {err:?}"
        );
        assert!(err.to_string().contains("invalid configuration"), "{err}");
    }
}

#[test]
fn contains_checks_bounds() {
    let r = region(&RegionConfig::new("t-contains", 8192).no_huge());
    let base = r.as_ptr() as usize;
    assert!(r.contains(base, r.len()));
    assert!(r.contains(base + 100, 200));
    assert!(r.contains(base + r.len() - 1, 1));
    assert!(!r.contains(base + r.len() - 1, 2));
    assert!(!r.contains(base + r.len(), 0));
    assert!(!r.contains(base - 1, 1));
    assert!(!r.contains(base + 1, usize::MAX));
}

#[test]
fn drop_unmaps() {
    let name = "t-drop-unmaps";
    let in_maps = || {
        fs::read_to_string("/proc/self/maps")
            .expect("maps")
            .contains(&format!("memfd:mempool:{name} "))
    };
    let r = region(&RegionConfig::new(name, 4096).shareable(true).no_huge());
    assert!(in_maps());
    drop(r);
    assert!(!in_maps(), "region still mapped after drop");
}

#[test]
fn from_shared_rejects_a_mismatched_fd() {
    let r = region(
        &RegionConfig::new("t-mismatch", 8192)
            .shareable(true)
            .no_huge(),
    );
    let h = r.share_handle().expect("handle");
    let dup = || h.fd.try_clone_to_owned().expect("dup");
    let err = Region::from_shared(dup(), 4096, 4096, "peer").expect_err("wrong len");
    assert!(
        matches!(
            err,
            MemError::SharedMismatch {
                fd_len: 8192,
                len: 4096,
                ..
            }
        ),
        "{err:?}"
    );
    let err = Region::from_shared(dup(), 8192, 3000, "peer").expect_err("bad page size");
    assert!(matches!(err, MemError::InvalidConfig { .. }), "{err:?}");
    let err = Region::from_shared(dup(), 2 * HUGE, HUGE, "peer").expect_err("not hugetlb");
    assert!(
        matches!(
            err,
            MemError::SharedMismatch {
                fd_page_size: 4096,
                ..
            }
        ),
        "{err:?}"
    );
}

/// A shareable region's memfd is sealed against resizing: whoever it is shared with cannot
/// truncate it under our mapping (which would make our next access a SIGBUS).
#[test]
fn shareable_memfd_cannot_be_resized_by_a_peer() {
    use std::os::fd::AsRawFd;
    let r = region(
        &RegionConfig::new("t-sealed", 8192)
            .shareable(true)
            .no_huge(),
    );
    let h = r.share_handle().expect("handle");
    // What a hostile peer would do with the descriptor it was sent.
    // SAFETY: plain ftruncate on a live descriptor.
    let shrink = unsafe { libc::ftruncate(h.fd.as_raw_fd(), 0) };
    let errno = std::io::Error::last_os_error();
    assert_eq!(shrink, -1, "shrinking a shared region's memfd succeeded");
    assert_eq!(errno.raw_os_error(), Some(libc::EPERM), "{errno}");
    // SAFETY: as above.
    let grow = unsafe { libc::ftruncate(h.fd.as_raw_fd(), 1 << 20) };
    assert_eq!(grow, -1, "growing a shared region's memfd succeeded");
    write_read_back(&r);
}

/// `from_shared` refuses a memfd its owner could still shrink.
#[test]
fn from_shared_rejects_an_unsealed_memfd() {
    use std::os::fd::{FromRawFd, OwnedFd};
    // SAFETY: memfd_create with a valid NUL-terminated name; the result is checked.
    let fd = unsafe { libc::memfd_create(c"t-unsealed".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let f = fs::File::from(fd);
    f.set_len(8192).expect("size");
    let err = Region::from_shared(f.into(), 8192, 4096, "peer").expect_err("unsealed");
    assert!(
        matches!(&err, MemError::SharedFd { source, .. } if source.to_string().contains("F_SEAL_SHRINK")),
        "{err:?}"
    );
}

/// After `seal_future_write`, the owner still writes through its mapping, a peer can map
/// the memfd only read-only and sees the owner's writes.
#[test]
fn future_write_seal_leaves_peers_read_only() {
    let r = region(&RegionConfig::new("t-ro", 8192).shareable(true).no_huge());
    r.seal_future_write().expect("seal");
    r.store_u8(100, 7);
    let h = r.share_handle().expect("handle");
    let dup = || h.fd.try_clone_to_owned().expect("dup");
    let err = Region::from_shared_quiet(dup(), 8192, 4096, "peer-rw").expect_err("rw map");
    assert!(matches!(err, MemError::Map { .. }), "{err:?}");
    let peer = Region::from_shared_read_only_quiet(dup(), 8192, 4096, "peer-ro").expect("ro map");
    assert!(!peer.is_writable());
    assert_eq!(peer.load_u8(100), 7);
    r.store_u8(100, 9);
    assert_eq!(peer.load_u8(100), 9);
    let caught = std::panic::catch_unwind(|| peer.store_u8(0, 1));
    assert!(
        caught.is_err(),
        "a store into a read-only region did not panic"
    );
}

#[test]
fn copy_from_moves_bytes_between_regions_and_checks_both_ranges() {
    let a = Region::new(&RegionConfig::new("copy-a", 8192).quiet()).unwrap();
    let b = Region::new(&RegionConfig::new("copy-b", 4096).quiet()).unwrap();
    let bytes: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
    a.copy_in(4096, &bytes);
    b.copy_from(0, &a, 4096, 4096);
    let mut out = vec![0u8; 4096];
    b.copy_out(0, &mut out);
    assert_eq!(out, bytes);
    // Within one region, overlapping: a memmove.
    a.copy_from(4097, &a, 4096, 100);
    let mut o = vec![0u8; 100];
    a.copy_out(4097, &mut o);
    assert_eq!(o, bytes[..100]);
    for (dst_off, src_off) in [(1, 0), (0, 4097), (usize::MAX, 0)] {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            b.copy_from(dst_off, &a, src_off, 4096)
        }));
        assert!(r.is_err(), "{dst_off}/{src_off} must be refused");
    }
}
