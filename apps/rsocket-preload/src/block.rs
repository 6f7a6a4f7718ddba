//! Blocking on rsockets. Every rsocket this library makes is non-blocking; a call the
//! program made blocking tries, and on `EAGAIN` goes through three phases ([`Retry`]):
//! it tries again at once for the rsocket library's polling time, then tries again after
//! each `sched_yield` for [`YIELD`], then waits here for readiness with `rpoll`, in slices
//! of [`SLICE_MS`] (where `rpoll` spins, then yields, then naps, so a long wait costs
//! little CPU). Every phase returns `EINTR` once a signal handler without `SA_RESTART` ran
//! since the call started (`signals`).
//!
//! Why retry before `rpoll`: a non-blocking try that finds nothing makes progress on its
//! socket (it polls the completion queue), so the try during which the data lands returns
//! it. A wait in `rpoll` instead sees the data in a readiness round over the whole poll
//! set, returns, and the call then tries again: a second pass through every layer between
//! the data's arrival and the program. Measured with callgrind on `sockperf pp --tcp`
//! (64 B), a fruitless try costs about 500 instructions, an `rpoll` round about 900.
//!
//! Why the yield phase is here and not `rpoll`'s: `rpoll` spins for the polling time
//! before it yields, so a call that spun already and then entered it would spin twice as
//! long before giving its CPU away. When the two ends of a connection share one CPU (a
//! loaded host), each round trip costs both ends' spins, so that doubled the round trip.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use libc::{c_int, c_short, pollfd};

use crate::{real, rs, signals};

/// The longest a blocked call waits before looking for a signal.
const SLICE_MS: c_int = 10;

/// librdmacm's default `polling_time` (microseconds).
const DEFAULT_POLLING_US: u64 = 10;

/// How long a blocked call yields between tries before it waits in `rpoll` (as long as
/// the dataplane library's `rpoll` yields before it naps).
pub(crate) const YIELD: Duration = Duration::from_millis(2);

/// The rsocket library's busy-poll time: `polling_time` of its configuration directory
/// (`DP_RSOCKET_CONFIG_DIR`, else `/etc/rdma/rsocket`, as both librdmacm and the
/// dataplane's library read it), else librdmacm's default; read once.
fn polling_time() -> Duration {
    static T: OnceLock<Duration> = OnceLock::new();
    *T.get_or_init(|| {
        let dir = std::env::var_os("DP_RSOCKET_CONFIG_DIR")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| "/etc/rdma/rsocket".into());
        let us = std::fs::read_to_string(dir.join("polling_time"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(DEFAULT_POLLING_US);
        Duration::from_micros(us)
    })
}

/// What a blocking call does after a fruitless try.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// Try again now (busy polling).
    Now,
    /// Yield the CPU, then try again.
    Yield,
    /// Wait for readiness in `rpoll`.
    Wait,
}

/// The phases of one blocking call (see the module docs): [`next`](Self::next) says
/// [`Next::Now`] until the polling time has passed since the first fruitless try, then
/// [`Next::Yield`] until [`YIELD`] more has, then [`Next::Wait`] for good. The clock is
/// read on the first fruitless try and then every [`Retry::CHECK`] busy tries.
#[derive(Debug)]
pub(crate) struct Retry {
    start: Option<Instant>,
    tries: u32,
    phase: Next,
}

impl Retry {
    /// Busy tries between clock reads (a try costs a few hundred instructions; a clock
    /// read under a hypervisor can cost as much as one).
    const CHECK: u32 = 16;

    pub(crate) fn new() -> Self {
        Self {
            start: None,
            tries: 0,
            phase: Next::Now,
        }
    }

    /// After a fruitless try: what to do before the next one.
    pub(crate) fn next(&mut self) -> Next {
        match self.phase {
            Next::Wait => return Next::Wait,
            Next::Now => {
                self.tries = self.tries.wrapping_add(1);
                if self.start.is_some() && !self.tries.is_multiple_of(Self::CHECK) {
                    core::hint::spin_loop();
                    return Next::Now;
                }
            }
            Next::Yield => {}
        }
        let start = *self.start.get_or_insert_with(Instant::now);
        let t = start.elapsed();
        let spin = polling_time();
        self.phase = if t < spin {
            core::hint::spin_loop();
            Next::Now
        } else if t < spin + YIELD {
            Next::Yield
        } else {
            Next::Wait
        };
        self.phase
    }
}

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
    let deadline =
        (timeout_ms >= 0).then(|| Instant::now() + Duration::from_millis(timeout_ms as u64));
    loop {
        let slice = match deadline {
            None => SLICE_MS,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
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
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_spins_for_the_polling_time_then_yields_then_waits_for_good() {
        let t0 = Instant::now();
        let mut r = Retry::new();
        let mut seen = Vec::new();
        loop {
            let n = r.next();
            if seen.last() != Some(&n) {
                seen.push(n);
                if n == Next::Yield {
                    assert!(
                        t0.elapsed() >= polling_time(),
                        "yielded after {:?}",
                        t0.elapsed()
                    );
                }
            }
            if n == Next::Wait {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "never got to waiting"
            );
        }
        assert_eq!(seen, [Next::Now, Next::Yield, Next::Wait]);
        assert!(
            t0.elapsed() >= polling_time() + YIELD,
            "waited after {:?}",
            t0.elapsed()
        );
        assert_eq!(
            r.next(),
            Next::Wait,
            "a call that waited went back to spinning"
        );
    }
}
