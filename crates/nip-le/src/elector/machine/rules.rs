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

    /// How long a leader's view stays valid after its own last write. A
    /// little under the stale bound: observers replace a hung holder only
    /// after the bound, measured from when they saw its last write, so the
    /// leader fences itself before anyone may take over, whatever the coarse
    /// clock's granularity.
    pub(crate) fn validity(&self) -> Duration {
        let margin = Duration::from_millis(50).min((self.stale.saturating_sub(self.refresh)) / 2);
        self.stale.saturating_sub(margin)
    }
}
