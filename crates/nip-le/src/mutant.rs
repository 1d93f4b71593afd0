//! Typed mutations: each defect a fix removed (or the simulator found),
//! compiled back in under the `mutants` feature and switched on by name,
//! so that the test command can show every guard still catching its
//! defect (`crates/nip-le/tests/teeth.rs`, `scripts/teeth.sh`). A
//! regex over the source broke silently whenever the code moved; a
//! switch moves with the code it guards.
//!
//! Without the feature, [`on`] is a constant `false` and every switch
//! compiles away. With it, `NIP_LE_MUTANT=<name>` (read once) or `set`
//! turns one defect on for the whole process.

macro_rules! mutants {
    ($( $(#[$doc:meta])* $variant:ident = $name:literal, )*) => {
        /// One defect that can be put back.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Mutant {
            $( $(#[$doc])* $variant, )*
        }

        impl Mutant {
            /// Every defect, in the order of the teeth table
            /// (docs/simulator.md).
            pub const ALL: &'static [Mutant] = &[$(Mutant::$variant),*];

            /// Its name, as `NIP_LE_MUTANT` takes it.
            pub fn name(self) -> &'static str {
                match self {
                    $(Mutant::$variant => $name,)*
                }
            }

            /// The defect of that name.
            pub fn from_name(name: &str) -> Option<Self> {
                match name {
                    $($name => Some(Mutant::$variant),)*
                    _ => None,
                }
            }
        }
    };
}

mutants! {
    /// A lead regained after an unannounced lapse is not announced as
    /// fenced first.
    Regained = "regained",
    /// `Lost` without `mustCancelTurn`.
    Lost = "lost",
    /// A hang judged at the next tick, not at the stale bound.
    Hang = "hang",
    /// The leave race: the key still evaluated after `leave` returned.
    Leave = "leave",
    /// An unconfirmed handoff not fenced.
    Handoff = "handoff",
    /// A holder renewed while a peer holds the `flock`.
    BusyRenew = "busy_renew",
    /// A dead holder watched again after its takeover failed.
    HotLoop = "hot_loop",
    /// Spec ticks re-armed by commands (latency only).
    SpecTicks = "spec_ticks",
    /// A permit that outlives its lease (the fence counted from 4 TTLs).
    NoFence = "no_fence",
    /// The fall-back whatever the policy.
    FallbackAlways = "fallback_always",
    /// A host leader continues another host's live lease.
    Steal = "steal",
    /// A hand-over that moves the key before the holder's writer closed
    /// its permit.
    EarlyHandover = "early_handover",
    /// A granted claim's lease revoked by its poster.
    RevokeClaim = "revoke_claim",
    /// A lease revoked under a sibling that continued it, and a same-host
    /// claim handed over onto it.
    RevokeSibling = "revoke_sibling",
    /// The ledger dropped while a child's record stands.
    ChildLedger = "child_ledger",
    /// A child's rewrite not written back on the wake-up.
    ChildRewrite = "child_rewrite",
    /// A file the child emptied not taken back.
    TakeBack = "take_back",
    /// A record naming us without an epoch re-uses ours.
    ChildEpoch = "child_epoch",
    /// Observers that do not wait for a live holder whose child emptied
    /// the file.
    NoWait = "no_wait",
    /// A window that never saw the holder does not wait.
    UnknownHolder = "unknown_holder",
    /// A spec writer in between ends the wait.
    SpecClears = "spec_clears",
    /// A release that does not mark the epoch released.
    NoReleaseMark = "no_release_mark",
    /// Our child's take adopted without the holder's bound.
    ChildsTake = "childs_take",
    /// A holder's child taken for a writer without a ledger.
    LedgerlessChild = "ledgerless_child",
    /// `done` refused once leadership moved.
    DoneFenced = "done_fenced",
    /// Takes of a live taker owed at once (no in-flight state).
    NoInFlight = "no_in_flight",
    /// The holder does not read a former holder's late lines.
    NoTail = "no_tail",
    /// A stand-down gives its takes back.
    StandDownGivesBack = "stand_down_gives_back",
    /// The hang timer restarted on every late round.
    PauseEveryRound = "pause_every_round",
    /// A take granted before its line is in the file.
    TakeUnsynced = "take_unsynced",
    /// Refused lines dropped when we stop leading.
    LossDropsLines = "loss_drops_lines",
    /// Refused lines dropped when we leave the key.
    LeaveDropsLines = "leave_drops_lines",
    /// A settle dropped while the ledger cannot be read.
    UnsettledLost = "unsettled_lost",
    /// A fail-safe leader records no `done` of its earlier take.
    FailsafeDone = "failsafe_done",
    /// A fail-safe leader grants at once, unrecorded.
    FailsafeTake = "failsafe_take",
    /// An unreadable ledger grants at once.
    UnreadableGrants = "unreadable_grants",
    /// A line glued onto another writer's fragment lost.
    GluedLine = "glued_line",
    /// An epoch issued since our last look taken for the holder we saw.
    UnseenEpoch = "unseen_epoch",
    /// `done`s and give-backs not synced.
    DoneNotSynced = "done_not_synced",
    /// Refused lines flushed by an unsynced line without a sync.
    HeldFlushUnsynced = "held_flush_unsynced",
    /// A lead regained at a new epoch drops the former epoch's refused
    /// lines.
    RegainDropsLines = "regain_drops_lines",
    /// What is queued after the first look owed only by its
    /// `publishedMs`.
    LateByPublished = "late_by_published",
    /// What our windows took and did not answer left to the floor.
    TakenLeftToFloor = "taken_left_to_floor",
    /// No `floor` line: the floor the first holder's alone.
    NoFloorLine = "no_floor_line",
    /// A fail-safe take under a gone taker's higher epoch without the
    /// give-back.
    HiddenTake = "hidden_take",
    /// A restart of the hang timer (a pause, a held exclusion) does not
    /// restart the wait for a holder whose child may empty the file.
    PauseKeepsVacatedDeadline = "pause_keeps_vacated_deadline",
    /// A window that never saw the holder takes its harness child's
    /// record by the child's dead pid while the holder lives.
    JoinerTakesChildByPid = "joiner_takes_child_by_pid",
    /// A leader's validity leaves no time for a reply on its way.
    NoReplyFlight = "no_reply_flight",
    /// A host leader without the lock file (the NIP's fail-safe) keeps
    /// renewing the lease the sibling holding the lock continues.
    UnlockedKeepsLease = "unlocked_keeps_lease",
    /// A host leader without the lock file tries to take the key.
    UnlockedAcquires = "unlocked_acquires",
    /// A claim honoured on a sibling's lease we continue.
    ClaimOnSiblingsLease = "claim_on_siblings_lease",
    /// A hand-over etcd gave no answer to dropped.
    DropUnansweredHandOver = "drop_unanswered_hand_over",
    /// A claim granted to a host leader without the lock file taken.
    GrantedUnlocked = "granted_unlocked",
    /// `held` and `floor` lines not synced.
    HeldNotSynced = "held_not_synced",
    /// An observer whose last locked look found the exclusion held takes
    /// the record at its next look if the lock is free, without giving the
    /// holder a window after the hold.
    TakeAsHoldEnds = "take_as_hold_ends",
    /// A hand-over whose swap failed after we stepped back from our host
    /// takes the lease back: held without leading.
    HeldAfterStepBack = "held_after_step_back",
    /// A hand-over owed through a fall-back whose swap then failed holds
    /// the key again with the fall-back's permit still open.
    FallbackPermitHeldAgain = "fallback_permit_held_again",
    /// An empty lock file whose exclusion a peer holds (its first record
    /// being written) read as no coordination: a fail-safe lead beside
    /// the first writer.
    EmptyHeldLeads = "empty_held_leads",
    /// A `done` or give-back whose sync failed reported as durable.
    SyncFailureHidden = "sync_failure_hidden",
    /// A rewrite past its budget forgets the oldest answered events.
    ForgetAnswered = "forget_answered",
    /// Takes never settled are granted without bound.
    FloodOfTakes = "flood_of_takes",
    /// A full ledger refuses the take of the event that holds its settled
    /// mark back.
    FullWedge = "full_wedge",
}

/// Whether `m` is the defect put back in this process.
#[cfg(not(feature = "mutants"))]
#[inline(always)]
pub const fn on(_m: Mutant) -> bool {
    false
}

#[cfg(feature = "mutants")]
mod switch {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::Mutant;

    const UNREAD: usize = usize::MAX;
    const NONE: usize = usize::MAX - 1;
    static ACTIVE: AtomicUsize = AtomicUsize::new(UNREAD);

    fn index(m: Option<Mutant>) -> usize {
        m.and_then(|m| Mutant::ALL.iter().position(|&x| x == m))
            .unwrap_or(NONE)
    }

    /// The defect switched on, reading `NIP_LE_MUTANT` the first time.
    pub fn active() -> Option<Mutant> {
        let mut i = ACTIVE.load(Ordering::Relaxed);
        if i == UNREAD {
            let named = std::env::var("NIP_LE_MUTANT")
                .ok()
                .filter(|s| !s.is_empty());
            let m = named.map(|n| {
                // A misspelt name must not pass for a defect that was
                // caught: the teeth would prove nothing.
                Mutant::from_name(&n)
                    .unwrap_or_else(|| panic!("NIP_LE_MUTANT: no defect named {n:?}"))
            });
            i = index(m);
            ACTIVE.store(i, Ordering::Relaxed);
        }
        Mutant::ALL.get(i).copied()
    }

    /// Switches `m` on (or every defect off) for the whole process.
    pub fn set(m: Option<Mutant>) {
        ACTIVE.store(index(m), Ordering::Relaxed);
    }
}

#[cfg(feature = "mutants")]
pub use switch::{active, set};

/// Whether `m` is the defect put back in this process.
#[cfg(feature = "mutants")]
pub fn on(m: Mutant) -> bool {
    active() == Some(m)
}

#[cfg(test)]
mod tests {
    use super::Mutant;

    #[test]
    fn every_name_is_its_own_and_unique() {
        for &m in Mutant::ALL {
            assert_eq!(Mutant::from_name(m.name()), Some(m));
        }
        let mut names: Vec<_> = Mutant::ALL.iter().map(|m| m.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Mutant::ALL.len());
        assert_eq!(Mutant::from_name("nothing"), None);
    }
}
