//! `rpoll` and `rselect` over any mix of rsockets and ordinary descriptors.
//!
//! Each round makes progress on the whole context (completions and connection events of
//! every stream socket), reads each rsocket's readiness, and asks the kernel about the
//! ordinary descriptors with a zero-timeout `poll(2)`. Between rounds the caller spins for
//! the context's polling time, then yields, then sleeps in short steps (see
//! [`Backoff`](crate::engine::Backoff)): latency first, and never a core burnt for long. A
//! set of ordinary descriptors only is handed to `poll(2)` as is.
//!
//! Two differences from librdmacm's `rpoll`, both fixes: the timeout is measured from the
//! start of the call, so a long timeout never expires early; and a stream whose peer
//! disconnected reports `POLLHUP` only once the data that arrived before the disconnect has
//! been read (until then `POLLIN` alone), as TCP does. librdmacm reports `POLLHUP` at once,
//! so a program that treats `POLLHUP` as fatal while reading (rstream `-T a` does) loses
//! the end of the stream whenever the disconnect overtakes its last reads.

use std::time::{Duration, Instant};

use dataplane::fabric::Provider;
use dataplane::rsocket::{Ready, RsError};
use libc::{c_int, c_short, pollfd};

use crate::engine::{Backoff, Engine};
use crate::errno::Errno;
use crate::handles::{Handle, Kind};

const IN: c_short = libc::POLLIN | libc::POLLRDNORM;
const OUT: c_short = libc::POLLOUT | libc::POLLWRNORM;

/// `revents` for readiness `r` of a socket polled for `events`.
fn revents(r: Ready, events: c_short) -> c_short {
    let mut v = 0;
    if r.readable {
        v |= events & IN;
    }
    if r.writable {
        v |= events & OUT;
    }
    if r.hup {
        v |= libc::POLLHUP;
    }
    if r.err {
        v |= libc::POLLERR;
    }
    v
}

/// Which entries of a poll set are rsockets: a bitmap, on the stack for sets of up to 256.
enum Marks {
    Small([u64; 4]),
    Large(Vec<u64>),
}

impl Marks {
    fn new(n: usize) -> Self {
        if n <= 256 {
            Self::Small([0; 4])
        } else {
            Self::Large(vec![0; n.div_ceil(64)])
        }
    }

    fn words(&mut self) -> &mut [u64] {
        match self {
            Self::Small(w) => w,
            Self::Large(w) => w,
        }
    }

    fn set(&mut self, i: usize) {
        self.words()[i / 64] |= 1 << (i % 64);
    }

    fn get(&mut self, i: usize) -> bool {
        self.words()[i / 64] & (1 << (i % 64)) != 0
    }
}

/// `poll(2)` on `fds` with `timeout` milliseconds; EINTR is the caller's, as with poll.
///
/// # Errors
/// The `errno` of poll(2).
pub(crate) fn sys_poll(fds: &mut [pollfd], timeout: c_int) -> Result<c_int, Errno> {
    // SAFETY: fds is a live, exclusively borrowed array of fds.len() pollfds.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
    if n < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(n)
}

impl<P: Provider> Engine<P> {
    /// The `revents` of rsocket `h` (after the round's progress).
    fn rsocket_revents(&self, h: &Handle<P>, events: c_short) -> c_short {
        let r = match &h.kind {
            // POLLHUP waits until the data that arrived before the disconnect is read.
            Kind::Stream(id) => self.ctx.readiness_now(*id).map(|mut r| {
                if r.hup && self.ctx.readable_bytes(*id).is_ok_and(|n| n > 0) {
                    r.hup = false;
                }
                r
            }),
            // A datagram socket busy in another thread's blocking call is not ready yet.
            Kind::Dgram(d) => match d.try_lock() {
                Ok(mut d) => Ok(d.readiness()),
                Err(std::sync::TryLockError::Poisoned(p)) => Ok(p.into_inner().readiness()),
                Err(std::sync::TryLockError::WouldBlock) => Ok(Ready::default()),
            },
        };
        match r {
            Ok(r) => revents(r, events),
            // Closed by another thread meanwhile.
            Err(RsError::BadSocket) => libc::POLLNVAL,
            Err(_) => libc::POLLERR,
        }
    }

    /// One round over the whole set; returns the entries with events.
    fn poll_round(
        &self,
        fds: &mut [pollfd],
        marks: &mut Marks,
        plain: bool,
    ) -> Result<c_int, Errno> {
        self.ctx.progress();
        if plain {
            // The kernel ignores negative descriptors: hide the rsockets from it.
            for (i, p) in fds.iter_mut().enumerate() {
                if marks.get(i) {
                    p.fd = !p.fd;
                }
            }
            let r = sys_poll(fds, 0);
            for (i, p) in fds.iter_mut().enumerate() {
                if marks.get(i) {
                    p.fd = !p.fd;
                }
            }
            r?;
        }
        let mut n = 0;
        for (i, p) in fds.iter_mut().enumerate() {
            if marks.get(i) {
                p.revents = match self.handles.get(p.fd) {
                    Some(h) => self.rsocket_revents(&h, p.events),
                    None => libc::POLLNVAL,
                };
            } else if !plain {
                p.revents = 0;
            }
            if p.revents != 0 {
                n += 1;
            }
        }
        Ok(n)
    }

    /// `rpoll`: waits up to `timeout` milliseconds (negative: forever, zero: just look).
    ///
    /// # Errors
    /// As poll(2) (`EINTR` from a signal while polling ordinary descriptors, `ENOMEM`).
    pub(crate) fn poll(&self, fds: &mut [pollfd], timeout: c_int) -> Result<c_int, Errno> {
        let mut marks = Marks::new(fds.len());
        let (mut any_rs, mut plain) = (false, false);
        for (i, p) in fds.iter().enumerate() {
            if self.handles.contains(p.fd) {
                marks.set(i);
                any_rs = true;
            } else if p.fd >= 0 {
                plain = true;
            }
        }
        if !any_rs {
            return sys_poll(fds, timeout);
        }
        let deadline = u64::try_from(timeout)
            .ok()
            .map(|ms| Instant::now() + Duration::from_millis(ms));
        let mut wait = Backoff::new(self.ctx.polling_time());
        loop {
            let n = self.poll_round(fds, &mut marks, plain)?;
            if n > 0 || timeout == 0 || deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(n);
            }
            wait.wait();
        }
    }
}

/// Borrowed C `fd_set`s of one `rselect` call.
pub(crate) struct FdSets<'a> {
    pub read: Option<&'a mut libc::fd_set>,
    pub write: Option<&'a mut libc::fd_set>,
    pub except: Option<&'a mut libc::fd_set>,
}

fn is_set(set: &Option<&mut libc::fd_set>, fd: c_int) -> bool {
    // SAFETY: fd is in 0..nfds <= FD_SETSIZE (checked by the caller), set is a live fd_set.
    set.as_ref()
        .is_some_and(|s| unsafe { libc::FD_ISSET(fd, *s) })
}

/// `rselect` as `rpoll` on the descriptors set in the sets. Unlike librdmacm's, descriptor
/// 0 is not dropped, and an rsocket that hung up or failed counts as readable (as in
/// select(2)).
///
/// # Errors
/// `EINVAL` for `nfds` outside `0..=FD_SETSIZE` or a bad timeout, `EBADF` for a closed
/// descriptor, and rpoll's errors.
pub(crate) fn select(
    poll: impl FnOnce(&mut [pollfd], c_int) -> Result<c_int, Errno>,
    nfds: c_int,
    mut sets: FdSets<'_>,
    timeout: Option<libc::timeval>,
) -> Result<c_int, Errno> {
    if !(0..=libc::FD_SETSIZE as c_int).contains(&nfds) {
        return Err(Errno(libc::EINVAL));
    }
    let ms = match timeout {
        None => -1,
        Some(t) if t.tv_sec < 0 || !(0..1_000_000).contains(&t.tv_usec) => {
            return Err(Errno(libc::EINVAL));
        }
        Some(t) => {
            let ms = t
                .tv_sec
                .saturating_mul(1000)
                .saturating_add((t.tv_usec + 999) / 1000);
            ms.min(i64::from(c_int::MAX)) as c_int
        }
    };
    let mut fds: Vec<pollfd> = (0..nfds)
        .filter_map(|fd| {
            let mut events = 0;
            if is_set(&sets.read, fd) {
                events |= libc::POLLIN;
            }
            if is_set(&sets.write, fd) {
                events |= libc::POLLOUT;
            }
            if is_set(&sets.except, fd) {
                events |= libc::POLLPRI;
            }
            (events != 0).then_some(pollfd {
                fd,
                events,
                revents: 0,
            })
        })
        .collect();
    poll(&mut fds, ms)?;
    if fds.iter().any(|p| p.revents & libc::POLLNVAL != 0) {
        return Err(Errno(libc::EBADF));
    }
    for s in [&mut sets.read, &mut sets.write, &mut sets.except]
        .into_iter()
        .flatten()
    {
        // SAFETY: s is a live fd_set.
        unsafe { libc::FD_ZERO(*s) };
    }
    let mut n = 0;
    for p in &fds {
        let mut mark = |set: &mut Option<&mut libc::fd_set>, on: bool| {
            if let (Some(s), true) = (set.as_mut(), on) {
                // SAFETY: p.fd < nfds <= FD_SETSIZE; s is a live fd_set.
                unsafe { libc::FD_SET(p.fd, *s) };
                n += 1;
            }
        };
        let r = p.revents;
        mark(
            &mut sets.read,
            p.events & libc::POLLIN != 0 && r & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0,
        );
        mark(
            &mut sets.write,
            p.events & libc::POLLOUT != 0 && r & (libc::POLLOUT | libc::POLLERR) != 0,
        );
        mark(
            &mut sets.except,
            p.events & libc::POLLPRI != 0 && r & libc::POLLPRI != 0,
        );
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_maps_to_requested_events_plus_hup_and_err() {
        let r = Ready {
            readable: true,
            writable: true,
            hup: false,
            err: false,
        };
        assert_eq!(revents(r, libc::POLLIN), libc::POLLIN);
        assert_eq!(
            revents(r, libc::POLLOUT | libc::POLLWRNORM),
            libc::POLLOUT | libc::POLLWRNORM
        );
        let gone = Ready {
            hup: true,
            err: true,
            ..Ready::default()
        };
        assert_eq!(revents(gone, 0), libc::POLLHUP | libc::POLLERR);
        let mut m = Marks::new(300);
        m.set(299);
        assert!(m.get(299) && !m.get(298));
    }
}
