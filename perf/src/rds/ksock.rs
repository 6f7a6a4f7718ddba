//! The kernel's own RDS sockets (`AF_RDS`), for `dp-perf rds-stress --kernel`: a thin,
//! non-blocking wrapper over libc, IPv4 only.
#![allow(unsafe_code)]

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `AF_RDS` / `PF_RDS`.
const AF_RDS: libc::c_int = 21;
/// `SOL_RDS`.
const SOL_RDS: libc::c_int = 276;
/// `SO_RDS_TRANSPORT`.
const SO_RDS_TRANSPORT: libc::c_int = 8;
/// `RDS_TRANS_TCP`.
pub(super) const RDS_TRANS_TCP: libc::c_int = 2;
/// `RDS_TRANS_IB` (the kernel's `rds_rdma`).
pub(super) const RDS_TRANS_IB: libc::c_int = 0;

/// A kernel RDS socket.
#[derive(Debug)]
pub(super) struct KSock(OwnedFd);

fn sockaddr(a: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(a.ip().octets()),
        },
        sin_zero: [0; 8],
    }
}

fn v4(a: SocketAddr) -> io::Result<SocketAddrV4> {
    match a {
        SocketAddr::V4(a) => Ok(a),
        SocketAddr::V6(_) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "dp-perf --kernel speaks IPv4 only",
        )),
    }
}

fn check(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

impl KSock {
    /// `socket(AF_RDS, SOCK_SEQPACKET, 0)`.
    pub(super) fn new() -> io::Result<Self> {
        // SAFETY: plain system call with constant arguments; no pointers.
        let fd = check(unsafe { libc::socket(AF_RDS, libc::SOCK_SEQPACKET, 0) })?;
        // SAFETY: `fd` was just returned by socket() and is owned by nobody else.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    fn setsockopt(&self, level: libc::c_int, name: libc::c_int, v: libc::c_int) -> io::Result<()> {
        // SAFETY: the pointer is to a local c_int and the length is its size.
        check(unsafe {
            libc::setsockopt(
                self.0.as_raw_fd(),
                level,
                name,
                (&v as *const libc::c_int).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        })
        .map(|_| ())
    }

    /// `SO_RDS_TRANSPORT` (before bind).
    pub(super) fn set_transport(&self, t: libc::c_int) -> io::Result<()> {
        self.setsockopt(SOL_RDS, SO_RDS_TRANSPORT, t)
    }

    /// `SO_SNDBUF` and `SO_RCVBUF`.
    pub(super) fn set_buffers(&self, bytes: u32) -> io::Result<()> {
        let b = bytes.min(i32::MAX as u32) as libc::c_int;
        self.setsockopt(libc::SOL_SOCKET, libc::SO_SNDBUF, b)?;
        self.setsockopt(libc::SOL_SOCKET, libc::SO_RCVBUF, b)
    }

    /// `bind`.
    pub(super) fn bind(&self, at: SocketAddr) -> io::Result<()> {
        let sa = sockaddr(v4(at)?);
        // SAFETY: `sa` is a valid sockaddr_in on the stack, with its size.
        check(unsafe {
            libc::bind(
                self.0.as_raw_fd(),
                (&sa as *const libc::sockaddr_in).cast(),
                size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        })
        .map(|_| ())
    }

    /// Non-blocking `sendto`.
    pub(super) fn send_to(&self, to: SocketAddr, buf: &[u8]) -> io::Result<usize> {
        let sa = sockaddr(v4(to)?);
        // SAFETY: `buf` is valid for its length; `sa` is a valid sockaddr_in.
        let r = unsafe {
            libc::sendto(
                self.0.as_raw_fd(),
                buf.as_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
                (&sa as *const libc::sockaddr_in).cast(),
                size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(r as usize)
    }

    /// Non-blocking `recvfrom`: the length and the sender.
    pub(super) fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        let mut sa: libc::sockaddr_in = sockaddr(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0));
        let mut len = size_of::<libc::sockaddr_in>() as libc::socklen_t;
        // SAFETY: `buf` is valid for writes of its length; `sa`/`len` are a sockaddr_in
        // buffer and its size, which the kernel fills.
        let r = unsafe {
            libc::recvfrom(
                self.0.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
                (&mut sa as *mut libc::sockaddr_in).cast(),
                &mut len,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        let ip = Ipv4Addr::from(sa.sin_addr.s_addr.to_ne_bytes());
        Ok((
            r as usize,
            SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(sa.sin_port))),
        ))
    }
}
