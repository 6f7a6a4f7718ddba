//! RDS-TCP reassembly: a hostile peer's byte stream, cut into arbitrary chunks, fed to an
//! engine's stream path (`RdsEngine::handle_stream_bytes`, what `dp_rds::tcp` does with
//! every `read`). Never panics or loops; never takes more than it is given; a first
//! header with `h_len` above 1 MiB is always a counted violation that resets only that
//! path; after a violation the transport reconnects and reassembly starts clean; the
//! engine's memory is all back once the application has read everything.
#![no_main]
use std::net::{IpAddr, SocketAddr};

use dp_rds::path::PathId;
use dp_rds::store::FragConfig;
use dp_rds::wire::MAX_MSG_SIZE;
use dp_rds::{
    Accept, Incoming, RdsConfig, RdsEngine, RecvFlags, TransportCmd, TransportKind, TransportSpec,
};
use lcore::time::Instant;
use libfuzzer_sys::fuzz_target;
use mempool::memory::HugePolicy;

const US: &str = "10.0.0.2";
const PEER: &str = "10.0.0.1";

fn engine() -> RdsEngine {
    let mut e = RdsEngine::new(RdsConfig {
        name: "fuzz-rds-tcp".into(),
        transports: vec![TransportSpec {
            multipath: false,
            ..TransportSpec::tcp()
        }],
        frags: FragConfig {
            count: 512,
            rx_reserve: 64,
            huge: HugePolicy::Never,
            shareable: false,
        },
        msgs: 1024,
        max_sockets: 8,
        max_conns: 4,
        wmem_max: 4 << 20,
        rmem_max: 4 << 20,
        ..RdsConfig::default()
    })
    .expect("engine");
    e.add_local_addr(US.parse().unwrap());
    e
}

/// The peer (smaller address) dials us: the path is up.
fn accept(e: &mut RdsEngine, now: Instant) -> Option<PathId> {
    let req = Incoming {
        transport: TransportKind::Tcp,
        laddr: US.parse().unwrap(),
        faddr: PEER.parse().unwrap(),
        tos: 0,
        path_index: 0,
        private: &[],
    };
    match e.handle_incoming(now, req) {
        Accept::Yes { path, .. } => {
            e.handle_connected(now, path, &[]);
            Some(path)
        }
        Accept::No(_) => None,
    }
}

/// Runs the engine's outputs as a transport that writes everything at once.
fn drain(e: &mut RdsEngine, now: Instant, buf: &mut [u8], socks: &[dp_rds::RdsSocket]) {
    for _ in 0..64 {
        let mut any = false;
        while let Some(cmd) = e.poll_transport() {
            any = true;
            match cmd {
                TransportCmd::Disconnect { path } => e.handle_transport_down(now, path),
                TransportCmd::Connect { path, .. } => e.handle_connect_failed(now, path),
            }
        }
        while let Some((path, f)) = e.poll_transmit(now) {
            any = true;
            e.handle_send_complete(now, path, f.token);
        }
        for &s in socks {
            while e.recv_from(now, s, buf, RecvFlags::DONTWAIT).is_ok() {
                any = true;
            }
        }
        while e.poll_event().is_some() {}
        if !any {
            return;
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&chunk_seed, stream)) = data.split_first() else {
        return;
    };
    let mut e = engine();
    let mut now = Instant::ZERO;
    let socks: Vec<_> = [4001u16, 0, 1]
        .iter()
        .filter_map(|&p| {
            let s = e.socket().ok()?;
            e.set_transport(now, s, 2).ok()?;
            let us: IpAddr = US.parse().unwrap();
            e.bind(s, SocketAddr::new(us, p)).ok()?;
            e.set_rcvbuf(now, s, 4 << 20).ok()?;
            Some(s)
        })
        .collect();
    let mut buf = vec![0u8; MAX_MSG_SIZE + 64];
    let mut path = accept(&mut e, now).expect("first accept");
    let huge_first = stream.len() >= 48
        && u32::from_be_bytes(stream[16..20].try_into().unwrap()) as usize > MAX_MSG_SIZE;
    let chunk = usize::from(chunk_seed % 64) * 97 + 1;
    let mut rest = stream;
    let mut rounds = 0usize;
    while !rest.is_empty() {
        rounds += 1;
        assert!(rounds < 1_000_000, "no progress");
        let n = chunk.min(rest.len());
        let took = e.handle_stream_bytes(now, path, &rest[..n]);
        assert!(took <= n, "took {took} of {n}");
        rest = &rest[took..];
        now = now.saturating_add(std::time::Duration::from_micros(10));
        if e.poll_timeout().is_some_and(|t| t <= now) {
            e.handle_timeout(now);
        }
        drain(&mut e, now, &mut buf, &socks);
        if e.path_state(path) != Some(dp_rds::path::ConnState::Up) {
            // A violation reset the path: the transport closed the socket; the peer dials
            // again and its next bytes start a new stream.
            drain(&mut e, now, &mut buf, &socks);
            match accept(&mut e, now) {
                Some(p) => path = p,
                None => return,
            }
        } else if took == 0 && n > 0 {
            // Store full with nothing readable: only possible if the application did not
            // read, which `drain` does; count it as a stall and stop.
            break;
        }
    }
    if huge_first {
        assert!(
            e.stats().conn_violation >= 1,
            "a first header with h_len above 1 MiB was not a violation"
        );
    }
    // Everything read or dropped: reset the path and the store holds nothing.
    e.handle_transport_error(now, path);
    drain(&mut e, now, &mut buf, &socks);
    for s in socks {
        let _ = e.close(now, s);
    }
    drain(&mut e, now, &mut buf, &[]);
});
