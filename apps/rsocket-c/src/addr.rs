//! Socket addresses between C's `sockaddr` and `std::net::SocketAddr`.
//!
//! IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`) are taken as the IPv4 address they map, so
//! an `AF_INET6` socket reaches an IPv4 listener as it would over TCP; addresses written
//! back to an `AF_INET6` socket are mapped again.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use libc::{c_int, sa_family_t, sockaddr, sockaddr_in, sockaddr_in6, socklen_t};

use crate::errno::Errno;

/// Reads a socket address from `(addr, len)`.
///
/// # Safety
/// `addr` must be null or point to `len` readable bytes.
///
/// # Errors
/// `EFAULT` for a null address, `EINVAL` for a short one, `EAFNOSUPPORT` for a family other
/// than `AF_INET`/`AF_INET6`.
pub(crate) unsafe fn read(addr: *const sockaddr, len: socklen_t) -> Result<SocketAddr, Errno> {
    if addr.is_null() {
        return Err(Errno(libc::EFAULT));
    }
    let len = len as usize;
    if len < size_of::<sa_family_t>() {
        return Err(Errno(libc::EINVAL));
    }
    // SAFETY: at least the family field is readable (checked above); unaligned because the
    // caller's buffer may be any byte array.
    let family = unsafe { addr.cast::<sa_family_t>().read_unaligned() };
    match c_int::from(family) {
        libc::AF_INET => {
            if len < size_of::<sockaddr_in>() {
                return Err(Errno(libc::EINVAL));
            }
            // SAFETY: len covers a sockaddr_in (checked).
            let a = unsafe { addr.cast::<sockaddr_in>().read_unaligned() };
            Ok(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 => {
            if len < size_of::<sockaddr_in6>() {
                return Err(Errno(libc::EINVAL));
            }
            // SAFETY: len covers a sockaddr_in6 (checked).
            let a = unsafe { addr.cast::<sockaddr_in6>().read_unaligned() };
            let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
            let port = u16::from_be(a.sin6_port);
            Ok(match ip.to_ipv4_mapped() {
                Some(v4) => SocketAddr::V4(SocketAddrV4::new(v4, port)),
                None => SocketAddr::V6(SocketAddrV6::new(
                    ip,
                    port,
                    a.sin6_flowinfo,
                    a.sin6_scope_id,
                )),
            })
        }
        _ => Err(Errno(libc::EAFNOSUPPORT)),
    }
}

/// The unspecified address of `family`, port 0 (what an unbound socket reports).
pub(crate) fn unspecified(family: c_int) -> SocketAddr {
    if family == libc::AF_INET6 {
        SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0)
    } else {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0)
    }
}

/// A socket address in C layout, as a socket of `family` reports it.
#[derive(Clone, Copy)]
pub(crate) enum CAddr {
    V4(sockaddr_in),
    V6(sockaddr_in6),
}

impl CAddr {
    /// `a` as a socket of `family` shows it (IPv4 on an `AF_INET6` socket is mapped).
    pub(crate) fn new(a: SocketAddr, family: c_int) -> Self {
        match a {
            SocketAddr::V4(v4) if family != libc::AF_INET6 => {
                // SAFETY: sockaddr_in is plain old data; all-zero is a valid value.
                let mut s: sockaddr_in = unsafe { std::mem::zeroed() };
                s.sin_family = libc::AF_INET as sa_family_t;
                s.sin_port = v4.port().to_be();
                s.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
                Self::V4(s)
            }
            SocketAddr::V4(v4) => Self::v6(v4.ip().to_ipv6_mapped(), v4.port(), 0, 0),
            SocketAddr::V6(v6) => Self::v6(*v6.ip(), v6.port(), v6.flowinfo(), v6.scope_id()),
        }
    }

    fn v6(ip: Ipv6Addr, port: u16, flowinfo: u32, scope: u32) -> Self {
        // SAFETY: sockaddr_in6 is plain old data; all-zero is a valid value.
        let mut s: sockaddr_in6 = unsafe { std::mem::zeroed() };
        s.sin6_family = libc::AF_INET6 as sa_family_t;
        s.sin6_port = port.to_be();
        s.sin6_flowinfo = flowinfo;
        s.sin6_scope_id = scope;
        s.sin6_addr.s6_addr = ip.octets();
        Self::V6(s)
    }

    /// The bytes of the C structure.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        match self {
            // SAFETY: viewing a live plain-old-data struct as its bytes.
            Self::V4(s) => unsafe {
                std::slice::from_raw_parts(
                    (s as *const sockaddr_in).cast(),
                    size_of::<sockaddr_in>(),
                )
            },
            // SAFETY: as above.
            Self::V6(s) => unsafe {
                std::slice::from_raw_parts(
                    (s as *const sockaddr_in6).cast(),
                    size_of::<sockaddr_in6>(),
                )
            },
        }
    }

    /// Writes the address to `(out, *len)` as `getsockname(2)` does: truncated to the
    /// caller's buffer, with `*len` set to the full size. A null `out` writes nothing.
    ///
    /// # Safety
    /// `len` must be null or valid; when both are non-null, `out` must point to `*len`
    /// writable bytes.
    pub(crate) unsafe fn write(&self, out: *mut sockaddr, len: *mut socklen_t) {
        if out.is_null() || len.is_null() {
            return;
        }
        let b = self.as_bytes();
        // SAFETY: len is valid (caller).
        let room = unsafe { *len } as usize;
        // SAFETY: out has room bytes (caller); we copy at most that many; the regions
        // cannot overlap (one is our local).
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), out.cast::<u8>(), b.len().min(room)) };
        // SAFETY: as above.
        unsafe { *len = b.len() as socklen_t };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(a: SocketAddr, family: c_int) -> SocketAddr {
        let c = CAddr::new(a, family);
        let b = c.as_bytes();
        // SAFETY: b is a complete sockaddr of its length.
        unsafe { read(b.as_ptr().cast(), b.len() as socklen_t) }.unwrap()
    }

    #[test]
    fn converts_both_families_and_maps_v4_on_v6_sockets() {
        let v4: SocketAddr = "127.0.0.1:7471".parse().unwrap();
        let v6: SocketAddr = "[fe80::1]:9".parse().unwrap();
        assert_eq!(roundtrip(v4, libc::AF_INET), v4);
        assert_eq!(roundtrip(v6, libc::AF_INET6), v6);
        assert!(matches!(CAddr::new(v4, libc::AF_INET6), CAddr::V6(_)));
        assert_eq!(roundtrip(v4, libc::AF_INET6), v4, "mapped back to IPv4");
        let short = CAddr::new(v4, libc::AF_INET);
        // SAFETY: reading 3 bytes of a live buffer.
        let e = unsafe { read(short.as_bytes().as_ptr().cast(), 3) };
        assert_eq!(e, Err(Errno(libc::EINVAL)));
        // SAFETY: a null pointer is checked before use.
        let e = unsafe { read(std::ptr::null(), 16) };
        assert_eq!(e, Err(Errno(libc::EFAULT)));
    }

    #[test]
    fn writes_truncate_and_report_the_full_length() {
        let c = CAddr::new("10.1.2.3:80".parse().unwrap(), libc::AF_INET);
        let mut buf = [0xFFu8; 4];
        let mut len: socklen_t = 4;
        // SAFETY: buf has len bytes.
        unsafe { c.write(buf.as_mut_ptr().cast(), &mut len) };
        assert_eq!(len as usize, size_of::<sockaddr_in>());
        assert_eq!(&buf[..], &c.as_bytes()[..4]);
    }
}
