//! Extension: writers that share an instance id with a window (the agent
//! harness children it spawns with `BUZZ_INSTANCE_ELECTION_ID`, see
//! `INTEROP.md`). Such a child acquires every refresh, rewriting the record
//! with its own pid and none of our fields, and truncates the file when it
//! exits, although its window still leads. Neither is a change of holder:
//!
//! * the holder keeps its epoch (and so its work ledger) through a child's
//!   record, and writes its own record back on the same wake-up;
//! * the holder re-takes a file its child emptied at the same epoch, when
//!   the epoch mark shows that nobody issued a later one (a release of
//!   ours raises the mark past our epoch, see [`KeyMachine::release_mark`]);
//! * an observer that saw a holder with a live presence neither takes nor
//!   fail-safe-leads on a file emptied (or caught mid-rewrite) while that
//!   holder lives and the mark shows no release: the holder re-takes it.
//!   It waits no longer than the holder's record would have kept it
//!   waiting (the stale bound since that record last changed), so a hung
//!   holder whose child emptied the file is replaced on time. The same
//!   when the observer's own child took the emptied file meanwhile.

use std::time::Instant;

use crate::epoch::Mark;
use crate::host::Origin;
use crate::liveness::Liveness;
use crate::presence::PeerPresence;
use crate::record::{LockContent, LockRecord};

use super::{KeyMachine, Probes};

/// What the machine remembers to read a same-id writer's traces.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub(super) struct SameId {
    /// The epoch of the record we hold, while we hold it.
    pub held_epoch: Option<u64>,
    /// The last other holder seen with a live presence, and its epoch.
    pub holder: Option<Holder>,
    /// The current look found the file vacated by a live holder's child.
    pub vacated: bool,
    /// The epoch mark of the current locked look (`None` before it).
    pub floor: Option<Mark>,
}

/// Another instance that held the lock with a presence.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Holder {
    id: String,
    /// `None`: a holder we never saw (we found the file vacant, with
    /// epochs issued and none released), while another participant is
    /// present.
    token: Option<String>,
    epoch: Option<u64>,
    here: bool,
    /// When we first saw its (or its child's) latest record: it may act
    /// until the stale bound after that, whoever wrote the file since.
    since: Instant,
}

/// Whether the mark shows `epoch` over: a later one issued, or released.
fn over(mark: Mark, epoch: u64) -> bool {
    mark.epoch > epoch || (mark.epoch == epoch && mark.released)
}

/// An emptied file, or one caught mid-rewrite: what a child's release or
/// in-place write leaves for a lock-free reader.
pub(super) fn vacant(content: &LockContent) -> bool {
    matches!(content, LockContent::Empty | LockContent::Malformed(_))
}

impl KeyMachine {
    /// A record naming us that a same-id writer without our fields (a
    /// harness child) wrote: ours, to write back at once. A record with a
    /// presence is another window misconfigured with our id, which we leave
    /// alone (two such windows would otherwise rewrite each other forever).
    pub(super) fn childs_record(&self, content: &LockContent) -> bool {
        self.rules.profile.presence
            && content.record().is_some_and(|r| {
                r.instance_id == *self.our_id && r.live.is_none() && r.pid != self.our_pid
            })
    }

    /// A record naming the last holder with a presence, without our fields:
    /// its harness child's. The holder's family still leads: should the
    /// child die before the holder writes its own record back (a full
    /// disk, a peer's `flock`), its dead pid is no sign of the holder's
    /// death (the simulator: an observer took the file by the child's dead
    /// pid while the holder still acted).
    ///
    /// A window that never saw a holder (it joined while the child's
    /// record was there) reads the record as the child of the participant
    /// whose instance id it names, when one lives and the child's pid is
    /// dead (the simulator: a window that joined took the file by the
    /// child's dead pid while the holder, kept from writing by a peer's
    /// `flock`, still acted).
    fn holders_childs_record(&self, content: &LockContent, probes: &dyn Probes) -> bool {
        let Some(r) = content.record() else {
            return false;
        };
        if r.live.is_some() || r.epoch.is_some() || r.instance_id == *self.our_id {
            return false;
        }
        match &self.same_id.holder {
            Some(h) if h.token.is_some() => r.instance_id == h.id,
            _ => {
                !mutated!(JoinerTakesChildByPid)
                    && self.rules.profile.presence
                    && probes.pid(r.pid) == Liveness::Dead
                    && probes.present_as(&r.instance_id).is_some()
            }
        }
    }

    /// Whether `content`, vacant, is ours to take back at our epoch: we held
    /// it, and (under the exclusion) the mark shows no later epoch and no
    /// release of ours. Before the locked look the mark is unknown: the
    /// answer is "look under the exclusion".
    pub(super) fn ours_vacated(&self, content: &LockContent) -> bool {
        let Some(epoch) = self.same_id.held_epoch else {
            return false;
        };
        self.holds_lock && vacant(content) && self.same_id.floor.is_none_or(|f| !over(f, epoch))
    }

    /// Whether `content`, vacant or its child's record, was left by the
    /// child of a holder that still lives: then we wait for it to take the
    /// file back. The same
    /// when our own child took it meanwhile (the harness takes an empty
    /// file at its next refresh): that holder may act until its validity
    /// ends, so we adopt our child's record only once the holder's would
    /// have let us take over. Sets [`SameId::vacated`] for the conclusion.
    pub(super) fn vacated_by_holder(
        &mut self,
        content: &LockContent,
        now: Instant,
        probes: &dyn Probes,
    ) -> bool {
        // We held it, but an epoch was issued since ours and not released
        // (a hand-over while we were stopped or starved): we observe a
        // holder we never saw (the simulator: a window starved through a
        // hand-over took the file its heir's child emptied, at once).
        let displaced = self.holds_lock
            && (self.same_id.held_epoch)
                .zip(self.same_id.floor)
                .is_some_and(|(e, f)| f.epoch > e && !f.released);
        let candidate = self.rules.profile.presence
            && (!self.holds_lock || displaced)
            && (vacant(content)
                || self.childs_record(content)
                || self.holders_childs_record(content, probes));
        // An epoch issued since the holder we saw and not released: a
        // holder we never saw (we were starved or stopped while it took
        // the file, and its child emptied it since), to wait for as one.
        let unseen = |h: &Holder, f: Option<Mark>| {
            f.is_some_and(|f| f.epoch > h.epoch.unwrap_or(0) && !f.released)
        };
        let stale_holder = !mutated!(UnseenEpoch)
            && self
                .same_id
                .holder
                .as_ref()
                .is_some_and(|h| unseen(h, self.same_id.floor));
        if candidate
            && ((self.same_id.holder.is_none() && !mutated!(UnknownHolder)) || stale_holder)
        {
            // We never saw the holder (we joined, or looked only while the
            // file was vacant): one that may be starved or stopped while
            // its child emptied the file is unknown to us.
            self.same_id.holder = Some(Holder {
                id: String::new(),
                token: None,
                epoch: self.same_id.floor.map(|f| f.epoch).filter(|&e| e > 0),
                here: true,
                since: now,
            });
        }
        let waits = !mutated!(NoWait)
            && candidate
            && self.same_id.holder.as_ref().is_some_and(|h| {
                h.here
                    && match (&h.token, self.same_id.floor) {
                        (Some(_), Some(f)) => !over(f, h.epoch.unwrap_or(0)),
                        (None, Some(f)) => f.epoch > 0 && !f.released,
                        (_, None) => true,
                    }
                    && match &h.token {
                        Some(t) => probes.presence(t) == PeerPresence::Alive,
                        None => probes.others_present(),
                    }
            })
            && self.vacated_deadline().is_some_and(|d| now < d);
        self.same_id.vacated = waits;
        waits
    }

    /// The holder we wait for gets a fresh stale bound from `now` (see
    /// `restart_hang_timer`: we were paused, or a peer held the exclusion).
    pub(super) fn restart_vacated_wait(&mut self, now: Instant) {
        if let Some(h) = self.same_id.holder.as_mut() {
            h.since = now;
        }
    }

    /// Until when the last holder with a presence may still act, as far as
    /// we can tell (the stale bound after its latest record).
    pub(super) fn vacated_deadline(&self) -> Option<Instant> {
        let h = self.same_id.holder.as_ref()?;
        Some(h.since + self.rules.stale + std::time::Duration::from_millis(1))
    }

    /// After a look at `now`: the epoch we hold at, and the holder to wait
    /// for.
    pub(super) fn remember_holders(&mut self, content: &LockContent, now: Instant) {
        self.same_id.held_epoch = if self.holds_lock {
            content
                .record()
                .and_then(|r| r.epoch)
                .or(self.same_id.held_epoch)
        } else {
            None
        };
        match content.record() {
            _ if self.holds_lock => self.same_id.holder = None,
            // Our child's record, not ours yet: the holder it took the file
            // from is still the one to wait for.
            Some(r) if r.instance_id == *self.our_id => {}
            Some(r) if self.observed.record() != Some(r) => self.remember_holder(r, now),
            // Unchanged, vacant or unreadable: whoever held it is still the
            // one to wait for (until the stale bound says otherwise).
            _ => {}
        }
    }

    fn remember_holder(&mut self, r: &LockRecord, now: Instant) {
        match (&r.live, self.same_id.holder.as_mut()) {
            (Some(token), _) => {
                self.same_id.holder = Some(Holder {
                    id: r.instance_id.clone(),
                    token: Some(token.clone()),
                    epoch: r.epoch,
                    here: r.origin(&self.here) == Origin::HereOrUnknown,
                    since: now,
                })
            }
            // The holder's own child: a sign of life of its family.
            (None, Some(h)) if h.id == r.instance_id => h.since = now,
            // A writer without a presence (a spec instance, another
            // window's child) took the file the holder's child emptied:
            // the holder may act still, until the stale bound after its
            // latest record.
            (None, _) => {
                if mutated!(SpecClears) {
                    self.same_id.holder = None;
                }
            }
        }
    }

    /// Whether a record we are about to replace may have been written by a
    /// writer that keeps no work ledger (a spec instance, or a harness that
    /// is not the child of the last holder with a presence, whose ledger
    /// its child's record continues): then events published before we led
    /// may have been answered without a trace. The id, for the ledger's
    /// `held` lines to settle it.
    pub(crate) fn ledgerless(&self, content: &LockContent) -> Option<String> {
        content
            .record()
            .filter(|r| {
                r.epoch.is_none()
                    && r.instance_id != *self.our_id
                    && self
                        .same_id
                        .holder
                        .as_ref()
                        .is_none_or(|h| h.id != r.instance_id)
            })
            .map(|r| r.instance_id.clone())
    }

    /// The epoch a release of ours marks released, so that observers tell
    /// our release from a child's truncation (which leaves it unmarked).
    pub(super) fn release_mark(&self, content: &LockContent) -> Option<u64> {
        self.same_id
            .held_epoch
            .or_else(|| content.record().and_then(|r| r.epoch))
    }
}
