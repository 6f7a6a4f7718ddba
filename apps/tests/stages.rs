//! rsocket stages driven by hand, one poll at a time: back-pressure from a slow consumer must
//! hold the sender back through the connection without losing, reordering or corrupting a
//! message, and end of stream must still arrive at the end.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use apps::config::{ClientDef, ServerDef, ServerMode};
use apps::link::link;
use apps::msg::{Msg, Pattern};
use apps::payload::Payloads;
use apps::stage::{RsClient, RsServer, Stage, StageIo, StartGate};
use apps::stats::{Role, StageStats};
use dataplane::fabric::shm::{Shm, ShmConfig, ShmDevice};
use dataplane::rsocket::{RsConfig, RsContext};
use lcore::time::{Clock, MonotonicClock};

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn run_pair(mode: ServerMode, n: u64, len: u32) {
    let dir =
        TempDir(std::env::temp_dir().join(format!("dpctl-stages-{}-{mode:?}", std::process::id())));
    let dev = ShmDevice::open(ShmConfig {
        dir: Some(dir.0.clone()),
        bounce_bytes: 4096,
        ..ShmConfig::default()
    })
    .unwrap();
    let ctx = || RsContext::<Shm>::with_config(dev.clone(), RsConfig::default()).unwrap();
    let addr: SocketAddr = "10.1.2.3:4000".parse().unwrap();
    let echo = mode == ServerMode::Echo;

    // Client input: every message queued up front, then end of stream.
    let (mut in_tx, in_rx) = link("in", (n as usize).next_power_of_two(), 1).unwrap();
    let msgs: Vec<Msg> = (0..n)
        .map(|seq| Msg {
            seq,
            len,
            pattern: Pattern::Counter,
            ..Msg::default()
        })
        .collect();
    assert_eq!(in_tx[0].send_burst(&msgs), n as usize);
    in_tx[0].close();
    // The slow end: a 4-slot ring drained one message every few polls.
    let (mut slow_tx, mut slow_rx) = link("slow", 4, 1).unwrap();

    let sstats = StageStats::new("server", "rsocket_server", 0, Role::Source, false);
    let cstats = StageStats::new("client", "rsocket_client", 0, Role::Inner, echo);
    let sdef = ServerDef {
        listen: addr,
        mode,
        output: (!echo).then(|| "slow".to_owned()),
        pool: None,
        connections: Some(1),
        verify: true,
        burst: 4,
    };
    let cdef = ClientDef {
        input: "in".into(),
        connect: addr,
        echo,
        output: echo.then(|| "slow".to_owned()),
        verify: true,
        burst: 32,
        connect_timeout: Duration::from_secs(10),
    };
    let server_out = (!echo).then(|| slow_tx.pop().unwrap());
    let client_out = echo.then(|| slow_tx.pop().unwrap());
    let mut server = RsServer::new(
        ctx(),
        &sdef,
        server_out,
        0,
        Payloads::new(&[]),
        sstats.clone(),
    )
    .unwrap();
    let gate = StartGate::new(1);
    let mut client = RsClient::new(
        ctx(),
        &cdef,
        in_rx,
        client_out,
        Payloads::new(&[]),
        gate.clone(),
        cstats.clone(),
    );

    let clock = MonotonicClock;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut got = Vec::with_capacity(n as usize);
    let mut i = 0u64;
    while !(server.is_finished() && client.is_finished() && slow_rx.at_eof()) {
        assert!(
            Instant::now() < deadline,
            "stuck after {} of {n} messages",
            got.len()
        );
        let io = StageIo {
            now: clock.now(),
            quiesce: false,
            links_up: true,
        };
        let w = client.poll(&io) + server.poll(&io);
        i += 1;
        if i.is_multiple_of(8) {
            let mut one = [Msg::default()];
            if slow_rx.recv_burst(&mut one) == 1 {
                got.push(one[0].seq);
            }
        }
        if w == 0 {
            std::thread::yield_now();
        }
    }
    assert!(
        gate.is_open(),
        "the client opened the start gate when it connected"
    );
    assert_eq!(
        got,
        (0..n).collect::<Vec<_>>(),
        "every message once, in order"
    );
    for s in [&sstats, &cstats] {
        assert_eq!(s.error(), None, "{}", s.name);
        let c = s.counters.snapshot();
        assert_eq!(
            (c.gaps, c.dups, c.verify_errors, c.dropped),
            (0, 0, 0, 0),
            "{}: {c:?}",
            s.name
        );
    }
    let held = if echo { &cstats } else { &sstats };
    assert!(
        held.counters.backpressure.get() > 0,
        "the slow ring held the stage back"
    );
    assert_eq!(sstats.counters.snapshot().conns_closed, 1);
    assert_eq!(cstats.counters.snapshot().conns_closed, 1);
}

#[test]
fn sink_server_backpressure_reaches_the_sender_without_loss() {
    // 4000 x 1000 bytes: far more than the server's 256 KiB receive buffer.
    run_pair(ServerMode::Sink, 4000, 1000);
}

#[test]
fn echo_server_backpressure_reaches_the_sender_without_loss() {
    run_pair(ServerMode::Echo, 4000, 1000);
}
