//! Socket handles: every rsocket is named by the number of an eventfd this library opened
//! for it, as librdmacm names each rsocket by one of its own descriptors. The kernel hands
//! out descriptor numbers, so a handle never equals a descriptor the program has open, and
//! an ordinary descriptor passed to `rpoll`/`rselect` is never mistaken for an rsocket. The
//! eventfd is only a name: it is never signalled, and `rclose` closes it.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use dataplane::fabric::Provider;
use dataplane::rsocket::{RsDatagram, SockId};
use libc::c_int;

use crate::errno::Errno;

/// What a handle names.
pub(crate) enum Kind<P: Provider> {
    /// A stream socket of the context.
    Stream(SockId),
    /// A datagram socket. Its calls take `&mut`: one caller at a time.
    Dgram(Box<Mutex<RsDatagram<P>>>),
}

/// Options the C layer keeps itself: ones the socket layer has no use for, stored so that
/// `rgetsockopt` returns what `rsetsockopt` set (as librdmacm does for most of them).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Extra {
    /// `F_SETFL` flags other than `O_NONBLOCK` (whose truth lives in the socket).
    pub fl_flags: c_int,
    /// `SO_REUSEADDR`.
    pub reuseaddr: bool,
    /// `SO_OOBINLINE`.
    pub oobinline: bool,
    /// `IP_TOS`.
    pub tos: c_int,
    /// `IPV6_V6ONLY`.
    pub v6only: bool,
    /// `SO_BROADCAST` (datagram sockets).
    pub broadcast: bool,
    /// `F_SETOWN`'s owner (never signalled: rsockets raise no `SIGIO`/`SIGURG`).
    pub owner: c_int,
}

/// A `riomap(PROT_NONE)` mapping: a local-only registration, which nothing in the protocol
/// reads, so it is only remembered for `riounmap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LocalMap {
    pub addr: usize,
    pub len: usize,
}

/// One rsocket.
pub(crate) struct Handle<P: Provider> {
    fd: OwnedFd,
    /// `AF_INET` or `AF_INET6`.
    pub family: c_int,
    pub kind: Kind<P>,
    pub extra: Mutex<Extra>,
    pub local_maps: Mutex<Vec<LocalMap>>,
}

impl<P: Provider> Handle<P> {
    /// The handle number.
    pub(crate) fn number(&self) -> c_int {
        self.fd.as_raw_fd()
    }

    /// The C layer's option state.
    pub(crate) fn extra(&self) -> std::sync::MutexGuard<'_, Extra> {
        self.extra.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The datagram socket, locked (blocking until its current user is done).
    pub(crate) fn dgram(m: &Mutex<RsDatagram<P>>) -> std::sync::MutexGuard<'_, RsDatagram<P>> {
        m.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Opens the descriptor that names a new rsocket.
///
/// # Errors
/// `EMFILE`/`ENFILE` and the like from `eventfd`.
pub(crate) fn new_name(cloexec: bool) -> Result<OwnedFd, Errno> {
    let flags = if cloexec { libc::EFD_CLOEXEC } else { 0 };
    // SAFETY: eventfd has no pointer arguments.
    let fd = unsafe { libc::eventfd(0, flags) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: eventfd returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The handles of the process, indexed by handle number.
pub(crate) struct Handles<P: Provider> {
    slots: RwLock<Vec<Option<Arc<Handle<P>>>>>,
}

impl<P: Provider> Handles<P> {
    pub(crate) fn new() -> Self {
        Self {
            slots: RwLock::new(Vec::new()),
        }
    }

    /// The handle named `fd`, if it is an rsocket.
    pub(crate) fn get(&self, fd: c_int) -> Option<Arc<Handle<P>>> {
        let i = usize::try_from(fd).ok()?;
        let slots = self.slots.read().unwrap_or_else(PoisonError::into_inner);
        slots.get(i)?.clone()
    }

    /// True if `fd` names an rsocket.
    pub(crate) fn contains(&self, fd: c_int) -> bool {
        let Ok(i) = usize::try_from(fd) else {
            return false;
        };
        let slots = self.slots.read().unwrap_or_else(PoisonError::into_inner);
        slots.get(i).is_some_and(Option::is_some)
    }

    /// Registers a handle under its descriptor's number; returns the number.
    pub(crate) fn insert(&self, fd: OwnedFd, family: c_int, kind: Kind<P>) -> c_int {
        let n = fd.as_raw_fd();
        let h = Arc::new(Handle {
            fd,
            family,
            kind,
            extra: Mutex::new(Extra::default()),
            local_maps: Mutex::new(Vec::new()),
        });
        let i = usize::try_from(n).expect("the kernel hands out non-negative descriptors");
        let mut slots = self.slots.write().unwrap_or_else(PoisonError::into_inner);
        if slots.len() <= i {
            slots.resize(i + 1, None);
        }
        slots[i] = Some(h);
        n
    }

    /// Unregisters handle `fd`. Its descriptor closes when the last user drops it, after
    /// the caller has released the socket: so the number cannot be handed to a new rsocket
    /// while the old one still holds it.
    pub(crate) fn remove(&self, fd: c_int) -> Option<Arc<Handle<P>>> {
        let i = usize::try_from(fd).ok()?;
        let mut slots = self.slots.write().unwrap_or_else(PoisonError::into_inner);
        slots.get_mut(i)?.take()
    }
}
