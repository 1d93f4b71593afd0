//! The fault plan: which fault comes next, from a seeded generator and the
//! cluster as the runner sees it. Pure: no process is touched here.

/// xorshift64*: plenty for choosing faults, and reproducible from its seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator; a zero seed is made odd (xorshift never leaves zero).
    pub fn new(seed: u64) -> Self {
        Self(seed | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// One fault (or mention) to inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Append a mention to the feed.
    Mention,
    /// SIGKILL the slot's instance; restart it after `restart_ms`. Its
    /// harness child, if any, outlives it by `orphan_ms` (it notices its
    /// window is gone) and then exits, gracefully or not.
    Kill {
        /// The slot.
        slot: usize,
        /// Delay before the restart.
        restart_ms: u64,
        /// How long a harness child lives on, orphaned.
        orphan_ms: u64,
        /// Whether the orphan exits with SIGTERM (it truncates the file)
        /// rather than SIGKILL.
        orphan_graceful: bool,
    },
    /// SIGTERM the slot's instance (graceful exit); restart after `restart_ms`.
    Term {
        /// The slot.
        slot: usize,
        /// Delay before the restart.
        restart_ms: u64,
    },
    /// SIGSTOP the slot's instance for `hold_ms`, then SIGCONT.
    Stop {
        /// The slot.
        slot: usize,
        /// How long it stays stopped.
        hold_ms: u64,
        /// Whether its harness child is stopped with it (a frozen app)
        /// rather than left running (a hung window whose harness goes on).
        with_child: bool,
    },
    /// Runs with harness children: SIGKILL the slot's child (its record
    /// stays, naming a dead pid); a new one starts after `restart_ms`.
    ChildKill {
        /// The slot.
        slot: usize,
        /// Delay before the restart.
        restart_ms: u64,
    },
    /// Runs with harness children: SIGTERM the slot's child (it truncates
    /// the file if its record is there); a new one starts after
    /// `restart_ms`.
    ChildTerm {
        /// The slot.
        slot: usize,
        /// Delay before the restart.
        restart_ms: u64,
    },
    /// Send `claim` to the slot's instance.
    Claim {
        /// The slot.
        slot: usize,
    },
    /// Cross-host runs: SIGSTOP etcd for `hold_ms`, then SIGCONT.
    EtcdPause {
        /// How long etcd stays stopped.
        hold_ms: u64,
    },
    /// Cross-host runs: SIGKILL an etcd member and start it again.
    EtcdRestart {
        /// Which member (modulo how many there are).
        member: usize,
    },
    /// Cross-host runs on a cluster: cut a member from the others for
    /// `hold_ms` (clients still reach it).
    EtcdPartition {
        /// Which member (modulo how many there are).
        member: usize,
        /// How long the cut lasts.
        hold_ms: u64,
    },
}

/// What the plan needs to know about the cluster now.
#[derive(Debug, Clone, Default)]
pub struct View {
    /// Slots whose instance runs (not stopped, not dead).
    pub running: Vec<usize>,
    /// The running slot whose latest report says it leads, if any.
    pub leader: Option<usize>,
}

/// Chooses faults: 40 % mentions, 15 % SIGKILL, 10 % SIGTERM, 12 % SIGSTOP,
/// 15 % claims, in cross-host runs 4 % etcd pauses, 2 % restarts of an etcd
/// member and (a cluster) 2 % partitions of one, in runs with harness
/// children 4 % SIGKILL and 4 % SIGTERM of a child, the rest nothing.
/// Faults hit the leader half the time, and signals to windows are sent
/// only while more than two instances run.
#[derive(Debug, Clone)]
pub struct Plan {
    rng: Rng,
    stale_ms: u64,
    /// Cross-host runs: etcd's lease TTL in ms; etcd pauses are planned.
    etcd_ttl_ms: Option<u64>,
    /// Cross-host runs: etcd's members (partitions only with several).
    etcd_members: usize,
    /// Windows have harness children: child faults are planned.
    children: bool,
}

impl Plan {
    /// A plan from `seed`; SIGSTOPs last up to twice `stale_ms`.
    pub fn new(seed: u64, stale_ms: u64) -> Self {
        Self {
            rng: Rng::new(seed),
            stale_ms,
            etcd_ttl_ms: None,
            etcd_members: 1,
            children: false,
        }
    }

    /// Runs with harness children: also kill and stop children (about one
    /// fault in 12).
    pub fn with_children(mut self) -> Self {
        self.children = true;
        self
    }

    /// Cross-host runs: also pause etcd (about one fault in 25), for half
    /// a TTL to three TTLs.
    pub fn with_etcd_pauses(mut self, ttl_ms: u64) -> Self {
        self.etcd_ttl_ms = Some(ttl_ms);
        self
    }

    /// Cross-host runs on `members` etcd members: also restart one (about
    /// one fault in 50) and, with several, cut one from the others for one
    /// to four TTLs (as often).
    pub fn with_etcd_members(mut self, members: usize) -> Self {
        self.etcd_members = members.max(1);
        self
    }

    /// The pause before the next fault, around `pace_ms`.
    pub fn pause_ms(&mut self, pace_ms: u64) -> u64 {
        pace_ms / 2 + self.rng.below(pace_ms)
    }

    /// The next fault, if any.
    pub fn next(&mut self, view: &View) -> Option<Fault> {
        let roll = self.rng.below(100);
        let enough = view.running.len() > 2;
        let restart_ms = 100 + self.rng.below(400);
        match roll {
            0..=39 => Some(Fault::Mention),
            40..=54 if enough => {
                let orphan_ms = self.rng.below(2 * self.stale_ms);
                let orphan_graceful = self.rng.below(2) == 0;
                self.pick(view).map(|slot| Fault::Kill {
                    slot,
                    restart_ms,
                    orphan_ms,
                    orphan_graceful,
                })
            }
            55..=64 if enough => self.pick(view).map(|slot| Fault::Term { slot, restart_ms }),
            65..=76 if enough => {
                let hold_ms = 100 + self.rng.below(2 * self.stale_ms);
                let with_child = self.rng.below(2) == 0;
                self.pick(view).map(|slot| Fault::Stop {
                    slot,
                    hold_ms,
                    with_child,
                })
            }
            77..=91 => {
                let i = self.rng.below(view.running.len() as u64) as usize;
                view.running.get(i).map(|&slot| Fault::Claim { slot })
            }
            92..=95 if self.etcd_ttl_ms.is_some() => self.etcd_ttl_ms.map(|ttl| Fault::EtcdPause {
                hold_ms: ttl / 2 + self.rng.below(ttl * 5 / 2),
            }),
            92..=95 if self.children => self
                .pick(view)
                .map(|slot| Fault::ChildKill { slot, restart_ms }),
            96..=99 if self.children => self
                .pick(view)
                .map(|slot| Fault::ChildTerm { slot, restart_ms }),
            96..=97 if self.etcd_ttl_ms.is_some() => Some(Fault::EtcdRestart {
                member: self.rng.below(self.etcd_members as u64) as usize,
            }),
            98..=99 if self.etcd_members > 1 => self.etcd_ttl_ms.map(|ttl| Fault::EtcdPartition {
                member: self.rng.below(self.etcd_members as u64) as usize,
                hold_ms: ttl + self.rng.below(3 * ttl),
            }),
            _ => None,
        }
    }

    /// A running slot, the leader half the time.
    fn pick(&mut self, view: &View) -> Option<usize> {
        if view.running.is_empty() {
            return None;
        }
        match view.leader {
            Some(l) if view.running.contains(&l) && self.rng.below(2) == 0 => Some(l),
            _ => Some(view.running[self.rng.below(view.running.len() as u64) as usize]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_faults_and_no_signals_with_two_running() {
        let view = View {
            running: vec![0, 1, 2],
            leader: Some(1),
        };
        let run = |seed| {
            let mut p = Plan::new(seed, 1000);
            (0..200).map(|_| p.next(&view)).collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert!(run(7).iter().any(|f| matches!(f, Some(Fault::Kill { .. }))));
        let two = View {
            running: vec![0, 1],
            leader: Some(0),
        };
        let mut p = Plan::new(3, 1000);
        for _ in 0..500 {
            assert!(matches!(
                p.next(&two),
                None | Some(Fault::Mention) | Some(Fault::Claim { .. })
            ));
        }
    }

    #[test]
    fn child_faults_only_in_runs_with_children() {
        let view = View {
            running: vec![0, 1, 2],
            leader: Some(0),
        };
        let is_child = |f: &Option<Fault>| {
            matches!(f, Some(Fault::ChildKill { .. } | Fault::ChildTerm { .. }))
        };
        let mut without = Plan::new(5, 1000);
        assert!((0..2000).all(|_| !is_child(&without.next(&view))));
        let mut with = Plan::new(5, 1000).with_children();
        let faults: Vec<_> = (0..2000).map(|_| with.next(&view)).collect();
        assert!(faults
            .iter()
            .any(|f| matches!(f, Some(Fault::ChildKill { .. }))));
        assert!(faults
            .iter()
            .any(|f| matches!(f, Some(Fault::ChildTerm { .. }))));
    }

    #[test]
    fn etcd_pauses_only_in_cross_host_runs_and_within_their_bounds() {
        let view = View {
            running: vec![0, 1, 2],
            leader: Some(0),
        };
        let mut single = Plan::new(9, 1000);
        assert!((0..2000).all(|_| !matches!(single.next(&view), Some(Fault::EtcdPause { .. }))));
        let mut hosts = Plan::new(9, 1000).with_etcd_pauses(2000);
        let holds: Vec<u64> = (0..2000)
            .filter_map(|_| match hosts.next(&view) {
                Some(Fault::EtcdPause { hold_ms }) => Some(hold_ms),
                _ => None,
            })
            .collect();
        assert!(!holds.is_empty());
        assert!(holds.iter().all(|h| (1000..6000).contains(h)), "{holds:?}");
    }

    #[test]
    fn member_restarts_in_cross_host_runs_and_partitions_only_on_a_cluster() {
        let view = View {
            running: vec![0, 1, 2],
            leader: Some(0),
        };
        let draw =
            |mut p: Plan| -> Vec<Fault> { (0..3000).filter_map(|_| p.next(&view)).collect() };
        let restart = |f: &Fault| matches!(f, Fault::EtcdRestart { .. });
        let cut = |f: &Fault| matches!(f, Fault::EtcdPartition { .. });
        let single = draw(Plan::new(3, 1000));
        assert!(!single.iter().any(|f| restart(f) || cut(f)));
        let one = draw(Plan::new(3, 1000).with_etcd_pauses(2000));
        assert!(one.iter().any(restart) && !one.iter().any(cut));
        let three = draw(
            Plan::new(3, 1000)
                .with_etcd_pauses(2000)
                .with_etcd_members(3),
        );
        assert!(three.iter().any(restart));
        for f in &three {
            match f {
                Fault::EtcdRestart { member } => assert!(*member < 3),
                Fault::EtcdPartition { member, hold_ms } => {
                    assert!(*member < 3 && (2000..8000).contains(hold_ms), "{f:?}");
                }
                _ => {}
            }
        }
        assert!(three.iter().any(cut));
    }
}
