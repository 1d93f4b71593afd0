//! The crate's error type. Every fallible public call returns it; nothing in
//! the engine panics on bad input.

use std::path::PathBuf;
use std::time::Duration;

use crate::config::ConfigError;
use crate::identity::InstanceIdError;
use crate::pubkey::{AgentPubkey, PubkeyError};

/// Errors from the election engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The agent pubkey is not 64 hex characters.
    #[error("invalid agent pubkey: {0}")]
    Pubkey(#[from] PubkeyError),
    /// The instance id is unusable.
    #[error("invalid instance id: {0}")]
    InstanceId(#[from] InstanceIdError),
    /// The configuration failed validation.
    #[error("invalid configuration: {0}")]
    Config(#[from] ConfigError),
    /// The call names an agent this elector has not joined.
    #[error("agent {0} has not been joined")]
    NotJoined(AgentPubkey),
    /// The lock path is a symbolic link; lock files are never followed.
    #[error("{}: is a symbolic link; refusing to follow it", path.display())]
    Symlink {
        /// The offending path.
        path: PathBuf,
    },
    /// Something other than a regular file sits at the lock path.
    #[error("{}: is a {kind}, not a regular file", path.display())]
    NotRegularFile {
        /// The offending path.
        path: PathBuf,
        /// What it is instead (directory, fifo, …).
        kind: &'static str,
    },
    /// The lock directory path exists but is not a directory.
    #[error("{}: lock directory is not a directory", path.display())]
    NotADirectory {
        /// The offending path.
        path: PathBuf,
    },
    /// The lock directory is not ours: another user owns it, or others may
    /// write in it, so a record or mark in it could be anyone's. Refused.
    #[error("{}: lock directory refused: {why}; it must belong to you (or root) and be writable by no one else (chmod 700)", path.display())]
    UnsafeLockDir {
        /// The directory.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// A peer held the exclusive lock for longer than the configured wait;
    /// the attempt changed nothing.
    #[error("{}: exclusive lock not obtained within {waited:?}", path.display())]
    LockTimeout {
        /// The lock file.
        path: PathBuf,
        /// How long we waited.
        waited: Duration,
    },
    /// An I/O error on a path.
    #[error("{}: {source}", path.display())]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A control frame of a known type is malformed.
    #[error("invalid control frame: {0}")]
    ControlFrame(String),
    /// An event id is unusable in the work ledger.
    #[error("invalid event id: {0}")]
    EventId(String),
    /// The elector has been shut down.
    #[error("the elector has been shut down")]
    ShutDown,
    /// A work-ledger line (a `done`, a give-back, or a line written with a
    /// take) is applied, but the disk has not made it durable: it refused
    /// the write (the line is kept and written as soon as it takes one) or
    /// failed to sync it (the line is in the file, where every process
    /// reads it, but a power cut may lose it). The settle itself took
    /// effect: never send its reply again because of this error.
    #[error("the work ledger's line is applied but not durable yet: {why}")]
    NotDurable {
        /// What the disk said.
        why: String,
    },
    /// A supervised agent command is unusable (see [`crate::agent`]).
    #[error("invalid agent command: {0}")]
    AgentCommand(String),
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}

/// Result alias for the engine.
pub type Result<T, E = Error> = std::result::Result<T, E>;
