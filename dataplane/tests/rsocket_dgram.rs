//! Datagram rsockets over the shm provider: the UDP-path handshake then UD, ping-pong with
//! per-message verification over IPv4 and IPv6, random sizes up to the limit, EMSGSIZE,
//! invalid UDP datagrams (checked byte by byte against the librdmacm wire format),
//! truncation, peeking, non-blocking calls, implicit bind, connected sockets, receive-queue
//! overflow, and a udpong-style echo loop.
//!
//! Every socket binds 127.0.0.1 or ::1 with port 0, so parallel tests cannot collide; every
//! blocking receive has a generous timeout that only guards against hangs.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dataplane::fabric::shm::{Shm, ShmConfig, ShmCq, ShmDevice, ShmMr, ShmPd, ShmUdDest, ShmUdQp};
use dataplane::fabric::{
    Access, Completion, CompletionQueue, Device, GRH_LEN, MemoryRegion, Payload, ProtectionDomain,
    QpCaps, QpInit, RecvWr, SendFlags, UdQueuePair, UdSendWr,
};
use dataplane::rsocket::dgram::{
    DgramStats, MAX_PAYLOAD_V4, MAX_PAYLOAD_V6, RDMA_UDP_QKEY, UDP_HOT_STEPS,
};
use dataplane::rsocket::{
    RecvFlags, RsConfig, RsContext, RsDatagram, RsError, SendFlagsRs, SockOpt,
};
use dataplane::wire::rsocket::{DS_UDP_TAG, DsHeader, DsUdpHeader, RsOp};
use mempool::memory::{Region, RegionConfig};

/// Hang guard for blocking receives (never reached when things work).
const WAIT: Duration = Duration::from_secs(20);

fn dir() -> PathBuf {
    std::env::var_os("DP_SHM_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join(format!("dp-dgram-{}", std::process::id())))
}

fn ctx() -> RsContext<Shm> {
    let dev = ShmDevice::open(ShmConfig {
        dir: Some(dir()),
        bounce_bytes: 4096,
        ..ShmConfig::default()
    })
    .expect("shm device");
    RsContext::with_config(dev, RsConfig::default()).expect("context")
}

fn v4() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn v6() -> SocketAddr {
    "[::1]:0".parse().unwrap()
}

fn sock(c: &RsContext<Shm>, at: SocketAddr) -> RsDatagram<Shm> {
    let mut s = RsDatagram::bind(c, at).expect("bind");
    s.set_read_timeout(Some(WAIT));
    s.set_write_timeout(Some(WAIT));
    s
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Message `seq` of `len` bytes: the sequence number (when it fits), then a pattern that
/// depends on both, so a misplaced, stale or corrupted byte is caught.
fn message(seq: u32, len: usize) -> Vec<u8> {
    let mut m: Vec<u8> = (0..len)
        .map(|i| {
            (i as u32)
                .wrapping_mul(31)
                .wrapping_add(seq.wrapping_mul(97)) as u8
                ^ 0x5A
        })
        .collect();
    if len >= 4 {
        m[..4].copy_from_slice(&seq.to_be_bytes());
    }
    m
}

fn assert_message(got: &[u8], seq: u32, len: usize) {
    assert_eq!(got.len(), len, "datagram {seq}: length");
    assert!(
        got == message(seq, len).as_slice(),
        "datagram {seq} of {len} bytes differs"
    );
}

// ------------------------------------------------------------------------------------------
// The handshake
// ------------------------------------------------------------------------------------------

#[test]
fn first_datagram_takes_udp_then_every_later_one_takes_ud() {
    let (ca, cb) = (ctx(), ctx());
    let (mut a, mut b) = (sock(&ca, v4()), sock(&cb, v4()));
    let (aa, ba) = (a.local_addr().unwrap(), b.local_addr().unwrap());
    assert_ne!(ba.port(), 0, "an ephemeral port was picked");

    assert_eq!(a.send_to(b"hello", ba), Ok(5));
    assert_eq!(a.stats().udp_sent, 1, "no address handle yet: UDP path");
    let mut buf = [0u8; 64];
    let (n, from) = b.recv_from(&mut buf).unwrap();
    assert_eq!((&buf[..n], from), (&b"hello"[..], aa));
    let s = b.stats();
    assert_eq!(
        (s.udp_received, s.ctrl_sent, s.ah_resolved),
        (1, 1, 1),
        "{s:?}"
    );

    // B resolved A's queue pair while answering: its reply takes the UD path at once.
    assert_eq!(b.send_to(b"world", from), Ok(5));
    assert_eq!((b.stats().ud_sent, b.stats().udp_sent), (1, 0));
    let (n, from) = a.recv_from(&mut buf).unwrap();
    assert_eq!((&buf[..n], from), (&b"world"[..], ba));
    let s = a.stats();
    assert_eq!(
        (s.ud_received, s.ctrl_received, s.ah_resolved),
        (1, 1, 1),
        "{s:?}"
    );

    for i in 0..10u32 {
        let m = message(i, 100 + i as usize);
        assert_eq!(a.send_to(&m, ba), Ok(m.len()));
        let (n, from) = b.recv_from(&mut buf).unwrap();
        assert_eq!(from, aa);
        assert_eq!(&buf[..n], &m[..n]);
    }
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!(
        (sa.udp_sent, sa.ud_sent),
        (1, 10),
        "only the first datagram used UDP: {sa:?}"
    );
    assert_eq!((sb.udp_received, sb.ud_received), (1, 10), "{sb:?}");
    assert_eq!(sb.truncated, 10, "64-byte buffer, longer datagrams");
    for s in [sa, sb] {
        assert_eq!(
            (
                s.invalid_udp,
                s.invalid_ud,
                s.resolve_failures,
                s.send_errors
            ),
            (0, 0, 0, 0),
            "{s:?}"
        );
    }
}

// ------------------------------------------------------------------------------------------
// Ping-pong and bulk
// ------------------------------------------------------------------------------------------

fn ping_pong(at: SocketAddr, rounds: u32) {
    let (cs, cc) = (ctx(), ctx());
    let mut server = sock(&cs, at);
    let server_addr = server.local_addr().unwrap();
    let max = server.max_payload(&server_addr);
    let echo = std::thread::spawn(move || {
        let mut buf = vec![0u8; 4096];
        for _ in 0..rounds {
            let (n, from) = server.recv_from(&mut buf).unwrap();
            assert_eq!(server.send_to(&buf[..n], from), Ok(n));
        }
        server.stats()
    });
    let mut client = sock(&cc, at);
    client.connect(server_addr).unwrap();
    assert_eq!(client.peer_addr(), Ok(server_addr));
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ u64::from(at.is_ipv6()));
    let mut buf = vec![0u8; 4096];
    for seq in 0..rounds {
        let len = match seq % 7 {
            0 => max,
            1 => 0,
            _ => rng.below(max + 1),
        };
        let m = message(seq, len);
        assert_eq!(client.send(&m), Ok(len));
        let n = client.recv(&mut buf).unwrap();
        assert_message(&buf[..n], seq, len);
    }
    let ss = echo.join().unwrap();
    let cs = client.stats();
    assert_eq!(cs.udp_sent + cs.ud_sent, u64::from(rounds));
    assert_eq!(
        cs.udp_sent, 1,
        "the client switched to UD after the first answer: {cs:?}"
    );
    assert_eq!((ss.udp_sent, ss.ud_sent), (0, u64::from(rounds)), "{ss:?}");
    assert_eq!(ss.udp_received + ss.ud_received, u64::from(rounds));
}

#[test]
fn ping_pong_ipv4_verifies_every_message() {
    ping_pong(v4(), 2000);
}

#[test]
fn ping_pong_ipv6_verifies_every_message() {
    ping_pong(v6(), 2000);
}

/// Windows of 16 datagrams of random sizes (0 and the maximum included), each window
/// acknowledged: nothing may be lost, reordered or corrupted, including across the switch
/// from the UDP path to UD in the middle of the first window.
fn windows(at: SocketAddr, nwin: u32) {
    const WIN: u32 = 16;
    let (cr, cs) = (ctx(), ctx());
    let mut rx = sock(&cr, at);
    let rx_addr = rx.local_addr().unwrap();
    let max = rx.max_payload(&rx_addr);
    let sizes: Vec<usize> = {
        let mut rng = Rng(42);
        (0..nwin * WIN)
            .map(|i| match i % 11 {
                0 => max,
                5 => 0,
                _ => rng.below(max + 1),
            })
            .collect()
    };
    let expect = sizes.clone();
    let receiver = std::thread::spawn(move || {
        let mut buf = vec![0u8; 4096];
        for w in 0..nwin {
            let mut from = None;
            for k in 0..WIN {
                let seq = w * WIN + k;
                let (n, f) = rx.recv_from(&mut buf).unwrap();
                assert_message(&buf[..n], seq, expect[seq as usize]);
                from = Some(f);
            }
            let from = from.unwrap();
            assert_eq!(rx.send_to(&w.to_be_bytes(), from), Ok(4));
        }
        rx.stats()
    });
    let mut tx = sock(&cs, at);
    let mut ack = [0u8; 8];
    for w in 0..nwin {
        for k in 0..WIN {
            let seq = w * WIN + k;
            let m = message(seq, sizes[seq as usize]);
            assert_eq!(tx.send_to(&m, rx_addr), Ok(m.len()));
        }
        let (n, from) = tx.recv_from(&mut ack).unwrap();
        assert_eq!((n, from), (4, rx_addr));
        assert_eq!(u32::from_be_bytes([ack[0], ack[1], ack[2], ack[3]]), w);
    }
    let rs = receiver.join().unwrap();
    let ts = tx.stats();
    let total = u64::from(nwin * WIN);
    // The switch happens within the first window (once the receiver answered); every later
    // window goes over UD.
    assert!(ts.udp_sent >= 1 && ts.udp_sent <= u64::from(WIN), "{ts:?}");
    assert_eq!(ts.udp_sent + ts.ud_sent, total);
    assert_eq!(
        (rs.udp_received, rs.ud_received),
        (ts.udp_sent, ts.ud_sent),
        "{rs:?}"
    );
    assert_eq!(
        (rs.invalid_ud, rs.invalid_udp, rs.truncated),
        (0, 0, 0),
        "{rs:?}"
    );
}

#[test]
fn many_datagrams_of_random_sizes_ipv4() {
    windows(v4(), 250);
}

#[test]
fn many_datagrams_of_random_sizes_ipv6() {
    windows(v6(), 100);
}

// ------------------------------------------------------------------------------------------
// Sizes
// ------------------------------------------------------------------------------------------

fn oversize(at: SocketAddr, max: usize) {
    let (ca, cb) = (ctx(), ctx());
    let (mut a, mut b) = (sock(&ca, at), sock(&cb, at));
    let ba = b.local_addr().unwrap();
    assert_eq!(a.max_payload(&ba), max);
    let big = message(1, max);
    let mut buf = vec![0u8; 4096];

    // UDP path.
    let e = a.send_to(&message(0, max + 1), ba).unwrap_err();
    assert_eq!(e, RsError::MsgSize);
    assert_eq!(std::io::Error::from(e).raw_os_error(), Some(libc::EMSGSIZE));
    assert_eq!(a.send_to(&big, ba), Ok(max));
    let (n, from) = b.recv_from(&mut buf).unwrap();
    assert_message(&buf[..n], 1, max);

    // UD path, both directions.
    assert_eq!(b.send_to(&vec![0; max + 1], from), Err(RsError::MsgSize));
    assert_eq!(b.send_to(&vec![0; 65536], from), Err(RsError::MsgSize));
    assert_eq!(b.send_to(&big, from), Ok(max));
    let (n, _) = a.recv_from(&mut buf).unwrap();
    assert_message(&buf[..n], 1, max);
    assert_eq!(a.send_to(&message(2, max), ba), Ok(max));
    let m = b.recv_msg(&mut buf, RecvFlags::default()).unwrap();
    assert_eq!((m.len, m.msg_len, m.truncated()), (max, max, false));
    assert_message(&buf[..max], 2, max);
    assert_eq!(a.send_to(&message(2, max + 1), ba), Err(RsError::MsgSize));
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!(
        (sa.udp_sent, sa.ud_sent, sb.ud_sent),
        (1, 1, 1),
        "{sa:?} {sb:?}"
    );
}

#[test]
fn oversize_datagrams_fail_with_emsgsize_ipv4() {
    assert_eq!(MAX_PAYLOAD_V4, 2032);
    oversize(v4(), MAX_PAYLOAD_V4);
}

#[test]
fn oversize_datagrams_fail_with_emsgsize_ipv6() {
    assert_eq!(MAX_PAYLOAD_V6, 2020);
    oversize(v6(), MAX_PAYLOAD_V6);
}

#[test]
fn queue_sizes_follow_ds_set_qp_size() {
    let c = ctx();
    let s = sock(&c, v4());
    assert_eq!(
        s.slots(),
        Some((64, 64)),
        "128 KiB buffers / 2048-byte slots"
    );
    let mut s =
        RsDatagram::bind_with(&c, v4(), &[SockOpt::RcvBuf(16384), SockOpt::SqSize(8)]).unwrap();
    assert_eq!(
        s.slots(),
        Some((8, 16)),
        "SO_RCVBUF doubled, then / 2048; RDMA_SQSIZE caps the send slots"
    );
    assert_eq!(
        s.set_option(SockOpt::RqSize(4)),
        Err(RsError::Invalid),
        "RDMA options only before bind"
    );
    let mut u = RsDatagram::unbound(&c);
    assert_eq!(u.slots(), None);
    u.set_option(SockOpt::SndBuf(4096)).unwrap();
    u.bind_addr(v4()).unwrap();
    assert_eq!(u.slots(), Some((4, 64)));
    assert_eq!(u.bind_addr(v4()), Err(RsError::Invalid), "already bound");
}

// ------------------------------------------------------------------------------------------
// Invalid input and the wire format
// ------------------------------------------------------------------------------------------

fn udp_header(op: RsOp, qpn: u32, addr: IpAddr) -> Vec<u8> {
    let h = DsUdpHeader { op, qpn, addr };
    let mut b = vec![0u8; h.buffer_len()];
    h.emit(&mut b);
    b
}

#[test]
fn invalid_udp_datagrams_are_dropped_and_counted_and_plain_udp_peers_interoperate() {
    let (ca, cb) = (ctx(), ctx());
    let (mut a, mut b) = (sock(&ca, v4()), sock(&cb, v4()));
    let ba = b.local_addr().unwrap();
    let raw = UdpSocket::bind(v4()).unwrap();
    raw.set_read_timeout(Some(WAIT)).unwrap();
    let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let good = {
        let mut g = udp_header(RsOp::Data, 0x00AB_CDEF, lo);
        g.extend_from_slice(b"raw");
        g
    };
    let mut bad = Vec::new();
    let mut tag = good.clone();
    tag[3] = 0x54;
    bad.push(tag);
    let mut v6hdr = udp_header(RsOp::Data, 1, "::1".parse().unwrap());
    v6hdr.extend_from_slice(b"x");
    bad.push(v6hdr); // version 6 header on an IPv4 socket
    bad.push(good[..10].to_vec()); // short
    let mut len = good.clone();
    len[6] = 20; // header length not matching version 4
    bad.push(len);
    bad.push(udp_header(RsOp::Sgl, 1, lo)); // an op the UDP path does not carry
    let mut huge = udp_header(RsOp::Data, 1, lo);
    huge.resize(16 + 2049, 0); // payload beyond a slot
    bad.push(huge);
    for d in &bad {
        raw.send_to(d, ba).unwrap();
    }
    b.set_nonblocking(true);
    let r = b.readiness();
    assert!(!r.readable && r.writable, "{r:?}");
    let s = b.stats();
    assert_eq!(s.invalid_udp, bad.len() as u64, "{s:?}");
    assert_eq!((s.udp_received, s.ctrl_sent, b.queued()), (0, 0, 0));
    let mut buf = [0u8; 64];
    assert_eq!(b.recv_from(&mut buf), Err(RsError::WouldBlock));

    // The socket is unharmed.
    b.set_nonblocking(false);
    a.send_to(b"after", ba).unwrap();
    let (n, _) = b.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"after");

    // A plain UDP sender speaking the format: its payload is delivered, the answer is a
    // librdmacm CTRL header, and its bogus queue pair number cannot be resolved, so
    // replies to it stay on the UDP path.
    let raw_addr = raw.local_addr().unwrap();
    raw.send_to(&good, ba).unwrap();
    let (n, from) = b.recv_from(&mut buf).unwrap();
    assert_eq!((&buf[..n], from), (&b"raw"[..], raw_addr));
    assert_eq!(b.stats().resolve_failures, 1);
    let mut r = [0u8; 64];
    let (n, from) = raw.recv_from(&mut r).unwrap();
    assert_eq!((n, from), (16, ba), "a header-only reply");
    assert_eq!(u32::from_be_bytes([r[0], r[1], r[2], r[3]]), DS_UDP_TAG);
    assert_eq!(
        &r[4..8],
        &[4, 7, 16, 0],
        "version 4, RS_OP_CTRL, 16-byte header, reserved"
    );
    let qpn = u32::from_be_bytes([r[8], r[9], r[10], r[11]]);
    assert!(
        qpn != 0 && qpn <= 0x00FF_FFFF,
        "24-bit queue pair number {qpn:#x}"
    );
    assert_eq!(&r[12..16], &[127, 0, 0, 1], "the sender's source address");

    assert_eq!(b.send_to(b"back", raw_addr), Ok(4));
    let (n, _) = raw.recv_from(&mut r).unwrap();
    let (h, hl) = DsUdpHeader::parse(&r[..n], false).unwrap();
    assert_eq!(
        (h.op, h.qpn, h.addr, &r[hl..n]),
        (RsOp::Data, qpn, lo, &b"back"[..])
    );

    // The same unresolvable queue pair is not resolved again for every datagram.
    raw.send_to(&good, ba).unwrap();
    b.recv_from(&mut buf).unwrap();
    let s = b.stats();
    assert_eq!(
        (s.resolve_failures, s.udp_sent, s.udp_received, s.ctrl_sent),
        (1, 1, 3, 3),
        "{s:?}"
    );
}

/// A librdmacm peer built by hand from the fabric and a plain UDP socket: it speaks the wire
/// format and nothing of this crate's datagram code.
struct Peer {
    raw: UdpSocket,
    qp: ShmUdQp,
    cq: ShmCq,
    dest: Option<ShmUdDest>,
    mr: ShmMr,
    mem: Arc<Region>,
    _pd: ShmPd,
    dev: ShmDevice,
}

impl Peer {
    const LO: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
    /// Receive buffers: 8 of GRH + 2048 bytes at 4 KiB strides; sends from 60 KiB.
    const SEND_OFF: usize = 60 << 10;

    fn new() -> Self {
        let dev = ShmDevice::open(ShmConfig {
            dir: Some(dir()),
            ..ShmConfig::default()
        })
        .unwrap();
        let pd = dev.alloc_pd().unwrap();
        let mem =
            Arc::new(Region::new(&RegionConfig::new("peer", 64 << 10).no_huge().quiet()).unwrap());
        let mr = pd
            .reg_region(&mem, 0, mem.len(), Access::LOCAL_WRITE)
            .unwrap();
        let cq = dev.create_cq(64).unwrap();
        let init = QpInit {
            pd: &pd,
            send_cq: &cq,
            recv_cq: &cq,
            caps: QpCaps::default(),
        };
        let mut qp = dev.create_ud_qp(&init, Self::LO, RDMA_UDP_QKEY).unwrap();
        for i in 0..8u64 {
            let sge = [mr.sge(i as usize * 4096, GRH_LEN + 2048)];
            qp.post_recv(&[RecvWr {
                wr_id: i,
                sgl: &sge,
            }])
            .unwrap();
        }
        let raw = UdpSocket::bind(v4()).unwrap();
        raw.set_read_timeout(Some(WAIT)).unwrap();
        Self {
            raw,
            qp,
            cq,
            dest: None,
            mr,
            mem,
            _pd: pd,
            dev,
        }
    }

    fn addr(&self) -> SocketAddr {
        self.raw.local_addr().unwrap()
    }

    fn send_udp(&self, to: SocketAddr, payload: &[u8]) {
        let mut d = udp_header(RsOp::Data, self.qp.qp_num(), Self::LO);
        d.extend_from_slice(payload);
        self.raw.send_to(&d, to).unwrap();
    }

    /// Reads the CTRL answer and resolves the address handle of the queue pair it names.
    fn take_ctrl(&mut self) {
        let mut r = [0u8; 64];
        let (n, _) = self.raw.recv_from(&mut r).unwrap();
        let (h, _) = DsUdpHeader::parse(&r[..n], false).unwrap();
        assert_eq!((n, h.op), (16, RsOp::Ctrl));
        let pd = self._pd.clone();
        self.dest = Some(
            self.dev
                .resolve_ud_dest(&pd, Self::LO, Self::LO, h.qpn, RDMA_UDP_QKEY)
                .unwrap(),
        );
    }

    fn send_ud(&mut self, payload: &[u8]) {
        let h = DsHeader {
            port: self.addr().port(),
            addr: Self::LO,
            flowinfo: 0,
        };
        let mut b = vec![0u8; 8 + payload.len()];
        h.emit(&mut b);
        b[8..].copy_from_slice(payload);
        self.mem.copy_in(Self::SEND_OFF, &b);
        let sge = [self.mr.sge(Self::SEND_OFF, b.len() as u32)];
        self.qp
            .post_send(&[UdSendWr {
                wr_id: 100,
                dest: self.dest.as_ref().unwrap(),
                payload: Payload::Sgl(&sge),
                flags: SendFlags::SIGNALED,
                imm: None,
            }])
            .unwrap();
    }

    /// Waits for one UD receive; returns what followed the GRH area.
    fn recv_ud(&mut self) -> Vec<u8> {
        let mut out = [Completion::default(); 8];
        let t0 = Instant::now();
        loop {
            let n = self.cq.poll(&mut out);
            if let Some(c) = out[..n].iter().find(|c| c.wr_id < 8) {
                assert!(c.is_ok(), "{c:?}");
                let mut b = vec![0u8; (c.byte_len - GRH_LEN) as usize];
                self.mem
                    .copy_out(c.wr_id as usize * 4096 + GRH_LEN as usize, &mut b);
                return b;
            }
            assert!(t0.elapsed() < WAIT, "no UD datagram");
            std::thread::yield_now();
        }
    }
}

/// A sender's UDP-path datagram that reaches our socket only after the UDP path went quiet
/// (no polling every step any more) is still queued before its first UD datagram. Run
/// twice with a different step phase, so the every-16th-step poll cannot hide a missing
/// forced drain.
#[test]
fn librdmacm_peer_switching_paths_stays_in_order_and_reads_our_ud_headers() {
    for extra in [0, 1] {
        let cb = ctx();
        let mut b = sock(&cb, v4());
        let ba = b.local_addr().unwrap();
        let mut peer = Peer::new();
        let pa = peer.addr();
        peer.send_udp(ba, b"u0");
        assert!(b.readiness().readable);
        peer.take_ctrl();
        for _ in 0..UDP_HOT_STEPS + extra {
            b.progress();
        }
        // Sent before the peer switched, but arriving after we stopped watching closely.
        peer.send_udp(ba, b"u1");
        peer.send_ud(b"d2");
        b.progress();
        b.set_nonblocking(true);
        let mut got = Vec::new();
        let mut buf = [0u8; 64];
        while let Ok((n, from)) = b.recv_from(&mut buf) {
            assert_eq!(from, pa);
            got.push(buf[..n].to_vec());
        }
        assert_eq!(got, [&b"u0"[..], b"u1", b"d2"], "phase {extra}");
        let s = b.stats();
        assert_eq!(
            (s.udp_received, s.ud_received, s.ctrl_sent, s.ah_resolved),
            (2, 1, 2, 1),
            "{s:?}"
        );

        // Our UD datagram, as the peer's queue pair sees it: the 8-byte IPv4 ds_header with
        // our UDP port and source address, then the payload.
        assert_eq!(b.send_to(b"reply", pa), Ok(5));
        let d = peer.recv_ud();
        let port = ba.port().to_be_bytes();
        assert_eq!(
            d,
            [&[4, 8, port[0], port[1], 127, 0, 0, 1][..], b"reply"].concat()
        );
    }
}

// ------------------------------------------------------------------------------------------
// Receive semantics
// ------------------------------------------------------------------------------------------

#[test]
fn peek_truncation_nonblocking_and_timeouts_on_both_paths() {
    let (ca, cb) = (ctx(), ctx());
    let (mut a, mut b) = (sock(&ca, v4()), sock(&cb, v4()));
    let (aa, ba) = (a.local_addr().unwrap(), b.local_addr().unwrap());
    b.set_nonblocking(true);
    assert!(b.is_nonblocking());
    let mut big = [0u8; 256];
    let mut small = [0u8; 10];
    assert_eq!(b.recv_from(&mut big), Err(RsError::WouldBlock));
    let r = b.readiness();
    assert!(!r.readable && r.writable);

    // First datagram (UDP path, staging slot), then one over UD after B answered.
    let peek = RecvFlags {
        peek: true,
        ..RecvFlags::default()
    };
    for (round, seq) in [(0, 7u32), (1, 8)] {
        if round == 1 {
            b.send_to(b"hi", aa).unwrap();
            a.recv_from(&mut big).unwrap();
        }
        let m = message(seq, 100);
        a.send_to(&m, ba).unwrap();
        let mut spins = 0;
        while !b.readiness().readable {
            spins += 1;
            assert!(spins < 1_000_000, "datagram {seq} never arrived");
            std::thread::yield_now();
        }
        let p = b.recv_msg(&mut big, peek).unwrap();
        assert_eq!((p.len, p.msg_len, p.src), (100, 100, aa));
        assert_eq!(b.queued(), 1, "peek leaves it queued");
        let t = b.recv_msg(&mut small, RecvFlags::default()).unwrap();
        assert_eq!((t.len, t.msg_len, t.truncated()), (10, 100, true));
        assert_eq!(&small[..], &m[..10]);
        assert_eq!(b.queued(), 0);
        assert_eq!(
            b.recv_from(&mut big),
            Err(RsError::WouldBlock),
            "the rest is gone"
        );
    }
    let s = b.stats();
    assert_eq!(
        (s.udp_received, s.ud_received, s.truncated),
        (1, 1, 2),
        "{s:?}"
    );

    // MSG_DONTWAIT on a blocking socket; the read timeout of a blocking one.
    b.set_nonblocking(false);
    let dontwait = RecvFlags {
        dontwait: true,
        ..RecvFlags::default()
    };
    assert_eq!(
        b.recv_from_with(&mut big, dontwait),
        Err(RsError::WouldBlock)
    );
    b.set_read_timeout(Some(Duration::from_millis(20)));
    let t0 = Instant::now();
    assert_eq!(b.recv_from(&mut big), Err(RsError::WouldBlock));
    assert!(t0.elapsed() >= Duration::from_millis(20));
    assert_eq!(
        a.send_to_with(b"nb", ba, SendFlagsRs { dontwait: true }),
        Ok(2),
        "a free slot: MSG_DONTWAIT sends"
    );
}

#[test]
fn ud_receive_queue_overflow_drops_like_hardware() {
    let (ca, cb) = (ctx(), ctx());
    let (mut a, mut b) = (sock(&ca, v4()), sock(&cb, v4()));
    let ba = b.local_addr().unwrap();
    let mut buf = [0u8; 64];
    a.send_to(b"x", ba).unwrap();
    let (_, from) = b.recv_from(&mut buf).unwrap();
    b.send_to(b"y", from).unwrap();
    a.recv_from(&mut buf).unwrap();
    let (_, rq) = b.slots().unwrap();
    // B does not read: its receive slots fill, the rest is dropped (UD semantics).
    for i in 0..rq + 10 {
        a.send_to(&i.to_be_bytes(), ba).unwrap();
    }
    assert_eq!(a.stats().ud_sent, u64::from(rq + 10));
    b.set_nonblocking(true);
    let mut got = Vec::new();
    while let Ok((n, _)) = b.recv_from(&mut buf) {
        got.push(u32::from_be_bytes(buf[..n].try_into().unwrap()));
    }
    assert_eq!(
        got,
        (0..rq).collect::<Vec<_>>(),
        "the first {rq} datagrams, in order"
    );
    // Consumed slots were posted again: the socket receives as before.
    a.send_to(b"again", ba).unwrap();
    b.set_nonblocking(false);
    let (n, _) = b.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"again");
}

// ------------------------------------------------------------------------------------------
// Binding and connecting
// ------------------------------------------------------------------------------------------

#[test]
fn unbound_socket_binds_on_first_send_and_learns_its_source_address() {
    let (ca, cb) = (ctx(), ctx());
    let mut b = sock(&cb, v4());
    let ba = b.local_addr().unwrap();
    let mut a = RsDatagram::unbound(&ca);
    a.set_read_timeout(Some(WAIT));
    let mut buf = [0u8; 64];
    assert_eq!(a.local_addr(), Err(RsError::NotConnected));
    assert_eq!(
        a.recv_from(&mut buf),
        Err(RsError::Invalid),
        "nothing can arrive before a bind"
    );
    assert_eq!(a.send(b"x"), Err(RsError::NotConnected));
    assert_eq!(a.send_to(b"first", ba), Ok(5));
    let al = a.local_addr().unwrap();
    assert!(al.ip().is_unspecified() && al.port() != 0, "{al}");
    let (n, from) = b.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"first");
    assert_eq!(
        from,
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), al.port())
    );
    b.send_to(b"second", from).unwrap();
    let (n, f) = a.recv_from(&mut buf).unwrap();
    assert_eq!((&buf[..n], f), (&b"second"[..], ba));
    // A's UD header carries the routed source address: B sees the same peer.
    a.send_to(b"third", ba).unwrap();
    let (n, f) = b.recv_from(&mut buf).unwrap();
    assert_eq!((&buf[..n], f), (&b"third"[..], from));
    assert_eq!((a.stats().ud_sent, b.stats().ud_received), (1, 1));
    assert_eq!(
        a.send_to(b"v6", "[::1]:9".parse().unwrap()),
        Err(RsError::Invalid),
        "other family"
    );
}

#[test]
fn connected_socket_takes_only_its_peers_datagrams() {
    let (ca, cb, cc) = (ctx(), ctx(), ctx());
    let (mut a, mut b, mut c) = (sock(&ca, v4()), sock(&cb, v4()), sock(&cc, v4()));
    let (aa, ba, cla) = (
        a.local_addr().unwrap(),
        b.local_addr().unwrap(),
        c.local_addr().unwrap(),
    );
    let mut buf = [0u8; 64];
    // C and B complete the handshake, so C can reach B over UD.
    c.send_to(b"c1", ba).unwrap();
    assert_eq!(b.recv_from(&mut buf).unwrap(), (2, cla));
    b.send_to(b"ok", cla).unwrap();
    c.recv_from(&mut buf).unwrap();

    b.connect(aa).unwrap();
    assert_eq!(b.peer_addr(), Ok(aa));
    c.send_to(b"c2", ba).unwrap();
    assert_eq!(c.stats().ud_sent, 1);
    a.send_to(b"a1", ba).unwrap();
    let n = b.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"a1");
    assert_eq!(b.stats().filtered, 1, "C's UD datagram was dropped");
    b.send(b"to-a").unwrap();
    let (n, f) = a.recv_from(&mut buf).unwrap();
    assert_eq!((&buf[..n], f), (&b"to-a"[..], ba));
    a.send_to(b"a2", ba).unwrap();
    assert_eq!(b.recv(&mut buf), Ok(2));
    assert_eq!(&buf[..2], b"a2");
}

// ------------------------------------------------------------------------------------------
// udpong
// ------------------------------------------------------------------------------------------

/// udpong's message: op, id, seqno, reserved, data (BE32), then payload.
mod pong {
    pub const LOGIN: u8 = 0;
    pub const START: u8 = 1;
    pub const DATA: u8 = 2;
    pub const ECHO: u8 = 3;
    pub const END: u8 = 4;
    pub const QUIT: u8 = 5;
    pub const CTRL_MSG_SIZE: usize = 16;

    pub fn msg(op: u8, id: u8, seqno: u8, data: u32, size: usize) -> Vec<u8> {
        let mut m = vec![0u8; size.max(CTRL_MSG_SIZE)];
        m[0] = op;
        m[1] = id;
        m[2] = seqno;
        m[4..8].copy_from_slice(&data.to_be_bytes());
        for (i, b) in m[CTRL_MSG_SIZE..].iter_mut().enumerate() {
            *b = (i as u8) ^ seqno;
        }
        m
    }

    pub fn data(m: &[u8]) -> u32 {
        u32::from_be_bytes([m[4], m[5], m[6], m[7]])
    }
}

fn udpong_server(mut s: RsDatagram<Shm>) -> DgramStats {
    let mut buf = vec![0u8; 4096];
    let mut received = 0u32;
    let mut next_id = 1u8;
    loop {
        let (n, from) = s.recv_from(&mut buf).unwrap();
        assert!(n >= pong::CTRL_MSG_SIZE, "short udpong message");
        match buf[0] {
            pong::LOGIN => {
                buf[1] = next_id;
                next_id += 1;
                s.send_to(&buf[..n], from).unwrap();
            }
            pong::START => received = 0,
            pong::DATA => received += 1,
            pong::ECHO => {
                s.send_to(&buf[..n], from).unwrap();
            }
            pong::END => {
                let r = pong::msg(pong::END, buf[1], buf[2], received, pong::CTRL_MSG_SIZE);
                s.send_to(&r, from).unwrap();
            }
            pong::QUIT => return s.stats(),
            op => panic!("unknown udpong op {op}"),
        }
    }
}

/// Sends `m` and waits for the reply with the same op, seqno and data, resending after
/// `resend` (udpong waits 1 ms); stale replies (answers to resends) are discarded. Returns
/// the reply's length and the resends.
fn exchange(c: &mut RsDatagram<Shm>, m: &[u8], buf: &mut [u8], resend: Duration) -> (usize, u32) {
    c.set_read_timeout(Some(resend));
    let mut resends = 0;
    let t0 = Instant::now();
    c.send(m).unwrap();
    loop {
        match c.recv(buf) {
            Ok(n)
                if n >= pong::CTRL_MSG_SIZE
                    && buf[0] == m[0]
                    && buf[2] == m[2]
                    && (m[0] != pong::ECHO || buf[4..8] == m[4..8]) =>
            {
                return (n, resends);
            }
            Ok(_) => {}
            Err(RsError::WouldBlock) => {
                assert!(t0.elapsed() < WAIT, "no answer to udpong op {}", m[0]);
                resends += 1;
                c.send(m).unwrap();
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn udpong_echo_loop() {
    const SIZES: [usize; 9] = [64, 128, 192, 256, 384, 512, 768, 1024, 1536];
    const ECHOES: u32 = 100;
    const WIN: u32 = 16;
    const WINDOWS: u32 = 8;
    let (cs, cc) = (ctx(), ctx());
    let server = sock(&cs, v4());
    let server_addr = server.local_addr().unwrap();
    let srv = std::thread::spawn(move || udpong_server(server));
    let mut c = sock(&cc, v4());
    c.connect(server_addr).unwrap();
    let mut buf = vec![0u8; 4096];
    const RESEND: Duration = Duration::from_millis(1);
    // Login without resends, so exactly one datagram takes the UDP path.
    let (n, _) = exchange(&mut c, &pong::msg(pong::LOGIN, 0, 0, 0, 64), &mut buf, WAIT);
    assert_eq!((n, buf[1]), (64, 1), "login assigns id 1");
    let id = buf[1];
    let mut resends = 0;
    for size in SIZES {
        c.send(&pong::msg(pong::START, id, 0, 0, pong::CTRL_MSG_SIZE))
            .unwrap();
        // Latency phase: every echo comes back intact.
        for seq in 0..ECHOES {
            let m = pong::msg(pong::ECHO, id, seq as u8, (size as u32) << 16 | seq, size);
            let (n, r) = exchange(&mut c, &m, &mut buf, RESEND);
            assert!(buf[..n] == m[..], "echo {seq} of {size} bytes differs");
            resends += r;
        }
        // Bandwidth phase: windows of fire-and-forget data, each closed by an echo (the
        // server handles messages in order, so the echo proves the window was received).
        for w in 0..WINDOWS {
            for k in 0..WIN {
                c.send(&pong::msg(pong::DATA, id, k as u8, w, size))
                    .unwrap();
            }
            let m = pong::msg(
                pong::ECHO,
                id,
                200 + w as u8,
                (size as u32) << 16 | w,
                pong::CTRL_MSG_SIZE,
            );
            resends += exchange(&mut c, &m, &mut buf, RESEND).1;
        }
        let end = pong::msg(pong::END, id, 255, 0, pong::CTRL_MSG_SIZE);
        let (n, r) = exchange(&mut c, &end, &mut buf, RESEND);
        resends += r;
        assert_eq!(n, pong::CTRL_MSG_SIZE);
        assert_eq!(
            pong::data(&buf),
            WIN * WINDOWS,
            "the server received every data message of {size} bytes"
        );
    }
    c.send(&pong::msg(pong::QUIT, id, 0, 0, pong::CTRL_MSG_SIZE))
        .unwrap();
    let ss = srv.join().unwrap();
    let cs = c.stats();
    assert_eq!(cs.udp_sent, 1, "{cs:?}");
    assert_eq!(ss.udp_sent, 0, "{ss:?}");
    assert!(cs.ud_sent > u64::from((ECHOES + WIN * WINDOWS) * SIZES.len() as u32));
    assert_eq!(
        (cs.invalid_ud, ss.invalid_ud, ss.invalid_udp, cs.invalid_udp),
        (0, 0, 0, 0)
    );
    // Resends are udpong's recovery from a late or lost answer; on shm they only happen
    // when the server thread was descheduled for more than a millisecond.
    if resends > 0 {
        eprintln!("udpong: {resends} resends");
    }
}
