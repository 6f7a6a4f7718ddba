//! The RTRS server ([`Server`]) against hostile clients, through the simulator's recording
//! driver ([`Recorder`]): the fuzzer is every client. It sends connect requests (valid ones
//! with fuzzed fields, or raw private data), info requests, any immediate or SEND on any
//! accepted connection with any status, writes anything into the chunks, completes the
//! server's sends in any order, raises CM events, and answers (or mis-answers) the requests
//! the handler gets, while time moves.
//!
//! Checked on every input:
//!
//! * no panic, and no chunk read outside a chunk (the recorder counts them);
//! * every request the handler gets names a chunk of the session, a user message and data
//!   that fit in front of the header inside the chunk, and a READ length within the chunk;
//! * every request is answered at most once: a second answer, or an answer with a made-up
//!   id, is refused as stale, never posted.

use std::time::Duration;

use arbitrary::Arbitrary;
use dp_fabric::{WcOpcode, WcStatus};
use dp_rtrs::error::RtrsError;
use dp_rtrs::sim::{Call, Recorder};
use dp_rtrs::srv::{OpId, Resp, Server, ServerConfig, ServerEvent};
use dp_rtrs::timer::Instant;
use dp_rtrs::wire::{ConnReqRepr, PROTO_VER};
use dp_rtrs::work::{CmEvent, Conn, PathId, RecvBuf, Wc};

const QD: u16 = 8;
const CHUNK: u32 = 8192;

/// One fuzz input.
#[derive(Arbitrary, Debug)]
pub struct Input {
    always_invalidate: bool,
    ops: Vec<Op>,
}

/// One step of some client.
#[derive(Arbitrary, Debug)]
enum Op {
    /// A connect request with these fields (`raw`: this private data instead).
    Connect {
        sess: u8,
        path: u8,
        cid: u8,
        cid_num: u8,
        recon: u8,
        first: bool,
        addr: u8,
        raw: Option<Vec<u8>>,
    },
    /// An info request with this name on a connection.
    Info { conn: u8, name: Vec<u8> },
    /// A receive completes with an immediate (RDMA WRITE with immediate, or not).
    Imm {
        conn: u8,
        imm: u32,
        rdma: bool,
        status: u8,
    },
    /// A receive completes with a SEND of this payload.
    Send {
        conn: u8,
        payload: Vec<u8>,
        imm: Option<u32>,
    },
    /// A well-formed IO request: header `hdr` written at `off` of `chunk`, then its
    /// immediate.
    Io {
        conn: u8,
        chunk: u8,
        off: u16,
        hdr: Vec<u8>,
    },
    /// Bytes into a chunk of a session.
    Write { chunk: u8, off: u16, bytes: Vec<u8> },
    /// One of the server's posted sends completes.
    SendDone { pick: u16, status: u8 },
    /// A CM event on a connection.
    Cm { conn: u8, kind: u8 },
    /// The handler answers one of its requests.
    Resp { pick: u8, status: i8 },
    /// An answer to an operation that does not exist.
    Bogus {
        path: u8,
        chunk: u16,
        generation: u32,
        status: i8,
    },
    /// Time moves on (ms).
    Tick(u16),
    /// Sysfs `disconnect` of a path.
    Close(u8),
}

fn status(s: u8) -> WcStatus {
    if s < 200 {
        WcStatus::Success
    } else {
        WcStatus::from_raw(u32::from(s - 200))
    }
}

struct World {
    srv: Server,
    io: Recorder,
    now: Instant,
    conns: Vec<Conn>,
    ops: Vec<OpId>,
    answered: Vec<OpId>,
    next_token: u64,
    seen: usize,
}

impl World {
    fn conn(&self, k: u8) -> Option<Conn> {
        if self.conns.is_empty() {
            return None;
        }
        Some(self.conns[usize::from(k) % self.conns.len()])
    }

    fn recv(&mut self, conn: Conn, wc: Wc, payload: &[u8]) {
        let Some((wr_id, buf)) = self.io.pop_recv(conn) else {
            return;
        };
        let n = payload.len().min(buf.len() as usize);
        let wc = Wc { wr_id, ..wc };
        self.srv
            .handle_completion(self.now, conn, &wc, &payload[..n], &mut self.io);
    }

    fn drain(&mut self) {
        for c in &self.io.calls[self.seen..] {
            if let Call::Accept(_, conn, _) = c {
                self.conns.push(*conn);
            }
        }
        self.seen = self.io.calls.len();
        while let Some(ev) = self.srv.poll_event() {
            if let ServerEvent::Request {
                op,
                chunk,
                data_len,
                usr_len,
                read_len,
                ..
            } = ev
            {
                assert!(chunk < QD, "request names chunk {chunk}");
                assert_eq!(op.chunk, chunk);
                let off = u64::from(data_len) + u64::from(usr_len);
                assert!(off < u64::from(CHUNK), "header at {off}, outside the chunk");
                assert!(read_len <= CHUNK, "read of {read_len} bytes");
                self.ops.push(op);
            }
        }
        assert_eq!(self.io.bounds_faults, 0, "a chunk read outside a chunk");
    }
}

/// Runs one input.
pub fn run(input: &Input) {
    let cfg = ServerConfig {
        queue_depth: QD,
        chunk_size: CHUNK,
        always_invalidate: input.always_invalidate,
        hb_interval: Duration::from_millis(50),
        ..ServerConfig::default()
    };
    let mut w = World {
        srv: Server::new(cfg).expect("valid config"),
        io: Recorder::new(),
        now: Instant::ZERO,
        conns: Vec::new(),
        ops: Vec::new(),
        answered: Vec::new(),
        next_token: 1,
        seen: 0,
    };
    for op in input.ops.iter().take(64) {
        match op {
            Op::Connect {
                sess,
                path,
                cid,
                cid_num,
                recon,
                first,
                addr,
                raw,
            } => {
                let pdata = match raw {
                    Some(r) => r.clone(),
                    None => ConnReqRepr {
                        version: PROTO_VER,
                        cid: u16::from(*cid % 4),
                        cid_num: u16::from(*cid_num % 5),
                        recon_cnt: u16::from(*recon % 3),
                        path_uuid: [*path % 4; 16],
                        sess_uuid: [*sess % 3; 16],
                        first_conn: *first,
                    }
                    .to_bytes()
                    .to_vec(),
                };
                let t = w.next_token;
                w.next_token += 1;
                w.srv
                    .handle_connect_request(w.now, t, u128::from(*addr % 4), &pdata, &mut w.io);
            }
            Op::Info { conn, name } => {
                let Some(c) = w.conn(*conn) else { continue };
                let mut b = [0u8; 272];
                let n = name.len().min(270);
                b[2..2 + n].copy_from_slice(&name[..n]);
                let wc = Wc {
                    opcode: WcOpcode::Recv,
                    byte_len: 272,
                    ..Wc::default()
                };
                w.recv(c, wc, &b);
            }
            Op::Imm {
                conn,
                imm,
                rdma,
                status: st,
            } => {
                let Some(c) = w.conn(*conn) else { continue };
                let wc = Wc {
                    status: status(*st),
                    opcode: if *rdma {
                        WcOpcode::RecvRdmaWithImm
                    } else {
                        WcOpcode::Recv
                    },
                    imm: Some(*imm),
                    ..Wc::default()
                };
                w.recv(c, wc, &[]);
            }
            Op::Send { conn, payload, imm } => {
                let Some(c) = w.conn(*conn) else { continue };
                let wc = Wc {
                    opcode: WcOpcode::Recv,
                    byte_len: payload.len() as u32,
                    imm: *imm,
                    ..Wc::default()
                };
                w.recv(c, wc, payload);
            }
            Op::Io {
                conn,
                chunk,
                off,
                hdr,
            } => {
                let Some(c) = w.conn(*conn) else { continue };
                let Some(sess) = w.srv.path_session(c.path) else {
                    continue;
                };
                let (chunk, off) = (u16::from(*chunk % 8), u32::from(*off) % CHUNK);
                if let Some(mem) = w.io.chunks.get_mut(&sess) {
                    let at = usize::from(chunk) * CHUNK as usize + off as usize;
                    let n = hdr.len().min(CHUNK as usize - off as usize).min(64);
                    mem[at..at + n].copy_from_slice(&hdr[..n]);
                }
                let g = dp_rtrs::wire::Geometry::new(QD, CHUNK).expect("valid");
                let imm = dp_rtrs::wire::Imm::io_req(g.encode(chunk, off).expect("in range")).0;
                let wc = Wc {
                    opcode: WcOpcode::RecvRdmaWithImm,
                    imm: Some(imm),
                    ..Wc::default()
                };
                w.recv(c, wc, &[]);
            }
            Op::Write { chunk, off, bytes } => {
                let Some(mem) = w.io.chunks.values_mut().next() else {
                    continue;
                };
                let at =
                    (usize::from(*chunk % 8) * CHUNK as usize + usize::from(*off)).min(mem.len());
                let n = bytes.len().min(mem.len() - at);
                mem[at..at + n].copy_from_slice(&bytes[..n]);
            }
            Op::SendDone { pick, status: st } => {
                let sends: Vec<(Conn, u64)> =
                    w.io.calls
                        .iter()
                        .filter_map(|c| match c {
                            Call::Send(k, v) => {
                                Some(v.iter().map(|p| (*k, p.wr_id)).collect::<Vec<_>>())
                            }
                            _ => None,
                        })
                        .flatten()
                        .collect();
                if sends.is_empty() {
                    continue;
                }
                let (c, wr_id) = sends[usize::from(*pick) % sends.len()];
                let wc = Wc {
                    wr_id,
                    status: status(*st),
                    opcode: WcOpcode::Send,
                    ..Wc::default()
                };
                w.srv.handle_completion(w.now, c, &wc, &[], &mut w.io);
            }
            Op::Cm { conn, kind } => {
                let Some(c) = w.conn(*conn) else { continue };
                let ev = match kind % 4 {
                    0 => CmEvent::Established { private_data: &[] },
                    1 => CmEvent::Disconnected,
                    2 => CmEvent::Unreachable,
                    _ => CmEvent::DeviceRemoval,
                };
                w.srv.handle_cm(w.now, c, ev, &mut w.io);
            }
            Op::Resp { pick, status } => {
                if w.ops.is_empty() {
                    continue;
                }
                let op = w.ops[usize::from(*pick) % w.ops.len()];
                let r = w.srv.resp_rdma(w.now, op, i32::from(*status), &mut w.io);
                if w.answered.contains(&op) {
                    assert_eq!(r, Err(RtrsError::StaleOp), "an operation answered twice");
                } else if r.is_ok() {
                    w.answered.push(op);
                }
                if let Ok(Resp::Sent | Resp::Queued | Resp::Dropped) = r {
                    assert!(w.answered.contains(&op));
                }
            }
            Op::Bogus {
                path,
                chunk,
                generation,
                status,
            } => {
                let op = OpId {
                    path: PathId {
                        idx: u16::from(*path % 4),
                        generation: 0,
                    },
                    chunk: *chunk,
                    generation: *generation | 0x8000_0000,
                };
                let r = w.srv.resp_rdma(w.now, op, i32::from(*status), &mut w.io);
                assert_eq!(
                    r,
                    Err(RtrsError::StaleOp),
                    "a made-up operation was answered"
                );
            }
            Op::Tick(ms) => {
                w.now = w
                    .now
                    .saturating_add(Duration::from_millis(u64::from(*ms % 40_000)));
                w.srv.handle_timeout(w.now, &mut w.io);
            }
            Op::Close(p) => {
                let paths: Vec<PathId> = w.srv.paths().collect();
                if let Some(&id) = paths.get(usize::from(*p) % paths.len().max(1)) {
                    let _ = w.srv.close_path(w.now, id, &mut w.io);
                }
            }
        }
        w.drain();
        let _ = RecvBuf::Empty;
    }
}
