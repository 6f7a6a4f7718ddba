//! The notice sink and the human size formats used in notices and reports.
//!
//! Each region emits exactly one line when it is created or mapped, naming
//! the backend it got and why. Notices are control-plane output (region
//! creation, never the data path), so building a `String` for them is fine.

use std::fmt;
use std::sync::{PoisonError, RwLock};

use super::Backend;

/// The current sink. A `fn` pointer rather than a boxed closure so it can be
/// a `static` with a const initialiser and be copied out before the call (the
/// lock is never held while user code runs).
static SINK: RwLock<fn(&str)> = RwLock::new(stderr_notice_sink);

/// Routes every region notice to `f` instead of stderr (process-wide).
///
/// Notices are single lines without a trailing newline, each starting with
/// `mempool: `. Use this to send them to the application's log or to capture
/// them in tests; [`stderr_notice_sink`] restores the default.
///
/// ```
/// use mempool::memory::{Region, RegionConfig, set_notice_sink, stderr_notice_sink};
///
/// fn check(line: &str) {
///     assert!(line.starts_with("mempool: region 'doc' 4.0 KiB on 4 KiB pages (anonymous"));
///     assert!(line.ends_with("hugepages off (no_huge))"));
/// }
/// set_notice_sink(check);
/// let _r = Region::new(&RegionConfig::new("doc", 100).no_huge())?;
/// set_notice_sink(stderr_notice_sink);
/// # Ok::<(), mempool::memory::MemError>(())
/// ```
pub fn set_notice_sink(f: fn(&str)) {
    *SINK.write().unwrap_or_else(PoisonError::into_inner) = f;
}

/// The default sink: prints the line to stderr.
pub fn stderr_notice_sink(line: &str) {
    eprintln!("{line}");
}

/// Sends one line to the current sink.
pub(crate) fn emit(line: &str) {
    let sink = *SINK.read().unwrap_or_else(PoisonError::into_inner);
    sink(line);
}

/// How a region's pages are kept resident, for the notice and `is_locked`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Residency {
    /// Hugetlb pages: never swapped, no `mlock` needed.
    Hugetlb,
    /// Normal pages, `mlock` succeeded.
    Locked,
    /// Normal pages left unlocked; the string says why and what to do.
    Unlocked(String),
}

/// Builds the one-line notice for a region.
///
/// `why_normal` is the reason a region ended up on normal pages (fallback or
/// `no_huge`), `origin` distinguishes regions mapped from a peer's memfd.
pub(crate) fn region_notice(
    name: &str,
    len: usize,
    page_size: usize,
    backend: Backend,
    residency: &Residency,
    why_normal: Option<&str>,
    from_peer: bool,
) -> String {
    let kind = if backend.is_huge() {
        "hugepages"
    } else {
        "pages"
    };
    let origin = match (backend, from_peer) {
        (Backend::HugeMemfd | Backend::NormalMemfd, true) => "memfd, mapped from peer",
        (Backend::HugeMemfd | Backend::NormalMemfd, false) => "memfd, shareable",
        (Backend::HugeAnon, _) => "anonymous, private",
        _ => "anonymous",
    };
    let mut line = format!(
        "mempool: region '{name}' {} on {} {kind} ({origin}",
        Size(len as u64),
        PageSize(page_size),
    );
    match residency {
        Residency::Hugetlb => {}
        Residency::Locked => line.push_str(", mlocked"),
        Residency::Unlocked(why) => {
            line.push_str(", not mlocked: ");
            line.push_str(why);
        }
    }
    if let Some(why) = why_normal {
        line.push_str("; ");
        line.push_str(why);
    }
    line.push(')');
    line
}

const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];

/// A byte count with one decimal in binary units: `512 B`, `64.0 MiB`, `1.5 GiB`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Size(pub(crate) u64);

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 < 1024 {
            return write!(f, "{} B", self.0);
        }
        let mut unit = 0;
        let mut scaled = self.0 as f64;
        while scaled >= 1024.0 && unit + 1 < UNITS.len() {
            scaled /= 1024.0;
            unit += 1;
        }
        write!(f, "{scaled:.1} {}", UNITS[unit])
    }
}

/// A page size in the largest unit that divides it exactly: `4 KiB`, `2 MiB`, `1 GiB`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PageSize(pub(crate) usize);

impl fmt::Display for PageSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut value = self.0;
        let mut unit = 0;
        while value != 0 && value.is_multiple_of(1024) && unit + 1 < UNITS.len() {
            value /= 1024;
            unit += 1;
        }
        write!(f, "{value} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_format_like_the_notices() {
        assert_eq!(Size(0).to_string(), "0 B");
        assert_eq!(Size(1023).to_string(), "1023 B");
        assert_eq!(Size(64 << 20).to_string(), "64.0 MiB");
        assert_eq!(Size(3 << 29).to_string(), "1.5 GiB");
        assert_eq!(PageSize(4096).to_string(), "4 KiB");
        assert_eq!(PageSize(2 << 20).to_string(), "2 MiB");
        assert_eq!(PageSize(1 << 30).to_string(), "1 GiB");
        assert_eq!(PageSize(1000).to_string(), "1000 B");
    }

    #[test]
    fn notice_lines_name_backend_and_reason() {
        let huge = region_notice(
            "rx-pool",
            64 << 20,
            2 << 20,
            Backend::HugeMemfd,
            &Residency::Hugetlb,
            None,
            false,
        );
        assert_eq!(
            huge,
            "mempool: region 'rx-pool' 64.0 MiB on 2 MiB hugepages (memfd, shareable)"
        );
        let normal = region_notice(
            "rx-pool",
            64 << 20,
            4096,
            Backend::NormalAnon,
            &Residency::Locked,
            Some("no free hugepages: 0 of 0 free, see `dpctl check`"),
            false,
        );
        assert_eq!(
            normal,
            "mempool: region 'rx-pool' 64.0 MiB on 4 KiB pages (anonymous, mlocked; \
             no free hugepages: 0 of 0 free, see `dpctl check`)"
        );
    }
}
