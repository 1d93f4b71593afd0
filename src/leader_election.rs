//! The handle an app uses (through [`crate::LeaderElectionExt`]) and the
//! commands use: the engine's [`Elector`], with string pubkeys validated at
//! the boundary and plugin payload types out.

use std::sync::Arc;

use nip_le::elector::LeaderFlag;
use nip_le::{AgentPubkey, Elector, LeadershipChange};
use tokio::sync::broadcast;

use crate::error::Result;
use crate::models::{AgentStatus, ClaimOutcome, ControlResult, Status};

/// This window's participation in the elections of its agents. Cheap to
/// clone; all clones share one engine.
#[derive(Clone, Debug)]
pub struct LeaderElection {
    elector: Arc<Elector>,
}

fn key(pubkey: &str) -> Result<AgentPubkey> {
    Ok(AgentPubkey::parse(pubkey).map_err(nip_le::Error::from)?)
}

impl LeaderElection {
    pub(crate) fn new(elector: Elector) -> Self {
        Self {
            elector: Arc::new(elector),
        }
    }

    /// This window's election id. Pass it to agent processes you spawn in
    /// `BUZZ_INSTANCE_ELECTION_ID` so they act as this window.
    pub fn instance_id(&self) -> &str {
        self.elector.instance_id().as_str()
    }

    /// Whether this window is the prompter for `pubkey` (cached: no I/O).
    /// Errors for an invalid or unjoined key.
    pub fn is_leader(&self, pubkey: &str) -> Result<bool> {
        Ok(self.gate(pubkey)?.is_leader())
    }

    /// A handle whose `is_leader()` is one atomic load, for the dispatch,
    /// 👀 and heartbeat paths (NIP-LE (a)–(c)).
    pub fn gate(&self, pubkey: &str) -> Result<LeaderFlag> {
        Ok(self.elector.leader_flag(&key(pubkey)?)?)
    }

    /// Joins an agent's election and claims at once. Idempotent. Blocking
    /// file I/O (bounded by the lock wait): call it off the UI thread.
    pub fn join(&self, pubkey: &str) -> Result<bool> {
        Ok(self.elector.join(&key(pubkey)?)?)
    }

    /// Leaves an agent's election, releasing its lock if this window held it.
    pub fn leave(&self, pubkey: &str) -> Result<()> {
        Ok(self.elector.leave(&key(pubkey)?)?)
    }

    /// "This window wants to lead" (the sidebar's claim). Co-located windows
    /// hand over without a relay; see [`Elector::claim`].
    pub fn claim(&self, pubkey: &str) -> Result<ClaimOutcome> {
        Ok(self.elector.claim(&key(pubkey)?)?.into())
    }

    /// Releases the lock if this window holds it and stands down for the
    /// stand-down timeout. Returns whether a claim of ours was released.
    pub fn release(&self, pubkey: &str) -> Result<bool> {
        Ok(self.elector.release(&key(pubkey)?)?)
    }

    /// Handles a relay-delivered control frame (decrypted JSON) for `pubkey`
    /// and returns the `control_result` to send back, if any. Check NIP-AO
    /// authorisation (the frame comes from the agent's owner) first.
    pub fn handle_control_frame(&self, pubkey: &str, frame: &str) -> Result<Option<ControlResult>> {
        Ok(self
            .elector
            .handle_control_frame(&key(pubkey)?, frame)?
            .map(Into::into))
    }

    /// A snapshot of every joined agent (cached: no I/O).
    pub fn status(&self) -> Status {
        Status {
            instance_id: self.instance_id().to_owned(),
            pid: std::process::id(),
            lock_dir: self.elector.config().lock_dir.display().to_string(),
            agents: self
                .elector
                .status()
                .into_iter()
                .map(AgentStatus::from)
                .collect(),
        }
    }

    /// Every later leadership change of this window, for the app's Rust side.
    pub fn subscribe(&self) -> broadcast::Receiver<LeadershipChange> {
        self.elector.subscribe()
    }

    /// The engine itself, for anything this wrapper does not cover.
    pub fn engine(&self) -> &Elector {
        &self.elector
    }

    /// Releases every lock this window holds and stops refreshing. Called on
    /// `RunEvent::Exit`; idempotent.
    pub fn shutdown(&self) {
        self.elector.shutdown();
    }
}
