//! errno, and how each C entry point turns a Rust result into C's return conventions.

use std::panic::{AssertUnwindSafe, catch_unwind};

use dataplane::rsocket::RsError;
use libc::c_int;

/// A failed call: the `errno` value to report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Errno(pub c_int);

impl From<RsError> for Errno {
    fn from(e: RsError) -> Self {
        Self(e.errno())
    }
}

impl From<std::io::Error> for Errno {
    fn from(e: std::io::Error) -> Self {
        Self(e.raw_os_error().unwrap_or(libc::EIO))
    }
}

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns the calling thread's errno slot, valid for the
    // thread's lifetime.
    unsafe { *libc::__errno_location() = e };
}

/// Runs one C entry point's body: a panic (a bug in this library) becomes `EIO` instead of
/// unwinding into C, which would abort the program.
pub(crate) fn guard<T>(f: impl FnOnce() -> Result<T, Errno>) -> Result<T, Errno> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(Err(Errno(libc::EIO)))
}

/// C's `int` convention: the value, or -1 with `errno` set.
pub(crate) fn ret_int(r: Result<c_int, Errno>) -> c_int {
    match r {
        Ok(v) => v,
        Err(Errno(e)) => {
            set_errno(e);
            -1
        }
    }
}

/// C's `ssize_t` convention: a byte count, or -1 with `errno` set.
pub(crate) fn ret_size(r: Result<usize, Errno>) -> libc::ssize_t {
    match r {
        // Counts never exceed the caller's buffer length, itself at most isize::MAX.
        Ok(n) => n as libc::ssize_t,
        Err(Errno(e)) => {
            set_errno(e);
            -1
        }
    }
}
