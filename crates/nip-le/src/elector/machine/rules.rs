//! The timings and the extensions the rules follow, with the few
//! judgements that are pure arithmetic on them.

use std::time::Duration;

use super::super::profile::Profile;

/// The timings and the components the rules follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Rules {
    /// Which extensions are on (see [`Profile`]).
    pub profile: Profile,
    pub refresh: Duration,
    pub stale: Duration,
    pub stand_down: Duration,
    /// How long a reply sent while we may act can take to reach the relay
    /// (see [`Rules::validity`]).
    pub reply_flight: Duration,
}

impl Rules {
    /// Extension: whether a round of the writer's loop that began `late`
    /// after the wake-up it asked for means we were paused (or starved)
    /// and could not look. The slack is half the margin between refresh
    /// and stale, so any pause long enough to make a live holder look hung
    /// is noticed. The hang timers then start again, once per unchanged
    /// record (see `KeyMachine::pause_noticed`), so that a cluster paused
    /// and resumed together, in any order, keeps its leader, and an
    /// observer whose every round comes that late still replaces a hung
    /// holder.
    pub(crate) fn paused(&self, late: Duration) -> bool {
        let slack = self.stale.saturating_sub(self.refresh) / 2;
        self.profile.monotonic_hang && late > slack
    }

    /// Ticks due within this much are run together: never much earlier,
    /// or a spec claimant would tick just before the holder releases and
    /// wait a whole interval more.
    pub(crate) fn tick_slack(&self) -> Duration {
        (self.refresh / 16).min(Duration::from_millis(10))
    }

    /// How soon a holder whose look found the `flock` held looks again: its
    /// write must land as soon as the hold ends.
    pub(crate) fn busy_retry(&self, lock_wait: Duration) -> Duration {
        (lock_wait + Duration::from_millis(50)).min(self.refresh)
    }

    /// How long a leader's view stays valid after its own last write. Under
    /// the stale bound by the reply flight: observers replace a holder that
    /// stopped writing only after the bound, measured from when they saw its
    /// last write, so the leader fences itself before anyone may take over,
    /// whatever the coarse clock's granularity, and a reply it sent just
    /// before lands (with its `done`) before a successor owes the event
    /// (the simulator: a holder kept from writing by a peer's `flock` sent
    /// a reply 50 ms before its fence that reached the relay after its
    /// successor had taken the mention again). At least 50 ms, at most a
    /// quarter of the gap between refresh and stale: the rest is for a
    /// refresh that failed to retry in before the holder stops acting (with
    /// half, short test timings fenced a holder after two missed refreshes
    /// of a loaded machine, which the NIP's timings never do).
    pub(crate) fn validity(&self) -> Duration {
        let flight = if mutated!(NoReplyFlight) {
            Duration::ZERO
        } else {
            self.reply_flight
        };
        let margin = (flight.max(Duration::from_millis(50)))
            .min((self.stale.saturating_sub(self.refresh)) / 4);
        self.stale.saturating_sub(margin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Mode;

    fn rules(refresh: u64, stale: u64, reply_flight: u64) -> Rules {
        let ms = Duration::from_millis;
        Rules {
            profile: Profile::of(Mode::Extended),
            refresh: ms(refresh),
            stale: ms(stale),
            stand_down: ms(stale),
            reply_flight: ms(reply_flight),
        }
    }

    #[test]
    fn a_leader_stops_acting_a_reply_flight_before_anyone_may_take_over() {
        let ms = Duration::from_millis;
        // The NIP's timings, the default flight: 1 s to land in.
        assert_eq!(rules(5_000, 10_000, 1_000).validity(), ms(9_000));
        // At least 50 ms for the coarse clock.
        assert_eq!(rules(5_000, 10_000, 1).validity(), ms(9_950));
        // At most a quarter of the gap a failed refresh retries in.
        assert_eq!(rules(200, 1_000, 1_000).validity(), ms(800));
    }
}
