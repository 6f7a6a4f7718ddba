//! `dp-wire`: the toolkit the protocols' wire codecs share.
//!
//! Each protocol crate keeps its own wire formats next to its state machine
//! (`dp_rsocket::wire`, later RDS and RTRS); this crate holds only what they have in common:
//! the error type, the open-enum macro, and the contract below.
//!
//! Every wire format is a `Packet<T: AsRef<[u8]>>`-style view with field byte ranges in a
//! private `field` module, plus a separate validated representation (`Repr`):
//!
//! * `new_unchecked` wraps bytes without checking (a `const fn`); `check_len` verifies the
//!   buffer is long enough for every field; `new_checked` = both. After `check_len`
//!   succeeds, no accessor panics.
//! * Untrusted input (anything from a peer) must go through `new_checked`. Do **not** use
//!   `new_checked` when emitting into a reused buffer: a stale length would make the check
//!   fail spuriously; size the buffer with `Repr::buffer_len` and use `new_unchecked`.
//! * `Repr::parse` never panics and rejects what the protocol forbids; `Repr::emit` never
//!   panics on a buffer of exactly `buffer_len()` bytes.
//! * Numeric code points are open enums (see [`enum_with_unknown!`](crate::enum_with_unknown)):
//!   unknown values are preserved and the protocol layer decides what to do with them.
//!
//! Errors are the allocation-free [`Error`]. This module contains no unsafe code.
#![forbid(unsafe_code)]

/// A wire-format error: small, `Copy`, allocation-free.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// The buffer is shorter than the format needs.
    Truncated,
    /// A field holds a value the protocol forbids.
    Malformed,
    /// The peer speaks a version we do not.
    Version,
}

impl Error {
    /// A static description.
    pub const fn reason(self) -> &'static str {
        match self {
            Self::Truncated => "message shorter than its format",
            Self::Malformed => "field value not allowed by the protocol",
            Self::Version => "unsupported protocol version",
        }
    }
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.reason())
    }
}

impl std::error::Error for Error {}

/// Result of wire parsing.
pub type Result<T> = core::result::Result<T, Error>;

/// Declares an open enum over an integer: named variants plus `Unknown(raw)`, with `From`
/// in both directions.
#[macro_export]
macro_rules! enum_with_unknown {
    (
        $( #[$attr:meta] )*
        pub enum $name:ident($ty:ty) {
            $( $( #[$vattr:meta] )* $variant:ident = $value:expr ),+ $(,)?
        }
    ) => {
        $( #[$attr] )*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $( #[$vattr] )* $variant, )+
            /// A value this implementation does not name.
            Unknown($ty),
        }

        impl ::core::convert::From<$ty> for $name {
            fn from(v: $ty) -> Self {
                match v {
                    $( x if x == $value => Self::$variant, )+
                    other => Self::Unknown(other),
                }
            }
        }

        impl ::core::convert::From<$name> for $ty {
            fn from(v: $name) -> Self {
                match v {
                    $( $name::$variant => $value, )+
                    $name::Unknown(other) => other,
                }
            }
        }
    };
}
