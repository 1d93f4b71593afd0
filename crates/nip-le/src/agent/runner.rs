//! The runner seam: what an app implements to start and stop its own agent
//! process for a key. Buzz's desktop starts its harness through its own
//! process manager (a cleared environment, a per-start key, a working
//! directory, a guardian process, a session or Job Object kill); that
//! manager implements [`AgentRunner`], and the engine decides when it is
//! called ([`super::machine`]). [`super::CommandRunner`] is the engine's own
//! implementation, for a plain command line.
//!
//! Every call is made on the key's supervisor thread, one at a time: a
//! runner needs no locking of its own, and may block (a start that waits
//! for its process to come up, a stop that waits for it to be gone).

use std::path::PathBuf;
use std::sync::Arc;

use crate::pubkey::AgentPubkey;

use super::orphan;

/// Starts and stops the agent process of one key.
pub trait AgentRunner: Send + 'static {
    /// Starts the agent. Called only while this process may act for the
    /// key, and never while an agent this runner started for it still
    /// runs. As soon as the agent's process exists, and before it can act,
    /// call [`AgentStart::started`] with its pid: the engine names it in
    /// the agent mark there, so that a successor can stop it should this
    /// process die. Pass [`AgentStart::instance_id`] to the agent in
    /// `BUZZ_INSTANCE_ELECTION_ID` if it reads the lock file. Returns the
    /// pid; answer [`StartError::Busy`] when the agent's instance lease is
    /// held elsewhere (the predecessor's agent still stopping): the start
    /// is retried soon.
    fn start(&mut self, start: &AgentStart) -> Result<u32, StartError>;

    /// Stops the agent started with `pid` and everything it started, and
    /// returns once they are gone (the agent's instance lease is then
    /// free). An agent that outlives the runner's grace is killed.
    fn stop(&mut self, pid: u32) -> StopOutcome;

    /// The agent started with `pid` has exited by itself (the runner
    /// reported it through [`AgentStart::exits`]): reap it and everything
    /// it left, and say how it ended.
    fn exited(&mut self, pid: u32) -> AgentExit;
}

/// Why a start did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The agent's instance lease is held elsewhere: retried after
    /// [`super::AgentTimings::busy_min`], doubling to `busy_max`.
    #[error("the agent's instance lease is held elsewhere: {0}")]
    Busy(String),
    /// Anything else: reported, and retried after
    /// [`super::AgentTimings::backoff_min`], doubling to `backoff_max`.
    #[error("{0}")]
    Failed(String),
}

/// How a stop went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StopOutcome {
    /// The agent outlived the grace and was killed.
    pub killed: bool,
}

/// How an agent that exited by itself ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AgentExit {
    /// Its exit code, when it exited.
    pub code: Option<i32>,
    /// The signal that ended it (Unix), when one did.
    pub signal: Option<i32>,
    /// It exited because its instance lease is held elsewhere: retried
    /// soon, like [`StartError::Busy`].
    pub busy: bool,
}

/// What a start is given.
#[derive(Debug)]
pub struct AgentStart {
    pub(super) pubkey: AgentPubkey,
    pub(super) instance_id: String,
    pub(super) lock_dir: PathBuf,
    pub(super) exits: AgentExits,
}

impl AgentStart {
    /// The agent key.
    pub fn pubkey(&self) -> &AgentPubkey {
        &self.pubkey
    }

    /// This process's instance id: the agent's `BUZZ_INSTANCE_ELECTION_ID`.
    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }

    /// The agent's process exists as `pid` (it has not acted yet): named
    /// in the agent mark, durably, before this returns. A mark that cannot
    /// be written is logged and the start goes on (an agent that does not
    /// run is worse than one a successor cannot name).
    pub fn started(&self, pid: u32) {
        orphan::name_agent(&self.lock_dir, &self.pubkey, &self.instance_id, pid);
    }

    /// Where to report that the agent exited by itself.
    pub fn exits(&self) -> AgentExits {
        self.exits.clone()
    }
}

/// Reports the exits of a runner's agents to their supervisor (from any
/// thread).
#[derive(Clone)]
pub struct AgentExits(Arc<dyn Fn(u32) + Send + Sync>);

impl std::fmt::Debug for AgentExits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AgentExits")
    }
}

impl AgentExits {
    /// Reports to `tell`.
    pub(super) fn new(tell: impl Fn(u32) + Send + Sync + 'static) -> Self {
        Self(Arc::new(tell))
    }

    /// The agent with `pid` has exited by itself. The supervisor then calls
    /// [`AgentRunner::exited`] (unless it had asked for a stop).
    pub fn exited(&self, pid: u32) {
        (self.0)(pid);
    }
}
