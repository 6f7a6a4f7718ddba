//! Time without syscalls: [`Instant`], the [`Clock`] trait and its implementations.
//!
//! Everything in the dataplane that needs "now" takes an [`Instant`] as an argument: protocol
//! state machines never read a clock themselves, and the poll loop reads time only through a
//! [`Clock`]. That keeps the fast path free of syscalls and lets tests drive time by hand with
//! [`ManualClock`].
//!
//! # Clocks
//!
//! | Clock | Source | Cost | Use |
//! |---|---|---|---|
//! | [`TscClock`] | `rdtsc` (x86_64), calibrated once against `CLOCK_MONOTONIC` | a few ns, no syscall | production lcores |
//! | [`MonotonicClock`] | `clock_gettime(CLOCK_MONOTONIC)` | tens of ns through the vDSO (no syscall on normal kernels) | fallback when the TSC is unusable |
//! | [`RealClock`] | picks [`TscClock`] if usable, else [`MonotonicClock`] | | the default for loops |
//! | [`ManualClock`] | a shared counter advanced by the test | one atomic load | deterministic tests |
//!
//! The TSC is used only when `/proc/cpuinfo` lists both `constant_tsc` (the rate does not follow
//! frequency scaling) and `nonstop_tsc` (it keeps counting in deep C-states); otherwise ticks
//! would not map to wall time and [`RealClock`] falls back to `CLOCK_MONOTONIC`.
//!
//! # Epochs
//!
//! An [`Instant`] counts nanoseconds since its clock's epoch. [`MonotonicClock`] and
//! [`TscClock`] share `CLOCK_MONOTONIC`'s epoch (boot, roughly): the TSC clock maps the tick
//! count at calibration onto the monotonic time read at the same moment. Over hours the two drift
//! apart by the calibration error (a few ppm), so compare instants only from the same clock.
//! [`ManualClock`] starts wherever the test says.

use core::fmt;
use core::ops::{Add, AddAssign, Sub, SubAssign};
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A point in time: nanoseconds since the epoch of the [`Clock`] that produced it.
///
/// Arithmetic saturates instead of overflowing or panicking: `Instant::ZERO - d` is
/// `Instant::ZERO`, `a - b` with `b > a` is a zero [`Duration`], and `Instant::MAX + d` is
/// `Instant::MAX`. A `u64` of nanoseconds spans 584 years, so saturation only matters for
/// sentinels such as [`Instant::MAX`] ("never").
#[repr(transparent)]
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instant(u64);

impl Instant {
    /// The clock's epoch.
    pub const ZERO: Self = Self(0);
    /// The largest representable instant; useful as "never".
    pub const MAX: Self = Self(u64::MAX);

    /// The instant `nanos` nanoseconds after the epoch.
    #[inline]
    pub const fn from_nanos(nanos: u64) -> Self {
        Self(nanos)
    }

    /// The instant `micros` microseconds after the epoch (saturating).
    #[inline]
    pub const fn from_micros(micros: u64) -> Self {
        Self(micros.saturating_mul(1_000))
    }

    /// The instant `millis` milliseconds after the epoch (saturating).
    #[inline]
    pub const fn from_millis(millis: u64) -> Self {
        Self(millis.saturating_mul(1_000_000))
    }

    /// Nanoseconds since the epoch.
    #[inline]
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Time elapsed from `earlier` to `self`, or zero if `earlier` is later.
    #[inline]
    pub const fn saturating_duration_since(self, earlier: Self) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }

    /// Nanoseconds elapsed from `earlier` to `self`, or zero if `earlier` is later.
    #[inline]
    pub const fn nanos_since(self, earlier: Self) -> u64 {
        self.0.saturating_sub(earlier.0)
    }

    /// `self + d`, or `None` if that does not fit in a `u64` of nanoseconds.
    #[inline]
    pub fn checked_add(self, d: Duration) -> Option<Self> {
        let d = u64::try_from(d.as_nanos()).ok()?;
        self.0.checked_add(d).map(Self)
    }

    /// `self - d`, or `None` if that would be before the epoch.
    #[inline]
    pub fn checked_sub(self, d: Duration) -> Option<Self> {
        let d = u64::try_from(d.as_nanos()).ok()?;
        self.0.checked_sub(d).map(Self)
    }

    /// `self + d`, clamped to [`Instant::MAX`].
    #[inline]
    pub fn saturating_add(self, d: Duration) -> Self {
        Self(self.0.saturating_add(duration_to_nanos(d)))
    }

    /// `self - d`, clamped to [`Instant::ZERO`].
    #[inline]
    pub fn saturating_sub(self, d: Duration) -> Self {
        Self(self.0.saturating_sub(duration_to_nanos(d)))
    }
}

/// A [`Duration`] in nanoseconds, clamped to `u64::MAX` (584 years).
#[inline]
pub fn duration_to_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Add<Duration> for Instant {
    type Output = Self;
    /// Saturating; see [`Instant::saturating_add`].
    #[inline]
    fn add(self, d: Duration) -> Self {
        self.saturating_add(d)
    }
}

impl AddAssign<Duration> for Instant {
    #[inline]
    fn add_assign(&mut self, d: Duration) {
        *self = self.saturating_add(d);
    }
}

impl Sub<Duration> for Instant {
    type Output = Self;
    /// Saturating; see [`Instant::saturating_sub`].
    #[inline]
    fn sub(self, d: Duration) -> Self {
        self.saturating_sub(d)
    }
}

impl SubAssign<Duration> for Instant {
    #[inline]
    fn sub_assign(&mut self, d: Duration) {
        *self = self.saturating_sub(d);
    }
}

impl Sub for Instant {
    type Output = Duration;
    /// Saturating; see [`Instant::saturating_duration_since`].
    #[inline]
    fn sub(self, earlier: Self) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

impl fmt::Debug for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Instant({}.{:09}s)",
            self.0 / 1_000_000_000,
            self.0 % 1_000_000_000
        )
    }
}

impl fmt::Display for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}.{:09}s",
            self.0 / 1_000_000_000,
            self.0 % 1_000_000_000
        )
    }
}

/// A source of [`Instant`]s.
///
/// Implementations must be monotonic (never return an instant earlier than one they returned
/// before, as seen by one thread) and must not make syscalls on the fast path: the poll loop
/// calls `now()` once per poller call.
pub trait Clock {
    /// The current time.
    fn now(&self) -> Instant;
}

impl<C: Clock + ?Sized> Clock for &C {
    #[inline]
    fn now(&self) -> Instant {
        (**self).now()
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    #[inline]
    fn now(&self) -> Instant {
        (**self).now()
    }
}

/// `clock_gettime(CLOCK_MONOTONIC)`.
///
/// glibc serves this from the vDSO without entering the kernel as long as the kernel's
/// clocksource supports it (`tsc`, `kvm-clock`, `arch_sys_counter`, ...). With clocksources
/// such as `hpet` or `acpi_pm` the vDSO falls back to a real syscall; check
/// `/sys/devices/system/clocksource/clocksource0/current_clocksource` if that matters.
#[derive(Debug, Clone, Copy, Default)]
pub struct MonotonicClock;

impl MonotonicClock {
    /// Reads `CLOCK_MONOTONIC` in nanoseconds.
    #[inline]
    pub fn read_nanos() -> u64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux, so
        // the call cannot fail and the return value carries no information.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        (ts.tv_sec as u64)
            .wrapping_mul(1_000_000_000)
            .wrapping_add(ts.tv_nsec as u64)
    }
}

impl Clock for MonotonicClock {
    #[inline]
    fn now(&self) -> Instant {
        Instant(Self::read_nanos())
    }
}

/// Why the TSC cannot be used as a clock.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TscError {
    /// Not an x86_64 build.
    #[error("the TSC clock needs x86_64; use MonotonicClock (RealClock falls back automatically)")]
    UnsupportedArch,
    /// `/proc/cpuinfo` could not be read or has no `flags` line.
    #[error("cannot read CPU flags from /proc/cpuinfo; the TSC's invariance cannot be checked")]
    NoCpuInfo,
    /// The CPU lacks `constant_tsc` and/or `nonstop_tsc`.
    #[error(
        "the CPU flags lack {missing}: the TSC does not tick at a constant rate across frequency \
         and sleep states; use MonotonicClock"
    )]
    NotInvariant {
        /// The missing flag(s).
        missing: &'static str,
    },
    /// Calibration measured a nonsensical rate.
    #[error("TSC calibration measured {hz} Hz, outside the plausible 1 MHz..100 GHz range")]
    Calibration {
        /// The measured rate.
        hz: u64,
    },
}

/// Reads the time-stamp counter.
#[cfg(target_arch = "x86_64")]
#[inline]
fn rdtsc() -> u64 {
    // SAFETY: RDTSC is available on every x86_64 CPU and has no memory effects.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// The time-stamp counter, converted to nanoseconds with a rate calibrated once per process.
///
/// Conversion is a 64x64->128-bit multiply by a 32.32 fixed-point "nanoseconds per tick" factor
/// and a shift; no division, no syscall. `rdtsc` is not a serialising instruction, so a read can
/// move by a few dozen cycles relative to surrounding loads; that is fine for busy/idle
/// accounting and timers, which is what this clock is for.
#[derive(Debug, Clone, Copy)]
pub struct TscClock {
    /// TSC value at calibration; maps to `epoch_ns`.
    epoch_tsc: u64,
    /// `CLOCK_MONOTONIC` nanoseconds read together with `epoch_tsc`.
    epoch_ns: u64,
    /// Nanoseconds per tick as 32.32 fixed point.
    mult: u64,
    /// Measured ticks per second.
    hz: u64,
}

static TSC: OnceLock<Result<TscClock, TscError>> = OnceLock::new();

impl TscClock {
    /// The process-wide TSC clock, calibrated on first use (this first call sleeps about 20 ms).
    ///
    /// # Errors
    ///
    /// [`TscError`] if this is not x86_64, the TSC is not invariant (`constant_tsc` and
    /// `nonstop_tsc`), or calibration failed. The result is cached either way.
    pub fn get() -> Result<Self, TscError> {
        *TSC.get_or_init(Self::calibrate)
    }

    /// Measured TSC rate in ticks per second.
    pub fn hz(&self) -> u64 {
        self.hz
    }

    /// Raw TSC ticks to nanoseconds (a length of time, not an instant).
    #[inline]
    pub fn ticks_to_nanos(&self, ticks: u64) -> u64 {
        ((u128::from(ticks) * u128::from(self.mult)) >> 32) as u64
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn calibrate() -> Result<Self, TscError> {
        Err(TscError::UnsupportedArch)
    }

    #[cfg(target_arch = "x86_64")]
    fn calibrate() -> Result<Self, TscError> {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").map_err(|_| TscError::NoCpuInfo)?;
        let flags = cpuinfo
            .lines()
            .find(|l| l.starts_with("flags"))
            .ok_or(TscError::NoCpuInfo)?;
        let has = |f: &str| flags.split_whitespace().any(|w| w == f);
        match (has("constant_tsc"), has("nonstop_tsc")) {
            (true, true) => {}
            (false, true) => {
                return Err(TscError::NotInvariant {
                    missing: "constant_tsc",
                });
            }
            (true, false) => {
                return Err(TscError::NotInvariant {
                    missing: "nonstop_tsc",
                });
            }
            (false, false) => {
                return Err(TscError::NotInvariant {
                    missing: "constant_tsc and nonstop_tsc",
                });
            }
        }
        let (tsc0, ns0) = Self::paired_read();
        std::thread::sleep(Duration::from_millis(20));
        let (tsc1, ns1) = Self::paired_read();
        let dt_ns = ns1.saturating_sub(ns0).max(1);
        let dt_tsc = tsc1.wrapping_sub(tsc0);
        let hz = (u128::from(dt_tsc) * 1_000_000_000 / u128::from(dt_ns)) as u64;
        if !(1_000_000..=100_000_000_000).contains(&hz) {
            return Err(TscError::Calibration { hz });
        }
        // ns per tick in 32.32 fixed point: 1e9 * 2^32 / hz. hz >= 1 MHz keeps this < 2^42.
        let mult = ((1_000_000_000u128 << 32) / u128::from(hz)) as u64;
        Ok(Self {
            epoch_tsc: tsc0,
            epoch_ns: ns0,
            mult,
            hz,
        })
    }

    /// Reads TSC and `CLOCK_MONOTONIC` as close together as possible: of a few attempts, keeps
    /// the one whose bracketing TSC reads are nearest, and pairs the monotonic time with the
    /// midpoint.
    #[cfg(target_arch = "x86_64")]
    fn paired_read() -> (u64, u64) {
        let mut best = (u64::MAX, 0, 0);
        for _ in 0..8 {
            let a = rdtsc();
            let ns = MonotonicClock::read_nanos();
            let b = rdtsc();
            let width = b.wrapping_sub(a);
            if width < best.0 {
                best = (width, a + width / 2, ns);
            }
        }
        (best.1, best.2)
    }
}

impl Clock for TscClock {
    #[cfg(target_arch = "x86_64")]
    #[inline]
    fn now(&self) -> Instant {
        let ticks = rdtsc().wrapping_sub(self.epoch_tsc);
        Instant(self.epoch_ns.wrapping_add(self.ticks_to_nanos(ticks)))
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn now(&self) -> Instant {
        // A TscClock cannot be constructed on other architectures (`get` fails); keep the
        // impl total by reading the monotonic clock.
        MonotonicClock.now()
    }
}

/// The production clock: [`TscClock`] when the TSC is invariant, else [`MonotonicClock`].
///
/// The choice is made once per process, on first use (which calibrates the TSC and sleeps about
/// 20 ms); call [`RealClock::new`] during start-up, not on an lcore's fast path.
#[derive(Debug, Clone, Copy)]
pub enum RealClock {
    /// Calibrated TSC.
    Tsc(TscClock),
    /// `CLOCK_MONOTONIC` through the vDSO.
    Monotonic(MonotonicClock),
}

impl RealClock {
    /// Picks the TSC if usable, else `CLOCK_MONOTONIC`.
    pub fn new() -> Self {
        match TscClock::get() {
            Ok(tsc) => Self::Tsc(tsc),
            Err(_) => Self::Monotonic(MonotonicClock),
        }
    }

    /// `"tsc"` or `"monotonic"`, for reports.
    pub fn source(&self) -> &'static str {
        match self {
            Self::Tsc(_) => "tsc",
            Self::Monotonic(_) => "monotonic",
        }
    }
}

impl Default for RealClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for RealClock {
    #[inline]
    fn now(&self) -> Instant {
        match self {
            Self::Tsc(c) => c.now(),
            Self::Monotonic(c) => c.now(),
        }
    }
}

/// A virtual clock for tests: time moves only when someone calls [`advance`](Self::advance) or
/// [`set`](Self::set).
///
/// Clones share the same time, so a test can hand one clone to a poll loop and keep another to
/// move time from a poller, a timer handler or the test body.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock reading `start`.
    pub fn new(start: Instant) -> Self {
        Self {
            nanos: Arc::new(AtomicU64::new(start.0)),
        }
    }

    /// Moves time forward by `d` (saturating at [`Instant::MAX`]).
    pub fn advance(&self, d: Duration) {
        self.advance_nanos(duration_to_nanos(d));
    }

    /// Moves time forward by `nanos` nanoseconds (saturating at [`Instant::MAX`]).
    pub fn advance_nanos(&self, nanos: u64) {
        // M1: AcqRel, pairs with M2 in `now` and with other advances: a thread that reads the new
        // time also sees what the advancing thread wrote before moving time, which keeps
        // cross-thread test scripts ordered.
        let _ = self
            .nanos
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                Some(n.saturating_add(nanos))
            });
    }

    /// Sets the time to `t`. Moving time backwards breaks the [`Clock`] contract; tests that do
    /// it get what they asked for.
    pub fn set(&self, t: Instant) {
        // M3: Release, pairs with M2 in `now` (same reasoning as M1).
        self.nanos.store(t.0, Ordering::Release);
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now(&self) -> Instant {
        // M2: Acquire, pairs with M1/M3.
        Instant(self.nanos.load(Ordering::Acquire))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instant_arithmetic_saturates() {
        let t = Instant::from_nanos(10);
        assert_eq!(t - Duration::from_nanos(20), Instant::ZERO);
        assert_eq!(Instant::MAX + Duration::from_secs(1), Instant::MAX);
        assert_eq!(Instant::from_nanos(5) - t, Duration::ZERO);
        assert_eq!(t - Instant::from_nanos(4), Duration::from_nanos(6));
        assert_eq!(Instant::MAX.checked_add(Duration::from_nanos(1)), None);
        assert_eq!(t.checked_sub(Duration::from_nanos(11)), None);
        assert_eq!(Instant::from_millis(2).as_nanos(), 2_000_000);
        assert_eq!(Instant::from_micros(3).as_nanos(), 3_000);
        assert_eq!(
            format!("{}", Instant::from_nanos(1_500_000_000)),
            "1.500000000s"
        );
    }

    #[test]
    fn manual_clock_is_shared_between_clones() {
        let a = ManualClock::new(Instant::from_nanos(100));
        let b = a.clone();
        b.advance(Duration::from_nanos(50));
        assert_eq!(a.now(), Instant::from_nanos(150));
        a.set(Instant::from_nanos(7));
        assert_eq!(b.now(), Instant::from_nanos(7));
    }

    #[test]
    fn real_clock_is_monotonic_and_tracks_monotonic_time() {
        let clock = RealClock::new();
        let mono0 = MonotonicClock.now();
        let a = clock.now();
        std::thread::sleep(Duration::from_millis(5));
        let b = clock.now();
        let mono1 = MonotonicClock.now();
        assert!(b > a, "{} then {} from {}", a, b, clock.source());
        // The clock advanced at least the sleep and no more than the bracketing monotonic span
        // plus a generous calibration allowance (this is a sanity check, not a timing test).
        let span = mono1 - mono0;
        assert!(b - a >= Duration::from_millis(4));
        assert!(b - a <= span * 2 + Duration::from_millis(1));
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn tsc_conversion_is_linear() {
        let Ok(tsc) = TscClock::get() else { return };
        assert_eq!(tsc.ticks_to_nanos(0), 0);
        let one_sec = tsc.ticks_to_nanos(tsc.hz());
        assert!(
            (999_999_000..=1_000_001_000).contains(&one_sec),
            "{one_sec}"
        );
    }
}
