//! The seam for the global level above the host's file election (the
//! etcd contender of `crate::global`, behind the `etcd` feature). The
//! writer tells it when this instance starts or stops leading its host for
//! a key and when the user claims; the global level answers with news
//! through the writer's mailbox, each carrying the permit it grants now.
//! The writer alone sets the key cell's permit and announces: one writer.
//! A permit ends on its own at its deadline, so news that arrives late
//! never extends what etcd granted; a global level that must know the
//! permit is closed before it acts (a hand-over to another host) asks the
//! writer to confirm ([`GlobalLevel::withdrawn`]). A renewal made beside
//! the global level's task ([`Renewed`]) only raises the deadline of the
//! permit the writer holds now, for the same lease: it opens nothing.

use std::sync::Arc;

use crate::error::Result;
use crate::pubkey::AgentPubkey;

use super::cache::global_state;
use super::types::{ChangeReason, GlobalStatus};

/// What a permit lets the window do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PermitState {
    /// Nothing: another host holds the key, or nobody does yet.
    NotHeld,
    /// Act until the permit's deadline: we hold the key's lease.
    Held,
    /// Act for this host alone, with no deadline: etcd is out of reach and
    /// the policy is to fall back. (Only the etcd level grants it.)
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    FallBack,
}

impl PermitState {
    /// Its value in the key cell ([`global_state`]), which readers load
    /// without a lock.
    pub(crate) fn code(self) -> u8 {
        match self {
            Self::NotHeld => global_state::NOT_HELD,
            Self::Held => global_state::HELD,
            Self::FallBack => global_state::FALLBACK,
        }
    }
}

/// What the global level lets this window do for a key, and for a held
/// one the [`super::cache::boot_nanos`] deadline of the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Permit {
    pub state: PermitState,
    pub until: u64,
    /// The lease a held permit stands on (0: none): a [`Renewed`] of
    /// another lease raises nothing.
    pub lease: i64,
}

impl Permit {
    /// No permit: another host holds the key, or nobody does yet.
    pub(crate) const NOT_HELD: Self = Self {
        state: PermitState::NotHeld,
        until: 0,
        lease: 0,
    };

    /// The permit news grants (`self`), where `now` is the one set: a
    /// renewal beside the task may have raised the same lease's deadline
    /// past what the task knows yet, and the later deadline stands.
    pub(crate) fn over(self, now: Self) -> Self {
        let same = self.state == PermitState::Held
            && now.state == PermitState::Held
            && self.lease == now.lease;
        Self {
            until: if same {
                self.until.max(now.until)
            } else {
                self.until
            },
            ..self
        }
    }

    /// This permit once `r` is applied at `now_nanos`: raised when it is
    /// open (held, not past its deadline) on `r`'s lease; otherwise
    /// unchanged (a lapsed permit is reopened by the task, which says so).
    /// The caller checks that `r` belongs to the current host leadership.
    pub(crate) fn renewed(self, r: &Renewed, now_nanos: u64) -> Self {
        let open = self.state == PermitState::Held && now_nanos < self.until;
        Self {
            until: if open && r.lease == self.lease {
                self.until.max(r.until)
            } else {
                self.until
            },
            ..self
        }
    }
}

/// The global level (etcd).
pub(crate) trait GlobalLevel: Send {
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
    /// ([`GlobalNews::confirm`]).
    fn withdrawn(&mut self, pubkey: AgentPubkey);

    /// We granted a take of event `id` under the permit: the global level
    /// records it (fenced by its hold), so that another host that gains the
    /// agent leaves it to us while this window runs. Told in order with
    /// [`GlobalLevel::withdrawn`]: a hand-over to another host comes after
    /// the record.
    fn took(&mut self, pubkey: AgentPubkey, id: &str);

    /// A take of ours ended: `done` (the reply was sent; recorded for every
    /// host, whoever leads by now) or given back (owed again).
    fn settled(&mut self, pubkey: AgentPubkey, id: &str, done: bool);

    /// Gives up whatever is still held (after the writer stepped down
    /// everywhere) and stops.
    fn shutdown(&mut self);
}

/// What the global level tells the writer about one key.
#[derive(Debug, Clone)]
pub(crate) struct GlobalNews {
    /// Why our answer changed; `None`: only the status view changed.
    pub reason: Option<ChangeReason>,
    /// The view to publish.
    pub status: GlobalStatus,
    /// What we may do now (applied only within `tenure`).
    pub permit: Permit,
    /// The host leadership this news belongs to.
    pub tenure: u64,
    /// The global level waits for [`GlobalLevel::withdrawn`] before it acts.
    pub confirm: bool,
    /// A gain from a holder on another host, whose work ledger is not ours:
    /// what was published before this time (unix ms) it may have answered,
    /// unknown here, so only what is published since is owed (see
    /// [`crate::Work::owed`]). `None`: a gain from our own host.
    pub unknown_before_ms: Option<u64>,
    /// When the permit changed (unix ms), stamped by the global level at
    /// the moment it opened or closed it, not when the writer got to it.
    pub at_ms: u64,
    /// What the global level knows of the agent's work on every host, read
    /// when we gain the key (and again while another window's takes are
    /// in flight); `None`: unchanged, or it could not be read.
    pub work: Option<Arc<SharedWork>>,
    /// We hold the key, but its work records could not be read yet: nothing
    /// is owed until they are (what another host answered is unknown).
    pub work_unread: bool,
}

/// The agent's work as the global level records it (its rules: [`crate::work`]).
pub(crate) use crate::work::SharedWork;

/// A lease renewed beside the global level's task, while the task was busy
/// (see `global::contender::renewer`): lease `lease` lives until `until`
/// (a [`super::cache::boot_nanos`] deadline) and the key still named us.
/// The writer raises the deadline of a permit that is still open on that
/// lease within `tenure`, and does nothing else: the task alone opens and
/// closes permits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Renewed {
    pub tenure: u64,
    pub lease: i64,
    pub until: u64,
}

/// How the global level tells the writer (through its mailbox).
pub(crate) type Tell = Box<dyn Fn(AgentPubkey, GlobalNews) + Send>;

/// How renewals beside the task reach the writer (through its mailbox).
pub(crate) type TellRenewed = Arc<dyn Fn(AgentPubkey, Renewed) + Send + Sync>;

/// Builds the global level once the writer's mailbox exists. The
/// elector never names the etcd level: its caller (`crate::start`) hands
/// the builder in.
pub(crate) type GlobalBuilder =
    Box<dyn FnOnce(Tell, TellRenewed) -> Result<Option<Box<dyn GlobalLevel>>>>;

/// No global level: leading the host is all there is.
pub(crate) fn none() -> GlobalBuilder {
    Box::new(|_, _| Ok(None))
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn held(lease: i64, until: u64) -> Permit {
        Permit {
            state: PermitState::Held,
            until,
            lease,
        }
    }

    const fn renewal(lease: i64, until: u64) -> Renewed {
        Renewed {
            tenure: 1,
            lease,
            until,
        }
    }

    #[test]
    fn a_renewal_raises_only_an_open_permit_on_its_lease() {
        assert_eq!(held(7, 100).renewed(&renewal(7, 200), 50), held(7, 200));
        assert_eq!(
            held(7, 100).renewed(&renewal(8, 200), 50),
            held(7, 100),
            "another lease"
        );
        assert_eq!(
            held(7, 100).renewed(&renewal(7, 200), 100),
            held(7, 100),
            "lapsed"
        );
        assert_eq!(
            held(7, 100).renewed(&renewal(7, 90), 50),
            held(7, 100),
            "never lowered"
        );
        let closed = Permit::NOT_HELD;
        assert_eq!(
            closed.renewed(&renewal(0, 200), 50),
            closed,
            "nothing is opened"
        );
    }

    #[test]
    fn news_keeps_a_raised_deadline_of_the_same_lease_only() {
        assert_eq!(held(7, 100).over(held(7, 200)), held(7, 200));
        assert_eq!(held(7, 300).over(held(7, 200)), held(7, 300));
        assert_eq!(held(8, 100).over(held(7, 200)), held(8, 100), "a new lease");
        assert_eq!(
            Permit::NOT_HELD.over(held(7, 200)),
            Permit::NOT_HELD,
            "closed"
        );
    }
}
