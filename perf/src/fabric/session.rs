//! What the two sides agree on: the [`Test`], and the session protocol carried in the
//! connection's private data (the client's request names the test, size and iteration count;
//! the server's accept answers with its buffer's address and key).

use dataplane::fabric::RemoteAddr;

/// Which benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Test {
    /// RDMA WRITE ping-pong.
    WriteLat,
    /// RDMA WRITE streaming.
    WriteBw,
    /// SEND/RECV ping-pong.
    SendLat,
    /// SEND streaming.
    SendBw,
    /// One RDMA READ at a time.
    ReadLat,
    /// RDMA READ streaming.
    ReadBw,
}

impl Test {
    /// The command name.
    pub const fn name(self) -> &'static str {
        match self {
            Self::WriteLat => "write-lat",
            Self::WriteBw => "write-bw",
            Self::SendLat => "send-lat",
            Self::SendBw => "send-bw",
            Self::ReadLat => "read-lat",
            Self::ReadBw => "read-bw",
        }
    }

    const fn code(self) -> u8 {
        match self {
            Self::WriteLat => 1,
            Self::WriteBw => 2,
            Self::SendLat => 3,
            Self::SendBw => 4,
            Self::ReadLat => 5,
            Self::ReadBw => 6,
        }
    }

    const fn from_code(c: u8) -> Option<Self> {
        Some(match c {
            1 => Self::WriteLat,
            2 => Self::WriteBw,
            3 => Self::SendLat,
            4 => Self::SendBw,
            5 => Self::ReadLat,
            6 => Self::ReadBw,
            _ => return None,
        })
    }

    pub(super) const fn is_latency(self) -> bool {
        matches!(self, Self::WriteLat | Self::SendLat | Self::ReadLat)
    }

    pub(super) const fn title(self) -> &'static str {
        match self {
            Self::WriteLat => "RDMA_Write Latency Test",
            Self::WriteBw => "RDMA_Write BW Test",
            Self::SendLat => "Send Latency Test",
            Self::SendBw => "Send BW Test",
            Self::ReadLat => "RDMA_Read Latency Test",
            Self::ReadBw => "RDMA_Read BW Test",
        }
    }
}

// ------------------------------------------------------------------------------------------
// Session protocol in connection private data.
// ------------------------------------------------------------------------------------------

const MAGIC: u32 = u32::from_le_bytes(*b"DPPF");
const FLAG_LAST: u8 = 1;

/// The client's request, one per size: sent with the connect request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Req {
    pub(super) test: Test,
    pub(super) last: bool,
    pub(super) size: u32,
    pub(super) iters: u64,
    pub(super) tx_depth: u32,
    pub(super) inline_size: u32,
    pub(super) buf: RemoteAddr,
}

impl Req {
    pub(super) fn encode(&self) -> [u8; 40] {
        let mut b = [0u8; 40];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4] = 1;
        b[5] = self.test.code();
        b[6] = if self.last { FLAG_LAST } else { 0 };
        b[8..12].copy_from_slice(&self.size.to_le_bytes());
        b[12..20].copy_from_slice(&self.iters.to_le_bytes());
        b[20..24].copy_from_slice(&self.tx_depth.to_le_bytes());
        b[24..32].copy_from_slice(&self.buf.addr.to_le_bytes());
        b[32..36].copy_from_slice(&self.buf.rkey.to_le_bytes());
        b[36..40].copy_from_slice(&self.inline_size.to_le_bytes());
        b
    }

    pub(super) fn decode(b: &[u8]) -> Option<Self> {
        let b: &[u8; 40] = b.get(..40)?.try_into().ok()?;
        if u32::from_le_bytes(b[0..4].try_into().ok()?) != MAGIC || b[4] != 1 {
            return None;
        }
        Some(Self {
            test: Test::from_code(b[5])?,
            last: b[6] & FLAG_LAST != 0,
            size: u32::from_le_bytes(b[8..12].try_into().ok()?),
            iters: u64::from_le_bytes(b[12..20].try_into().ok()?),
            tx_depth: u32::from_le_bytes(b[20..24].try_into().ok()?),
            buf: RemoteAddr {
                addr: u64::from_le_bytes(b[24..32].try_into().ok()?),
                rkey: u32::from_le_bytes(b[32..36].try_into().ok()?),
            },
            inline_size: u32::from_le_bytes(b[36..40].try_into().ok()?),
        })
    }
}

/// The server's answer: its buffer, sent with the accept.
pub(super) fn encode_buf(r: RemoteAddr) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    b[4..12].copy_from_slice(&r.addr.to_le_bytes());
    b[12..16].copy_from_slice(&r.rkey.to_le_bytes());
    b
}

pub(super) fn decode_buf(b: &[u8]) -> Option<RemoteAddr> {
    if b.len() < 16 || b[0..4] != MAGIC.to_le_bytes() {
        return None;
    }
    Some(RemoteAddr {
        addr: u64::from_le_bytes(b[4..12].try_into().ok()?),
        rkey: u32::from_le_bytes(b[12..16].try_into().ok()?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn req_roundtrip_and_rejects_garbage() {
        let r = Req {
            test: Test::SendBw,
            last: true,
            size: 4096,
            iters: 77,
            tx_depth: 64,
            inline_size: 220,
            buf: RemoteAddr {
                addr: 0xABCD,
                rkey: 9,
            },
        };
        assert_eq!(Req::decode(&r.encode()), Some(r));
        assert_eq!(Req::decode(&[0u8; 40]), None);
        assert_eq!(Req::decode(&r.encode()[..39]), None);
        let mut bad = r.encode();
        bad[5] = 99;
        assert_eq!(Req::decode(&bad), None);
        assert_eq!(decode_buf(&encode_buf(r.buf)), Some(r.buf));
        assert_eq!(decode_buf(&[1, 2, 3]), None);
    }
}
