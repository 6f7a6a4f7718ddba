//! The text being parsed: turning spans into lines, and serde's errors into located
//! [`ConfigError`]s. Shared by the parser and the cross-section checks.

use std::ops::Range;

use serde::de::DeserializeOwned;
use toml::Spanned;
use toml::de::{DeValue, ValueDeserializer};

use super::error::ConfigError;

/// Every key of `t` and of the tables inside it (arrays of tables included), with the span
/// from the key to the end of its value.
fn keys_of(t: &toml::de::DeTable<'_>, out: &mut Vec<(String, Range<usize>)>) {
    for (k, v) in t {
        out.push((k.get_ref().to_string(), k.span().start..v.span().end));
        match v.get_ref() {
            DeValue::Table(inner) => keys_of(inner, out),
            DeValue::Array(a) => {
                for item in a {
                    if let DeValue::Table(inner) = item.get_ref() {
                        keys_of(inner, out);
                    }
                }
            }
            _ => {}
        }
    }
}

/// The text being parsed, for turning spans into lines.
pub(super) struct Doc<'a> {
    pub(super) text: &'a str,
    pub(super) file: &'a str,
}

/// A named sub-section (`[pool.NAME]`): its name, header span and value.
type Named<'i> = (String, Range<usize>, Spanned<DeValue<'i>>);

impl<'a> Doc<'a> {
    pub(super) fn line(&self, offset: usize) -> usize {
        let end = offset.min(self.text.len());
        self.text.as_bytes()[..end]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1
    }

    pub(super) fn invalid(
        &self,
        span: &Range<usize>,
        section: &str,
        key: &str,
        message: String,
    ) -> ConfigError {
        ConfigError::Invalid {
            file: self.file.to_owned(),
            line: self.line(span.start),
            key: key.to_owned(),
            section: section.to_owned(),
            message,
        }
    }

    pub(super) fn bad_value(
        &self,
        span: &Range<usize>,
        section: &str,
        key: &str,
        message: String,
    ) -> ConfigError {
        ConfigError::BadValue {
            file: self.file.to_owned(),
            line: self.line(span.start),
            key: key.to_owned(),
            section: section.to_owned(),
            message,
        }
    }

    /// Deserializes one section, turning serde's errors into located ones.
    pub(super) fn section<T: DeserializeOwned>(
        &self,
        section: &str,
        value: Spanned<DeValue<'a>>,
    ) -> Result<T, ConfigError> {
        let span = value.span();
        let keys: Vec<(String, Range<usize>)> = match value.get_ref() {
            DeValue::Table(t) => {
                let mut keys = Vec::new();
                keys_of(t, &mut keys);
                keys
            }
            other => {
                return Err(self.bad_value(
                    &span,
                    "top level",
                    section,
                    format!("expected a [{section}] table, found a {}", other.type_str()),
                ));
            }
        };
        T::deserialize(ValueDeserializer::from(value)).map_err(|e| {
            let msg = e.message();
            let at = e.span().unwrap_or_else(|| span.clone());
            if let Some(rest) = msg.strip_prefix("unknown field `") {
                let key = rest.split('`').next().unwrap_or(rest).to_owned();
                let expected = msg
                    .split_once(", expected ")
                    .map_or_else(|| "no keys here".to_owned(), |(_, x)| x.to_owned());
                ConfigError::UnknownKey {
                    file: self.file.to_owned(),
                    line: self.line(at.start),
                    key,
                    section: section.to_owned(),
                    expected,
                }
            } else if let Some(rest) = msg.strip_prefix("missing field `") {
                ConfigError::MissingKey {
                    file: self.file.to_owned(),
                    line: self.line(span.start),
                    key: rest.split('`').next().unwrap_or(rest).to_owned(),
                    section: section.to_owned(),
                }
            } else {
                // The innermost key around the error: a key of a sub-table (an
                // `[[stage.NAME.export]]`) names the value better than the table's own key.
                let key = keys
                    .iter()
                    .filter(|(_, r)| r.start <= at.start && at.start < r.end)
                    .min_by_key(|(_, r)| r.end - r.start)
                    .map_or("?", |(k, _)| k.as_str());
                self.bad_value(&at, section, key, msg.to_owned())
            }
        })
    }

    /// The `[kind.NAME]` sub-sections of a table such as `pool`.
    pub(super) fn named(
        &self,
        kind: &str,
        value: Spanned<DeValue<'a>>,
    ) -> Result<Vec<Named<'a>>, ConfigError> {
        let span = value.span();
        let DeValue::Table(t) = value.into_inner() else {
            return Err(self.bad_value(
                &span,
                "top level",
                kind,
                format!("expected [{kind}.NAME] sections"),
            ));
        };
        let mut out = Vec::new();
        for (k, v) in t {
            let name = k.get_ref().to_string();
            let kspan = k.span();
            if !v.get_ref().is_table() {
                return Err(self.bad_value(
                    &kspan,
                    kind,
                    &name,
                    format!(
                        "expected a [{kind}.{name}] table, found a {}",
                        v.get_ref().type_str()
                    ),
                ));
            }
            if name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            {
                return Err(self.invalid(
                    &kspan,
                    kind,
                    &name,
                    format!("`{name}` is not a valid name; use letters, digits, `_` and `-`"),
                ));
            }
            let header = v.span();
            out.push((name, header, v));
        }
        out.sort_by_key(|(_, s, _)| s.start);
        Ok(out)
    }
}
