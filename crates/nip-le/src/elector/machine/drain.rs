//! Extension: a step-down that waits for this process's agent to stop
//! before the lock moves. Upstream's agent harness holds an exclusive
//! instance lease for its whole life, so a successor that starts its agent
//! while ours still stops finds the lease taken and has to retry. So a
//! holder that gives the lock up on purpose (another window's claim, a
//! release, a leave) stops acting at once, keeps its record while its agent
//! stops, and hands the lock over when the agent is gone, or at a bound:
//! half the stand-down (the claimant's request is still fresh for the other
//! half) and never so long that observers, who judge a record unchanged
//! for the stale bound hung, would take the lock meanwhile (our last write
//! is at most a refresh old). Pure: the writer asks and carries out.

use std::time::{Duration, Instant};

use super::super::types::ChangeReason;
use super::Rules;

/// What a step-down does once it may give the lock up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StepDownPlan {
    /// Why we stopped acting (the change announced at once).
    pub reason: ChangeReason,
    /// The instance the lock should go to, when one asked for it.
    pub target: Option<String>,
    /// Announce even if nothing changed (a leave).
    pub always: bool,
    /// We leave the key: our takes are given back.
    pub departing: bool,
    /// The local lead request the step-down serves, if any.
    pub nonce: Option<String>,
}

/// A step-down waiting for our agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Drain {
    pub plan: StepDownPlan,
    /// When the lock moves whether the agent is gone or not.
    pub until: Instant,
}

impl Rules {
    /// The longest a step-down waits for our agent (see the module).
    pub(crate) fn drain_bound(&self) -> Duration {
        (self.stand_down / 2).min(self.stale.saturating_sub(self.refresh))
    }

    /// Whether `plan` waits for our agent: only with hand-overs (extended
    /// mode: the plain NIP releases at once), only while we hold the lock
    /// (a fail-safe lead moves no lock) and only while our agent runs.
    pub(crate) fn drain(
        &self,
        plan: StepDownPlan,
        holds_lock: bool,
        agent_running: bool,
        now: Instant,
    ) -> Result<Drain, StepDownPlan> {
        if self.profile.handoff && holds_lock && agent_running {
            Ok(Drain {
                plan,
                until: now + self.drain_bound(),
            })
        } else {
            Err(plan)
        }
    }
}

impl Drain {
    /// Whether the lock may move now.
    pub(crate) fn over(&self, agent_running: bool, now: Instant) -> bool {
        !agent_running || now >= self.until
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Mode;
    use crate::elector::profile::Profile;

    fn rules(mode: Mode, refresh: u64, stale: u64, stand_down: u64) -> Rules {
        let ms = Duration::from_millis;
        Rules {
            profile: Profile::of(mode),
            refresh: ms(refresh),
            stale: ms(stale),
            stand_down: ms(stand_down),
            reply_flight: crate::config::DEFAULT_REPLY_FLIGHT,
        }
    }

    fn plan() -> StepDownPlan {
        StepDownPlan {
            reason: ChangeReason::StoodDown,
            target: Some("b".into()),
            always: false,
            departing: false,
            nonce: None,
        }
    }

    #[test]
    fn a_holder_whose_agent_runs_waits_for_it_up_to_the_bound() {
        let (r, t0) = (rules(Mode::Extended, 5_000, 10_000, 10_000), Instant::now());
        assert_eq!(r.drain_bound(), Duration::from_secs(5));
        let d = r.drain(plan(), true, true, t0).expect("waits");
        assert!(!d.over(true, t0 + Duration::from_millis(4_999)));
        assert!(d.over(false, t0), "the agent is gone: at once");
        assert!(d.over(true, t0 + Duration::from_secs(5)), "bounded");
        // Short timings: bounded by the stale margin, or by the stand-down.
        assert_eq!(
            rules(Mode::Extended, 200, 1_000, 1_000).drain_bound(),
            Duration::from_millis(500)
        );
        assert_eq!(
            rules(Mode::Extended, 900, 1_000, 4_000).drain_bound(),
            Duration::from_millis(100)
        );
    }

    #[test]
    fn nothing_waits_without_an_agent_a_lock_or_hand_overs() {
        let t0 = Instant::now();
        let ext = rules(Mode::Extended, 200, 1_000, 1_000);
        assert_eq!(ext.drain(plan(), true, false, t0), Err(plan()));
        assert_eq!(ext.drain(plan(), false, true, t0), Err(plan()));
        let spec = rules(Mode::Spec, 200, 1_000, 1_000);
        assert_eq!(spec.drain(plan(), true, true, t0), Err(plan()));
    }
}
