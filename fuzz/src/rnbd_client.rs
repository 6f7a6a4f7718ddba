//! The RNBD client session ([`ClientSession`]) against a hostile server and a failing
//! transport: the fuzzer is the server and the driver. It completes the client's requests
//! in any order with any status and any answer bytes (well-formed responses with fuzzed
//! fields, or raw bytes), completes tags nobody sent, refuses submissions, takes the link
//! down and up, while the user maps, unmaps, remaps and issues every kind of IO.
//!
//! Checked on every input:
//!
//! * no panic;
//! * every message the client hands the transport parses, and an IO's data length is its
//!   buffer's; two requests in flight never share a tag;
//! * a device is only reported mapped with a geometry the module doc promises (logical block
//!   a power of two from 512 B to 64 KiB, size in bytes representable, largest IO within
//!   the transport's);
//! * every IO the client accepted completes exactly once: during the input, or when the
//!   fuzzer stops and every request still in flight is completed.

use std::collections::HashSet;

use arbitrary::Arbitrary;
use dp_rnbd::client::{
    Buf, ClientEvent, ClientSession, ClientTransport, Con, DevId, Payload, SubmitError, WriteFlags,
};
use dp_rnbd::server::Dir;
use dp_rnbd::wire::{AccessMode, Io, Msg, OpenRsp, SessInfoRsp};

/// The transport's largest request.
const MAX_IO: u32 = 128 << 10;

/// One fuzz input.
#[derive(Arbitrary, Debug)]
pub struct Input {
    ops: Vec<Op>,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Start,
    Map {
        name: u8,
        mode: u8,
    },
    Unmap {
        dev: u8,
    },
    Remap {
        dev: u8,
    },
    Read {
        dev: u8,
        sector: u64,
        len: u32,
    },
    Write {
        dev: u8,
        sector: u64,
        len: u32,
        fua: bool,
        preflush: bool,
    },
    Flush {
        dev: u8,
    },
    Discard {
        dev: u8,
        sector: u64,
        n: u32,
    },
    WriteZeroes {
        dev: u8,
        sector: u64,
        n: u32,
    },
    Complete {
        which: u8,
        status: i8,
        answer: Answer,
    },
    CompleteUnknown {
        tag: u64,
        status: i8,
    },
    Refuse {
        how: Option<bool>,
    },
    LinkDown,
    LinkUp,
    Pump,
}

/// What the server leaves in the client's buffer.
#[derive(Arbitrary, Debug)]
enum Answer {
    /// The right response with sane fields.
    Good,
    /// An `OPEN_RSP` with these fields.
    Open {
        device_id: u32,
        nsectors: u64,
        max_hw_sectors: u32,
        max_write_zeroes_sectors: u32,
        max_discard_sectors: u32,
        physical_block_size: u16,
        logical_block_size: u16,
        cache_policy: u8,
        cut: u8,
    },
    /// A `SESS_INFO_RSP` with this version.
    Sess { ver: u8 },
    /// Anything.
    Raw(Vec<u8>),
}

/// One request in flight.
#[derive(Debug)]
struct Sent {
    tag: u64,
    kind: Kind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    SessInfo,
    Open,
    Other,
}

/// The fake transport.
#[derive(Default)]
struct Net {
    in_flight: Vec<Sent>,
    refuse: Option<SubmitError>,
}

impl ClientTransport for Net {
    fn submit(
        &mut self,
        tag: u64,
        _con: Con,
        _dir: Dir,
        usr: &[u8],
        payload: Payload,
    ) -> Result<(), SubmitError> {
        if let Some(e) = self.refuse {
            return Err(e);
        }
        assert!(
            self.in_flight.iter().all(|s| s.tag != tag),
            "tag {tag} is already in flight"
        );
        let msg = Msg::parse(usr).expect("the client sent a message that does not parse");
        let kind = match msg {
            Msg::SessInfo(_) => Kind::SessInfo,
            Msg::Open(_) => Kind::Open,
            Msg::Io(Io { bi_size, .. }) => {
                if let Payload::Data(b) = payload {
                    assert_eq!(b.len, bi_size, "IO length is not its buffer's");
                }
                Kind::Other
            }
            Msg::Close(_) => Kind::Other,
            other => panic!("the client sent a server's message: {other:?}"),
        };
        self.in_flight.push(Sent { tag, kind });
        Ok(())
    }
}

/// The user's side: devices handed out and IOs waiting for completion.
#[derive(Default)]
struct User {
    devs: Vec<DevId>,
    outstanding: HashSet<u64>,
    next_ctx: u64,
}

/// Runs one input.
pub fn run(input: &Input) {
    let mut c = ClientSession::new(MAX_IO);
    let mut net = Net::default();
    let mut user = User::default();
    for op in &input.ops {
        step(&mut c, &mut net, &mut user, op);
        events(&mut c, &mut user);
    }
    // The server answers everything still in flight; the client's IOs must all complete.
    net.refuse = None;
    c.link_up(&mut net);
    for _ in 0..64 {
        c.pump(&mut net);
        events(&mut c, &mut user);
        if net.in_flight.is_empty() {
            break;
        }
        while let Some(s) = net.in_flight.pop() {
            let a = good(s.kind, 0);
            c.complete(s.tag, 0, &a, &mut net);
            events(&mut c, &mut user);
        }
    }
    assert!(
        net.in_flight.is_empty(),
        "requests keep coming with nothing new to do"
    );
    assert!(
        user.outstanding.is_empty(),
        "IOs accepted and never completed: {:?}",
        user.outstanding
    );
}

fn dev(user: &User, i: u8) -> Option<DevId> {
    (!user.devs.is_empty()).then(|| user.devs[usize::from(i) % user.devs.len()])
}

fn step(c: &mut ClientSession, net: &mut Net, user: &mut User, op: &Op) {
    let ctx = user.next_ctx;
    let buf = |len: u32| Buf {
        region: 0,
        offset: 0,
        len,
    };
    let accepted = match op {
        Op::Start => {
            let _ = c.start(net);
            None
        }
        Op::Map { name, mode } => {
            let names: [&[u8]; 4] = [b"disk0", b"disk1", b"", b"../x"];
            let mode = AccessMode::from(mode % 3);
            if let Ok(d) = c.map(names[usize::from(*name) % names.len()], mode, net) {
                user.devs.push(d);
            }
            None
        }
        Op::Unmap { dev: i } => {
            if let Some(d) = dev(user, *i) {
                let _ = c.unmap(d, net);
            }
            None
        }
        Op::Remap { dev: i } => {
            if let Some(d) = dev(user, *i) {
                let _ = c.remap(d, net);
            }
            None
        }
        Op::Read {
            dev: i,
            sector,
            len,
        } => dev(user, *i).map(|d| c.read(d, *sector, buf(len % (2 * MAX_IO)), ctx, net)),
        Op::Write {
            dev: i,
            sector,
            len,
            fua,
            preflush,
        } => dev(user, *i).map(|d| {
            let flags = WriteFlags {
                fua: *fua,
                preflush: *preflush,
                sync: false,
            };
            c.write(d, *sector, buf(len % (2 * MAX_IO)), flags, ctx, net)
        }),
        Op::Flush { dev: i } => dev(user, *i).map(|d| c.flush(d, ctx, net)),
        Op::Discard { dev: i, sector, n } => {
            dev(user, *i).map(|d| c.discard(d, *sector, *n, ctx, net))
        }
        Op::WriteZeroes { dev: i, sector, n } => {
            dev(user, *i).map(|d| c.write_zeroes(d, *sector, *n, ctx, net))
        }
        Op::Complete {
            which,
            status,
            answer,
        } => {
            if !net.in_flight.is_empty() {
                let k = usize::from(*which) % net.in_flight.len();
                let s = net.in_flight.swap_remove(k);
                let status = i32::from(*status);
                let bytes = match answer {
                    Answer::Good => good(s.kind, status),
                    Answer::Open {
                        device_id,
                        nsectors,
                        max_hw_sectors,
                        max_write_zeroes_sectors,
                        max_discard_sectors,
                        physical_block_size,
                        logical_block_size,
                        cache_policy,
                        cut,
                    } => {
                        let mut b = vec![0u8; OpenRsp::LEN];
                        OpenRsp {
                            device_id: *device_id,
                            nsectors: *nsectors,
                            max_hw_sectors: *max_hw_sectors,
                            max_write_zeroes_sectors: *max_write_zeroes_sectors,
                            max_discard_sectors: *max_discard_sectors,
                            physical_block_size: *physical_block_size,
                            logical_block_size: *logical_block_size,
                            cache_policy: *cache_policy,
                            ..OpenRsp::default()
                        }
                        .emit(&mut b);
                        b.truncate(OpenRsp::LEN - usize::from(*cut) % 4 * 10);
                        b
                    }
                    Answer::Sess { ver } => {
                        let mut b = vec![0u8; SessInfoRsp::LEN];
                        SessInfoRsp { ver: *ver }.emit(&mut b);
                        b
                    }
                    Answer::Raw(b) => b.clone(),
                };
                c.complete(s.tag, status, &bytes, net);
            }
            None
        }
        Op::CompleteUnknown { tag, status } => {
            if net.in_flight.iter().all(|s| s.tag != *tag) {
                c.complete(*tag, i32::from(*status), &[], net);
            }
            None
        }
        Op::Refuse { how } => {
            net.refuse = how.map(|busy| {
                if busy {
                    SubmitError::Busy
                } else {
                    SubmitError::NoPath
                }
            });
            None
        }
        Op::LinkDown => {
            c.link_down();
            None
        }
        Op::LinkUp => {
            c.link_up(net);
            None
        }
        Op::Pump => {
            c.pump(net);
            None
        }
    };
    if let Some(Ok(())) = accepted {
        user.outstanding.insert(ctx);
        user.next_ctx += 1;
    }
}

/// A well-formed answer for a request of `kind` (a sane RAM disk for opens).
fn good(kind: Kind, status: i32) -> Vec<u8> {
    match kind {
        Kind::SessInfo => {
            let mut b = vec![0u8; SessInfoRsp::LEN];
            SessInfoRsp { ver: 2 }.emit(&mut b);
            b
        }
        Kind::Open => {
            let mut b = vec![0u8; OpenRsp::LEN];
            OpenRsp {
                device_id: status.unsigned_abs() % 4,
                nsectors: 2048,
                max_hw_sectors: 256,
                max_write_zeroes_sectors: 256,
                max_discard_sectors: 256,
                physical_block_size: 4096,
                logical_block_size: 512,
                cache_policy: 3,
                ..OpenRsp::default()
            }
            .emit(&mut b);
            b
        }
        Kind::Other => Vec::new(),
    }
}

fn events(c: &mut ClientSession, user: &mut User) {
    while let Some(e) = c.poll_event() {
        match e {
            ClientEvent::Mapped { geometry: g, .. } => {
                assert!(
                    g.logical_block.is_power_of_two() && (512..=65536).contains(&g.logical_block),
                    "mapped with a logical block of {}",
                    g.logical_block
                );
                assert!(
                    g.nsectors.checked_mul(512).is_some(),
                    "size overflows bytes"
                );
                assert!(g.max_io <= MAX_IO, "largest IO beyond the transport's");
            }
            ClientEvent::IoDone { ctx, .. } => {
                assert!(
                    user.outstanding.remove(&ctx),
                    "IO {ctx} completed twice or was never accepted"
                );
            }
            _ => {}
        }
    }
}
