//! Subject and stream names, and stream setup.
//!
//! Owns: [`Namespace`] (`<root>.evt.<producer>`, `<root>.cmd.<name>`, stream
//! names) and [`ensure_stream`]. Must never: create streams whose subjects
//! overlap another namespace's (each root has its own subjects), or use
//! JetStream features newer than 2.9.

use std::time::Duration;

use async_nats::jetstream::{self, stream};

use crate::BusError;

/// Default deduplication window of streams made by [`ensure_stream`].
pub const DEFAULT_DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// A namespace of subjects and stream names. Production uses the root
/// `gpusched`; tests use their own roots so that streams never overlap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Namespace {
    root: String,
}

/// Whether `s` is a plain subject token: non-empty ASCII letters, digits,
/// `-` or `_`.
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// `Ok` if `value` is a plain subject token, else [`BusError::InvalidName`]
/// naming `field`.
pub(crate) fn check(field: &'static str, value: &str) -> Result<(), BusError> {
    if is_token(value) {
        Ok(())
    } else {
        Err(BusError::InvalidName {
            field,
            value: value.to_string(),
        })
    }
}

impl Namespace {
    /// The production namespace, root `gpusched`.
    pub fn production() -> Self {
        Namespace {
            root: "gpusched".to_string(),
        }
    }

    /// A namespace with its own root, e.g. `gpusched_test_1a2b`. The root
    /// must be one subject token.
    pub fn new(root: &str) -> Result<Self, BusError> {
        check("root", root)?;
        Ok(Namespace {
            root: root.to_string(),
        })
    }

    /// The root token.
    pub fn root(&self) -> &str {
        &self.root
    }

    /// `<root>.evt.<producer>`: committed event batches of one producer.
    pub fn evt_subject(&self, producer: &str) -> Result<String, BusError> {
        check("producer", producer)?;
        Ok(format!("{}.evt.{producer}", self.root))
    }

    /// `<root>.evt.>`: every producer's event batches.
    pub fn evt_wildcard(&self) -> String {
        format!("{}.evt.>", self.root)
    }

    /// `<root>.cmd.<name>`: one kind of command.
    pub fn cmd_subject(&self, name: &str) -> Result<String, BusError> {
        check("command", name)?;
        Ok(format!("{}.cmd.{name}", self.root))
    }

    /// `<root>.cmd.>`: every command.
    pub fn cmd_wildcard(&self) -> String {
        format!("{}.cmd.>", self.root)
    }

    /// Name of the events stream: the root upper-cased, `-` as `_`, plus
    /// `_EVT` (e.g. `GPUSCHED_EVT`).
    pub fn evt_stream(&self) -> String {
        format!("{}_EVT", self.stream_prefix())
    }

    /// Name of the commands stream (e.g. `GPUSCHED_CMD`).
    pub fn cmd_stream(&self) -> String {
        format!("{}_CMD", self.stream_prefix())
    }

    fn stream_prefix(&self) -> String {
        self.root.to_ascii_uppercase().replace('-', "_")
    }
}

/// Creates a file-storage stream with these subjects and the
/// [`DEFAULT_DUPLICATE_WINDOW`], or returns it if it exists (idempotent; an
/// existing stream's configuration is left as it is).
pub async fn ensure_stream(
    js: &jetstream::Context,
    name: &str,
    subjects: Vec<String>,
) -> Result<stream::Stream, BusError> {
    js.get_or_create_stream(stream::Config {
        name: name.to_string(),
        subjects,
        storage: stream::StorageType::File,
        duplicate_window: DEFAULT_DUPLICATE_WINDOW,
        ..Default::default()
    })
    .await
    .map_err(|e| BusError::nats("ensure stream", e))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn names() {
        let p = Namespace::production();
        assert_eq!(p.evt_subject("admit").unwrap(), "gpusched.evt.admit");
        assert_eq!(p.cmd_subject("submit").unwrap(), "gpusched.cmd.submit");
        assert_eq!(p.evt_wildcard(), "gpusched.evt.>");
        assert_eq!(p.evt_stream(), "GPUSCHED_EVT");
        assert_eq!(p.cmd_stream(), "GPUSCHED_CMD");
        let t = Namespace::new("gpusched_test-ab1").unwrap();
        assert_eq!(t.evt_stream(), "GPUSCHED_TEST_AB1_EVT");
    }

    #[test]
    fn bad_tokens_are_refused() {
        for bad in ["", "a.b", "*", ">", "a b", "é"] {
            assert!(Namespace::new(bad).is_err(), "{bad:?}");
            assert!(Namespace::production().evt_subject(bad).is_err());
            assert!(Namespace::production().cmd_subject(bad).is_err());
        }
    }
}
