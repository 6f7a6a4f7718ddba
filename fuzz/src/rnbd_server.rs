//! The RNBD server session ([`ServerSession`]) against a hostile client: the fuzzer sends
//! any sequence of session-info, open, close and IO requests (well-formed ones with fuzzed
//! fields, or raw bytes), in either RTRS direction, with chunks of any size, against two
//! exported RAM disks and device names that try to leave the search path.
//!
//! Checked on every input:
//!
//! * no panic;
//! * nothing is written outside the request's chunk (a guard area after it must stay intact);
//! * an answer that claims success carries a well-formed response (`SESS_INFO_RSP` with a
//!   version no newer than ours, `OPEN_RSP` with the geometry of an exported device);
//! * a write-kind IO on a device the session opened read-only is refused with `EPERM`;
//!   an IO the server submits names an open device and comes back with its own tag;
//! * opens resolve only inside the search path (`..` is refused), and once the session has
//!   closed everything it opened, no export is left open.

use std::cell::RefCell;
use std::path::PathBuf;

use arbitrary::Arbitrary;
use dp_rnbd::backend::{Backend, BlkDone, MemBackend};
use dp_rnbd::export::{Exports, SearchPath};
use dp_rnbd::server::{Dir, ServerSession};
use dp_rnbd::wire::{AccessMode, Close, Io, Msg, Op, Open, PROTO_VER_MAJOR, Rw, SECTOR, SessInfo};

/// Bytes of each exported RAM disk.
const DISK: u64 = 256 << 10;
/// Guard bytes after every chunk.
const GUARD: usize = 64;
const CANARY: u8 = 0xA5;

/// Names a hostile client tries (two real devices, escapes, empty, a near miss).
const NAMES: [&[u8]; 7] = [
    b"disk0",
    b"disk1",
    b"../mem/disk0",
    b"disk0/../disk1",
    b"",
    b"disk2",
    b"/mem/disk0",
];

/// One fuzz input.
#[derive(Arbitrary, Debug)]
pub struct Input {
    ops: Vec<Req>,
}

/// One request of the client.
#[derive(Arbitrary, Debug)]
enum Req {
    SessInfo {
        ver: u8,
        write_dir: bool,
    },
    Open {
        mode: u8,
        name: u8,
        raw_name: Option<Vec<u8>>,
        write_dir: bool,
        chunk: u16,
    },
    Close {
        dev: u32,
        read_dir: bool,
    },
    Io {
        dev: u32,
        sector: u64,
        op: u8,
        flags: u32,
        bi_size: u32,
        prio: u16,
        read_dir: bool,
        chunk: u16,
        truncate: u8,
    },
    Raw {
        bytes: Vec<u8>,
        read_dir: bool,
        chunk: u16,
    },
}

thread_local! {
    /// The exports live across inputs (a RAM disk per input would dominate the run time);
    /// each input closes what it opened, which is checked.
    static EXPORTS: RefCell<Exports<MemBackend>> = RefCell::new(exports());
}

fn exports() -> Exports<MemBackend> {
    let mut e = Exports::new(SearchPath::new("/mem").expect("search path"));
    for name in ["disk0", "disk1"] {
        let path = format!("/mem/{name}");
        e.add(
            path.as_str(),
            MemBackend::new(&format!("fuzz-rnbd-{name}"), DISK, 8).expect("RAM disk"),
        );
    }
    e
}

/// Runs one input.
pub fn run(input: &Input) {
    EXPORTS.with(|e| {
        let mut e = e.borrow_mut();
        let mut s = ServerSession::new("fuzz");
        for (tag, req) in input.ops.iter().enumerate() {
            one(&mut s, &mut e, tag as u64, req);
        }
        // Close everything the session has open, as its disconnect does.
        let open: Vec<u32> = s.devices().keys().collect();
        for id in open {
            let mut m = [0u8; Close::LEN];
            Close { device_id: id }.emit(&mut m);
            let r = request(&mut s, &mut e, u64::MAX, Dir::Write, &m, 0);
            assert_eq!(r.answer, 0, "closing open device {id}");
        }
        for (path, d) in e.iter() {
            assert_eq!(d.open_count(), 0, "{} left open", path.display());
        }
    });
}

fn one(s: &mut ServerSession, e: &mut Exports<MemBackend>, tag: u64, req: &Req) {
    let dir = |read: bool| if read { Dir::Read } else { Dir::Write };
    match req {
        Req::SessInfo { ver, write_dir } => {
            let mut m = [0u8; SessInfo::LEN];
            SessInfo { ver: *ver }.emit(&mut m);
            let r = request(s, e, tag, dir(!write_dir), &m, 4096);
            if r.answer == 0 {
                match Msg::parse(&r.chunk) {
                    Ok(Msg::SessInfoRsp(rsp)) => {
                        assert!(rsp.ver <= PROTO_VER_MAJOR && rsp.ver <= *ver);
                    }
                    other => panic!("SESS_INFO answered 0 with {other:?}"),
                }
            }
        }
        Req::Open {
            mode,
            name,
            raw_name,
            write_dir,
            chunk,
        } => {
            let dev_name: &[u8] = match raw_name {
                Some(raw) => &raw[..raw.len().min(255)],
                None => NAMES[usize::from(*name) % NAMES.len()],
            };
            let Some(access_mode) =
                Some(AccessMode::from(*mode % 4)).filter(|m| !matches!(m, AccessMode::Unknown(_)))
            else {
                let mut m = [0u8; Open::LEN];
                Open {
                    access_mode: AccessMode::Ro,
                    dev_name,
                }
                .emit(&mut m);
                m[4] = *mode;
                let r = request(s, e, tag, dir(!write_dir), &m, usize::from(*chunk));
                assert_ne!(r.answer, 0, "an unknown access mode was accepted");
                return;
            };
            let mut m = [0u8; Open::LEN];
            Open {
                access_mode,
                dev_name,
            }
            .emit(&mut m);
            let before: Vec<u32> = s.devices().keys().collect();
            let r = request(s, e, tag, dir(!write_dir), &m, usize::from(*chunk));
            if r.answer == 0 {
                assert!(!write_dir, "an OPEN sent as an RTRS WRITE was accepted");
                let Ok(Msg::OpenRsp(rsp)) = Msg::parse(&r.chunk) else {
                    panic!("OPEN answered 0 without an OPEN_RSP");
                };
                assert_eq!(rsp.nsectors, DISK / SECTOR);
                let d = s
                    .devices()
                    .get(&rsp.device_id)
                    .expect("OPEN_RSP names a device the session does not have open");
                assert!(
                    d.path == PathBuf::from("/mem/disk0") || d.path == PathBuf::from("/mem/disk1"),
                    "opened {} outside the exports",
                    d.path.display()
                );
            } else {
                // A refused open leaves the session's devices as they were.
                let mut after: Vec<u32> = s.devices().keys().collect();
                let mut b = before;
                b.sort_unstable();
                after.sort_unstable();
                assert_eq!(b, after, "a refused open changed the session's devices");
            }
        }
        Req::Close { dev, read_dir } => {
            let id = dev % 4;
            let mut m = [0u8; Close::LEN];
            Close { device_id: id }.emit(&mut m);
            let had = s.devices().contains_key(&id);
            let r = request(s, e, tag, dir(*read_dir), &m, 0);
            if r.answer == 0 {
                assert!(had && !read_dir, "closed device {id} it did not have open");
                assert!(!s.devices().contains_key(&id));
            }
        }
        Req::Io {
            dev,
            sector,
            op,
            flags,
            bi_size,
            prio,
            read_dir,
            chunk,
            truncate,
        } => {
            let device_id = if dev & 0x8000_0000 != 0 {
                *dev
            } else {
                dev % 4
            };
            let io = Io {
                device_id,
                // Mostly inside the disk, sometimes anywhere.
                sector: if sector & 1 == 0 {
                    (sector >> 1) % (DISK / SECTOR + 8)
                } else {
                    *sector
                },
                rw: Rw(u32::from(*op % 8) | (flags & !0xFF)),
                bi_size: if bi_size & 1 == 0 {
                    (bi_size >> 1) % (2 * 4096 + 1)
                } else {
                    *bi_size
                },
                prio: *prio,
            };
            let mut m = [0u8; Io::LEN];
            io.emit(&mut m);
            let len = Io::LEN - usize::from(*truncate) % 8;
            let mode = s.devices().get(&device_id).map(|d| d.mode);
            let r = request(s, e, tag, dir(*read_dir), &m[..len], usize::from(*chunk));
            let writes = !matches!(io.rw.op(), Op::Read);
            if mode == Some(AccessMode::Ro) && writes && io.rw.supported() && len >= Io::MIN_LEN {
                assert_eq!(r.answer, libc::EPERM, "a write-kind IO on a read-only open");
            }
            if r.answer == 0 {
                assert!(
                    mode.is_some(),
                    "IO on device {device_id}, not open, succeeded"
                );
            }
        }
        Req::Raw {
            bytes,
            read_dir,
            chunk,
        } => {
            request(s, e, tag, dir(*read_dir), bytes, usize::from(*chunk));
        }
    }
}

/// What a request came to.
struct Answered {
    /// 0 or an errno.
    answer: i32,
    /// The chunk as the server left it.
    chunk: Vec<u8>,
}

/// Hands one request to the session with a chunk of `chunk_len` bytes followed by a guard;
/// completes a submitted IO at once.
fn request(
    s: &mut ServerSession,
    e: &mut Exports<MemBackend>,
    tag: u64,
    dir: Dir,
    usr: &[u8],
    chunk_len: usize,
) -> Answered {
    let mut buf = vec![CANARY; chunk_len + GUARD];
    // SAFETY: `buf` holds chunk_len bytes (plus the guard) and nothing else touches it until
    // the request is answered, which happens before this function returns.
    let r = unsafe { s.handle(e, tag, dir, usr, buf.as_mut_ptr(), chunk_len) };
    let answer = match r {
        Some(errno) => errno,
        None => {
            let mut out = [BlkDone::default(); 8];
            let mut got = None;
            for (_, d) in e.iter_mut() {
                let n = d.backend.poll(&mut out);
                for done in &out[..n] {
                    assert!(got.is_none(), "one IO completed twice");
                    assert_eq!(done.tag, tag, "a completion with another request's tag");
                    got = Some(done.result);
                }
            }
            let result = got.expect("the server submitted an IO that no backend has");
            s.complete(result)
        }
    };
    assert!(
        buf[chunk_len..].iter().all(|&b| b == CANARY),
        "the server wrote past the {chunk_len}-byte chunk"
    );
    buf.truncate(chunk_len);
    Answered { answer, chunk: buf }
}
