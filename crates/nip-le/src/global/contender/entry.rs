//! One key's state in the contender: what we hold of it in etcd
//! ([`Holding`]), what we know of its holder, the timers and the permit
//! we grant the writer. Its phases are named in `phase.rs`.

use std::sync::Arc;
use std::time::Instant;

use crate::elector::global_level::{Permit, PermitState, SharedWork};
use crate::elector::GlobalHolder;

/// Our hold on a key.
#[derive(Debug, Clone, Copy)]
pub(super) struct Held {
    pub lease: i64,
    /// The revision we last wrote the key at.
    pub revision: u64,
    pub renew_at: Instant,
    /// The permit's deadline ([`crate::elector::cache::boot_nanos`]).
    pub until: u64,
}

/// What this window holds or does of a key in etcd, one value, so that
/// no two exclude each other only by convention: nothing, acting for this
/// host alone, the key on our lease, or the key we stood down from for a
/// claim. With [`Entry::leads`] it is the key's phase (see `phase.rs`).
#[derive(Debug, Clone, Default)]
pub(super) enum Holding {
    /// Idle or contending: nothing held, nothing done alone.
    #[default]
    Nothing,
    /// etcd was silent for a whole TTL and the policy is to act for this
    /// host alone: no lease of ours can have survived that.
    FallingBack,
    /// The key, on our lease.
    Key(Held),
    /// Standing down for the claim: our lease and the revision we wrote
    /// (kept to swap the key to the claimant once our writer confirms),
    /// and the claim. A hand-over is still owed when etcd falls silent:
    /// `falling_back` says the host acts alone meanwhile.
    HandingOver {
        held: Held,
        claim: super::Kv,
        falling_back: bool,
    },
}

pub(super) struct Entry {
    /// We lead our host for this key.
    pub leads: bool,
    /// ... holding its lock file (not the NIP's fail-safe).
    pub locked: bool,
    /// The host leadership we were last told of.
    pub tenure: u64,
    /// What we hold of the key.
    pub holding: Holding,
    pub holder: Option<GlobalHolder>,
    /// A claim of ours, until it expires.
    pub claim_until: Option<Instant>,
    /// The lease our posted claim is bound to.
    pub claim_lease: Option<i64>,
    /// Don't call etcd for this key before (after a failure).
    pub retry_at: Option<Instant>,
    /// etcd's refusals in a row (its answers, not an outage): each doubles
    /// the wait before the next call, up to `task::MAX_REFUSAL_WAIT`.
    pub refusals: u32,
    /// Look again even if we hold (after the watch lost track).
    pub verify: bool,
    /// The latest revision at which we know the leader key's state.
    pub seen: u64,
    /// The host of the last holder we saw (kept across deletions).
    pub last_holder_host: Option<String>,
    pub last_error: Option<String>,
    /// The error the writer was last told of: a new refusal (or its end)
    /// is told at once, though no permit changes.
    pub told_error: Option<String>,
    /// The permit we grant the writer now, and the last one we told it.
    pub permit: Permit,
    pub told: Permit,
    /// The work records read for the writer's next news.
    pub work_news: Option<Arc<SharedWork>>,
    /// Read the work records again then (another window's take is open,
    /// or they could not be read).
    pub work_again_at: Option<Instant>,
    /// We hold the key and its work records could not be read yet.
    pub work_unread: bool,
    /// Since when they could not be read.
    pub unread_since: Option<Instant>,
    /// The writer confirmed a hand-over whose swap waits for our work
    /// records: tried again then.
    pub swap_at: Option<Instant>,
}

impl Entry {
    /// Sets the permit the writer is to apply (told with the next news).
    pub(super) fn grant(&mut self, state: PermitState, until: u64) {
        let lease = match (state, self.held()) {
            (PermitState::Held, Some(h)) => h.lease,
            _ => 0,
        };
        self.permit = Permit {
            state,
            until,
            lease,
        };
    }

    /// The key on our lease, if we hold it (not while handing it over).
    pub(super) fn held(&self) -> Option<Held> {
        match self.holding {
            Holding::Key(h) => Some(h),
            _ => None,
        }
    }

    /// [`Entry::held`], to update in place.
    pub(super) fn held_mut(&mut self) -> Option<&mut Held> {
        match &mut self.holding {
            Holding::Key(h) => Some(h),
            _ => None,
        }
    }

    /// Gives up the key we hold, if we do; a hand-over stays.
    pub(super) fn take_held(&mut self) -> Option<Held> {
        let h = self.held()?;
        self.holding = Holding::Nothing;
        Some(h)
    }

    /// Whether we are standing down for a claim.
    pub(super) fn handing_over(&self) -> bool {
        matches!(self.holding, Holding::HandingOver { .. })
    }

    /// Whether this host acts alone on the key (etcd silent, policy
    /// fall-back), whether or not a hand-over is still owed.
    pub(super) fn falling_back(&self) -> bool {
        matches!(
            self.holding,
            Holding::FallingBack
                | Holding::HandingOver {
                    falling_back: true,
                    ..
                }
        )
    }

    /// Starts or ends acting alone; a hand-over still owed stays owed. A
    /// key held is given up before etcd's silence can start a fall-back.
    pub(super) fn set_falling_back(&mut self, on: bool) {
        match &mut self.holding {
            Holding::HandingOver { falling_back, .. } => *falling_back = on,
            Holding::Nothing if on => self.holding = Holding::FallingBack,
            Holding::FallingBack if !on => self.holding = Holding::Nothing,
            _ => {}
        }
    }

    /// Stands down for `claim` from the key we hold (nothing if we hold
    /// none).
    pub(super) fn begin_hand_over(&mut self, claim: super::Kv) {
        if let Some(held) = self.held() {
            self.holding = Holding::HandingOver {
                held,
                claim,
                falling_back: false,
            };
        }
    }

    /// Ends the hand-over, if one is waiting: the hold, the claim, and
    /// whether the host was acting alone meanwhile. Nothing is held then,
    /// and a fall-back goes on until etcd's answers end it.
    pub(super) fn take_hand_over(&mut self) -> Option<(Held, super::Kv, bool)> {
        match std::mem::take(&mut self.holding) {
            Holding::HandingOver {
                held,
                claim,
                falling_back,
            } => {
                if falling_back {
                    self.holding = Holding::FallingBack;
                }
                Some((held, claim, falling_back))
            }
            other => {
                self.holding = other;
                None
            }
        }
    }

    /// Records the holder the key names now (`None`: deleted).
    pub(super) fn see(&mut self, holder: Option<GlobalHolder>) {
        if let Some(h) = holder.as_ref().filter(|h| !h.host_id.is_empty()) {
            self.last_holder_host = Some(h.host_id.clone());
        }
        self.holder = holder;
    }

    /// A key we have just heard of: nothing held, nothing granted.
    pub(super) fn new() -> Self {
        Self {
            leads: false,
            locked: false,
            tenure: 0,
            holding: Holding::Nothing,
            holder: None,
            claim_until: None,
            claim_lease: None,
            retry_at: None,
            refusals: 0,
            verify: false,
            seen: 0,
            last_holder_host: None,
            last_error: None,
            told_error: None,
            permit: Permit::NOT_HELD,
            told: Permit::NOT_HELD,
            work_news: None,
            work_again_at: None,
            work_unread: false,
            unread_since: None,
            swap_at: None,
        }
    }
}
