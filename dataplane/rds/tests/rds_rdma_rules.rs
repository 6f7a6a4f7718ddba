//! The engine's RDMA rules over the simulator, with virtual time: notification when the
//! message's frames complete (before the ack, once),
//! never a retransmission (`RDS_RDMA_DROPPED` after a reset, while the other messages are
//! resent), use-once regions freed by the peer's extension header (and only the receiving
//! socket's), and `RDMA_DEST` delivery. The simulator's links carry frames only: moving
//! the bytes is the fabric transport's, proven over shm in `dataplane/tests/rds_rdma.rs`.
//! The engines get a key table of their own here (`Keys`), as a transport would plug in.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use dp_rds::engine::{RdmaMemory, RdmaNotify, Registered, cookie_key};
use dp_rds::sim::{SimConfig, SimNet};
use dp_rds::uapi::*;
use dp_rds::{RdsError, RdsSocket, Received, RecvFlags, SendCmsg, SendFlags, TransportKind};

/// Window addresses the engines believe in (nothing is read or written through them).
const WIN: u64 = 0x10_0000_0000;
const WIN_LEN: u64 = 16 << 20;

/// A key table: registrations by key, shared with the test to see what is live.
#[derive(Clone, Default)]
struct Keys(Arc<Mutex<Vec<u32>>>, u32);

impl RdmaMemory for Keys {
    fn register(&mut self, addr: u64, bytes: u64, _w: bool) -> Result<Registered, RdsError> {
        if addr < WIN || addr + bytes > WIN + WIN_LEN {
            return Err(RdsError::Fault("outside the window"));
        }
        self.1 += 0x101;
        self.0.lock().unwrap().push(self.1);
        Ok(Registered {
            rkey: self.1,
            offset: (addr - WIN) as u32,
        })
    }
    fn deregister(&mut self, rkey: u32) {
        self.0.lock().unwrap().retain(|&k| k != rkey);
    }
    fn window(&self) -> (u64, u64) {
        (WIN, WIN_LEN)
    }
}

struct Net {
    net: SimNet,
    keys: [Keys; 2],
    sa: RdsSocket,
    sb: RdsSocket,
}

fn net() -> Net {
    let mut net = pair(ib(), SimConfig::default());
    let keys = [Keys::default(), Keys::default()];
    for (n, k) in keys.iter().enumerate() {
        net.engine(n)
            .set_rdma_memory(TransportKind::Ib, Box::new(k.clone()))
            .unwrap();
    }
    let (sa_, _) = net.socket(0, sa(A, 4000));
    let (sb, _) = net.socket(1, sa(B, 4001));
    Net {
        net,
        keys,
        sa: sa_,
        sb,
    }
}

fn write_args(cookie: u64, token: u64) -> SendCmsg {
    SendCmsg::RdmaArgs {
        cookie,
        remote_addr: 0,
        remote_bytes: 4096,
        nr_local: 1,
        local_addr: WIN,
        local_bytes: 4096,
        flags: RDS_RDMA_READWRITE | RDS_RDMA_NOTIFY_ME,
        user_token: token,
    }
}

fn send(t: &mut Net, data: &[u8], cmsgs: &[SendCmsg]) {
    let now = t.net.now;
    let r = t.net.engine(0).send_msg(
        now,
        t.sa,
        Some(sa(B, 4001)),
        data,
        cmsgs,
        SendFlags::DONTWAIT,
    );
    assert_eq!(r, Ok(data.len()));
}

/// Everything node `n`'s socket has: messages and notifications, in order.
fn drain(t: &mut Net, n: usize, s: RdsSocket) -> (Vec<Vec<u8>>, Vec<RdmaNotify>) {
    let (mut msgs, mut notes) = (Vec::new(), Vec::new());
    let mut buf = [0u8; 256];
    loop {
        let now = t.net.now;
        match t
            .net
            .engine(n)
            .recv_from(now, s, &mut buf, RecvFlags::DONTWAIT)
        {
            Ok(Received::Data { len, .. }) => msgs.push(buf[..len].to_vec()),
            Ok(Received::RdmaStatus(st)) => notes.push(st),
            Ok(_) => {}
            Err(_) => return (msgs, notes),
        }
    }
}

fn drain_a(t: &mut Net) -> (Vec<Vec<u8>>, Vec<RdmaNotify>) {
    let s = t.sa;
    drain(t, 0, s)
}

fn drain_b(t: &mut Net) -> (Vec<Vec<u8>>, Vec<RdmaNotify>) {
    let s = t.sb;
    drain(t, 1, s)
}

#[test]
fn test_rdma_notify_success_and_use_once_freed_by_the_exthdr() {
    let mut t = net();
    let once = t
        .net
        .engine(1)
        .get_mr(t.sb, WIN, 4096, RDS_RDMA_READWRITE | RDS_RDMA_USE_ONCE)
        .unwrap();
    assert_eq!(t.keys[1].0.lock().unwrap().len(), 1);
    send(&mut t, b"rdma", &[write_args(once, 7)]);
    t.net.run_for(Duration::from_millis(10));
    let (msgs, _) = drain_b(&mut t);
    assert_eq!(msgs, vec![b"rdma".to_vec()]);
    assert!(
        t.keys[1].0.lock().unwrap().is_empty(),
        "the use-once region was deregistered when the header arrived"
    );
    assert_eq!(t.net.engine(1).stats().rdma_use_once_freed, 1);
    let (_, notes) = drain_a(&mut t);
    assert_eq!(
        notes,
        vec![RdmaNotify {
            user_token: 7,
            status: RDS_RDMA_SUCCESS
        }]
    );
}

#[test]
fn test_rdma_use_once_of_another_socket_is_not_freed() {
    let mut t = net();
    let (other, _) = t.net.socket(1, sa(B, 4002));
    let theirs = t
        .net
        .engine(1)
        .get_mr(other, WIN, 4096, RDS_RDMA_READWRITE | RDS_RDMA_USE_ONCE)
        .unwrap();
    // Sent to sb with a key sb does not own: the region of `other` stays.
    send(&mut t, b"x", &[write_args(theirs, 1)]);
    t.net.run_for(Duration::from_millis(10));
    assert_eq!(drain_b(&mut t).0.len(), 1);
    assert_eq!(*t.keys[1].0.lock().unwrap(), vec![cookie_key(theirs)]);
    assert_eq!(t.net.engine(1).stats().rdma_unuse_unknown_key, 1);
}

#[test]
fn test_rdma_message_not_retransmitted_after_reset_dropped_notified() {
    let mut t = net();
    // Connect first, so the next frames are in flight when the link dies.
    send(&mut t, b"hello", &[]);
    t.net.run_for(Duration::from_millis(10));
    assert_eq!(drain_b(&mut t).0, vec![b"hello".to_vec()]);
    send(&mut t, b"plain-1", &[]);
    send(&mut t, b"rdma", &[write_args(0x1234, 9)]);
    send(&mut t, b"plain-2", &[]);
    // B stops taking frames: they are sent and wait on the link, which then dies.
    t.net.stall(1, true);
    t.net.run_for(Duration::from_millis(1));
    assert!(t.net.reset_all() > 0);
    t.net.stall(1, false);
    t.net.run_for(Duration::from_millis(500));
    let (msgs, _) = drain_b(&mut t);
    assert_eq!(
        msgs,
        vec![b"plain-1".to_vec(), b"plain-2".to_vec()],
        "the plain messages are retransmitted, the RDMA one is not"
    );
    let (_, notes) = drain_a(&mut t);
    assert_eq!(
        notes,
        vec![RdmaNotify {
            user_token: 9,
            status: RDS_RDMA_DROPPED
        }]
    );
    assert_eq!(t.net.engine(0).stats().send_drop_flushed, 1);
}

#[test]
fn test_rdma_dest_cookie_is_delivered_with_the_message() {
    let mut t = net();
    let mine = t
        .net
        .engine(0)
        .get_mr(t.sa, WIN + 8192 + 5, 100, RDS_RDMA_READWRITE)
        .unwrap();
    send(&mut t, b"dest", &[SendCmsg::RdmaDest(mine)]);
    t.net.run_for(Duration::from_millis(10));
    let mut buf = [0u8; 16];
    let now = t.net.now;
    match t
        .net
        .engine(1)
        .recv_from(now, t.sb, &mut buf, RecvFlags::DONTWAIT)
    {
        Ok(Received::Data { rdma_dest, .. }) => assert_eq!(rdma_dest, Some(mine)),
        other => panic!("expected the message, got {other:?}"),
    }
}

#[test]
fn test_rdma_notified_at_completion_before_the_ack() {
    let mut t = net();
    send(&mut t, b"first", &[]);
    t.net.run_for(Duration::from_millis(10));
    assert_eq!(drain_b(&mut t).0.len(), 1);
    let acked = t.net.engine(0).stats().send_drop_acked;
    send(&mut t, b"rdma", &[write_args(0x99, 3)]);
    // Delivered (its frame completed) well inside the delayed-ack time.
    t.net.run_for(Duration::from_micros(100));
    let (_, notes) = drain_a(&mut t);
    assert_eq!(
        notes,
        vec![RdmaNotify {
            user_token: 3,
            status: RDS_RDMA_SUCCESS
        }],
        "reported when the message's SEND completed (the kernel's approach 3)"
    );
    assert_eq!(
        t.net.engine(0).stats().send_drop_acked,
        acked,
        "not acked yet"
    );
    // The ack comes later and reports nothing again.
    t.net.run_for(Duration::from_millis(10));
    assert!(t.net.engine(0).stats().send_drop_acked > acked);
    assert!(
        drain_a(&mut t).1.is_empty(),
        "one notification per operation"
    );
}
