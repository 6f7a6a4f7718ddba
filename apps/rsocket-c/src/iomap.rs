//! `riomap`, `riounmap`, `riowrite`: direct placement into buffers the peer published.
//!
//! `riomap(PROT_WRITE)` registers the caller's memory for the peer's remote writes and
//! publishes it lazily (with the socket's next send), as in librdmacm. With the shm provider
//! a `malloc`ed buffer is made shareable in place on first registration: see
//! `dataplane::fabric::shm` for what that means for the program (the pages become shared
//! memory; `fork` afterwards is unsupported, as it is with librdmacm's registrations).
//! `riomap(PROT_NONE)` is a local-only registration, which librdmacm makes and nothing ever
//! reads: here it is only remembered, for `riounmap`.
//!
//! Unlike librdmacm, `riowrite` to an offset the peer never mapped fails with `EINVAL`
//! (librdmacm returns 0 without setting errno), and it needs no stream credit.

use dataplane::fabric::Provider;
use libc::c_int;

use crate::engine::Engine;
use crate::errno::Errno;
use crate::handles::LocalMap;
use crate::io::{data_err, send_flags};

impl<P: Provider> Engine<P> {
    /// `riomap`: returns the offset the peer writes at.
    ///
    /// # Safety
    /// `[buf, buf + len)` must be memory of the program that stays mapped and writable
    /// until `riounmap` or `rclose`; the peer writes into it at any time meanwhile.
    ///
    /// # Errors
    /// `EBADF`, `EINVAL` (bad `prot`, not connected, memory that cannot be registered),
    /// `ENOMEM` (no free slot in the peer's iomap table; see `RDMA_IOMAPSIZE`).
    pub(crate) unsafe fn iomap(
        &self,
        fd: c_int,
        buf: *mut u8,
        len: usize,
        prot: c_int,
        offset: libc::off_t,
    ) -> Result<libc::off_t, Errno> {
        let id = self.stream(fd, libc::EINVAL)?;
        let offset = if offset == -1 {
            None
        } else {
            Some(u64::try_from(offset).map_err(|_| Errno(libc::EINVAL))?)
        };
        match prot {
            libc::PROT_WRITE => {
                // SAFETY: forwarded from this function's contract.
                let off = unsafe { self.ctx.iomap_raw(id, buf, len, offset) }?;
                libc::off_t::try_from(off).map_err(|_| Errno(libc::EINVAL))
            }
            libc::PROT_NONE => {
                let h = self.handle(fd)?;
                let mut maps = h
                    .local_maps
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                maps.push(LocalMap {
                    addr: buf as usize,
                    len,
                });
                let off = offset.unwrap_or(buf as u64);
                libc::off_t::try_from(off).map_err(|_| Errno(libc::EINVAL))
            }
            _ => Err(Errno(libc::EINVAL)),
        }
    }

    /// `riounmap`: withdraws the mapping of exactly `(buf, len)`.
    ///
    /// # Errors
    /// `EBADF`, `EINVAL` if no such mapping.
    pub(crate) fn iounmap(&self, fd: c_int, buf: usize, len: usize) -> Result<(), Errno> {
        let id = self.stream(fd, libc::EINVAL)?;
        let h = self.handle(fd)?;
        {
            let mut maps = h
                .local_maps
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let m = LocalMap { addr: buf, len };
            if let Some(i) = maps.iter().position(|x| *x == m) {
                maps.swap_remove(i);
                return Ok(());
            }
        }
        self.ctx.iounmap(id, buf as u64, len)?;
        Ok(())
    }

    /// `riowrite`: writes `data` into the peer's mapping at `offset`.
    ///
    /// # Errors
    /// `EBADF`, `EINVAL` (offset not mapped by the peer), `EWOULDBLOCK`, `ECONNRESET`.
    pub(crate) fn iowrite(
        &self,
        fd: c_int,
        data: &[u8],
        offset: libc::off_t,
        flags: c_int,
    ) -> Result<usize, Errno> {
        let id = self.stream(fd, libc::EINVAL)?;
        let offset = u64::try_from(offset).map_err(|_| Errno(libc::EINVAL))?;
        self.ctx
            .iowrite(id, data, offset, send_flags(flags))
            .map_err(data_err)
    }
}
