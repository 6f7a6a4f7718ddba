//! rsocket sockets over the shm provider: echo, refused and re-attempted connects,
//! non-blocking connect, half close, options, iomap, peer death (another process), and
//! thousands of concurrent streams served by one lcore pair.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dataplane::fabric::shm::{Shm, ShmConfig, ShmDevice};
use dataplane::rsocket::{
    RecvFlags, RsConfig, RsContext, RsError, RsListener, RsStream, SendFlagsRs, Shutdown, SockOpt,
    SockOptName,
};
use mempool::memory::{Region, RegionConfig};

fn dir() -> PathBuf {
    std::env::var_os("DP_SHM_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join(format!("dp-rs-{}", std::process::id())))
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

fn addr(port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 7, 1)), port)
}

fn pattern(seed: usize, i: usize) -> u8 {
    (i.wrapping_mul(131) ^ seed.wrapping_mul(7) ^ (i >> 9)) as u8
}

#[test]
fn stream_echo_byte_exact_then_eof() {
    let server_ctx = ctx();
    let l = RsListener::bind(&server_ctx, addr(5001)).unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut buf = vec![0u8; 100_000];
        let mut total = 0;
        loop {
            let n = s.read(&mut buf).unwrap();
            if n == 0 {
                return total;
            }
            s.write_all(&buf[..n]).unwrap();
            total += n;
        }
    });
    let c = ctx();
    let mut s = RsStream::connect(&c, addr(5001)).unwrap();
    assert_eq!(s.peer_addr().unwrap(), addr(5001));
    let mut sent = 0;
    for (k, size) in [
        1usize,
        7,
        64,
        65,
        2048,
        4096,
        65536,
        100_000,
        1 << 20,
        3 << 20,
    ]
    .into_iter()
    .enumerate()
    {
        let data: Vec<u8> = (0..size).map(|i| pattern(k, i)).collect();
        // Write from another thread: an echo of more than the socket buffers would
        // deadlock with both sides blocked in send (as with TCP).
        let (wc, id, d2) = (c.clone(), s.id(), data.clone());
        let writer = std::thread::spawn(move || {
            let mut off = 0;
            while off < d2.len() {
                off += wc.send(id, &d2[off..], SendFlagsRs::default()).unwrap();
            }
        });
        let mut back = vec![0u8; size];
        s.read_exact(&mut back).unwrap();
        writer.join().unwrap();
        assert!(back == data, "echo of {size} bytes differs");
        sent += size;
    }
    drop(s);
    assert_eq!(
        server.join().unwrap(),
        sent,
        "server saw every byte, then end of stream"
    );
}

#[test]
fn connect_refused_then_reconnect() {
    let c = ctx();
    let err = RsStream::connect(&c, addr(5002)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused, "{err}");
    // A second attempt once something listens succeeds.
    let sc = ctx();
    let l = RsListener::bind(&sc, addr(5002)).unwrap();
    let t = std::thread::spawn(move || l.accept().map(|_| ()));
    let s = RsStream::connect(&c, addr(5002)).unwrap();
    t.join().unwrap().unwrap();
    drop(s);
}

#[test]
fn nonblocking_connect_and_io() {
    let sc = ctx();
    let l = RsListener::bind(&sc, addr(5003)).unwrap();
    l.set_nonblocking(true).unwrap();
    let c = ctx();
    let s = RsStream::connect_nonblocking(&c, addr(5003)).unwrap();
    let t0 = Instant::now();
    let accepted = loop {
        match l.accept() {
            Ok((a, _)) => break a,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => panic!("{e}"),
        }
        let _ = s.readiness();
        assert!(t0.elapsed() < Duration::from_secs(10));
        std::thread::yield_now();
    };
    while !s.readiness().unwrap().writable {
        let _ = accepted.readiness();
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "never became writable"
        );
    }
    assert!(s.take_error().unwrap().is_none());
    // Non-blocking receive with nothing queued.
    let mut b = [0u8; 8];
    assert_eq!(
        accepted.recv(
            &mut b,
            RecvFlags {
                dontwait: true,
                ..RecvFlags::default()
            }
        ),
        Err(RsError::WouldBlock)
    );
    assert_eq!(s.send(b"nb", SendFlagsRs { dontwait: true }), Ok(2));
    let t0 = Instant::now();
    loop {
        match accepted.recv(&mut b, RecvFlags::default()) {
            Ok(2) => break,
            Err(RsError::WouldBlock) => assert!(t0.elapsed() < Duration::from_secs(10)),
            r => panic!("{r:?}"),
        }
    }
    assert_eq!(&b[..2], b"nb");
}

#[test]
fn half_close_over_the_fabric() {
    let sc = ctx();
    let l = RsListener::bind(&sc, addr(5004)).unwrap();
    let t = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        s.write_all(b"bye").unwrap();
        got
    });
    let c = ctx();
    let mut s = RsStream::connect(&c, addr(5004)).unwrap();
    s.write_all(b"request").unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    assert_eq!(
        s.write(b"x").unwrap_err().kind(),
        ErrorKind::ConnectionReset
    );
    let mut reply = Vec::new();
    s.read_to_end(&mut reply).unwrap();
    assert_eq!(reply, b"bye");
    assert_eq!(t.join().unwrap(), b"request");
}

#[test]
fn options_before_and_after_connect() {
    let sc = ctx();
    let l = RsListener::bind_with(
        &sc,
        addr(5005),
        &[SockOpt::RcvBuf(8192), SockOpt::SqSize(64)],
    )
    .unwrap();
    let t = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        s.option(SockOptName::RcvBuf).unwrap()
    });
    let c = ctx();
    let id = c.socket(false);
    c.set_option(id, SockOpt::SndBuf(100)).unwrap();
    assert_eq!(
        c.option(id, SockOptName::SndBuf).unwrap(),
        SockOpt::SndBuf(4096)
    );
    c.set_option(id, SockOpt::Inline(128)).unwrap();
    c.connect(id, addr(5005)).unwrap();
    assert_eq!(
        c.set_option(id, SockOpt::RqSize(64)),
        Err(RsError::Invalid),
        "RDMA options only before connecting"
    );
    assert_eq!(
        c.set_option(id, SockOpt::KeepIdle(0)),
        Err(RsError::Invalid)
    );
    c.set_option(id, SockOpt::KeepAlive(true)).unwrap();
    c.set_option(id, SockOpt::KeepIdle(1)).unwrap();
    assert_eq!(
        t.join().unwrap(),
        SockOpt::RcvBuf(16384),
        "accepted sockets inherit listener options"
    );
    c.close(id);
}

#[test]
fn iomap_and_iowrite_over_the_fabric() {
    let sc = ctx();
    let l = RsListener::bind_with(&sc, addr(5006), &[SockOpt::IomapSize(2)]).unwrap();
    let mem = Arc::new(
        Region::new(
            &RegionConfig::new("iomap-test", 1 << 16)
                .shareable(true)
                .no_huge()
                .quiet(),
        )
        .unwrap(),
    );
    let m2 = mem.clone();
    let t = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let off = s.iomap(&m2, 4096, 8192, Some(0)).unwrap();
        assert_eq!(off, 0);
        s.write_all(b"m").unwrap(); // the mapping is published ahead of this byte
        let mut done = [0u8; 4];
        s.read_exact(&mut done).unwrap();
        assert_eq!(&done, b"done");
        (0..8192).map(|i| m2.load_u8(4096 + i)).collect::<Vec<u8>>()
    });
    // The side that exposes iomap slots (RDMA_IOMAPSIZE) is the one whose peer maps
    // buffers into them: here the client, so the server can riomap and the client riowrite.
    let c = ctx();
    let mut s = RsStream::connect_with(&c, addr(5006), &[SockOpt::IomapSize(2)]).unwrap();
    let mut m = [0u8; 1];
    s.read_exact(&mut m).unwrap();
    let data: Vec<u8> = (0..8192).map(|i| pattern(9, i)).collect();
    assert_eq!(s.iowrite(&data, 0).unwrap(), 8192);
    assert_eq!(
        s.iowrite(b"x", 8192).unwrap_err().kind(),
        ErrorKind::InvalidInput,
        "past the mapping"
    );
    s.write_all(b"done").unwrap();
    assert_eq!(t.join().unwrap(), data);
    drop(mem);
}

const ROLE: &str = "DP_RS_CHILD";

#[test]
fn peer_death_reads_as_reset() {
    if std::env::var(ROLE).as_deref() == Ok("victim") {
        let c = ctx();
        let mut s = RsStream::connect(&c, addr(5007)).unwrap();
        s.write_all(b"last words").unwrap();
        std::thread::sleep(Duration::from_secs(60));
        return;
    }
    let sc = ctx();
    let l = RsListener::bind(&sc, addr(5007)).unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "peer_death_reads_as_reset",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, "victim")
        .env("DP_SHM_TEST_DIR", dir())
        .spawn()
        .unwrap();
    let (mut s, _) = l.accept().unwrap();
    let mut b = [0u8; 10];
    s.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"last words");
    child.kill().unwrap();
    let _ = child.wait();
    let t0 = Instant::now();
    // A blocking read waits until the death is noticed, then fails.
    let err = s.read(&mut b).expect_err("read from a dead peer");
    assert_eq!(err.kind(), ErrorKind::ConnectionReset, "{err}");
    println!("peer death seen as ECONNRESET after {:?}", t0.elapsed());
    assert_eq!(
        s.write(b"x").unwrap_err().kind(),
        ErrorKind::ConnectionReset
    );
}

fn raise_fd_limit() {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY-free: getrlimit/setrlimit through libc with a valid struct.
    #[allow(unsafe_code)]
    // SAFETY: r is a valid rlimit the calls read and write.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        r.rlim_cur = r.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &r);
    }
}

/// Thousands of concurrent streams, each verified, served by one lcore pair: the client
/// lcore drives every stream from one poller, the server lcore echoes from another.
#[test]
fn thousands_of_streams_on_one_lcore_pair() {
    use lcore::time::RealClock;
    use lcore::{CoreList, DrainPolicy, Lcores, LcoresConfig, LoopBuilder, LoopConfig, PollMode};

    const N: usize = 2000;
    const BYTES: usize = 3000;
    raise_fd_limit();
    let small = [
        SockOpt::SndBuf(4096),
        SockOpt::RcvBuf(4096),
        SockOpt::SqSize(16),
        SockOpt::RqSize(16),
    ];
    let sctx = ctx();
    let l = RsListener::bind_with(&sctx, addr(5100), &small).unwrap();
    l.set_nonblocking(true).unwrap();
    let cctx = ctx();

    let lcores = Lcores::<u8>::init(&LcoresConfig::new(CoreList::parse("0-1").unwrap()))
        .expect("CPUs 0 and 1");
    let worker = lcores.workers().next().unwrap();
    let cfg = |name: &str| LoopConfig {
        name: name.into(),
        mode: PollMode::Hybrid {
            spin: Duration::from_micros(50),
            sleep: Duration::from_micros(100),
        },
        drain: DrainPolicy {
            idle_iterations: 16,
            timeout: Duration::from_secs(2),
        },
        ..LoopConfig::default()
    };
    let server = lcores
        .launch(worker, {
            let cfg = cfg("server");
            move |lc| {
                let mut b = LoopBuilder::<u8, _>::new(cfg, RealClock::new());
                let mut streams: Vec<(RsStream<Shm>, Vec<u8>)> = Vec::new();
                let mut buf = vec![0u8; 8192];
                let started = Instant::now();
                b.poller("echo", move |cx| {
                    let mut work = sctx.progress();
                    while let Ok((s, _)) = l.accept() {
                        streams.push((s, Vec::new()));
                        work += 1;
                    }
                    for (s, pending) in &mut streams {
                        if pending.is_empty() {
                            match s.recv(&mut buf, RecvFlags::default()) {
                                Ok(n) if n > 0 => {
                                    pending.extend_from_slice(&buf[..n]);
                                    work += 1;
                                }
                                _ => {}
                            }
                        }
                        if !pending.is_empty()
                            && let Ok(n) = s.send(pending, SendFlagsRs::default())
                        {
                            pending.drain(..n);
                            work += 1;
                        }
                    }
                    if started.elapsed() > Duration::from_secs(240) {
                        cx.stop_all();
                    }
                    work
                });
                let mut lp = b.build().unwrap();
                lc.run(&mut lp)
            }
        })
        .unwrap();

    let verified = lcores
        .run_on_main(|lc| {
            let mut b = LoopBuilder::<u8, _>::new(cfg("client"), RealClock::new());
            struct C {
                s: RsStream<Shm>,
                sent: usize,
                got: Vec<u8>,
                done: bool,
            }
            let mut conns: Vec<C> = Vec::with_capacity(N);
            let mut verified = std::rc::Rc::new(std::cell::Cell::new(0usize));
            let v2 = verified.clone();
            let started = Instant::now();
            let mut buf = vec![0u8; 8192];
            b.poller("streams", move |cx| {
                let mut work = cctx.progress();
                // Open connections in batches so the listener's backlog keeps up.
                while conns.len() < N && conns.len() < v2.get() + 512 {
                    let s = RsStream::connect_nonblocking_with(&cctx, addr(5100), &small).unwrap();
                    conns.push(C {
                        s,
                        sent: 0,
                        got: Vec::with_capacity(BYTES),
                        done: false,
                    });
                    work += 1;
                }
                for (k, c) in conns.iter_mut().enumerate() {
                    if c.done {
                        continue;
                    }
                    if c.sent < BYTES {
                        let data: Vec<u8> = (c.sent..BYTES).map(|i| pattern(k, i)).collect();
                        if let Ok(n) = c.s.send(&data, SendFlagsRs::default()) {
                            c.sent += n;
                            work += 1;
                        }
                    }
                    if let Ok(n) = c.s.recv(&mut buf, RecvFlags::default())
                        && n > 0
                    {
                        c.got.extend_from_slice(&buf[..n]);
                        work += 1;
                    }
                    if c.got.len() == BYTES {
                        assert!(
                            c.got.iter().enumerate().all(|(i, b)| *b == pattern(k, i)),
                            "stream {k} corrupted"
                        );
                        c.done = true;
                        v2.set(v2.get() + 1);
                    }
                }
                if v2.get() == N || started.elapsed() > Duration::from_secs(240) {
                    cx.stop_all();
                }
                work
            });
            let mut lp = b.build().unwrap();
            let _ = lc.run(&mut lp);
            std::mem::take(&mut verified).get()
        })
        .unwrap();
    let _ = server.join();
    assert_eq!(verified, N, "every stream echoed and verified");
}

#[test]
fn poll_set_serves_many_streams() {
    use dataplane::rsocket::{Interest, RsPoll, Token};
    let sctx = ctx();
    let l = RsListener::bind(&sctx, addr(5200)).unwrap();
    l.set_nonblocking(true).unwrap();
    let mut poll = RsPoll::new(&sctx);
    poll.register(&l, Token(0), Interest::READABLE).unwrap();
    assert_eq!(
        poll.register(&l, Token(0), Interest::READABLE),
        Err(RsError::Invalid)
    );
    // Nothing yet: a zero timeout returns at once, a short one expires.
    let mut events = Vec::new();
    assert_eq!(poll.poll(&mut events, Some(Duration::ZERO)).unwrap(), 0);
    assert_eq!(
        poll.poll(&mut events, Some(Duration::from_millis(5)))
            .unwrap(),
        0
    );

    const N: usize = 20;
    let cctx = ctx();
    let clients: Vec<RsStream<Shm>> = (0..N)
        .map(|_| RsStream::connect(&cctx, addr(5200)).unwrap())
        .collect();
    for (k, c) in clients.iter().enumerate() {
        c.send(format!("hello {k:02}").as_bytes(), SendFlagsRs::default())
            .unwrap();
    }
    let mut streams: Vec<RsStream<Shm>> = Vec::new();
    let mut echoed = 0;
    let t0 = Instant::now();
    while echoed < N {
        poll.poll(&mut events, Some(Duration::from_secs(5)))
            .unwrap();
        assert!(
            !events.is_empty(),
            "poll timed out with {echoed}/{N} echoed"
        );
        for ev in events.clone() {
            if ev.token == Token(0) {
                while let Ok((s, _)) = l.accept() {
                    poll.register(&s, Token(streams.len() + 1), Interest::READABLE)
                        .unwrap();
                    streams.push(s);
                }
                continue;
            }
            let s = &streams[ev.token.0 - 1];
            let mut b = [0u8; 8];
            if let Ok(8) = s.recv(
                &mut b,
                RecvFlags {
                    waitall: true,
                    ..RecvFlags::default()
                },
            ) {
                s.send(&b, SendFlagsRs::default()).unwrap();
                echoed += 1;
            }
        }
        assert!(t0.elapsed() < Duration::from_secs(30));
    }
    for (k, c) in clients.iter().enumerate() {
        let mut b = [0u8; 8];
        assert_eq!(
            c.recv(
                &mut b,
                RecvFlags {
                    waitall: true,
                    ..RecvFlags::default()
                }
            ),
            Ok(8)
        );
        assert_eq!(&b, format!("hello {k:02}").as_bytes());
    }
    // A stream whose peer closed reports a hang-up even with only writable interest.
    poll.reregister(&streams[0], Token(1), Interest::WRITABLE)
        .unwrap();
    drop(clients);
    let t0 = Instant::now();
    loop {
        poll.poll(&mut events, Some(Duration::from_secs(5)))
            .unwrap();
        if events
            .iter()
            .any(|e| e.token == Token(1) && (e.ready.hup || e.ready.readable))
        {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no hang-up reported"
        );
    }
    poll.deregister(&streams[0]).unwrap();
    assert_eq!(poll.len(), N);
}

/// librdmacm's pitfall #1: a single-threaded program that listens, connects to itself with
/// a blocking connect, then accepts must not hang (connections are accepted in the
/// background, as librdmacm's listen service thread does).
#[test]
fn single_thread_connects_to_itself() {
    let c = ctx();
    let l = RsListener::bind(&c, addr(5300)).unwrap();
    let mut a = RsStream::connect(&c, addr(5300)).unwrap();
    let (mut b, peer) = l.accept().unwrap();
    assert_eq!(peer, a.local_addr().unwrap());
    a.write_all(b"to myself").unwrap();
    let mut got = [0u8; 9];
    b.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"to myself");
}
