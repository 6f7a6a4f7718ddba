//! Two processes share one region: the parent creates it and writes the
//! first half, a child (this test binary re-executed with the memfd
//! inherited) maps it with `Region::from_shared`, checks the first half and
//! writes the second, and the parent checks the second half.
//!
//! The hugepage variant runs when at least two 2 MiB hugepages are free and
//! otherwise prints why it was skipped.

use std::env;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mempool::memory::{Backend, HugePolicy, Region, RegionConfig, set_notice_sink};

/// Descriptor number the child finds the memfd at.
const CHILD_FD: i32 = 100;
const ENV_GEOMETRY: &str = "MEMPOOL_TEST_SHARED_REGION";

fn quiet(_: &str) {}

fn parent_byte(i: usize) -> u8 {
    (i.wrapping_mul(31) ^ 0x5a) as u8
}

fn child_byte(i: usize) -> u8 {
    (i.wrapping_mul(17) ^ 0xc3) as u8
}

/// Checks `[from, to)` of the region against `pattern`, returning the first
/// mismatch.
fn check(r: &Region, from: usize, to: usize, pattern: fn(usize) -> u8) -> Result<(), String> {
    for i in from..to {
        // SAFETY: i < r.len(); the other process is not writing this half.
        let got = unsafe { r.as_ptr().add(i).read_volatile() };
        if got != pattern(i) {
            return Err(format!("byte {i}: got {got:#x}, want {:#x}", pattern(i)));
        }
    }
    Ok(())
}

fn fill(r: &Region, from: usize, to: usize, pattern: fn(usize) -> u8) {
    for i in from..to {
        // SAFETY: i < r.len(); the other process does not touch this half.
        unsafe { r.as_ptr().add(i).write_volatile(pattern(i)) };
    }
}

/// Child side, run only when re-executed by `share_with_child`.
#[test]
#[ignore = "helper: the child half of the cross-process tests"]
fn child_maps_and_writes() {
    let Ok(geometry) = env::var(ENV_GEOMETRY) else {
        return;
    };
    let (len, page_size) = geometry
        .split_once(',')
        .and_then(|(l, p)| Some((l.parse().ok()?, p.parse().ok()?)))
        .expect("geometry env var is `len,page_size`");
    // SAFETY: the parent dup2'ed the memfd to CHILD_FD for us and nothing
    // else in this process owns that descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(CHILD_FD) };
    set_notice_sink(quiet);
    let r = Region::from_shared(fd, len, page_size, "peer").expect("from_shared in the child");
    assert_eq!(r.len(), len);
    assert_eq!(r.page_size(), page_size);
    check(&r, 0, len / 2, parent_byte).expect("parent's half, seen by the child");
    fill(&r, len / 2, len, child_byte);
}

/// Creates the region as `cfg` says, runs the child on it and checks both halves.
fn share_with_child(cfg: &RegionConfig, backend: Backend) {
    set_notice_sink(quiet);
    let r = Region::new(cfg).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.backend(), backend);
    let len = r.len();
    fill(&r, 0, len / 2, parent_byte);

    let h = r.share_handle().expect("shareable");
    let raw = h.fd.as_raw_fd();
    let mut cmd = Command::new(env::current_exe().expect("test binary path"));
    cmd.args([
        "--exact",
        "child_maps_and_writes",
        "--include-ignored",
        "--test-threads=1",
    ])
    .env(ENV_GEOMETRY, format!("{len},{}", h.page_size))
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    // SAFETY: the hook runs between fork and exec and calls only dup2 and
    // fcntl, which are async-signal-safe; `raw` stays open in the parent
    // (the region lives until after wait).
    unsafe {
        cmd.pre_exec(move || {
            if raw == CHILD_FD {
                // dup2 onto itself would keep FD_CLOEXEC; clear it instead.
                if libc::fcntl(raw, libc::F_SETFD, 0) < 0 {
                    return Err(io::Error::last_os_error());
                }
            } else if libc::dup2(raw, CHILD_FD) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("spawn child");
    // Hang guard only: the child finishes in well under a second.
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("child did not finish within 120 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let out = child.wait_with_output().expect("child output");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(status.success(), "child failed: {status}\n{report}");
    assert!(
        report.contains("1 passed"),
        "child did not run its half:\n{report}"
    );
    check(&r, len / 2, len, child_byte).expect("child's half, seen by the parent");
}

#[test]
fn normal_memfd_region_is_shared_with_a_child() {
    share_with_child(
        &RegionConfig::new("xproc-normal", 3 * 4096 + 10)
            .shareable(true)
            .no_huge(),
        Backend::NormalMemfd,
    );
}

fn free_2m_hugepages() -> u64 {
    let dir = "/sys/kernel/mm/hugepages/hugepages-2048kB";
    let read = |f: &str| -> u64 {
        fs::read_to_string(format!("{dir}/{f}"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    };
    read("free_hugepages").saturating_sub(read("resv_hugepages"))
}

#[test]
fn hugepage_memfd_region_is_shared_with_a_child() {
    if free_2m_hugepages() < 2 {
        println!("skipped: no hugepages reserved (echo 64 > /proc/sys/vm/nr_hugepages)");
        return;
    }
    share_with_child(
        &RegionConfig::new("xproc-huge", 4 << 20)
            .shareable(true)
            .huge(HugePolicy::Require),
        Backend::HugeMemfd,
    );
}
