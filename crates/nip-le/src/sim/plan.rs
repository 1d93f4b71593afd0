//! What a run is made of: the cluster (how many windows of each mode,
//! harness peers), the timings (through the same [`crate::Config`] fields
//! an app sets) and a random plan of faults drawn from the seed.

use std::time::Duration;

use super::rng::Rng;

const MS: u64 = 1_000_000;

/// One fault. Which window it hits is drawn when it happens.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// SIGKILL of a window; a new one starts after `restart_after` ns.
    Kill {
        /// Delay of the restart.
        restart_after: u64,
    },
    /// A graceful quit (release, shutdown); a new window after the delay.
    Quit {
        /// Delay of the restart.
        restart_after: u64,
    },
    /// SIGSTOP of a window for `d` ns.
    Stop {
        /// How long.
        d: u64,
    },
    /// Every process stopped for `d` ns, the clocks running on.
    PauseAll {
        /// How long.
        d: u64,
    },
    /// The machine suspended for `d` ns: the monotonic clock stands still.
    Suspend {
        /// How long.
        d: u64,
    },
    /// The wall clock steps by `ns` (either way).
    WallStep {
        /// The step.
        ns: i64,
    },
    /// A window's wake-ups come late by up to `late` ns, for `d` ns.
    Starve {
        /// How long.
        d: u64,
        /// The most a wake-up comes late.
        late: u64,
    },
    /// The acting window (and its harness child) stops for `d` ns, and
    /// every other window's
    /// wake-ups come `late` ns late meanwhile (an overloaded machine, VM
    /// steal, a CPU quota): starved observers around a hung holder.
    StarvedAroundAHungLeader {
        /// How long.
        d: u64,
        /// How late every wake-up of the others comes.
        late: u64,
    },
    /// Writes fail with ENOSPC for `d` ns.
    Enospc {
        /// How long.
        d: u64,
    },
    /// Reads and writes fail with EIO for `d` ns.
    Eio {
        /// How long.
        d: u64,
    },
    /// The lock directory is read-only for `d` ns.
    ReadOnly {
        /// How long.
        d: u64,
    },
    /// The machine loses power: every process dies at once, a ledger keeps
    /// what was synced and perhaps part of the rest (a fragment), a lock
    /// file (never synced) keeps its record or comes back empty, the epoch
    /// mark (synced) stays; everyone starts again after `restart_after`.
    PowerLoss {
        /// Until the windows start again.
        restart_after: u64,
    },
    /// A peer hangs holding the lock file's `flock` for `d` ns.
    HoldFlock {
        /// How long.
        d: u64,
    },
    /// An unrelated process takes the pid of one that exited.
    PidReuse,
    /// A window's user claims the agent (the sidebar): the window's own
    /// claim and the relay frame the desktop sends beside it.
    Claim,
    /// The acting window is stopped past the stale bound in mid-turn; its
    /// successor is killed before it resumes, so the stopped one takes the
    /// lock back: a lead regained after a lapse, the turn of the old tenure
    /// still in flight.
    StopLeaderPastStale,
    /// Whichever window acts is killed (a restart follows after
    /// `restart_after`).
    KillActing {
        /// Delay of the restart.
        restart_after: u64,
    },
    /// A window leaves the election and joins again after `rejoin_after`.
    Leave {
        /// Delay of the join.
        rejoin_after: u64,
    },
    /// A window's agent harness child (sharing the window's instance id) exits,
    /// gracefully (it truncates the record that names the id) or by
    /// SIGKILL, and the window starts a new one after `restart_after`.
    ChildExit {
        /// Whether it exits gracefully.
        graceful: bool,
        /// Delay of the new child.
        restart_after: u64,
    },
    /// A relay `claim_leadership` frame for a window, lost or duplicated
    /// per recipient with these chances.
    ClaimFrame {
        /// Chance a recipient never gets it.
        lose: f64,
        /// Chance a recipient gets it twice.
        dup: f64,
    },
}

/// The cluster, the timings and the mix of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// Simulated seconds of faults (a quiet tail follows).
    pub seconds: u64,
    /// Extended windows.
    pub extended: usize,
    /// Spec-mode windows.
    pub spec: usize,
    /// Harness peers with ids of their own.
    pub harnesses: usize,
    /// The NIP's refresh.
    pub refresh: Duration,
    /// The NIP's stale bound.
    pub stale: Duration,
    /// The stand-down timeout.
    pub stand_down: Duration,
    /// The `flock` wait.
    pub lock_wait: Duration,
    /// Mean fault interval, ms (0: none).
    pub fault_every_ms: u64,
    /// Mean mention interval, ms (0: none).
    pub mention_every_ms: u64,
    /// How long a turn takes on average, ms (each draws a quarter to twice
    /// that).
    pub turn_ms: u64,
    /// Most mentions an app keeps queued (0: every one), the oldest
    /// dropped first, as Buzz's harness keeps 500 per channel: the queue
    /// an app walks for what is owed stays bounded on a long run.
    pub queue_cap: usize,
    /// The work ledger's rewrite budget, bytes (`None`: the engine's 8 MiB,
    /// which no run reaches). With one, each rewrite past it marks answered
    /// events settled, and the apps say when each event they take was
    /// published, as `LeaderGate` does: the settled mark under every fault.
    pub ledger_budget: Option<usize>,
    /// With [`Options::ledger_budget`], how far behind now a rewrite may
    /// mark answered events settled (the engine's 10 minutes is longer
    /// than a run).
    pub settle_lag: Duration,
    /// Which faults are drawn.
    pub mix: Mix,
}

/// Which kinds of fault a plan draws.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mix {
    /// Kills, quits, stops, leaves, claims.
    pub processes: bool,
    /// A peer hanging while it holds the lock file's `flock`.
    pub holds: bool,
    /// Whole-machine pauses and suspends, wall steps.
    pub clocks: bool,
    /// ENOSPC, EIO, a read-only directory.
    pub files: bool,
    /// Starved wake-ups.
    pub starvation: bool,
    /// Pid reuse.
    pub pids: bool,
    /// Every extended window runs an agent harness child with its id (the
    /// NIP's injected-id path), which exits and restarts.
    pub children: bool,
}

impl Mix {
    /// Every kind.
    pub const ALL: Mix = Mix {
        processes: true,
        holds: true,
        clocks: true,
        files: true,
        starvation: true,
        pids: true,
        children: true,
    };
}

impl Options {
    /// The sizes the simulated ledgers keep to (see
    /// [`Options::ledger_budget`]).
    pub fn ledger_limits(&self) -> crate::ledger::Limits {
        (self.ledger_budget).map_or_else(Default::default, |budget| crate::ledger::Limits {
            settle_lag: self.settle_lag,
            ..crate::ledger::Limits::scaled(budget)
        })
    }

    /// Three extended windows working a queue, the NIP's timings, every
    /// fault.
    pub fn extended(seconds: u64) -> Self {
        Self {
            seconds,
            extended: 3,
            spec: 0,
            harnesses: 0,
            refresh: Duration::from_secs(5),
            stale: Duration::from_secs(10),
            stand_down: Duration::from_secs(10),
            lock_wait: Duration::from_millis(250),
            fault_every_ms: 4000,
            mention_every_ms: 2000,
            turn_ms: 1500,
            queue_cap: 0,
            ledger_budget: None,
            settle_lag: crate::ledger::SETTLE_LAG,
            mix: Mix::ALL,
        }
    }

    /// Extended and spec windows beside a harness peer: leadership
    /// invariants only (spec windows and the harness keep no ledger, so
    /// they may answer twice by design).
    pub fn mixed(seconds: u64) -> Self {
        Self {
            extended: 2,
            spec: 1,
            harnesses: 1,
            mention_every_ms: 0,
            ..Self::extended(seconds)
        }
    }

    /// Spec-mode windows only (the NIP's letter): leadership invariants,
    /// and how often a claimant wins the lock its holder released.
    pub fn spec(seconds: u64) -> Self {
        Self {
            extended: 0,
            spec: 3,
            harnesses: 0,
            mention_every_ms: 0,
            ..Self::extended(seconds)
        }
    }

    /// Whether every mention must be answered exactly once: only extended
    /// windows take part.
    pub fn exactly_once(&self) -> bool {
        self.spec == 0 && self.harnesses == 0 && self.mention_every_ms > 0
    }
}

/// The faults of a run, in time order.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// (virtual ns, fault).
    pub faults: Vec<(u64, Fault)>,
}

impl Plan {
    /// A plan drawn from `rng`.
    pub fn random(rng: &mut Rng, o: &Options) -> Self {
        let mut faults = Vec::new();
        if o.fault_every_ms == 0 {
            return Self { faults };
        }
        let end = o.seconds * 1000 * MS;
        let stale = o.stale.as_nanos() as u64;
        let mut at = 2000 * MS;
        while at < end {
            if let Some(f) = draw(rng, o.mix, stale) {
                faults.push((at, f));
            }
            at += rng.range(o.fault_every_ms / 2, o.fault_every_ms * 3 / 2) * MS;
        }
        Self { faults }
    }
}

fn draw(rng: &mut Rng, mix: Mix, stale: u64) -> Option<Fault> {
    // Drawn apart, so that the plans without children stay as they were.
    if mix.children && rng.chance(0.15) {
        return Some(Fault::ChildExit {
            graceful: rng.chance(0.5),
            restart_after: rng.range(0, stale / 2),
        });
    }
    // Drawn apart too: every round late past the pause rule's bound (a
    // refresh and a quarter of the stale bound at the default timings),
    // for longer than a takeover may take then.
    if mix.starvation && rng.chance(0.03) {
        return Some(Fault::StarvedAroundAHungLeader {
            d: rng.range(4 * stale, 5 * stale),
            late: rng.range(stale * 8 / 10, stale),
        });
    }
    let restart_after = rng.range(0, 2 * stale);
    let d = rng.range(MS, 3 * stale);
    Some(match rng.range(0, 16) {
        0 | 1 if mix.processes => Fault::Kill { restart_after },
        2 if mix.processes => Fault::Quit { restart_after },
        3 | 4 if mix.processes => Fault::Stop { d },
        5 | 6 if mix.processes => Fault::Claim,
        7 if mix.processes => Fault::ClaimFrame {
            lose: 0.2,
            dup: 0.2,
        },
        8 if mix.clocks => Fault::PauseAll { d },
        9 if mix.clocks => Fault::Suspend { d },
        10 if mix.clocks => Fault::WallStep {
            ns: rng.range(0, 2 * stale) as i64 - stale as i64,
        },
        11 if mix.starvation => Fault::Starve {
            d,
            late: rng.range(0, stale / 4),
        },
        12 if mix.files => match rng.range(0, 3) {
            0 => Fault::Enospc { d },
            1 => Fault::Eio { d },
            2 => Fault::ReadOnly { d },
            _ => Fault::PowerLoss { restart_after },
        },
        13 if mix.pids => Fault::PidReuse,
        14 if mix.holds => Fault::HoldFlock {
            d: rng.range(MS, stale / 2),
        },
        15 if mix.processes => Fault::Leave {
            rejoin_after: restart_after,
        },
        16 if mix.processes => Fault::StopLeaderPastStale,
        _ => return None,
    })
}
