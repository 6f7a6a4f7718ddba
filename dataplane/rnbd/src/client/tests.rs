//! The client against the real server session (in process, no RTRS): every message goes
//! through `ServerSession::handle` over a memory backend, as RTRS would carry it.

use std::path::PathBuf;

use super::*;
use crate::backend::{Backend, BlkDone, MemBackend};
use crate::export::{Exports, SearchPath};
use crate::server::ServerSession;
use crate::wire::{CACHE_WRITEBACK, F_FUA, Msg, Op, SessInfoRsp};

const CHUNK: usize = 128 * 1024;

/// One request as the transport took it.
#[derive(Clone, Debug)]
struct Sent {
    tag: u64,
    con: Con,
    dir: Dir,
    usr: Vec<u8>,
    payload: Payload,
}

/// A transport that queues requests; `permits` bounds what it takes.
#[derive(Default)]
struct Queue {
    sent: Vec<Sent>,
    permits: usize,
    down: bool,
}

impl ClientTransport for Queue {
    fn submit(
        &mut self,
        tag: u64,
        con: Con,
        dir: Dir,
        usr: &[u8],
        payload: Payload,
    ) -> Result<(), SubmitError> {
        if self.down {
            return Err(SubmitError::NoPath);
        }
        if self.sent.len() >= self.permits {
            return Err(SubmitError::Busy);
        }
        self.sent.push(Sent {
            tag,
            con,
            dir,
            usr: usr.to_vec(),
            payload,
        });
        Ok(())
    }
}

/// Client, transport, server and the user's buffers (region = index).
struct Rig {
    c: ClientSession,
    q: Queue,
    s: ServerSession,
    e: Exports<MemBackend>,
    bufs: Vec<Vec<u8>>,
}

impl Rig {
    fn new() -> Self {
        let mut e = Exports::new(SearchPath::new("/mem").unwrap());
        e.add(
            "/mem/disk0",
            MemBackend::new("t-rnbd-clt", 1 << 20, 64).unwrap(),
        );
        e.add(
            "/mem/disk1",
            MemBackend::new("t-rnbd-clt1", 1 << 20, 64).unwrap(),
        );
        let mut r = Self {
            c: ClientSession::new(CHUNK as u32),
            q: Queue {
                permits: 64,
                ..Queue::default()
            },
            s: ServerSession::new("sess"),
            e,
            bufs: Vec::new(),
        };
        r.c.start(&mut r.q).unwrap();
        r.serve_all();
        assert_eq!(r.c.poll_event(), Some(ClientEvent::SessionReady { ver: 2 }));
        r
    }

    fn buf(&mut self, bytes: Vec<u8>) -> Buf {
        self.bufs.push(bytes);
        let i = self.bufs.len() - 1;
        Buf {
            region: i as u32,
            offset: 0,
            len: self.bufs[i].len() as u32,
        }
    }

    /// Serves the oldest queued request and completes it on the client.
    fn serve_one(&mut self) {
        let r = self.q.sent.remove(0);
        let mut chunk = vec![0u8; CHUNK];
        if let (Dir::Write, Payload::Data(b)) = (r.dir, r.payload) {
            let src = &self.bufs[b.region as usize][b.offset as usize..][..b.len as usize];
            chunk[..src.len()].copy_from_slice(src);
        }
        // SAFETY: the chunk lives, exclusively ours, until the backend completes below.
        let status = match unsafe {
            self.s
                .handle(&mut self.e, r.tag, r.dir, &r.usr, chunk.as_mut_ptr(), CHUNK)
        } {
            Some(e) => e,
            None => {
                let mut out = [BlkDone::default(); 1];
                let mut n = 0;
                for p in ["/mem/disk0", "/mem/disk1"] {
                    n += self
                        .e
                        .get_mut(&PathBuf::from(p))
                        .unwrap()
                        .backend
                        .poll(&mut out[n..]);
                    if n == 1 {
                        break;
                    }
                }
                assert_eq!(n, 1, "the backend did not complete the IO");
                self.s.complete(out[0].result)
            }
        };
        let answer: &[u8] = match r.payload {
            Payload::Answer(n) => &chunk[..n as usize],
            Payload::Data(b) => {
                if r.dir == Dir::Read && status == 0 {
                    let dst =
                        &mut self.bufs[b.region as usize][b.offset as usize..][..b.len as usize];
                    dst.copy_from_slice(&chunk[..b.len as usize]);
                }
                &[]
            }
            Payload::None => &[],
        };
        let answer = answer.to_vec();
        self.c.complete(r.tag, status, &answer, &mut self.q);
    }

    fn serve_all(&mut self) {
        while !self.q.sent.is_empty() {
            self.serve_one();
        }
    }

    fn events(&mut self) -> Vec<ClientEvent> {
        std::iter::from_fn(|| self.c.poll_event()).collect()
    }

    /// Maps through the real server, but tells the client the device has a write cache
    /// (the memory backend has none, so preflush would be skipped).
    fn map_with_write_cache(&mut self, name: &[u8]) -> DevId {
        let dev = self.c.map(name, AccessMode::Rw, &mut self.q).unwrap();
        let s = self.q.sent.remove(0);
        let mut chunk = vec![0u8; CHUNK];
        // SAFETY: the chunk is ours for the call; an open completes at once.
        let st = unsafe {
            self.s
                .handle(&mut self.e, s.tag, s.dir, &s.usr, chunk.as_mut_ptr(), CHUNK)
        };
        assert_eq!(st, Some(0));
        chunk[45] |= CACHE_WRITEBACK;
        self.c
            .complete(s.tag, 0, &chunk[..OpenRsp::LEN], &mut self.q);
        assert!(
            matches!(self.events()[..], [ClientEvent::Mapped { geometry, .. }] if geometry.write_cache)
        );
        dev
    }

    fn map(&mut self, name: &[u8], mode: AccessMode) -> (DevId, DevGeometry) {
        let dev = self.c.map(name, mode, &mut self.q).unwrap();
        self.serve_all();
        match self.events()[..] {
            [
                ClientEvent::Mapped {
                    dev: d,
                    geometry,
                    remapped: false,
                },
            ] if d == dev => (dev, geometry),
            ref other => panic!("{other:?}"),
        }
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn test_map_write_read_back() {
    let mut r = Rig::new();
    let (dev, g) = r.map(b"disk0", AccessMode::Rw);
    assert_eq!(g.nsectors, (1 << 20) / 512);
    assert_eq!(g.logical_block, 512);
    let data = pattern(8192, 7);
    let w = r.buf(data.clone());
    r.c.write(dev, 16, w, WriteFlags::default(), 1, &mut r.q)
        .unwrap();
    let rd = r.buf(vec![0; 8192]);
    r.c.read(dev, 16, rd, 2, &mut r.q).unwrap();
    assert_eq!(r.c.in_flight(dev), 2);
    r.serve_all();
    assert_eq!(
        r.events(),
        vec![
            ClientEvent::IoDone {
                dev,
                ctx: 1,
                result: Ok(())
            },
            ClientEvent::IoDone {
                dev,
                ctx: 2,
                result: Ok(())
            },
        ]
    );
    assert_eq!(r.bufs[rd.region as usize], data);
    assert_eq!(r.c.stats().ios_ok, 2);
}

#[test]
fn test_io_messages_travel_on_io_connection_and_admin_on_admin() {
    let mut r = Rig::new();
    let dev = r.c.map(b"disk0", AccessMode::Rw, &mut r.q).unwrap();
    assert_eq!((r.q.sent[0].con, r.q.sent[0].dir), (Con::Admin, Dir::Read));
    assert_eq!(r.q.sent[0].payload, Payload::Answer(OpenRsp::LEN as u32));
    r.serve_all();
    r.events();
    r.c.flush(dev, 9, &mut r.q).unwrap();
    assert_eq!(
        (r.q.sent[0].con, r.q.sent[0].dir, r.q.sent[0].payload),
        (Con::Io, Dir::Write, Payload::None)
    );
    let Ok(Msg::Io(m)) = Msg::parse(&r.q.sent[0].usr) else {
        panic!()
    };
    assert_eq!((m.rw.op(), m.bi_size), (Op::Flush, 0));
    r.serve_all();
    r.c.unmap(dev, &mut r.q).unwrap();
    assert_eq!((r.q.sent[0].con, r.q.sent[0].dir), (Con::Admin, Dir::Write));
    assert_eq!(
        Msg::parse(&r.q.sent[0].usr),
        Ok(Msg::Close(Close {
            device_id: m.device_id
        }))
    );
}

#[test]
fn test_second_rw_open_refused_eperm_ro_allowed() {
    let mut r = Rig::new();
    r.map(b"disk0", AccessMode::Rw);
    // A second session asks for the same device read-write.
    let mut other = Rig::new();
    std::mem::swap(&mut other.e, &mut r.e);
    let dev = other.c.map(b"disk0", AccessMode::Rw, &mut other.q).unwrap();
    other.serve_all();
    assert_eq!(
        other.events(),
        vec![ClientEvent::MapFailed {
            dev,
            errno: libc::EPERM
        }]
    );
    assert_eq!(other.c.state(dev), None, "a failed map leaves no device");
    let (ro, _) = other.map(b"disk0", AccessMode::Ro);
    let w = other.buf(vec![1; 512]);
    assert_eq!(
        other
            .c
            .write(ro, 0, w, WriteFlags::default(), 0, &mut other.q),
        Err(BlkError::ReadOnly)
    );
    assert_eq!(other.c.flush(ro, 0, &mut other.q), Err(BlkError::ReadOnly));
    assert_eq!(
        other.c.discard(ro, 0, 8, 0, &mut other.q),
        Err(BlkError::ReadOnly)
    );
    assert_eq!(
        other.c.write_zeroes(ro, 0, 8, 0, &mut other.q),
        Err(BlkError::ReadOnly)
    );
}

#[test]
fn test_map_unknown_and_dotdot_names_fail() {
    let mut r = Rig::new();
    let a = r.c.map(b"nope", AccessMode::Ro, &mut r.q).unwrap();
    let b = r.c.map(b"../mem/disk0", AccessMode::Ro, &mut r.q).unwrap();
    r.serve_all();
    let ev = r.events();
    assert!(
        matches!(ev[0], ClientEvent::MapFailed { dev, errno } if dev == a && errno == libc::ENOENT),
        "{ev:?}"
    );
    assert!(
        matches!(ev[1], ClientEvent::MapFailed { dev, errno } if dev == b && errno != 0),
        "{ev:?}"
    );
    assert_eq!(
        r.c.map(b"", AccessMode::Ro, &mut r.q),
        Err(BlkError::BadName)
    );
    assert_eq!(
        r.c.map(&[b'a'; 256], AccessMode::Ro, &mut r.q),
        Err(BlkError::BadName)
    );
    assert_eq!(
        r.c.map(b"a\0b", AccessMode::Ro, &mut r.q),
        Err(BlkError::BadName)
    );
}

#[test]
fn test_io_checks_alignment_range_and_size() {
    let mut r = Rig::new();
    let (dev, g) = r.map(b"disk0", AccessMode::Rw);
    let odd = r.buf(vec![0; 100]);
    assert_eq!(r.c.read(dev, 0, odd, 0, &mut r.q), Err(BlkError::Unaligned));
    let one = r.buf(vec![0; 512]);
    assert_eq!(
        r.c.read(dev, g.nsectors, one, 0, &mut r.q),
        Err(BlkError::OutOfRange)
    );
    assert_eq!(
        r.c.read(dev, u64::MAX, one, 0, &mut r.q),
        Err(BlkError::OutOfRange)
    );
    let big = r.buf(vec![0; g.max_io as usize + 512]);
    assert_eq!(r.c.read(dev, 0, big, 0, &mut r.q), Err(BlkError::TooLarge));
    assert!(r.q.sent.is_empty(), "nothing may be sent for a refused IO");
    assert_eq!(r.c.in_flight(dev), 0);
}

#[test]
fn test_busy_transport_returns_busy_and_sends_nothing() {
    let mut r = Rig::new();
    let (dev, _) = r.map(b"disk0", AccessMode::Rw);
    r.q.permits = 1;
    let b = r.buf(vec![0; 512]);
    r.c.read(dev, 0, b, 1, &mut r.q).unwrap();
    assert_eq!(r.c.read(dev, 0, b, 2, &mut r.q), Err(BlkError::Busy));
    assert_eq!(r.c.in_flight(dev), 1);
    r.serve_all();
    assert_eq!(r.events().len(), 1);
}

#[test]
fn test_link_down_disconnects_link_up_remaps() {
    let mut r = Rig::new();
    let (dev, _) = r.map(b"disk0", AccessMode::Rw);
    let (dev1, _) = r.map(b"disk1", AccessMode::Ro);
    r.c.link_down();
    assert_eq!(
        r.events(),
        vec![
            ClientEvent::Disconnected { dev },
            ClientEvent::Disconnected { dev: dev1 }
        ]
    );
    let b = r.buf(vec![0; 512]);
    assert_eq!(
        r.c.read(dev, 0, b, 0, &mut r.q),
        Err(BlkError::NotMapped(DevState::MappedDisconnected))
    );
    assert_eq!(r.c.state(dev).map(DevState::as_str), Some("closed"));
    r.c.link_up(&mut r.q);
    // Session info first, then one OPEN per device.
    let kinds: Vec<_> =
        r.q.sent
            .iter()
            .map(|s| Msg::parse(&s.usr).map(|m| std::mem::discriminant(&m)))
            .collect();
    assert_eq!(kinds.len(), 3);
    assert!(matches!(Msg::parse(&r.q.sent[0].usr), Ok(Msg::SessInfo(_))));
    r.serve_all();
    let ev = r.events();
    assert!(
        ev.iter()
            .any(|e| matches!(e, ClientEvent::Mapped { dev: d, remapped: true, .. } if *d == dev)),
        "{ev:?}"
    );
    assert!(
        ev.iter()
            .any(|e| matches!(e, ClientEvent::Mapped { dev: d, remapped: true, .. } if *d == dev1)),
        "{ev:?}"
    );
    assert_eq!(r.c.stats().remaps, 2);
    r.c.read(dev, 0, b, 0, &mut r.q).unwrap();
    r.serve_all();
    assert_eq!(
        r.events(),
        vec![ClientEvent::IoDone {
            dev,
            ctx: 0,
            result: Ok(())
        }]
    );
}

#[test]
fn test_remap_without_permits_waits_for_pump() {
    let mut r = Rig::new();
    let (dev, _) = r.map(b"disk0", AccessMode::Rw);
    r.c.link_down();
    r.events();
    r.q.permits = 0;
    r.c.link_up(&mut r.q);
    assert!(r.q.sent.is_empty());
    r.c.pump(&mut r.q);
    assert!(r.q.sent.is_empty(), "still no permit");
    r.q.permits = 64;
    r.c.pump(&mut r.q);
    assert_eq!(
        r.q.sent.len(),
        2,
        "session info and the open go once permits are back"
    );
    r.serve_all();
    assert!(
        matches!(r.events()[..], [ClientEvent::Mapped { dev: d, remapped: true, .. }] if d == dev)
    );
}

#[test]
fn test_preflush_write_sends_flush_then_write() {
    let mut r = Rig::new();
    let dev = r.map_with_write_cache(b"disk0");
    let w = r.buf(pattern(4096, 3));
    let flags = WriteFlags {
        preflush: true,
        fua: true,
        sync: false,
    };
    r.c.write(dev, 8, w, flags, 5, &mut r.q).unwrap();
    assert_eq!(r.q.sent.len(), 1);
    let Ok(Msg::Io(m)) = Msg::parse(&r.q.sent[0].usr) else {
        panic!()
    };
    assert_eq!(m.rw.op(), Op::Flush);
    r.serve_one();
    assert!(
        r.events().is_empty(),
        "the write is not done when its flush is"
    );
    let Ok(Msg::Io(m)) = Msg::parse(&r.q.sent[0].usr) else {
        panic!()
    };
    assert_eq!(
        (m.rw.op(), m.rw.flags() & F_FUA, m.sector),
        (Op::Write, F_FUA, 8)
    );
    assert_eq!(
        m.rw.flags() & crate::wire::F_PREFLUSH,
        0,
        "Linux 6.1 servers refuse PREFLUSH"
    );
    r.serve_all();
    assert_eq!(
        r.events(),
        vec![ClientEvent::IoDone {
            dev,
            ctx: 5,
            result: Ok(())
        }]
    );
    assert_eq!(r.c.in_flight(dev), 0);
}

#[test]
fn test_preflush_write_deferred_when_no_permit() {
    let mut r = Rig::new();
    let dev = r.map_with_write_cache(b"disk0");
    let w = r.buf(pattern(512, 1));
    let flags = WriteFlags {
        preflush: true,
        ..WriteFlags::default()
    };
    r.c.write(dev, 0, w, flags, 5, &mut r.q).unwrap();
    r.q.permits = 0;
    r.serve_one();
    assert!(r.q.sent.is_empty() && r.events().is_empty());
    assert_eq!(r.c.in_flight(dev), 1, "the deferred write still counts");
    r.q.permits = 1;
    r.c.pump(&mut r.q);
    r.serve_all();
    assert_eq!(
        r.events(),
        vec![ClientEvent::IoDone {
            dev,
            ctx: 5,
            result: Ok(())
        }]
    );
}

#[test]
fn test_preflush_skipped_without_write_cache() {
    let mut r = Rig::new();
    let (dev, g) = r.map(b"disk0", AccessMode::Rw);
    assert!(!g.write_cache);
    let w = r.buf(pattern(512, 1));
    let flags = WriteFlags {
        preflush: true,
        ..WriteFlags::default()
    };
    r.c.write(dev, 0, w, flags, 5, &mut r.q).unwrap();
    let Ok(Msg::Io(m)) = Msg::parse(&r.q.sent[0].usr) else {
        panic!()
    };
    assert_eq!(
        m.rw.op(),
        Op::Write,
        "no cache to flush: the write goes at once"
    );
}

#[test]
fn test_unmap_waits_for_in_flight_io() {
    let mut r = Rig::new();
    let (dev, _) = r.map(b"disk0", AccessMode::Rw);
    let b = r.buf(vec![0; 512]);
    r.c.read(dev, 0, b, 1, &mut r.q).unwrap();
    r.c.unmap(dev, &mut r.q).unwrap();
    assert_eq!(
        r.c.read(dev, 0, b, 2, &mut r.q),
        Err(BlkError::NotMapped(DevState::Unmapped))
    );
    r.serve_one();
    assert_eq!(
        r.events(),
        vec![ClientEvent::IoDone {
            dev,
            ctx: 1,
            result: Ok(())
        }]
    );
    r.serve_all();
    assert_eq!(r.events(), vec![ClientEvent::Unmapped { dev }]);
    assert_eq!(
        r.c.read(dev, 0, b, 3, &mut r.q),
        Err(BlkError::NoDevice),
        "stale handle"
    );
    // The server closed it: mapping read-write again works.
    let (again, _) = r.map(b"disk0", AccessMode::Rw);
    assert_ne!(again, dev, "a new handle, never the stale one");
}

#[test]
fn test_unmap_while_opening_closes_on_server() {
    let mut r = Rig::new();
    let dev = r.c.map(b"disk0", AccessMode::Rw, &mut r.q).unwrap();
    r.c.unmap(dev, &mut r.q).unwrap();
    r.serve_all();
    assert_eq!(r.events(), vec![ClientEvent::Unmapped { dev }]);
    assert!(
        r.s.devices().is_empty(),
        "the server's open was closed again"
    );
}

#[test]
fn test_server_errno_reaches_io_completion() {
    let mut r = Rig::new();
    let (dev, _) = r.map(b"disk0", AccessMode::Rw);
    let b = r.buf(vec![0; 512]);
    r.c.read(dev, 0, b, 4, &mut r.q).unwrap();
    // The server forgets the device (as after a server restart).
    r.s = ServerSession::new("sess");
    r.serve_all();
    assert_eq!(
        r.events(),
        vec![ClientEvent::IoDone {
            dev,
            ctx: 4,
            result: Err(libc::ENOTCONN)
        }]
    );
    assert_eq!(r.c.stats().ios_failed, 1);
}

#[test]
fn test_stale_and_repeated_tags_ignored() {
    let mut r = Rig::new();
    let (dev, _) = r.map(b"disk0", AccessMode::Rw);
    let b = r.buf(vec![0; 512]);
    r.c.read(dev, 0, b, 1, &mut r.q).unwrap();
    let tag = r.q.sent[0].tag;
    r.serve_all();
    r.events();
    r.c.complete(tag, 0, &[], &mut r.q);
    r.c.complete(tag ^ (1 << 40), 0, &[], &mut r.q);
    r.c.complete(u64::MAX, 0, &[], &mut r.q);
    assert!(r.events().is_empty());
    assert_eq!(r.c.stats().unknown_tags, 3);
}

/// Answers the oldest request with `answer` instead of the server's.
fn answer_with(r: &mut Rig, status: i32, answer: &[u8]) {
    let s = r.q.sent.remove(0);
    r.c.complete(s.tag, status, answer, &mut r.q);
}

fn open_rsp(f: impl FnOnce(&mut OpenRsp)) -> Vec<u8> {
    let mut rsp = OpenRsp {
        device_id: 3,
        nsectors: 2048,
        max_hw_sectors: 256,
        logical_block_size: 512,
        physical_block_size: 512,
        ..OpenRsp::default()
    };
    f(&mut rsp);
    let mut b = vec![0u8; OpenRsp::LEN];
    rsp.emit(&mut b);
    b
}

#[test]
fn test_hostile_open_rsp_fails_map_with_eproto() {
    let bad: Vec<Vec<u8>> = vec![
        open_rsp(|r| r.logical_block_size = 0),
        open_rsp(|r| r.logical_block_size = 3),
        open_rsp(|r| r.logical_block_size = 256),
        open_rsp(|r| r.nsectors = u64::MAX),
        open_rsp(|r| r.max_hw_sectors = 0)
            .into_iter()
            .take(20)
            .collect(),
        {
            let mut b = vec![0u8; SessInfoRsp::LEN];
            SessInfoRsp { ver: 2 }.emit(&mut b);
            b
        },
        vec![0xFF; OpenRsp::LEN],
    ];
    for (i, rsp) in bad.iter().enumerate() {
        let mut r = Rig::new();
        let dev = r.c.map(b"disk0", AccessMode::Rw, &mut r.q).unwrap();
        answer_with(&mut r, 0, rsp);
        assert_eq!(
            r.events(),
            vec![ClientEvent::MapFailed {
                dev,
                errno: libc::EPROTO
            }],
            "case {i}"
        );
        assert_eq!(r.c.stats().bad_responses, 1, "case {i}");
    }
    // The good one maps, with max_io capped by the server's max_hw_sectors.
    let mut r = Rig::new();
    let dev = r.c.map(b"disk0", AccessMode::Rw, &mut r.q).unwrap();
    answer_with(&mut r, 0, &open_rsp(|_| {}));
    let g = r.c.geometry(dev).unwrap();
    assert_eq!((g.nsectors, g.max_io), (2048, 256 * 512));
}

#[test]
fn test_hostile_sess_info_rsp_fails_session() {
    let mut c = ClientSession::new(4096);
    let mut q = Queue {
        permits: 8,
        ..Queue::default()
    };
    c.start(&mut q).unwrap();
    let tag = q.sent[0].tag;
    c.complete(tag, 0, &[1, 0, 0, 0], &mut q);
    assert_eq!(
        c.poll_event(),
        Some(ClientEvent::SessionFailed {
            errno: libc::EPROTO
        })
    );
    assert_eq!(
        c.map(b"disk0", AccessMode::Ro, &mut q),
        Err(BlkError::NotReady)
    );
}

#[test]
fn test_sess_info_version_is_min_of_both() {
    let mut c = ClientSession::new(4096);
    let mut q = Queue {
        permits: 8,
        ..Queue::default()
    };
    c.start(&mut q).unwrap();
    let mut b = [0u8; SessInfoRsp::LEN];
    SessInfoRsp { ver: 9 }.emit(&mut b);
    c.complete(q.sent[0].tag, 0, &b, &mut q);
    assert_eq!(c.poll_event(), Some(ClientEvent::SessionReady { ver: 2 }));
}

#[test]
fn test_discard_unsupported_when_server_says_so() {
    let mut r = Rig::new();
    let dev = r.c.map(b"disk0", AccessMode::Rw, &mut r.q).unwrap();
    answer_with(&mut r, 0, &open_rsp(|rsp| rsp.max_discard_sectors = 0));
    r.events();
    assert_eq!(
        r.c.discard(dev, 0, 8, 0, &mut r.q),
        Err(BlkError::Unsupported)
    );
    assert_eq!(
        r.c.write_zeroes(dev, 0, 8, 0, &mut r.q),
        Err(BlkError::Unsupported)
    );
}

#[test]
fn test_discard_reads_back_zeroes() {
    let mut r = Rig::new();
    let (dev, g) = r.map(b"disk0", AccessMode::Rw);
    assert!(g.max_discard_sectors >= 8);
    let w = r.buf(vec![0xAB; 4096]);
    r.c.write(dev, 0, w, WriteFlags::default(), 1, &mut r.q)
        .unwrap();
    r.c.discard(dev, 0, 8, 2, &mut r.q).unwrap();
    let rd = r.buf(vec![1; 4096]);
    r.c.read(dev, 0, rd, 3, &mut r.q).unwrap();
    r.serve_all();
    assert_eq!(r.events().len(), 3);
    assert!(r.bufs[rd.region as usize].iter().all(|&b| b == 0));
}
