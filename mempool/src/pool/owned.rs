//! [`PoolBox`]: an owned object that returns to its pool on drop.

use core::fmt;
use core::mem::ManuallyDrop;
use core::ops::{Deref, DerefMut};
use core::ptr::NonNull;
use core::slice;
use std::sync::Arc;

use super::error::Empty;
use super::{ObjId, Pool};

/// One object of a pool, owned: its bytes are this handle's until it is dropped, which puts
/// the object back in the pool's ring.
///
/// Made by [`Pool::get_owned`]. The handle keeps the pool alive (`Arc<Pool>`) and returns the
/// object straight to the ring, not to a cache, so each get and drop is a ring operation: fine
/// for control paths and long-lived buffers. The hot path should move raw [`ObjId`]s through a
/// [`PoolCache`](super::PoolCache).
///
/// The handle derefs to the object's `obj_size` bytes.
///
/// # Shareable pools
///
/// The safe byte views assume that nothing else writes the object while a view lives. In a
/// [shareable](super::PoolConfig::shareable) or fabric-registered pool a peer process or a
/// remote RDMA write may write the object's memory; the application protocol must rule that
/// out while `as_slice`/`as_mut_slice` borrows are alive (as with any posted receive buffer:
/// do not look at it before its completion). Where it cannot, use [`PoolBox::as_ptr`] with
/// volatile or atomic accesses.
pub struct PoolBox {
    pool: Arc<Pool>,
    id: ObjId,
}

impl PoolBox {
    /// Wraps an object the caller owns.
    ///
    /// # Safety
    ///
    /// `id` must have been handed out by a get on `pool` (or [`PoolBox::into_raw`] of a box of
    /// `pool`), must not have been put back since, and the caller gives up all other access to
    /// the object: the box now owns its bytes exclusively.
    pub unsafe fn from_raw(pool: Arc<Pool>, id: ObjId) -> Self {
        debug_assert!(id.index() < pool.count());
        Self { pool, id }
    }

    /// Gives up ownership without returning the object: the caller must put it back (or
    /// rebuild a box with [`PoolBox::from_raw`]) to avoid leaking it.
    #[must_use = "the object is leaked unless the id is put back"]
    pub fn into_raw(self) -> ObjId {
        let this = ManuallyDrop::new(self);
        // SAFETY: `this` is never used or dropped again, so the `Arc` is moved out exactly once.
        drop(unsafe { core::ptr::read(&this.pool) });
        this.id
    }

    /// The object's id.
    pub fn id(&self) -> ObjId {
        self.id
    }

    /// The pool the object belongs to.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// Start of the object's `obj_size` bytes.
    ///
    /// Writes through the pointer are allowed (the box owns the object) while no slice
    /// borrowed from the box is alive.
    pub fn as_ptr(&self) -> NonNull<u8> {
        self.pool.addr(self.id)
    }

    /// Object size in bytes (the pool's `obj_size`).
    pub fn len(&self) -> usize {
        self.pool.obj_size()
    }

    /// Always `false`: objects hold at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The object's bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the object's `obj_size` bytes lie inside the pool's region, which lives as
        // long as `self.pool`; they are initialised (regions start zeroed, and raw writers
        // store only initialised bytes, see "Objects are bytes" in the module docs); this box
        // owns the object exclusively (get/`from_raw` contract), so nobody in this process
        // writes it while `&self` is borrowed (see the type docs for peers).
        unsafe { slice::from_raw_parts(self.as_ptr().as_ptr(), self.len()) }
    }

    /// The object's bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; `&mut self` makes this the only borrow of the bytes.
        unsafe { slice::from_raw_parts_mut(self.as_ptr().as_ptr(), self.len()) }
    }
}

// Owned gets: the pool's side of `PoolBox`, here so that `objects.rs` need not know the type.
impl Pool {
    /// Takes one object from the ring as an owned handle that puts it back when dropped.
    ///
    /// # Errors
    ///
    /// [`Empty`] when the ring holds no object.
    pub fn get_owned(self: &Arc<Self>) -> Result<PoolBox, Empty> {
        let id = self.get()?;
        // SAFETY: `id` was just taken from this pool, and nobody else owns it.
        Ok(unsafe { PoolBox::from_raw(Arc::clone(self), id) })
    }
}

impl Deref for PoolBox {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl DerefMut for PoolBox {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

impl Drop for PoolBox {
    fn drop(&mut self) {
        // SAFETY: the box owns `id`, which came from `pool` (constructor contract), and gives
        // it up here exactly once.
        unsafe { self.pool.put(self.id) };
    }
}

impl fmt::Debug for PoolBox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolBox")
            .field("pool", &self.pool.name())
            .field("id", &self.id)
            .field("addr", &self.as_ptr())
            .finish()
    }
}
