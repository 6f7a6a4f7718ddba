//! Reliable-connected queue pairs: the application's handle ([`ShmQp`]) on the engine in
//! [`rc`](crate::rc), attached to its completion queues.

use std::sync::{Arc, Weak};

use mempool::ring::{Producer, Single};

use crate::core::DevCore;
use crate::cq::{CqOps, ShmCq, SlotEntry};
use crate::pd::PdInner;
use crate::rc::{QpCore, RecvWqe};
use dp_fabric::error::{PostError, Result};
use dp_fabric::traits::{ConnId, RcQueuePair};
use dp_fabric::types::{QpCaps, QpState, RecvWr, SendWr};

/// A reliable-connected queue pair of the shm provider.
pub struct ShmQp {
    pub(crate) core: Arc<QpCore>,
    rq: Producer<RecvWqe, Single>,
    recv_posted: u64,
    send_ops: Arc<CqOps>,
    recv_ops: Arc<CqOps>,
}

impl core::fmt::Debug for ShmQp {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ShmQp")
            .field("qpn", &self.core.qpn)
            .field("state", &self.core.state())
            .finish()
    }
}

impl ShmQp {
    /// Creates a queue pair (state Init) for connection `conn`, attached to its completion
    /// queues.
    pub(crate) fn create(
        dev: &Arc<DevCore>,
        pd: &Arc<PdInner>,
        send_cq: &ShmCq,
        recv_cq: &ShmCq,
        caps: QpCaps,
        conn: ConnId,
    ) -> Result<Self> {
        let (core, rq, recv) =
            QpCore::create(dev, pd, send_cq.shared(), recv_cq.shared(), caps, conn)?;
        let send_ops = send_cq.ops().clone();
        let recv_ops = recv_cq.ops().clone();
        if Arc::ptr_eq(send_cq.shared(), recv_cq.shared()) {
            send_ops.attach(
                core.send_slot,
                SlotEntry::rc(core.clone(), true, Some(recv)),
            );
        } else {
            send_ops.attach(core.send_slot, SlotEntry::rc(core.clone(), true, None));
            recv_ops.attach(
                core.recv_slot,
                SlotEntry::rc(core.clone(), false, Some(recv)),
            );
        }
        Ok(Self {
            core,
            rq,
            recv_posted: 0,
            send_ops,
            recv_ops,
        })
    }
}

impl Drop for ShmQp {
    fn drop(&mut self) {
        if let Some(c) = self.core.conn_ref.get().and_then(Weak::upgrade) {
            c.qp_dropped();
        }
        self.core.set_error();
        self.send_ops.detach(self.core.send_slot);
        if self.core.recv_slot != self.core.send_slot
            || !Arc::ptr_eq(&self.core.send_cq, &self.core.recv_cq)
        {
            self.recv_ops.detach(self.core.recv_slot);
        }
    }
}

impl RcQueuePair for ShmQp {
    fn qp_num(&self) -> u32 {
        self.core.qpn
    }

    fn state(&self) -> QpState {
        self.core.state()
    }

    fn caps(&self) -> QpCaps {
        self.core.caps
    }

    fn conn_id(&self) -> ConnId {
        self.core.conn
    }

    fn post_send(&mut self, wrs: &[SendWr<'_>]) -> core::result::Result<(), PostError> {
        self.core.post_send(wrs)
    }

    fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> core::result::Result<(), PostError> {
        self.core
            .post_recv(&mut self.rq, &mut self.recv_posted, wrs)
    }

    fn move_to_error(&mut self) {
        self.core.set_error();
    }
}
