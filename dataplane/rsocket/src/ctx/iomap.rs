//! `riomap`, `riounmap` and `riowrite` on a context: direct placement into a peer's
//! mapped buffer, as librdmacm's iomap calls.
//!
//! Registering memory with remote write may block (the shm provider waits for every
//! connected peer of the protection domain to map a newly exported region), so `riomap`
//! registers with no lock held, between two short steps under the data lock: reading the
//! stream's protection domain and connection, then publishing the mapping if the socket
//! still holds that connection. Registrations are dropped with the data lock released.

use std::sync::Arc;

use mempool::memory::Region;

use super::RsContext;
use super::sock::{IoMapping, Phase, SendFlagsRs, SockId};
use crate::error::RsError;
use crate::wait::Waiter;
use crate::wire::RsSge;
use dp_fabric::{Access, ConnId, MemoryRegion, ProtectionDomain, Provider};

impl<P: Provider> RsContext<P> {
    /// Publishes `len` bytes of `region` at `off` for the peer's `riowrite` (`riomap` with
    /// `PROT_WRITE`); `offset` is the application offset (`None`: the buffer's address, as
    /// librdmacm's `-1`). Returns the offset. The registration lives until `iounmap` or
    /// close.
    ///
    /// # Errors
    /// `EINVAL` (not connected, bad range), `ENOMEM` (no free slot at the peer).
    pub fn iomap(
        &self,
        id: SockId,
        region: &Arc<Region>,
        off: usize,
        len: usize,
        offset: Option<u64>,
    ) -> Result<u64, RsError> {
        let length = u32::try_from(len).map_err(|_| RsError::Invalid)?;
        let (pd, cid) = self.iomap_target(id)?;
        let mr = pd
            .reg_region(region, off, len, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .map_err(|_| RsError::Invalid)?;
        self.iomap_publish(id, cid, mr, length, offset)
    }

    /// The first step of `riomap`, under the data lock: the protection domain to register
    /// in, and the connection the mapping is for.
    fn iomap_target(&self, id: SockId) -> Result<(P::Pd, ConnId), RsError> {
        let mut c = self.data();
        let st = c.stream(id)?;
        if st.phase != Phase::Established {
            return Err(RsError::Invalid);
        }
        Ok((st.pd.clone(), st.conn_id))
    }

    /// The last step of `riomap`, under the data lock: publishes `mr` at `offset` (`None`:
    /// its address) if socket `id` still holds connection `cid` (it may have been closed,
    /// and its id reused, while registering). On failure the registration is dropped
    /// after the lock is released.
    fn iomap_publish(
        &self,
        id: SockId,
        cid: ConnId,
        mr: P::Mr,
        length: u32,
        offset: Option<u64>,
    ) -> Result<u64, RsError> {
        let addr = mr.addr();
        let offset = offset.unwrap_or(addr);
        let sge = RsSge {
            addr,
            key: mr.rkey(),
            length,
        };
        let mut c = self.data();
        let st = match c.stream(id) {
            Ok(st) if st.conn_id == cid && st.phase == Phase::Established => st,
            other => {
                let e = other.err().unwrap_or(RsError::Invalid);
                drop(c);
                drop(mr);
                return Err(e);
            }
        };
        match st.conn.iomap(offset, sge) {
            Ok(index) => {
                st.maps.push(IoMapping {
                    addr,
                    len: length as usize,
                    index: Some(index),
                    _mr: mr,
                });
                Ok(offset)
            }
            Err(e) => {
                drop(c);
                drop(mr);
                Err(e)
            }
        }
    }

    /// [`iomap`](Self::iomap) on raw process memory (`riomap` on a caller's buffer, such as
    /// a `malloc`ed one): registers `[addr, addr + len)` for the peer's direct writes and
    /// publishes it at `offset` (`None`: the buffer's address). Withdraw it with
    /// [`iounmap`](Self::iounmap)`(addr, len)`.
    ///
    /// On the shm provider, memory outside shareable regions is made shareable in place
    /// (see `fabric::shm`'s protection domain docs for what that costs the program).
    ///
    /// # Safety
    /// `[addr, addr + len)` must stay mapped and writable until the mapping is withdrawn or
    /// the socket is closed; the peer writes into it at any time meanwhile, so no Rust
    /// reference to it may be alive while it is mapped. On the shm provider, no other
    /// thread may store into the pages holding the range during this call.
    ///
    /// # Errors
    /// `EINVAL` (not connected, or memory the provider cannot register), `ENOMEM` (no free
    /// slot at the peer).
    #[allow(unsafe_code)]
    pub unsafe fn iomap_raw(
        &self,
        id: SockId,
        addr: *mut u8,
        len: usize,
        offset: Option<u64>,
    ) -> Result<u64, RsError> {
        let length = u32::try_from(len).map_err(|_| RsError::Invalid)?;
        let (pd, cid) = self.iomap_target(id)?;
        // SAFETY: the range stays mapped and writable while registered, and nothing holds
        // a Rust reference into it: this function's own contract.
        let mr = unsafe { pd.reg_raw(addr, len, Access::LOCAL_WRITE | Access::REMOTE_WRITE) }
            .map_err(|_| RsError::Invalid)?;
        self.iomap_publish(id, cid, mr, length, offset)
    }

    /// Withdraws a mapping made with [`iomap`](Self::iomap) (`riounmap`): `addr` and `len`
    /// must match it.
    ///
    /// # Errors
    /// `EINVAL` if no such mapping.
    pub fn iounmap(&self, id: SockId, addr: u64, len: usize) -> Result<(), RsError> {
        let m = {
            let mut c = self.data();
            let st = c.stream(id)?;
            let i = st
                .maps
                .iter()
                .position(|m| m.addr == addr && m.len == len)
                .ok_or(RsError::Invalid)?;
            let m = st.maps.swap_remove(i);
            if let Some(idx) = m.index {
                st.conn.iounmap(idx);
            }
            m
        };
        // Deregistration may wait for the provider's locks: not under the data lock.
        drop(m);
        Ok(())
    }

    /// Writes directly into the peer's mapping at `offset` (`riowrite`). Blocks like
    /// `send` on a blocking socket.
    ///
    /// # Errors
    /// `EINVAL` (offset not mapped by the peer), `EWOULDBLOCK`, `ECONNRESET`.
    pub fn iowrite(
        &self,
        id: SockId,
        data: &[u8],
        offset: u64,
        flags: SendFlagsRs,
    ) -> Result<usize, RsError> {
        let mut done = 0usize;
        let mut w = Waiter::new(self.polling_time);
        loop {
            let (r, nonblocking) = {
                let mut c = self.data();
                let r = c.iowrite(id, &data[done..], offset + done as u64);
                c.progress_one(id);
                (r, c.sock(id)?.nonblocking || flags.dontwait)
            };
            match r {
                Ok(n) => {
                    done += n;
                    if done == data.len() || nonblocking {
                        return Ok(done);
                    }
                    w.reset();
                }
                Err(RsError::WouldBlock) if !nonblocking => {}
                Err(e) => return if done > 0 { Ok(done) } else { Err(e) },
            }
            if data.is_empty() {
                return Ok(0);
            }
            w.wait();
        }
    }
}
