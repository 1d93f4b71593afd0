//! What to announce and why: a pure machine over what readers see (the
//! leader flag with self-fencing) and what the key machine concluded. The
//! writer hands it the facts and publishes what it returns; it decides
//! every change event: the lapse of a fenced lead, a gain withheld while
//! fenced, `unfenced`, and `mustCancelTurn`.

use super::super::types::ChangeReason;

/// One change event to publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Announcement {
    /// Whether we act now (what `is_leader` answers).
    pub is_leader: bool,
    /// Why.
    pub reason: ChangeReason,
    /// We acted until this change and must abort the turn in flight.
    pub must_cancel_turn: bool,
}

/// What was announced last, and a gain not announced yet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Announcer {
    /// Whether the last announcement said we act.
    reported: bool,
    /// The reason of a gain we could not announce because we were fenced
    /// (a handed-over record we could not confirm), told when a write of
    /// ours unfences us.
    withheld: Option<ChangeReason>,
}

impl Announcer {
    /// Whether the last announcement said we act.
    pub(crate) fn reported(&self) -> bool {
        self.reported
    }

    /// Announces `is_leader` for `reason` if it differs from the last
    /// announcement, or `always`.
    pub(crate) fn tell(
        &mut self,
        is_leader: bool,
        reason: ChangeReason,
        always: bool,
    ) -> Option<Announcement> {
        let was = std::mem::replace(&mut self.reported, is_leader);
        (was != is_leader || always).then(|| Announcement {
            is_leader,
            reason,
            must_cancel_turn: was && !is_leader && reason.must_cancel_turn(),
        })
    }

    /// A lead we announced whose validity ran out (`acting` is false now)
    /// is announced as fenced, so the app's gate closes when `is_leader`
    /// turns false, not at the next look.
    pub(crate) fn lapse(&mut self, acting: bool) -> Option<Announcement> {
        (self.reported && !acting)
            .then(|| self.tell(false, ChangeReason::Fenced, false))
            .flatten()
    }

    /// What a look's conclusion announces. `leader` is the machine's view,
    /// `acting_before` what readers saw before this look was carried out,
    /// `acting` what they see now (fencing included), `held` whether the
    /// flag said leader before this look. A lapse not announced yet comes
    /// first: others may have acted meanwhile, so a lead regained now is a
    /// new tenure, not a continuation (a look that concludes we lost says
    /// so itself).
    pub(crate) fn conclude(
        &mut self,
        leader: bool,
        acting_before: bool,
        acting: bool,
        held: bool,
        given: ChangeReason,
        always: bool,
    ) -> Vec<Announcement> {
        let mut out = Vec::new();
        if leader && !mutated!(Regained) {
            out.extend(self.lapse(acting_before));
        }
        let reason = match (self.reported, acting) {
            (true, false) if leader => ChangeReason::Fenced,
            (false, true) if held && given == ChangeReason::Acquired => {
                self.withheld.take().unwrap_or(ChangeReason::Unfenced)
            }
            _ => given,
        };
        if leader && !acting && !self.reported && given != ChangeReason::Acquired {
            self.withheld = Some(given);
        } else if acting || !leader {
            self.withheld = None;
        }
        out.extend(self.tell(acting, reason, always));
        out
    }

    /// The step-down path: we stop acting before the file changes.
    pub(crate) fn step_down(&mut self, reason: ChangeReason, always: bool) -> Option<Announcement> {
        self.withheld = None;
        self.tell(false, reason, always)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ChangeReason::*;

    fn lead(a: &mut Announcer) {
        assert_eq!(
            a.conclude(true, false, true, false, Acquired, true),
            vec![Announcement {
                is_leader: true,
                reason: Acquired,
                must_cancel_turn: false
            }]
        );
    }

    #[test]
    fn a_lead_regained_after_an_unannounced_lapse_is_announced_fenced_first() {
        // Stopped past the validity, replaced, the replacement died: the
        // look after SIGCONT takes the lock again. Without the fenced
        // announcement first the lead looks unbroken and a turn of the old
        // tenure finishes (f743e46).
        let mut a = Announcer::default();
        lead(&mut a);
        let out = a.conclude(true, false, true, true, Failover, false);
        assert_eq!(
            out,
            vec![
                Announcement {
                    is_leader: false,
                    reason: Fenced,
                    must_cancel_turn: true
                },
                Announcement {
                    is_leader: true,
                    reason: Failover,
                    must_cancel_turn: false
                },
            ]
        );
    }

    #[test]
    fn every_way_of_ceasing_to_act_cancels_the_turn_and_observers_cancel_nothing() {
        for reason in [Lost, StoodDown, Released] {
            let mut a = Announcer::default();
            lead(&mut a);
            let out = a.conclude(false, true, false, true, reason, false);
            assert_eq!(out.len(), 1);
            assert!(out[0].must_cancel_turn, "{reason:?}");
        }
        let mut a = Announcer::default();
        let out = a.conclude(false, false, false, false, Observer, true);
        assert!(!out[0].must_cancel_turn);
        assert_eq!(a.lapse(false), None, "nothing was announced to lapse");
    }

    #[test]
    fn a_gain_withheld_while_fenced_is_told_when_a_write_unfences_it() {
        let mut a = Announcer::default();
        // Handed over but unconfirmed: we hold the lock and may not act.
        assert!(a
            .conclude(true, false, false, false, HandedOver, false)
            .is_empty());
        // The next look writes and validates: the gain is told as it was.
        let out = a.conclude(true, false, true, true, Acquired, false);
        assert_eq!(out[0].reason, HandedOver);
        // A fence and a write that lifts it: fenced, then unfenced.
        assert_eq!(a.lapse(false).map(|x| x.reason), Some(Fenced));
        let out = a.conclude(true, false, true, true, Acquired, false);
        assert_eq!(out[0].reason, Unfenced);
    }

    #[test]
    fn a_look_that_finds_us_fenced_says_fenced() {
        let mut a = Announcer::default();
        lead(&mut a);
        let out = a.conclude(true, true, false, true, Acquired, false);
        assert_eq!(
            out,
            vec![Announcement {
                is_leader: false,
                reason: Fenced,
                must_cancel_turn: true
            }]
        );
    }
}
