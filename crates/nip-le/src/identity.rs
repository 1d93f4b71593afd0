//! The per-window election identity (NIP-LE `instance_id`).
//!
//! It must be unique per running window — the Tauri bundle identifier is not
//! (same-class windows collide and would both lead). A process mints a UUID v4
//! at start unless `BUZZ_INSTANCE_ELECTION_ID` is set, which is how a window
//! makes the agent processes it spawns act as the same instance.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Environment variable holding an inherited election id (see INTEROP.md).
pub const ELECTION_ID_ENV: &str = "BUZZ_INSTANCE_ELECTION_ID";

/// Longest election id accepted; keeps records small and bounded.
pub const MAX_INSTANCE_ID_LEN: usize = 256;

/// Why a string cannot be used as an election id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InstanceIdError {
    /// Empty (or only whitespace).
    #[error("election id must not be empty")]
    Empty,
    /// Longer than [`MAX_INSTANCE_ID_LEN`] bytes.
    #[error("election id is {0} bytes; at most {MAX_INSTANCE_ID_LEN} are allowed")]
    TooLong(usize),
    /// Contains a control character (would corrupt line-oriented logs).
    #[error("election id must not contain control characters")]
    ControlChar,
}

/// A per-window election identity. Compared byte for byte with the record's
/// `instance_id`.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct InstanceId(String);

impl InstanceId {
    /// Uses `id` verbatim after checking it is non-empty, bounded and free of
    /// control characters.
    pub fn new(id: impl Into<String>) -> Result<Self, InstanceIdError> {
        let id = id.into();
        if id.trim().is_empty() {
            return Err(InstanceIdError::Empty);
        }
        if id.len() > MAX_INSTANCE_ID_LEN {
            return Err(InstanceIdError::TooLong(id.len()));
        }
        if id.chars().any(char::is_control) {
            return Err(InstanceIdError::ControlChar);
        }
        Ok(Self(id))
    }

    /// A fresh random UUID v4.
    pub fn random() -> Self {
        Self(uuid::Uuid::new_v4().to_string())
    }

    /// The id from `BUZZ_INSTANCE_ELECTION_ID` when it is set and valid,
    /// otherwise a fresh UUID v4. An invalid inherited value is logged and
    /// ignored rather than silently sharing a broken identity.
    pub fn from_env_or_random() -> Self {
        match std::env::var(ELECTION_ID_ENV) {
            Ok(v) => Self::new(v).unwrap_or_else(|e| {
                tracing::warn!("ignoring {ELECTION_ID_ENV}: {e}");
                Self::random()
            }),
            Err(_) => Self::random(),
        }
    }

    /// The id as written into lock records.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for InstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for InstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "InstanceId({})", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_ids_are_unique_uuids() {
        let a = InstanceId::random();
        let b = InstanceId::random();
        assert_ne!(a, b);
        assert!(uuid::Uuid::parse_str(a.as_str()).is_ok());
    }

    #[test]
    fn explicit_ids_are_verbatim_and_validated() {
        assert_eq!(
            InstanceId::new("12345-1700000000").unwrap().as_str(),
            "12345-1700000000"
        );
        assert_eq!(InstanceId::new(""), Err(InstanceIdError::Empty));
        assert_eq!(InstanceId::new("  "), Err(InstanceIdError::Empty));
        assert_eq!(InstanceId::new("a\nb"), Err(InstanceIdError::ControlChar));
        assert!(matches!(
            InstanceId::new("x".repeat(257)),
            Err(InstanceIdError::TooLong(257))
        ));
    }
}
