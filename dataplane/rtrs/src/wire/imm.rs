//! The 32-bit immediate: a 4-bit type and a 28-bit payload (`rtrs_to_imm`, rtrs-pri.h).
//!
//! | type | direction | payload |
//! |---|---|---|
//! | [`ImmType::IoReq`] (0) | client to server | chunk index and header offset, see [`Geometry`](super::Geometry) |
//! | [`ImmType::IoRsp`] (1) | server to client | [`IoRsp`]: 9 bits of errno magnitude, 19 bits of chunk index |
//! | [`ImmType::IoRspWInv`] (2) | server to client | the same; the server also invalidated the client's rkey |
//! | [`ImmType::HbMsg`] (8) | both | 0: a heartbeat |
//! | [`ImmType::HbAck`] (9) | both | 0: its answer |
//!
//! Values here are in host order: the fabric converts from the wire's big-endian.

use dp_wire::enum_with_unknown;

/// `MAX_IMM_TYPE_BITS`.
pub const TYPE_BITS: u32 = 4;
/// `MAX_IMM_PAYL_BITS`.
pub const PAYLOAD_BITS: u32 = 28;
/// `MAX_IMM_PAYL_MASK`.
pub const PAYLOAD_MASK: u32 = (1 << PAYLOAD_BITS) - 1;
/// Bits of the chunk index in an IO response payload.
pub const RSP_ID_BITS: u32 = 19;
/// Mask of the chunk index in an IO response payload.
pub const RSP_ID_MASK: u32 = (1 << RSP_ID_BITS) - 1;
/// Mask of the errno magnitude in an IO response payload (after the shift).
pub const RSP_ERRNO_MASK: u32 = 0x1FF;

enum_with_unknown! {
    /// `enum rtrs_imm_type`: the top 4 bits of the immediate.
    pub enum ImmType(u32) {
        /// `RTRS_IO_REQ_IMM`: an IO request was written into a chunk.
        IoReq = 0,
        /// `RTRS_IO_RSP_IMM`: an IO finished.
        IoRsp = 1,
        /// `RTRS_IO_RSP_W_INV_IMM`: an IO finished and the server invalidated the client's rkey.
        IoRspWInv = 2,
        /// `RTRS_HB_MSG_IMM`: a heartbeat.
        HbMsg = 8,
        /// `RTRS_HB_ACK_IMM`: a heartbeat's answer.
        HbAck = 9,
    }
}

/// A 32-bit immediate value in host order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Imm(pub u32);

impl Imm {
    /// `rtrs_to_imm`: type in the top 4 bits, payload truncated to 28 bits.
    #[inline]
    pub const fn new(ty: u32, payload: u32) -> Self {
        Self(((ty & 0xF) << PAYLOAD_BITS) | (payload & PAYLOAD_MASK))
    }

    /// Builds from a named type.
    #[inline]
    pub fn with(ty: ImmType, payload: u32) -> Self {
        Self::new(u32::from(ty), payload)
    }

    /// The type (`rtrs_from_imm`).
    #[inline]
    pub fn ty(self) -> ImmType {
        ImmType::from(self.0 >> PAYLOAD_BITS)
    }

    /// The raw 4-bit type.
    #[inline]
    pub const fn raw_ty(self) -> u32 {
        self.0 >> PAYLOAD_BITS
    }

    /// The 28-bit payload.
    #[inline]
    pub const fn payload(self) -> u32 {
        self.0 & PAYLOAD_MASK
    }

    /// An IO request for the header at `payload` (see [`Geometry::encode`](super::Geometry::encode)).
    #[inline]
    pub const fn io_req(payload: u32) -> Self {
        Self::new(0, payload)
    }

    /// A heartbeat.
    pub const HB_MSG: Self = Self::new(8, 0);
    /// A heartbeat answer.
    pub const HB_ACK: Self = Self::new(9, 0);
}

/// The payload of an IO response (`rtrs_to_io_rsp_imm`, `rtrs_from_io_rsp_imm`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IoRsp {
    /// The chunk index of the request (19 bits on the wire).
    pub msg_id: u32,
    /// 0, or a negative errno whose magnitude fits 9 bits (larger ones are truncated when
    /// encoded, as Linux does).
    pub errno: i32,
}

impl IoRsp {
    /// Decodes a payload.
    #[inline]
    pub const fn decode(payload: u32) -> Self {
        Self {
            msg_id: payload & RSP_ID_MASK,
            errno: -(((payload >> RSP_ID_BITS) & RSP_ERRNO_MASK) as i32),
        }
    }

    /// The payload: `(|errno| & 0x1FF) << 19 | msg_id & 0x7FFFF`.
    #[inline]
    pub const fn payload(self) -> u32 {
        ((self.errno.unsigned_abs() & RSP_ERRNO_MASK) << RSP_ID_BITS) | (self.msg_id & RSP_ID_MASK)
    }

    /// The immediate, `IoRspWInv` if the server invalidated the client's rkey.
    #[inline]
    pub const fn imm(self, w_inv: bool) -> Imm {
        Imm::new(if w_inv { 2 } else { 1 }, self.payload())
    }
}
