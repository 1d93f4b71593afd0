//! The rules of a leader-gated agent process, pure: what the election says
//! and what the runner answered go in, with the time; what to ask of the
//! runner comes out. The shell ([`super::AgentSupervisor`]) only calls the
//! runner ([`super::AgentRunner`]) and reports.
//!
//! * The agent runs only while we may act: it is started when we may, and
//!   stopped as soon as we may not. A stop asked for while a start is in
//!   flight waits for that start's answer, then stops what it started.
//! * One start or stop in flight at a time, and at most one agent: a new
//!   one is started only once the previous one is gone.
//! * A start refused as "busy" (the agent's instance lease is still held,
//!   by the predecessor's agent that is stopping), or an agent that exits
//!   at once for that reason, is retried after a short backoff that
//!   doubles from `busy_min` to `busy_max`, for as long as we may act.
//! * A start that fails otherwise, and an agent that exits by itself while
//!   we may act, is retried after a backoff that doubles from
//!   `backoff_min` to `backoff_max`; one that ran for `backoff_max` or
//!   longer before exiting starts the backoff afresh.
//! * An agent left behind by a window that is gone is stopped by whoever
//!   leads the host after it (see [`super::orphan`]): before each start,
//!   and once per host leadership when we lead the host but may not act
//!   (the agent's lease is held on another host, or by a sibling).

use std::time::{Duration, Instant};

/// The timings of the rules (see [`super::AgentCommand`] for the defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentTimings {
    /// How long an agent has after a graceful stop before it is killed
    /// (the command runner's; an app's runner keeps its own).
    pub grace: Duration,
    /// The first restart delay after a failure or an exit.
    pub backoff_min: Duration,
    /// The longest restart delay.
    pub backoff_max: Duration,
    /// The first retry delay after a "busy" answer.
    pub busy_min: Duration,
    /// The longest retry delay after "busy" answers.
    pub busy_max: Duration,
}

impl Default for AgentTimings {
    /// Grace 5 s; restarts from 250 ms to 10 s; busy retries from 25 ms to
    /// 100 ms (a predecessor's lease is freed the moment its agent exits).
    fn default() -> Self {
        Self {
            grace: Duration::from_secs(5),
            backoff_min: Duration::from_millis(250),
            backoff_max: Duration::from_secs(10),
            busy_min: Duration::from_millis(25),
            busy_max: Duration::from_millis(100),
        }
    }
}

impl AgentTimings {
    /// Checks the timings: every one positive, each backoff's bounds in
    /// order, none above an hour.
    pub fn validate(&self) -> Result<(), String> {
        let hour = Duration::from_secs(3600);
        let all = [
            self.grace,
            self.backoff_min,
            self.backoff_max,
            self.busy_min,
            self.busy_max,
        ];
        if all.iter().any(|d| *d > hour) {
            return Err("agent timings must not exceed an hour".into());
        }
        if all.iter().any(Duration::is_zero) {
            return Err("agent grace and backoffs must be greater than zero".into());
        }
        for (min, max, what) in [
            (self.backoff_min, self.backoff_max, "backoff"),
            (self.busy_min, self.busy_max, "busy backoff"),
        ] {
            if min > max {
                return Err(format!(
                    "agent {what}: the minimum ({min:?}) exceeds the maximum ({max:?})"
                ));
            }
        }
        Ok(())
    }
}

/// What the election says of the key now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Lead {
    /// We may act for the agent: its agent may run here.
    pub may_act: bool,
    /// We lead our host (the lock file names us), whether or not we may
    /// act across hosts: a dead window's agent on this host is ours to stop.
    pub host_leader: bool,
}

/// What happened, for the rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// Look again (the leadership may have changed, a deadline may be due).
    Look,
    /// The agent we asked for started, with this pid.
    Started(u32),
    /// The start failed; `busy`: its instance lease is held elsewhere.
    StartFailed {
        /// The lease is held elsewhere.
        busy: bool,
    },
    /// The start was not made after all: we may no longer act.
    StartCancelled,
    /// The agent with this pid exited by itself; `busy`: because its
    /// instance lease is held elsewhere.
    Exited {
        /// Its pid.
        pid: u32,
        /// It exited because its lease is held elsewhere.
        busy: bool,
    },
    /// The stop we asked for completed: the agent is gone.
    Stopped(u32),
    /// The look for a dead window's agent we asked for is done.
    OrphansChecked,
}

/// What to ask of the runner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Start the agent (answered by `Started` or `StartFailed`). A dead
    /// window's agent is stopped first.
    Start,
    /// Stop the agent with this pid (answered by `Stopped`).
    Stop(u32),
    /// Stop a dead window's agent, if the mark names one (answered by
    /// `OrphansChecked`).
    CheckOrphans,
}

/// Where the agent is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// No agent; one may be started.
    Idle,
    /// A start was asked for and not answered yet.
    Starting,
    /// Running since the instant given.
    Running {
        /// Its pid.
        pid: u32,
        /// When it started.
        since: Instant,
    },
    /// A stop was asked for and not answered yet.
    Stopping {
        /// Its pid.
        pid: u32,
    },
    /// No agent; the next start waits until `until`.
    BackingOff {
        /// When a start may be made again.
        until: Instant,
    },
    /// Looking for a dead window's agent.
    CheckingOrphans,
}

/// The agent's rules and state.
#[derive(Debug, Clone)]
pub struct AgentMachine {
    t: AgentTimings,
    state: State,
    /// Failed starts and early exits since the last long run.
    failures: u32,
    /// "Busy" answers in a row.
    busy: u32,
    /// Whether a dead window's agent was looked for in this host
    /// leadership.
    orphans_checked: bool,
}

/// The delay after `n` answers in a row: `min` doubled `n - 1` times, at
/// most `max`.
fn doubling(min: Duration, max: Duration, n: u32) -> Duration {
    let shift = n.saturating_sub(1).min(20);
    min.saturating_mul(1u32 << shift).min(max)
}

impl AgentMachine {
    /// No agent yet.
    pub fn new(t: AgentTimings) -> Self {
        Self {
            t,
            state: State::Idle,
            failures: 0,
            busy: 0,
            orphans_checked: false,
        }
    }

    /// Where the agent is.
    pub fn state(&self) -> State {
        self.state
    }

    /// One step: `input` happened at `now`, and `lead` is what the
    /// election says now.
    pub fn step(&mut self, input: Input, lead: Lead, now: Instant) -> Vec<Action> {
        if !lead.host_leader {
            self.orphans_checked = false;
        }
        match (self.state, input) {
            (State::Starting, Input::Started(pid)) => {
                self.state = State::Running { pid, since: now };
            }
            (State::Starting, Input::StartFailed { busy }) => self.retry(now, busy, Duration::ZERO),
            (State::Starting, Input::StartCancelled) => self.state = State::Idle,
            (State::Running { pid, since }, Input::Exited { pid: p, busy }) if p == pid => {
                self.retry(now, busy, now.saturating_duration_since(since));
            }
            (State::Stopping { pid }, Input::Stopped(p) | Input::Exited { pid: p, .. })
                if p == pid =>
            {
                self.state = State::Idle;
            }
            (State::CheckingOrphans, Input::OrphansChecked) => {
                self.orphans_checked = true;
                self.state = State::Idle;
            }
            _ => {}
        }
        // Then what the election and the clock ask for.
        let mut out = Vec::new();
        match self.state {
            State::Running { pid, .. } if !lead.may_act => {
                out.push(Action::Stop(pid));
                self.state = State::Stopping { pid };
            }
            State::BackingOff { .. } if !lead.may_act => {
                self.busy = 0;
                self.state = State::Idle;
                self.idle(lead, &mut out);
            }
            State::BackingOff { until } if now >= until => {
                out.push(Action::Start);
                self.state = State::Starting;
            }
            State::Idle => self.idle(lead, &mut out),
            _ => {}
        }
        out
    }

    /// No agent: start one if we may act (a dead window's agent is stopped
    /// first, by the start), else look for a dead window's agent once per
    /// host leadership.
    fn idle(&mut self, lead: Lead, out: &mut Vec<Action>) {
        if lead.may_act {
            out.push(Action::Start);
            self.state = State::Starting;
        } else if lead.host_leader && !self.orphans_checked {
            out.push(Action::CheckOrphans);
            self.state = State::CheckingOrphans;
        }
    }

    /// The agent failed to start, or exited after running for `ran`, while
    /// we wanted it running: back off, briefly if its lease was busy.
    fn retry(&mut self, now: Instant, busy: bool, ran: Duration) {
        if ran >= self.t.backoff_max {
            // A long run: whatever came before is over.
            self.busy = 0;
        }
        let delay = if busy {
            self.busy = self.busy.saturating_add(1);
            doubling(self.t.busy_min, self.t.busy_max, self.busy)
        } else {
            self.busy = 0;
            self.failures = if ran >= self.t.backoff_max {
                1
            } else {
                self.failures.saturating_add(1)
            };
            doubling(self.t.backoff_min, self.t.backoff_max, self.failures)
        };
        self.state = State::BackingOff { until: now + delay };
    }

    /// When the rules must look again without an input: a start due.
    pub fn next_deadline(&self) -> Option<Instant> {
        match self.state {
            State::BackingOff { until } => Some(until),
            _ => None,
        }
    }
}

#[cfg(test)]
#[path = "machine_tests.rs"]
mod tests;
