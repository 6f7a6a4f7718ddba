//! `SOCK_SEQPACKET` Unix sockets with descriptor passing (`SCM_RIGHTS`): the shm provider's
//! control channel. Control path only; nothing here runs on the data path.

use std::ffi::CString;
use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::msg::{MAX_FDS, MAX_MSG};

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn sockaddr_un(path: &Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain old data; all-zero is a valid (empty) value.
    let mut addr: libc::sockaddr_un = unsafe { zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= addr.sun_path.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "rendezvous socket path {} is longer than {} bytes: choose a shorter rendezvous directory",
                path.display(),
                addr.sun_path.len() - 1
            ),
        ));
    }
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = size_of::<libc::sa_family_t>() + bytes.len() + 1;
    Ok((addr, len as libc::socklen_t))
}

fn socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2) call; the result is checked before use.
    let fd =
        cvt(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: fd was just returned by socket(2) and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Binds and listens on `path` (which must not exist).
pub(crate) fn listen(path: &Path, backlog: u32) -> io::Result<OwnedFd> {
    let fd = socket()?;
    let (addr, len) = sockaddr_un(path)?;
    // SAFETY: addr is a valid sockaddr_un of length len; fd is a live socket.
    cvt(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&raw const addr).cast::<libc::sockaddr>(),
            len,
        )
    })?;
    let backlog = backlog.clamp(1, 4096) as libc::c_int;
    // SAFETY: fd is a bound socket.
    cvt(unsafe { libc::listen(fd.as_raw_fd(), backlog) })?;
    set_nonblocking(fd.as_raw_fd(), true)?;
    Ok(fd)
}

/// Connects to the listener at `path`. Fails with `NotFound` or `ConnectionRefused` when
/// nobody listens.
pub(crate) fn connect(path: &Path) -> io::Result<OwnedFd> {
    let fd = socket()?;
    let (addr, len) = sockaddr_un(path)?;
    // SAFETY: addr is a valid sockaddr_un of length len; fd is a live socket.
    cvt(unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&raw const addr).cast::<libc::sockaddr>(),
            len,
        )
    })?;
    Ok(fd)
}

/// Accepts one pending connection, or `Ok(None)` if none is pending.
pub(crate) fn accept(listener: RawFd) -> io::Result<Option<OwnedFd>> {
    // SAFETY: listener is a listening socket; we do not ask for the peer address.
    let r = unsafe {
        libc::accept4(
            listener,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC,
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::WouldBlock => Ok(None),
            _ if e.raw_os_error() == Some(libc::ECONNABORTED) => Ok(None),
            _ => Err(e),
        };
    }
    // SAFETY: r is a fresh descriptor returned by accept4.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(r) }))
}

/// Sets or clears `O_NONBLOCK`.
pub(crate) fn set_nonblocking(fd: RawFd, on: bool) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own; F_GETFL has no pointer arguments.
    let fl = cvt(unsafe { libc::fcntl(fd, libc::F_GETFL) })?;
    let fl = if on {
        fl | libc::O_NONBLOCK
    } else {
        fl & !libc::O_NONBLOCK
    };
    // SAFETY: as above.
    cvt(unsafe { libc::fcntl(fd, libc::F_SETFL, fl) })?;
    Ok(())
}

const CMSG_SPACE: usize = {
    // CMSG_SPACE(MAX_FDS * sizeof(int)) for 64-bit Linux: header 16 + data rounded to 8.
    let data = MAX_FDS * size_of::<libc::c_int>();
    size_of::<libc::cmsghdr>() + data.div_ceil(8) * 8
};

#[repr(C, align(8))]
struct CmsgBuf([u8; CMSG_SPACE]);

/// Sends one message with descriptors attached. Blocks only as long as the socket buffer is
/// full, which for these small control messages does not happen in practice.
pub(crate) fn send(fd: RawFd, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    assert!(fds.len() <= MAX_FDS && bytes.len() <= MAX_MSG);
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    let mut cbuf = CmsgBuf([0; CMSG_SPACE]);
    // SAFETY: msghdr is plain old data; zero is a valid initial value.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        let data_len = size_of_val(fds);
        // SAFETY: CMSG_SPACE/CMSG_LEN are pure arithmetic.
        let space = unsafe { libc::CMSG_SPACE(data_len as u32) } as usize;
        msg.msg_control = cbuf.0.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: msg_control points at a buffer of at least `space` bytes, so the first
        // header fits.
        let cmsg = unsafe { libc::CMSG_FIRSTHDR(&raw const msg) };
        // SAFETY: cmsg points into cbuf (non-null because controllen >= one header); we
        // write the header fields and `fds.len()` ints of data, all inside `space`.
        unsafe {
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(data_len as u32) as usize;
            let data = libc::CMSG_DATA(cmsg).cast::<libc::c_int>();
            for (i, f) in fds.iter().enumerate() {
                data.add(i).write_unaligned(f.as_raw_fd());
            }
        }
    }
    loop {
        // SAFETY: msg points at live iovec and control buffers for the duration of the call.
        let r = unsafe { libc::sendmsg(fd, &raw const msg, libc::MSG_NOSIGNAL) };
        if r >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            continue;
        }
        if e.kind() == io::ErrorKind::WouldBlock {
            // The socket may be nonblocking (shared with the service thread): wait briefly.
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLOUT,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&raw mut p, 1, 100) };
            continue;
        }
        return Err(e);
    }
}

/// Receives one message into `buf`, appending attached descriptors to `fds`. Returns the
/// message length, `Ok(None)` on end of file (the peer closed or died), or `WouldBlock`.
pub(crate) fn recv(fd: RawFd, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<Option<usize>> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cbuf = CmsgBuf([0; CMSG_SPACE]);
    // SAFETY: msghdr is plain old data; zero is a valid initial value.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.0.as_mut_ptr().cast();
    msg.msg_controllen = CMSG_SPACE;
    let n = loop {
        // SAFETY: msg points at live buffers for the duration of the call.
        let r = unsafe { libc::recvmsg(fd, &raw mut msg, libc::MSG_CMSG_CLOEXEC) };
        if r >= 0 {
            break r as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    // Collect descriptors first so they are closed (not leaked) on every error path.
    // SAFETY: msg was filled by recvmsg; CMSG_FIRSTHDR/NXTHDR walk within msg_controllen.
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(&raw const msg) };
    while !cmsg.is_null() {
        // SAFETY: cmsg is a valid header inside the control buffer.
        let (level, ty, len) = unsafe { ((*cmsg).cmsg_level, (*cmsg).cmsg_type, (*cmsg).cmsg_len) };
        if level == libc::SOL_SOCKET && ty == libc::SCM_RIGHTS {
            // SAFETY: CMSG_LEN(0) is pure arithmetic.
            let hdr = unsafe { libc::CMSG_LEN(0) } as usize;
            let count = (len.saturating_sub(hdr)) / size_of::<libc::c_int>();
            // SAFETY: the kernel wrote `count` ints after the header.
            let data = unsafe { libc::CMSG_DATA(cmsg) }.cast::<libc::c_int>();
            for i in 0..count {
                // SAFETY: i < count, inside the data the kernel wrote.
                let raw = unsafe { data.add(i).read_unaligned() };
                // SAFETY: SCM_RIGHTS installed this descriptor in our table for us.
                fds.push(unsafe { OwnedFd::from_raw_fd(raw) });
            }
        }
        // SAFETY: advancing within the same control buffer.
        cmsg = unsafe { libc::CMSG_NXTHDR(&raw const msg, cmsg) };
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "control message truncated: too many descriptors",
        ));
    }
    if msg.msg_flags & libc::MSG_TRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "control message longer than the receive buffer",
        ));
    }
    if n == 0 {
        return Ok(None);
    }
    Ok(Some(n))
}

/// Removes `path` if it exists.
pub(crate) fn unlink(path: &Path) {
    if let Ok(c) = CString::new(path.as_os_str().as_bytes()) {
        // SAFETY: c is a valid NUL-terminated path.
        unsafe { libc::unlink(c.as_ptr()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn passes_message_and_descriptor() {
        let dir = std::env::temp_dir().join(format!("dp-unix-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("l.sock");
        unlink(&path);
        let l = listen(&path, 4).unwrap();
        let c = connect(&path).unwrap();
        let s = loop {
            if let Some(s) = accept(l.as_raw_fd()).unwrap() {
                break s;
            }
        };
        let mut f = tempfile_fd();
        f.write_all(b"hello").unwrap();
        let owned: OwnedFd = f.into();
        send(c.as_raw_fd(), b"abc", &[owned.as_fd_borrowed()]).unwrap();
        let mut buf = [0u8; 16];
        let mut fds = Vec::new();
        let n = recv(s.as_raw_fd(), &mut buf, &mut fds).unwrap().unwrap();
        assert_eq!(&buf[..n], b"abc");
        assert_eq!(fds.len(), 1);
        drop(c);
        assert_eq!(recv(s.as_raw_fd(), &mut buf, &mut fds).unwrap(), None);
        unlink(&path);
    }

    trait AsFdBorrowed {
        fn as_fd_borrowed(&self) -> BorrowedFd<'_>;
    }
    impl AsFdBorrowed for OwnedFd {
        fn as_fd_borrowed(&self) -> BorrowedFd<'_> {
            use std::os::fd::AsFd;
            self.as_fd()
        }
    }

    fn tempfile_fd() -> std::fs::File {
        let p = std::env::temp_dir().join(format!("dp-unix-test-{}.f", std::process::id()));
        let f = std::fs::File::options()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        let _ = std::fs::remove_file(&p);
        f
    }
}
