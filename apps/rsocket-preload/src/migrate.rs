//! Moving a TCP connection to rsockets, and [`route`]: where a call on a descriptor goes.
//!
//! Connections are set up by the kernel (`connect`, `accept` on kernel sockets), then
//! moved: the accepting side opens an rsocket listener on an ephemeral port of its local
//! address and sends an offer (`wire::Hello`) with the port and a random cookie on the TCP
//! connection; the connecting side answers `Coming`, connects an rsocket to the peer's
//! address at that port and sends the cookie on it; the accepting side accepts, checks the
//! cookie, and both sides carry the connection on the rsocket from then on. The TCP
//! connection stays open, idle, behind the program's descriptor (`table`).
//!
//! # When: first use, which is what makes fork work
//!
//! By default ([`Mode::FirstUse`]) a connection moves on the first call that uses it for
//! I/O or waits on it: `read`/`write` and their kin, `poll`/`ppoll`/`select`/`pselect`,
//! `shutdown`, `dup`. Until then it is a plain kernel socket that a `fork` shares like any
//! other, and it moves in whichever process uses it first, with that process's own engine.
//! This is what a forking server (qperf's) needs: it accepts, forks, and the child waits
//! in `select` before reading; librdmacm's `librspreload` moves connections only on
//! `read`/`write` and its child's `select` waits forever. `DP_RSPRELOAD_MIGRATE=connect`
//! moves every connection inside `accept`/`connect` instead ([`Mode::Connect`]).
//!
//! What a fork does not carry: a connection that moved before the fork is the parent's
//! (the child's descriptor fails with `EBADF` and a message), and a child of a process
//! whose engine started makes no rsockets (its new connections stay on kernel TCP, said
//! once on standard error): the engine's threads do not survive a fork.
//!
//! # Trust
//!
//! The peer is untrusted. A hello that does not parse, a cookie that does not match, an
//! rsocket that does not arrive within [`HANDSHAKE_LIMIT`]: that connection fails
//! (`ECONNRESET` from then on), counted in [`violations`], and nothing else is touched.
//! A peer that is not this library (its first bytes are not a hello) keeps the connection
//! on kernel TCP, its bytes unread. Both ends must run this library to get rsockets.

use core::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use libc::{c_int, sockaddr, sockaddr_in, sockaddr_in6, sockaddr_storage, socklen_t};

use crate::table::{self, Entry, Kind, Refs};
use crate::wire::{Hello, HelloKind, HelloView, LEN};
use crate::{block, real, rs, signals};

/// How long a handshake step may wait for a peer that said it is coming.
pub(crate) const HANDSHAKE_LIMIT: Duration = Duration::from_secs(10);

/// When connections move to rsockets (`DP_RSPRELOAD_MIGRATE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// On first use (the default): fork-safe.
    FirstUse,
    /// Inside `accept` and `connect`.
    Connect,
}

impl Mode {
    /// The environment variable.
    pub(crate) const VAR: &str = "DP_RSPRELOAD_MIGRATE";

    fn parse(v: Option<&str>) -> Result<Self, String> {
        match v {
            None | Some("" | "first-use") => Ok(Self::FirstUse),
            Some("connect") => Ok(Self::Connect),
            Some(o) => Err(format!(
                "{}={o:?} is not a mode; use 'first-use' (the default: a connection moves to \
                 rsockets when first used, so it survives fork) or 'connect' (inside accept \
                 and connect)",
                Self::VAR
            )),
        }
    }

    /// The mode of this process (read once).
    pub(crate) fn get() -> Self {
        static M: OnceLock<Mode> = OnceLock::new();
        *M.get_or_init(|| {
            Self::parse(std::env::var(Self::VAR).ok().as_deref()).unwrap_or_else(|e| {
                real::notice(&format!("{e}; using 'first-use'"));
                Self::FirstUse
            })
        })
    }
}

fn verbose() -> bool {
    static V: OnceLock<bool> = OnceLock::new();
    *V.get_or_init(|| std::env::var_os("DP_RSPRELOAD_VERBOSE").is_some())
}

static VIOLATIONS: AtomicU64 = AtomicU64::new(0);

fn violation(fd: c_int, what: &str) -> Outcome {
    // Relaxed: a statistic.
    let n = VIOLATIONS.fetch_add(1, Ordering::Relaxed) + 1;
    real::notice(&format!(
        "fd {fd}: the peer broke the handshake ({what}); this connection is reset \
         ({n} so far)"
    ));
    Outcome::Broken
}

/// Where a call on a descriptor goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// To the kernel, as is.
    Kernel,
    /// To rsocket `handle`; `nonblock` is the program's `O_NONBLOCK`.
    Rs { handle: c_int, nonblock: bool },
}

/// Where a call on `fd` goes, moving its connection to rsockets first if it is due.
///
/// # Errors
/// The errno of a descriptor that cannot be used: `EBADF` (moved in another process
/// before a fork), `ECONNRESET` (its move failed).
#[inline]
pub(crate) fn route(fd: c_int) -> Result<Route, c_int> {
    if rs::in_lib() {
        return Ok(Route::Kernel);
    }
    // The two answers of nearly every call, without the frame of the moving code.
    match table::get(fd) {
        None => Ok(Route::Kernel),
        Some(e) if matches!(e.kind, Kind::Socket | Kind::Listener) => Ok(Route::Kernel),
        Some(e) if e.kind == Kind::Rs => Ok(Route::Rs {
            handle: e.handle,
            nonblock: e.nonblock,
        }),
        Some(_) => route_slow(fd),
    }
}

/// [`route`] for a descriptor that is not settled: due to move, being moved, or unusable.
#[cold]
#[inline(never)]
fn route_slow(fd: c_int) -> Result<Route, c_int> {
    loop {
        let Some(e) = table::get(fd) else {
            return Ok(Route::Kernel);
        };
        match e.kind {
            Kind::Socket | Kind::Listener => return Ok(Route::Kernel),
            Kind::Rs => {
                return Ok(Route::Rs {
                    handle: e.handle,
                    nonblock: e.nonblock,
                });
            }
            Kind::Passive | Kind::Active => migrate(fd, e),
            Kind::Busy => std::thread::yield_now(),
            Kind::Foreign => {
                real::notice(&format!(
                    "fd {fd} moved to rsockets in the parent before fork(); only that process \
                     can use it. Run with {}=first-use (the default) so connections move \
                     in the process that uses them",
                    Mode::VAR
                ));
                return Err(libc::EBADF);
            }
            Kind::Broken => return Err(libc::ECONNRESET),
        }
    }
}

/// What moving a connection came to.
enum Outcome {
    /// It is on this rsocket.
    Rs(c_int),
    /// It stays on kernel TCP.
    Plain,
    /// It failed.
    Broken,
}

fn migrate(fd: c_int, e: Entry) {
    if !table::swap(fd, e, Entry::new(Kind::Busy, e.nonblock)) {
        return; // another thread changed it: look again
    }
    let out = if e.kind == Kind::Passive {
        passive(fd)
    } else {
        active(fd)
    };
    let busy = Entry::new(Kind::Busy, e.nonblock);
    // The program may have changed O_NONBLOCK meanwhile: take the current entry's.
    let now = table::get(fd).unwrap_or(busy);
    let to = match out {
        Outcome::Rs(h) => {
            Refs::init(h);
            if verbose() {
                real::notice(&format!("fd {fd}: on rsocket {h}"));
            }
            Entry {
                handle: h,
                ..Entry::new(Kind::Rs, now.nonblock)
            }
        }
        Outcome::Plain => {
            if now.nonblock {
                set_kernel_nonblock(fd, true);
            }
            if verbose() {
                real::notice(&format!("fd {fd}: stays on kernel TCP"));
            }
            // Not routed any more: a plain kernel socket.
            table::take(fd);
            return;
        }
        Outcome::Broken => Entry::new(Kind::Broken, now.nonblock),
    };
    if !table::swap(fd, now, to) {
        // Closed by another thread meanwhile (close waits for Busy, so this is a dup2
        // over it): nobody names the rsocket.
        if let Outcome::Rs(h) = out {
            // SAFETY: h is an rsocket this thread made.
            unsafe { rs::rclose(h) };
        }
    }
}

/// Sets or clears `O_NONBLOCK` on the kernel socket `fd`.
pub(crate) fn set_kernel_nonblock(fd: c_int, on: bool) {
    // SAFETY: fcntl on a descriptor number; failures leave it as it was.
    unsafe {
        let fl = real::fcntl(fd, libc::F_GETFL, 0);
        if fl >= 0 {
            let fl = if on {
                fl | libc::O_NONBLOCK
            } else {
                fl & !libc::O_NONBLOCK
            };
            real::fcntl(fd, libc::F_SETFL, fl as libc::c_ulong);
        }
    }
}

/// Writes all of `buf` to the kernel socket `fd` (blocking).
fn send_all(fd: c_int, buf: &[u8]) -> bool {
    let mut off = 0;
    while off < buf.len() {
        // SAFETY: buf[off..] is live for its length.
        let n = unsafe {
            real::send(
                fd,
                buf[off..].as_ptr().cast(),
                buf.len() - off,
                libc::MSG_NOSIGNAL,
            )
        };
        if n <= 0 {
            if n < 0 && real::errno() == libc::EINTR {
                continue;
            }
            return false;
        }
        off += n as usize;
    }
    true
}

/// Reads exactly `buf.len()` bytes from the kernel socket `fd` (blocking; `peek` leaves
/// them there). `Ok(false)` at end of stream, or for a peek whose first bytes already
/// show no magic.
fn recv_exact(fd: c_int, buf: &mut [u8], peek: bool) -> Result<bool, c_int> {
    let mut off = 0;
    loop {
        let (ptr, len, flags) = if peek {
            (buf.as_mut_ptr(), buf.len(), libc::MSG_PEEK)
        } else {
            (buf[off..].as_mut_ptr(), buf.len() - off, libc::MSG_WAITALL)
        };
        // SAFETY: ptr is live for len bytes.
        let n = unsafe { real::recv(fd, ptr.cast(), len, flags) };
        if n < 0 {
            match real::errno() {
                libc::EINTR => continue,
                e => return Err(e),
            }
        }
        if n == 0 {
            return Ok(false);
        }
        let n = n as usize;
        if peek {
            let seen = n.min(4);
            if buf[..seen] != crate::wire::MAGIC[..seen] {
                return Ok(false);
            }
            if n == buf.len() {
                return Ok(true);
            }
            std::thread::sleep(Duration::from_millis(1));
        } else {
            off += n;
            if off == buf.len() {
                return Ok(true);
            }
        }
    }
}

/// The address of `fd`'s local (`peer` false) or remote end, with IPv4-mapped IPv6
/// addresses turned into IPv4 ones (both ends then name the rsocket alike).
fn address(fd: c_int, peer: bool) -> Option<(sockaddr_storage, socklen_t)> {
    // SAFETY: a zeroed sockaddr_storage is valid.
    let mut ss: sockaddr_storage = unsafe { core::mem::zeroed() };
    let mut len = size_of::<sockaddr_storage>() as socklen_t;
    let p = (&raw mut ss).cast::<sockaddr>();
    // SAFETY: p and len describe ss.
    let r = unsafe {
        if peer {
            real::getpeername(fd, p, &mut len)
        } else {
            real::getsockname(fd, p, &mut len)
        }
    };
    if r != 0 {
        return None;
    }
    if c_int::from(ss.ss_family) == libc::AF_INET6 {
        // SAFETY: an AF_INET6 address fills a sockaddr_in6.
        let s6: sockaddr_in6 = unsafe { *(&raw const ss).cast() };
        let a = s6.sin6_addr.s6_addr;
        if a[..10] == [0; 10] && a[10..12] == [0xff, 0xff] {
            // SAFETY: zeroed sockaddrs are valid.
            let mut out: sockaddr_storage = unsafe { core::mem::zeroed() };
            let s4 = sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: s6.sin6_port,
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes([a[12], a[13], a[14], a[15]]),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: a sockaddr_in fits in a sockaddr_storage.
            unsafe { *(&raw mut out).cast::<sockaddr_in>() = s4 };
            return Some((out, size_of::<sockaddr_in>() as socklen_t));
        }
    }
    Some((ss, len))
}

/// Sets the port of an AF_INET or AF_INET6 address (network order inside).
fn set_port(ss: &mut sockaddr_storage, port: u16) {
    let fam = c_int::from(ss.ss_family);
    // SAFETY: the family says which struct the storage holds.
    unsafe {
        if fam == libc::AF_INET {
            (*(&raw mut *ss).cast::<sockaddr_in>()).sin_port = port.to_be();
        } else {
            (*(&raw mut *ss).cast::<sockaddr_in6>()).sin6_port = port.to_be();
        }
    }
}

/// The port of an AF_INET or AF_INET6 address.
fn port_of(ss: &sockaddr_storage) -> u16 {
    // SAFETY: the family says which struct the storage holds.
    unsafe {
        if c_int::from(ss.ss_family) == libc::AF_INET {
            u16::from_be((*(&raw const *ss).cast::<sockaddr_in>()).sin_port)
        } else {
            u16::from_be((*(&raw const *ss).cast::<sockaddr_in6>()).sin6_port)
        }
    }
}

fn plain_notice_once(why: &str) {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| real::notice(&format!("connections stay on kernel TCP: {why}")));
}

fn cannot_rsocket() -> &'static str {
    "this process cannot make rsockets (the rsocket library is missing, or this is a child \
     forked after its parent's rsocket engine started)"
}

/// A random cookie.
fn cookie() -> u64 {
    let mut c = [0u8; 8];
    // SAFETY: c is live for 8 bytes.
    let n = unsafe { libc::getrandom(c.as_mut_ptr().cast(), 8, 0) };
    if n != 8 {
        // Not secret, only unguessable by a process that did not see the offer: mix the
        // clock and the pid if getrandom is unavailable.
        let t = Instant::now().elapsed().as_nanos() as u64;
        return t ^ u64::from(std::process::id()).rotate_left(32) ^ 0x9e37_79b9_7f4a_7c15;
    }
    u64::from_ne_bytes(c)
}

/// A new non-blocking rsocket listener on `fd`'s local address, ephemeral port; returns
/// it and its port.
fn listener(fd: c_int) -> Option<(c_int, u16)> {
    let (mut local, len) = address(fd, false)?;
    set_port(&mut local, 0);
    let l = rs::new_stream(c_int::from(local.ss_family));
    if l < 0 {
        return None;
    }
    let p = (&raw const local).cast::<sockaddr>();
    let mut bound = local;
    let mut blen = len;
    // SAFETY: p/len describe local; bound/blen an out buffer.
    let ok = unsafe {
        rs::rbind(l, p, len) == 0
            && rs::rlisten(l, 1) == 0
            && rs::rgetsockname(l, (&raw mut bound).cast(), &mut blen) == 0
            && rs::rfcntl(l, libc::F_SETFL, libc::c_long::from(libc::O_NONBLOCK)) == 0
    };
    let port = port_of(&bound);
    if !ok || port == 0 {
        // SAFETY: l is an rsocket this function made.
        unsafe { rs::rclose(l) };
        return None;
    }
    Some((l, port))
}

/// The accepting side's move.
fn passive(fd: c_int) -> Outcome {
    let Some((l, port)) = rs::usable().then(|| listener(fd)).flatten() else {
        plain_notice_once(cannot_rsocket());
        return if send_all(fd, &Hello::bare(HelloKind::Plain).to_bytes()) {
            Outcome::Plain
        } else {
            Outcome::Broken
        };
    };
    let out = passive_offer(fd, l, port);
    // SAFETY: l is an rsocket made by listener().
    unsafe { rs::rclose(l) };
    out
}

fn passive_offer(fd: c_int, l: c_int, port: u16) -> Outcome {
    let cookie = cookie();
    let offer = Hello {
        kind: HelloKind::Offer,
        port,
        cookie,
    };
    if !send_all(fd, &offer.to_bytes()) {
        return Outcome::Broken;
    }
    let mut buf = [0u8; LEN];
    match recv_exact(fd, &mut buf, false) {
        Ok(true) => {}
        // The peer closed before using the connection: what it sees is the kernel's.
        Ok(false) => return Outcome::Plain,
        Err(_) => return Outcome::Broken,
    }
    match Hello::parse(&buf) {
        Ok(h) if h.kind == HelloKind::Plain => return Outcome::Plain,
        Ok(h) if h.kind == HelloKind::Coming => {}
        Ok(_) => return violation(fd, "an answer that is not Coming or Plain"),
        Err(e) => return violation(fd, e.reason()),
    }
    let since = signals::interrupts();
    let limit = HANDSHAKE_LIMIT.as_millis() as c_int;
    if !matches!(block::wait(l, libc::POLLIN, since, limit), Ok(true)) {
        return violation(fd, "it said Coming and did not connect");
    }
    // SAFETY: null address buffers are allowed.
    let d = unsafe { rs::raccept(l, core::ptr::null_mut(), core::ptr::null_mut()) };
    if d < 0 {
        return violation(fd, "its rsocket did not arrive");
    }
    // SAFETY: integer arguments.
    unsafe { rs::rfcntl(d, libc::F_SETFL, libc::c_long::from(libc::O_NONBLOCK)) };
    let mut got = [0u8; 8];
    let mut off = 0;
    let t0 = Instant::now();
    while off < 8 {
        // SAFETY: got[off..] is live.
        let n = unsafe { rs::rread(d, got[off..].as_mut_ptr().cast(), 8 - off) };
        if n > 0 {
            off += n as usize;
            continue;
        }
        let left = HANDSHAKE_LIMIT.saturating_sub(t0.elapsed()).as_millis() as c_int;
        if n == 0
            || real::errno() != libc::EAGAIN
            || !matches!(block::wait(d, libc::POLLIN, since, left), Ok(true))
        {
            // SAFETY: d is the rsocket accepted above.
            unsafe { rs::rclose(d) };
            return violation(fd, "no cookie on its rsocket");
        }
    }
    if u64::from_be_bytes(got) != cookie {
        // SAFETY: as above.
        unsafe { rs::rclose(d) };
        return violation(fd, "a wrong cookie");
    }
    Outcome::Rs(d)
}

/// The connecting side's move.
fn active(fd: c_int) -> Outcome {
    let mut buf = [0u8; LEN];
    match recv_exact(fd, &mut buf, true) {
        Ok(true) => {}
        // End of stream, or a peer that is not this library: kernel TCP, bytes unread.
        Ok(false) => {
            if buf != [0; LEN] && !HelloView::new_unchecked(&buf[..]).has_magic() {
                plain_notice_once(
                    "the peer does not run dp-rspreload (its first bytes are not an offer)",
                );
            }
            return Outcome::Plain;
        }
        Err(_) => return Outcome::Broken,
    }
    let offer = match Hello::parse(&buf) {
        Ok(h) => h,
        Err(e) => return violation(fd, e.reason()),
    };
    // Consume the offer (it is in the socket: the peek saw it).
    if !matches!(recv_exact(fd, &mut buf, false), Ok(true)) {
        return Outcome::Broken;
    }
    match offer.kind {
        HelloKind::Plain => return Outcome::Plain,
        HelloKind::Offer => {}
        _ => return violation(fd, "a hello that is not an offer"),
    }
    let peer = rs::usable().then(|| address(fd, true)).flatten();
    let Some((mut peer, len)) = peer else {
        plain_notice_once(cannot_rsocket());
        let ok = send_all(fd, &Hello::bare(HelloKind::Plain).to_bytes());
        return if ok { Outcome::Plain } else { Outcome::Broken };
    };
    let s = rs::new_stream(c_int::from(peer.ss_family));
    if s < 0 {
        plain_notice_once(cannot_rsocket());
        let ok = send_all(fd, &Hello::bare(HelloKind::Plain).to_bytes());
        return if ok { Outcome::Plain } else { Outcome::Broken };
    }
    if !send_all(fd, &Hello::bare(HelloKind::Coming).to_bytes()) {
        // SAFETY: s is the rsocket made above.
        unsafe { rs::rclose(s) };
        return Outcome::Broken;
    }
    set_port(&mut peer, offer.port);
    let c = offer.cookie.to_be_bytes();
    // SAFETY: peer/len describe the peer's address; c is live for 8 bytes.
    let ok = unsafe {
        rs::rconnect(s, (&raw const peer).cast(), len) == 0
            && rs::rsend(s, c.as_ptr().cast(), 8, 0) == 8
            && rs::rfcntl(s, libc::F_SETFL, libc::c_long::from(libc::O_NONBLOCK)) == 0
    };
    if !ok {
        let e = real::errno();
        // SAFETY: as above.
        unsafe { rs::rclose(s) };
        real::notice(&format!(
            "fd {fd}: connecting the rsocket to the offered port {} failed (errno {e}); \
             this connection is reset",
            offer.port
        ));
        return Outcome::Broken;
    }
    Outcome::Rs(s)
}

#[cfg(test)]
mod tests {
    use super::Mode;

    #[test]
    fn mode_defaults_to_first_use_and_refuses_unknown_values() {
        assert_eq!(Mode::parse(None), Ok(Mode::FirstUse));
        assert_eq!(Mode::parse(Some("first-use")), Ok(Mode::FirstUse));
        assert_eq!(Mode::parse(Some("connect")), Ok(Mode::Connect));
        let e = Mode::parse(Some("eager")).unwrap_err();
        assert!(
            e.contains("DP_RSPRELOAD_MIGRATE") && e.contains("'connect'"),
            "{e}"
        );
    }
}
