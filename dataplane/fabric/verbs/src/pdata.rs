//! Connection private data on the wire.
//!
//! The IB CM (and RoCE, which uses it) carries private data in fixed-size fields: 92 bytes
//! in a REQ, of which the RDMA CM's own header takes 36, 196 in a REP and 148 in a REJ. The
//! receiver always sees the full field, zero padded, so the sender's length is lost. In
//! [`PrivateDataFormat::Framed`] mode the sender prefixes its bytes with `[MAGIC, len]` and
//! the receiver cuts them out again; bytes that do not carry the header (a peer that does
//! not frame) are delivered as received.

use crate::PrivateDataFormat;
use dp_fabric::error::{FabricError, Result};
use dp_fabric::traits::{MAX_PRIVATE_DATA, PrivateData};

/// First byte of a framed private data field.
pub(crate) const MAGIC: u8 = 0xD9;
/// Bytes of the frame header.
pub(crate) const HDR: usize = 2;
/// User bytes of an IB CM REQ behind the RDMA CM header.
pub(crate) const IB_REQ: usize = 56;
/// Private data bytes of an IB CM REP.
pub(crate) const IB_REP: usize = 196;
/// Private data bytes of an IB CM REJ.
pub(crate) const IB_REJ: usize = 148;

/// The REQ, REP and REJ limits a caller sees in `format`.
pub(crate) const fn limits(format: PrivateDataFormat) -> (usize, usize, usize) {
    match format {
        PrivateDataFormat::Framed => (IB_REQ - HDR, IB_REP - HDR, IB_REJ - HDR),
        PrivateDataFormat::Raw => (IB_REQ, IB_REP, IB_REJ),
    }
}

/// Private data ready for the wire.
#[derive(Clone, Copy)]
pub(crate) struct Wire {
    len: usize,
    bytes: [u8; MAX_PRIVATE_DATA],
}

impl Wire {
    /// The bytes to hand to librdmacm.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// Encodes `data` for a message whose caller-visible limit is `max`.
pub(crate) fn encode(
    format: PrivateDataFormat,
    data: &[u8],
    max: usize,
    msg: &'static str,
) -> Result<Wire> {
    if data.len() > max {
        return Err(FabricError::PrivateDataTooLong {
            len: data.len(),
            max,
            msg,
        });
    }
    let mut w = Wire {
        len: 0,
        bytes: [0; MAX_PRIVATE_DATA],
    };
    match format {
        PrivateDataFormat::Raw => {
            w.bytes[..data.len()].copy_from_slice(data);
            w.len = data.len();
        }
        PrivateDataFormat::Framed => {
            w.bytes[0] = MAGIC;
            // `max` is at most 194 here, so the length fits a byte.
            w.bytes[1] = data.len() as u8;
            w.bytes[HDR..HDR + data.len()].copy_from_slice(data);
            w.len = HDR + data.len();
        }
    }
    Ok(w)
}

/// Decodes received private data.
pub(crate) fn decode(format: PrivateDataFormat, raw: &[u8]) -> PrivateData {
    if format == PrivateDataFormat::Framed
        && raw.len() >= HDR
        && raw[0] == MAGIC
        && usize::from(raw[1]) <= raw.len() - HDR
        && let Some(p) = PrivateData::new(&raw[HDR..HDR + usize::from(raw[1])])
    {
        return p;
    }
    // Not framed (or raw mode): as received, cut to what PrivateData holds.
    PrivateData::new(&raw[..raw.len().min(MAX_PRIVATE_DATA)]).unwrap_or(PrivateData::EMPTY)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the IB CM does to private data: pad to the field size.
    fn pad(w: &Wire, field: usize) -> Vec<u8> {
        let mut v = w.as_bytes().to_vec();
        v.resize(field, 0);
        v
    }

    #[test]
    fn framed_data_keeps_its_exact_length_through_padding() {
        let f = PrivateDataFormat::Framed;
        let (req, rep, rej) = limits(f);
        for (field, max) in [(IB_REQ, req), (IB_REP, rep), (IB_REJ, rej)] {
            for data in [&[][..], &[0u8; 5][..], &[7u8; 40][..], &vec![0xAB; max][..]] {
                let w = encode(f, data, max, "REQ").unwrap();
                assert_eq!(decode(f, &pad(&w, field)).as_bytes(), data);
            }
        }
    }

    #[test]
    fn too_long_is_refused_with_the_limit() {
        let e = encode(PrivateDataFormat::Framed, &[0; 55], 54, "REQ")
            .err()
            .unwrap();
        assert_eq!(
            e.to_string(),
            "private data of 55 bytes exceeds the 54-byte limit for REQ"
        );
        assert!(encode(PrivateDataFormat::Raw, &[0; 56], 56, "REQ").is_ok());
    }

    #[test]
    fn unframed_and_raw_data_is_delivered_as_received() {
        // An rsocket-style REQ from a peer that does not frame: version 1 first.
        let mut raw = vec![1u8, 2, 0, 64];
        raw.resize(IB_REQ, 0);
        assert_eq!(decode(PrivateDataFormat::Framed, &raw).as_bytes(), &raw[..]);
        assert_eq!(decode(PrivateDataFormat::Raw, &raw).as_bytes(), &raw[..]);
        // A header whose length runs past the field is not a header.
        let bogus = [MAGIC, 200, 1, 2];
        assert_eq!(
            decode(PrivateDataFormat::Framed, &bogus).as_bytes(),
            &bogus[..]
        );
        // Raw mode never strips a header-looking prefix.
        let w = encode(PrivateDataFormat::Framed, b"hi", 54, "REQ").unwrap();
        assert_eq!(
            decode(PrivateDataFormat::Raw, w.as_bytes()).as_bytes(),
            &[MAGIC, 2, b'h', b'i']
        );
        // Longer than PrivateData holds (an iWARP-sized field): cut.
        assert_eq!(
            decode(PrivateDataFormat::Raw, &[3u8; 300]).as_bytes().len(),
            MAX_PRIVATE_DATA
        );
    }
}
