//! The system calls `std` and `socket2` do not offer: `ioctl(SIOCOUTQ)` and `ioctl(SIOCINQ)`.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::AsRawFd;

/// Bytes written to the TCP socket that the peer has not acknowledged yet (`SIOCOUTQ`,
/// `tp->write_seq - tp->snd_una`): so `written - unacked(s)` is the peer's acknowledged
/// byte count, what the kernel's RDS-TCP reads from `snd_una`.
///
/// # Errors
///
/// The ioctl failed (not a TCP socket, or closed).
pub(super) fn unacked(s: &impl AsRawFd) -> io::Result<u32> {
    let mut n: libc::c_int = 0;
    // SAFETY: the descriptor is a live socket owned by the caller; SIOCOUTQ (TIOCOUTQ)
    // writes one c_int to the pointer, which points to a local c_int.
    let r = unsafe { libc::ioctl(s.as_raw_fd(), libc::TIOCOUTQ, &mut n as *mut libc::c_int) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(u32::try_from(n).unwrap_or(0))
}

/// Bytes received on a socket and not yet read (`SIOCINQ`, the same request as
/// `FIONREAD`).
///
/// # Errors
///
/// The ioctl failed (not a TCP socket, or closed).
pub(super) fn unread(s: &impl AsRawFd) -> io::Result<u32> {
    let mut n: libc::c_int = 0;
    // SAFETY: the descriptor is a live socket owned by the caller; FIONREAD (SIOCINQ)
    // writes one c_int to the pointer, which points to a local c_int.
    let r = unsafe { libc::ioctl(s.as_raw_fd(), libc::FIONREAD, &mut n as *mut libc::c_int) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(u32::try_from(n).unwrap_or(0))
}
