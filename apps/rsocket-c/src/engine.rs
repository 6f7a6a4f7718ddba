//! The process-wide engine: one rsocket context over one fabric device, and the handle
//! table. It is created on the first `rsocket()` call (or the first call that needs it)
//! and lives until the process exits; programs that never create an rsocket never open a
//! device.
//!
//! The provider is chosen when the engine starts, from `DP_RSOCKET_PROVIDER`:
//!
//! * `shm` (the default): software RDMA between processes of this host through shared
//!   memory, in the rendezvous directory `$DP_SHM_DIR` (see
//!   [`dataplane::fabric::shm::default_rendezvous_dir`]). Queue-pair bounce buffers are
//!   kept at one page: rsockets send with RDMA WRITE, never large SENDs.
//! * `verbs`: RDMA hardware through rdma-core (only when built with the `verbs` feature);
//!   `DP_RSOCKET_DEVICE` names the device, else the first one is used.
//!
//! `DP_RSOCKET_VERBOSE` (any value) prints the memory regions the engine creates.
//!
//! `DP_RSOCKET_SENDTO` chooses what `rsendto`/`rsendmsg` do with a destination address on
//! a stream socket ([`SendtoMode`]): `librdmacm` (the default) fails with `EISCONN` as
//! librdmacm does; `linux` ignores the address as Linux TCP does, so programs written for
//! kernel sockets that pass the peer's address on every send (`sockperf --tcp`) run
//! through `librspreload.so`. It is read once, when the engine starts.
//!
//! If the device cannot be opened, the failing call returns -1 with `errno` set (`ENODEV`
//! when no device exists) and the reason is printed once to standard error, since no errno
//! carries it.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use dataplane::fabric::shm::{Shm, ShmConfig, ShmDevice};
#[cfg(feature = "verbs")]
use dataplane::fabric::verbs::{Verbs, VerbsDevice};
use dataplane::fabric::{FabricError, Provider};
use dataplane::rsocket::RsContext;

use crate::errno::Errno;
use crate::handles::Handles;

/// What a send with a destination address does on a stream socket (`DP_RSOCKET_SENDTO`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SendtoMode {
    /// librdmacm's: `EISCONN` (the default).
    Librdmacm,
    /// Linux TCP's: the address is ignored.
    Linux,
}

impl SendtoMode {
    /// The environment variable that chooses the mode.
    pub(crate) const VAR: &str = "DP_RSOCKET_SENDTO";

    /// The mode a value of [`Self::VAR`] names (unset: the default).
    ///
    /// # Errors
    /// A message saying what was wrong and what to do, for any other value.
    pub(crate) fn parse(v: Option<&str>) -> Result<Self, String> {
        match v {
            None | Some("" | "librdmacm") => Ok(Self::Librdmacm),
            Some("linux") => Ok(Self::Linux),
            Some(other) => Err(format!(
                "{}={other:?} is not a mode; use 'linux' (ignore the address of a send on a \
                 connected stream, as Linux TCP) or 'librdmacm' (EISCONN, the default)",
                Self::VAR
            )),
        }
    }

    /// Reads [`Self::VAR`]; an invalid value is reported on standard error and the default
    /// is used.
    fn from_env() -> Self {
        let v = std::env::var(Self::VAR).ok();
        Self::parse(v.as_deref()).unwrap_or_else(|e| {
            eprintln!("librdmacm (dataplane rsockets): {e}; using 'librdmacm'");
            Self::Librdmacm
        })
    }
}

/// The context and handles over one provider.
pub(crate) struct Engine<P: Provider> {
    pub ctx: RsContext<P>,
    pub handles: Handles<P>,
    /// What a send with an address does on a stream socket.
    pub sendto: SendtoMode,
}

impl<P: Provider> Engine<P> {
    fn new(dev: P::Device) -> Result<Self, FabricError> {
        Ok(Self {
            ctx: RsContext::new(dev)?,
            handles: Handles::new(),
            sendto: SendtoMode::from_env(),
        })
    }
}

/// The engine of the provider in use.
pub(crate) enum Lib {
    Shm(Engine<Shm>),
    #[cfg(feature = "verbs")]
    Verbs(Engine<Verbs>),
}

/// Runs `$body` with `$e` bound to the engine, whatever its provider.
macro_rules! dispatch {
    ($lib:expr, $e:ident => $body:expr) => {
        match $lib {
            $crate::engine::Lib::Shm($e) => $body,
            #[cfg(feature = "verbs")]
            $crate::engine::Lib::Verbs($e) => $body,
        }
    };
}
pub(crate) use dispatch;

static LIB: OnceLock<Result<Lib, Errno>> = OnceLock::new();

/// Where mempool's region notices go: a C program did not ask for them, so they are
/// printed only with `DP_RSOCKET_VERBOSE` set.
fn notice(line: &str) {
    eprintln!("librdmacm (dataplane rsockets): {line}");
}

fn start() -> Result<Lib, Errno> {
    if std::env::var_os("DP_RSOCKET_VERBOSE").is_some() {
        mempool::memory::set_notice_sink(notice);
    } else {
        mempool::memory::set_notice_sink(|_| {});
    }
    let provider = std::env::var("DP_RSOCKET_PROVIDER").unwrap_or_else(|_| "shm".into());
    let r = match provider.as_str() {
        "shm" => ShmDevice::open(ShmConfig {
            name: "rsocket-shm".into(),
            bounce_bytes: 4096,
            ..ShmConfig::default()
        })
        .and_then(Engine::new)
        .map(Lib::Shm),
        #[cfg(feature = "verbs")]
        "verbs" => {
            let name = std::env::var("DP_RSOCKET_DEVICE").ok();
            VerbsDevice::open(name.as_deref())
                .and_then(Engine::new)
                .map(Lib::Verbs)
        }
        #[cfg(not(feature = "verbs"))]
        "verbs" => {
            eprintln!(
                "librdmacm (dataplane rsockets): DP_RSOCKET_PROVIDER=verbs, but this library \
                 was built without the `verbs` feature; rebuild with --features verbs"
            );
            return Err(Errno(libc::ENODEV));
        }
        other => {
            eprintln!(
                "librdmacm (dataplane rsockets): unknown DP_RSOCKET_PROVIDER '{other}'; \
                 use shm or verbs"
            );
            return Err(Errno(libc::EINVAL));
        }
    };
    r.map_err(|e| {
        eprintln!("librdmacm (dataplane rsockets): cannot start the {provider} provider: {e}");
        Errno(match e {
            FabricError::NoDevice { .. } | FabricError::ProviderNotBuilt { .. } => libc::ENODEV,
            FabricError::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            _ => libc::EIO,
        })
    })
}

/// The engine, started on first use.
///
/// # Errors
/// Why the engine could not start (reported once on standard error).
pub(crate) fn lib() -> Result<&'static Lib, Errno> {
    LIB.get_or_init(start).as_ref().map_err(|e| *e)
}

/// The engine if it has started: calls that only look up handles (`rpoll` over ordinary
/// descriptors, `rclose` of a non-rsocket) must not start a device.
pub(crate) fn started() -> Option<&'static Lib> {
    LIB.get().and_then(|r| r.as_ref().ok())
}

/// How `rpoll` waits between checks: busy polls for the context's polling time (latency),
/// then yields the core for a while, then sleeps in short steps, so a long wait never
/// burns a core.
#[derive(Debug)]
pub(crate) struct Backoff {
    start: Instant,
    spin: Duration,
}

impl Backoff {
    /// After spinning, yield this long before sleeping.
    const YIELD: Duration = Duration::from_millis(2);
    /// One sleep step.
    const NAP: Duration = Duration::from_micros(50);

    pub(crate) fn new(spin: Duration) -> Self {
        Self {
            start: Instant::now(),
            spin,
        }
    }

    /// Waits a little.
    pub(crate) fn wait(&mut self) {
        let t = self.start.elapsed();
        if t < self.spin {
            core::hint::spin_loop();
        } else if t < self.spin + Self::YIELD {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Self::NAP);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::SendtoMode;

    #[test]
    fn sendto_mode_defaults_to_librdmacm_and_refuses_unknown_values() {
        assert_eq!(SendtoMode::parse(None), Ok(SendtoMode::Librdmacm));
        assert_eq!(SendtoMode::parse(Some("")), Ok(SendtoMode::Librdmacm));
        assert_eq!(
            SendtoMode::parse(Some("librdmacm")),
            Ok(SendtoMode::Librdmacm)
        );
        assert_eq!(SendtoMode::parse(Some("linux")), Ok(SendtoMode::Linux));
        let e = SendtoMode::parse(Some("Linux")).unwrap_err();
        assert!(
            e.contains("DP_RSOCKET_SENDTO") && e.contains("'linux'"),
            "{e}"
        );
    }
}
