//! One IO request on the client: what it is (kept per path, indexed by its permit, so it can
//! be rebuilt on another path: `rtrs_clt_io_req`), the size rules it must pass
//! (`rtrs_clt_request`, `rtrs_clt_write_req`, `rtrs_clt_read_req`), and the RTRS header it
//! carries behind its user message.

use crate::error::IoError;
use crate::permit::ConType;
use crate::wire::{Geometry, RdmaRead, RdmaReadRepr, RdmaWrite, RdmaWriteRepr, SgDesc};
use crate::work::Dir;

use super::io::{DataRef, Mapped};

/// Where a request is in its life on a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Posted; waiting for the server's response.
    Posted,
    /// Answered with this result; waiting for our `LOCAL_INV` of its one-shot key.
    Invalidating(Result<(), IoError>),
}

/// A request in flight on a path, in the slot of its permit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Req {
    /// The caller's cookie, returned with the completion.
    pub(crate) ctx: u64,
    pub(crate) dir: Dir,
    pub(crate) usr_len: u16,
    pub(crate) data: Option<DataRef>,
    pub(crate) con: ConType,
    pub(crate) lane: u16,
    /// The connection it was posted on.
    pub(crate) cid: u16,
    /// A one-shot key to invalidate before completing (per-IO registration).
    pub(crate) key: Option<u32>,
    pub(crate) phase: Phase,
}

/// Bytes of the RTRS header of a request (`hdr_len` of `rtrs_clt_request`): 8 + 16 per
/// descriptor for a READ (one descriptor if it moves data), 4 for a WRITE.
pub(crate) const fn hdr_len(dir: Dir, has_data: bool) -> u32 {
    match dir {
        Dir::Read => RdmaRead::<&[u8]>::hdr_len(if has_data { 1 } else { 0 }) as u32,
        Dir::Write => RdmaWrite::<&[u8]>::LEN as u32,
    }
}

/// The header-room rule, checked per path before anything is posted: user message plus
/// RTRS header must fit `max_hdr_size`.
///
/// # Errors
/// [`IoError::MsgSize`].
pub(crate) const fn check_hdr_room(
    dir: Dir,
    usr_len: u16,
    has_data: bool,
    max_hdr_size: u32,
) -> Result<(), IoError> {
    if usr_len as u32 + hdr_len(dir, has_data) > max_hdr_size {
        Err(IoError::MsgSize)
    } else {
        Ok(())
    }
}

/// The chunk rule: header + data + user message must fit the chunk. Returns the offset of
/// the RTRS header in the chunk (`data_len + usr_len`), which the immediate carries.
///
/// # Errors
/// [`IoError::MsgSize`].
pub(crate) const fn chunk_offset(
    g: &Geometry,
    dir: Dir,
    usr_len: u16,
    data_len: u32,
) -> Result<u32, IoError> {
    let hdr = hdr_len(dir, data_len != 0);
    let tsize = hdr as u64 + data_len as u64 + usr_len as u64;
    if tsize > g.chunk_size() as u64 {
        Err(IoError::MsgSize)
    } else {
        Ok(data_len + usr_len as u32)
    }
}

/// The RTRS header of a request, in its first `n` bytes.
pub(crate) fn header(
    dir: Dir,
    usr_len: u16,
    data_len: u32,
    mapped: Option<&Mapped>,
) -> ([u8; 24], usize) {
    let mut b = [0u8; 24];
    match dir {
        Dir::Write => {
            let r = RdmaWriteRepr { usr_len };
            r.emit(&mut b);
            (b, r.buffer_len())
        }
        Dir::Read => {
            let r = RdmaReadRepr {
                usr_len,
                need_inval: mapped.is_some_and(|m| m.register.is_some()),
                desc: mapped.map(|m| SgDesc {
                    addr: m.addr,
                    key: m.rkey,
                    len: data_len,
                }),
            };
            r.emit(&mut b);
            (b, r.buffer_len())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_size_rules() {
        let g = Geometry::new(512, 131_072).unwrap();
        assert_eq!(check_hdr_room(Dir::Read, 4072, true, 4096), Ok(()));
        assert_eq!(
            check_hdr_room(Dir::Read, 4073, true, 4096),
            Err(IoError::MsgSize)
        );
        assert_eq!(check_hdr_room(Dir::Write, 4092, true, 4096), Ok(()));
        assert_eq!(chunk_offset(&g, Dir::Write, 32, 4096), Ok(4128));
        assert_eq!(chunk_offset(&g, Dir::Write, 0, 131_068), Ok(131_068));
        assert_eq!(
            chunk_offset(&g, Dir::Write, 0, 131_069),
            Err(IoError::MsgSize)
        );
        assert_eq!(
            chunk_offset(&g, Dir::Read, 8, 131_040),
            Ok(131_048),
            "24 + 131040 + 8"
        );
        assert_eq!(
            chunk_offset(&g, Dir::Read, 9, 131_040),
            Err(IoError::MsgSize)
        );
        assert_eq!(
            chunk_offset(&g, Dir::Read, 9, 0),
            Ok(9),
            "no data: an 8-byte header"
        );
    }

    #[test]
    fn test_read_header_need_inval_only_with_one_shot_key() {
        let m = Mapped {
            addr: 0x1000,
            lkey: 1,
            rkey: 2,
            register: None,
        };
        let (b, n) = header(Dir::Read, 32, 4096, Some(&m));
        assert_eq!(n, 24);
        assert_eq!(
            &b[4..8],
            &[0, 0, 1, 0],
            "long-lived key: no NEED_INVAL, one descriptor"
        );
        let one_shot = Mapped {
            register: Some(7),
            ..m
        };
        let (b, _) = header(Dir::Read, 32, 4096, Some(&one_shot));
        assert_eq!(&b[4..6], &[1, 0], "NEED_INVAL");
        let (_, n) = header(Dir::Write, 32, 4096, Some(&m));
        assert_eq!(n, 4);
    }
}
