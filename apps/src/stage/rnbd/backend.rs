//! [`AnyBackend`]: the backends a file can choose (null, mem, file), as one type, so one
//! server exports devices of every kind.

use dataplane::rnbd::backend::{
    Backend, BlkDone, BlkIo, Geometry, MemBackend, NullBackend, UringBackend,
};

/// A device's storage, whichever backend the file chose.
#[derive(Debug)]
pub enum AnyBackend {
    /// `backend = "null"`.
    Null(NullBackend),
    /// `backend = "mem"`.
    Mem(MemBackend),
    /// `backend = "file"`.
    File(UringBackend),
}

impl AnyBackend {
    /// As written in files.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Null(_) => "null",
            Self::Mem(_) => "mem",
            Self::File(_) => "file",
        }
    }
}

impl Backend for AnyBackend {
    fn geometry(&self) -> Geometry {
        match self {
            Self::Null(b) => b.geometry(),
            Self::Mem(b) => b.geometry(),
            Self::File(b) => b.geometry(),
        }
    }

    unsafe fn submit(&mut self, io: BlkIo) -> Result<(), BlkIo> {
        // SAFETY: the caller's contract is the one each backend asks for; passed on.
        unsafe {
            match self {
                Self::Null(b) => b.submit(io),
                Self::Mem(b) => b.submit(io),
                Self::File(b) => b.submit(io),
            }
        }
    }

    fn poll(&mut self, out: &mut [BlkDone]) -> usize {
        match self {
            Self::Null(b) => b.poll(out),
            Self::Mem(b) => b.poll(out),
            Self::File(b) => b.poll(out),
        }
    }

    fn in_flight(&self) -> usize {
        match self {
            Self::Null(b) => b.in_flight(),
            Self::Mem(b) => b.in_flight(),
            Self::File(b) => b.in_flight(),
        }
    }
}
