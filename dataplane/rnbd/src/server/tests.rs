use super::*;
use crate::backend::{BlkDone, MemBackend};
use crate::export::SearchPath;
use crate::wire::{Open, Rw, SessInfo, SessInfoRsp};

fn exports() -> Exports<MemBackend> {
    let mut e = Exports::new(SearchPath::new("/mem").unwrap());
    e.add(
        "/mem/disk0",
        MemBackend::new("t-rnbd-srv", 1 << 20, 64).unwrap(),
    );
    e
}

/// Runs one request with a chunk of `chunk.len()` bytes; completes backend IOs at once.
fn req(
    s: &mut ServerSession,
    e: &mut Exports<MemBackend>,
    dir: Dir,
    usr: &[u8],
    chunk: &mut [u8],
) -> i32 {
    // SAFETY: chunk is a live exclusive buffer for the whole call (the backend completes
    // before we return).
    let r = unsafe { s.handle(e, 1, dir, usr, chunk.as_mut_ptr(), chunk.len()) };
    match r {
        Some(errno) => errno,
        None => {
            let path = PathBuf::from("/mem/disk0");
            let mut out = [BlkDone::default(); 1];
            let n = e.get_mut(&path).unwrap().backend.poll(&mut out);
            assert_eq!(n, 1, "the IO was not completed");
            s.complete(out[0].result)
        }
    }
}

fn open(
    s: &mut ServerSession,
    e: &mut Exports<MemBackend>,
    name: &[u8],
    mode: AccessMode,
) -> Result<OpenRsp, i32> {
    let mut m = [0u8; Open::LEN];
    Open {
        access_mode: mode,
        dev_name: name,
    }
    .emit(&mut m);
    let mut chunk = [0u8; 4096];
    match req(s, e, Dir::Read, &m, &mut chunk) {
        0 => match Msg::parse(&chunk[..OpenRsp::LEN]) {
            Ok(Msg::OpenRsp(r)) => Ok(r),
            other => panic!("{other:?}"),
        },
        errno => Err(errno),
    }
}

fn io(
    s: &mut ServerSession,
    e: &mut Exports<MemBackend>,
    dir: Dir,
    id: u32,
    rw: Rw,
    sector: u64,
    chunk: &mut [u8],
) -> i32 {
    let mut m = [0u8; Io::LEN];
    Io {
        device_id: id,
        sector,
        rw,
        bi_size: chunk.len() as u32,
        prio: 0,
    }
    .emit(&mut m);
    req(s, e, dir, &m, chunk)
}

#[test]
fn test_sess_info_answers_the_lower_version() {
    let mut e = exports();
    let mut s = ServerSession::new("s1");
    let mut m = [0u8; SessInfo::LEN];
    SessInfo { ver: 9 }.emit(&mut m);
    let mut chunk = [0u8; 64];
    assert_eq!(req(&mut s, &mut e, Dir::Read, &m, &mut chunk), 0);
    assert_eq!(
        Msg::parse(&chunk[..SessInfoRsp::LEN]),
        Ok(Msg::SessInfoRsp(SessInfoRsp {
            ver: PROTO_VER_MAJOR
        }))
    );
}

/// An open whose answer does not fit the client's chunk is refused and leaves nothing open
/// (found by the `rnbd_server` fuzz target: the device stayed open, and counted as the
/// export's one writer, behind an `EINVAL`).
#[test]
fn test_open_into_a_short_chunk_is_refused_and_opens_nothing() {
    let mut e = exports();
    let mut s = ServerSession::new("s1");
    let mut m = [0u8; Open::LEN];
    Open {
        access_mode: AccessMode::Rw,
        dev_name: b"disk0",
    }
    .emit(&mut m);
    let mut short = [0u8; OpenRsp::LEN - 1];
    assert_eq!(req(&mut s, &mut e, Dir::Read, &m, &mut short), libc::EINVAL);
    assert!(s.devices().is_empty());
    let path = PathBuf::from("/mem/disk0");
    assert_eq!(e.get(&path).unwrap().open_count(), 0);
    // The export's one writer slot is still free for another session.
    let mut other = ServerSession::new("s2");
    assert!(open(&mut other, &mut e, b"disk0", AccessMode::Rw).is_ok());
}

#[test]
fn test_open_write_read_close() {
    let mut e = exports();
    let mut s = ServerSession::new("s1");
    let rsp = open(&mut s, &mut e, b"disk0", AccessMode::Rw).unwrap();
    assert_eq!(rsp.nsectors, (1 << 20) / 512);
    assert_eq!(rsp.logical_block_size, 512);
    let mut w = vec![7u8; 4096];
    assert_eq!(
        io(
            &mut s,
            &mut e,
            Dir::Write,
            rsp.device_id,
            Rw::new(Op::Write, F_FUA),
            8,
            &mut w
        ),
        0
    );
    let mut r = vec![0u8; 4096];
    assert_eq!(
        io(
            &mut s,
            &mut e,
            Dir::Read,
            rsp.device_id,
            Rw::new(Op::Read, 0),
            8,
            &mut r
        ),
        0
    );
    assert_eq!(r, w);
    // Reopening the same name is the same device.
    assert_eq!(
        open(&mut s, &mut e, b"disk0", AccessMode::Rw)
            .unwrap()
            .device_id,
        rsp.device_id
    );
    let mut c = [0u8; Close::LEN];
    Close {
        device_id: rsp.device_id,
    }
    .emit(&mut c);
    assert_eq!(req(&mut s, &mut e, Dir::Write, &c, &mut []), 0);
    assert_eq!(
        io(
            &mut s,
            &mut e,
            Dir::Read,
            rsp.device_id,
            Rw::new(Op::Read, 0),
            8,
            &mut r
        ),
        libc::ENOTCONN
    );
}

fn close(s: &mut ServerSession, e: &mut Exports<MemBackend>, device_id: u32) -> i32 {
    let mut c = [0u8; Close::LEN];
    Close { device_id }.emit(&mut c);
    req(s, e, Dir::Write, &c, &mut [])
}

/// Device ids are the lowest free ones, as `rnbd-srv`'s `xa_alloc` gives them: an id closed
/// is given again to the next open, and then names the new device only.
#[test]
fn test_device_ids_are_lowest_free_and_a_closed_id_names_nothing() {
    let mut e = exports();
    e.add(
        "/mem/disk1",
        MemBackend::new("t-rnbd-srv1", 1 << 20, 64).unwrap(),
    );
    let mut s = ServerSession::new("s1");
    let a = open(&mut s, &mut e, b"disk0", AccessMode::Rw)
        .unwrap()
        .device_id;
    let b = open(&mut s, &mut e, b"disk1", AccessMode::Ro)
        .unwrap()
        .device_id;
    assert_eq!((a, b), (0, 1));
    assert_eq!(close(&mut s, &mut e, a), 0);
    assert_eq!(s.devices().len(), 1);
    assert!(!s.devices().contains_key(&a));
    let mut r = vec![0u8; 512];
    let read = Rw::new(Op::Read, 0);
    assert_eq!(
        io(&mut s, &mut e, Dir::Read, a, read, 0, &mut r),
        libc::ENOTCONN
    );
    // disk1 keeps its id; disk0 reopened gets the freed one back and is disk0 again.
    let a2 = open(&mut s, &mut e, b"disk0", AccessMode::Rw)
        .unwrap()
        .device_id;
    assert_eq!(a2, 0);
    assert_eq!(s.devices()[&a2].path, PathBuf::from("/mem/disk0"));
    assert_eq!(s.devices()[&b].path, PathBuf::from("/mem/disk1"));
    assert_eq!(io(&mut s, &mut e, Dir::Read, a2, read, 0, &mut r), 0);
    assert_eq!(s.devices().keys().collect::<Vec<_>>(), [0, 1]);
    assert_eq!(close(&mut s, &mut e, b), 0);
    assert_eq!(close(&mut s, &mut e, b), libc::ENOTCONN);
    assert_eq!(close(&mut s, &mut e, a2), 0);
    assert!(s.devices().is_empty());
    // A third device after both closed starts from 0 again.
    let c = open(&mut s, &mut e, b"disk1", AccessMode::Ro)
        .unwrap()
        .device_id;
    assert_eq!(c, 0);
}

#[test]
fn test_second_writer_is_eperm_and_readonly_cannot_write() {
    let mut e = exports();
    let mut a = ServerSession::new("a");
    let mut b = ServerSession::new("b");
    open(&mut a, &mut e, b"disk0", AccessMode::Rw).unwrap();
    assert_eq!(
        open(&mut b, &mut e, b"disk0", AccessMode::Rw),
        Err(libc::EPERM)
    );
    let ro = open(&mut b, &mut e, b"disk0", AccessMode::Ro).unwrap();
    let mut w = vec![1u8; 512];
    assert_eq!(
        io(
            &mut b,
            &mut e,
            Dir::Write,
            ro.device_id,
            Rw::new(Op::Write, 0),
            0,
            &mut w
        ),
        libc::EPERM
    );
    assert_eq!(
        open(&mut b, &mut e, b"../etc/passwd", AccessMode::Ro),
        Err(libc::EINVAL)
    );
    assert_eq!(
        open(&mut b, &mut e, b"disk9", AccessMode::Ro),
        Err(libc::ENOENT)
    );
}

#[test]
fn test_hostile_requests_are_refused_not_served() {
    let mut e = exports();
    let mut s = ServerSession::new("s1");
    let d = open(&mut s, &mut e, b"disk0", AccessMode::Rw)
        .unwrap()
        .device_id;
    let mut buf = vec![0u8; 4096];
    // Past the end of the device, sector overflowing a byte offset, unknown op, data
    // longer than the chunk, direction not matching the operation, garbage.
    assert_eq!(
        io(
            &mut s,
            &mut e,
            Dir::Read,
            d,
            Rw::new(Op::Read, 0),
            (1 << 20) / 512,
            &mut buf
        ),
        libc::EINVAL
    );
    assert_eq!(
        io(
            &mut s,
            &mut e,
            Dir::Read,
            d,
            Rw::new(Op::Read, 0),
            u64::MAX / 256,
            &mut buf
        ),
        libc::EINVAL
    );
    assert_eq!(
        io(&mut s, &mut e, Dir::Write, d, Rw(0x17), 0, &mut buf),
        libc::EOPNOTSUPP
    );
    let mut m = [0u8; Io::LEN];
    Io {
        device_id: d,
        sector: 0,
        rw: Rw::new(Op::Read, 0),
        bi_size: 8192,
        prio: 0,
    }
    .emit(&mut m);
    assert_eq!(req(&mut s, &mut e, Dir::Read, &m, &mut buf), libc::EINVAL);
    assert_eq!(
        io(
            &mut s,
            &mut e,
            Dir::Write,
            d,
            Rw::new(Op::Read, 0),
            0,
            &mut buf
        ),
        libc::EINVAL
    );
    assert_eq!(
        io(
            &mut s,
            &mut e,
            Dir::Read,
            77,
            Rw::new(Op::Read, 0),
            0,
            &mut buf
        ),
        libc::ENOTCONN
    );
    assert_eq!(
        req(&mut s, &mut e, Dir::Read, &[1, 2, 3], &mut buf),
        libc::EINVAL
    );
    let st = s.stats();
    assert!(
        st.malformed >= 3 && st.refused >= 2 && st.unknown_device == 1,
        "{st:?}"
    );
}

#[test]
fn test_discard_and_write_zeroes_are_dataless() {
    let mut e = exports();
    let mut s = ServerSession::new("s1");
    let d = open(&mut s, &mut e, b"disk0", AccessMode::Rw)
        .unwrap()
        .device_id;
    let mut w = vec![9u8; 4096];
    assert_eq!(
        io(
            &mut s,
            &mut e,
            Dir::Write,
            d,
            Rw::new(Op::Write, 0),
            0,
            &mut w
        ),
        0
    );
    let mut m = [0u8; Io::LEN];
    Io {
        device_id: d,
        sector: 0,
        rw: Rw::new(Op::Discard, 0),
        bi_size: 4096,
        prio: 0,
    }
    .emit(&mut m);
    assert_eq!(req(&mut s, &mut e, Dir::Write, &m, &mut []), 0);
    let mut r = vec![1u8; 4096];
    assert_eq!(
        io(
            &mut s,
            &mut e,
            Dir::Read,
            d,
            Rw::new(Op::Read, 0),
            0,
            &mut r
        ),
        0
    );
    assert!(r.iter().all(|&x| x == 0));
}

/// Each open device counts the IOs its session submitted to the backend, in sectors as a
/// block device's `stat` does (one the backend then fails is counted; one the session
/// refuses is not).
#[test]
fn test_device_counts_reads_and_writes_in_sectors() {
    let mut e = exports();
    let mut s = ServerSession::new("s1");
    let id = open(&mut s, &mut e, b"disk0", AccessMode::Rw)
        .unwrap()
        .device_id;
    let mut w = vec![1u8; 4096];
    let wr = Rw::new(Op::Write, 0);
    assert_eq!(io(&mut s, &mut e, Dir::Write, id, wr, 0, &mut w), 0);
    assert_eq!(io(&mut s, &mut e, Dir::Write, id, wr, 8, &mut w), 0);
    let mut r = vec![0u8; 1024];
    let rd = Rw::new(Op::Read, 0);
    assert_eq!(io(&mut s, &mut e, Dir::Read, id, rd, 0, &mut r), 0);
    // Out of range: submitted, failed by the backend.
    let mut far = vec![0u8; 512];
    let far_rc = io(&mut s, &mut e, Dir::Read, id, rd, 1 << 40, &mut far);
    assert_eq!(far_rc, libc::EINVAL);
    // The wrong direction for a write: refused by the session, not counted.
    assert_eq!(
        io(&mut s, &mut e, Dir::Read, id, wr, 0, &mut w),
        libc::EINVAL
    );
    let st = s.devices()[&id].stats;
    assert_eq!((st.writes, st.write_sectors), (2, 16));
    assert_eq!((st.reads, st.read_sectors), (2, 3));
    assert_eq!((st.flushes, st.discards), (0, 0));
}
