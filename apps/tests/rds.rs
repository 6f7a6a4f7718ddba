//! The RDS stages: their config checks, and the example pipelines run through the `dpctl`
//! binary (one process with both nodes, and two processes), every message counted.
//!
//! Runs take one lock so that at most two hybrid-mode lcores poll at a time (2-CPU CI).
//! Time limits are hang guards only.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use apps::config::{Config, Provider, StageKind};
use apps::summary::StopCause;
use common::{TempDir, dpctl, err, heavy, info, key_of, run_json, stage, summary, wait_socket};

const HEAD: &str = "[eal]\ncores = \"0-1\"\n\n[fabric]\nprovider = \"shm\"\n\n\
                    [ring.tx]\ncapacity = 64\n\n[ring.rx]\ncapacity = 64\n\n";

/// A generator, a sender, a receiver and a sink; `s` and `r` are appended to the sender and
/// the receiver.
fn rds(s: &str, r: &str) -> String {
    format!(
        "{HEAD}[stage.gen]\nkind = \"generator\"\nlcore = 0\noutput = \"tx\"\n\n\
         [stage.snd]\nkind = \"rds_sender\"\nlcore = 0\ninput = \"tx\"\n{s}\n\n\
         [stage.rcv]\nkind = \"rds_receiver\"\nlcore = 1\noutput = \"rx\"\n{r}\n\n\
         [stage.sink]\nkind = \"sink\"\nlcore = 1\ninput = \"rx\"\n"
    )
}

const OK_S: &str = "bind = \"10.0.0.1:0\"\ndest = \"10.0.0.2:4000\"";
const OK_R: &str = "bind = \"10.0.0.2:4000\"";

#[test]
fn rds_stages_parse_with_their_defaults() {
    let c = Config::parse(&rds(OK_S, OK_R), "t.toml").unwrap();
    let StageKind::RdsSender(s) = &c.stages[1].kind else {
        panic!("{:?}", c.stages[1].kind)
    };
    assert_eq!(s.input, "tx");
    assert_eq!(s.dest, "10.0.0.2:4000".parse().unwrap());
    assert_eq!(s.bind, "10.0.0.1:0".parse().unwrap());
    assert_eq!(s.sndbuf, 4 << 20);
    assert_eq!(s.burst, 32);
    let StageKind::RdsReceiver(r) = &c.stages[2].kind else {
        panic!("{:?}", c.stages[2].kind)
    };
    assert_eq!((r.senders, r.pool.as_deref(), r.verify), (None, None, true));
    assert_eq!(r.rcvbuf, 4 << 20);
    assert_eq!(c.stages[1].kind.inputs(), ["tx"]);
    assert_eq!(c.stages[2].kind.outputs(), ["rx"]);
    // RDS frames do not fit the rsocket default bounce buffer: a bigger default.
    let Some(Provider::Shm { bounce_bytes, .. }) = c.fabric.map(|f| f.provider) else {
        panic!("shm")
    };
    assert_eq!(bounce_bytes, 64 << 10);
}

#[test]
fn rds_mistakes_name_the_key_and_say_what_to_do() {
    let cases: &[(String, &str, &str)] = &[
        (
            rds(OK_S, OK_R).replace("[fabric]\nprovider = \"shm\"\n", ""),
            "kind",
            "need a [fabric] section",
        ),
        (
            rds("bind = \"10.0.0.1:0\"\ndest = \"10.0.0.1:4000\"", OK_R),
            "dest",
            "this stage's own address",
        ),
        (
            rds("bind = \"10.0.0.1:0\"\ndest = \"10.0.0.2:0\"", OK_R),
            "dest",
            "port 0",
        ),
        (
            rds("bind = \"10.0.0.1:0\"\ndest = \"nowhere\"", OK_R),
            "dest",
            "not an IP:port",
        ),
        (rds(OK_S, "bind = \"10.0.0.2:0\""), "bind", "fixed port"),
        (
            rds(
                "bind = \"10.0.0.2:0\"\ndest = \"10.0.0.3:4000\"",
                "bind = \"10.0.0.2:4000\"",
            ),
            "bind",
            "already binds 10.0.0.2",
        ),
        (
            rds(OK_S, &format!("{OK_R}\nsenders = 0")),
            "senders",
            "at least 1",
        ),
        (
            rds(&format!("{OK_S}\nsndbuf = 1000"), OK_R),
            "sndbuf",
            "outside",
        ),
        (
            rds(OK_S, &format!("{OK_R}\npool = \"nope\"")),
            "pool",
            "no pool `nope`",
        ),
        (rds(OK_S, &format!("{OK_R}\ndest = \"x\"")), "dest", ""),
        (rds("dest = \"10.0.0.2:4000\"", OK_R), "bind", ""),
        (
            rds(OK_S, OK_R).replace(
                "provider = \"shm\"\n",
                "provider = \"shm\"\nbounce_bytes = 4096\n",
            ),
            "bounce_bytes",
            "at least 4144",
        ),
    ];
    for (body, key, says) in cases {
        let e = err(body);
        assert_eq!(key_of(&e), *key, "{e}");
        assert!(e.to_string().contains(says), "{e}");
        assert!(e.to_string().starts_with("t.toml:"), "names the file: {e}");
    }
}

#[test]
fn example_rds_pair_delivers_every_message_and_ends_by_itself() {
    let _g = heavy();
    let dir = TempDir::new("rds", "pair");
    let s = summary(
        run_json(&mut dpctl(&dir.0), "rds-pair.toml", &[]),
        Duration::from_secs(60),
    );
    assert_eq!(s.stopped_by, StopCause::Finished, "{s:#?}");
    let n = 20_000;
    assert_eq!(stage(&s, "gen").counters.out_msgs, n);
    let snd = stage(&s, "sender").counters;
    assert_eq!((snd.in_msgs, snd.out_msgs, snd.dropped), (n, n, 0));
    let rcv = stage(&s, "receiver").counters;
    assert_eq!((rcv.in_msgs, rcv.out_msgs, rcv.dropped), (n, n, 0));
    assert_eq!(rcv.in_bytes, snd.out_bytes, "every byte crossed");
    let sink = stage(&s, "sink").counters;
    assert_eq!(sink.in_msgs, n);
    assert_eq!((sink.gaps, sink.dups, sink.verify_errors), (0, 0, 0));
    assert!(s.totals.lossless);
}

#[test]
fn example_rds_sender_and_receiver_across_two_processes() {
    let _g = heavy();
    let dir = TempDir::new("rds", "two");
    let receiver = run_json(
        &mut dpctl(&dir.0),
        "rds-receiver.toml",
        &["--duration", "60"],
    );
    // The sender may start first: RDS retries the connection until the receiver is there.
    let sender = summary(
        run_json(&mut dpctl(&dir.0), "rds-sender.toml", &["--duration", "1"]),
        Duration::from_secs(60),
    );
    let receiver = summary(receiver, Duration::from_secs(60));
    let sent = stage(&sender, "gen").counters.out_msgs;
    assert!(sent > 0);
    assert_eq!(stage(&sender, "sender").counters.out_msgs, sent);
    assert_eq!(
        receiver.stopped_by,
        StopCause::Finished,
        "the receiver ends when its one sender has ended its stream"
    );
    assert_eq!(stage(&receiver, "receiver").counters.in_msgs, sent);
    let sink = stage(&receiver, "sink");
    assert_eq!(sink.counters.in_msgs, sent);
    assert_eq!(
        (sink.counters.gaps, sink.counters.verify_errors),
        (0, 0),
        "payloads crossed two pools and the fabric intact, in order"
    );
    assert!(sink.latency_ns.is_some());
}

/// `dpctl rds-info ARGS --pid PID` in `dir`: its exit status, stdout and stderr.
fn rds_info(dir: &Path, pid: u32, args: &[&str]) -> (bool, String, String) {
    info(dir, "rds-info", pid, args)
}

#[test]
fn rds_info_shows_the_running_nodes_like_rds_info() {
    let _g = heavy();
    let dir = TempDir::new("rds", "info");
    let receiver = run_json(
        &mut dpctl(&dir.0),
        "rds-receiver.toml",
        &["--duration", "60"],
    );
    let sender = run_json(&mut dpctl(&dir.0), "rds-sender.toml", &["--duration", "3"]);
    wait_socket(&dir.0, receiver.id());
    wait_socket(&dir.0, sender.id());
    // The receiver's node once the sender's connection is up and messages arrived.
    let t0 = Instant::now();
    let node = loop {
        let (ok, out, err) = rds_info(&dir.0, receiver.id(), &["--json"]);
        assert!(ok, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let n = v[0].clone();
        let up = n["connections"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["state"] == "UP"));
        if up && n["counters"]["recv_queued"].as_u64().unwrap_or(0) > 0 {
            break n;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "never connected: {n}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(node["stage"], "receiver");
    assert_eq!(node["local_addrs"], serde_json::json!(["10.0.0.2"]));
    let sock = &node["sockets"][0];
    assert_eq!(
        (sock["bound_addr"].as_str(), sock["bound_port"].as_u64()),
        (Some("10.0.0.2"), Some(4000))
    );
    let conn = &node["connections"][0];
    assert_eq!(conn["remote_addr"], "10.0.0.1");
    assert_eq!(conn["transport"], "infiniband");
    assert!(conn["next_rx_seq"].as_u64().unwrap() > 1, "{conn}");
    assert!(node["counters"]["fabric_rx_frames"].as_u64().unwrap() > 0);
    let maps = node["congestion"].as_array().unwrap();
    assert!(
        maps.iter()
            .any(|m| m["addr"] == "10.0.0.2" && m["local"] == true),
        "{maps:?}"
    );
    // The text form: rds-info's sections and columns, and only the chosen ones.
    let (ok, text, err) = rds_info(&dir.0, receiver.id(), &[]);
    assert!(ok, "{err}");
    for want in [
        "== stage receiver (RDS receiver, node 10.0.0.2)",
        "CounterName",
        "recv_queued",
        "BoundAddr BPort",
        "LocalAddr      RemoteAddr",
        "Congestion maps:",
    ] {
        assert!(text.contains(want), "no `{want}` in:\n{text}");
    }
    let (ok, text, _) = rds_info(&dir.0, sender.id(), &["-n"]);
    assert!(ok);
    assert!(
        text.contains("RDS Connections:") && text.contains("10.0.0.2"),
        "{text}"
    );
    assert!(
        !text.contains("CounterName") && !text.contains("BoundAddr"),
        "{text}"
    );
    let (ok, _, err) = rds_info(&dir.0, sender.id(), &["--stage", "nope"]);
    assert!(!ok && err.contains("no RDS stage `nope`"), "{err}");
    let sender = summary(sender, Duration::from_secs(60));
    let receiver = summary(receiver, Duration::from_secs(60));
    assert_eq!(
        stage(&receiver, "sink").counters.in_msgs,
        stage(&sender, "gen").counters.out_msgs
    );
}

#[test]
fn rds_info_says_when_a_pipeline_has_no_rds_stages() {
    let _g = heavy();
    let dir = TempDir::new("rds", "none");
    let p = run_json(&mut dpctl(&dir.0), "pipeline.toml", &["--duration", "60"]);
    wait_socket(&dir.0, p.id());
    let (ok, _, err) = rds_info(&dir.0, p.id(), &[]);
    assert!(!ok);
    assert!(err.contains("has no RDS stages"), "{err}");
    // Ctrl-C, by pid, ends it.
    p.interrupt();
    summary(p, Duration::from_secs(30));
}

/// An RDS node of this test process owning `ip`, over shm in `dir`.
fn test_node(dir: &Path, ip: &str) -> dataplane::rds::node::RdsNode {
    use dataplane::fabric::shm::{Shm, ShmConfig, ShmDevice};
    use dataplane::rds::fabric::{FabricConfig, FabricTransport};
    use dataplane::rds::{RdsConfig, RdsEngine, TransportSpec};
    let mut cfg = RdsConfig {
        name: "dpctl-test-peer".into(),
        transports: vec![TransportSpec::ib()],
        seed: 0x5eed ^ u64::from(std::process::id()),
        ..RdsConfig::default()
    };
    cfg.frags.count = 256;
    cfg.frags.rx_reserve = 32;
    let mut e = RdsEngine::new(cfg).unwrap();
    e.add_local_addr(ip.parse().unwrap());
    let dev = ShmDevice::open(ShmConfig {
        dir: Some(dir.to_path_buf()),
        ..ShmConfig::default()
    })
    .unwrap();
    let t = FabricTransport::<Shm>::new(dev, &e, FabricConfig::default()).unwrap();
    let mut n = dataplane::rds::node::RdsNode::new(e);
    n.add_transport(Box::new(t)).unwrap();
    n
}

#[test]
fn receiver_drops_and_counts_hostile_datagrams() {
    use apps::msg::{HEADER_LEN, Msg, Pattern, encode_header};
    use dataplane::rds::node::RdsNode;
    use dataplane::rds::{PathId, RdsError, SendFlags};
    use lcore::time::{Clock, RealClock};

    let _g = heavy();
    let dir = TempDir::new("rds", "hostile");
    let receiver = run_json(
        &mut dpctl(&dir.0),
        "rds-receiver.toml",
        &["--duration", "60"],
    );
    // Its node listens before its telemetry socket appears.
    wait_socket(&dir.0, receiver.id());
    let clock = RealClock::new();
    let to: std::net::SocketAddr = "10.0.0.2:4000".parse().unwrap();
    // One good message, then what a hostile peer may send, then the end of the stream.
    let good = Msg {
        seq: 0,
        len: 64,
        pattern: Pattern::Zeros,
        ..Msg::default()
    };
    let mut frame = vec![0u8; 64];
    encode_header(&good, (&mut frame[..HEADER_LEN]).try_into().unwrap());
    let mut lying = frame.clone();
    lying.truncate(50); // the header says 64 bytes
    let garbage = vec![0xA5u8; 300];
    let short = vec![1u8; 3];
    // Sends `datagrams` from `s` and polls until all are acked or `limit` passes.
    let deliver = |n: &mut RdsNode, s, datagrams: &[&[u8]], limit: Duration| -> bool {
        let mut next = 0;
        let t0 = Instant::now();
        while t0.elapsed() < limit {
            let now = clock.now();
            n.poll(now);
            while n.engine_mut().poll_event().is_some() {}
            if next < datagrams.len() {
                match n
                    .engine_mut()
                    .send_to(now, s, Some(to), datagrams[next], SendFlags::DONTWAIT)
                {
                    Ok(_) => next += 1,
                    Err(e) => assert!(matches!(e, RdsError::WouldBlock), "{e}"),
                }
            } else if n.engine().queued_bytes(s).unwrap().0 == 0 {
                return true;
            }
            n.flush(now);
            std::thread::sleep(Duration::from_micros(100));
        }
        false
    };
    // The good message first (it also brings the connection up), then the rest.
    let mut n = test_node(&dir.0, "10.0.0.1");
    let s = n.engine_mut().socket().unwrap();
    n.engine_mut()
        .bind(s, "10.0.0.1:0".parse().unwrap())
        .unwrap();
    assert!(
        deliver(&mut n, s, &[&frame], Duration::from_secs(30)),
        "the good message was not delivered"
    );
    let ok = deliver(
        &mut n,
        s,
        &[&lying, &garbage, &short, b"DPCTLEOS"],
        Duration::from_secs(30),
    );
    if !ok {
        // Say where the sender's path is and how the receiver ended.
        let e = n.engine();
        let mut state = format!("{:?}", e.path_state(PathId { conn: 0, index: 0 }));
        for (k, v) in e.stats().iter().filter(|(_, v)| *v != 0) {
            state += &format!(" {k}={v}");
        }
        let r = summary(receiver, Duration::from_secs(5));
        panic!("not delivered: sender path {state}; receiver {r:#?}");
    }
    // Keep the node up until the receiver has finished (its acks done), then stop polling.
    let t1 = Instant::now();
    while t1.elapsed() < Duration::from_millis(300) {
        n.poll(clock.now());
        std::thread::sleep(Duration::from_micros(200));
    }
    let r = summary(receiver, Duration::from_secs(60));
    assert_eq!(
        r.stopped_by,
        StopCause::Finished,
        "the end of stream counted"
    );
    let rcv = stage(&r, "receiver").counters;
    assert_eq!((rcv.in_msgs, rcv.dropped), (1, 3), "{rcv:?}");
    assert_eq!(stage(&r, "sink").counters.in_msgs, 1);
}
