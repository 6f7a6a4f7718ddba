mod common;
use common::*;
use dp_rds::path::PathId;
use dp_rds::sim::SimConfig;
const P0: PathId = PathId { conn: 0, index: 0 };
#[test]
fn dbg_reset() {
    let mut net = pair(ib(), SimConfig::default());
    let (s, _) = net.socket(0, sa(A, 4000));
    let (r, _) = net.socket(1, sa(B, 4001));
    for i in 0..20 {
        net.send_blocking(0, s, sa(B, 4001), &payload(11, i, 3000), 100_000).unwrap();
    }
    net.run_until(100_000, |net| net.engine(1).stats().recv_queued >= 5);
    assert!(net.reset_link(0, P0));
    let mut got = 0;
    for _ in 0..2000 {
        while net.recv(1, r).is_some() { got += 1; }
        if !net.step() { break; }
    }
    for n in 0..2 {
        let p = net.engine(n).path(P0).unwrap();
        eprintln!("node {n}: state {:?} sendq {} retrans {} inflight {} credits {:?} sending {} next_tx {} next_rx {}", p.state(), p.send_queue_len(), p.retrans_queue_len(), p.frames_in_flight(), p.credits(), p.is_sending(), p.next_tx_seq(), p.next_rx_seq());
        eprintln!("  ack {:?} max_sent {}", p.ack_state(), p.max_sent_seq());
    }
    eprintln!("got {got} sim {:?} now {:?}", net.stats, net.now);
}
