//! What the driver of a run across hosts asks of each host's run: its
//! next event, the relay's mentions and frames, who acts, and the bounds
//! its faults allow.

use super::*;
use crate::Level;

/// A window that acts for the agent now, as the driver sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Acting {
    /// The window (see [`Sim::window_id`]).
    pub window: usize,
    /// It holds etcd's key (not only its host, under the fall-back).
    pub global: bool,
}

impl Sim {
    /// The relay publishes mention `n` at `t`: it reaches every window of
    /// this host, each after its own delay.
    pub(crate) fn publish(&mut self, n: u64, t: u64) {
        self.published.push((n, t));
        let procs: Vec<(ProcId, bool)> = (self.windows.iter())
            .map(|w| (w.proc, w.writer.is_some()))
            .collect();
        for (p, alive) in procs {
            // Drawn for every window ever started, so that a seed replays
            // as it always did; delivered only to the living (a day's run
            // keeps thousands of dead windows).
            let d = self.rng.range(0, 300) * MS;
            if alive {
                self.push(t + d, Ev::Deliver(p, n));
            }
        }
    }

    /// When the next event happens, whether or not the run is over.
    pub(crate) fn next_event(&self) -> Option<u64> {
        if self.violation.is_some() {
            return None;
        }
        self.queue.first_key_value().map(|(&(at, _), _)| at)
    }

    /// Sets the machine's clocks to `t` (the driver keeps every host at
    /// the run's time).
    pub(crate) fn advance_to(&mut self, t: u64) {
        let mut s = lock(&self.m);
        if s.t < t {
            s.advance(t);
        }
    }

    /// A user of this host claims the agent: one of its running windows
    /// claims, and the relay's frame goes to this host's processes. The
    /// claimant's id, for the other hosts' frames.
    pub(crate) fn claim_here(&mut self) -> Option<String> {
        let live: Vec<usize> = (0..self.windows.len())
            .filter(|&w| self.windows[w].writer.is_some())
            .collect();
        let w = live[self.rng.pick(live.len())?];
        let t = self.now();
        self.last_claim = t;
        let pk = self.pk;
        self.call(w, |r| Command::Claim(pk, r))?;
        self.broadcast_frame(w, 0.0, 0.0);
        Some(
            lock(&self.m).procs[self.windows[w].proc]
                .instance_id
                .clone(),
        )
    }

    /// The relay brings another host's claim frame for `target`.
    pub(crate) fn frame_from_afar(&mut self, target: &str) {
        let t = self.now();
        self.last_claim = t;
        let procs: Vec<ProcId> = self.windows.iter().map(|w| w.proc).collect();
        for p in procs {
            let d = self.rng.range(0, 500) * MS;
            self.push(t + d, Ev::Frame(p, target.to_owned()));
        }
    }

    /// Hands each window that acts now to `f`.
    pub(crate) fn acting(&self, f: &mut dyn FnMut(Acting)) {
        let s = lock(&self.m);
        for (w, win) in self.windows.iter().enumerate() {
            if win.writer.is_none() || !s.procs[win.proc].running(s.t) {
                continue;
            }
            let Some(cell) = win.shared.snapshot.get(&self.pk) else {
                continue;
            };
            if cell.is_leader_on(&s.clocks) {
                f(Acting {
                    window: w,
                    global: cell.level_on(&s.clocks) == Level::Global,
                });
            }
        }
    }

    /// Window `w`'s instance id.
    pub(crate) fn window_id(&self, w: usize) -> String {
        lock(&self.m).procs[self.windows[w].proc]
            .instance_id
            .clone()
    }

    /// When this host's windows last sent an answer.
    pub(crate) fn last_answer(&self) -> u64 {
        self.last_answer
    }

    /// Whether any window could act: it runs and has joined.
    pub(crate) fn able(&self) -> bool {
        let s = lock(&self.m);
        self.windows.iter().any(|w| {
            let p = &s.procs[w.proc];
            w.writer.is_some() && p.running(s.t) && !p.left.contains(&self.pk)
        })
    }

    /// The end of the last fault of this host that may silence it.
    pub(crate) fn quiet_from(&self) -> u64 {
        self.quiet_from
    }

    /// The longest silence this host's faults allow at `t`.
    pub(crate) fn bound_at(&self, t: u64) -> u64 {
        self.silence_bound(t)
    }

    /// The answers this host's windows sent: mention → (window, when).
    pub(crate) fn answers(&self) -> &BTreeMap<u64, Vec<(String, u64)>> {
        &self.answers
    }

    /// When window `by` last took mention `n`.
    pub(crate) fn took_at(&self, by: &str, n: u64) -> Option<u64> {
        self.took_at.get(&(by.to_owned(), n)).copied()
    }

    /// How long window `by`'s reply to mention `n` waited on its way for
    /// the window to run again (frozen), ns.
    pub(crate) fn reply_frozen(&self, by: &str, n: u64) -> u64 {
        self.reply_frozen
            .get(&(by.to_owned(), n))
            .copied()
            .unwrap_or(0)
    }

    /// Whether window `by`'s grant of mention `n` was forced by the disk
    /// or granted while another window's reply to it waited frozen (see
    /// [`super::Outcome::forced_by_disk`], [`super::Outcome::frozen_reply`]).
    pub(crate) fn grant_excused(&self, by: &str, n: u64) -> bool {
        let id = mention_id(n);
        let s = lock(&self.m);
        let forced = (s.procs.iter().enumerate())
            .any(|(p, x)| x.instance_id == by && self.forced_takes.contains(&(p, id.clone())));
        forced || self.frozen_regrants.contains(&id)
    }

    /// The first broken invariant of this host, if any.
    pub(crate) fn host_violation(&self) -> Option<Violation> {
        self.violation
            .clone()
            .or_else(|| lock(&self.m).violations.first().cloned())
    }

    /// What this host's run found (its own checks; the driver's come
    /// beside).
    pub(crate) fn outcome(self) -> Outcome {
        self.finish()
    }
}
