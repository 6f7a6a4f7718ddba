//! What a server exports and who may open it: the device search path (the kernel's
//! `dev_search_path` module parameter) and the access rules of `rnbd-srv.c`.
//!
//! A client opens a device by the name in its `OPEN` message. The server resolves it under
//! its search path exactly as the kernel does ([`SearchPath::resolve`]: `%SESSNAME%` puts
//! each session in a namespace of its own, duplicate slashes are squeezed, a name holding
//! `..` is refused, and the whole must fit `PATH_MAX`), then looks the path up among the
//! devices it exports ([`Exports`]). Opening follows the kernel's rules
//! ([`Device::check_open`]): read-only opens are unlimited, read-write needs no other
//! writer, migration allows two writers; anything else is `EPERM`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::wire::AccessMode;

/// Longest resolved path (`PATH_MAX`, the terminating NUL included).
pub const PATH_MAX: usize = 4096;

/// Why an open was refused. Each maps to the errno the kernel server answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The name holds `..`, is empty or not a path, or the resolved path is too long.
    #[error("invalid device name: {0}")]
    Invalid(&'static str),
    /// Nothing is exported under the resolved path.
    #[error("no such device exported")]
    NotFound,
    /// The access mode conflicts with the device's other openers.
    #[error("the device is open for writing by another client")]
    Permission,
}

impl OpenError {
    /// The errno the kernel server answers with.
    pub fn errno(self) -> i32 {
        match self {
            Self::Invalid(_) => libc::EINVAL,
            Self::NotFound => libc::ENOENT,
            Self::Permission => libc::EPERM,
        }
    }
}

/// The directory device names are resolved under (`dev_search_path`, default `/`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SearchPath(String);

impl Default for SearchPath {
    fn default() -> Self {
        Self("/".into())
    }
}

impl SearchPath {
    /// A search path; `%SESSNAME%` in it is replaced by the session's name at open time.
    ///
    /// # Errors
    /// A path of `PATH_MAX` bytes or more.
    pub fn new(path: impl Into<String>) -> Result<Self, OpenError> {
        let p = path.into();
        if p.len() >= PATH_MAX {
            return Err(OpenError::Invalid("search path too long"));
        }
        Ok(Self(p))
    }

    /// The search path as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Resolves `dev_name` for session `sessname` (`rnbd_srv_get_full_path`): the search
    /// path up to `%SESSNAME%`, then `/<sessname>/<dev_name>` when it holds the token;
    /// otherwise `<search path>/<dev_name>`; then every run of slashes squeezed to one.
    ///
    /// # Errors
    /// [`OpenError::Invalid`] for a name that holds `..`, holds a NUL, is empty, or whose
    /// resolved path would not fit `PATH_MAX`.
    pub fn resolve(&self, sessname: &str, dev_name: &[u8]) -> Result<PathBuf, OpenError> {
        if dev_name.is_empty() {
            return Err(OpenError::Invalid("empty device name"));
        }
        if dev_name.contains(&0) {
            return Err(OpenError::Invalid("device name holds a NUL byte"));
        }
        if dev_name.windows(2).any(|w| w == b"..") {
            return Err(OpenError::Invalid("device name holds '..'"));
        }
        if self.0.len() + dev_name.len() >= PATH_MAX {
            return Err(OpenError::Invalid("device path longer than PATH_MAX"));
        }
        let mut full: Vec<u8> = match self.0.find("%SESSNAME%") {
            Some(at) => {
                let mut v = self.0.as_bytes()[..at].to_vec();
                v.push(b'/');
                v.extend_from_slice(sessname.as_bytes());
                v.push(b'/');
                v
            }
            None => {
                let mut v = self.0.as_bytes().to_vec();
                v.push(b'/');
                v
            }
        };
        full.extend_from_slice(dev_name);
        if full.len() >= PATH_MAX {
            return Err(OpenError::Invalid("device path longer than PATH_MAX"));
        }
        let mut squeezed = Vec::with_capacity(full.len());
        for c in full {
            if !(c == b'/' && squeezed.last() == Some(&b'/')) {
                squeezed.push(c);
            }
        }
        use std::os::unix::ffi::OsStringExt;
        Ok(PathBuf::from(std::ffi::OsString::from_vec(squeezed)))
    }
}

/// One exported device and who has it open.
#[derive(Debug)]
pub struct Device<B> {
    /// The backend serving it.
    pub backend: B,
    /// Writers (read-write and migration opens) right now.
    open_write_cnt: u32,
    /// Opens of any mode right now.
    open_cnt: u32,
    /// The most this device allows (see [`Device::set_max_access`]).
    max_access: AccessMode,
}

impl<B> Device<B> {
    /// A device nobody has open, allowing every mode (the kernel's rules).
    pub fn new(backend: B) -> Self {
        Self {
            backend,
            open_write_cnt: 0,
            open_cnt: 0,
            max_access: AccessMode::Migration,
        }
    }

    /// Limits the modes this device may be opened in, as an operator exports a device
    /// read-only: `Ro` allows read-only opens only, `Rw` read-only and read-write opens,
    /// `Migration` (the default, the kernel's behaviour) all three. Opens above the limit
    /// are refused with `EPERM`, as the kernel refuses a second writer.
    pub fn set_max_access(&mut self, max: AccessMode) {
        self.max_access = max;
    }

    /// The most this device allows.
    pub fn max_access(&self) -> AccessMode {
        self.max_access
    }

    /// Checks and records an open in `mode` (`rnbd_srv_check_update_open_perm`), within
    /// the device's [`Device::max_access`].
    ///
    /// # Errors
    /// [`OpenError::Permission`] if the mode conflicts with the current writers, exceeds
    /// the device's limit, or is not one the protocol has.
    pub fn check_open(&mut self, mode: AccessMode) -> Result<(), OpenError> {
        let allowed = match (self.max_access, mode) {
            (AccessMode::Ro, m) => m == AccessMode::Ro,
            (AccessMode::Rw, m) => matches!(m, AccessMode::Ro | AccessMode::Rw),
            _ => true,
        };
        if !allowed {
            return Err(OpenError::Permission);
        }
        match mode {
            AccessMode::Ro => {}
            AccessMode::Rw if self.open_write_cnt == 0 => self.open_write_cnt += 1,
            AccessMode::Migration if self.open_write_cnt < 2 => self.open_write_cnt += 1,
            _ => return Err(OpenError::Permission),
        }
        self.open_cnt += 1;
        Ok(())
    }

    /// Records a close of an open in `mode`.
    pub fn close(&mut self, mode: AccessMode) {
        if matches!(mode, AccessMode::Rw | AccessMode::Migration) {
            self.open_write_cnt = self.open_write_cnt.saturating_sub(1);
        }
        self.open_cnt = self.open_cnt.saturating_sub(1);
    }

    /// Opens of any mode right now.
    pub fn open_count(&self) -> u32 {
        self.open_cnt
    }

    /// Writers right now.
    pub fn writers(&self) -> u32 {
        self.open_write_cnt
    }
}

/// The devices a server exports, by resolved path.
///
/// Each device also has an index ([`Exports::id_of`]) that stays valid while the exports
/// live: a session resolves a name to a path once, at open time, and reaches the device by
/// index on every IO (no path hashing on the data path).
#[derive(Debug)]
pub struct Exports<B> {
    search: SearchPath,
    devices: Vec<(PathBuf, Device<B>)>,
    by_path: HashMap<PathBuf, usize>,
}

impl<B> Exports<B> {
    /// No devices, resolving names under `search`.
    pub fn new(search: SearchPath) -> Self {
        Self {
            search,
            devices: Vec::new(),
            by_path: HashMap::new(),
        }
    }

    /// Exports `backend` under `path` (the path a resolved name must equal, for example
    /// `/dev/ram0`, or `/mem/disk0` for a memory device). A path exported again gets the
    /// new backend, at the same index.
    pub fn add(&mut self, path: impl Into<PathBuf>, backend: B) {
        let path = path.into();
        match self.by_path.get(&path) {
            Some(&i) => self.devices[i].1 = Device::new(backend),
            None => {
                self.by_path.insert(path.clone(), self.devices.len());
                self.devices.push((path, Device::new(backend)));
            }
        }
    }

    /// The device at index `id`.
    pub fn by_id(&self, id: usize) -> Option<&Device<B>> {
        self.devices.get(id).map(|(_, d)| d)
    }

    /// The index of the device at `path`.
    pub fn id_of(&self, path: &Path) -> Option<usize> {
        self.by_path.get(path).copied()
    }

    /// The device at index `id` (see [`Exports::id_of`]), mutably.
    pub fn by_id_mut(&mut self, id: usize) -> Option<&mut Device<B>> {
        self.devices.get_mut(id).map(|(_, d)| d)
    }

    /// The search path.
    pub fn search_path(&self) -> &SearchPath {
        &self.search
    }

    /// Resolves `dev_name` for `sessname` and opens the device in `mode`; returns its path
    /// (the key for [`Exports::get`] and [`Exports::close`]).
    ///
    /// # Errors
    /// As [`SearchPath::resolve`], [`OpenError::NotFound`], and [`Device::check_open`].
    pub fn open(
        &mut self,
        sessname: &str,
        dev_name: &[u8],
        mode: AccessMode,
    ) -> Result<PathBuf, OpenError> {
        let path = self.search.resolve(sessname, dev_name)?;
        let dev = self.get_mut(&path).ok_or(OpenError::NotFound)?;
        dev.check_open(mode)?;
        Ok(path)
    }

    /// Closes an open of `path` in `mode`.
    pub fn close(&mut self, path: &Path, mode: AccessMode) {
        if let Some(d) = self.get_mut(path) {
            d.close(mode);
        }
    }

    /// The device at `path`.
    pub fn get(&self, path: &Path) -> Option<&Device<B>> {
        self.id_of(path).map(|i| &self.devices[i].1)
    }

    /// The device at `path`, mutably (its backend).
    pub fn get_mut(&mut self, path: &Path) -> Option<&mut Device<B>> {
        self.id_of(path).map(|i| &mut self.devices[i].1)
    }

    /// Every exported path and device, in the order they were added.
    pub fn iter(&self) -> impl Iterator<Item = (&PathBuf, &Device<B>)> {
        self.devices.iter().map(|(p, d)| (p, d))
    }

    /// Every device, mutably (to poll their backends).
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&PathBuf, &mut Device<B>)> {
        self.devices.iter_mut().map(|(p, d)| (&*p, d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_like_the_kernel() {
        let s = SearchPath::default();
        assert_eq!(
            s.resolve("s1", b"/dev/ram0"),
            Ok(PathBuf::from("/dev/ram0"))
        );
        assert_eq!(
            s.resolve("s1", b"dev//ram0"),
            Ok(PathBuf::from("/dev/ram0"))
        );
        let s = SearchPath::new("/srv/blk/").unwrap();
        assert_eq!(
            s.resolve("s1", b"disk0"),
            Ok(PathBuf::from("/srv/blk/disk0"))
        );
        let s = SearchPath::new("/srv/%SESSNAME%/ignored").unwrap();
        assert_eq!(
            s.resolve("clientA", b"disk0"),
            Ok(PathBuf::from("/srv/clientA/disk0"))
        );
    }

    #[test]
    fn refuses_dotdot_nul_empty_and_too_long() {
        let s = SearchPath::default();
        assert_eq!(
            s.resolve("s", b"../etc/passwd"),
            Err(OpenError::Invalid("device name holds '..'"))
        );
        assert_eq!(
            s.resolve("s", b"a/..b"),
            Err(OpenError::Invalid("device name holds '..'"))
        );
        assert!(s.resolve("s", b"").is_err());
        assert!(s.resolve("s", b"a\0b").is_err());
        let long = vec![b'a'; PATH_MAX];
        assert_eq!(s.resolve("s", &long).unwrap_err().errno(), libc::EINVAL);
    }

    #[test]
    fn access_rules_match_rnbd_srv() {
        let mut d = Device::new(());
        d.check_open(AccessMode::Ro).unwrap();
        d.check_open(AccessMode::Rw).unwrap();
        assert_eq!(d.check_open(AccessMode::Rw), Err(OpenError::Permission));
        d.check_open(AccessMode::Migration).unwrap();
        assert_eq!(
            d.check_open(AccessMode::Migration),
            Err(OpenError::Permission)
        );
        d.check_open(AccessMode::Ro).unwrap();
        assert_eq!(d.writers(), 2);
        assert_eq!(d.open_count(), 4);
        d.close(AccessMode::Rw);
        d.check_open(AccessMode::Migration).unwrap();
        assert_eq!(
            d.check_open(AccessMode::Unknown(9)),
            Err(OpenError::Permission)
        );
        assert_eq!(OpenError::Permission.errno(), libc::EPERM);
    }

    #[test]
    fn max_access_limits_the_modes_an_export_allows() {
        let mut d = Device::new(());
        d.set_max_access(AccessMode::Ro);
        assert_eq!(d.check_open(AccessMode::Rw), Err(OpenError::Permission));
        assert_eq!(
            d.check_open(AccessMode::Migration),
            Err(OpenError::Permission)
        );
        d.check_open(AccessMode::Ro).unwrap();
        assert_eq!((d.open_count(), d.writers()), (1, 0));
        let mut d = Device::new(());
        d.set_max_access(AccessMode::Rw);
        assert_eq!(
            d.check_open(AccessMode::Migration),
            Err(OpenError::Permission)
        );
        d.check_open(AccessMode::Rw).unwrap();
        d.check_open(AccessMode::Ro).unwrap();
        assert_eq!(d.max_access(), AccessMode::Rw);
    }

    #[test]
    fn exports_open_by_resolved_path() {
        let mut e = Exports::new(SearchPath::new("/mem").unwrap());
        e.add("/mem/disk0", 7u32);
        let p = e.open("s", b"disk0", AccessMode::Rw).unwrap();
        assert_eq!(e.get(&p).unwrap().backend, 7);
        assert_eq!(
            e.open("s", b"disk0", AccessMode::Rw),
            Err(OpenError::Permission)
        );
        assert_eq!(
            e.open("s", b"disk1", AccessMode::Ro),
            Err(OpenError::NotFound)
        );
        e.close(&p, AccessMode::Rw);
        e.open("s", b"/disk0", AccessMode::Rw).unwrap();
    }
}
