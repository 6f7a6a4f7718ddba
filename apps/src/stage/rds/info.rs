//! What `dpctl rds-info` shows of a running RDS stage: the sections of Linux `rds-info`
//! (connections, sockets, counters) and the node's congestion maps, taken on the stage's own
//! lcore when the telemetry thread asks.
//!
//! A node belongs to its lcore (`&mut`), so the telemetry thread never touches it: it raises
//! the request flag of the stage's [`RdsInfoSlot`] and waits; the stage sees the flag on its
//! next poll (one relaxed load per poll when nobody asks), writes a snapshot into the slot and
//! lowers the flag. Building the snapshot allocates, on the lcore, once per operator request:
//! control path, not data path.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use dataplane::rds::node::RdsNode;
use dataplane::rds::{PathId, RdsSocket, TransportKind};
use serde_json::{Value, json};

use crate::stats::StageStats;

/// Ports of a congestion map listed by name (the count is always given).
const MAX_LISTED_PORTS: usize = 32;

/// The meeting point of one RDS stage and the telemetry thread.
#[derive(Debug)]
pub struct RdsInfoSlot {
    stats: Arc<StageStats>,
    want: AtomicBool,
    snap: Mutex<Option<Value>>,
}

impl RdsInfoSlot {
    pub(crate) fn new(stats: Arc<StageStats>) -> Arc<Self> {
        Arc::new(Self {
            stats,
            want: AtomicBool::new(false),
            snap: Mutex::new(None),
        })
    }

    /// The stage's name.
    pub fn stage(&self) -> &str {
        &self.stats.name
    }

    /// Asks the stage for a snapshot and waits up to `timeout` for it. A stage that has
    /// finished is polled no more: its answer says so.
    pub fn query(&self, timeout: Duration) -> Value {
        if self.stats.is_finished() {
            return json!({ "stage": self.stage(), "error": "the stage has finished; its node is no longer polled" });
        }
        *self.snap.lock().unwrap_or_else(PoisonError::into_inner) = None;
        // Release/Acquire: pairs with `publish`, which writes the snapshot before lowering
        // the flag.
        self.want.store(true, Ordering::Release);
        let t0 = Instant::now();
        while self.want.load(Ordering::Acquire) {
            if t0.elapsed() > timeout {
                self.want.store(false, Ordering::Relaxed);
                return json!({ "stage": self.stage(), "error": format!("no answer from the stage's lcore within {timeout:?}") });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        self.snap
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .unwrap_or_else(|| json!({ "stage": self.stage(), "error": "no snapshot" }))
    }

    /// Whether the telemetry thread is waiting for a snapshot.
    #[inline]
    pub(crate) fn wanted(&self) -> bool {
        // Relaxed: a hint checked every poll; `publish` orders the data.
        self.want.load(Ordering::Relaxed)
    }

    fn publish(&self, v: Value) {
        *self.snap.lock().unwrap_or_else(PoisonError::into_inner) = Some(v);
        self.want.store(false, Ordering::Release);
    }

    /// Takes a snapshot of `node` (the stage's socket is `sock`; a sender names its `dest`)
    /// and hands it over. Called from the stage's poll when [`Self::wanted`].
    pub(crate) fn answer(
        &self,
        node: &mut RdsNode,
        sock: RdsSocket,
        role: &str,
        dest: Option<SocketAddr>,
    ) {
        self.publish(snapshot(self.stage(), node, sock, role, dest));
    }
}

fn transport_name(k: TransportKind) -> &'static str {
    match k {
        TransportKind::Ib => "infiniband",
        TransportKind::Tcp => "tcp",
        _ => "loopback",
    }
}

fn snapshot(
    stage: &str,
    node: &mut RdsNode,
    sock: RdsSocket,
    role: &str,
    dest: Option<SocketAddr>,
) -> Value {
    let e = node.engine();
    let mut conns = Vec::new();
    for (conn, key, npaths) in e.connections() {
        // rds-info lists path 0 of each connection, as RDS_INFO_CONNECTIONS does.
        let Some(p) = e.path(PathId { conn, index: 0 }) else {
            continue;
        };
        let state = p.state();
        let up = p.is_up();
        let connecting = state.name() == "CONNECTING";
        let mut flags = String::new();
        flags.push(if p.is_sending() { 's' } else { '-' });
        flags.push(if connecting { 'c' } else { '-' });
        flags.push(if up { 'C' } else { '-' });
        let (_, credits_send, credits_post) = p.credits();
        conns.push(json!({
            "local_addr": key.laddr.ip(),
            "remote_addr": key.faddr.ip(),
            "tos": key.tos,
            "transport": transport_name(key.transport),
            "next_tx_seq": p.next_tx_seq(),
            "next_rx_seq": p.next_rx_seq(),
            "flags": flags,
            "state": state.name(),
            "paths": npaths,
            "send_queue": p.send_queue_len(),
            "retrans_queue": p.retrans_queue_len(),
            "credits": { "send": credits_send, "posted": credits_post },
        }));
    }
    let bound = e.local_addr(sock).ok();
    let (unacked, unread) = e.queued_bytes(sock).unwrap_or((0, 0));
    let socket = json!({
        "bound_addr": bound.map(|a| a.ip()),
        "bound_port": bound.map(|a| a.port()),
        "conn_addr": dest.map(|a| a.ip()),
        "conn_port": dest.map(|a| a.port()),
        "sndbuf": e.sndbuf(sock).unwrap_or(0),
        "rcvbuf": e.rcvbuf(sock).unwrap_or(0),
        "unacked_bytes": unacked,
        "unread_bytes": unread,
    });
    let mut cong = Vec::new();
    for (ip, local, map) in e.congestion_maps() {
        let ports: Vec<u16> = (0..=u16::MAX)
            .filter(|&p| map.test(p))
            .take(MAX_LISTED_PORTS)
            .collect();
        cong.push(json!({
            "addr": ip,
            "local": local,
            "congested_ports": map.count(),
            "ports": ports,
        }));
    }
    let local: Vec<_> = e.local_addrs().collect();
    let mut counters: Vec<(&'static str, u64)> = e.stats().iter().collect();
    if let Some(t) = node.transport_mut(TransportKind::Ib) {
        t.counters(&mut |k, x| counters.push((k, x)));
    }
    let counters: serde_json::Map<String, Value> = counters
        .into_iter()
        .map(|(k, v)| (k.to_owned(), json!(v)))
        .collect();
    json!({
        "stage": stage,
        "role": role,
        "local_addrs": local,
        "connections": conns,
        "sockets": [socket],
        "counters": counters,
        "congestion": cong,
    })
}
