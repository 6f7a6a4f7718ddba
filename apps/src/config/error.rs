//! Configuration errors: every one names the file and line, and the section and key when
//! there is one.

use std::io;

/// Why a pipeline configuration was rejected.
///
/// Every variant but [`ConfigError::Read`] carries the file name and the 1-based line of
/// the offending key, value or section header, and its message starts with `file:line:`.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The path given.
        path: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The text is not valid TOML.
    #[error("{file}:{line}: TOML syntax error: {message}")]
    Syntax {
        /// File name.
        file: String,
        /// Line of the error.
        line: usize,
        /// The parser's message.
        message: String,
    },
    /// A top-level section the format does not have.
    #[error(
        "{file}:{line}: unknown section [{section}]; the sections are [eal], [memory], \
         [fabric], [pool.NAME], [ring.NAME] and [stage.NAME]"
    )]
    UnknownSection {
        /// File name.
        file: String,
        /// Line of the section.
        line: usize,
        /// The section name as written.
        section: String,
    },
    /// A key the section does not have (a typo, or a key of another stage kind).
    #[error("{file}:{line}: unknown key `{key}` in [{section}]; expected {expected}")]
    UnknownKey {
        /// File name.
        file: String,
        /// Line of the key.
        line: usize,
        /// The key as written.
        key: String,
        /// The section, e.g. `stage.gen`.
        section: String,
        /// The keys the section accepts.
        expected: String,
    },
    /// A required key is absent.
    #[error("{file}:{line}: missing key `{key}` in [{section}]")]
    MissingKey {
        /// File name.
        file: String,
        /// Line of the section header.
        line: usize,
        /// The missing key.
        key: String,
        /// The section.
        section: String,
    },
    /// A value of the wrong type or outside the accepted set.
    #[error("{file}:{line}: bad value for `{key}` in [{section}]: {message}")]
    BadValue {
        /// File name.
        file: String,
        /// Line of the value.
        line: usize,
        /// The key.
        key: String,
        /// The section.
        section: String,
        /// What is wrong and what is accepted.
        message: String,
    },
    /// Well-formed values that do not fit together (an unknown ring, a CPU outside the core
    /// list, a ring without a consumer, ...).
    #[error("{file}:{line}: `{key}` in [{section}]: {message}")]
    Invalid {
        /// File name.
        file: String,
        /// Line of the key (or section header).
        line: usize,
        /// The key.
        key: String,
        /// The section.
        section: String,
        /// What is wrong and how to fix it.
        message: String,
    },
}

impl ConfigError {
    /// The 1-based line the error points at (`None` for [`ConfigError::Read`]).
    pub fn line(&self) -> Option<usize> {
        match self {
            Self::Read { .. } => None,
            Self::Syntax { line, .. }
            | Self::UnknownSection { line, .. }
            | Self::UnknownKey { line, .. }
            | Self::MissingKey { line, .. }
            | Self::BadValue { line, .. }
            | Self::Invalid { line, .. } => Some(*line),
        }
    }

    /// The key the error is about, if any.
    pub fn key(&self) -> Option<&str> {
        match self {
            Self::UnknownKey { key, .. }
            | Self::MissingKey { key, .. }
            | Self::BadValue { key, .. }
            | Self::Invalid { key, .. } => Some(key),
            _ => None,
        }
    }
}
