//! The messages the facade (and the global level) send the
//! writer, and where their answers go.

use std::sync::{mpsc, Arc};

use crate::error::{Error, Result};
use crate::pubkey::AgentPubkey;

use super::global_level::GlobalNews;
use super::types::{ClaimOutcome, QueuedEvent, TakeOutcome};

/// Where a command's answer goes.
pub(crate) type Reply<T> = mpsc::SyncSender<Result<T>>;

/// What the facade asks of the writer.
pub(crate) enum Command {
    Join(Vec<AgentPubkey>, Reply<Vec<bool>>),
    Leave(AgentPubkey, Reply<()>),
    Claim(AgentPubkey, Reply<ClaimOutcome>),
    Release(AgentPubkey, Reply<bool>),
    StandDown(AgentPubkey, Reply<()>),
    Resume(AgentPubkey, Reply<bool>),
    /// A `claim_leadership` frame naming this target.
    ClaimFrame(AgentPubkey, String, Reply<bool>),
    RefreshNow(Reply<()>),
    Shutdown(Reply<()>),
    /// A work-ledger operation on a key.
    Work(AgentPubkey, WorkOp, WorkReply),
    /// News from the global level.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    Global(AgentPubkey, GlobalNews),
    /// A renewal made beside the global level's task.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    Renewed(AgentPubkey, super::global_level::Renewed),
}

/// A work-ledger operation (see [`crate::Work`]).
#[derive(Debug)]
pub(crate) enum WorkOp {
    /// An event id, and when it was published if the app said.
    Take(String, Option<u64>),
    Done(String),
    GiveBack(String),
    /// The app's whole queue, shared: a simulated app passes its own
    /// (copied only if it changes while the writer reads it).
    Owed(Arc<Vec<QueuedEvent>>),
}

/// Where a work-ledger answer goes.
pub(crate) enum WorkReply {
    Take(Reply<TakeOutcome>),
    Flag(Reply<bool>),
    Owed(Reply<Vec<String>>),
}

impl WorkReply {
    pub(crate) fn fail(self, e: Error) {
        match self {
            WorkReply::Take(r) => drop(r.send(Err(e))),
            WorkReply::Flag(r) => drop(r.send(Err(e))),
            WorkReply::Owed(r) => drop(r.send(Err(e))),
        }
    }
}
