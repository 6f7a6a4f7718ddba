//! The C entry points: raw pointers in, C return conventions out.
//!
//! Every function here checks and converts its pointer arguments, runs the safe Rust
//! implementation (in [`crate::socket`], [`crate::io`], [`crate::poll`], [`crate::opts`],
//! [`crate::iomap`], [`crate::rdma`]) under [`guard`], and reports failure as C does: -1
//! (or `(size_t)-1`, or null) with `errno` set. `errno` is left alone on success. A panic
//! inside the library returns `EIO` rather than unwinding into C.
//!
//! Buffers are borrowed as Rust slices for the duration of the call, so the program must
//! not modify a buffer while a call that reads or fills it is running (as with any C
//! socket call). Calls on a descriptor never start the engine: before the first `rsocket`
//! no descriptor is an rsocket, so they fail with `EBADF` (and `rpoll`/`rselect` treat
//! every descriptor as ordinary).
//!
//! # Safety
//!
//! Each function's contract is the C one of `<rdma/rsocket.h>`: pointers are null only where
//! the C API allows it, point to as many bytes as their length arguments say, and stay
//! valid for the call.

use std::ffi::{c_char, c_void};
use std::net::SocketAddr;

use libc::{c_int, iovec, msghdr, off_t, pollfd, size_t, sockaddr, socklen_t, ssize_t};

use crate::addr::{self, CAddr};
use crate::engine::{Lib, dispatch, lib, started};
use crate::errno::{Errno, guard, ret_int, ret_size, set_errno};
use crate::io::Received;
use crate::poll::{FdSets, select, sys_poll};
use crate::rdma::{self, RdmaAddrinfo};

/// The engine, for a call on an existing descriptor: never starts it.
fn engine() -> Result<&'static Lib, Errno> {
    started().ok_or(Errno(libc::EBADF))
}

/// Borrows `(p, len)` as bytes.
///
/// # Safety
/// `p` must be null or point to `len` readable bytes that stay valid and unmodified for
/// `'a`.
unsafe fn bytes<'a>(p: *const c_void, len: usize) -> Result<&'a [u8], Errno> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Errno(libc::EFAULT));
    }
    if len > isize::MAX as usize {
        return Err(Errno(libc::EINVAL));
    }
    // SAFETY: non-null, len readable bytes valid for 'a (caller).
    Ok(unsafe { std::slice::from_raw_parts(p.cast(), len) })
}

/// Borrows `(p, len)` as writable bytes.
///
/// # Safety
/// `p` must be null or point to `len` writable bytes that nothing else accesses for `'a`.
unsafe fn bytes_mut<'a>(p: *mut c_void, len: usize) -> Result<&'a mut [u8], Errno> {
    if len == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return Err(Errno(libc::EFAULT));
    }
    if len > isize::MAX as usize {
        return Err(Errno(libc::EINVAL));
    }
    // SAFETY: non-null, len writable bytes exclusively ours for 'a (caller).
    Ok(unsafe { std::slice::from_raw_parts_mut(p.cast(), len) })
}

/// Most iovecs a call takes (Linux's `IOV_MAX`).
const IOV_MAX: c_int = 1024;

/// Borrows an iovec array as slices.
///
/// # Safety
/// `iov` must point to `cnt` iovecs, each describing memory as [`bytes`] requires.
unsafe fn iovecs<'a>(iov: *const iovec, cnt: c_int) -> Result<Vec<&'a [u8]>, Errno> {
    if !(0..=IOV_MAX).contains(&cnt) {
        return Err(Errno(libc::EINVAL));
    }
    if cnt > 0 && iov.is_null() {
        return Err(Errno(libc::EFAULT));
    }
    (0..cnt as usize)
        // SAFETY: i < cnt iovecs (caller), each valid as bytes() needs.
        .map(|i| unsafe {
            let v = &*iov.add(i);
            bytes(v.iov_base, v.iov_len)
        })
        .collect()
}

/// Borrows an iovec array as writable slices.
///
/// # Safety
/// `iov` must point to `cnt` iovecs, each describing memory as [`bytes_mut`] requires, not
/// overlapping one another.
unsafe fn iovecs_mut<'a>(iov: *const iovec, cnt: c_int) -> Result<Vec<&'a mut [u8]>, Errno> {
    if !(0..=IOV_MAX).contains(&cnt) {
        return Err(Errno(libc::EINVAL));
    }
    if cnt > 0 && iov.is_null() {
        return Err(Errno(libc::EFAULT));
    }
    (0..cnt as usize)
        // SAFETY: i < cnt iovecs (caller), each valid and disjoint as bytes_mut() needs.
        .map(|i| unsafe {
            let v = &*iov.add(i);
            bytes_mut(v.iov_base, v.iov_len)
        })
        .collect()
}

/// Reads an optional destination address (null: none).
///
/// # Safety
/// As [`addr::read`].
unsafe fn opt_addr(a: *const sockaddr, len: socklen_t) -> Result<Option<SocketAddr>, Errno> {
    if a.is_null() {
        return Ok(None);
    }
    // SAFETY: a points to len bytes (caller).
    unsafe { addr::read(a, len) }.map(Some)
}

/// Writes a received-from address, as recvfrom(2) does.
///
/// # Safety
/// As [`CAddr::write`].
unsafe fn put_from(r: &Received, out: *mut sockaddr, len: *mut socklen_t) {
    if let Some(a) = r.from {
        // SAFETY: forwarded from the caller.
        unsafe { CAddr::new(a, r.family).write(out, len) };
    } else if !len.is_null() {
        // SAFETY: len is valid when non-null (caller).
        unsafe { *len = 0 };
    }
}

/// `rsocket(3)`.
///
/// # Safety
/// None beyond C's: no pointer arguments.
pub(crate) unsafe extern "C" fn rsocket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    ret_int(guard(|| {
        crate::socket::check_socket_args(domain, ty, protocol)?;
        dispatch!(lib()?, e => e.socket(domain, ty, protocol))
    }))
}

/// `rbind(3)`.
///
/// # Safety
/// `addr` points to `len` bytes.
pub(crate) unsafe extern "C" fn rbind(s: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    ret_int(guard(|| {
        // SAFETY: caller's contract.
        let a = unsafe { addr::read(addr, len) }?;
        dispatch!(engine()?, e => e.bind(s, a)).map(|()| 0)
    }))
}

/// `rlisten(3)`.
///
/// # Safety
/// None beyond C's.
pub(crate) unsafe extern "C" fn rlisten(s: c_int, backlog: c_int) -> c_int {
    ret_int(guard(|| {
        dispatch!(engine()?, e => e.listen(s, backlog)).map(|()| 0)
    }))
}

/// `raccept(3)`.
///
/// # Safety
/// `addr`/`addrlen` null or valid, `addr` with `*addrlen` bytes.
pub(crate) unsafe extern "C" fn raccept(
    s: c_int,
    addr: *mut sockaddr,
    addrlen: *mut socklen_t,
) -> c_int {
    ret_int(guard(|| {
        let (n, peer, family) = dispatch!(engine()?, e => e.accept(s))?;
        // SAFETY: caller's contract.
        unsafe { CAddr::new(peer, family).write(addr, addrlen) };
        Ok(n)
    }))
}

/// `rconnect(3)`.
///
/// # Safety
/// `addr` points to `len` bytes.
pub(crate) unsafe extern "C" fn rconnect(s: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    ret_int(guard(|| {
        // SAFETY: caller's contract.
        let a = unsafe { addr::read(addr, len) }?;
        dispatch!(engine()?, e => e.connect(s, a)).map(|()| 0)
    }))
}

/// `rshutdown(3)`.
///
/// # Safety
/// None beyond C's.
pub(crate) unsafe extern "C" fn rshutdown(s: c_int, how: c_int) -> c_int {
    ret_int(guard(|| {
        dispatch!(engine()?, e => e.shutdown(s, how)).map(|()| 0)
    }))
}

/// `rclose(3)`.
///
/// # Safety
/// None beyond C's.
pub(crate) unsafe extern "C" fn rclose(s: c_int) -> c_int {
    ret_int(guard(|| dispatch!(engine()?, e => e.close(s)).map(|()| 0)))
}

/// `rrecv(3)`.
///
/// # Safety
/// `buf` has `len` writable bytes.
pub(crate) unsafe extern "C" fn rrecv(
    s: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
) -> ssize_t {
    ret_size(guard(|| {
        // SAFETY: caller's contract.
        let b = unsafe { bytes_mut(buf, len) }?;
        dispatch!(engine()?, e => e.recv(s, b, flags, false)).map(|r| r.len)
    }))
}

/// `rrecvfrom(3)`.
///
/// # Safety
/// `buf` has `len` writable bytes; `src`/`srclen` null or valid.
pub(crate) unsafe extern "C" fn rrecvfrom(
    s: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
    src: *mut sockaddr,
    srclen: *mut socklen_t,
) -> ssize_t {
    ret_size(guard(|| {
        // SAFETY: caller's contract.
        let b = unsafe { bytes_mut(buf, len) }?;
        let r = dispatch!(engine()?, e => e.recv(s, b, flags, !src.is_null()))?;
        // SAFETY: caller's contract.
        unsafe { put_from(&r, src, srclen) };
        Ok(r.len)
    }))
}

/// `rrecvmsg(3)`: fills every iovec; `MSG_TRUNC` in `msg_flags` for a truncated datagram;
/// no control data.
///
/// # Safety
/// `msg` is a valid `msghdr` whose iovecs and name buffer are valid.
pub(crate) unsafe extern "C" fn rrecvmsg(s: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    ret_size(guard(|| {
        // SAFETY: msg is valid (caller).
        let m = unsafe { msg.as_mut() }.ok_or(Errno(libc::EFAULT))?;
        // SAFETY: caller's contract.
        let mut bufs = unsafe { iovecs_mut(m.msg_iov, m.msg_iovlen as c_int) }?;
        let want = !m.msg_name.is_null();
        let r = dispatch!(engine()?, e => e.recv_vectored(s, &mut bufs, flags, want))?;
        if want {
            // SAFETY: msg_name has msg_namelen bytes (caller).
            unsafe { put_from(&r, m.msg_name.cast(), &mut m.msg_namelen) };
        }
        m.msg_controllen = 0;
        m.msg_flags = if r.truncated { libc::MSG_TRUNC } else { 0 };
        Ok(r.len)
    }))
}

/// `rsend(3)`.
///
/// # Safety
/// `buf` has `len` readable bytes.
pub(crate) unsafe extern "C" fn rsend(
    s: c_int,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
) -> ssize_t {
    ret_size(guard(|| {
        // SAFETY: caller's contract.
        let b = unsafe { bytes(buf, len) }?;
        dispatch!(engine()?, e => e.send(s, b, flags, None))
    }))
}

/// `rsendto(3)`.
///
/// # Safety
/// `buf` has `len` readable bytes; `dest` null or `destlen` bytes.
pub(crate) unsafe extern "C" fn rsendto(
    s: c_int,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
    dest: *const sockaddr,
    destlen: socklen_t,
) -> ssize_t {
    ret_size(guard(|| {
        // SAFETY: caller's contract.
        let b = unsafe { bytes(buf, len) }?;
        // SAFETY: caller's contract.
        let to = unsafe { opt_addr(dest, destlen) }?;
        dispatch!(engine()?, e => e.send(s, b, flags, to))
    }))
}

/// `rsendmsg(3)`: gathers every iovec; control data is refused (`EOPNOTSUPP`).
///
/// # Safety
/// `msg` is a valid `msghdr` whose iovecs and name are valid.
pub(crate) unsafe extern "C" fn rsendmsg(s: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    ret_size(guard(|| {
        // SAFETY: msg is valid (caller).
        let m = unsafe { msg.as_ref() }.ok_or(Errno(libc::EFAULT))?;
        if !m.msg_control.is_null() && m.msg_controllen > 0 {
            return Err(Errno(libc::EOPNOTSUPP));
        }
        // SAFETY: caller's contract.
        let bufs = unsafe { iovecs(m.msg_iov, m.msg_iovlen as c_int) }?;
        // SAFETY: caller's contract.
        let to = unsafe { opt_addr(m.msg_name.cast(), m.msg_namelen) }?;
        dispatch!(engine()?, e => e.send_vectored(s, &bufs, flags, to))
    }))
}

/// `rread(3)`.
///
/// # Safety
/// `buf` has `count` writable bytes.
pub(crate) unsafe extern "C" fn rread(s: c_int, buf: *mut c_void, count: size_t) -> ssize_t {
    // SAFETY: same contract.
    unsafe { rrecv(s, buf, count, 0) }
}

/// `rreadv(3)`: fills every iovec.
///
/// # Safety
/// `iov` points to `cnt` valid iovecs.
pub(crate) unsafe extern "C" fn rreadv(s: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    ret_size(guard(|| {
        // SAFETY: caller's contract.
        let mut bufs = unsafe { iovecs_mut(iov, cnt) }?;
        dispatch!(engine()?, e => e.recv_vectored(s, &mut bufs, 0, false)).map(|r| r.len)
    }))
}

/// `rwrite(3)`.
///
/// # Safety
/// `buf` has `count` readable bytes.
pub(crate) unsafe extern "C" fn rwrite(s: c_int, buf: *const c_void, count: size_t) -> ssize_t {
    // SAFETY: same contract.
    unsafe { rsend(s, buf, count, 0) }
}

/// `rwritev(3)`.
///
/// # Safety
/// `iov` points to `cnt` valid iovecs.
pub(crate) unsafe extern "C" fn rwritev(s: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    ret_size(guard(|| {
        // SAFETY: caller's contract.
        let bufs = unsafe { iovecs(iov, cnt) }?;
        dispatch!(engine()?, e => e.send_vectored(s, &bufs, 0, None))
    }))
}

/// `rpoll(3)`.
///
/// # Safety
/// `fds` points to `nfds` pollfds.
pub(crate) unsafe extern "C" fn rpoll(
    fds: *mut pollfd,
    nfds: libc::nfds_t,
    timeout: c_int,
) -> c_int {
    ret_int(guard(|| {
        let n = usize::try_from(nfds).map_err(|_| Errno(libc::EINVAL))?;
        let fds = if n == 0 {
            &mut []
        } else if fds.is_null() {
            return Err(Errno(libc::EFAULT));
        } else {
            // SAFETY: fds has nfds entries, ours for the call (caller).
            unsafe { std::slice::from_raw_parts_mut(fds, n) }
        };
        match started() {
            Some(l) => dispatch!(l, e => e.poll(fds, timeout)),
            None => sys_poll(fds, timeout),
        }
    }))
}

/// `rselect(3)`.
///
/// # Safety
/// Each set null or a valid `fd_set`; `timeout` null or valid.
pub(crate) unsafe extern "C" fn rselect(
    nfds: c_int,
    readfds: *mut libc::fd_set,
    writefds: *mut libc::fd_set,
    exceptfds: *mut libc::fd_set,
    timeout: *mut libc::timeval,
) -> c_int {
    ret_int(guard(|| {
        // SAFETY: each pointer null or valid and ours for the call (caller).
        let sets = unsafe {
            FdSets {
                read: readfds.as_mut(),
                write: writefds.as_mut(),
                except: exceptfds.as_mut(),
            }
        };
        // SAFETY: timeout null or valid (caller).
        let t = unsafe { timeout.as_ref() }.copied();
        let poll = |fds: &mut [pollfd], ms: c_int| match started() {
            Some(l) => dispatch!(l, e => e.poll(fds, ms)),
            None => sys_poll(fds, ms),
        };
        select(poll, nfds, sets, t)
    }))
}

/// The body of `rgetpeername`/`rgetsockname`: `get`'s address written to `addr` in C form.
///
/// # Safety
/// `addr`/`addrlen` valid, `addr` with `*addrlen` bytes.
unsafe fn write_name(
    addr: *mut sockaddr,
    addrlen: *mut socklen_t,
    get: impl FnOnce() -> Result<(SocketAddr, c_int), Errno>,
) -> c_int {
    ret_int(guard(|| {
        if addr.is_null() || addrlen.is_null() {
            return Err(Errno(libc::EFAULT));
        }
        let (a, family) = get()?;
        // SAFETY: caller's contract.
        unsafe { CAddr::new(a, family).write(addr, addrlen) };
        Ok(0)
    }))
}

/// `rgetpeername(3)`.
///
/// # Safety
/// `addr`/`addrlen` valid, `addr` with `*addrlen` bytes.
pub(crate) unsafe extern "C" fn rgetpeername(
    s: c_int,
    addr: *mut sockaddr,
    addrlen: *mut socklen_t,
) -> c_int {
    // SAFETY: caller's contract.
    unsafe { write_name(addr, addrlen, || dispatch!(engine()?, e => e.peer_addr(s))) }
}

/// `rgetsockname(3)`.
///
/// # Safety
/// `addr`/`addrlen` valid, `addr` with `*addrlen` bytes.
pub(crate) unsafe extern "C" fn rgetsockname(
    s: c_int,
    addr: *mut sockaddr,
    addrlen: *mut socklen_t,
) -> c_int {
    // SAFETY: caller's contract.
    unsafe { write_name(addr, addrlen, || dispatch!(engine()?, e => e.local_addr(s))) }
}

/// `rsetsockopt(3)`.
///
/// # Safety
/// `optval` has `optlen` readable bytes.
pub(crate) unsafe extern "C" fn rsetsockopt(
    s: c_int,
    level: c_int,
    name: c_int,
    optval: *const c_void,
    optlen: socklen_t,
) -> c_int {
    ret_int(guard(|| {
        // SAFETY: caller's contract.
        let v = unsafe { bytes(optval, optlen as usize) }?;
        dispatch!(engine()?, e => e.setsockopt(s, level, name, v)).map(|()| 0)
    }))
}

/// `rgetsockopt(3)`: copies at most `*optlen` bytes and sets `*optlen` to the bytes
/// copied, as getsockopt(2).
///
/// # Safety
/// `optlen` valid; `optval` with `*optlen` writable bytes.
pub(crate) unsafe extern "C" fn rgetsockopt(
    s: c_int,
    level: c_int,
    name: c_int,
    optval: *mut c_void,
    optlen: *mut socklen_t,
) -> c_int {
    ret_int(guard(|| {
        if optlen.is_null() {
            return Err(Errno(libc::EFAULT));
        }
        // SAFETY: optlen is valid (caller).
        let room = unsafe { *optlen } as usize;
        // SAFETY: caller's contract.
        let out = unsafe { bytes_mut(optval, room) }?;
        let v = dispatch!(engine()?, e => e.getsockopt(s, level, name))?;
        let n = v.with_bytes(|b| {
            let n = b.len().min(out.len());
            out[..n].copy_from_slice(&b[..n]);
            n
        });
        // SAFETY: optlen is valid (caller).
        unsafe { *optlen = n as socklen_t };
        Ok(0)
    }))
}

/// `rfcntl(3)`, declared variadic in C. On x86_64 and aarch64 Linux a variadic integer
/// argument travels in the same register as a fixed third argument, so the trampoline
/// reaches this fixed-argument function with `arg` in place; commands without an argument
/// leave garbage there, which they ignore.
///
/// # Safety
/// None beyond C's: the commands supported take no pointer.
pub(crate) unsafe extern "C" fn rfcntl(s: c_int, cmd: c_int, arg: libc::c_long) -> c_int {
    ret_int(guard(|| dispatch!(engine()?, e => e.fcntl(s, cmd, arg))))
}

/// `riomap(3)`: -1 with errno on failure.
///
/// # Safety
/// `buf` is `len` bytes of the program's memory that stay mapped and writable until
/// `riounmap` or `rclose`; the peer writes into it meanwhile.
pub(crate) unsafe extern "C" fn riomap(
    s: c_int,
    buf: *mut c_void,
    len: size_t,
    prot: c_int,
    _flags: c_int,
    offset: off_t,
) -> off_t {
    match guard(|| {
        if buf.is_null() {
            return Err(Errno(libc::EINVAL));
        }
        // SAFETY: caller's contract.
        dispatch!(engine()?, e => unsafe { e.iomap(s, buf.cast(), len, prot, offset) })
    }) {
        Ok(o) => o,
        Err(Errno(e)) => {
            set_errno(e);
            -1
        }
    }
}

/// `riounmap(3)`.
///
/// # Safety
/// None: the buffer is only compared.
pub(crate) unsafe extern "C" fn riounmap(s: c_int, buf: *mut c_void, len: size_t) -> c_int {
    ret_int(guard(|| {
        dispatch!(engine()?, e => e.iounmap(s, buf as usize, len)).map(|()| 0)
    }))
}

/// `riowrite(3)`: `(size_t)-1` with errno on failure.
///
/// # Safety
/// `buf` has `count` readable bytes.
pub(crate) unsafe extern "C" fn riowrite(
    s: c_int,
    buf: *const c_void,
    count: size_t,
    offset: off_t,
    flags: c_int,
) -> size_t {
    match guard(|| {
        // SAFETY: caller's contract.
        let b = unsafe { bytes(buf, count) }?;
        dispatch!(engine()?, e => e.iowrite(s, b, offset, flags))
    }) {
        Ok(n) => n,
        Err(Errno(e)) => {
            set_errno(e);
            usize::MAX
        }
    }
}

/// `rdma_getaddrinfo(3)`.
///
/// # Safety
/// As [`rdma::getaddrinfo`].
pub(crate) unsafe extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const RdmaAddrinfo,
    res: *mut *mut RdmaAddrinfo,
) -> c_int {
    // SAFETY: hints is null or a valid rdma_addrinfo (caller).
    if let Some(h) = unsafe { hints.as_ref() }
        && rdma::needs_rdma_cm(h)
    {
        // SAFETY: caller's contract, which the system librdmacm shares.
        return unsafe {
            crate::rdmacm_fwd::rdma_getaddrinfo(node, service, hints.cast(), res.cast())
        };
    }
    // SAFETY: caller's contract.
    guard(|| Ok(unsafe { rdma::getaddrinfo(node, service, hints, res) })).unwrap_or(libc::EAI_FAIL)
}

/// `rdma_freeaddrinfo(3)`.
///
/// # Safety
/// As [`rdma::freeaddrinfo`].
pub(crate) unsafe extern "C" fn rdma_freeaddrinfo(res: *mut RdmaAddrinfo) {
    let _ = guard(|| {
        // SAFETY: caller's contract.
        unsafe { rdma::freeaddrinfo(res) };
        Ok(())
    });
}
