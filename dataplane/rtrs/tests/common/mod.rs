//! Helpers shared by the RTRS test files.
#![allow(dead_code, reason = "each test file uses a subset")]

use std::time::Duration;

use dp_fabric::{WcOpcode, WcStatus};
use dp_rtrs::clt::{ClientConfig, ClientEvent, ClientSession};
use dp_rtrs::sim::{Call, Recorder, Sim, SimConfig};
use dp_rtrs::srv::ServerEvent;
use dp_rtrs::timer::Instant;
use dp_rtrs::wire::{ConnRspRepr, InfoRsp, MSG_NEW_RKEY_F, PROTO_VER, SgDesc};
use dp_rtrs::work::{CmEvent, Conn, PathId, RecvBuf, Wc};

/// Milliseconds as an instant.
pub fn ms(n: u64) -> Instant {
    Instant::from_millis(n)
}

/// A simulation that is open, with `f` applied to the configuration first.
pub fn open_sim(seed: u64, f: impl FnOnce(&mut SimConfig)) -> Sim {
    let mut cfg = SimConfig::new(seed);
    f(&mut cfg);
    let mut s = Sim::new(cfg);
    s.open();
    s
}

/// The client events logged so far matching `f`.
pub fn client_events(s: &Sim, f: impl Fn(&ClientEvent) -> bool) -> Vec<(Instant, ClientEvent)> {
    s.client_log
        .iter()
        .filter(|l| f(&l.ev))
        .map(|l| (l.at, l.ev))
        .collect()
}

/// The server events logged so far matching `f`.
pub fn server_events(s: &Sim, f: impl Fn(&ServerEvent) -> bool) -> Vec<(Instant, ServerEvent)> {
    s.server_log
        .iter()
        .filter(|l| f(&l.ev))
        .map(|l| (l.at, l.ev))
        .collect()
}

/// Runs the workload at `qd` for `d` and checks nothing failed. Long runs are paced (one
/// new IO per 100 us) so they stay cheap.
pub fn load(s: &mut Sim, qd: usize, d: Duration) {
    s.app.target = qd;
    if d > Duration::from_millis(50) {
        s.app.interval = Duration::from_micros(100);
    }
    s.run_for(d);
    assert_eq!(s.app.failed, 0, "errors: {:?}", s.app.errors);
    assert_eq!(s.app.verify_errors, 0);
    assert_eq!(s.app.spurious, 0, "an IO completed twice");
    assert_eq!(s.handler.bad_requests, 0);
}

/// An accept's private data.
pub fn accept(qd: u16, max_io: u32, max_hdr: u32, flags: u32) -> [u8; 56] {
    ConnRspRepr {
        version: PROTO_VER,
        errno: 0,
        queue_depth: qd,
        max_io_size: max_io,
        max_hdr_size: max_hdr,
        flags,
    }
    .to_bytes()
}

/// A client session played by hand: its recorder, and the server side's answers.
pub struct Scripted {
    pub client: ClientSession,
    pub io: Recorder,
    pub now: Instant,
    pub path: PathId,
    pub qd: u16,
    pub chunk: u32,
    pub new_rkey: bool,
}

impl Scripted {
    /// A session with one path and `io_conns` IO connections, opened up to the connect of
    /// cid 0.
    pub fn new(io_conns: u16) -> Self {
        let mut cfg = ClientConfig::new(b"scripted", [3; 16]).unwrap();
        cfg.io_connections = io_conns;
        cfg.reconnect_delay = Duration::from_secs(1);
        let mut client = ClientSession::new(cfg).unwrap();
        let mut io = Recorder::new();
        let path = client.open(Instant::ZERO, &[[9; 16]], &mut io).unwrap()[0];
        Self {
            client,
            io,
            now: Instant::ZERO,
            path,
            qd: 8,
            chunk: 8192,
            new_rkey: false,
        }
    }

    /// The connects recorded since the last call (other calls stay recorded).
    pub fn connects(&mut self) -> Vec<(Conn, [u8; 56])> {
        let mut out = Vec::new();
        self.io.calls.retain(|c| match c {
            Call::Connect(k, p) => {
                out.push((*k, *p));
                false
            }
            _ => true,
        });
        out
    }

    /// Accepts every connection in turn with `rsp`, up to the info exchange; returns the
    /// connection of cid 0.
    pub fn accept_all(&mut self, rsp: [u8; 56]) -> Conn {
        let mut c0 = None;
        loop {
            let cs = self.connects();
            let Some((conn, _)) = cs.last().copied() else {
                break;
            };
            if conn.cid == 0 {
                c0 = Some(conn);
            }
            self.client.handle_cm(
                self.now,
                conn,
                CmEvent::Established { private_data: &rsp },
                &mut self.io,
            );
        }
        c0.expect("cid 0 connected")
    }

    /// The info response of a well-behaved server: one descriptor per chunk.
    pub fn info_rsp(&self) -> Vec<u8> {
        let descs: Vec<SgDesc> = (0..self.qd)
            .map(|i| SgDesc {
                addr: 0x5000_0000 + u64::from(i) * u64::from(self.chunk),
                key: 0x100 + u32::from(i),
                len: self.chunk,
            })
            .collect();
        let mut b = vec![0u8; InfoRsp::<&[u8]>::len_for(descs.len())];
        InfoRsp::new_unchecked(&mut b[..]).emit(&descs);
        b
    }

    /// Delivers `payload` as the info response on `c0`.
    pub fn deliver_info(&mut self, c0: Conn, payload: &[u8]) {
        let (wr_id, buf) = self.io.pop_recv(c0).expect("info receive posted");
        assert!(matches!(buf, RecvBuf::InfoRsp(_)));
        let wc = Wc {
            wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: payload.len() as u32,
            imm: None,
            invalidated: None,
        };
        self.client
            .handle_completion(self.now, c0, &wc, payload, &mut self.io);
    }

    /// Connects fully (accepts, info) and drains the events; returns cid 0's connection.
    pub fn connect(&mut self) -> Conn {
        let flags = if self.new_rkey { MSG_NEW_RKEY_F } else { 0 };
        let c0 = self.accept_all(accept(self.qd, self.chunk - 4096, 4096, flags));
        let info = self.info_rsp();
        self.deliver_info(c0, &info);
        let evs: Vec<_> = std::iter::from_fn(|| self.client.poll_event()).collect();
        assert!(
            evs.iter().any(|e| matches!(e, ClientEvent::Opened { .. })),
            "{evs:?}"
        );
        c0
    }

    /// Completes the oldest receive on `conn` with an immediate (RDMA WRITE with immediate).
    pub fn imm(&mut self, conn: Conn, imm: u32) {
        let (wr_id, _) = self.io.pop_recv(conn).expect("a receive posted");
        let wc = Wc {
            wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::RecvRdmaWithImm,
            byte_len: 0,
            imm: Some(imm),
            invalidated: None,
        };
        self.client
            .handle_completion(self.now, conn, &wc, &[], &mut self.io);
    }

    /// Completes the oldest receive on `conn` as a SEND.
    pub fn send(&mut self, conn: Conn, imm: Option<u32>, invalidated: Option<u32>, payload: &[u8]) {
        let (wr_id, _) = self.io.pop_recv(conn).expect("a receive posted");
        let wc = Wc {
            wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: payload.len() as u32,
            imm,
            invalidated,
        };
        self.client
            .handle_completion(self.now, conn, &wc, payload, &mut self.io);
    }

    /// The events since the last call.
    pub fn events(&mut self) -> Vec<ClientEvent> {
        std::iter::from_fn(|| self.client.poll_event()).collect()
    }
}

/// A server played against by hand.
pub struct ScriptedServer {
    pub server: dp_rtrs::srv::Server,
    pub io: Recorder,
    pub now: Instant,
    next_token: u64,
}

impl ScriptedServer {
    /// A server of 8 chunks of 8 KiB.
    pub fn new(always_inv: bool) -> Self {
        Self::with_qd(always_inv, 8)
    }

    /// A server of `qd` chunks of 8 KiB.
    pub fn with_qd(always_inv: bool, qd: u16) -> Self {
        let cfg = dp_rtrs::srv::ServerConfig {
            queue_depth: qd,
            chunk_size: 8192,
            always_invalidate: always_inv,
            ..dp_rtrs::srv::ServerConfig::default()
        };
        Self {
            server: dp_rtrs::srv::Server::new(cfg).unwrap(),
            io: Recorder::new(),
            now: Instant::ZERO,
            next_token: 1,
        }
    }

    /// Sends a connect request; returns the accepted connection, or the reject errno.
    pub fn connect(&mut self, req: &dp_rtrs::wire::ConnReqRepr, addr: u128) -> Result<Conn, i16> {
        let t = self.next_token;
        self.next_token += 1;
        self.server
            .handle_connect_request(self.now, t, addr, &req.to_bytes(), &mut self.io);
        let answer = self.io.calls.iter().rev().find_map(|c| match c {
            Call::Accept(k, conn, _) if *k == t => Some(Ok(*conn)),
            Call::Reject(k, p) if *k == t => Some(Err(ConnRspRepr::parse(
                &dp_rtrs::wire::ConnRsp::new_checked(&p[..]).unwrap(),
            )
            .unwrap()
            .errno)),
            _ => None,
        });
        answer.expect("answered")
    }

    /// Connects every cid of a path and sends its info request named `name`; returns the
    /// connections.
    pub fn path(&mut self, sess: u8, path: u8, cid_num: u16, name: &[u8], addr: u128) -> Vec<Conn> {
        let conns: Vec<Conn> = (0..cid_num)
            .map(|cid| {
                let r = dp_rtrs::wire::ConnReqRepr {
                    version: PROTO_VER,
                    cid,
                    cid_num,
                    recon_cnt: 1,
                    path_uuid: [path; 16],
                    sess_uuid: [sess; 16],
                    first_conn: true,
                };
                self.connect(&r, addr).expect("accepted")
            })
            .collect();
        let mut b = [0u8; 272];
        b[2..2 + name.len()].copy_from_slice(name);
        self.send(conns[0], &b);
        conns
    }

    /// Completes the oldest receive on `conn` as a SEND of `payload`.
    pub fn send(&mut self, conn: Conn, payload: &[u8]) {
        let (wr_id, _) = self.io.pop_recv(conn).expect("a receive posted");
        let wc = Wc {
            wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: payload.len() as u32,
            imm: None,
            invalidated: None,
        };
        self.server
            .handle_completion(self.now, conn, &wc, payload, &mut self.io);
    }

    /// Completes the oldest receive on `conn` as an RDMA WRITE with immediate.
    pub fn imm(&mut self, conn: Conn, imm: u32) {
        let (wr_id, _) = self.io.pop_recv(conn).expect("a receive posted");
        let wc = Wc {
            wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::RecvRdmaWithImm,
            byte_len: 0,
            imm: Some(imm),
            invalidated: None,
        };
        self.server
            .handle_completion(self.now, conn, &wc, &[], &mut self.io);
    }

    /// Writes into chunk `chunk` of the session of `conn`'s path, as the client's RDMA
    /// WRITE would.
    pub fn write_chunk_of(&mut self, conn: Conn, chunk: u16, off: usize, bytes: &[u8]) {
        let sess = self.server.path_session(conn.path).expect("a live path");
        let cs = self.io.chunk_size as usize;
        let mem = self.io.chunks.get_mut(&sess).expect("its chunks");
        let at = usize::from(chunk) * cs + off;
        mem[at..at + bytes.len()].copy_from_slice(bytes);
    }

    /// Writes into chunk `chunk` of the only session, as the client's RDMA WRITE would.
    pub fn write_chunk(&mut self, chunk: u16, off: usize, bytes: &[u8]) {
        assert_eq!(
            self.io.chunks.len(),
            1,
            "one session: else use write_chunk_of"
        );
        let cs = self.io.chunk_size as usize;
        let mem = self.io.chunks.values_mut().next().expect("a session");
        let at = usize::from(chunk) * cs + off;
        mem[at..at + bytes.len()].copy_from_slice(bytes);
    }

    /// The server's events since the last call.
    pub fn events(&mut self) -> Vec<ServerEvent> {
        std::iter::from_fn(|| self.server.poll_event()).collect()
    }
}
