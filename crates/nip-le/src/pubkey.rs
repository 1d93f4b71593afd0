//! The agent public key that names an election.
//!
//! The key becomes a file name (`<pubkey>.lock`), so it is validated before it
//! touches the filesystem: exactly 64 hex characters, normalised to lower case
//! (the existing harness writes lower case). Anything else — `../../etc/passwd`,
//! separators, unicode, the empty string — is a typed error.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Length in hex characters of an agent public key (32 bytes).
pub const PUBKEY_HEX_LEN: usize = 64;

/// Why a string is not an agent public key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PubkeyError {
    /// Not exactly 64 characters long (counted in bytes, so multi-byte
    /// characters count for what they weigh on disk).
    #[error("agent pubkey must be {PUBKEY_HEX_LEN} hex characters, got {0} bytes")]
    Length(usize),
    /// A character outside `0-9a-fA-F`.
    #[error("agent pubkey may only contain hex digits; found {found:?} at byte {at}")]
    NotHex {
        /// The offending character.
        found: char,
        /// Its byte offset in the input.
        at: usize,
    },
}

/// A validated, lower-case, 64-hex-character agent public key.
///
/// Cheap to clone (fixed-size, no heap) and safe to use as a file-name stem.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AgentPubkey([u8; PUBKEY_HEX_LEN]);

impl AgentPubkey {
    /// Validates and normalises `input` (upper-case hex is accepted and
    /// lowered). No surrounding whitespace is tolerated.
    pub fn parse(input: &str) -> Result<Self, PubkeyError> {
        if let Some((at, found)) = input.char_indices().find(|(_, c)| !c.is_ascii_hexdigit()) {
            return Err(PubkeyError::NotHex { found, at });
        }
        let bytes = input.as_bytes();
        if bytes.len() != PUBKEY_HEX_LEN {
            return Err(PubkeyError::Length(bytes.len()));
        }
        let mut out = [0u8; PUBKEY_HEX_LEN];
        for (dst, src) in out.iter_mut().zip(bytes) {
            *dst = src.to_ascii_lowercase();
        }
        Ok(Self(out))
    }

    /// The lower-case hex form.
    pub fn as_str(&self) -> &str {
        // Only ASCII hex digits are ever stored.
        std::str::from_utf8(&self.0).expect("pubkey bytes are ASCII hex")
    }

    /// The lock file name for this key: `<pubkey>.lock`.
    pub fn lock_file_name(&self) -> String {
        format!("{}.lock", self.as_str())
    }
}

impl fmt::Display for AgentPubkey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for AgentPubkey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AgentPubkey({})", self.as_str())
    }
}

impl FromStr for AgentPubkey {
    type Err = PubkeyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl Serialize for AgentPubkey {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for AgentPubkey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90";

    #[test]
    fn accepts_lower_and_normalises_upper() {
        let lower = AgentPubkey::parse(KEY).unwrap();
        let upper = AgentPubkey::parse(&KEY.to_ascii_uppercase()).unwrap();
        assert_eq!(lower, upper);
        assert_eq!(upper.as_str(), KEY);
        assert_eq!(upper.lock_file_name(), format!("{KEY}.lock"));
    }

    #[test]
    fn rejects_hostile_and_malformed_keys() {
        let too_long = format!("{KEY}0");
        let unicode = format!("{}é", &KEY[..62]);
        let cases: &[&str] = &[
            "",
            "../../etc/passwd",
            &KEY[..63],
            &too_long,
            "g1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90",
            "a1b2c3d4e5f60718293a4b5c6d7e8f90/1b2c3d4e5f60718293a4b5c6d7e8f90",
            "a1b2c3d4e5f60718293a4b5c6d7e8f90\\1b2c3d4e5f60718293a4b5c6d7e8f90",
            " a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9",
            &unicode,
            "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9\0",
        ];
        for case in cases {
            assert!(AgentPubkey::parse(case).is_err(), "accepted {case:?}");
        }
    }

    #[test]
    fn serde_round_trip_validates() {
        let pk: AgentPubkey = serde_json::from_str(&format!("\"{KEY}\"")).unwrap();
        assert_eq!(serde_json::to_string(&pk).unwrap(), format!("\"{KEY}\""));
        assert!(serde_json::from_str::<AgentPubkey>("\"../x\"").is_err());
    }
}
