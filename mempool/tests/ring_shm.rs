//! A ring in a `MAP_SHARED` anonymous mapping, used by two processes.
//!
//! The parent formats the ring and forks; the child attaches the producer side and enqueues
//! 1,000,000 `u64` in order; the parent attaches the consumer side and checks order and count.
//! The only other contact between the processes is `waitpid` at the end. Every wait is bounded:
//! a stuck child `_exit`s with a distinct status, a stuck parent kills the child and fails.
#![cfg(all(unix, not(loom)))]

use std::ptr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mempool::ring::{KeepAlive, Ring, RingLayout, Single};

const COUNT: u64 = 1_000_000;
const CAPACITY: usize = 1024;
/// Hang guard for either process; a healthy run takes well under a second.
const DEADLINE: Duration = Duration::from_secs(60);

/// Child exit codes.
const CHILD_OK: i32 = 0;
const CHILD_ATTACH_FAILED: i32 = 3;
const CHILD_TIMED_OUT: i32 = 4;

/// An anonymous shared mapping, unmapped when the last handle lets go of it.
struct SharedMap {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory; the ring handles synchronise all access to it.
unsafe impl Send for SharedMap {}
// SAFETY: as above; `SharedMap` itself only unmaps on drop.
unsafe impl Sync for SharedMap {}

impl SharedMap {
    fn new(len: usize) -> Self {
        // SAFETY: anonymous mapping request with valid arguments; checked for MAP_FAILED below.
        let ptr = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(
            ptr,
            libc::MAP_FAILED,
            "mmap: {}",
            std::io::Error::last_os_error()
        );
        Self {
            ptr: ptr.cast(),
            len,
        }
    }
}

impl Drop for SharedMap {
    fn drop(&mut self) {
        // SAFETY: mapped in `new` with this length; no handle uses it any more (we are the
        // last `Arc` owner).
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// Child side: attach the producer and enqueue `0..COUNT` in order, mixing bulk, burst and
/// single enqueues. Allocation-free (the parent's threads may hold allocator locks at fork
/// time), and never returns: the child must not run the test harness's exit path.
fn child(mem: *mut u8, len: usize, keep: &KeepAlive) -> ! {
    let started = Instant::now();
    // Cloning an `Arc` only bumps a counter: no allocation.
    // SAFETY: the parent formatted the region before forking; this is the only producer.
    let tx = unsafe { Ring::<u64>::attach_producer::<Single>(mem, len, Arc::clone(keep)) };
    let Ok(mut tx) = tx else {
        // SAFETY: `_exit` is async-signal-safe and skips the parent's atexit handlers.
        unsafe { libc::_exit(CHILD_ATTACH_FAILED) }
    };
    let mut next = 0u64;
    let mut batch = [0u64; 37];
    let mut round = 0u32;
    while next < COUNT {
        let n = (COUNT - next).min(batch.len() as u64) as usize;
        for (i, slot) in batch[..n].iter_mut().enumerate() {
            *slot = next + i as u64;
        }
        let done = match round % 3 {
            0 => tx.enqueue_bulk(&batch[..n]),
            1 => tx.enqueue_burst(&batch[..n]),
            _ => usize::from(tx.enqueue(next).is_ok()),
        };
        round = round.wrapping_add(1);
        next += done as u64;
        if done == 0 {
            std::thread::yield_now();
            if started.elapsed() > DEADLINE {
                // SAFETY: as above.
                unsafe { libc::_exit(CHILD_TIMED_OUT) }
            }
        }
    }
    // SAFETY: as above.
    unsafe { libc::_exit(CHILD_OK) }
}

/// Waits for `pid` with a deadline; kills it if it does not exit in time.
fn reap(pid: libc::pid_t) -> Result<i32, String> {
    let started = Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: `pid` is our child; `status` is a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return if libc::WIFEXITED(status) {
                Ok(libc::WEXITSTATUS(status))
            } else {
                Err(format!("child did not exit normally: status {status:#x}"))
            };
        }
        if r < 0 {
            return Err(format!("waitpid: {}", std::io::Error::last_os_error()));
        }
        if started.elapsed() > DEADLINE {
            // SAFETY: `pid` is our child, not yet reaped.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            // SAFETY: as above; blocking reap after SIGKILL cannot hang.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            return Err("child did not exit before the deadline".into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn fork_child_produces_parent_consumes() {
    let len = RingLayout::bytes_for::<u64>(CAPACITY).unwrap();
    let map = SharedMap::new(len);
    let mem = map.ptr;
    let keep: KeepAlive = Arc::new(map);
    // SAFETY: fresh private-to-us mapping of `len` bytes; nobody else can see it yet, and the
    // fork below orders formatting before the child's attach.
    unsafe { Ring::<u64>::init_in::<Single, Single>(mem, len, CAPACITY) }.unwrap();

    // SAFETY: plain fork; the child only runs allocation-free code and `_exit`s.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        child(mem, len, &keep);
    }

    // SAFETY: formatted before the fork; this process is the only consumer.
    let rx = unsafe { Ring::<u64>::attach_consumer::<Single>(mem, len, Arc::clone(&keep)) };
    let mut rx = match rx {
        Ok(rx) => rx,
        Err(e) => {
            let _ = reap(pid);
            panic!("parent attach failed: {e}");
        }
    };

    let started = Instant::now();
    let mut expected = 0u64;
    let mut buf = [0u64; 64];
    let mut failure = None;
    while expected < COUNT {
        let n = rx.dequeue_burst(&mut buf);
        for &v in &buf[..n] {
            if v != expected {
                failure = Some(format!("got {v}, expected {expected}"));
                break;
            }
            expected += 1;
        }
        if failure.is_some() {
            break;
        }
        if n == 0 {
            if started.elapsed() > DEADLINE {
                failure = Some(format!(
                    "only {expected} of {COUNT} elements before the deadline"
                ));
                break;
            }
            std::thread::yield_now();
        }
    }
    let status = reap(pid);
    if let Some(f) = failure {
        panic!("{f} (child: {status:?})");
    }
    assert_eq!(status, Ok(CHILD_OK), "child exit status");
    assert_eq!(expected, COUNT);
    assert!(
        rx.is_empty(),
        "the child enqueued more than {COUNT} elements"
    );
    assert_eq!(rx.dequeue(), None);
}
