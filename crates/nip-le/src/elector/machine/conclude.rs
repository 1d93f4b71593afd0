//! The end of an evaluation (the new view from what the look saw) and the
//! one step-down path, with the claims that end a stand-down.

use crate::election::{self, TakeReason};
use crate::host::Origin;
use crate::presence::Sibling;
use crate::record::{encode_record_at, LockContent, RecordExt};

use super::super::types::ChangeReason;
use super::{
    Begin, Cause, Conclusion, KeyMachine, Look, Now, Observed, PendingClaim, Seen, Validity, Write,
};

impl KeyMachine {
    /// The new view from what the look saw.
    pub(super) fn conclude(
        &mut self,
        cause: Cause,
        begin: &Begin,
        look: Look,
        seen: Seen,
        now: std::time::Instant,
    ) -> Conclusion {
        let Seen {
            content,
            took,
            locked,
            busy,
            error,
        } = seen;
        match look {
            Look::Acquire { .. } => self.last_error = error,
            Look::Read => {
                // Another holder, or a holder that handed the lock to us:
                // the handoff is over either way.
                if matches!(&content, Ok(LockContent::Record(_))) {
                    self.stand_down_until = None;
                    self.stood_down_for = None;
                }
            }
        }
        // Extension: a file our harness child emptied (or is rewriting) is
        // still ours (see [`super::same_id`]): the retry takes it back.
        let vacated_ours = matches!(&content, Ok(c) if self.ours_vacated(c));
        // A record our child took (from a holder that may still act, or
        // from anyone) is ours only once we wrote ours over it, under the
        // rules that protect that holder.
        let childs_take = matches!(&content, Ok(c) if self.childs_record(c))
            && !self.held_before
            && took.is_none()
            && !mutated!(ChildsTake);
        self.holds_lock = !self.same_id.vacated
            && !childs_take
            && (vacated_ours
                || matches!(&content, Ok(LockContent::Record(r)) if r.instance_id == *self.our_id));
        if let Ok(c) = &content {
            self.remember_holders(c, now);
        }
        // No record seen (unreadable, empty, malformed): no hang to time.
        // A past deadline kept from the last record woke the writer again
        // at once for as long as the file stayed unreadable (EIO: found by
        // the simulator); the record, once readable again, gets a fresh
        // window.
        if !matches!(&content, Ok(LockContent::Record(_))) && !self.same_id.vacated {
            self.seen = None;
        }
        let validity = if !self.rules.profile.self_fencing {
            Validity::Always
        } else if !self.holds_lock {
            // Leading without holding the lock can only be the NIP's
            // fail-safe (absent, unreadable or malformed file): a MUST that
            // self-fencing never overrides. Fencing applies to holders.
            Validity::Always
        } else if locked && took.is_some() {
            // Validity counts from our own last write: observers time a hang
            // from the last change they saw, which is never earlier than
            // that write, so we are fenced before any of them may take over.
            // A read that finds our record unchanged proves nothing to them.
            Validity::Renew
        } else if busy && self.held_before && self.wrote_last(&content) {
            // A peer hangs holding the store's exclusion and the record is
            // still the one we wrote. Nobody can write meanwhile, but that
            // renews nothing: an observer that did not try to lock during
            // the hold times our hang from our last write, and may take
            // over the moment the hold ends, before our next write lands.
            // (The simulator found two acting windows when this renewed:
            // docs/simulator.md.) We fence at the deadline of our last
            // write, and a write after the hold unfences us; observers that
            // found the exclusion held gave us a fresh window, so nobody
            // else leads meanwhile.
            if mutated!(BusyRenew) {
                Validity::Renew
            } else {
                Validity::Keep
            }
        } else if !self.held_before {
            // A record naming us that we did not write (a handoff) and
            // could not confirm (the exclusive lock timed out): nobody has
            // seen a write of ours, so nothing bounds it yet.
            if mutated!(Handoff) {
                Validity::Always
            } else {
                Validity::Fenced
            }
        } else {
            Validity::Keep
        };
        // A holder already judged gone or hung is not watched: its death
        // can tell us nothing more, and a watch of a process that is gone
        // fires at once (a take that failed would look again, forever).
        let judged = !mutated!(HotLoop) && self.record_judged();
        let watch = match &content {
            Ok(c) if self.rules.profile.watch && !judged => c
                .record()
                .filter(|r| r.instance_id != *self.our_id)
                .filter(|r| r.origin(&self.here) == Origin::HereOrUnknown)
                .and_then(|r| r.live.clone()),
            _ => None,
        };
        // Extension: an empty file whose exclusion a peer holds is being
        // written, not "no coordination": the first record of a crowd
        // start, whose writer makes the epoch mark durable under the
        // exclusion first (a loaded disk made that longer than our lock
        // wait, and a second window fail-safe-led beside the first). No
        // fail-safe lead until the hold has lasted the stale bound: a
        // writer that hangs there never silences the agent. (A file our
        // harness child is rewriting stays ours: see `vacated_ours`.)
        let held_empty = self.rules.profile.monotonic_hang
            && busy
            && !vacated_ours
            && matches!(&content, Ok(LockContent::Empty))
            && !mutated!(EmptyHeldLeads);
        if !held_empty {
            self.held_empty = None;
        }
        let being_written = held_empty && {
            let (since, judged) = self.held_empty.get_or_insert((now, false));
            *judged = now.saturating_duration_since(*since) >= self.rules.stale;
            !*judged
        };
        // While another instance's claim is pending and we do not hold the
        // lock, an emptied file means a handoff in progress, not "no
        // coordination": the fail-safe does not make us a leader then.
        // Nor does a file a live holder's child emptied (see
        // [`super::same_id`]): the holder takes it back.
        let leader = self.stand_down_until.is_none()
            && (self.holds_lock || !begin.other_wants_it)
            && !self.same_id.vacated
            && !childs_take
            && !being_written
            && (vacated_ours || election::reads_as_leader(content.as_ref(), &self.our_id));
        self.observed = match content {
            Ok(c) => Observed::Content(c),
            Err(e) => Observed::Unreadable(e),
        };
        let claim_done = self.holds_lock && self.pending.is_some();
        let remove_request = if claim_done {
            self.pending.take().and_then(|p| p.nonce)
        } else {
            None
        };
        let reason = if claim_done {
            ChangeReason::Claimed
        } else if leader {
            match took {
                Some(r) if r.is_takeover() => ChangeReason::Failover,
                // A record naming us that we did not write: handed to us.
                Some(TakeReason::Ours) if !self.held_before && cause != Cause::Join => {
                    ChangeReason::HandedOver
                }
                Some(_) => ChangeReason::Acquired,
                None if self.holds_lock && !self.held_before => ChangeReason::HandedOver,
                None if self.holds_lock => ChangeReason::Acquired,
                None => ChangeReason::FailSafe,
            }
        } else if cause == Cause::Join {
            ChangeReason::Observer
        } else {
            ChangeReason::Lost
        };
        Conclusion {
            leader,
            reason,
            always: cause == Cause::Join || claim_done,
            validity,
            watch,
            remove_request,
            unbroken: locked && took == Some(TakeReason::Ours) && self.rewrote_ours,
            took_over: took.is_some_and(TakeReason::is_takeover),
        }
    }

    /// Starts the one step-down path: stop leading now (the writer clears
    /// the flag before it touches the file, so no moment exists where a
    /// successor and we both lead) and suppress acquiring until the
    /// stand-down timeout.
    pub(super) fn step_down(&mut self, now: Now) {
        self.stand_down_until = Some(now.mono + self.rules.stand_down);
        self.stood_down_for = None;
        self.pending = None;
    }

    /// Records which local lead request the current stand-down serves.
    pub(super) fn serve_request(&mut self, nonce: Option<String>) {
        self.stood_down_for = nonce;
    }

    /// Under the store's exclusion: give the lock up iff the file names us.
    /// Extension: to `heir` (a live sibling) with the next epoch, so the
    /// file is never empty while a sibling lives; otherwise truncate as the
    /// NIP says. Returns what to write and whether a record of ours was
    /// given up.
    pub(super) fn decide_release(
        &mut self,
        content: &LockContent,
        now: Now,
        heir: Option<&Sibling>,
    ) -> (Write, bool) {
        let ours = self.ours_vacated(content)
            || content
                .record()
                .is_some_and(|r| r.instance_id == *self.our_id);
        if !ours {
            return (Write::Keep, false);
        }
        let mark = if mutated!(NoReleaseMark) {
            None
        } else {
            self.release_mark(content)
        };
        match heir {
            Some(h) => {
                let epoch = self.next_epoch(content);
                let ext = RecordExt {
                    epoch,
                    live: &h.token,
                };
                let bytes =
                    encode_record_at(&h.instance_id, h.pid, now.wall, Some(ext), &self.here);
                match LockContent::parse(&bytes) {
                    LockContent::Record(r) => (Write::Put(bytes, r), true),
                    // A sibling's record that does not parse (an id no
                    // reader accepts): release as the NIP says instead.
                    _ => (Write::Clear(mark), true),
                }
            }
            None => (Write::Clear(mark), true),
        }
    }

    /// Ends the step-down path with what the store holds now.
    pub(super) fn released(&mut self, result: Result<LockContent, String>) {
        self.holds_lock = false;
        self.same_id.held_epoch = None;
        match result {
            Ok(c) => self.observed = Observed::Content(c),
            Err(e) => self.last_error = Some(e),
        }
    }

    /// The user's claim, first step: it ends any stand-down of ours.
    pub(super) fn claim_started(&mut self) {
        self.stand_down_until = None;
    }

    /// The user's claim: from now on, acquiring completes it (reported as
    /// [`ChangeReason::Claimed`]) until the stand-down timeout.
    pub(super) fn claim_pending_from(&mut self, now: Now, nonce: Option<String>) {
        let until = match &self.pending {
            Some(p) if p.nonce.is_none() => p.until,
            _ => now.mono + self.rules.stand_down,
        };
        self.pending = Some(PendingClaim { until, nonce });
    }

    /// `resume()`: ends a stand-down.
    pub(super) fn resume(&mut self) {
        self.stand_down_until = None;
    }
}
