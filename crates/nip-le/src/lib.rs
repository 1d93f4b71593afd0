//! # nip-le — the NIP-LE leader election engine
//!
//! Several running copies of an app signed in with the same agent identity
//! must answer each mention exactly once. NIP-LE elects one prompter per agent
//! key through a local lock file, `<lock dir>/<pubkey>.lock`, shared with the
//! existing Buzz agent harness byte for byte (see `INTEROP.md`).
//!
//! This crate is the engine only: no Tauri, no CLI parser, no signal
//! handler, no log formatter. The Tauri plugin, the `nip-le` CLI and any
//! agent process link it.
//!
//! One concept per module. What an app uses:
//! * [`pubkey`]: the validated agent key (it becomes a file name);
//! * [`identity`]: the per-window instance id;
//! * [`config`]: the one validated set of timings;
//! * [`read_side()`]: the NIP's read side whole, for processes that only
//!   read leadership;
//! * [`control`]: `claim_leadership` frames and local lead requests;
//! * `global` (feature `etcd`): extension, one prompter per agent across
//!   hosts, on etcd;
//! * [`elector`]: many keys, one writer thread, a lock-free snapshot for
//!   readers, and change events;
//! * [`agent`]: extension, an agent process that runs only while we lead.
//!
//! The internals (public for the `nip-le` CLI and the tests, hidden from
//! these docs, no stability promise): `record` (the lock record, parsed
//! defensively, written compatibly), `lockfile` (lock file I/O: no
//! symlinks, capped reads, bounded waits), `liveness` (is a holder's pid
//! running), `token` (the presence token a record names its holder by),
//! `election` (the NIP's read-side and acquire-side rules, pure),
//! `presence` (per-participant liveness locks), `ledger` (the work
//! ledger), `epoch` and `host`.
//!
//! ```no_run
//! use nip_le::{AgentPubkey, Config, Elector, InstanceId};
//!
//! let elector = Elector::start(Config::default_from_env()?, InstanceId::from_env()?)?;
//! let agent = AgentPubkey::parse(&"ab".repeat(32))?;
//! elector.join(&agent)?;
//! if elector.is_leader(&agent) {
//!     // dispatch the prompt, add the 👀 reaction, run the heartbeat
//! }
//! # Ok::<(), nip_le::Error>(())
//! ```

// The modules marked `#[doc(hidden)]` are the engine's internals: public
// for the `nip-le` CLI, the lab and the tests, with no stability promise.
// What an app uses is re-exported below or lives in `agent`, `config`,
// `control`, `elector`, `error`, `global`, `identity` and `pubkey`.
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

/// Whether a fixed defect is put back (`mutant`): `false` unless the
/// `mutants` feature is on and the defect switched on. First, so that
/// every module below sees it.
macro_rules! mutated {
    ($m:ident) => {
        $crate::mutant::on($crate::mutant::Mutant::$m)
    };
}

#[doc(hidden)]
pub mod mutant;

pub mod agent;
pub mod config;
pub mod control;
#[doc(hidden)]
pub mod election;
pub mod elector;
#[doc(hidden)]
pub mod epoch;
pub mod error;
#[cfg(feature = "etcd")]
#[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
pub mod global;
#[doc(hidden)]
pub mod host;
pub mod identity;
#[doc(hidden)]
pub mod ledger;
#[doc(hidden)]
pub mod liveness;
#[doc(hidden)]
pub mod lockfile;
#[doc(hidden)]
pub mod presence;
pub mod pubkey;
mod read_side;
#[doc(hidden)]
pub mod record;
#[cfg(feature = "sim")]
#[cfg_attr(docsrs, doc(cfg(feature = "sim")))]
pub mod sim;
mod start;
mod token;
mod work;

pub use config::{Backend, Config, Mode};
pub use control::{ControlFrame, ControlResult};
pub use elector::{
    ChangeReason, ClaimOutcome, ElectionStatus, Elector, GlobalHolder, GlobalStatus, HolderStatus,
    LeaderFlag, LeadershipChange, Level, LockState, QueuedEvent, TakeOutcome, Work,
};
pub use error::{Error, Result};
pub use identity::{InstanceId, ELECTION_ID_ENV};
pub use ledger::StateCounts;
pub use pubkey::AgentPubkey;
pub use read_side::read_side;
