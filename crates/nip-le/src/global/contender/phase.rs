//! A key's phase at the etcd level, with what each allows written beside
//! it and checked. The phase is the entry's state: what we hold or do of
//! the key is one value ([`super::entry::Holding`]: nothing, acting alone,
//! the key, or a hand-over, which may go on while the host acts alone),
//! and with whether we lead our host it names the phase; the permit and
//! the lock are still fields. [`Entry::phase`] reads which phase holds and
//! [`Entry::broken_invariant`] says what no move may leave beside it. The
//! simulator checks every key of every contender after each of its steps
//! (invariant H3), so a move that leaves a combination outside these
//! phases fails a seed.

use super::entry::{Entry, Holding};
use super::task::PermitState;

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
    /// The entry's phase. A hand-over outranks a fall-back: one may still
    /// be owed when etcd falls silent.
    pub(crate) fn phase(&self) -> Phase {
        match self.holding {
            Holding::HandingOver { .. } => Phase::HandingOver,
            Holding::FallingBack => Phase::FallingBack,
            Holding::Key(_) => Phase::Held,
            Holding::Nothing if self.leads => Phase::Contending,
            Holding::Nothing => Phase::Idle,
        }
    }

    /// The first rule of the entry's phase it breaks, if any.
    pub(crate) fn broken_invariant(&self) -> Option<&'static str> {
        let permit = self.permit.state;
        let breaks = |broken: bool, what: &'static str| broken.then_some(what);
        // Each phase's own fields are its definition (`phase`); what is
        // checked is the rest.
        match self.phase() {
            Phase::Idle => breaks(permit != PermitState::NotHeld, "idle, yet grants a permit"),
            Phase::Contending => breaks(
                permit != PermitState::NotHeld,
                "contending, yet grants a permit",
            ),
            Phase::Held => breaks(!self.leads, "holds a lease without leading its host")
                .or(breaks(
                    !self.locked,
                    "holds a lease without its host's lock file",
                ))
                .or(breaks(
                    permit == PermitState::FallBack,
                    "holds a lease, yet falls back",
                ))
                .or(breaks(
                    permit == PermitState::Held
                        && self.held().is_some_and(|h| h.lease != self.permit.lease),
                    "grants a permit on a lease it does not hold",
                )),
            Phase::HandingOver => breaks(
                permit == PermitState::Held,
                "hands over, yet grants a held permit",
            )
            .or(breaks(
                (permit == PermitState::FallBack) != self.falling_back(),
                "hands over with a fall-back permit while not acting alone, or the reverse",
            )),
            Phase::FallingBack => {
                breaks(!self.leads, "falls back without leading its host").or(breaks(
                    permit != PermitState::FallBack,
                    "falls back without a fall-back permit",
                ))
            }
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
