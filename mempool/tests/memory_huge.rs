//! Hugepage backends. Each test reads the free pages from sysfs and, with
//! fewer than it needs, prints why it skipped and returns; reserve a pool to
//! run them: `echo 64 > /proc/sys/vm/nr_hugepages` (as root), and set it back
//! to 0 afterwards.
//!
//! Tests in this binary take a lock so their sysfs accounting is not
//! disturbed by each other.

use std::fs;
use std::sync::{Mutex, MutexGuard, PoisonError};

use mempool::memory::{Backend, HugePolicy, MemError, Region, RegionConfig, set_notice_sink};

const HUGE: usize = 2 << 20;

static NOTICES: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn capture(line: &str) {
    NOTICES
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(line.to_owned());
}

fn notice_for(name: &str) -> String {
    let tag = format!("region '{name}' ");
    let all = NOTICES.lock().unwrap_or_else(PoisonError::into_inner);
    let mine: Vec<&String> = all.iter().filter(|l| l.contains(&tag)).collect();
    assert_eq!(mine.len(), 1, "one notice per region: {mine:?}");
    mine[0].clone()
}

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Pool counters straight from sysfs: (free - reserved, free).
fn pool(page_size: usize) -> Option<(u64, u64)> {
    let dir = format!("/sys/kernel/mm/hugepages/hugepages-{}kB", page_size / 1024);
    let read = |f: &str| -> Option<u64> {
        fs::read_to_string(format!("{dir}/{f}"))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    let free = read("free_hugepages")?;
    Some((free.saturating_sub(read("resv_hugepages")?), free))
}

/// The default hugepage size (what the private backend uses).
fn default_size() -> Option<usize> {
    let meminfo = fs::read_to_string("/proc/meminfo").ok()?;
    let kb: usize = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("Hugepagesize:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// `true` (after printing why) when fewer than `pages` pages are available.
fn skip(page_size: usize, pages: u64) -> bool {
    let avail = pool(page_size).map_or(0, |p| p.0);
    if avail < pages {
        println!(
            "skipped: no hugepages reserved (echo 64 > /proc/sys/vm/nr_hugepages): \
             need {pages} free pages of {} KiB, {avail} available",
            page_size / 1024
        );
        return true;
    }
    false
}

fn resident(r: &Region) -> bool {
    let pages = r.len().div_ceil(4096);
    let mut vec = vec![0u8; pages];
    // SAFETY: the live mapping of the region, one vector byte per 4 KiB.
    let rc = unsafe { libc::mincore(r.as_ptr().cast(), r.len(), vec.as_mut_ptr()) };
    assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
    vec.iter().all(|v| v & 1 == 1)
}

#[test]
fn shareable_region_on_2m_hugepages_is_prefaulted() {
    let _g = serial();
    if skip(HUGE, 3) {
        return;
    }
    set_notice_sink(capture);
    let (_, free_before) = pool(HUGE).expect("pool");
    let cfg = RegionConfig::new("huge-memfd", 5 << 20)
        .shareable(true)
        .huge(HugePolicy::Require);
    let r = Region::new(&cfg).expect("3 pages are free");
    assert_eq!(r.backend(), Backend::HugeMemfd);
    assert_eq!((r.len(), r.page_size()), (6 << 20, HUGE));
    assert_eq!(r.as_ptr() as usize % HUGE, 0);
    assert!(r.is_locked(), "hugetlb pages are never swapped");
    assert!(resident(&r));
    // Pre-faulted: the pages left the free pool at creation, not at first use.
    assert_eq!(pool(HUGE).expect("pool").1, free_before - 3);
    let h = r.share_handle().expect("shareable");
    assert_eq!((h.len, h.page_size), (6 << 20, HUGE));
    assert_eq!(
        notice_for("huge-memfd"),
        "mempool: region 'huge-memfd' 6.0 MiB on 2 MiB hugepages (memfd, shareable)"
    );
    drop(r);
    assert_eq!(
        pool(HUGE).expect("pool").1,
        free_before,
        "pages returned on drop"
    );
}

#[test]
fn private_region_uses_hugepage_rs_at_the_default_size() {
    let _g = serial();
    let Some(size) = default_size() else {
        println!("skipped: no Hugepagesize in /proc/meminfo (no hugetlb support)");
        return;
    };
    if skip(size, 2) {
        return;
    }
    set_notice_sink(capture);
    let (_, free_before) = pool(size).expect("pool");
    let r = Region::new(&RegionConfig::new("huge-anon", size + 1).huge(HugePolicy::Require))
        .expect("2 pages are free");
    assert_eq!(r.backend(), Backend::HugeAnon);
    assert_eq!((r.len(), r.page_size()), (2 * size, size));
    assert!(r.share_handle().is_none());
    assert!(resident(&r));
    assert_eq!(pool(size).expect("pool").1, free_before - 2);
    // SAFETY: both ends are inside the private region.
    unsafe {
        r.as_ptr().write(1);
        r.as_ptr().add(r.len() - 1).write(2);
        assert_eq!(
            (r.as_ptr().read(), r.as_ptr().add(r.len() - 1).read()),
            (1, 2)
        );
    }
    let unit = if size >= 1 << 30 {
        format!("{} GiB", size >> 30)
    } else {
        format!("{} MiB", size >> 20)
    };
    let n = notice_for("huge-anon");
    assert!(
        n.ends_with(&format!("on {unit} hugepages (anonymous, private)")),
        "{n}"
    );
    drop(r);
    assert_eq!(pool(size).expect("pool").1, free_before);
}

#[test]
fn auto_prefers_hugepages_when_free() {
    let _g = serial();
    if skip(HUGE, 1) {
        return;
    }
    set_notice_sink(capture);
    let r = Region::new(&RegionConfig::new("huge-auto", 4096).shareable(true)).expect("auto");
    assert_eq!(r.backend(), Backend::HugeMemfd);
    assert_eq!(r.len(), HUGE);
    assert!(notice_for("huge-auto").contains("on 2 MiB hugepages"));
}

#[test]
fn peer_mapping_of_a_hugepage_memfd_sees_the_same_pages() {
    let _g = serial();
    if skip(HUGE, 1) {
        return;
    }
    set_notice_sink(capture);
    let r = Region::new(
        &RegionConfig::new("huge-peer-src", HUGE)
            .shareable(true)
            .huge(HugePolicy::Require),
    )
    .expect("one page is free");
    let h = r.share_handle().expect("shareable");
    let fd = || h.fd.try_clone_to_owned().expect("dup");

    let wrong = Region::from_shared(fd(), HUGE, 4096, "huge-peer-wrong").expect_err("4 KiB");
    assert!(
        matches!(
            wrong,
            MemError::SharedMismatch {
                fd_page_size: HUGE,
                ..
            }
        ),
        "{wrong:?}"
    );

    let peer = Region::from_shared(fd(), h.len, h.page_size, "huge-peer").expect("map");
    assert_eq!(peer.backend(), Backend::HugeMemfd);
    assert_ne!(peer.as_ptr(), r.as_ptr());
    // SAFETY: offsets inside both live mappings; single-threaded use.
    unsafe {
        r.as_ptr().add(12345).write(0x77);
        assert_eq!(peer.as_ptr().add(12345).read_volatile(), 0x77);
        peer.as_ptr().add(HUGE - 1).write(0x88);
        assert_eq!(r.as_ptr().add(HUGE - 1).read_volatile(), 0x88);
    }
    assert!(notice_for("huge-peer").contains("(memfd, mapped from peer)"));
}

#[test]
fn require_beyond_the_pool_fails_and_leaves_it_untouched() {
    let _g = serial();
    let Some((avail, free)) = pool(HUGE) else {
        println!("skipped: the kernel has no 2 MiB hugepage pool");
        return;
    };
    let wanted = avail + 1;
    let cfg = RegionConfig::new("huge-too-big", wanted as usize * HUGE)
        .shareable(true)
        .huge(HugePolicy::Require);
    let err = Region::new(&cfg).expect_err("one page more than available");
    assert!(
        matches!(err, MemError::HugepageShortage { wanted_pages, free_pages, .. }
            if wanted_pages == wanted && free_pages == avail),
        "{err:?}"
    );
    assert_eq!(pool(HUGE), Some((avail, free)));
}
