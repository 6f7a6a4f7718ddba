//! Blocking on rsockets. Every rsocket this library makes is non-blocking; a call the
//! program made blocking tries, and on `EAGAIN` waits here for readiness with `rpoll`, in
//! slices of [`SLICE_MS`], returning `EINTR` once a signal handler without `SA_RESTART`
//! ran since the call started (`signals`). Within a slice `rpoll` spins, then yields, then
//! naps, so a blocked call wakes within microseconds of its data and costs little CPU
//! after a while.

use libc::{c_int, c_short, pollfd};

use crate::{real, rs, signals};

/// The longest a blocked call waits before looking for a signal.
const SLICE_MS: c_int = 10;

/// Waits until rsocket `h` is ready for `events` or `timeout_ms` passed (negative:
/// forever). `since` is [`signals::interrupts`] at the start of the program's call.
///
/// # Errors
/// The errno: `EINTR` (a signal handler ran), or `rpoll`'s.
pub(crate) fn wait(
    h: c_int,
    events: c_short,
    since: u64,
    timeout_ms: c_int,
) -> Result<bool, c_int> {
    let mut fds = [pollfd {
        fd: h,
        events,
        revents: 0,
    }];
    poll_sliced(&mut fds, since, timeout_ms).map(|n| n > 0)
}

/// `rpoll` on `fds` up to `timeout_ms` (negative: forever) in slices, returning `EINTR`
/// once a handler ran since `since`.
///
/// # Errors
/// The errno: `EINTR`, or `rpoll`'s.
pub(crate) fn poll_sliced(
    fds: &mut [pollfd],
    since: u64,
    timeout_ms: c_int,
) -> Result<c_int, c_int> {
    let deadline = (timeout_ms >= 0)
        .then(|| std::time::Instant::now() + std::time::Duration::from_millis(timeout_ms as u64));
    loop {
        let slice = match deadline {
            None => SLICE_MS,
            Some(d) => {
                let left = d.saturating_duration_since(std::time::Instant::now());
                (left.as_millis() as c_int).min(SLICE_MS)
            }
        };
        // SAFETY: fds is a live, exclusively borrowed array of fds.len() pollfds.
        let n = unsafe { rs::rpoll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, slice) };
        if n < 0 {
            let e = real::errno();
            if e != libc::EINTR {
                return Err(e);
            }
        } else if n > 0 {
            return Ok(n);
        }
        if signals::interrupts() != since {
            return Err(libc::EINTR);
        }
        if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
            return Ok(0);
        }
    }
}
