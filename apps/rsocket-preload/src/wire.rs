//! The hello: the one message of this library's own protocol, 16 bytes sent on a kernel
//! TCP connection to move it to rsockets.
//!
//! ```text
//!  0      4     5     6      8              16
//!  +------+-----+-----+------+--------------+
//!  | DPRS | ver | kind| port |    cookie    |   all big-endian
//!  +------+-----+-----+------+--------------+
//! ```
//!
//! The accepting side (passive) sends an offer: [`HelloKind::Offer`] with the port of an
//! rsocket listener it just opened and a random cookie, or [`HelloKind::Plain`] when it
//! cannot make rsockets (then the connection stays on kernel TCP). The connecting side
//! (active) answers an offer with [`HelloKind::Coming`] (then connects to the port and
//! sends the cookie as the first 8 bytes on the new rsocket) or [`HelloKind::Plain`].
//!
//! Every hello comes from a peer, so it is parsed like any hostile input: [`Hello::parse`]
//! never panics and rejects anything but this version's exact layout; the caller decides
//! what a rejection costs (that connection only).
//!
//! This file depends on `dp-wire` alone: the fuzz target `preload_hello` includes it.

use dp_wire::{Error, Result, enum_with_unknown};

/// The first four bytes of every hello.
pub const MAGIC: [u8; 4] = *b"DPRS";
/// The protocol version this library speaks.
pub const VERSION: u8 = 1;
/// The size of a hello on the wire.
pub const LEN: usize = 16;

enum_with_unknown! {
    /// What a hello says.
    pub enum HelloKind(u8) {
        /// Passive: an rsocket listener is waiting on the port for the cookie.
        Offer = 1,
        /// Either side: this connection stays on kernel TCP.
        Plain = 2,
        /// Active: connecting to the offered port now.
        Coming = 3,
    }
}

/// Byte ranges of the fields.
mod field {
    use core::ops::Range;
    pub const MAGIC: Range<usize> = 0..4;
    pub const VERSION: usize = 4;
    pub const KIND: usize = 5;
    pub const PORT: Range<usize> = 6..8;
    pub const COOKIE: Range<usize> = 8..16;
}

/// A checked view of a hello in a buffer.
#[derive(Debug, Clone, Copy)]
pub struct HelloView<T: AsRef<[u8]>>(T);

impl<T: AsRef<[u8]>> HelloView<T> {
    /// Wraps `buf` without checking it (accessors may then panic on a short buffer).
    pub const fn new_unchecked(buf: T) -> Self {
        Self(buf)
    }

    /// Wraps `buf` if it holds a whole hello.
    ///
    /// # Errors
    /// [`Error::Truncated`] when it is shorter than [`LEN`].
    pub fn new_checked(buf: T) -> Result<Self> {
        let v = Self(buf);
        v.check_len()?;
        Ok(v)
    }

    /// Checks that the buffer holds a whole hello.
    ///
    /// # Errors
    /// [`Error::Truncated`] when it is shorter than [`LEN`].
    pub fn check_len(&self) -> Result<()> {
        if self.0.as_ref().len() < LEN {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    /// True if the magic is there (a hello of some version of this protocol).
    pub fn has_magic(&self) -> bool {
        self.0.as_ref()[field::MAGIC] == MAGIC
    }

    /// The version byte.
    pub fn version(&self) -> u8 {
        self.0.as_ref()[field::VERSION]
    }

    /// The kind byte.
    pub fn kind(&self) -> HelloKind {
        self.0.as_ref()[field::KIND].into()
    }

    /// The port.
    pub fn port(&self) -> u16 {
        let b = &self.0.as_ref()[field::PORT];
        u16::from_be_bytes([b[0], b[1]])
    }

    /// The cookie.
    pub fn cookie(&self) -> u64 {
        let mut c = [0; 8];
        c.copy_from_slice(&self.0.as_ref()[field::COOKIE]);
        u64::from_be_bytes(c)
    }
}

/// What a hello means, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// What it says.
    pub kind: HelloKind,
    /// The rsocket listener's port ([`HelloKind::Offer`]; else 0).
    pub port: u16,
    /// The cookie the active side must send on the rsocket ([`HelloKind::Offer`]; else 0).
    pub cookie: u64,
}

impl Hello {
    /// Parses and validates a hello.
    ///
    /// # Errors
    /// [`Error::Truncated`] (short buffer), [`Error::Version`] (another version), and
    /// [`Error::Malformed`] for a wrong magic, an unknown kind, an offer of port 0, or a
    /// port or cookie on anything but an offer.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let v = HelloView::new_checked(buf)?;
        if !v.has_magic() {
            return Err(Error::Malformed);
        }
        if v.version() != VERSION {
            return Err(Error::Version);
        }
        let h = Self {
            kind: v.kind(),
            port: v.port(),
            cookie: v.cookie(),
        };
        match h.kind {
            HelloKind::Offer if h.port != 0 => Ok(h),
            HelloKind::Plain | HelloKind::Coming if h.port == 0 && h.cookie == 0 => Ok(h),
            _ => Err(Error::Malformed),
        }
    }

    /// Writes the hello into the first [`LEN`] bytes of `buf`.
    ///
    /// # Errors
    /// [`Error::Truncated`] when `buf` is shorter than [`LEN`].
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        let b = buf.get_mut(..LEN).ok_or(Error::Truncated)?;
        b[field::MAGIC].copy_from_slice(&MAGIC);
        b[field::VERSION] = VERSION;
        b[field::KIND] = self.kind.into();
        b[field::PORT].copy_from_slice(&self.port.to_be_bytes());
        b[field::COOKIE].copy_from_slice(&self.cookie.to_be_bytes());
        Ok(())
    }

    /// The hello as bytes.
    pub fn to_bytes(self) -> [u8; LEN] {
        let mut b = [0; LEN];
        // A LEN-byte buffer always fits.
        let _ = self.emit(&mut b);
        b
    }

    /// An answer or a refusal (no port, no cookie).
    pub const fn bare(kind: HelloKind) -> Self {
        Self {
            kind,
            port: 0,
            cookie: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_offer_round_trips() {
        let h = Hello {
            kind: HelloKind::Offer,
            port: 40_001,
            cookie: 0x0123_4567_89ab_cdef,
        };
        assert_eq!(Hello::parse(&h.to_bytes()), Ok(h));
        let c = Hello::bare(HelloKind::Coming);
        assert_eq!(Hello::parse(&c.to_bytes()), Ok(c));
    }

    #[test]
    fn test_hostile_hellos_are_rejected() {
        let good = Hello {
            kind: HelloKind::Offer,
            port: 7,
            cookie: 1,
        }
        .to_bytes();
        assert_eq!(Hello::parse(&good[..15]), Err(Error::Truncated));
        let mut b = good;
        b[0] = b'X';
        assert_eq!(Hello::parse(&b), Err(Error::Malformed));
        let mut b = good;
        b[4] = 2;
        assert_eq!(Hello::parse(&b), Err(Error::Version));
        let mut b = good;
        b[5] = 9;
        assert_eq!(Hello::parse(&b), Err(Error::Malformed));
        let mut b = good;
        b[6..8].copy_from_slice(&[0, 0]);
        assert_eq!(
            Hello::parse(&b),
            Err(Error::Malformed),
            "an offer of port 0"
        );
        let mut b = Hello::bare(HelloKind::Coming).to_bytes();
        b[15] = 1;
        assert_eq!(
            Hello::parse(&b),
            Err(Error::Malformed),
            "a cookie on an answer"
        );
    }
}
