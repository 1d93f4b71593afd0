//! Extension: a leader-gated agent process. Buzz's desktop spawns its agent
//! harness (`buzz-acp`) as a child; upstream's harness no longer reads the
//! lock file and takes an exclusive instance lease instead, so without a
//! gate a second Buzz build on the machine leaves its agent failing to
//! start, with no standby and no failover. An [`AgentSupervisor`] runs the
//! command only while this window may act for the agent, with
//! `BUZZ_INSTANCE_ELECTION_ID` set to the window's election id:
//!
//! * started when we may act, stopped (SIGTERM, `grace`, SIGKILL; on
//!   Windows `TerminateProcess` at once) on any loss of leadership;
//! * restarted with a bounded, doubling backoff if it exits while we may act
//!   (for example because the predecessor's agent still holds upstream's
//!   instance lease while it stops);
//! * on Linux's native backend the child is killed by the kernel when the
//!   window dies (`PR_SET_PDEATHSIG`), so a SIGKILLed window leaves no
//!   agent acting unseen. On macOS and Windows (and Linux's portable
//!   backend) the successor stops it before it starts its own
//!   ([`orphan`]): see `docs/platforms.md`.
//!
//! The rules are the pure [`machine::AgentMachine`]; this module and
//! [`AgentSupervisor`] only spawn, signal and reap.

pub mod machine;
pub mod orphan;
mod process;
mod supervisor;

use std::ffi::OsString;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use machine::AgentTimings;
pub use supervisor::AgentSupervisor;

use crate::pubkey::AgentPubkey;

/// The agent command and its timings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentCommand {
    /// The program (looked up in `PATH` when it has no directory).
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Variables added to (or replacing those of) the inherited environment;
    /// `BUZZ_INSTANCE_ELECTION_ID` is always set to the window's id.
    pub env: Vec<(OsString, OsString)>,
    /// Stop and restart timings (defaults: grace 5 s, backoff 250 ms to
    /// 10 s).
    pub timings: AgentTimings,
    /// How often the supervisor looks at the leadership between events
    /// (default 50 ms): the longest delay between a loss of leadership and
    /// the SIGTERM.
    pub poll: Duration,
}

impl AgentCommand {
    /// `program` with `args`, default timings.
    pub fn new<P, I, A>(program: P, args: I) -> Self
    where
        P: Into<OsString>,
        I: IntoIterator<Item = A>,
        A: Into<OsString>,
    {
        Self {
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
            env: Vec::new(),
            timings: AgentTimings {
                grace: Duration::from_secs(5),
                backoff_min: Duration::from_millis(250),
                backoff_max: Duration::from_secs(10),
            },
            poll: Duration::from_millis(50),
        }
    }

    /// Checks the timings: every one positive, the backoff's bounds in
    /// order, none above an hour, the poll at most a second.
    pub fn validate(&self) -> Result<(), String> {
        let t = &self.timings;
        let hour = Duration::from_secs(3600);
        if t.grace > hour || t.backoff_max > hour {
            return Err("agent grace and backoff must not exceed an hour".into());
        }
        if self.program.is_empty() {
            return Err("the agent command is empty".into());
        }
        if t.grace.is_zero() || t.backoff_min.is_zero() || self.poll.is_zero() {
            return Err("agent grace, backoff and poll must be greater than zero".into());
        }
        if t.backoff_min > t.backoff_max {
            return Err(format!(
                "agent backoff_min ({:?}) exceeds backoff_max ({:?})",
                t.backoff_min, t.backoff_max
            ));
        }
        if self.poll > Duration::from_secs(1) {
            return Err(format!("agent poll ({:?}) exceeds 1 s", self.poll));
        }
        Ok(())
    }
}

/// What the agent process did, for JSON lines and change events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS), ts(export_to = "AgentEvent.ts"))]
#[serde(tag = "what", rename_all = "snake_case")]
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
    },
    /// Stopped by us: leadership was lost or the supervisor stopped.
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
    /// The command could not be started.
    SpawnFailed {
        /// Why.
        error: String,
    },
}

/// One [`AgentEvent`] of one agent key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_validated() {
        let ok = AgentCommand::new("agent", ["--x"]);
        ok.validate().unwrap();
        let mut c = ok.clone();
        c.program = OsString::new();
        assert!(c.validate().is_err());
        let mut c = ok.clone();
        c.timings.grace = Duration::ZERO;
        assert!(c.validate().is_err());
        let mut c = ok.clone();
        c.timings.backoff_min = Duration::from_secs(60);
        assert!(c.validate().is_err());
        let mut c = ok.clone();
        c.poll = Duration::from_secs(5);
        assert!(c.validate().is_err());
        let mut c = ok;
        c.timings.grace = Duration::MAX;
        assert!(c.validate().is_err(), "never an Instant overflow");
    }
}
