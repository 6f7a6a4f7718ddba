//! Normal-page regions under a small `RLIMIT_MEMLOCK` without
//! `CAP_IPC_LOCK`: a region that fits is mlocked, one that does not is left
//! unlocked and its notice says why. Runs in a child process (this binary
//! re-executed) because the limit is process-wide and, for root, dropping
//! `CAP_IPC_LOCK` means removing it from the bounding set before `exec`.

use std::env;
use std::io;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::{Mutex, PoisonError};

use mempool::memory::{Limit, Preflight, Region, RegionConfig, set_notice_sink};

const ENV_CHILD: &str = "MEMPOOL_TEST_MEMLOCK_CHILD";
const LIMIT: u64 = 64 * 1024;
/// `CAP_IPC_LOCK` from `<linux/capability.h>` (not exported by `libc`).
const CAP_IPC_LOCK: libc::c_ulong = 14;

static NOTICES: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn capture(line: &str) {
    NOTICES
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(line.to_owned());
}

#[test]
#[ignore = "helper: runs in a child with a 64 KiB memlock limit"]
fn child_under_small_memlock() {
    if env::var_os(ENV_CHILD).is_none() {
        return;
    }
    let pf = Preflight::gather();
    assert_eq!(
        pf.memlock.soft,
        Limit::Bytes(LIMIT),
        "limit set by the parent"
    );
    if pf.cap_ipc_lock {
        println!("skipped: CAP_IPC_LOCK could not be dropped");
        return;
    }
    set_notice_sink(capture);
    let small = Region::new(&RegionConfig::new("ml-small", 16 * 1024).no_huge()).expect("small");
    assert!(small.is_locked(), "16 KiB fits in a 64 KiB limit");
    let big = Region::new(
        &RegionConfig::new("ml-big", 1 << 20)
            .shareable(true)
            .no_huge(),
    )
    .expect("an unlockable region is still created");
    assert!(!big.is_locked());
    let notices = NOTICES.lock().unwrap_or_else(PoisonError::into_inner);
    assert!(
        notices[0].contains("(anonymous, mlocked; hugepages off"),
        "{notices:?}"
    );
    assert!(
        notices[1].contains(
            "(memfd, shareable, not mlocked: RLIMIT_MEMLOCK is 64.0 KiB with 16.0 KiB already \
             locked, raise it with `ulimit -l unlimited` or grant CAP_IPC_LOCK; hugepages off"
        ),
        "{notices:?}"
    );
    println!("child checks done");
}

#[test]
fn regions_beyond_the_memlock_limit_stay_unlocked_and_say_why() {
    let mut cmd = Command::new(env::current_exe().expect("test binary"));
    cmd.args([
        "--exact",
        "child_under_small_memlock",
        "--include-ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(ENV_CHILD, "1");
    // SAFETY: the hook runs between fork and exec and makes only raw system
    // calls (prctl, setrlimit), which are async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            // Root regains every capability in the bounding set at exec;
            // take CAP_IPC_LOCK out of it. Non-root lacks it anyway (EPERM).
            let _ = libc::prctl(libc::PR_CAPBSET_DROP, CAP_IPC_LOCK, 0, 0, 0);
            let rl = libc::rlimit {
                rlim_cur: LIMIT,
                rlim_max: LIMIT,
            };
            if libc::setrlimit(libc::RLIMIT_MEMLOCK, &rl) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    // The child does a few small mmaps and exits; no hang guard beyond the
    // test harness is needed.
    let out = cmd.output().expect("run child");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child failed:\n{text}");
    assert!(
        text.contains("child checks done") || text.contains("skipped: CAP_IPC_LOCK"),
        "child did not run:\n{text}"
    );
    if text.contains("skipped") {
        println!("skipped: CAP_IPC_LOCK could not be dropped in the child");
    }
}
