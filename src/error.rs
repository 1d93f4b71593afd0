//! The plugin's error: typed on the Rust side, and serialised for IPC as
//! `{"kind": "...", "message": "..."}` so the frontend can branch on `kind`
//! instead of parsing strings.

use serde::{Serialize, Serializer};

/// What went wrong, as the frontend sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export_to = "ErrorKind.ts"))]
// snake_case, as every other enum value across IPC (`fail_safe`,
// `already_taken`, `claim_leadership`).
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorKind {
    /// The agent pubkey is not 64 hex characters.
    InvalidPubkey,
    /// The instance id is unusable.
    InvalidInstanceId,
    /// The plugin configuration was rejected.
    InvalidConfig,
    /// The agent has not been joined by this window.
    NotJoined,
    /// A `claim_leadership` frame is malformed.
    InvalidControlFrame,
    /// An event id is unusable in the work ledger.
    InvalidEventId,
    /// A peer held the lock file longer than the configured wait.
    LockTimeout,
    /// The lock path is a symlink, a directory or another non-file, or the
    /// lock directory is not the user's (another owner, or writable by others).
    UnsafeLockPath,
    /// Another filesystem error.
    Io,
    /// The plugin has shut down (the app is exiting).
    ShutDown,
    /// The app does not let its webviews act on this agent (see
    /// `Builder::allow_agents` and `LeaderElection::allow_agent`).
    NotAllowed,
    /// A page settled (`done`, `give_back`) an event no page of this
    /// process holds a take of.
    NotTaken,
    /// A `done` or `give_back` took effect, but the disk has not made its
    /// line durable yet (it refused the write: kept and written as soon as
    /// it takes one; or the sync failed). Never send the reply again
    /// because of it; the status's `workDegraded` says why until a later
    /// line is synced.
    NotDurable,
}

/// The wire form of an error: its kind and message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export_to = "LeaderElectionError.ts"))]
pub struct LeaderElectionError {
    /// Machine-readable kind.
    pub kind: ErrorKind,
    /// Human-readable detail.
    pub message: String,
}

/// Errors of the plugin's Rust API and commands.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An error from the election engine.
    #[error(transparent)]
    Engine(#[from] nip_le::Error),
    /// A blocking task could not be joined (it panicked or was cancelled).
    #[error("background task failed: {0}")]
    Task(String),
    /// A webview named an agent the app does not let its webviews join,
    /// claim or release (deny by default: see `Builder::allow_agents` and
    /// `LeaderElection::allow_agent`).
    #[error("webviews may not act on agent {0}: the app does not allow it")]
    NotAllowed(nip_le::AgentPubkey),
    /// A webview settled (`done`, `give_back`) an event that no page of
    /// this process took, or whose turn already ended: a page may settle
    /// only its own process's takes (the Rust API may settle any).
    #[error("no page of this process holds a take of event {event_id} of agent {pubkey}")]
    NotTaken {
        /// The agent.
        pubkey: nip_le::AgentPubkey,
        /// The event.
        event_id: String,
    },
}

impl Error {
    /// The kind reported to the frontend.
    pub fn kind(&self) -> ErrorKind {
        use nip_le::Error as E;
        match self {
            Error::Engine(E::Pubkey(_)) => ErrorKind::InvalidPubkey,
            Error::Engine(E::InstanceId(_)) => ErrorKind::InvalidInstanceId,
            // An agent command is configuration too.
            Error::Engine(E::Config(_) | E::AgentCommand(_)) => ErrorKind::InvalidConfig,
            Error::Engine(E::NotJoined(_)) => ErrorKind::NotJoined,
            Error::Engine(E::ControlFrame(_)) => ErrorKind::InvalidControlFrame,
            Error::Engine(E::EventId(_)) => ErrorKind::InvalidEventId,
            Error::Engine(E::LockTimeout { .. }) => ErrorKind::LockTimeout,
            Error::Engine(
                E::Symlink { .. }
                | E::NotRegularFile { .. }
                | E::NotADirectory { .. }
                | E::UnsafeLockDir { .. },
            ) => ErrorKind::UnsafeLockPath,
            Error::Engine(E::ShutDown) => ErrorKind::ShutDown,
            Error::Engine(E::NotDurable { .. }) => ErrorKind::NotDurable,
            Error::Engine(E::Io { .. }) | Error::Task(_) => ErrorKind::Io,
            // An engine error newer than this mapping: an I/O failure is
            // the kind a caller already retries or reports.
            Error::Engine(_) => ErrorKind::Io,
            Error::NotAllowed(_) => ErrorKind::NotAllowed,
            Error::NotTaken { .. } => ErrorKind::NotTaken,
        }
    }
}

impl Serialize for Error {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        LeaderElectionError {
            kind: self.kind(),
            message: self.to_string(),
        }
        .serialize(s)
    }
}

/// Result alias for the plugin.
pub type Result<T> = std::result::Result<T, Error>;
