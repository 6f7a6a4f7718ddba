//! With the `verbs` feature: the RDMA CM calls the verbs provider makes, forwarded to the
//! system's librdmacm.
//!
//! To the dynamic loader this library *is* `librdmacm.so.1`, so the system's librdmacm,
//! which the verbs provider needs for connection management, cannot be loaded under that
//! name: the loader would return this library. Every RDMA CM call the provider makes is
//! therefore defined here (and exported, so the provider's references bind to it) as a
//! forwarder to the system library, opened by path with `RTLD_LOCAL | RTLD_DEEPBIND` (its
//! own internal calls bind to itself, not to these forwarders). The path is
//! `$DP_RSOCKET_SYSTEM_LIBRDMACM`, else the first of the usual library directories that has
//! `librdmacm.so.1`.
//!
//! `build.rs` lists the same names; a call the provider starts making must be added to both
//! (the library test checks the built library needs no `librdmacm.so.1` but itself).

use std::ffi::{CString, c_void};
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
        "librdmacm (dataplane rsockets): the verbs provider needs the system's librdmacm, \
         which could not be loaded ({}); set DP_RSOCKET_SYSTEM_LIBRDMACM to its path",
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

fn sym(h: *mut c_void, name: &'static str) -> Result<*mut c_void, String> {
    let n = CString::new(name).map_err(|_| "bad symbol name".to_owned())?;
    // SAFETY: h is a live handle from dlopen; both strings are NUL-terminated.
    let p = unsafe { libc::dlvsym(h, n.as_ptr(), c"RDMACM_1.0".as_ptr()) };
    if p.is_null() {
        return Err(format!("no {name}@RDMACM_1.0"));
    }
    Ok(p)
}

fn system() -> Result<&'static Table, c_int> {
    SYSTEM.get_or_init(open).as_ref().map_err(|e| *e)
}

macro_rules! forwarders {
    ($( fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty = $fail:expr; )*) => {
        /// The system library's entry points.
        struct Table {
            $( $name: unsafe extern "C" fn($($ty),*) -> $ret, )*
        }

        fn load(h: *mut c_void) -> Result<Table, String> {
            Ok(Table {
                $( $name: {
                    let p = sym(h, stringify!($name))?;
                    // SAFETY: the system librdmacm defines this symbol at version
                    // RDMACM_1.0 with the C signature declared here (<rdma/rdma_cma.h>,
                    // opaque structures as void pointers).
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
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
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

forwarders! {
    fn rdma_create_event_channel() -> P = null_mut();
    fn rdma_destroy_event_channel(ch: P) -> () = ();
    fn rdma_create_id(ch: P, id: *mut P, context: P, ps: c_int) -> c_int = -1;
    fn rdma_destroy_id(id: P) -> c_int = -1;
    fn rdma_bind_addr(id: P, addr: P) -> c_int = -1;
    fn rdma_listen(id: P, backlog: c_int) -> c_int = -1;
    fn rdma_resolve_addr(id: P, src: P, dst: P, timeout_ms: c_int) -> c_int = -1;
    fn rdma_resolve_route(id: P, timeout_ms: c_int) -> c_int = -1;
    fn rdma_connect(id: P, param: P) -> c_int = -1;
    fn rdma_accept(id: P, param: P) -> c_int = -1;
    fn rdma_reject(id: P, data: *const c_void, len: u8) -> c_int = -1;
    fn rdma_disconnect(id: P) -> c_int = -1;
    fn rdma_get_cm_event(ch: P, event: *mut P) -> c_int = -1;
    fn rdma_ack_cm_event(event: P) -> c_int = -1;
    fn rdma_create_qp(id: P, pd: P, attr: P) -> c_int = -1;
    fn rdma_destroy_qp(id: P) -> () = ();
    fn rdma_migrate_id(id: P, ch: P) -> c_int = -1;
    fn rdma_get_devices(n: *mut c_int) -> *mut P = null_mut();
    fn rdma_free_devices(list: *mut P) -> () = ();
}
