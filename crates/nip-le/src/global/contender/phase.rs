//! A key's phase at the etcd level: the states the contender's per-key
//! [`Entry`] means, named, with what each allows written beside it and
//! checked. What we hold of the key is one value ([`super::entry::Holding`]:
//! nothing, the key, or a hand-over), so a key is never held and handed
//! over at once; the rest are still fields (`leads`, `locked`, `fallback`,
//! the permit). [`Entry::phase`] reads which phase holds and
//! [`Entry::broken_invariant`] says what a combination no move may leave
//! behind. The simulator checks every key of every contender
//! after each of its steps (invariant H3), so a move that leaves a
//! combination outside these phases fails a seed.

use super::entry::Entry;
use super::task::{FALLBACK, HELD, NOT_HELD};

/// What a key is at the etcd level, for one window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// We do not lead our host for the key and have nothing to finish.
    /// Holds nothing, grants nothing, never falls back.
    Idle,
    /// We lead our host but hold no lease on the key: it is free, another
    /// host's, a sibling's to continue, or etcd did not answer. Grants
    /// nothing.
    Contending,
    /// We hold the key on a lease. Only with our host's lock file (a
    /// fail-safe host leader gives a key up); the permit is open on that
    /// lease, or closed while a renewal is owed.
    Held,
    /// We stood down for another host's claim: the key goes to the claimant
    /// once our writer confirms it stopped acting and our work records are
    /// in etcd. Holds nothing meanwhile (the lease and revision to hand
    /// over are kept with the claim); grants nothing, unless etcd fell
    /// silent and the host acts alone.
    HandingOver,
    /// etcd was silent for a whole TTL and the policy is to act for this
    /// host alone: no lease can have survived that, so none is held.
    FallingBack,
}

impl Entry {
    /// The phase the entry's fields describe. A hand-over outranks a
    /// fall-back: one may still be owed when etcd falls silent.
    pub(crate) fn phase(&self) -> Phase {
        if self.handing_over() {
            Phase::HandingOver
        } else if self.fallback {
            Phase::FallingBack
        } else if self.held().is_some() {
            Phase::Held
        } else if self.leads {
            Phase::Contending
        } else {
            Phase::Idle
        }
    }

    /// The first rule of the entry's phase it breaks, if any.
    pub(crate) fn broken_invariant(&self) -> Option<&'static str> {
        let permit = self.permit.state;
        let breaks = |broken: bool, what: &'static str| broken.then_some(what);
        // Each phase's own fields are its definition (`phase`); what is
        // checked is the rest.
        match self.phase() {
            Phase::Idle => breaks(permit != NOT_HELD, "idle, yet grants a permit"),
            Phase::Contending => breaks(permit != NOT_HELD, "contending, yet grants a permit"),
            Phase::Held => breaks(!self.leads, "holds a lease without leading its host")
                .or(breaks(
                    !self.locked,
                    "holds a lease without its host's lock file",
                ))
                .or(breaks(permit == FALLBACK, "holds a lease, yet falls back"))
                .or(breaks(
                    permit == HELD && self.held().is_some_and(|h| h.lease != self.permit.lease),
                    "grants a permit on a lease it does not hold",
                )),
            Phase::HandingOver => breaks(permit == HELD, "hands over, yet grants a held permit")
                .or(breaks(
                    (permit == FALLBACK) != self.fallback,
                    "hands over with a fall-back permit and flag that disagree",
                )),
            Phase::FallingBack => breaks(self.held().is_some(), "falls back, yet holds a lease")
                .or(breaks(!self.leads, "falls back without leading its host"))
                .or(breaks(
                    permit != FALLBACK,
                    "falls back without a fall-back permit",
                )),
        }
    }
}

impl super::Task {
    /// The first key whose entry breaks its phase's rules, and which rule.
    pub(crate) fn phase_violation(&self) -> Option<String> {
        self.entries.iter().find_map(|(pk, e)| {
            e.broken_invariant()
                .map(|what| format!("{pk}: {what} ({:?})", e.phase()))
        })
    }
}
