//! The two decisions of NIP-LE, as pure functions of what the file holds.
//!
//! * Read side: leader iff the record's `instance_id` is ours; anything that
//!   is not a readable record (absent, unreadable, empty, malformed,
//!   oversized) fails safe to leader.
//! * Acquire side: a claim may be taken iff the file is free (absent, empty,
//!   malformed, oversized), already ours, its pid is dead, or its
//!   `claimed_at` is unparseable or further than the stale bound from now.
//!
//! **Future-dated claims.** The harness treats a `claimed_at` in the future
//! as fresh, so a clock that jumped back (or a bogus writer) plus a recycled
//! pid can pin a dead claim forever. We treat a `claimed_at` more than the
//! stale bound *ahead* of now exactly like one more than the stale bound
//! behind: stale. A live leader rewrites `claimed_at` every refresh, so on
//! one machine (one clock) a live claim is never that far ahead; a claim that
//! is can only be abandoned or written across a clock jump, and at worst one
//! live leader is displaced once, never wedged.

use std::time::{Duration, SystemTime};

use crate::liveness::Liveness;
use crate::record::{ClaimedAt, LockContent};

/// Why a claim may be taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TakeReason {
    /// No file, empty file (released), or unreadable content.
    Free,
    /// The record already names us: a refresh.
    Ours,
    /// The holder's pid is not running.
    DeadPid,
    /// `claimed_at` is older than the stale bound (abandoned; pid recycled).
    Stale,
    /// `claimed_at` is further in the future than the stale bound.
    FutureDated,
    /// `claimed_at` cannot be parsed.
    UnparseableClaimedAt,
    /// Extension: the holder's presence lock is free (it died or left).
    HolderGone,
    /// Extension: the holder lives but its record has not changed for longer
    /// than the stale bound by our monotonic clock (it hangs).
    Hung,
}

impl TakeReason {
    /// Whether taking for this reason displaces a previous holder.
    pub fn is_takeover(self) -> bool {
        matches!(
            self,
            TakeReason::DeadPid
                | TakeReason::Stale
                | TakeReason::FutureDated
                | TakeReason::UnparseableClaimedAt
                | TakeReason::HolderGone
                | TakeReason::Hung
        )
    }
}

/// The acquire-side decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Takeable {
    /// May be written with our record.
    Yes(TakeReason),
    /// A live, fresh claim by another instance: leave it alone.
    No,
}

/// Decides whether `content` may be overwritten with our claim. `probe` is
/// called at most once, and only for a record held by someone else.
pub fn takeable(
    content: &LockContent,
    our_id: &str,
    now: SystemTime,
    stale: Duration,
    probe: impl FnOnce(u32) -> Liveness,
) -> Takeable {
    let r = match content {
        LockContent::Record(r) => r,
        _ => return Takeable::Yes(TakeReason::Free),
    };
    if r.instance_id == our_id {
        return Takeable::Yes(TakeReason::Ours);
    }
    if probe(r.pid) == Liveness::Dead {
        return Takeable::Yes(TakeReason::DeadPid);
    }
    match claim_age(&r.claimed_at, now) {
        ClaimAge::Unparseable => Takeable::Yes(TakeReason::UnparseableClaimedAt),
        ClaimAge::Past(age) if age > stale => Takeable::Yes(TakeReason::Stale),
        ClaimAge::Future(ahead) if ahead > stale => Takeable::Yes(TakeReason::FutureDated),
        _ => Takeable::No,
    }
}

/// The extended acquire decision. A record carrying a presence token
/// (written by our extended instances) is judged by the holder's presence
/// lock: gone → take at once; alive → only when the record has stayed
/// unchanged for longer than `stale` by our monotonic clock
/// (`unchanged_for`), never by the wall clock, so a machine that slept does
/// not move leadership. Records without a token, and tokens we cannot judge,
/// keep the NIP's rules ([`takeable`]), except that a stale or future-dated
/// `claimed_at` of a live pid must also be confirmed by `unchanged_for`.
pub fn takeable_extended(
    content: &LockContent,
    our_id: &str,
    now: SystemTime,
    stale: Duration,
    unchanged_for: Duration,
    probe_pid: impl FnOnce(u32) -> Liveness,
    probe_presence: impl FnOnce(&str) -> crate::presence::PeerPresence,
) -> Takeable {
    use crate::presence::PeerPresence;
    if let LockContent::Record(r) = content {
        if r.instance_id != our_id {
            if let Some(token) = &r.live {
                match probe_presence(token) {
                    PeerPresence::Gone => return Takeable::Yes(TakeReason::HolderGone),
                    PeerPresence::Alive if unchanged_for > stale => {
                        return Takeable::Yes(TakeReason::Hung)
                    }
                    PeerPresence::Alive => return Takeable::No,
                    PeerPresence::Unknown => {}
                }
            }
        }
    }
    match takeable(content, our_id, now, stale, probe_pid) {
        // A writer without presence (the harness, a spec instance) whose pid
        // lives is judged by its `claimed_at`, and a step of the wall clock
        // (ours or its) makes a live writer's stamp look stale or
        // future-dated. A live writer rewrites its record every refresh, so
        // we take it only once the record has also stayed unchanged for
        // longer than the stale bound on our monotonic clock: no takeover
        // of a live harness on any wall-clock step. (A dead pid is still
        // taken at once.)
        Takeable::Yes(TakeReason::Stale | TakeReason::FutureDated) if unchanged_for <= stale => {
            Takeable::No
        }
        verdict => verdict,
    }
}

/// How far `claimed_at` is from `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimAge {
    /// This long ago.
    Past(Duration),
    /// This far ahead of now.
    Future(Duration),
    /// Not a time.
    Unparseable,
}

/// Age of a claim relative to `now`.
pub fn claim_age(claimed_at: &ClaimedAt, now: SystemTime) -> ClaimAge {
    match claimed_at.instant() {
        None => ClaimAge::Unparseable,
        Some(t) => match now.duration_since(t) {
            Ok(age) => ClaimAge::Past(age),
            Err(e) => ClaimAge::Future(e.duration()),
        },
    }
}

/// The read-side decision on a (possibly failed) unguarded read.
pub fn reads_as_leader<E>(content: Result<&LockContent, E>, our_id: &str) -> bool {
    match content {
        Ok(LockContent::Record(r)) => r.instance_id == our_id,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::LockRecord;

    const STALE: Duration = Duration::from_secs(10);

    fn at(now: SystemTime, offset_secs: i64) -> ClaimedAt {
        let d = Duration::from_secs(offset_secs.unsigned_abs());
        ClaimedAt::At(if offset_secs >= 0 { now + d } else { now - d })
    }

    fn record(id: &str, claimed_at: ClaimedAt) -> LockContent {
        LockContent::Record(LockRecord {
            instance_id: id.into(),
            pid: 4242,
            claimed_at,
            epoch: None,
            live: None,
            host: None,
            boot: None,
        })
    }

    fn alive(_: u32) -> Liveness {
        Liveness::Alive
    }

    #[test]
    fn free_files_are_takeable_and_read_as_leader() {
        let now = SystemTime::now();
        for c in [
            LockContent::Absent,
            LockContent::Empty,
            LockContent::Oversized,
            LockContent::Malformed("x".into()),
        ] {
            assert_eq!(
                takeable(&c, "me", now, STALE, alive),
                Takeable::Yes(TakeReason::Free)
            );
            assert!(reads_as_leader::<()>(Ok(&c), "me"));
        }
        assert!(reads_as_leader(Err("permission denied"), "me"));
    }

    #[test]
    fn read_side_is_instance_id_only() {
        let now = SystemTime::now();
        // Even a stale, dead claim of ours reads as ours, and a fresh foreign
        // one as not: pid and claimed_at are informational to the read side.
        assert!(reads_as_leader::<()>(
            Ok(&record("me", at(now, -3600))),
            "me"
        ));
        assert!(!reads_as_leader::<()>(
            Ok(&record("other", ClaimedAt::Unparseable("?".into()))),
            "me"
        ));
    }

    #[test]
    fn acquire_rules() {
        let now = SystemTime::now();
        let t = |c: &LockContent, live: Liveness| takeable(c, "me", now, STALE, |_| live);
        assert_eq!(
            t(&record("me", at(now, -1)), Liveness::Alive),
            Takeable::Yes(TakeReason::Ours)
        );
        assert_eq!(
            t(&record("other", at(now, -1)), Liveness::Alive),
            Takeable::No
        );
        assert_eq!(
            t(&record("other", at(now, -1)), Liveness::Dead),
            Takeable::Yes(TakeReason::DeadPid)
        );
        assert_eq!(
            t(&record("other", at(now, -11)), Liveness::Alive),
            Takeable::Yes(TakeReason::Stale)
        );
        assert_eq!(
            t(&record("other", at(now, -9)), Liveness::Alive),
            Takeable::No
        );
        assert_eq!(
            t(&record("other", at(now, 5)), Liveness::Alive),
            Takeable::No
        );
        assert_eq!(
            t(&record("other", at(now, 11)), Liveness::Alive),
            Takeable::Yes(TakeReason::FutureDated)
        );
        assert_eq!(
            t(
                &record("other", ClaimedAt::Unparseable("soon".into())),
                Liveness::Alive
            ),
            Takeable::Yes(TakeReason::UnparseableClaimedAt)
        );
    }

    #[test]
    fn extended_rules_judge_tokens_by_presence_and_monotonic_age() {
        use crate::presence::PeerPresence;
        let now = SystemTime::now();
        let mut rec = record("other", at(now, -3600)); // wall-clock ancient: a slept machine
        if let LockContent::Record(r) = &mut rec {
            r.live = Some("1-0123456789abcdef".into());
        }
        let t = |unchanged: u64, p: PeerPresence| {
            takeable_extended(
                &rec,
                "me",
                now,
                STALE,
                Duration::from_secs(unchanged),
                alive,
                |_| p,
            )
        };
        // Alive and recently changed: never evicted by the wall clock.
        assert_eq!(t(1, PeerPresence::Alive), Takeable::No);
        // Alive but frozen longer than stale by our clock: hung.
        assert_eq!(t(11, PeerPresence::Alive), Takeable::Yes(TakeReason::Hung));
        assert_eq!(
            t(1, PeerPresence::Gone),
            Takeable::Yes(TakeReason::HolderGone)
        );
        // Unknown presence: the NIP's rules (here: stale by the wall clock),
        // confirmed by our own clock: a live writer rewrites its record.
        assert_eq!(t(1, PeerPresence::Unknown), Takeable::No);
        assert_eq!(
            t(11, PeerPresence::Unknown),
            Takeable::Yes(TakeReason::Stale)
        );
        // Records without a token: the NIP's rules, presence never probed.
        let foreign = record("other", at(now, -1));
        let r = takeable_extended(
            &foreign,
            "me",
            now,
            STALE,
            Duration::from_secs(99),
            alive,
            |_| panic!("probed"),
        );
        assert_eq!(r, Takeable::No);
    }

    #[test]
    fn a_wall_clock_step_never_evicts_a_live_writer_without_presence() {
        let now = SystemTime::now();
        let t = |offset: i64, unchanged: u64, pid: fn(u32) -> Liveness| {
            takeable_extended(
                &record("harness", at(now, offset)),
                "me",
                now,
                STALE,
                Duration::from_secs(unchanged),
                pid,
                |_| panic!("no token, no presence probe"),
            )
        };
        // The clock stepped back (their stamp is an hour ahead) or forward
        // (an hour behind): a record that keeps changing is a live writer.
        assert_eq!(t(3600, 1, alive), Takeable::No);
        assert_eq!(t(-3600, 1, alive), Takeable::No);
        // Unchanged past the bound on our clock: abandoned (recycled pid).
        assert_eq!(t(3600, 11, alive), Takeable::Yes(TakeReason::FutureDated));
        assert_eq!(t(-3600, 11, alive), Takeable::Yes(TakeReason::Stale));
        // A dead pid is still taken at once.
        assert_eq!(
            t(3600, 0, |_| Liveness::Dead),
            Takeable::Yes(TakeReason::DeadPid)
        );
    }

    #[test]
    fn probe_is_not_called_for_free_or_own_files() {
        let now = SystemTime::now();
        let boom = |_: u32| -> Liveness { panic!("probed") };
        takeable(&LockContent::Empty, "me", now, STALE, boom);
        takeable(&record("me", at(now, 0)), "me", now, STALE, boom);
    }
}
