//! # nip-le — the NIP-LE leader election engine
//!
//! Several running copies of an app signed in with the same agent identity
//! must answer each mention exactly once. NIP-LE elects one prompter per agent
//! key through a local lock file, `<lock dir>/<pubkey>.lock`, shared with the
//! existing Buzz agent harness byte for byte (see `INTEROP.md`).
//!
//! This crate has no Tauri dependency: the plugin, the `nip-le` CLI and any
//! agent process link the same engine.
//!
//! One concept per module:
//! * [`pubkey`] — the validated agent key (it becomes a file name);
//! * [`identity`] — the per-window election id;
//! * [`config`] — the one validated set of timings;
//! * [`record`] — the lock record, parsed defensively, written compatibly;
//! * [`lockfile`] — lock file I/O (no symlinks, capped reads, bounded waits);
//! * [`liveness`] — is a holder's pid running;
//! * [`election`] — the read-side and acquire-side decisions;
//! * [`presence`] — extension: per-participant liveness locks;
//! * [`control`] — `claim_leadership` frames and local claim requests;
//! * [`elector`] — many keys, the refresh thread, the cache and the changes;
//! * [`cluster`] — driving `nip-le run` processes (demo, tests, benchmarks);
//! * [`feed`] — following an appended JSON-lines file (the simulated relay).
//!
//! ```no_run
//! use nip_le::{AgentPubkey, Config, Elector, InstanceId};
//!
//! let elector = Elector::start(Config::default_from_env()?, InstanceId::from_env_or_random())?;
//! let agent = AgentPubkey::parse(&"ab".repeat(32))?;
//! elector.join(&agent)?;
//! if elector.is_leader(&agent) {
//!     // dispatch the prompt, add the 👀 reaction, run the heartbeat
//! }
//! # Ok::<(), nip_le::Error>(())
//! ```

#![warn(missing_docs)]

pub mod cluster;
pub mod config;
pub mod control;
pub mod election;
pub mod elector;
pub mod error;
pub mod feed;
pub mod identity;
pub mod liveness;
pub mod lockfile;
pub mod presence;
pub mod pubkey;
pub mod record;

pub use config::{Config, Mode};
pub use control::{ControlFrame, ControlResult};
pub use elector::{
    ChangeReason, ClaimOutcome, ElectionStatus, Elector, HolderStatus, LeaderFlag, LeadershipChange,
};
pub use error::{Error, Result};
pub use identity::InstanceId;
pub use pubkey::AgentPubkey;
