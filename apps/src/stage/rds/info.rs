//! What `dpctl rds-info` shows of a running RDS stage: the sections of Linux `rds-info`
//! (connections, sockets, counters) and the node's congestion maps, taken on the stage's own
//! lcore through its [`InfoSlot`] (see `stage/info.rs`).

use std::net::SocketAddr;

use dataplane::rds::node::RdsNode;
use dataplane::rds::{PathId, RdsSocket, TransportKind};
use serde_json::{Value, json};

use crate::stage::info::InfoSlot;

/// Ports of a congestion map listed by name (the count is always given).
const MAX_LISTED_PORTS: usize = 32;

impl InfoSlot {
    /// Takes a snapshot of `node` (the stage's socket is `sock`; a sender names its `dest`)
    /// and hands it over. Called from the stage's poll when [`Self::wanted`].
    pub(crate) fn answer_rds(
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
