//! Every librdmacm call that is not an rsocket call, forwarded to the system's librdmacm:
//! the RDMA CM (`rdma_create_id`, `rdma_resolve_addr`, `rdma_get_cm_event`, ...), its
//! endpoint helpers, SRQs, multicast and ECE. Programs that use RDMA CM and verbs as well as
//! rsockets (`qperf`, say) load and run their RDMA CM part on the real one, while their
//! rsocket calls run here; the verbs provider's own connection management goes the same
//! way.
//!
//! # Forwarding, not interposing
//!
//! To the dynamic loader this library *is* `librdmacm.so.1` (SONAME and version nodes), so
//! a program needs nothing but `LD_LIBRARY_PATH` (`scripts/with-rsocket`), and
//! `librspreload.so`, which resolves the rsocket calls with `dlsym(RTLD_DEFAULT)`, finds
//! ours. An interposer would instead be a second library, preloaded in front of the real
//! librdmacm and defining only the rsocket calls at `RDMACM_1.0`: it would need
//! `LD_PRELOAD` (in a fixed order with librspreload's), and the real library would still
//! be loaded and initialised in every rsocket program. Forwarding keeps one file and one
//! name; its cost is one indirect jump on RDMA CM calls, which are all control path.
//!
//! The system library cannot be loaded under its own name (the loader would return this
//! one), so it is opened by path, on the first forwarded call, with `RTLD_LOCAL |
//! RTLD_DEEPBIND`: its internal calls bind to itself, never to these forwarders, and its
//! symbols do not enter the global scope. The path is `$DP_RSOCKET_SYSTEM_LIBRDMACM`, else
//! the first of the usual library directories that has `librdmacm.so.1` and is not this
//! library. Each forwarder is typed with its C signature from `<rdma/rdma_cma.h>` (opaque
//! structures as pointers) and resolved with `dlvsym` at its own version node, so a
//! mismatch between the lists fails loudly at the first call instead of binding to a
//! different version.
//!
//! If the system library cannot be loaded, the reason is printed once on standard error
//! and every forwarded call fails as librdmacm fails without an RDMA CM device: -1 (or
//! null) with `errno` `ENODEV`.
//!
//! Served: every symbol of the version script of the librdmacm it forwards to (rdma-core
//! v44, Debian 12: nodes `RDMACM_1.0` to `RDMACM_1.3`); `symbols.txt` lists them with
//! their nodes. Newer nodes (`RDMACM_1.4`'s `rdma_resolve_addrinfo`, `RDMACM_1.5`'s
//! `repoll_*`) exist in no library this one can forward to here, so a program needing them
//! would not load on the system librdmacm either.

use std::ffi::{CString, c_char, c_void};
use std::ptr::null_mut;
use std::sync::OnceLock;

use libc::c_int;

use crate::errno::set_errno;

type P = *mut c_void;

/// The system librdmacm, opened once.
static SYSTEM: OnceLock<Result<Table, c_int>> = OnceLock::new();

fn candidates() -> Vec<String> {
    if let Ok(p) = std::env::var("DP_RSOCKET_SYSTEM_LIBRDMACM") {
        return vec![p];
    }
    let arch = std::env::consts::ARCH;
    [
        format!("/usr/lib/{arch}-linux-gnu/librdmacm.so.1"),
        format!("/lib/{arch}-linux-gnu/librdmacm.so.1"),
        "/usr/lib64/librdmacm.so.1".into(),
        "/lib64/librdmacm.so.1".into(),
        "/usr/lib/librdmacm.so.1".into(),
    ]
    .into()
}

/// The base address of the object holding `p`, if it is in a loaded object.
fn object_of(p: *const c_void) -> Option<usize> {
    // SAFETY: Dl_info is plain old data; dladdr fills it for a mapped address.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the loader's tables for address p.
    (unsafe { libc::dladdr(p, &mut info) } != 0).then_some(info.dli_fbase as usize)
}

fn open() -> Result<Table, c_int> {
    let ours = object_of(open as *const c_void);
    let mut why = Vec::new();
    for path in candidates() {
        let Ok(c) = CString::new(path.clone()) else {
            continue;
        };
        // SAFETY: c is a NUL-terminated path; dlopen has no other preconditions.
        let h = unsafe {
            libc::dlopen(
                c.as_ptr(),
                libc::RTLD_NOW | libc::RTLD_LOCAL | libc::RTLD_DEEPBIND,
            )
        };
        if h.is_null() {
            why.push(format!("{path}: {}", dlerror()));
            continue;
        }
        match load(h) {
            Ok(t) if object_of(t.rdma_create_id as *const c_void) != ours => return Ok(t),
            Ok(_) => why.push(format!("{path} is this library, not the system's")),
            Err(e) => why.push(format!("{path}: {e}")),
        }
    }
    eprintln!(
        "librdmacm (dataplane rsockets): RDMA CM calls go to the system's librdmacm, \
         which could not be loaded ({}); install librdmacm1 or set \
         DP_RSOCKET_SYSTEM_LIBRDMACM to its path",
        why.join("; ")
    );
    Err(libc::ENODEV)
}

fn dlerror() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated message owned by the loader.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        return "unknown error".into();
    }
    // SAFETY: non-null, NUL-terminated (above).
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

fn sym(h: *mut c_void, name: &'static str, version: &'static str) -> Result<*mut c_void, String> {
    let n = CString::new(name).map_err(|_| "bad symbol name".to_owned())?;
    let v = CString::new(version).map_err(|_| "bad version name".to_owned())?;
    // SAFETY: h is a live handle from dlopen; both strings are NUL-terminated.
    let p = unsafe { libc::dlvsym(h, n.as_ptr(), v.as_ptr()) };
    if p.is_null() {
        return Err(format!("no {name}@{version}"));
    }
    Ok(p)
}

fn system() -> Result<&'static Table, c_int> {
    SYSTEM.get_or_init(open).as_ref().map_err(|e| *e)
}

macro_rules! forwarders {
    ($( $ver:literal fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty = $fail:expr; )*) => {
        /// The system library's entry points.
        struct Table {
            $( $name: unsafe extern "C" fn($($ty),*) -> $ret, )*
        }

        fn load(h: *mut c_void) -> Result<Table, String> {
            Ok(Table {
                $( $name: {
                    let p = sym(h, stringify!($name), $ver)?;
                    // SAFETY: the system librdmacm defines this symbol at this version
                    // with the C signature declared here (<rdma/rdma_cma.h>, opaque
                    // structures as pointers).
                    unsafe {
                        std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($ty),*) -> $ret>(p)
                    }
                }, )*
            })
        }

        $(
            #[doc = concat!("`", stringify!($name), "`, forwarded to the system librdmacm.")]
            ///
            /// # Safety
            /// librdmacm's contract for the call.
            pub(crate) unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
                match system() {
                    // SAFETY: the caller's arguments, under the same contract.
                    Ok(t) => unsafe { (t.$name)($($arg),*) },
                    Err(e) => {
                        set_errno(e);
                        $fail
                    }
                }
            }
        )*
    };
}

/// `rdma_event_str`'s answer for an unknown event, as librdmacm's.
const UNKNOWN_EVENT: *const c_char = c"UNKNOWN EVENT".as_ptr();

forwarders! {
    "RDMACM_1.0" fn rdma_create_event_channel() -> P = null_mut();
    "RDMACM_1.0" fn rdma_destroy_event_channel(ch: P) -> () = ();
    "RDMACM_1.0" fn rdma_create_id(ch: P, id: *mut P, context: P, ps: c_int) -> c_int = -1;
    "RDMACM_1.0" fn rdma_destroy_id(id: P) -> c_int = -1;
    "RDMACM_1.0" fn rdma_bind_addr(id: P, addr: P) -> c_int = -1;
    "RDMACM_1.0" fn rdma_resolve_addr(id: P, src: P, dst: P, timeout_ms: c_int) -> c_int = -1;
    "RDMACM_1.0" fn rdma_resolve_route(id: P, timeout_ms: c_int) -> c_int = -1;
    "RDMACM_1.0" fn rdma_create_qp(id: P, pd: P, attr: P) -> c_int = -1;
    "RDMACM_1.0" fn rdma_destroy_qp(id: P) -> () = ();
    "RDMACM_1.0" fn rdma_connect(id: P, param: P) -> c_int = -1;
    "RDMACM_1.0" fn rdma_listen(id: P, backlog: c_int) -> c_int = -1;
    "RDMACM_1.0" fn rdma_accept(id: P, param: P) -> c_int = -1;
    "RDMACM_1.0" fn rdma_reject(id: P, data: *const c_void, len: u8) -> c_int = -1;
    "RDMACM_1.0" fn rdma_notify(id: P, event: c_int) -> c_int = -1;
    "RDMACM_1.0" fn rdma_disconnect(id: P) -> c_int = -1;
    "RDMACM_1.0" fn rdma_get_cm_event(ch: P, event: *mut P) -> c_int = -1;
    "RDMACM_1.0" fn rdma_ack_cm_event(event: P) -> c_int = -1;
    "RDMACM_1.0" fn rdma_get_src_port(id: P) -> u16 = 0;
    "RDMACM_1.0" fn rdma_get_dst_port(id: P) -> u16 = 0;
    "RDMACM_1.0" fn rdma_join_multicast(id: P, addr: P, context: P) -> c_int = -1;
    "RDMACM_1.0" fn rdma_leave_multicast(id: P, addr: P) -> c_int = -1;
    "RDMACM_1.0" fn rdma_get_devices(n: *mut c_int) -> *mut P = null_mut();
    "RDMACM_1.0" fn rdma_free_devices(list: *mut P) -> () = ();
    "RDMACM_1.0" fn rdma_event_str(event: c_int) -> *const c_char = UNKNOWN_EVENT;
    "RDMACM_1.0" fn rdma_set_option(id: P, level: c_int, name: c_int, val: P, len: libc::size_t) -> c_int = -1;
    "RDMACM_1.0" fn rdma_migrate_id(id: P, ch: P) -> c_int = -1;
    "RDMACM_1.0" fn rdma_getaddrinfo(node: *const c_char, service: *const c_char, hints: *const c_void, res: *mut P) -> c_int = -1;
    "RDMACM_1.0" fn rdma_get_request(listen: P, id: *mut P) -> c_int = -1;
    "RDMACM_1.0" fn rdma_create_ep(id: *mut P, res: P, pd: P, attr: P) -> c_int = -1;
    "RDMACM_1.0" fn rdma_destroy_ep(id: P) -> () = ();
    "RDMACM_1.0" fn rdma_create_srq(id: P, pd: P, attr: P) -> c_int = -1;
    "RDMACM_1.0" fn rdma_destroy_srq(id: P) -> () = ();
    "RDMACM_1.0" fn rdma_create_srq_ex(id: P, attr: P) -> c_int = -1;
    "RDMACM_1.0" fn rdma_create_qp_ex(id: P, attr: P) -> c_int = -1;
    "RDMACM_1.1" fn rdma_join_multicast_ex(id: P, attr: P, context: P) -> c_int = -1;
    "RDMACM_1.2" fn rdma_establish(id: P) -> c_int = -1;
    "RDMACM_1.2" fn rdma_init_qp_attr(id: P, attr: P, mask: *mut c_int) -> c_int = -1;
    "RDMACM_1.3" fn rdma_get_remote_ece(id: P, ece: P) -> c_int = -1;
    "RDMACM_1.3" fn rdma_reject_ece(id: P, data: *const c_void, len: u8) -> c_int = -1;
    "RDMACM_1.3" fn rdma_set_local_ece(id: P, ece: P) -> c_int = -1;
}
