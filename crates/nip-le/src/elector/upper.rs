//! The seam for a level of leadership above the host's file election (the
//! etcd contender of [`crate::global`], behind the `etcd` feature). The
//! writer tells it when this instance starts or stops leading its host for
//! a key and when the user claims; the upper level answers by setting the
//! key cell's permit (so `is_leader` and the ledger's fence check see it at
//! once, without waiting for the writer) and by news through the writer's
//! mailbox (so changes are announced and published by the one writer).

use std::sync::Arc;

use crate::error::Result;
use crate::pubkey::AgentPubkey;

use super::cache::KeyCell;
use super::types::{ChangeReason, GlobalStatus};

/// A level above the host.
pub(crate) trait UpperLevel: Send {
    /// Our host id.
    fn host_id(&self) -> &str;

    /// We lead our host for `pubkey` now (`leads`), or stopped. `revoke`:
    /// we stopped and no sibling of this host took the lock from us, so the
    /// agent should be given up at once (not left for a sibling to
    /// continue).
    fn host_leader(&mut self, pubkey: AgentPubkey, cell: &Arc<KeyCell>, leads: bool, revoke: bool);

    /// The user claims `pubkey` for this window (which may not lead its
    /// host yet: the claim is posted once it does).
    fn claim(&mut self, pubkey: AgentPubkey, cell: &Arc<KeyCell>);

    /// Gives up whatever is still held (after the writer stepped down
    /// everywhere) and stops.
    fn shutdown(&mut self);
}

/// What the upper level tells the writer about one key.
#[derive(Debug, Clone)]
pub(crate) struct UpperNews {
    /// Why our answer changed; `None`: only the status view changed.
    pub reason: Option<ChangeReason>,
    /// The view to publish.
    pub status: GlobalStatus,
    /// A gain from a holder on another host: its work ledger is not ours,
    /// so what it may have answered is unknown here (see
    /// [`crate::Work::owed`]).
    pub from_other_host: bool,
    /// When the permit changed (unix ms), stamped by the upper level at
    /// the moment it opened or closed it, not when the writer got to it.
    pub at_ms: u64,
}

/// How the upper level tells the writer (through its mailbox).
pub(crate) type Tell = Box<dyn Fn(AgentPubkey, UpperNews) + Send>;

/// Builds the level above the host once the writer's mailbox exists. The
/// elector never names the etcd level: its caller (`crate::start`) hands
/// the builder in.
pub(crate) type UpperBuilder = Box<dyn FnOnce(Tell) -> Result<Option<Box<dyn UpperLevel>>>>;

/// No level above the host: leading the host is all there is.
pub(crate) fn none() -> UpperBuilder {
    Box::new(|_| Ok(None))
}
