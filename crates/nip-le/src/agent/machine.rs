//! The rules of a leader-gated agent process, pure: whether the window may
//! act and what its child did go in, with the time; what to do with the
//! child comes out. The shell ([`super::AgentSupervisor`]) only spawns, signals
//! and reaps.
//!
//! * The child runs only while we may act: it is started when we may, and
//!   stopped (SIGTERM, then SIGKILL after the grace) as soon as we may not.
//! * A child that exits while we may act is started again after a backoff
//!   that doubles from `backoff_min` to `backoff_max`; one that ran for
//!   `backoff_max` or longer before exiting starts the backoff afresh. An
//!   agent that refuses to start while another holds its instance lease
//!   (upstream's harness, the predecessor's agent still stopping) is so
//!   retried until the lease is free.
//! * At most one child exists at any time: a new one is started only once
//!   the previous one has been reaped.

use std::time::{Duration, Instant};

/// The timings of the rules (see [`super::AgentCommand`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentTimings {
    /// How long a child has after SIGTERM before SIGKILL.
    pub grace: Duration,
    /// The first restart delay.
    pub backoff_min: Duration,
    /// The longest restart delay.
    pub backoff_max: Duration,
}

/// What happened, for the rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// Look again (the leadership may have changed, a deadline may be due).
    Look,
    /// The child we started has this pid.
    Spawned(u32),
    /// Starting the child failed (no such program, …).
    SpawnFailed,
    /// The start was not made after all: we may no longer act.
    SpawnCancelled,
    /// The child with this pid has exited (it is reaped by the shell).
    Exited(u32),
}

/// What to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Start the child (answered by `Spawned` or `SpawnFailed`).
    Spawn,
    /// Ask the child to stop (SIGTERM).
    Terminate(u32),
    /// Stop the child now (SIGKILL).
    Kill(u32),
}

/// Where the child is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// No child; one may be started.
    Idle,
    /// A start was asked for and not answered yet.
    Spawning,
    /// Running while we may act, since the instant given.
    Running {
        /// Its pid.
        pid: u32,
        /// When it started.
        since: Instant,
    },
    /// Asked to stop; killed at `kill_at` unless it exits first.
    Stopping {
        /// Its pid.
        pid: u32,
        /// When SIGKILL is due.
        kill_at: Instant,
        /// Whether SIGKILL was sent.
        killed: bool,
    },
    /// No child; the next start waits until `until`.
    BackingOff {
        /// When a start may be made again.
        until: Instant,
    },
}

/// The agent's rules and state.
#[derive(Debug, Clone)]
pub struct AgentMachine {
    t: AgentTimings,
    state: State,
    /// Restarts since the last long run: the backoff's exponent.
    failures: u32,
}

impl AgentMachine {
    /// No child yet.
    pub fn new(t: AgentTimings) -> Self {
        Self {
            t,
            state: State::Idle,
            failures: 0,
        }
    }

    /// Where the child is.
    pub fn state(&self) -> State {
        self.state
    }

    /// The next restart delay after `failures` restarts.
    fn backoff(&self) -> Duration {
        let shift = self.failures.saturating_sub(1).min(20);
        self.t
            .backoff_min
            .saturating_mul(1u32 << shift)
            .min(self.t.backoff_max)
    }

    /// One step: `input` happened at `now`, and `may_act` says whether the
    /// window may act for the agent now.
    pub fn step(&mut self, input: Input, may_act: bool, now: Instant) -> Vec<Action> {
        let mut out = Vec::new();
        match (self.state, input) {
            (State::Spawning, Input::Spawned(pid)) => {
                self.state = State::Running { pid, since: now };
            }
            (State::Spawning, Input::SpawnFailed) => self.exited_early(now, Duration::ZERO),
            (State::Spawning, Input::SpawnCancelled) => self.state = State::Idle,
            (State::Running { pid, since }, Input::Exited(p)) if p == pid => {
                self.exited_early(now, now.saturating_duration_since(since));
            }
            (State::Stopping { pid, .. }, Input::Exited(p)) if p == pid => {
                self.state = State::Idle;
            }
            _ => {}
        }
        // Then what the leadership and the clock ask for.
        match self.state {
            State::Running { pid, .. } if !may_act => {
                out.push(Action::Terminate(pid));
                self.state = State::Stopping {
                    pid,
                    kill_at: now + self.t.grace,
                    killed: false,
                };
            }
            State::Stopping {
                pid,
                kill_at,
                killed: false,
            } if now >= kill_at => {
                out.push(Action::Kill(pid));
                self.state = State::Stopping {
                    pid,
                    kill_at,
                    killed: true,
                };
            }
            State::BackingOff { .. } if !may_act => self.state = State::Idle,
            State::BackingOff { until } if now >= until => {
                out.push(Action::Spawn);
                self.state = State::Spawning;
            }
            State::Idle if may_act => {
                out.push(Action::Spawn);
                self.state = State::Spawning;
            }
            _ => {}
        }
        out
    }

    /// The child exited (or never started) while we wanted it running,
    /// after running for `ran`.
    fn exited_early(&mut self, now: Instant, ran: Duration) {
        self.failures = if ran >= self.t.backoff_max {
            1
        } else {
            self.failures.saturating_add(1)
        };
        self.state = State::BackingOff {
            until: now + self.backoff(),
        };
    }

    /// When the rules must look again without an input: SIGKILL or a
    /// restart due.
    pub fn next_deadline(&self) -> Option<Instant> {
        match self.state {
            State::Stopping {
                kill_at,
                killed: false,
                ..
            } => Some(kill_at),
            State::BackingOff { until } => Some(until),
            _ => None,
        }
    }

    /// Whether the machine asked for SIGKILL of the child it is stopping.
    pub fn killed(&self) -> bool {
        matches!(self.state, State::Stopping { killed: true, .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn m() -> AgentMachine {
        AgentMachine::new(AgentTimings {
            grace: 500 * MS,
            backoff_min: 100 * MS,
            backoff_max: 2_000 * MS,
        })
    }

    #[test]
    fn runs_only_while_we_may_act_and_stops_with_term_then_kill() {
        let (mut m, t0) = (m(), Instant::now());
        assert!(
            m.step(Input::Look, false, t0).is_empty(),
            "never started unled"
        );
        assert_eq!(m.step(Input::Look, true, t0), vec![Action::Spawn]);
        assert!(
            m.step(Input::Look, true, t0).is_empty(),
            "one start at a time"
        );
        assert!(m.step(Input::Spawned(7), true, t0).is_empty());
        // Leadership lost: SIGTERM at once, SIGKILL after the grace only.
        assert_eq!(
            m.step(Input::Look, false, t0 + MS),
            vec![Action::Terminate(7)]
        );
        assert_eq!(m.next_deadline(), Some(t0 + 501 * MS));
        assert!(m.step(Input::Look, false, t0 + 400 * MS).is_empty());
        // Regained meanwhile: nothing new starts while the old one lives.
        assert!(m.step(Input::Look, true, t0 + 450 * MS).is_empty());
        assert_eq!(
            m.step(Input::Look, true, t0 + 501 * MS),
            vec![Action::Kill(7)]
        );
        assert!(m.killed());
        assert!(m.step(Input::Look, true, t0 + 600 * MS).is_empty());
        // Reaped: only now a new one starts.
        assert_eq!(
            m.step(Input::Exited(7), true, t0 + 601 * MS),
            vec![Action::Spawn]
        );
    }

    #[test]
    fn an_exit_while_we_may_act_restarts_after_a_doubling_bounded_backoff() {
        let (mut m, mut t) = (m(), Instant::now());
        m.step(Input::Look, true, t);
        let mut delays = Vec::new();
        for pid in 1..=8 {
            m.step(Input::Spawned(pid), true, t);
            t += 10 * MS;
            assert!(m.step(Input::Exited(pid), true, t).is_empty());
            let until = m.next_deadline().unwrap();
            delays.push((until - t).as_millis());
            assert!(m.step(Input::Look, true, until - MS).is_empty(), "early");
            assert_eq!(m.step(Input::Look, true, until), vec![Action::Spawn]);
            t = until;
        }
        assert_eq!(delays, vec![100, 200, 400, 800, 1600, 2000, 2000, 2000]);
        // A long run starts the backoff afresh.
        m.step(Input::Spawned(9), true, t);
        t += 2_000 * MS;
        m.step(Input::Exited(9), true, t);
        assert_eq!(m.next_deadline(), Some(t + 100 * MS));
        // Leadership lost while backing off: nothing starts.
        assert!(m.step(Input::Look, false, t + 200 * MS).is_empty());
        assert_eq!(m.state(), State::Idle);
    }

    #[test]
    fn a_failed_start_backs_off_and_a_stray_exit_is_ignored() {
        let (mut m, t) = (m(), Instant::now());
        m.step(Input::Look, true, t);
        assert!(m.step(Input::SpawnFailed, true, t).is_empty());
        assert_eq!(m.next_deadline(), Some(t + 100 * MS));
        assert_eq!(m.step(Input::Look, true, t + 100 * MS), vec![Action::Spawn]);
        m.step(Input::Spawned(3), true, t + 100 * MS);
        assert!(m.step(Input::Exited(99), true, t + 200 * MS).is_empty());
        assert!(matches!(m.state(), State::Running { pid: 3, .. }));
    }

    #[test]
    fn a_start_cancelled_for_a_lost_lead_is_no_failure() {
        let (mut m, t) = (m(), Instant::now());
        assert_eq!(m.step(Input::Look, true, t), vec![Action::Spawn]);
        assert!(m.step(Input::SpawnCancelled, false, t).is_empty());
        assert_eq!(m.state(), State::Idle);
        assert_eq!(
            m.step(Input::Look, true, t),
            vec![Action::Spawn],
            "no backoff"
        );
    }
}
