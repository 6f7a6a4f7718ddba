//! Small helpers around the rdma-core FFI: raw-pointer wrappers, errno, socket addresses and
//! the GID table.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use rdma_sys as ffi;

#[link(name = "ibverbs")]
unsafe extern "C" {
    /// `ibv_query_gid_table` (a static inline in `verbs.h` over this exported symbol,
    /// rdma-core 32 and later): copies the valid entries of every port's GID table.
    fn _ibv_query_gid_table(
        context: *mut ffi::ibv_context,
        entries: *mut ffi::ibv_gid_entry,
        max_entries: usize,
        flags: u32,
        entry_size: usize,
    ) -> isize;
}

/// `IBV_LINK_LAYER_INFINIBAND` (a `#define`, not in the bindings).
pub(crate) const LINK_LAYER_INFINIBAND: u8 = 1;
/// `IBV_LINK_LAYER_ETHERNET`.
pub(crate) const LINK_LAYER_ETHERNET: u8 = 2;
/// `IBV_GID_TYPE_ROCE_V2`.
pub(crate) const GID_TYPE_ROCE_V2: u32 = 2;

/// The current `errno`.
pub(crate) fn errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// An `io::Error` from an errno value.
pub(crate) fn os_err(errno: i32) -> io::Error {
    io::Error::from_raw_os_error(errno)
}

/// An `rdma_cm_id` pointer that may move between threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IdPtr(pub *mut ffi::rdma_cm_id);

// SAFETY: librdmacm ids are plain heap objects whose calls are serialised by librdmacm's own
// per-id mutex where needed; this crate never calls into one id from two threads without
// holding the channel's connection-table lock.
unsafe impl Send for IdPtr {}

/// A socket address in the C layout librdmacm takes.
pub(crate) struct SockAddr {
    storage: libc::sockaddr_storage,
}

impl SockAddr {
    pub(crate) fn new(a: SocketAddr) -> Self {
        // SAFETY: sockaddr_storage is plain data; all-zero is a valid (AF_UNSPEC) value.
        let mut storage: libc::sockaddr_storage = unsafe { core::mem::zeroed() };
        match a {
            SocketAddr::V4(v4) => {
                let sin = libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: v4.port().to_be(),
                    sin_addr: libc::in_addr {
                        s_addr: u32::from_ne_bytes(v4.ip().octets()),
                    },
                    sin_zero: [0; 8],
                };
                // SAFETY: sockaddr_storage is larger than and suitably aligned for
                // sockaddr_in; we write one whole value into it.
                unsafe { (&raw mut storage).cast::<libc::sockaddr_in>().write(sin) };
            }
            SocketAddr::V6(v6) => {
                let sin6 = libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: v6.port().to_be(),
                    sin6_flowinfo: v6.flowinfo().to_be(),
                    sin6_addr: libc::in6_addr {
                        s6_addr: v6.ip().octets(),
                    },
                    sin6_scope_id: v6.scope_id(),
                };
                // SAFETY: as above, for sockaddr_in6.
                unsafe { (&raw mut storage).cast::<libc::sockaddr_in6>().write(sin6) };
            }
        }
        Self { storage }
    }

    pub(crate) fn as_mut_ptr(&mut self) -> *mut libc::sockaddr {
        (&raw mut self.storage).cast()
    }
}

/// Reads a `sockaddr_in`/`sockaddr_in6`.
///
/// # Safety
/// `sa` must be null or point to a readable `sockaddr` of the size its family implies.
pub(crate) unsafe fn socket_addr(sa: *const libc::sockaddr) -> Option<SocketAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: the caller guarantees a readable sockaddr; sa_family is its first field.
    let family = i32::from(unsafe { (*sa).sa_family });
    match family {
        libc::AF_INET => {
            // SAFETY: the family says this is a sockaddr_in (caller's guarantee of size).
            let sin = unsafe { sa.cast::<libc::sockaddr_in>().read_unaligned() };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says this is a sockaddr_in6.
            let sin6 = unsafe { sa.cast::<libc::sockaddr_in6>().read_unaligned() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                u32::from_be(sin6.sin6_flowinfo),
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// Local and peer address of an id.
///
/// # Safety
/// `id` must be a live `rdma_cm_id`.
pub(crate) unsafe fn id_addrs(
    id: *mut ffi::rdma_cm_id,
) -> (Option<SocketAddr>, Option<SocketAddr>) {
    // SAFETY: the caller guarantees a live id; the route's address unions hold sockaddrs
    // written by librdmacm (or zeros, which read as AF_UNSPEC and give None).
    unsafe {
        let addr = &raw const (*id).route.addr;
        let src = (&raw const (*addr).src_addr_union.src_storage).cast::<libc::sockaddr>();
        let dst = (&raw const (*addr).dst_addr_union.dst_storage).cast::<libc::sockaddr>();
        (socket_addr(src), socket_addr(dst))
    }
}

/// The IP address a GID encodes, for RoCE GIDs (IPv4-mapped or a plain IPv6 address).
pub(crate) fn gid_ip(raw: &[u8; 16]) -> Option<IpAddr> {
    let v6 = Ipv6Addr::from(*raw);
    if let Some(v4) = v6.to_ipv4_mapped() {
        return Some(IpAddr::V4(v4));
    }
    if v6.is_unspecified() {
        return None;
    }
    Some(IpAddr::V6(v6))
}

/// One valid GID table entry.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GidEntry {
    pub gid: [u8; 16],
    pub index: u32,
    pub port: u32,
    pub gid_type: u32,
}

/// Every valid GID table entry of the device.
///
/// # Safety
/// `ctx` must be a live device context.
pub(crate) unsafe fn gid_table(
    ctx: *mut ffi::ibv_context,
    max: usize,
) -> io::Result<Vec<GidEntry>> {
    let max = max.max(1);
    let mut raw: Vec<ffi::ibv_gid_entry> = Vec::with_capacity(max);
    // SAFETY: the buffer has room for `max` entries of the size we pass; the function writes
    // at most that many and returns how many.
    let n = unsafe {
        _ibv_query_gid_table(
            ctx,
            raw.as_mut_ptr(),
            max,
            0,
            size_of::<ffi::ibv_gid_entry>(),
        )
    };
    if n < 0 {
        return Err(os_err(i32::try_from(-n).unwrap_or(libc::EIO)));
    }
    let n = (n as usize).min(max);
    // SAFETY: the library initialised the first n entries.
    unsafe { raw.set_len(n) };
    Ok(raw
        .iter()
        .map(|e| GidEntry {
            // SAFETY: every bit pattern of the union is a valid [u8; 16].
            gid: unsafe { e.gid.raw },
            index: e.gid_index,
            port: e.port_num,
            gid_type: e.gid_type,
        })
        .collect())
}

/// A C string from the library as an owned `String`.
///
/// # Safety
/// `p` must be null or a NUL-terminated string that stays valid during the call.
pub(crate) unsafe fn c_string(p: *const libc::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: caller's guarantee.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockaddr_roundtrip() {
        for a in [
            "10.77.0.1:4791".parse::<SocketAddr>().unwrap(),
            "[fe80::1]:18515".parse::<SocketAddr>().unwrap(),
        ] {
            let mut s = SockAddr::new(a);
            // SAFETY: s holds a sockaddr of a's family, alive for the call.
            assert_eq!(unsafe { socket_addr(s.as_mut_ptr()) }, Some(a));
        }
    }

    #[test]
    fn gid_to_ip() {
        let mut g = [0u8; 16];
        assert_eq!(gid_ip(&g), None);
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&[10, 77, 0, 1]);
        assert_eq!(gid_ip(&g), Some(IpAddr::V4(Ipv4Addr::new(10, 77, 0, 1))));
        let ll: Ipv6Addr = "fe80::92bf:3bff:fe46:a0fe".parse().unwrap();
        assert_eq!(gid_ip(&ll.octets()), Some(IpAddr::V6(ll)));
    }
}
