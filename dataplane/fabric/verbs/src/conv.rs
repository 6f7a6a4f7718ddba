//! Conversions between this crate's verbs types and libibverbs' numeric values.
//!
//! The model's enums carry libibverbs' meaning but not its representation; every mapping
//! goes through the rdma-sys constants here, so a change on either side shows up in the
//! unit tests below rather than as a wrong completion on hardware.

use rdma_sys as ffi;
use rdma_sys::{
    ibv_qp_state as qps, ibv_wc_opcode as wco, ibv_wc_status as wcs, ibv_wr_opcode as wro,
};

use dp_fabric::types::{Access, QpState, SendFlags, SendOp, WcOpcode, WcStatus};

/// `IBV_ACCESS_*` bits for `access`.
pub(crate) fn access_flags(access: Access) -> u32 {
    let mut f = 0;
    if access.contains(Access::LOCAL_WRITE) {
        f |= ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
    }
    if access.contains(Access::REMOTE_WRITE) {
        f |= ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
    }
    if access.contains(Access::REMOTE_READ) {
        f |= ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
    }
    if access.contains(Access::MW_BIND) {
        f |= ffi::ibv_access_flags::IBV_ACCESS_MW_BIND.0;
    }
    f
}

/// `IBV_SEND_*` bits for `flags` (inline is added by the caller for inline payloads).
pub(crate) fn send_flags(flags: SendFlags, inline: bool) -> u32 {
    let mut f = 0;
    if flags.contains(SendFlags::SIGNALED) {
        f |= ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
    }
    if flags.contains(SendFlags::FENCE) {
        f |= ffi::ibv_send_flags::IBV_SEND_FENCE.0;
    }
    if flags.contains(SendFlags::SOLICITED) {
        f |= ffi::ibv_send_flags::IBV_SEND_SOLICITED.0;
    }
    if inline {
        f |= ffi::ibv_send_flags::IBV_SEND_INLINE.0;
    }
    f
}

/// The `ibv_wr_opcode` of a send operation, and the value of the work request's
/// `imm_data`/`invalidate_rkey` union: the immediate in network byte order, or the key to
/// invalidate in host byte order (`ibv_send_wr.invalidate_rkey` is a plain `uint32_t`).
pub(crate) fn send_opcode(op: SendOp) -> (ffi::ibv_wr_opcode::Type, Option<u32>) {
    match op {
        SendOp::SendInv(rkey) => (wro::IBV_WR_SEND_WITH_INV, Some(rkey)),
        SendOp::Send => (wro::IBV_WR_SEND, None),
        SendOp::SendImm(imm) => (wro::IBV_WR_SEND_WITH_IMM, Some(imm.to_be())),
        SendOp::Write(_) => (wro::IBV_WR_RDMA_WRITE, None),
        SendOp::WriteImm(_, imm) => (wro::IBV_WR_RDMA_WRITE_WITH_IMM, Some(imm.to_be())),
        SendOp::Read(_) => (wro::IBV_WR_RDMA_READ, None),
        // Posted by `VerbsQp::post_bind`, which fills the bind part.
        SendOp::BindMw { .. } => (wro::IBV_WR_BIND_MW, None),
        SendOp::LocalInv(rkey) => (wro::IBV_WR_LOCAL_INV, Some(rkey)),
    }
}

/// The completion opcode for a libibverbs `ibv_wc_opcode`, if this model names it.
pub(crate) fn wc_opcode(raw: ffi::ibv_wc_opcode::Type) -> Option<WcOpcode> {
    Some(match raw {
        wco::IBV_WC_SEND => WcOpcode::Send,
        wco::IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
        wco::IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
        wco::IBV_WC_RECV => WcOpcode::Recv,
        wco::IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
        wco::IBV_WC_BIND_MW => WcOpcode::BindMw,
        wco::IBV_WC_LOCAL_INV => WcOpcode::LocalInv,
        _ => return None,
    })
}

/// A small code for a send completion opcode, stored per request (error completions leave
/// the hardware opcode undefined).
pub(crate) const fn opcode_code(op: WcOpcode) -> u32 {
    match op {
        WcOpcode::Send => 0,
        WcOpcode::RdmaWrite => 1,
        WcOpcode::RdmaRead => 2,
        WcOpcode::Recv => 3,
        WcOpcode::RecvRdmaWithImm => 4,
        WcOpcode::BindMw => 5,
        WcOpcode::LocalInv => 6,
    }
}

/// Inverse of [`opcode_code`].
pub(crate) const fn opcode_from_code(code: u32) -> WcOpcode {
    match code {
        1 => WcOpcode::RdmaWrite,
        2 => WcOpcode::RdmaRead,
        3 => WcOpcode::Recv,
        4 => WcOpcode::RecvRdmaWithImm,
        5 => WcOpcode::BindMw,
        6 => WcOpcode::LocalInv,
        _ => WcOpcode::Send,
    }
}

/// The completion status for a libibverbs `ibv_wc_status`.
pub(crate) fn wc_status(raw: ffi::ibv_wc_status::Type) -> WcStatus {
    match raw {
        wcs::IBV_WC_SUCCESS => WcStatus::Success,
        wcs::IBV_WC_LOC_LEN_ERR => WcStatus::LocLenErr,
        wcs::IBV_WC_LOC_QP_OP_ERR => WcStatus::LocQpOpErr,
        wcs::IBV_WC_LOC_PROT_ERR => WcStatus::LocProtErr,
        wcs::IBV_WC_WR_FLUSH_ERR => WcStatus::WrFlushErr,
        wcs::IBV_WC_REM_INV_REQ_ERR => WcStatus::RemInvReqErr,
        wcs::IBV_WC_MW_BIND_ERR => WcStatus::MwBindErr,
        wcs::IBV_WC_REM_ACCESS_ERR => WcStatus::RemAccessErr,
        wcs::IBV_WC_REM_OP_ERR => WcStatus::RemOpErr,
        wcs::IBV_WC_RETRY_EXC_ERR => WcStatus::RetryExcErr,
        wcs::IBV_WC_RNR_RETRY_EXC_ERR => WcStatus::RnrRetryExcErr,
        wcs::IBV_WC_GENERAL_ERR => WcStatus::GeneralErr,
        other => WcStatus::Other(other),
    }
}

/// The model's state for a libibverbs `ibv_qp_state`.
pub(crate) fn qp_state(raw: ffi::ibv_qp_state::Type) -> QpState {
    match raw {
        qps::IBV_QPS_RESET | qps::IBV_QPS_INIT => QpState::Init,
        qps::IBV_QPS_RTR => QpState::Rtr,
        qps::IBV_QPS_RTS | qps::IBV_QPS_SQD => QpState::Rts,
        _ => QpState::Error,
    }
}

/// Bytes of an `ibv_mtu` value.
pub(crate) fn mtu_bytes(mtu: ffi::ibv_mtu::Type) -> u32 {
    match mtu {
        ffi::ibv_mtu::IBV_MTU_256 => 256,
        ffi::ibv_mtu::IBV_MTU_512 => 512,
        ffi::ibv_mtu::IBV_MTU_1024 => 1024,
        ffi::ibv_mtu::IBV_MTU_2048 => 2048,
        ffi::ibv_mtu::IBV_MTU_4096 => 4096,
        _ => 256,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dp_fabric::types::RemoteAddr;

    #[test]
    fn every_status_maps_to_its_libibverbs_value() {
        let named = [
            (wcs::IBV_WC_SUCCESS, WcStatus::Success),
            (wcs::IBV_WC_LOC_LEN_ERR, WcStatus::LocLenErr),
            (wcs::IBV_WC_LOC_QP_OP_ERR, WcStatus::LocQpOpErr),
            (wcs::IBV_WC_LOC_PROT_ERR, WcStatus::LocProtErr),
            (wcs::IBV_WC_WR_FLUSH_ERR, WcStatus::WrFlushErr),
            (wcs::IBV_WC_REM_INV_REQ_ERR, WcStatus::RemInvReqErr),
            (wcs::IBV_WC_MW_BIND_ERR, WcStatus::MwBindErr),
            (wcs::IBV_WC_REM_ACCESS_ERR, WcStatus::RemAccessErr),
            (wcs::IBV_WC_REM_OP_ERR, WcStatus::RemOpErr),
            (wcs::IBV_WC_RETRY_EXC_ERR, WcStatus::RetryExcErr),
            (wcs::IBV_WC_RNR_RETRY_EXC_ERR, WcStatus::RnrRetryExcErr),
            (wcs::IBV_WC_GENERAL_ERR, WcStatus::GeneralErr),
        ];
        for (raw, st) in named {
            assert_eq!(wc_status(raw), st, "raw {raw}");
            // The model's own numbering agrees with libibverbs'.
            assert_eq!(st.to_raw(), raw, "{st:?}");
            assert_eq!(WcStatus::from_raw(raw), st);
        }
        for raw in [wcs::IBV_WC_BAD_RESP_ERR, wcs::IBV_WC_FATAL_ERR, 99] {
            assert_eq!(wc_status(raw), WcStatus::Other(raw));
        }
    }

    #[test]
    fn completion_opcodes() {
        assert_eq!(wc_opcode(wco::IBV_WC_SEND), Some(WcOpcode::Send));
        assert_eq!(wc_opcode(wco::IBV_WC_RDMA_WRITE), Some(WcOpcode::RdmaWrite));
        assert_eq!(wc_opcode(wco::IBV_WC_RDMA_READ), Some(WcOpcode::RdmaRead));
        assert_eq!(wc_opcode(wco::IBV_WC_RECV), Some(WcOpcode::Recv));
        assert_eq!(
            wc_opcode(wco::IBV_WC_RECV_RDMA_WITH_IMM),
            Some(WcOpcode::RecvRdmaWithImm)
        );
        assert_eq!(wc_opcode(wco::IBV_WC_COMP_SWAP), None);
        for op in [
            WcOpcode::Send,
            WcOpcode::RdmaWrite,
            WcOpcode::RdmaRead,
            WcOpcode::Recv,
            WcOpcode::RecvRdmaWithImm,
        ] {
            assert_eq!(opcode_from_code(opcode_code(op)), op);
        }
    }

    #[test]
    fn send_opcodes_and_immediates_in_network_order() {
        let r = RemoteAddr {
            addr: 0x1000,
            rkey: 7,
        };
        assert_eq!(send_opcode(SendOp::Send), (wro::IBV_WR_SEND, None));
        assert_eq!(
            send_opcode(SendOp::Write(r)),
            (wro::IBV_WR_RDMA_WRITE, None)
        );
        assert_eq!(send_opcode(SendOp::Read(r)), (wro::IBV_WR_RDMA_READ, None));
        let (op, imm) = send_opcode(SendOp::SendImm(0x0102_0304));
        assert_eq!(op, wro::IBV_WR_SEND_WITH_IMM);
        // htonl: the first byte on the wire is the most significant one.
        assert_eq!(imm.unwrap().to_ne_bytes(), [1, 2, 3, 4]);
        assert_eq!(
            send_opcode(SendOp::SendInv(0x0102_0304)),
            (wro::IBV_WR_SEND_WITH_INV, Some(0x0102_0304))
        );
        let (op, imm) = send_opcode(SendOp::WriteImm(r, 0xDEAD_BEEF));
        assert_eq!(op, wro::IBV_WR_RDMA_WRITE_WITH_IMM);
        assert_eq!(u32::from_be(imm.unwrap()), 0xDEAD_BEEF);
        // Every operation's completion opcode is one libibverbs reports for it.
        for (o, want) in [
            (SendOp::Send, wco::IBV_WC_SEND),
            (SendOp::SendImm(1), wco::IBV_WC_SEND),
            (SendOp::SendInv(1), wco::IBV_WC_SEND),
            (SendOp::Write(r), wco::IBV_WC_RDMA_WRITE),
            (SendOp::WriteImm(r, 1), wco::IBV_WC_RDMA_WRITE),
            (SendOp::Read(r), wco::IBV_WC_RDMA_READ),
        ] {
            assert_eq!(Some(o.wc_opcode()), wc_opcode(want), "{o:?}");
        }
    }

    #[test]
    fn access_and_send_flags() {
        assert_eq!(access_flags(Access::NONE), 0);
        assert_eq!(access_flags(Access::LOCAL_WRITE), 1);
        assert_eq!(
            access_flags(Access::LOCAL_WRITE | Access::REMOTE_WRITE),
            1 | 2
        );
        assert_eq!(access_flags(Access::ALL), 1 | 2 | 4);
        assert_eq!(send_flags(SendFlags::NONE, false), 0);
        assert_eq!(send_flags(SendFlags::SIGNALED, false), 2);
        assert_eq!(
            send_flags(SendFlags::SIGNALED | SendFlags::FENCE, true),
            2 | 1 | 8
        );
        assert_eq!(send_flags(SendFlags::SOLICITED, false), 4);
    }

    #[test]
    fn qp_states_and_mtu() {
        assert_eq!(qp_state(qps::IBV_QPS_INIT), QpState::Init);
        assert_eq!(qp_state(qps::IBV_QPS_RTR), QpState::Rtr);
        assert_eq!(qp_state(qps::IBV_QPS_RTS), QpState::Rts);
        assert_eq!(qp_state(qps::IBV_QPS_ERR), QpState::Error);
        assert_eq!(qp_state(qps::IBV_QPS_SQE), QpState::Error);
        assert_eq!(mtu_bytes(ffi::ibv_mtu::IBV_MTU_1024), 1024);
        assert_eq!(mtu_bytes(ffi::ibv_mtu::IBV_MTU_4096), 4096);
    }
}
