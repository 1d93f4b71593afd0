//! What one run of a host found: its verdict and what it counted.

use super::Violation;

/// What one run found.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// The first broken invariant, if any.
    pub violation: Option<Violation>,
    /// Faults injected.
    pub faults: u64,
    /// Mentions published and answered.
    pub mentions: u64,
    /// Of which answered.
    pub answered: u64,
    /// Holder changes the file showed.
    pub holder_changes: u64,
    /// Time two or more acted under the NIP's fail-safe, ns.
    pub fail_safe_ns: u64,
    /// Time two or more acted through a lagging cached read, ns.
    pub stale_cache_ns: u64,
    /// Longest silence, ns.
    pub longest_silence_ns: u64,
    /// Writer rounds run.
    pub rounds: u64,
    /// Mentions answered twice because the disk refused the first
    /// answer's `done` line and its window had no round since in which the
    /// disk took writes (it died, quit, froze or starved first): no
    /// ledger can record a sent reply then; or because the second answer's
    /// take was granted while the disk refused writes (a fail-safe leader
    /// past the stale bound grants unrecorded, and no other window can
    /// know of it). Counted, not failed.
    pub forced_by_disk: u64,
    /// Mentions never answered because a harness child held the lock
    /// after its window, and no `held` line names that window (the disk
    /// refused it for as long as the window lived, or the window never
    /// held: paused or killed when its child took the lock): the successor
    /// cannot tell that child from a writer without a ledger, who may have
    /// answered what was published before (Buzz's harness drains its
    /// backlog when it gains). Counted, not failed.
    pub skipped_after_ledgerless: u64,
    /// Mentions published before a writer without a ledger was replaced
    /// (as for [`Outcome::skipped_after_ledgerless`]) and first answered
    /// after: that writer may have answered them already (Buzz's harness
    /// drains its backlog when it gains; the simulator's answers nothing),
    /// so each is a duplicate in Buzz's desktop. Counted, not failed.
    pub answered_after_ledgerless: u64,
    /// Mentions answered twice because a reply, decided while its window
    /// could act, waited on its way for the window to run again (a SIGSTOP
    /// or a suspend between the check and the send) while a takeover
    /// granted the mention again: no lock fences a reply between the two.
    /// Counted, not failed.
    pub frozen_reply: u64,
    /// Mentions never answered that an app dropped from its capped queue
    /// ([`crate::sim::Options::queue_cap`]): counted, not failed.
    pub dropped_by_cap: u64,
    /// The largest the work ledger file grew, bytes.
    pub ledger_peak_bytes: u64,
    /// Each answered mention's latency, publication to first answer (ms),
    /// with its number.
    pub latencies_ms: Vec<(u64, u64)>,
    /// Claims made (a window's user claimed the agent).
    pub claims: u64,
    /// Of which the claimant acted within the stand-down.
    pub claims_honoured: u64,
}
