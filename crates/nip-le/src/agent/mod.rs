//! Extension: a leader-gated agent process. Buzz's desktop starts its agent
//! harness (`buzz-acp`) through its own process manager; upstream's harness
//! no longer reads the lock file and takes an exclusive instance lease
//! instead, so without a gate a second Buzz on the machine leaves its
//! agent failing to start, with no standby and no failover. The election's
//! job there is which app process runs each agent's harness:
//!
//! * [`AgentRunner`] is the seam an app implements to start and stop its
//!   own agent process for a key (Buzz's controller would);
//!   [`CommandRunner`] is the engine's own, for a plain command line;
//! * an [`AgentSupervisor`] per key decides when, by the pure rules of
//!   [`machine::AgentMachine`]: start only while this process may act;
//!   stop on every loss; a start refused as busy (the predecessor's agent
//!   still holds its lease) retried soon; one call at a time; restarts of
//!   a crashed agent backed off;
//! * a step-down this process chooses (another window's claim, a release, a
//!   leave) gives the lock up only once the agent has stopped, so the
//!   successor's start finds the lease free; a graceful exit stops the
//!   agents before the elector shuts down;
//! * an agent left behind by a window that died or hung is stopped by
//!   whoever leads the host next ([`orphan`]), and stops reach its whole
//!   process tree.
//!
//! What each platform guarantees when the window itself is killed:
//! `docs/platforms.md`.

mod agent_command;
mod command;
pub mod machine;
pub mod orphan;
mod process;
mod runner;
mod supervisor;
mod tree;

use serde::{Deserialize, Serialize};

pub use agent_command::AgentCommand;
pub use command::CommandRunner;
pub use machine::AgentTimings;
pub use runner::{AgentExit, AgentExits, AgentRunner, AgentStart, StartError, StopOutcome};
pub use supervisor::{AgentSupervisor, POLL};

use crate::pubkey::AgentPubkey;

/// What the agent process did, for JSON lines and change events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS), ts(export_to = "AgentEvent.ts"))]
#[serde(tag = "what", rename_all = "snake_case")]
#[non_exhaustive]
pub enum AgentEvent {
    /// Started, with its pid.
    Started {
        /// Its pid.
        pid: u32,
    },
    /// Exited by itself while we could act (it is restarted after the
    /// backoff).
    Exited {
        /// Its pid.
        pid: u32,
        /// Its exit code, when it exited.
        code: Option<i32>,
        /// The signal that ended it (Unix), when one did.
        signal: Option<i32>,
        /// It exited because its instance lease is held elsewhere (retried
        /// soon).
        busy: bool,
    },
    /// Stopped by us: the lead was lost or given up, or the supervisor
    /// stopped.
    Stopped {
        /// Its pid.
        pid: u32,
        /// Whether it needed SIGKILL after the grace.
        killed: bool,
    },
    /// The agent of a window that is gone, named by the agent mark
    /// ([`orphan`]), was stopped before ours started.
    OrphanStopped {
        /// Its pid.
        pid: u32,
        /// Whether it needed SIGKILL after the grace.
        killed: bool,
    },
    /// The agent could not be started (retried after the backoff).
    StartFailed {
        /// Why.
        error: String,
        /// Its instance lease is held elsewhere, by the predecessor's agent
        /// that is stopping (retried soon).
        busy: bool,
    },
}

/// One agent event (`AgentEvent`) of one agent key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS), ts(export_to = "AgentReport.ts"))]
#[serde(rename_all = "camelCase")]
pub struct AgentReport {
    /// The agent key whose process this is.
    #[cfg_attr(feature = "ts", ts(type = "string"))]
    pub pubkey: AgentPubkey,
    /// When it happened (ms since the Unix epoch).
    pub at_ms: u64,
    /// What happened.
    #[serde(flatten)]
    pub event: AgentEvent,
}
