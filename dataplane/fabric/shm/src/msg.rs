//! The shm provider's connection-management messages, exchanged over `SOCK_SEQPACKET` Unix
//! sockets (one datagram per message; descriptors travel as `SCM_RIGHTS`).
//!
//! Layout: an 8-byte header (`magic` u32 LE `"DPSH"`, `version` u8, `kind` u8, `len` u16 LE
//! payload length) followed by the payload. All integers are little-endian: both ends are
//! processes on the same host. Decoding never panics: every read is bounds-checked and a
//! malformed message is a [`DecodeError`], which the caller answers by dropping the
//! connection, as the RDMA CM drops malformed MADs.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use dp_fabric::traits::{MAX_PRIVATE_DATA, PrivateData};

/// Header magic, `"DPSH"`.
pub(crate) const MAGIC: u32 = u32::from_le_bytes(*b"DPSH");
/// Protocol version spoken here.
pub(crate) const VERSION: u8 = 2;
/// Header length.
pub(crate) const HDR_LEN: usize = 8;
/// Largest message (header + payload).
pub(crate) const MAX_MSG: usize = HDR_LEN + u16::MAX as usize;
/// Most descriptors one message carries (the kernel's `SCM_MAX_FD` is 253).
pub(crate) const MAX_FDS: usize = 250;
/// Most exported regions one endpoint description lists (3 descriptors are segments).
pub(crate) const MAX_REGIONS: usize = MAX_FDS - 3;

/// Why a message could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DecodeError {
    /// Shorter than its header or its declared payload.
    Truncated,
    /// Wrong magic: not our protocol.
    BadMagic,
    /// A version we do not speak.
    BadVersion,
    /// A kind we do not know.
    UnknownKind,
    /// A field holds an impossible value.
    Malformed,
}

/// One exported registration, as listed in an endpoint description or announced. Its
/// memfd travels in the same message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RegionDesc {
    /// Slot in the exporting protection domain's export table.
    pub slot: u32,
    /// Mapped length (the registration's pages).
    pub len: u64,
    /// Page size of the memfd (4 KiB or 2 MiB).
    pub page_size: u32,
    /// Whether peers may write it (a remote write right); otherwise it is mapped read-only
    /// (and sealed so that nothing else is possible).
    pub writable: bool,
}

/// What one side of a connection tells the other about itself. Descriptors, in order:
/// queue-pair segment, receive-CQ segment, key-table segment, then one per region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct EndpointInfo {
    /// The sender's device context id.
    pub ctx_id: u32,
    /// The sender's process id (for diagnostics).
    pub pid: u32,
    /// The sender's queue pair number.
    pub qpn: u32,
    /// Protection-domain id (unique within the context).
    pub pd_id: u64,
    /// Receive completion queue id (unique within the context).
    pub cq_id: u64,
    /// The queue pair's slot in its receive CQ's doorbell bitmap.
    pub cq_slot: u32,
    /// Size of the queue-pair segment.
    pub qp_seg_len: u64,
    /// Size of the CQ segment.
    pub cq_seg_len: u64,
    /// Size of the key-table segment.
    pub kt_seg_len: u64,
    /// Exported regions.
    pub regions: Vec<RegionDesc>,
}

/// A CM message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Msg {
    /// Connect request.
    Req {
        /// The requester's address.
        src: SocketAddr,
        /// The address it connects to.
        dst: SocketAddr,
        /// Requester endpoint.
        ep: EndpointInfo,
        /// Private data.
        pdata: PrivateData,
    },
    /// Accept.
    Rep {
        /// Responder endpoint.
        ep: EndpointInfo,
        /// Private data.
        pdata: PrivateData,
    },
    /// Reject.
    Rej {
        /// Private data.
        pdata: PrivateData,
    },
    /// Ready to use: the requester has mapped everything.
    Rtu,
    /// Disconnect request.
    Dreq,
    /// A new region was exported; its memfd is attached.
    MrAdd {
        /// Sequence number to acknowledge.
        seq: u64,
        /// The region.
        region: RegionDesc,
    },
    /// An exported registration ended: unmap export `slot`. Not acknowledged: the
    /// exporter no longer backs those pages with the memfd the peer holds.
    MrDel {
        /// Export slot.
        slot: u32,
    },
    /// The peer has mapped region announcement `seq`.
    MrAck {
        /// Sequence number.
        seq: u64,
    },
    /// Asks a context for the segments of one of its UD queue pairs.
    UdResolve {
        /// The UD queue pair.
        qpn: u32,
    },
    /// Answer: status 0 and the UD segment + CQ segment descriptors, or an errno.
    UdResolveRep {
        /// 0 or an errno.
        status: u32,
        /// The UD queue pair's Q_Key.
        qkey: u32,
        /// Its slot in its receive CQ's doorbell bitmap.
        cq_slot: u32,
        /// UD segment length.
        seg_len: u64,
        /// CQ segment length.
        cq_seg_len: u64,
    },
}

const K_REQ: u8 = 1;
const K_REP: u8 = 2;
const K_REJ: u8 = 3;
const K_RTU: u8 = 4;
const K_DREQ: u8 = 5;
const K_MR_ADD: u8 = 6;
const K_MR_ACK: u8 = 7;
const K_UD_RESOLVE: u8 = 8;
const K_UD_RESOLVE_REP: u8 = 9;
const K_MR_DEL: u8 = 10;

impl Msg {
    /// Number of descriptors that must accompany this message.
    pub(crate) fn fd_count(&self) -> usize {
        match self {
            Self::Req { ep, .. } | Self::Rep { ep, .. } => 3 + ep.regions.len(),
            Self::MrAdd { .. } => 1,
            Self::UdResolveRep { status: 0, .. } => 2,
            _ => 0,
        }
    }

    /// Encodes into `out` (cleared first).
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.push(VERSION);
        out.push(self.kind());
        out.extend_from_slice(&[0, 0]);
        match self {
            Self::Req {
                src,
                dst,
                ep,
                pdata,
            } => {
                put_addr(out, src);
                put_addr(out, dst);
                put_ep(out, ep);
                put_pdata(out, pdata);
            }
            Self::Rep { ep, pdata } => {
                put_ep(out, ep);
                put_pdata(out, pdata);
            }
            Self::Rej { pdata } => put_pdata(out, pdata),
            Self::Rtu | Self::Dreq => {}
            Self::MrAdd { seq, region } => {
                out.extend_from_slice(&seq.to_le_bytes());
                put_region(out, region);
            }
            Self::MrAck { seq } => out.extend_from_slice(&seq.to_le_bytes()),
            Self::MrDel { slot } => out.extend_from_slice(&slot.to_le_bytes()),
            Self::UdResolve { qpn } => out.extend_from_slice(&qpn.to_le_bytes()),
            Self::UdResolveRep {
                status,
                qkey,
                cq_slot,
                seg_len,
                cq_seg_len,
            } => {
                out.extend_from_slice(&status.to_le_bytes());
                out.extend_from_slice(&qkey.to_le_bytes());
                out.extend_from_slice(&cq_slot.to_le_bytes());
                out.extend_from_slice(&seg_len.to_le_bytes());
                out.extend_from_slice(&cq_seg_len.to_le_bytes());
            }
        }
        let len = (out.len() - HDR_LEN) as u16;
        out[6..8].copy_from_slice(&len.to_le_bytes());
    }

    fn kind(&self) -> u8 {
        match self {
            Self::Req { .. } => K_REQ,
            Self::Rep { .. } => K_REP,
            Self::Rej { .. } => K_REJ,
            Self::Rtu => K_RTU,
            Self::Dreq => K_DREQ,
            Self::MrAdd { .. } => K_MR_ADD,
            Self::MrAck { .. } => K_MR_ACK,
            Self::MrDel { .. } => K_MR_DEL,
            Self::UdResolve { .. } => K_UD_RESOLVE,
            Self::UdResolveRep { .. } => K_UD_RESOLVE_REP,
        }
    }

    /// Decodes one message. Never panics.
    pub(crate) fn decode(buf: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader { buf, pos: 0 };
        if r.u32()? != MAGIC {
            return Err(DecodeError::BadMagic);
        }
        if r.u8()? != VERSION {
            return Err(DecodeError::BadVersion);
        }
        let kind = r.u8()?;
        let len = usize::from(r.u16()?);
        if buf.len() != HDR_LEN + len {
            return Err(DecodeError::Truncated);
        }
        let msg = match kind {
            K_REQ => Self::Req {
                src: r.addr()?,
                dst: r.addr()?,
                ep: r.ep()?,
                pdata: r.pdata()?,
            },
            K_REP => Self::Rep {
                ep: r.ep()?,
                pdata: r.pdata()?,
            },
            K_REJ => Self::Rej { pdata: r.pdata()? },
            K_RTU => Self::Rtu,
            K_DREQ => Self::Dreq,
            K_MR_ADD => Self::MrAdd {
                seq: r.u64()?,
                region: r.region()?,
            },
            K_MR_ACK => Self::MrAck { seq: r.u64()? },
            K_MR_DEL => Self::MrDel { slot: r.u32()? },
            K_UD_RESOLVE => Self::UdResolve { qpn: r.u32()? },
            K_UD_RESOLVE_REP => Self::UdResolveRep {
                status: r.u32()?,
                qkey: r.u32()?,
                cq_slot: r.u32()?,
                seg_len: r.u64()?,
                cq_seg_len: r.u64()?,
            },
            _ => return Err(DecodeError::UnknownKind),
        };
        if r.pos != buf.len() {
            return Err(DecodeError::Malformed);
        }
        Ok(msg)
    }
}

fn put_addr(out: &mut Vec<u8>, a: &SocketAddr) {
    match a.ip() {
        IpAddr::V4(ip) => {
            out.push(4);
            let mut b = [0u8; 16];
            b[..4].copy_from_slice(&ip.octets());
            out.extend_from_slice(&b);
        }
        IpAddr::V6(ip) => {
            out.push(6);
            out.extend_from_slice(&ip.octets());
        }
    }
    out.extend_from_slice(&a.port().to_le_bytes());
}

fn put_region(out: &mut Vec<u8>, r: &RegionDesc) {
    out.extend_from_slice(&r.slot.to_le_bytes());
    out.extend_from_slice(&r.len.to_le_bytes());
    out.extend_from_slice(&r.page_size.to_le_bytes());
    out.push(u8::from(r.writable));
}

fn put_ep(out: &mut Vec<u8>, ep: &EndpointInfo) {
    out.extend_from_slice(&ep.ctx_id.to_le_bytes());
    out.extend_from_slice(&ep.pid.to_le_bytes());
    out.extend_from_slice(&ep.qpn.to_le_bytes());
    out.extend_from_slice(&ep.pd_id.to_le_bytes());
    out.extend_from_slice(&ep.cq_id.to_le_bytes());
    out.extend_from_slice(&ep.cq_slot.to_le_bytes());
    out.extend_from_slice(&ep.qp_seg_len.to_le_bytes());
    out.extend_from_slice(&ep.cq_seg_len.to_le_bytes());
    out.extend_from_slice(&ep.kt_seg_len.to_le_bytes());
    out.extend_from_slice(&(ep.regions.len() as u16).to_le_bytes());
    for r in &ep.regions {
        put_region(out, r);
    }
}

fn put_pdata(out: &mut Vec<u8>, p: &PrivateData) {
    let b = p.as_bytes();
    out.push(b.len() as u8);
    out.extend_from_slice(b);
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let end = self.pos.checked_add(N).ok_or(DecodeError::Truncated)?;
        let s = self.buf.get(self.pos..end).ok_or(DecodeError::Truncated)?;
        self.pos = end;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.take()?))
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.take()?))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.take()?))
    }
    fn addr(&mut self) -> Result<SocketAddr, DecodeError> {
        let fam = self.u8()?;
        let ip: [u8; 16] = self.take()?;
        let port = self.u16()?;
        let ip = match fam {
            4 => IpAddr::V4(Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3])),
            6 => IpAddr::V6(Ipv6Addr::from(ip)),
            _ => return Err(DecodeError::Malformed),
        };
        Ok(SocketAddr::new(ip, port))
    }
    fn region(&mut self) -> Result<RegionDesc, DecodeError> {
        let r = RegionDesc {
            slot: self.u32()?,
            len: self.u64()?,
            page_size: self.u32()?,
            writable: match self.u8()? {
                0 => false,
                1 => true,
                _ => return Err(DecodeError::Malformed),
            },
        };
        if r.len == 0
            || r.slot as usize >= MAX_REGIONS
            || !r.page_size.is_power_of_two()
            || !r.len.is_multiple_of(u64::from(r.page_size))
        {
            return Err(DecodeError::Malformed);
        }
        Ok(r)
    }
    fn ep(&mut self) -> Result<EndpointInfo, DecodeError> {
        let mut ep = EndpointInfo {
            ctx_id: self.u32()?,
            pid: self.u32()?,
            qpn: self.u32()?,
            pd_id: self.u64()?,
            cq_id: self.u64()?,
            cq_slot: self.u32()?,
            qp_seg_len: self.u64()?,
            cq_seg_len: self.u64()?,
            kt_seg_len: self.u64()?,
            regions: Vec::new(),
        };
        let n = usize::from(self.u16()?);
        if n > MAX_REGIONS {
            return Err(DecodeError::Malformed);
        }
        for _ in 0..n {
            ep.regions.push(self.region()?);
        }
        Ok(ep)
    }
    fn pdata(&mut self) -> Result<PrivateData, DecodeError> {
        let n = usize::from(self.u8()?);
        if n > MAX_PRIVATE_DATA {
            return Err(DecodeError::Malformed);
        }
        let end = self.pos.checked_add(n).ok_or(DecodeError::Truncated)?;
        let s = self.buf.get(self.pos..end).ok_or(DecodeError::Truncated)?;
        self.pos = end;
        PrivateData::new(s).ok_or(DecodeError::Malformed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ep() -> EndpointInfo {
        EndpointInfo {
            ctx_id: 7,
            pid: 1234,
            qpn: 0x7001,
            pd_id: 3,
            cq_id: 9,
            cq_slot: 17,
            qp_seg_len: 8192,
            cq_seg_len: 4096,
            kt_seg_len: 4096,
            regions: vec![RegionDesc {
                slot: 0,
                len: 1 << 21,
                page_size: 1 << 21,
                writable: true,
            }],
        }
    }

    #[test]
    fn roundtrip_every_kind() {
        let pd = PrivateData::new(&[1, 2, 3, 4]).unwrap();
        let msgs = [
            Msg::Req {
                src: "127.0.0.1:40000".parse().unwrap(),
                dst: "[::1]:7471".parse().unwrap(),
                ep: ep(),
                pdata: pd,
            },
            Msg::Rep {
                ep: ep(),
                pdata: pd,
            },
            Msg::Rej { pdata: pd },
            Msg::Rtu,
            Msg::Dreq,
            Msg::MrAdd {
                seq: 5,
                region: RegionDesc {
                    slot: 2,
                    len: 4096,
                    page_size: 4096,
                    writable: false,
                },
            },
            Msg::MrAck { seq: 5 },
            Msg::MrDel { slot: 2 },
            Msg::UdResolve { qpn: 99 },
            Msg::UdResolveRep {
                status: 0,
                qkey: 0x1234,
                cq_slot: 3,
                seg_len: 1 << 20,
                cq_seg_len: 4096,
            },
        ];
        let mut buf = Vec::new();
        for m in msgs {
            m.encode(&mut buf);
            assert_eq!(Msg::decode(&buf).unwrap(), m);
        }
    }

    #[test]
    fn rejects_bad_header() {
        let mut buf = Vec::new();
        Msg::Rtu.encode(&mut buf);
        let mut b = buf.clone();
        b[0] ^= 1;
        assert_eq!(Msg::decode(&b), Err(DecodeError::BadMagic));
        let mut b = buf.clone();
        b[4] = VERSION + 1;
        assert_eq!(Msg::decode(&b), Err(DecodeError::BadVersion));
        let mut b = buf.clone();
        b[5] = 200;
        assert_eq!(Msg::decode(&b), Err(DecodeError::UnknownKind));
        assert_eq!(Msg::decode(&buf[..7]), Err(DecodeError::Truncated));
        let mut b = buf.clone();
        b.push(0);
        assert_eq!(Msg::decode(&b), Err(DecodeError::Truncated));
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = Msg::decode(&bytes);
        }

        #[test]
        fn decode_with_valid_header_never_panics(kind in 0u8..12, body in proptest::collection::vec(any::<u8>(), 0..400)) {
            let mut b = Vec::new();
            b.extend_from_slice(&MAGIC.to_le_bytes());
            b.push(VERSION);
            b.push(kind);
            b.extend_from_slice(&(body.len() as u16).to_le_bytes());
            b.extend_from_slice(&body);
            let _ = Msg::decode(&b);
        }
    }
}
