//! The seam for a level of leadership above the host's file election (the
//! etcd contender of [`crate::global`], behind the `etcd` feature). The
//! writer tells it when this instance starts or stops leading its host for
//! a key and when the user claims; the upper level answers with news
//! through the writer's mailbox, each carrying the permit it grants now.
//! The writer alone sets the key cell's permit and announces: one writer.
//! A permit ends on its own at its deadline, so news that arrives late
//! never extends what etcd granted; an upper level that must know the
//! permit is closed before it acts (a hand-over to another host) asks the
//! writer to confirm ([`UpperLevel::withdrawn`]).

use std::sync::Arc;

use crate::error::Result;
use crate::pubkey::AgentPubkey;

use super::types::{ChangeReason, GlobalStatus};

/// What the upper level lets this window do for a key: one of
/// [`super::cache::global_state`] and, for `HELD`, the
/// [`super::cache::boot_nanos`] deadline of the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Permit {
    pub state: u8,
    pub until: u64,
}

impl Permit {
    /// No permit: another host holds the key, or nobody does yet.
    pub(crate) const NOT_HELD: Self = Self {
        state: super::cache::global_state::NOT_HELD,
        until: 0,
    };
}

/// A level above the host.
pub(crate) trait UpperLevel: Send {
    /// Our host id.
    fn host_id(&self) -> &str;

    /// We lead our host for `pubkey` now (`leads`), or stopped. `revoke`:
    /// we stopped and no sibling of this host took the lock from us, so the
    /// agent should be given up at once (not left for a sibling to
    /// continue).
    /// `tenure` numbers our host leaderships of the key: news carries the
    /// one it belongs to, so a permit of an earlier one is never applied.
    /// `locked`: we hold the host's lock file (not the NIP's fail-safe,
    /// where a sibling may lead the host too).
    fn host_leader(
        &mut self,
        pubkey: AgentPubkey,
        leads: bool,
        locked: bool,
        revoke: bool,
        tenure: u64,
    );

    /// The user claims `pubkey` for this window (which may not lead its
    /// host yet: the claim is posted once it does).
    fn claim(&mut self, pubkey: AgentPubkey);

    /// The writer closed the permit of news that asked for a confirmation
    /// ([`UpperNews::confirm`]).
    fn withdrawn(&mut self, pubkey: AgentPubkey);

    /// We granted a take of event `id` under the permit: the upper level
    /// records it (fenced by its hold), so that another host that gains the
    /// agent leaves it to us while this window runs. Told in order with
    /// [`UpperLevel::withdrawn`]: a hand-over to another host comes after
    /// the record.
    fn took(&mut self, pubkey: AgentPubkey, id: &str);

    /// A take of ours ended: `done` (the reply was sent; recorded for every
    /// host, whoever leads by now) or given back (owed again).
    fn settled(&mut self, pubkey: AgentPubkey, id: &str, done: bool);

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
    /// What we may do now (applied only within `tenure`).
    pub permit: Permit,
    /// The host leadership this news belongs to.
    pub tenure: u64,
    /// The upper level waits for [`UpperLevel::withdrawn`] before it acts.
    pub confirm: bool,
    /// A gain from a holder on another host, whose work ledger is not ours:
    /// what was published before this time (unix ms) it may have answered,
    /// unknown here, so only what is published since is owed (see
    /// [`crate::Work::owed`]). `None`: a gain from our own host.
    pub unknown_before_ms: Option<u64>,
    /// When the permit changed (unix ms), stamped by the upper level at
    /// the moment it opened or closed it, not when the writer got to it.
    pub at_ms: u64,
    /// What the upper level knows of the agent's work on every host, read
    /// when we gain the key (and again while another window's takes are
    /// in flight); `None`: unchanged, or it could not be read.
    pub work: Option<Arc<SharedWork>>,
    /// We hold the key, but its work records could not be read yet: nothing
    /// is owed until they are (what another host answered is unknown).
    pub work_unread: bool,
}

/// The agent's work as the level above records it (its rules: [`crate::work`]).
pub(crate) use crate::work::SharedWork;

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
