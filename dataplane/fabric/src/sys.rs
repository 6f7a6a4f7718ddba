//! Small, safe wrappers over the few OS calls the protocol layers need on their control
//! paths (never on a data path): waiting for descriptors to become readable, an eventfd to
//! wake a waiting thread, and the futex a completion queue's sleeping poller waits on.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// Waits until any of `fds` is readable (or hung up / invalid) or `timeout` passes.
/// Returns a bit mask: bit `i` set if `fds[i]` has something to report. An invalid
/// descriptor reports itself (`POLLNVAL`) rather than failing.
///
/// # Errors
/// The OS error of `poll(2)` (not `EINTR`, which returns an empty mask).
pub fn poll_readable(fds: &[RawFd], timeout: Option<Duration>) -> io::Result<u64> {
    assert!(fds.len() <= 64, "at most 64 descriptors");
    let mut p = [libc::pollfd {
        fd: -1,
        events: 0,
        revents: 0,
    }; 64];
    for (d, fd) in p.iter_mut().zip(fds) {
        d.fd = *fd;
        d.events = libc::POLLIN;
    }
    let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
    // SAFETY: p is a live array; we pass its first fds.len() entries.
    let r = unsafe { libc::poll(p.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok(0)
        } else {
            Err(e)
        };
    }
    Ok(p[..fds.len()]
        .iter()
        .enumerate()
        .filter(|(_, d)| d.revents != 0)
        .fold(0u64, |m, (i, _)| m | 1 << i))
}

/// An eventfd: a counter another thread can wait on with [`poll_readable`].
#[derive(Debug)]
pub struct EventFd(OwnedFd);

impl EventFd {
    /// A non-blocking, close-on-exec eventfd.
    ///
    /// # Errors
    /// The OS error of `eventfd(2)`.
    pub fn new() -> io::Result<Self> {
        // SAFETY: eventfd with valid flags; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor we own.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Makes the eventfd readable.
    pub fn notify(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd.
        unsafe { libc::write(self.0.as_raw_fd(), (&raw const one).cast(), 8) };
    }

    /// Clears it.
    pub fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our non-blocking eventfd.
        unsafe { libc::read(self.0.as_raw_fd(), (&raw mut v).cast(), 8) };
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Sleeps while `word` holds `expected`, up to `timeout` (`FUTEX_WAIT` on a word that may
/// live in memory shared between processes, so not `FUTEX_PRIVATE_FLAG`). Returns at once
/// if the word already differs; spurious returns are possible, callers re-check.
///
/// This is the sleeping half of a completion queue's notification, used by a blocking
/// call after it has busy-polled for its polling time: a system call, but not on the data
/// path (nothing was there to process).
pub fn futex_wait(word: &std::sync::atomic::AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: word is a live, aligned u32 for the duration of the call; ts is a live
    // timespec; FUTEX_WAIT reads the word and sleeps, it writes nothing.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &raw const ts,
        );
    }
}

/// Wakes every thread (of any process) sleeping in [`futex_wait`] on `word`. The waker's
/// side of a completion queue's notification: called only when a sleeper announced itself.
pub fn futex_wake(word: &std::sync::atomic::AtomicU32) {
    // SAFETY: word is a live, aligned u32; FUTEX_WAKE only looks up its address.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eventfd_wakes_poll() {
        let e = EventFd::new().unwrap();
        assert_eq!(
            poll_readable(&[e.as_raw_fd()], Some(Duration::ZERO)).unwrap(),
            0
        );
        e.notify();
        assert_eq!(
            poll_readable(&[e.as_raw_fd()], Some(Duration::ZERO)).unwrap(),
            1
        );
        e.drain();
        assert_eq!(
            poll_readable(&[e.as_raw_fd()], Some(Duration::from_millis(1))).unwrap(),
            0
        );
        assert_eq!(
            poll_readable(&[-1, e.as_raw_fd()], Some(Duration::ZERO)).unwrap(),
            0
        );
    }
}
