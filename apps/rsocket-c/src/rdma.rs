//! Address resolution for rsocket programs: `rdma_getaddrinfo`/`rdma_freeaddrinfo`, which
//! rdmacm-utils' rsocket programs use for `-T r`/`-f gid`. They are served here, not
//! forwarded, because librdmacm's need an RDMA CM device (its `ucma_init`) and rsockets over
//! the shm provider run on hosts with none.
//!
//! * `rdma_getaddrinfo` resolves IP names and numeric addresses through the system resolver
//!   and returns librdmacm's `struct rdma_addrinfo` (one entry, as librdmacm): the address
//!   as `ai_src_addr` with `RAI_PASSIVE`, else as `ai_dst_addr`. Requests only the RDMA CM
//!   can answer (`AF_IB` addresses, `RAI_SA` path queries; [`needs_rdma_cm`]) go on to the
//!   system's librdmacm. Errors are `EAI_*` codes, for `gai_strerror`.
//! * `rdma_freeaddrinfo` frees every member with `free`, as librdmacm's does, so it also
//!   frees lists the system library made.
//!
//! The programs are linked with `BIND_NOW`, so every symbol they import must resolve for
//! them to start at all; the rest of the RDMA CM is forwarded (`rdmacm_fwd`).

use std::ffi::{c_char, c_void};

use libc::{c_int, sockaddr, socklen_t};

/// `struct rdma_addrinfo` of `<rdma/rdma_cma.h>`.
#[repr(C)]
#[derive(Debug)]
pub struct RdmaAddrinfo {
    /// `RAI_*` flags.
    pub ai_flags: c_int,
    /// Address family.
    pub ai_family: c_int,
    /// `IBV_QPT_RC` or `IBV_QPT_UD`.
    pub ai_qp_type: c_int,
    /// `RDMA_PS_TCP` or `RDMA_PS_UDP`.
    pub ai_port_space: c_int,
    /// Bytes at `ai_src_addr`.
    pub ai_src_len: socklen_t,
    /// Bytes at `ai_dst_addr`.
    pub ai_dst_len: socklen_t,
    /// Source (local) address, or null.
    pub ai_src_addr: *mut sockaddr,
    /// Destination address, or null.
    pub ai_dst_addr: *mut sockaddr,
    /// Canonical source name, or null.
    pub ai_src_canonname: *mut c_char,
    /// Canonical destination name, or null.
    pub ai_dst_canonname: *mut c_char,
    /// Bytes at `ai_route`.
    pub ai_route_len: libc::size_t,
    /// Path records, or null.
    pub ai_route: *mut c_void,
    /// Bytes at `ai_connect`.
    pub ai_connect_len: libc::size_t,
    /// Connection private data, or null.
    pub ai_connect: *mut c_void,
    /// The next entry, or null.
    pub ai_next: *mut Self,
}

// The C layout: four ints, two socklen_t, then eight pointer-sized fields and the next link.
const _: () = assert!(size_of::<RdmaAddrinfo>() == 96);
const _: () = assert!(align_of::<RdmaAddrinfo>() == 8);

/// `RAI_PASSIVE`.
pub(crate) const RAI_PASSIVE: c_int = 1;
/// `RAI_NUMERICHOST`.
pub(crate) const RAI_NUMERICHOST: c_int = 2;
/// `RAI_FAMILY`.
pub(crate) const RAI_FAMILY: c_int = 8;
/// `RAI_SA`: resolve through the subnet administrator (InfiniBand path records).
pub(crate) const RAI_SA: c_int = 0x10;
/// `AF_IB`.
pub(crate) const AF_IB: c_int = 27;
/// `RDMA_PS_TCP`.
pub(crate) const RDMA_PS_TCP: c_int = 0x0106;
/// `RDMA_PS_UDP`.
pub(crate) const RDMA_PS_UDP: c_int = 0x0111;
/// `IBV_QPT_RC`.
pub(crate) const IBV_QPT_RC: c_int = 2;
/// `IBV_QPT_UD`.
pub(crate) const IBV_QPT_UD: c_int = 4;

/// True for requests only librdmacm's RDMA CM can answer: `AF_IB` addresses and `RAI_SA`
/// path queries. `rdma_getaddrinfo` forwards those to the system's librdmacm.
pub(crate) fn needs_rdma_cm(hints: &RdmaAddrinfo) -> bool {
    hints.ai_family == AF_IB || hints.ai_flags & RAI_SA != 0
}

/// A `malloc`ed copy of `len` bytes at `src` (null for a null source).
///
/// # Safety
/// `src` must be null or point to `len` readable bytes.
unsafe fn dup(src: *const c_void, len: usize) -> Result<*mut c_void, c_int> {
    if src.is_null() || len == 0 {
        return Ok(std::ptr::null_mut());
    }
    // SAFETY: malloc has no preconditions.
    let p = unsafe { libc::malloc(len) };
    if p.is_null() {
        return Err(libc::EAI_MEMORY);
    }
    // SAFETY: p has len bytes, src has len readable bytes (caller), fresh memory cannot
    // overlap.
    unsafe { std::ptr::copy_nonoverlapping(src.cast::<u8>(), p.cast::<u8>(), len) };
    Ok(p)
}

/// `rdma_getaddrinfo`.
///
/// # Safety
/// `node` and `service` must be null or NUL-terminated strings; `hints` null or a valid
/// `rdma_addrinfo`; `res` valid for a write.
pub(crate) unsafe fn getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const RdmaAddrinfo,
    res: *mut *mut RdmaAddrinfo,
) -> c_int {
    if res.is_null() || (node.is_null() && service.is_null()) {
        return libc::EAI_NONAME;
    }
    // SAFETY: hints is null or valid (caller).
    let hints = unsafe { hints.as_ref() };
    let flags = hints.map_or(0, |h| h.ai_flags);
    let family = hints.map_or(0, |h| h.ai_family);
    if family == AF_IB {
        return libc::EAI_FAMILY;
    }
    let udp = hints.is_some_and(|h| h.ai_port_space == RDMA_PS_UDP || h.ai_qp_type == IBV_QPT_UD);
    // SAFETY: addrinfo is plain old data; all-zero is a valid value.
    let mut ai_hints: libc::addrinfo = unsafe { std::mem::zeroed() };
    if flags & RAI_PASSIVE != 0 {
        ai_hints.ai_flags |= libc::AI_PASSIVE;
    }
    if flags & RAI_NUMERICHOST != 0 {
        ai_hints.ai_flags |= libc::AI_NUMERICHOST;
    }
    if flags & RAI_FAMILY != 0 || family != 0 {
        ai_hints.ai_family = family;
    }
    (ai_hints.ai_socktype, ai_hints.ai_protocol) = if udp {
        (libc::SOCK_DGRAM, libc::IPPROTO_UDP)
    } else {
        (libc::SOCK_STREAM, libc::IPPROTO_TCP)
    };
    let mut ai: *mut libc::addrinfo = std::ptr::null_mut();
    // SAFETY: node/service are null or C strings (caller); ai_hints and ai are live locals.
    let r = unsafe { libc::getaddrinfo(node, service, &ai_hints, &mut ai) };
    if r != 0 {
        return r;
    }
    // SAFETY: getaddrinfo succeeded, so ai is a non-empty list it allocated.
    let first = unsafe { &*ai };
    let built = build(first, flags, udp, hints);
    // SAFETY: ai came from getaddrinfo and is freed once.
    unsafe { libc::freeaddrinfo(ai) };
    match built {
        Ok(p) => {
            // SAFETY: res is valid for a write (caller).
            unsafe { *res = p };
            0
        }
        Err(e) => e,
    }
}

fn build(
    ai: &libc::addrinfo,
    flags: c_int,
    udp: bool,
    hints: Option<&RdmaAddrinfo>,
) -> Result<*mut RdmaAddrinfo, c_int> {
    // SAFETY: calloc has no preconditions; zeroed memory is a valid RdmaAddrinfo (nulls).
    let rai = unsafe { libc::calloc(1, size_of::<RdmaAddrinfo>()) }.cast::<RdmaAddrinfo>();
    if rai.is_null() {
        return Err(libc::EAI_MEMORY);
    }
    // SAFETY: fresh, zeroed, exclusively ours.
    let r = unsafe { &mut *rai };
    r.ai_flags = flags;
    r.ai_family = ai.ai_family;
    r.ai_qp_type = if udp { IBV_QPT_UD } else { IBV_QPT_RC };
    r.ai_port_space = if udp { RDMA_PS_UDP } else { RDMA_PS_TCP };
    // SAFETY: ai_addr has ai_addrlen bytes (getaddrinfo's contract).
    let addr = match unsafe { dup(ai.ai_addr.cast(), ai.ai_addrlen as usize) } {
        Ok(a) => a.cast::<sockaddr>(),
        Err(e) => {
            // SAFETY: rai is ours, with null members.
            unsafe { freeaddrinfo(rai) };
            return Err(e);
        }
    };
    if flags & RAI_PASSIVE != 0 {
        r.ai_src_addr = addr;
        r.ai_src_len = ai.ai_addrlen;
    } else {
        r.ai_dst_addr = addr;
        r.ai_dst_len = ai.ai_addrlen;
        if let Some(h) = hints.filter(|h| !h.ai_src_addr.is_null()) {
            // SAFETY: the hints' source address has ai_src_len bytes (caller).
            match unsafe { dup(h.ai_src_addr.cast(), h.ai_src_len as usize) } {
                Ok(s) => {
                    r.ai_src_addr = s.cast();
                    r.ai_src_len = h.ai_src_len;
                }
                Err(e) => {
                    // SAFETY: rai is ours; its members are null or malloc'd.
                    unsafe { freeaddrinfo(rai) };
                    return Err(e);
                }
            }
        }
    }
    Ok(rai)
}

/// `rdma_freeaddrinfo`: frees a list and every member (as librdmacm does), so lists built
/// by the program the same way are freed correctly too. A null list is ignored.
///
/// # Safety
/// `res` must be null or a list whose entries and members were allocated with `malloc`.
pub(crate) unsafe fn freeaddrinfo(mut res: *mut RdmaAddrinfo) {
    while !res.is_null() {
        // SAFETY: res is a live entry (caller).
        let r = unsafe { &*res };
        let next = r.ai_next;
        for p in [
            r.ai_src_addr.cast::<c_void>(),
            r.ai_dst_addr.cast(),
            r.ai_src_canonname.cast(),
            r.ai_dst_canonname.cast(),
            r.ai_route,
            r.ai_connect,
        ] {
            // SAFETY: each member is null or malloc'd (caller); free(NULL) is a no-op.
            unsafe { libc::free(p) };
        }
        // SAFETY: the entry itself was malloc'd (caller).
        unsafe { libc::free(res.cast()) };
        res = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numeric_addresses_resolve_to_librdmacm_layout() {
        let mut hints: RdmaAddrinfo =
            // SAFETY: all-zero is a valid RdmaAddrinfo (null pointers).
            unsafe { std::mem::zeroed() };
        hints.ai_flags = RAI_NUMERICHOST;
        hints.ai_port_space = RDMA_PS_TCP;
        let mut res: *mut RdmaAddrinfo = std::ptr::null_mut();
        // SAFETY: C strings and live pointers.
        let r = unsafe { getaddrinfo(c"127.0.0.1".as_ptr(), c"7471".as_ptr(), &hints, &mut res) };
        assert_eq!(r, 0);
        // SAFETY: success returned one entry.
        let e = unsafe { &*res };
        assert_eq!(
            (e.ai_family, e.ai_qp_type, e.ai_port_space),
            (libc::AF_INET, IBV_QPT_RC, RDMA_PS_TCP)
        );
        assert!(e.ai_src_addr.is_null() && !e.ai_dst_addr.is_null());
        // SAFETY: dst has ai_dst_len bytes.
        let a = unsafe { crate::addr::read(e.ai_dst_addr, e.ai_dst_len) }.unwrap();
        assert_eq!(a, "127.0.0.1:7471".parse().unwrap());
        // SAFETY: res came from getaddrinfo.
        unsafe { freeaddrinfo(res) };

        hints.ai_flags = RAI_PASSIVE;
        res = std::ptr::null_mut();
        // SAFETY: as above.
        let r = unsafe { getaddrinfo(std::ptr::null(), c"7471".as_ptr(), &hints, &mut res) };
        assert_eq!(r, 0);
        // SAFETY: success returned one entry.
        let e = unsafe { &*res };
        assert!(!e.ai_src_addr.is_null() && e.ai_dst_addr.is_null());
        // SAFETY: res came from getaddrinfo; null is accepted.
        unsafe {
            freeaddrinfo(res);
            freeaddrinfo(std::ptr::null_mut());
        }

        hints.ai_family = AF_IB;
        // SAFETY: as above.
        let r = unsafe { getaddrinfo(c"::1".as_ptr(), c"1".as_ptr(), &hints, &mut res) };
        assert_eq!(r, libc::EAI_FAMILY);
        hints.ai_family = 0;
        hints.ai_flags = RAI_NUMERICHOST;
        // SAFETY: as above.
        let r = unsafe { getaddrinfo(c"not-a-number".as_ptr(), c"1".as_ptr(), &hints, &mut res) };
        assert_eq!(r, libc::EAI_NONAME);
    }
}
