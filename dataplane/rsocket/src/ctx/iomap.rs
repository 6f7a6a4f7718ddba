//! `riomap`, `riounmap` and `riowrite` on a context: direct placement into a peer's
//! mapped buffer, as librdmacm's iomap calls.

use std::sync::Arc;

use mempool::memory::Region;

use super::RsContext;
use super::sock::{IoMapping, Phase, SendFlagsRs, SockId};
use crate::error::RsError;
use crate::wait::Waiter;
use crate::wire::RsSge;
use dp_fabric::{Access, MemoryRegion, ProtectionDomain, Provider};

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
        let mut c = self.lock();
        let pd = c.pd.clone();
        let st = c.stream(id)?;
        if st.phase != Phase::Established {
            return Err(RsError::Invalid);
        }
        let mr = pd
            .reg_region(region, off, len, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .map_err(|_| RsError::Invalid)?;
        let addr = mr.addr();
        let offset = offset.unwrap_or(addr);
        let index = st.conn.iomap(
            offset,
            RsSge {
                addr,
                key: mr.rkey(),
                length: u32::try_from(len).map_err(|_| RsError::Invalid)?,
            },
        )?;
        st.maps.push(IoMapping {
            addr,
            len,
            index: Some(index),
            _mr: mr,
        });
        Ok(offset)
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
        let mut c = self.lock();
        let pd = c.pd.clone();
        let st = c.stream(id)?;
        if st.phase != Phase::Established {
            return Err(RsError::Invalid);
        }
        let length = u32::try_from(len).map_err(|_| RsError::Invalid)?;
        // SAFETY: the range stays mapped and writable while registered, and nothing holds
        // a Rust reference into it: this function's own contract.
        let mr = unsafe { pd.reg_raw(addr, len, Access::LOCAL_WRITE | Access::REMOTE_WRITE) }
            .map_err(|_| RsError::Invalid)?;
        let addr = mr.addr();
        let offset = offset.unwrap_or(addr);
        let index = st.conn.iomap(
            offset,
            RsSge {
                addr,
                key: mr.rkey(),
                length,
            },
        )?;
        st.maps.push(IoMapping {
            addr,
            len,
            index: Some(index),
            _mr: mr,
        });
        Ok(offset)
    }

    /// Withdraws a mapping made with [`iomap`](Self::iomap) (`riounmap`): `addr` and `len`
    /// must match it.
    ///
    /// # Errors
    /// `EINVAL` if no such mapping.
    pub fn iounmap(&self, id: SockId, addr: u64, len: usize) -> Result<(), RsError> {
        let mut c = self.lock();
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
                let mut c = self.lock();
                let st = c.stream(id)?;
                let r = if st.phase == Phase::Established {
                    let (conn, mut io) = st.io();
                    conn.iowrite(&data[done..], offset + done as u64, &mut io)
                } else {
                    Err(RsError::WouldBlock)
                };
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
