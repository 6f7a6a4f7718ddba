//! The rsocket stream state machine ([`StreamConn`](dp_rsocket::StreamConn)) against a
//! hostile peer, over the simulator.
//!
//! Side `a` of a [`SimPair`] is the honest endpoint under test. Side `b`'s state machine
//! never runs: its application is the fuzzer, which may lie in its connection data, write
//! anything its keys allow into `a`'s memory, claim anything in its immediates, complete
//! `a`'s receives with any length and status (more than a real peer can), fail `a`'s sends,
//! withhold receives and move the clock. `a`'s application sends, receives, shuts down,
//! publishes and writes iomaps. After every operation the invariants are checked:
//!
//! * no panic, and no access outside `a`'s buffers (the simulator bounds-checks every one);
//! * `a` never has more bytes queued for reading than its receive buffer holds (checked at
//!   the end of the input, so that an `AppRecv` may first show what reading them does);
//! * `a` never posts a data message beyond the credits `b` granted it, never grants `b`
//!   more than `rq_size` messages beyond those it received, and every receive-buffer half
//!   it grants lies inside its receive buffer;
//! * once failed, `a` stays failed and posts nothing more.

use std::time::Duration;

use arbitrary::Arbitrary;
use dp_fabric::{RemoteAddr, WcStatus};
use dp_rsocket::conn::{RsIo, Shutdown, StreamConfig, WR_RECV};
use dp_rsocket::sim::{PostedWr, SimPair};
use dp_rsocket::wire::{HOST_BIG_ENDIAN, RsIomap, RsMsg, RsOp, RsSge, scale_round};

/// One fuzz input: `a`'s configuration, `b`'s connection data, then the operations.
#[derive(Arbitrary, Debug)]
pub struct Input {
    cfg: Cfg,
    peer: PeerData,
    ops: Vec<Op>,
}

/// Sizes, within what `SockOpts::stream_config` produces (small, so rings wrap often).
#[derive(Arbitrary, Debug)]
struct Cfg {
    sq: u8,
    rq: u8,
    sbuf: u16,
    rbuf: u16,
    inline: u8,
    iomap: u8,
}

impl Cfg {
    fn get(&self) -> StreamConfig {
        StreamConfig {
            sq_size: 16 + u32::from(self.sq % 49),
            rq_size: 16 + u32::from(self.rq % 49),
            sbuf_size: 4096 + u32::from(self.sbuf) % 61441,
            rbuf_size: (u32::from(self.rbuf).max(2) + 1) & !1,
            sq_inline: u32::from(self.inline),
            target_iomap_size: scale_round(u32::from(self.iomap % 65)),
        }
    }
}

/// What `b` announces at connection time, if it lies.
#[derive(Arbitrary, Debug)]
struct PeerData {
    credits: Option<u16>,
    big_endian: Option<bool>,
    iomap_size: Option<Option<u8>>,
    target_sgl: Option<(u64, u32, u32)>,
    data_buf: Option<(u64, u32, u32)>,
}

/// One step of the application of `a`, of the hostile `b`, or of the fabric.
#[derive(Arbitrary, Debug)]
enum Op {
    /// `a` sends this many bytes.
    AppSend(u16),
    /// `a` receives into a buffer of this size.
    AppRecv { len: u16, peek: bool },
    /// `a` shuts down (read, write, both).
    AppShutdown(u8),
    /// `a` publishes `[off, off + len)` of its iomap memory.
    AppIomap { off: u16, len: u16 },
    /// `a` withdraws an iomap slot.
    AppIounmap(u8),
    /// `a` writes into `b`'s mapping at this offset.
    AppIowrite { offset: u32, len: u16 },
    /// `a` sets its keepalive period (microseconds) or disables it.
    AppKeepalive(Option<u16>),
    /// `a`'s progress pass: polls its completions, re-posts receives, returns credits.
    Progress,
    /// The fabric executes `a`'s posted requests (into `b`'s memory, checked).
    Deliver,
    /// Virtual time moves on (ns); `a`'s timers fire if due.
    Tick(u32),
    /// `b` writes `len` bytes at `off` of `a`'s receive buffer with a Data immediate that
    /// claims `claim` bytes (29 bits: a real peer can claim anything).
    PeerData { off: u32, len: u16, claim: u32 },
    /// `b` grants credits up to this limit.
    PeerCredit(u16),
    /// `b` sends a control message.
    PeerCtrl(u8),
    /// `a`'s next receive completes with exactly these fields.
    PeerCompletion {
        imm: Option<u32>,
        byte_len: u32,
        status: u8,
    },
    /// `b` writes a target SGE (entry 0 or 1) in either byte order.
    PeerWritesTarget {
        entry: bool,
        sge: (u64, u32, u32),
        swap: bool,
    },
    /// `b` writes an iomap entry of `a`'s table.
    PeerWritesIomap {
        entry: u8,
        offset: u64,
        sge: (u64, u32, u32),
        swap: bool,
    },
    /// `b` writes raw bytes at an offset of `a`'s target list or receive buffer, with any
    /// key (`key` 0: target list, 1: receive buffer, other: that raw rkey).
    PeerWrite {
        key: u32,
        off: u32,
        len: u8,
        byte: u8,
    },
    /// `b` posts more receives (else `a`'s writes with immediate wait).
    PeerPostsRecvs(u8),
    /// `a`'s next executed send completes with this error status.
    FailNextSend(u8),
    /// `a` learns its peer went away (CM event).
    PeerGone,
}

fn sge((addr, key, length): (u64, u32, u32)) -> RsSge {
    RsSge { addr, key, length }
}

fn status(s: u8) -> WcStatus {
    if s < 128 {
        WcStatus::Success
    } else {
        WcStatus::from_raw(u32::from(s - 128))
    }
}

/// What `a` may do, tracked from outside.
struct Monitor {
    cfg: StreamConfig,
    rbuf: (u64, u64),
    peer_be: bool,
    /// The credit limit `a` honours now, and the one queued in its completions.
    granted: u16,
    pending_grant: Option<u16>,
    data_sent: u16,
    failed: bool,
}

impl Monitor {
    fn check_posts(&mut self, posted: Vec<PostedWr>, received: u64) {
        if self.failed {
            assert!(posted.is_empty(), "posted {posted:?} after failing");
        }
        for w in posted {
            let Some(imm) = w.imm else { continue };
            let m = RsMsg(imm);
            match m.op() {
                RsOp::Data => {
                    assert_ne!(
                        self.data_sent, self.granted,
                        "data message beyond the credit limit {} granted",
                        self.granted
                    );
                    self.data_sent = self.data_sent.wrapping_add(1);
                }
                RsOp::Sgl => {
                    let ahead = (m.data() as u16).wrapping_sub(received as u16) as i16;
                    assert!(
                        i64::from(ahead) <= i64::from(self.cfg.rq_size),
                        "granted {ahead} messages beyond those received (rq_size {})",
                        self.cfg.rq_size
                    );
                    if let Some(s) = RsSge::read(&w.data, self.peer_be) {
                        assert!(
                            s.addr >= self.rbuf.0
                                && s.addr
                                    .checked_add(u64::from(s.length))
                                    .is_some_and(|e| e <= self.rbuf.1)
                                && s.length == self.cfg.rbuf_size / 2,
                            "granted {s:?} outside the receive buffer {:x?}",
                            self.rbuf
                        );
                    }
                }
                _ => {}
            }
        }
    }
}

/// What the application and the peer send.
static SCRATCH: [u8; 1 << 16] = [0x5A; 1 << 16];

/// Runs one input.
pub fn run(input: &Input) {
    let cfg = input.cfg.get();
    let pd = &input.peer;
    let (mut p, established) = SimPair::connect_edited(cfg, cfg, Duration::ZERO, |d| {
        if let Some(c) = pd.credits {
            d.credits = c;
        }
        if let Some(be) = pd.big_endian {
            d.big_endian = be;
        }
        match pd.iomap_size {
            Some(Some(n)) => {
                d.iomap = true;
                d.iomap_size = scale_round(u32::from(n));
            }
            Some(None) => {
                d.iomap = false;
                d.iomap_size = 0;
            }
            None => {}
        }
        if let Some(s) = pd.target_sgl {
            d.target_sgl = sge(s);
        }
        if let Some(s) = pd.data_buf {
            d.data_buf = sge(s);
        }
    });
    let granted = match established {
        Ok(()) => pd.credits.unwrap_or(cfg.rq_size.min(0xFFFF) as u16),
        Err(_) => 0,
    };
    let keys = p.a.st.keys();
    let mut mon = Monitor {
        cfg,
        rbuf: (keys.rbuf_addr, keys.rbuf_addr + u64::from(cfg.rbuf_size)),
        peer_be: pd.big_endian.unwrap_or(HOST_BIG_ENDIAN),
        granted,
        pending_grant: None,
        data_sent: 0,
        failed: false,
    };
    let scratch = &SCRATCH[..];
    let mut rx = vec![0u8; 1 << 16];
    let mut recv_id = 0u64;
    let mut peak_queued = 0usize;
    p.a.st.posted = Some(Vec::new());

    for op in &input.ops {
        let now = p.now();
        match *op {
            Op::AppSend(n) => {
                let _ = p.a.with(|c, io| c.send(&scratch[..usize::from(n)], io));
            }
            Op::AppRecv { len, peek } => {
                let _ =
                    p.a.with(|c, io| c.recv(&mut rx[..usize::from(len)], peek, io));
            }
            Op::AppShutdown(h) => {
                let how = [Shutdown::Read, Shutdown::Write, Shutdown::Both][usize::from(h % 3)];
                p.a.with(|c, io| c.shutdown(how, io));
            }
            Op::AppIomap { off, len } => {
                let s = p.a.st.iomem_sge(usize::from(off), usize::from(len));
                let _ = p.a.conn.iomap(u64::from(off), s);
            }
            Op::AppIounmap(i) => p.a.conn.iounmap(u32::from(i)),
            Op::AppIowrite { offset, len } => {
                let d = &scratch[..usize::from(len)];
                let _ = p.a.with(|c, io| c.iowrite(d, u64::from(offset), io));
            }
            Op::AppKeepalive(us) => {
                let d = us.map(|us| Duration::from_micros(u64::from(us)));
                p.a.conn.set_keepalive(d, now);
            }
            Op::Progress => {
                p.a.progress();
                if let Some(g) = mon.pending_grant.take() {
                    mon.granted = g;
                }
            }
            Op::Deliver => {
                p.deliver_due(true);
            }
            Op::Tick(ns) => {
                p.tick(Duration::from_nanos(u64::from(ns)));
                let now = p.now();
                if p.a.conn.poll_timeout().is_some_and(|t| t <= now) {
                    p.a.with(|c, io| c.handle_timeout(now, io));
                }
            }
            Op::PeerData { off, len, claim } => {
                let to = RemoteAddr {
                    addr: keys.rbuf_addr + u64::from(off),
                    rkey: keys.rbuf_rkey,
                };
                let imm = RsMsg::with(RsOp::Data, claim).0;
                p.peer_write(true, to, &scratch[..usize::from(len)], Some(imm));
            }
            Op::PeerCredit(limit) => {
                let imm = RsMsg::with(RsOp::Sgl, u32::from(limit)).0;
                if p.inject_recv(true, Some(imm), 0, WcStatus::Success) {
                    mon.pending_grant = Some(limit);
                }
            }
            Op::PeerCtrl(code) => {
                let imm = RsMsg::with(RsOp::Ctrl, u32::from(code % 4)).0;
                p.inject_recv(true, Some(imm), 0, WcStatus::Success);
            }
            Op::PeerCompletion {
                imm,
                byte_len,
                status: s,
            } => {
                let st = status(s);
                if p.inject_recv(true, imm, byte_len, st)
                    && st == WcStatus::Success
                    && let Some(m) = imm.map(RsMsg).filter(|m| m.op() == RsOp::Sgl)
                {
                    mon.pending_grant = Some(m.data() as u16);
                }
            }
            Op::PeerWritesTarget {
                entry,
                sge: s,
                swap,
            } => {
                let b = sge(s).to_bytes(HOST_BIG_ENDIAN ^ swap);
                let to = RemoteAddr {
                    addr: keys.target_addr + RsSge::LEN as u64 * u64::from(entry),
                    rkey: keys.target_rkey,
                };
                p.peer_write(true, to, &b, None);
            }
            Op::PeerWritesIomap {
                entry,
                offset,
                sge: s,
                swap,
            } => {
                let m = RsIomap {
                    offset,
                    sge: sge(s),
                };
                let b = m.to_bytes(HOST_BIG_ENDIAN ^ swap);
                let at = 2 * RsSge::LEN as u64 + RsIomap::LEN as u64 * u64::from(entry);
                let to = RemoteAddr {
                    addr: keys.target_addr + at,
                    rkey: keys.target_rkey,
                };
                p.peer_write(true, to, &b, None);
            }
            Op::PeerWrite {
                key,
                off,
                len,
                byte,
            } => {
                let (base, rkey) = match key {
                    0 => (keys.target_addr, keys.target_rkey),
                    1 => (keys.rbuf_addr, keys.rbuf_rkey),
                    k => (keys.rbuf_addr, k),
                };
                let to = RemoteAddr {
                    addr: base.wrapping_add(u64::from(off)),
                    rkey,
                };
                p.peer_write(true, to, &vec![byte; usize::from(len)], None);
            }
            Op::PeerPostsRecvs(n) => {
                for _ in 0..n % 16 {
                    recv_id += 1;
                    let _ =
                        p.b.with(|_, io| io.post_recv(WR_RECV | (1 << 40) | recv_id));
                }
            }
            Op::FailNextSend(s) => {
                let st = WcStatus::from_raw(1 + u32::from(s % 21));
                p.a.st.fail_next = Some((1, st));
            }
            Op::PeerGone => p.a.conn.peer_gone(),
        }

        // Invariants.
        assert_eq!(
            p.a.st.bounds_faults(),
            0,
            "state machine accessed memory outside its buffers: {:?} (buffer, offset, length)",
            p.a.st.last_bounds_fault()
        );
        peak_queued = peak_queued.max(p.a.conn.readable_bytes());
        let posted = p.a.st.posted.replace(Vec::new()).unwrap_or_default();
        let received = p.a.conn.stats().data_msgs_received;
        mon.check_posts(posted, received);
        let err = p.a.with(|c, io| c.readiness(io).err);
        if mon.failed {
            assert!(err && !p.a.conn.is_connected(), "recovered after failing");
        }
        mon.failed = err;
    }
    // Checked last, so that an `AppRecv` op may first show what reading such a queue does.
    assert!(
        peak_queued <= cfg.rbuf_size as usize,
        "{peak_queued} bytes were queued for reading, more than the {}-byte receive buffer holds",
        cfg.rbuf_size
    );
}
