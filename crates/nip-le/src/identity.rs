//! The per-window election identity (NIP-LE `instance_id`).
//!
//! It must be unique per running window — the Tauri bundle identifier is not
//! (same-class windows collide and would both lead). A process mints a UUID v4
//! at start unless `BUZZ_INSTANCE_ELECTION_ID` is set, which is how a window
//! makes the agent processes it spawns act as the same instance.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Environment variable holding an inherited instance id (see INTEROP.md).
pub const ELECTION_ID_ENV: &str = "BUZZ_INSTANCE_ELECTION_ID";

/// Longest instance id accepted; keeps records small and bounded.
pub const MAX_INSTANCE_ID_LEN: usize = 256;

/// Why a string cannot be used as an instance id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InstanceIdError {
    /// Empty (or only whitespace).
    #[error("instance id must not be empty")]
    Empty,
    /// Longer than [`MAX_INSTANCE_ID_LEN`] bytes.
    #[error("instance id is {0} bytes; at most {MAX_INSTANCE_ID_LEN} are allowed")]
    TooLong(usize),
    /// Contains a control character (would corrupt line-oriented logs).
    #[error("instance id must not contain control characters")]
    ControlChar,
    /// Contains `"` or `\\`: Buzz's agent harness writes the id into its
    /// JSON unescaped, so every record a harness child of this window
    /// wrote would be malformed (and every reader would lead).
    #[error(
        "instance id must not contain {0:?}: the agent harness writes it into its lock record unescaped"
    )]
    Unescaped(char),
    /// `BUZZ_INSTANCE_ELECTION_ID` is set but is not a usable id.
    #[error("{ELECTION_ID_ENV} is set but unusable: {0}")]
    Inherited(Box<InstanceIdError>),
}

/// A per-window election identity. Compared byte for byte with the record's
/// `instance_id`.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct InstanceId(String);

impl InstanceId {
    /// Uses `id` verbatim after checking it is non-empty, bounded and free of
    /// control characters, `"` and `\\` (the characters JSON would escape,
    /// which the agent harness does not; see INTEROP.md).
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
        if let Some(c) = id.chars().find(|c| matches!(c, '"' | '\\')) {
            return Err(InstanceIdError::Unescaped(c));
        }
        Ok(Self(id))
    }

    /// A fresh random UUID v4.
    pub fn random() -> Self {
        Self(uuid::Uuid::new_v4().to_string())
    }

    /// The id from `BUZZ_INSTANCE_ELECTION_ID` when it is set, otherwise a
    /// fresh UUID v4. A value that is set but unusable (not UTF-8, or
    /// refused by [`InstanceId::new`]) is an error: a window that minted
    /// another id would silently stop being the instance its parent meant.
    pub fn from_env() -> Result<Self, InstanceIdError> {
        match std::env::var(ELECTION_ID_ENV) {
            Ok(v) => Self::new(v).map_err(|e| InstanceIdError::Inherited(Box::new(e))),
            Err(std::env::VarError::NotPresent) => Ok(Self::random()),
            Err(std::env::VarError::NotUnicode(_)) => Err(InstanceIdError::Inherited(Box::new(
                InstanceIdError::ControlChar,
            ))),
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
        assert_eq!(
            InstanceId::new("a\"b"),
            Err(InstanceIdError::Unescaped('"'))
        );
        assert_eq!(
            InstanceId::new("a\\b"),
            Err(InstanceIdError::Unescaped('\\'))
        );
        // Everything else JSON leaves alone is fine, Unicode included.
        assert!(InstanceId::new("win 1/é-{x}:'y'").is_ok());
        assert!(matches!(
            InstanceId::new("x".repeat(257)),
            Err(InstanceIdError::TooLong(257))
        ));
    }
}
