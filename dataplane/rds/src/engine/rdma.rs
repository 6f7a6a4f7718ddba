//! RDMA memory registration on sockets (`rds_get_mr`, `rds_get_mr_for_dest`,
//! `rds_free_mr`, `rds_rdma_drop_keys`), with Linux's checks in Linux's order. The memory
//! rule and the cookie format are in `mr.rs`.

use super::config::TransportKind;
use super::core::RdsEngine;
use super::mr::{MrTable, RdmaMemory, cookie_key, cookie_offset, pages_in_vec};
use super::socket::{RdsSocket, SendCmsg};
use crate::error::RdsError;
use crate::store::RdmaOp;
use crate::uapi::{
    FREE_MR_ARGS_LEN, GET_MR_ARGS_LEN, GET_MR_FOR_DEST_ARGS_LEN, RDS_GET_MR, RDS_GET_MR_FOR_DEST,
    RDS_RDMA_FENCE, RDS_RDMA_NOTIFY_ME, RDS_RDMA_READWRITE, UIO_MAXIOV,
};

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_ne_bytes(w)
}

/// `struct rds_get_mr_args` (or the tail of `rds_get_mr_for_dest_args`), parsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GetMrArgs {
    /// `vec.addr`: the first byte (a process virtual address).
    pub addr: u64,
    /// `vec.bytes`.
    pub bytes: u64,
    /// Where Linux writes the cookie (0: nowhere).
    pub cookie_addr: u64,
    /// `RDS_RDMA_*` flags.
    pub flags: u64,
}

impl GetMrArgs {
    /// Parses the option bytes of `RDS_GET_MR` (exactly 32 bytes) or
    /// `RDS_GET_MR_FOR_DEST` (exactly 160: the destination, ignored as in Linux, then the
    /// same fields).
    ///
    /// # Errors
    ///
    /// `EINVAL` for any other length.
    pub fn parse(name: i32, val: &[u8]) -> Result<Self, RdsError> {
        let at = match name {
            RDS_GET_MR if val.len() == GET_MR_ARGS_LEN => 0,
            RDS_GET_MR_FOR_DEST if val.len() == GET_MR_FOR_DEST_ARGS_LEN => 128,
            RDS_GET_MR => {
                return Err(RdsError::InvalidArgument(
                    "RDS_GET_MR takes exactly a struct rds_get_mr_args (32 bytes)",
                ));
            }
            _ => {
                return Err(RdsError::InvalidArgument(
                    "RDS_GET_MR_FOR_DEST takes exactly a struct rds_get_mr_for_dest_args (160 bytes)",
                ));
            }
        };
        Ok(Self {
            addr: u64_at(val, at),
            bytes: u64_at(val, at + 8),
            cookie_addr: u64_at(val, at + 16),
            flags: u64_at(val, at + 24),
        })
    }

    /// The 32 option bytes of `RDS_GET_MR`.
    pub fn to_bytes(&self) -> [u8; GET_MR_ARGS_LEN] {
        let mut b = [0u8; GET_MR_ARGS_LEN];
        for (i, v) in [self.addr, self.bytes, self.cookie_addr, self.flags]
            .into_iter()
            .enumerate()
        {
            b[i * 8..i * 8 + 8].copy_from_slice(&v.to_ne_bytes());
        }
        b
    }
}

impl RdsEngine {
    /// Plugs in the memory a transport of `kind` lets sockets register for peers' RDMA
    /// (the fabric transport's RDMA window). Until then `RDS_GET_MR` fails with
    /// `EOPNOTSUPP`, as on a transport without memory registration. Regions registered
    /// through an earlier backend are freed first. Control path.
    ///
    /// # Errors
    ///
    /// `EOPNOTSUPP` for a kind other than [`TransportKind::Ib`] (RDS-TCP has no RDMA, as in
    /// Linux) or one the engine does not list.
    pub fn set_rdma_memory(
        &mut self,
        kind: TransportKind,
        backend: Box<dyn RdmaMemory>,
    ) -> Result<(), RdsError> {
        if kind != TransportKind::Ib || self.spec(kind).is_none() {
            return Err(RdsError::NotSupported(
                "only the engine's Ib (fabric) transport registers memory for RDMA",
            ));
        }
        if let Some(mut old) = self.mr.take() {
            for i in 0..self.socks.slots.len() {
                let g = self.socks.slots[i].generation;
                old.free_socket(i as u32, g);
            }
        }
        self.mr = Some(MrTable::new(backend));
        for t in &mut self.cfg.transports {
            if t.kind == kind {
                t.rdma = true;
            }
        }
        Ok(())
    }

    /// Live memory regions of all sockets.
    pub fn mr_count(&self) -> usize {
        self.mr.as_ref().map_or(0, MrTable::len)
    }

    /// The table if `sock` may register memory (`__rds_rdma_map`'s first checks).
    fn mr_table_for(&mut self, sock: RdsSocket) -> Result<&mut MrTable, RdsError> {
        let s = self.socks.get(sock).ok_or(RdsError::BadSocket)?;
        let Some(t) = s.transport.filter(|_| s.bound.is_some()) else {
            return Err(RdsError::NotConnected(
                "bind the socket (select its transport) before registering memory",
            ));
        };
        if t != TransportKind::Ib {
            return Err(RdsError::NotSupported(
                "memory registration needs the fabric (Ib) transport; RDS-TCP has no RDMA",
            ));
        }
        self.mr.as_mut().ok_or(RdsError::NotSupported(
            "the fabric transport has no RDMA window: expose one (FabricTransport::expose_window)",
        ))
    }

    /// The checks `get_mr` makes before registering (for the raw option's `EFAULT` path).
    pub(crate) fn mr_precheck(&mut self, sock: RdsSocket) -> Result<(), RdsError> {
        self.mr_table_for(sock).map(|_| ())
    }

    /// `RDS_GET_MR`: registers `[addr, addr + bytes)` for the socket's peers and returns
    /// the cookie. `flags`: `RDS_RDMA_READWRITE` lets peers write it (else they may only
    /// read it), `RDS_RDMA_USE_ONCE` frees it when a peer's RDMA operation on it arrives
    /// (`RDS_RDMA_INVALIDATE` is implied: freeing always revokes the key here).
    ///
    /// | condition | error |
    /// |---|---|
    /// | socket unbound | `ENOTCONN` |
    /// | transport without memory registration (RDS-TCP, no window) | `EOPNOTSUPP` |
    /// | range empty, wrapping, or longer than 4 GiB | `EINVAL` |
    /// | range over more than 1 MiB of pages (+1 for an unaligned start) | `EMSGSIZE` |
    /// | memory outside the transport's RDMA window | `EFAULT` |
    ///
    /// # Errors
    ///
    /// As in the table; [`RdsError::BadSocket`] for a handle that is not open.
    pub fn get_mr(
        &mut self,
        sock: RdsSocket,
        addr: u64,
        bytes: u64,
        flags: u64,
    ) -> Result<u64, RdsError> {
        let t = self.mr_table_for(sock)?;
        t.get(sock.idx, sock.generation, addr, bytes, flags)
    }

    /// `RDS_GET_MR` / `RDS_GET_MR_FOR_DEST` with C's option bytes: returns the cookie and
    /// the `cookie_addr` the caller (a C shim) must store it at; the engine writes no
    /// memory through a caller's pointer.
    ///
    /// # Errors
    ///
    /// `EINVAL` for a wrong option length, then as [`get_mr`](Self::get_mr).
    pub fn get_mr_raw(
        &mut self,
        sock: RdsSocket,
        name: i32,
        val: &[u8],
    ) -> Result<(u64, u64), RdsError> {
        let a = GetMrArgs::parse(name, val)?;
        let cookie = self.get_mr(sock, a.addr, a.bytes, a.flags)?;
        Ok((cookie, a.cookie_addr))
    }

    /// `RDS_FREE_MR`: frees the socket's region named by `cookie`. Cookie 0 flushes the
    /// transport's unused regions (`flush_mrs`): deregistration is immediate here, so there
    /// is nothing to flush. `flags` (`RDS_RDMA_INVALIDATE`) changes nothing: the key is
    /// always revoked at once.
    ///
    /// # Errors
    ///
    /// `EINVAL` if the socket has no region with the cookie's key (or, for cookie 0, no
    /// transport with memory registration); [`RdsError::BadSocket`].
    pub fn free_mr(&mut self, sock: RdsSocket, cookie: u64, flags: u64) -> Result<(), RdsError> {
        let _ = flags;
        let s = self.socks.get(sock).ok_or(RdsError::BadSocket)?;
        if cookie == 0 {
            return match (s.transport, &self.mr) {
                (Some(TransportKind::Ib), Some(_)) => Ok(()),
                _ => Err(RdsError::InvalidArgument(
                    "cookie 0 flushes a transport's unused regions: the socket has no transport with memory registration",
                )),
            };
        }
        let freed = self
            .mr
            .as_mut()
            .is_some_and(|t| t.free(sock.idx, sock.generation, cookie_key(cookie)));
        if freed {
            Ok(())
        } else {
            Err(RdsError::InvalidArgument(
                "the socket has no memory region with this cookie's key",
            ))
        }
    }

    /// `RDS_FREE_MR` with C's option bytes (exactly a `struct rds_free_mr_args`).
    ///
    /// # Errors
    ///
    /// `EINVAL` for another length, then as [`free_mr`](Self::free_mr).
    pub fn free_mr_raw(&mut self, sock: RdsSocket, val: &[u8]) -> Result<(), RdsError> {
        if val.len() != FREE_MR_ARGS_LEN {
            return Err(RdsError::InvalidArgument(
                "RDS_FREE_MR takes exactly a struct rds_free_mr_args (16 bytes)",
            ));
        }
        self.free_mr(sock, u64_at(val, 0), u64_at(val, 8))
    }

    /// A peer's RDMA extension header named `rkey` on a message for socket slot `sidx`
    /// (`rds_rdma_unuse`): frees the region if the socket owns it and it is use-once.
    pub(crate) fn rdma_unuse(&mut self, sidx: u32, rkey: u32) {
        let generation = self.socks.slots[sidx as usize].generation;
        let Some(t) = self.mr.as_mut() else {
            return;
        };
        match t.lookup(sidx, generation, rkey) {
            Some(e) if e.use_once => {
                t.free(sidx, generation, rkey);
                self.stats.rdma_use_once_freed += 1;
            }
            Some(_) => {}
            None => self.stats.rdma_unuse_unknown_key += 1,
        }
    }

    /// The RDMA operation of a message's control messages (`rds_cmsg_rdma_args`), checked
    /// in Linux's order; `None` if there is none. The caller checked that the socket's
    /// transport has RDMA and that the groups do not mix.
    pub(crate) fn rdma_from_cmsgs(
        &self,
        cmsgs: &[SendCmsg],
        recverr: bool,
    ) -> Result<Option<RdmaOp>, RdsError> {
        let mut op: Option<RdmaOp> = None;
        for c in cmsgs {
            match *c {
                SendCmsg::RdmaArgs {
                    cookie,
                    remote_addr,
                    remote_bytes,
                    nr_local,
                    local_addr,
                    local_bytes,
                    flags,
                    user_token,
                } => {
                    if op.is_some() {
                        return Err(RdsError::InvalidArgument(
                            "one RDS_CMSG_RDMA_ARGS per message",
                        ));
                    }
                    if nr_local > UIO_MAXIOV {
                        return Err(RdsError::MessageTooLong {
                            len: nr_local as usize,
                            limit: UIO_MAXIOV as usize,
                            what: "nr_local: at most UIO_MAXIOV local ranges",
                        });
                    }
                    if nr_local != 1 {
                        return Err(RdsError::InvalidArgument(
                            "nr_local must be 1: this engine takes one local range, in the RDMA window",
                        ));
                    }
                    if pages_in_vec(local_addr, local_bytes) == 0 {
                        return Err(RdsError::InvalidArgument(
                            "the local range is empty, wraps, or is longer than 4 GiB",
                        ));
                    }
                    let local = self
                        .mr
                        .as_ref()
                        .and_then(|t| t.window_offset(local_addr, local_bytes))
                        .ok_or(RdsError::Fault(
                            "the local range is not inside the node's RDMA window (FabricTransport::expose_window)",
                        ))?;
                    if local_bytes > remote_bytes {
                        return Err(RdsError::InvalidArgument(
                            "the local range is longer than remote_vec.bytes",
                        ));
                    }
                    op = Some(RdmaOp {
                        rkey: cookie_key(cookie),
                        remote: remote_addr.wrapping_add(u64::from(cookie_offset(cookie))),
                        local,
                        len: local_bytes as u32,
                        write: flags & RDS_RDMA_READWRITE != 0,
                        fence: flags & RDS_RDMA_FENCE != 0,
                        notify: flags & RDS_RDMA_NOTIFY_ME != 0,
                        recverr,
                        user_token,
                        failed: None,
                        done: false,
                    });
                }
                SendCmsg::Atomic(_) => {
                    return Err(RdsError::NotSupported(
                        "RDMA atomics: the dp-fabric providers have no atomic operations",
                    ));
                }
                _ => {}
            }
        }
        Ok(op)
    }

    /// The cookie a message offers its receiver (`RDS_CMSG_RDMA_DEST`: one of the socket's
    /// regions, `rds_cmsg_rdma_dest`; `RDS_CMSG_RDMA_MAP`: a region registered now, as
    /// `RDS_GET_MR` would, `rds_cmsg_rdma_map`), carried in `RDS_EXTHDR_RDMA_DEST`.
    /// `None` if the message offers none. A region mapped here stays the socket's (free it
    /// with `RDS_FREE_MR`, as in Linux) even if the send then fails.
    pub(crate) fn rdma_dest_from_cmsgs(
        &mut self,
        sock: RdsSocket,
        cmsgs: &[SendCmsg],
    ) -> Result<Option<u64>, RdsError> {
        let mut cookie: Option<u64> = None;
        for c in cmsgs {
            let got = match *c {
                SendCmsg::RdmaDest(c) => {
                    let t = self.mr_table_for(sock)?;
                    if cookie.is_none()
                        && t.lookup(sock.idx, sock.generation, cookie_key(c)).is_none()
                    {
                        return Err(RdsError::InvalidArgument(
                            "RDS_CMSG_RDMA_DEST names no memory region of this socket",
                        ));
                    }
                    c
                }
                SendCmsg::RdmaMap { addr, bytes, flags } => {
                    if cookie.is_some() {
                        0
                    } else {
                        self.get_mr(sock, addr, bytes, flags)?
                    }
                }
                _ => continue,
            };
            if cookie.is_some() {
                return Err(RdsError::InvalidArgument(
                    "one RDS_CMSG_RDMA_DEST or RDS_CMSG_RDMA_MAP per message",
                ));
            }
            cookie = Some(got);
        }
        Ok(cookie)
    }

    /// Frees the regions of a closing socket (`rds_rdma_drop_keys`).
    pub(crate) fn drop_mrs(&mut self, sock: RdsSocket) {
        if let Some(t) = self.mr.as_mut() {
            t.free_socket(sock.idx, sock.generation);
        }
    }
}
