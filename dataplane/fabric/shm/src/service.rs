//! The device's control service thread: a `poll(2)` loop over registered descriptors.
//!
//! One thread per device blocks in `poll(2)` on every descriptor registered with it: the
//! context socket, every listener, every connection being set up and every live
//! connection. What happens when one becomes readable (or hangs up) is up to the
//! [`Watch`] registered with it; the connection manager and the device register theirs.
//! When a peer process dies the kernel closes its sockets, `poll` wakes at once, and the
//! watcher of that connection moves its queue pair to the error state. Detection time is
//! therefore the scheduling latency of this thread (microseconds; bounded in practice by
//! one scheduler tick on a busy host), not a timeout.
//!
//! The thread never runs data-path code and the data path never waits for it. This module
//! knows nothing of what it watches, so everything above it can register here.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{JoinHandle, ThreadId};

use crate::msg::MAX_MSG;
use crate::util::lock;

/// Something the service thread watches.
pub(crate) trait Watch: Send + Sync {
    /// `fd` (the descriptor this was registered under) is readable, hung up or in error.
    /// Runs on the service thread; `buf` is scratch space of `MAX_MSG` bytes.
    fn ready(&self, reg: &Registry, fd: RawFd, buf: &mut [u8]);
}

/// The watched descriptors, shared by the owner and the thread.
pub(crate) struct Registry {
    wake: OwnedFd,
    items: Mutex<HashMap<RawFd, Arc<dyn Watch>>>,
    stop: AtomicBool,
}

impl Registry {
    fn kick(&self) {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a live u64 to our eventfd.
        unsafe { libc::write(self.wake.as_raw_fd(), (&raw const one).cast(), 8) };
    }

    /// Watches `fd` with `w` (replacing any earlier watcher of `fd`).
    pub(crate) fn add(&self, fd: RawFd, w: Arc<dyn Watch>) {
        lock(&self.items).insert(fd, w);
        self.kick();
    }

    /// Stops watching `fd`.
    pub(crate) fn remove(&self, fd: RawFd) {
        if lock(&self.items).remove(&fd).is_some() {
            self.kick();
        }
    }

    fn contains(&self, fd: RawFd) -> bool {
        lock(&self.items).contains_key(&fd)
    }
}

/// The service thread's handle, owned by the device.
pub(crate) struct Service {
    reg: Arc<Registry>,
    thread: Mutex<Option<JoinHandle<()>>>,
    tid: OnceLock<ThreadId>,
}

impl Service {
    pub(crate) fn new() -> io::Result<Self> {
        // SAFETY: eventfd(2) with valid flags; checked below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            reg: Arc::new(Registry {
                // SAFETY: fresh descriptor we own.
                wake: unsafe { OwnedFd::from_raw_fd(fd) },
                items: Mutex::new(HashMap::new()),
                stop: AtomicBool::new(false),
            }),
            thread: Mutex::new(None),
            tid: OnceLock::new(),
        })
    }

    /// The registry watchers are added to.
    pub(crate) fn registry(&self) -> &Registry {
        &self.reg
    }

    /// Starts the thread.
    pub(crate) fn start(&self, name: String) -> io::Result<()> {
        let reg = self.reg.clone();
        let h = std::thread::Builder::new()
            .name(name)
            .spawn(move || run(&reg))?;
        let _ = self.tid.set(h.thread().id());
        *lock(&self.thread) = Some(h);
        Ok(())
    }

    /// Stops the thread (joining it unless called from it) and drops every watcher.
    pub(crate) fn shutdown(&self) {
        // Release: pairs with the Acquire in `run`, which then sees the stop.
        self.reg.stop.store(true, Ordering::Release);
        self.reg.kick();
        let h = lock(&self.thread).take();
        if let Some(h) = h
            && Some(&std::thread::current().id()) != self.tid.get()
        {
            let _ = h.join();
        }
        lock(&self.reg.items).clear();
    }
}

fn run(reg: &Registry) {
    let mut buf = vec![0u8; MAX_MSG];
    loop {
        // Acquire: pairs with the Release in `shutdown`.
        if reg.stop.load(Ordering::Acquire) {
            return;
        }
        let items: Vec<(RawFd, Arc<dyn Watch>)> = lock(&reg.items)
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        let mut pfds: Vec<libc::pollfd> = Vec::with_capacity(items.len() + 1);
        pfds.push(libc::pollfd {
            fd: reg.wake.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        for (fd, _) in &items {
            pfds.push(libc::pollfd {
                fd: *fd,
                events: libc::POLLIN,
                revents: 0,
            });
        }
        // SAFETY: pfds is a live array of pfds.len() pollfd structs.
        let r = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, -1) };
        if r < 0 {
            continue;
        }
        if pfds[0].revents != 0 {
            let mut v: u64 = 0;
            // SAFETY: reading 8 bytes into a live u64 from our nonblocking eventfd.
            unsafe { libc::read(reg.wake.as_raw_fd(), (&raw mut v).cast(), 8) };
        }
        // Acquire: as above.
        if reg.stop.load(Ordering::Acquire) {
            return;
        }
        for (p, (fd, w)) in pfds[1..].iter().zip(items) {
            // Skip items removed while we were blocked.
            if p.revents == 0 || !reg.contains(fd) {
                continue;
            }
            w.ready(reg, fd, &mut buf);
        }
    }
}

/// Waits up to `ms` for `fd` to become readable.
pub(crate) fn wait_readable(fd: RawFd, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&raw mut p, 1, ms) > 0 }
}
