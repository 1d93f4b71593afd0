//! The faults of the plan, carried out: kills, quits, stops, pauses,
//! suspends, wall steps, starvation, file faults, hung `flock` holders, pid
//! reuse, leaves, claims and relay frames.

use super::*;

impl Sim {
    /// Carries out one fault of the plan.
    pub(super) fn fault(&mut self, f: Fault) {
        let t = self.now();
        let live: Vec<usize> = (0..self.windows.len())
            .filter(|&w| self.windows[w].writer.is_some())
            .collect();
        // Half of the faults aim at a window that acts (the leader, or one
        // that believes it leads): that is where the rules are tested.
        let acting: Vec<usize> = live
            .iter()
            .copied()
            .filter(|&w| self.acting_window(w))
            .collect();
        let pick = |sim: &mut Self| {
            let pool = if !acting.is_empty() && sim.rng.chance(0.5) {
                &acting
            } else {
                &live
            };
            sim.rng.pick(pool.len()).map(|i| pool[i])
        };
        match f {
            Fault::Kill { restart_after } => {
                if let Some(w) = pick(self) {
                    self.kill(w);
                    self.restart(w, t + restart_after);
                }
            }
            Fault::KillActing { restart_after } => {
                if let Some(&w) = acting.first() {
                    self.kill(w);
                    self.restart(w, t + restart_after);
                }
            }
            Fault::StopLeaderPastStale => {
                // Prefer the acting window with a turn in flight.
                let w = acting
                    .iter()
                    .copied()
                    .find(|&w| self.windows[w].app.turn.is_some())
                    .or_else(|| acting.first().copied());
                if let Some(w) = w {
                    let stale = self.opts.stale.as_nanos() as u64;
                    let turn = self.opts.turn_ms * MS;
                    let kill_at = t + stale + 2 * turn;
                    let d = kill_at - t + self.rng.range(MS, turn);
                    stop_until(&mut lock(&self.m).procs[self.windows[w].proc], t + d);
                    let restart_after = self.rng.range(0, 2 * stale);
                    self.push(kill_at, Ev::Fault(Fault::KillActing { restart_after }));
                }
            }
            Fault::Quit { restart_after } => {
                if let Some(w) = pick(self) {
                    self.end_child(w, true);
                    let _ = self.call(w, Command::Shutdown);
                    self.windows[w].writer = None;
                    lock(&self.m).procs[self.windows[w].proc].alive = false;
                    self.restart(w, t + restart_after);
                }
            }
            Fault::Stop { d } => {
                if let Some(w) = pick(self) {
                    // No excuse: a stopped holder is replaced within the
                    // stale bound by any window that kept running (one that
                    // resumes learns the record only then: the checks).
                    stop_until(&mut lock(&self.m).procs[self.windows[w].proc], t + d);
                    // A stop can land inside the few microseconds the
                    // window holds the lock file's `flock`: everyone's
                    // locked looks then time out until it resumes.
                    if self.opts.mix.holds && self.rng.chance(0.25) {
                        self.hold_flock(t + d);
                    }
                }
            }
            Fault::PauseAll { d } | Fault::Suspend { d } => {
                let mut s = lock(&self.m);
                for p in s.procs.iter_mut() {
                    p.stopped_until = p.stopped_until.max(t + d);
                }
                drop(s);
                self.quiet_from = self.quiet_from.max(t + d);
                if matches!(f, Fault::Suspend { .. }) {
                    // Overlapping suspends freeze the clock once.
                    let from = self.suspended_until.max(t);
                    let until = self.suspended_until.max(t + d);
                    self.suspended_until = until;
                    self.push(until, Ev::Wake(until - from));
                }
            }
            Fault::WallStep { ns } => lock(&self.m).wall_offset += i128::from(ns),
            Fault::Starve { d, late } => {
                if let Some(w) = pick(self) {
                    self.starved.insert(self.windows[w].proc, (t + d, 0, late));
                    self.quiet_from = self.quiet_from.max(t + d);
                }
            }
            Fault::StarvedAroundAHungLeader { d, late } => {
                let holder = lock(&self.m)
                    .files
                    .get(&self.pk)
                    .and_then(|f| f.content().record().map(|r| r.instance_id.clone()));
                let named = |sim: &Self, w: usize| {
                    holder.as_deref()
                        == Some(lock(&sim.m).procs[sim.windows[w].proc].instance_id.as_str())
                };
                if let Some(&w) = acting.iter().find(|&&w| named(self, w)) {
                    // Hung with its children (a frozen cgroup): a child
                    // left running would keep the id's record fresh.
                    let child = self.windows[w].child.map(|h| self.harnesses[h].proc);
                    let mut s = lock(&self.m);
                    for p in std::iter::once(self.windows[w].proc).chain(child) {
                        stop_until(&mut s.procs[p], t + d);
                    }
                    drop(s);
                    for o in live.iter().copied().filter(|&o| o != w) {
                        self.starved
                            .insert(self.windows[o].proc, (t + d, late, late));
                    }
                }
            }
            Fault::Enospc { d } | Fault::Eio { d } | Fault::ReadOnly { d } => {
                let mut s = lock(&self.m);
                let until = match f {
                    Fault::Enospc { .. } => &mut s.faults.enospc_until,
                    Fault::Eio { .. } => &mut s.faults.eio_until,
                    _ => &mut s.faults.readonly_until,
                };
                *until = (*until).max(t + d);
                if matches!(f, Fault::Enospc { .. }) {
                    s.faults.enospc_room = true;
                }
                drop(s);
                self.quiet_from = self.quiet_from.max(t + d);
            }
            Fault::PowerLoss { restart_after } => self.power_loss(t + restart_after),
            Fault::HoldFlock { d } => self.hold_flock(t + d),
            Fault::PidReuse => {
                let mut s = lock(&self.m);
                let dead: Vec<u32> = s
                    .procs
                    .iter()
                    .filter(|p| !p.alive)
                    .map(|p| p.pid)
                    .filter(|pid| !s.pid_alive(*pid))
                    .collect();
                if let Some(i) = self.rng.pick(dead.len()) {
                    let pid = dead[i];
                    s.procs.push(crate::sim::state::Proc::new(
                        pid,
                        String::new(),
                        Kind::Squatter,
                    ));
                }
            }
            Fault::Claim => {
                if let Some(w) = pick(self) {
                    self.last_claim = t;
                    // A claim by the window that acts already proves
                    // nothing.
                    if !acting.contains(&w) {
                        self.claims.0 += 1;
                        self.claims_open.push((w, t));
                    }
                    let pk = self.pk;
                    let _ = self.call(w, |r| Command::Claim(pk, r));
                    self.broadcast_frame(w, 0.0, 0.0);
                }
            }
            Fault::ChildExit {
                graceful,
                restart_after,
            } => {
                let with_child: Vec<usize> = live
                    .iter()
                    .copied()
                    .filter(|&w| self.windows[w].child.is_some())
                    .collect();
                if let Some(i) = self.rng.pick(with_child.len()) {
                    let w = with_child[i];
                    self.end_child(w, graceful);
                    let proc = self.windows[w].proc;
                    self.push(t + restart_after, Ev::StartChild(proc));
                }
            }
            Fault::ClaimFrame { lose, dup } => {
                if let Some(w) = pick(self) {
                    self.last_claim = t;
                    self.broadcast_frame(w, lose, dup);
                }
            }
            Fault::Leave { rejoin_after } => {
                if let Some(w) = pick(self) {
                    let pk = self.pk;
                    if self.call(w, |r| Command::Leave(pk, r)).is_some() {
                        let proc = self.windows[w].proc;
                        lock(&self.m).procs[proc].left.insert(pk);
                        // Its turn and its replies on their way end with it.
                        self.windows[w].app.turn = None;
                        self.windows[w].app.sending.clear();
                        self.push(t + rejoin_after, Ev::Rejoin(proc));
                    }
                }
            }
        }
    }

    /// The machine loses power (see [`Fault::PowerLoss`]); everyone starts
    /// again at `at`.
    fn power_loss(&mut self, at: u64) {
        self.power_back = self.power_back.max(at);
        for w in 0..self.windows.len() {
            if self.windows[w].writer.is_some() {
                self.kill(w);
                self.restart(w, at);
            }
        }
        let peers: Vec<usize> = (0..self.harnesses.len())
            .filter(|&h| !self.windows.iter().any(|w| w.child == Some(h)))
            .collect();
        let mut restart = Vec::new();
        let mut s = lock(&self.m);
        for h in peers {
            let proc = self.harnesses[h].proc;
            if s.procs[proc].alive {
                s.procs[proc].alive = false;
                restart.push(format!("{}r", s.procs[proc].instance_id));
            }
        }
        let state = &mut *s;
        for (pk, bytes) in state.ledgers.iter_mut() {
            let synced = state
                .ledger_synced
                .get(pk)
                .copied()
                .unwrap_or(0)
                .min(bytes.len());
            let kept = synced + self.rng.range(0, (bytes.len() - synced) as u64) as usize;
            bytes.truncate(kept);
            state.ledger_synced.insert(*pk, kept);
        }
        for f in s.files.values_mut() {
            f.held_until = 0;
            f.pending = None;
            if self.rng.chance(0.5) {
                f.bytes.clear();
            }
        }
        drop(s);
        for id in restart {
            self.push(at, Ev::StartPeer(id));
        }
        self.quiet_from = self.quiet_from.max(at);
    }

    /// Someone holds the lock file's `flock` until `until`: every locked
    /// look times out meanwhile, and the agent may be silent for as long.
    fn hold_flock(&mut self, until: u64) {
        let pk = self.pk;
        let mut s = lock(&self.m);
        let f = s.files.entry(pk).or_default();
        f.held_until = f.held_until.max(until);
        drop(s);
        self.quiet_from = self.quiet_from.max(until);
    }

    /// The relay brings a `claim_leadership` frame for window `w` to every
    /// process, each copy late, lost or doubled by chance.
    pub(super) fn broadcast_frame(&mut self, w: usize, lose: f64, dup: f64) {
        let t = self.now();
        let target = lock(&self.m).procs[self.windows[w].proc]
            .instance_id
            .clone();
        let procs: Vec<ProcId> = self
            .windows
            .iter()
            .map(|w| w.proc)
            .chain(self.harnesses.iter().map(|h| h.proc))
            .collect();
        for p in procs {
            if self.rng.chance(lose) {
                continue;
            }
            let copies = if self.rng.chance(dup) { 2 } else { 1 };
            for _ in 0..copies {
                let d = self.rng.range(0, 500) * MS;
                self.push(t + d, Ev::Frame(p, target.clone()));
            }
        }
    }

    pub(super) fn rejoin(&mut self, proc: ProcId) {
        let Some(w) = self.window_of(proc) else {
            return;
        };
        if self.windows[w].writer.is_none() {
            return;
        }
        let t = self.now();
        self.quiet_from = self.quiet_from.max(t);
        lock(&self.m).procs[proc].left.remove(&self.pk);
        self.join_when_running(proc);
    }

    /// Window `w`'s child exits (gracefully: it truncates the record that
    /// names the id, as the harness does on exit).
    pub(super) fn end_child(&mut self, w: usize, graceful: bool) {
        let Some(h) = self.windows[w].child.take() else {
            return;
        };
        let mut s = lock(&self.m);
        let proc = self.harnesses[h].proc;
        if !s.procs[proc].alive {
            return;
        }
        if graceful && s.procs[proc].running(s.t) {
            self.harnesses[h].release(&mut s);
        }
        s.procs[proc].alive = false;
        self.harnesses[h].leader = false;
    }

    pub(super) fn kill(&mut self, w: usize) {
        // The desktop's children go with it (its process group).
        self.end_child(w, false);
        let proc = self.windows[w].proc;
        lock(&self.m).procs[proc].alive = false;
        // Dropped without a shutdown: the kernel releases its locks.
        self.windows[w].writer = None;
        self.windows[w].app.turn = None;
        self.rounds.remove(&proc);
        self.contender_killed(proc);
    }

    pub(super) fn restart(&mut self, w: usize, at: u64) {
        let id = format!("{}r", lock(&self.m).procs[self.windows[w].proc].instance_id);
        let extended = self.windows[w].extended;
        self.push(at, Ev::Start(id, extended));
    }
}

/// Stops `p` until `until` at least: a stop that ends sooner never wakes a
/// process that a machine suspend (or a pause of everyone) holds longer.
/// Setting it outright let a window stopped during a suspend run while the
/// machine slept, and act beside the holder that woke with it (a suspend
/// of the budget: two acting windows).
fn stop_until(p: &mut crate::sim::state::Proc, until: u64) {
    p.stopped_until = p.stopped_until.max(until);
}
