//! The drivers' views of the simulated fabric: what the client and server state machines
//! call to post work and to reach registered memory.

use dp_fabric::PostError;

use super::{CLIENT_DATA_AT, Net, SERVER_CHUNKS_AT, SKey, Side, mem_range};
use crate::clt::{ClientIo, DataRef, Mapped};
use crate::srv::{CmToken, ServerIo, SessId};
use crate::wire::SgDesc;
use crate::work::{Conn, Dir, OutOfBounds, PathId, QpSizes, RecvBuf, SrcRef, Wr};

/// The client's driver over the simulated fabric.
#[derive(Debug)]
pub struct ClientSide<'a>(pub &'a mut Net);

impl ClientIo for ClientSide<'_> {
    fn connect(&mut self, conn: Conn, _sizes: QpSizes, private_data: &[u8; 56]) -> Result<(), i32> {
        self.0.client_connect(conn, private_data);
        Ok(())
    }

    fn close_path(&mut self, path: PathId) {
        self.0.close_path(Side::Client, path);
    }

    fn post_send(&mut self, conn: Conn, chain: &[Wr<'_>]) -> Result<(), PostError> {
        self.0.post_send(Side::Client, conn, chain)
    }

    fn post_recv(&mut self, conn: Conn, wr_id: u64, buf: RecvBuf) -> Result<(), PostError> {
        self.0.post_recv(Side::Client, conn, wr_id, buf)
    }

    fn map_data(
        &mut self,
        conn: Conn,
        slot: u16,
        data: &DataRef,
        _dir: Dir,
    ) -> Result<Mapped, i32> {
        let net = &mut *self.0;
        let link = net.link_for(conn.path);
        let addr = CLIENT_DATA_AT
            .checked_add(data.offset)
            .ok_or(libc::EFAULT)?;
        if mem_range(CLIENT_DATA_AT, net.data.len(), addr, u64::from(data.len)).is_none()
            || data.region != 0
        {
            return Err(libc::EFAULT);
        }
        if net.per_io_registration {
            let rot = net.window_rot.entry((link, slot)).or_insert(0);
            *rot = rot.wrapping_add(1);
            let key =
                0x8000_0000 | ((link as u32) << 24) | (u32::from(slot) << 8) | u32::from(*rot);
            return Ok(Mapped {
                addr,
                lkey: key,
                rkey: key,
                register: Some((u64::from(slot) << 32) | u64::from(key)),
            });
        }
        let k = Net::static_key(link);
        Ok(Mapped {
            addr,
            lkey: k,
            rkey: k,
            register: None,
        })
    }

    fn write_iu(&mut self, slot: u16, off: u32, bytes: &[u8]) -> Result<(), OutOfBounds> {
        let net = &mut *self.0;
        let end = off as usize + bytes.len();
        if end > net.iu_slot {
            net.bounds_faults += 1;
            return Err(OutOfBounds);
        }
        let at = usize::from(slot) * net.iu_slot;
        let Some(b) = net.iu.get_mut(at + off as usize..at + end) else {
            net.bounds_faults += 1;
            return Err(OutOfBounds);
        };
        b.copy_from_slice(bytes);
        Ok(())
    }
}

/// The server's driver over the simulated fabric.
#[derive(Debug)]
pub struct ServerSide<'a>(pub &'a mut Net);

impl ServerIo for ServerSide<'_> {
    fn accept(
        &mut self,
        req: CmToken,
        conn: Conn,
        _sizes: QpSizes,
        private_data: &[u8; 56],
    ) -> Result<(), i32> {
        self.0.accept(req, conn, private_data)
    }

    fn reject(&mut self, req: CmToken, private_data: &[u8; 56]) {
        self.0.reject(req, private_data);
    }

    fn close_path(&mut self, path: PathId) {
        let net = &mut *self.0;
        net.close_path(Side::Server, path);
        net.skeys.retain(|_, k| k.path != path);
        net.chunk_keys.retain(|(p, _), _| *p != path);
        net.path_sess.remove(&path);
    }

    fn post_send(&mut self, conn: Conn, chain: &[Wr<'_>]) -> Result<(), PostError> {
        self.0.post_send(Side::Server, conn, chain)
    }

    fn source_fits(&self, src: SrcRef, len: u32) -> bool {
        self.0.sources.get(src.id as usize).is_some_and(|m| {
            src.offset
                .checked_add(u64::from(len))
                .is_some_and(|e| e <= m.len() as u64)
        })
    }

    fn post_recv(&mut self, conn: Conn, wr_id: u64, buf: RecvBuf) -> Result<(), PostError> {
        self.0.post_recv(Side::Server, conn, wr_id, buf)
    }

    fn create_session(
        &mut self,
        sess: SessId,
        queue_depth: u16,
        chunk_size: u32,
    ) -> Result<(), i32> {
        let net = &mut *self.0;
        net.chunk_size = chunk_size;
        net.chunks.insert(
            sess,
            vec![0; usize::from(queue_depth) * chunk_size as usize],
        );
        Ok(())
    }

    fn free_session(&mut self, sess: SessId) {
        self.0.chunks.remove(&sess);
    }

    fn map_chunks(
        &mut self,
        sess: SessId,
        path: PathId,
        per_chunk: bool,
        table: &mut Vec<SgDesc>,
    ) -> Result<(), i32> {
        let net = &mut *self.0;
        let mem = net.chunks.get(&sess).ok_or(-libc::ENOENT)?;
        let cs = u64::from(net.chunk_size);
        let qd = mem.len() as u64 / cs;
        let base = SERVER_CHUNKS_AT + (u64::from(sess.idx) << 36);
        let tag = (u32::from(path.idx) + 1) << 24 | u32::from(path.generation & 0xF) << 20;
        table.clear();
        let regions = if per_chunk {
            qd
        } else if qd.is_multiple_of(4) {
            4
        } else {
            1
        };
        let per = qd / regions;
        for r in 0..regions {
            let key = if per_chunk {
                tag | ((r as u32) << 8 & 0xF_FF00)
            } else {
                tag | ((r as u32) << 8)
            };
            let d = SgDesc {
                addr: base + r * per * cs,
                key,
                len: (per * cs) as u32,
            };
            net.skeys.insert(
                key,
                SKey {
                    path,
                    addr: d.addr,
                    len: u64::from(d.len),
                },
            );
            if per_chunk {
                net.chunk_keys.insert((path, d.addr), key);
            }
            table.push(d);
        }
        net.path_sess.insert(path, sess);
        Ok(())
    }

    fn read_chunk(
        &mut self,
        sess: SessId,
        chunk: u16,
        off: u32,
        out: &mut [u8],
    ) -> Result<(), OutOfBounds> {
        let net = &mut *self.0;
        let cs = net.chunk_size as usize;
        let end = off as usize + out.len();
        if end > cs {
            net.bounds_faults += 1;
            return Err(OutOfBounds);
        }
        let Some(c) = net.chunk(sess, chunk) else {
            net.bounds_faults += 1;
            return Err(OutOfBounds);
        };
        out.copy_from_slice(&c[off as usize..end]);
        Ok(())
    }
}
