//! What each window's app does: read its change events, take owed
//! mentions, end its turns (sending the reply only while it may act).

use super::*;

impl Sim {
    /// The app of window `w` reads its change events and looks for work.
    pub(super) fn react(&mut self, w: usize) {
        loop {
            let change = match self.windows[w].rx.try_recv() {
                Ok(c) => c,
                Err(broadcast::error::TryRecvError::Lagged(_)) => continue,
                Err(_) => break,
            };
            self.note(w, || {
                format!(
                    "{} leader={} cancel={} epoch={:?}",
                    change.reason.as_str(),
                    change.is_leader,
                    change.must_cancel_turn,
                    change.epoch
                )
            });
            self.windows[w].app.gate = change.is_leader;
            if change.must_cancel_turn {
                if let Some(turn) = self.windows[w].app.turn.take() {
                    self.record(w, WorkOp::GiveBack(turn.id));
                }
            }
        }
        if !self.windows[w].app.idle_with_work() {
            return;
        }
        let queue = Arc::clone(&self.windows[w].app.queue);
        let pk = self.pk;
        let owed = self
            .call(w, |r| {
                Command::Work(pk, WorkOp::Owed(Arc::clone(&queue)), WorkReply::Owed(r))
            })
            .unwrap_or_default();
        if owed.is_empty() {
            self.poll_later(w);
        }
        for id in owed {
            // With a small ledger budget, the app says when the event was
            // published (as `LeaderGate` does), so rewrites mark it settled.
            let published = (self.opts.ledger_budget.is_some())
                .then(|| queue.iter().find(|e| e.id == id)?.published_ms)
                .flatten();
            let took = self.call(w, |r| {
                Command::Work(pk, WorkOp::Take(id.clone(), published), WorkReply::Take(r))
            });
            self.note(w, || format!("take {id}: {took:?}"));
            match took {
                Some(TakeOutcome::Granted { .. }) => {
                    // Judged per grant: the answer this turn sends.
                    let proc = self.windows[w].proc;
                    let grant = (proc, id.clone());
                    let by = lock(&self.m).procs[proc].instance_id.clone();
                    if self.granted_unrecorded(&id, &by) || self.disk_forced(&id) {
                        self.forced_takes.insert(grant);
                    } else {
                        self.forced_takes.remove(&grant);
                    }
                    if self.reply_waits_frozen(&id, proc) {
                        self.frozen_regrants.insert(id.clone());
                    }
                    let t = self.now();
                    let n = u64::from_str_radix(&id, 16).unwrap_or(u64::MAX);
                    self.took_at.insert((by, n), t);
                    // Agent turns vary: a quarter to twice the mean.
                    let mean = self.opts.turn_ms;
                    let ends = t + self.rng.range(mean / 4, mean * 2) * MS;
                    let serial = self.windows[w].app.start(id, ends);
                    let proc = self.windows[w].proc;
                    self.push(ends, Ev::TurnEnd(proc, serial));
                    return;
                }
                Some(TakeOutcome::Done) => self.windows[w].app.drop_mention(&id),
                // The disk refuses the take, or the ledger is at its
                // bound: kept, and asked again.
                Some(
                    TakeOutcome::Unavailable | TakeOutcome::LedgerFull | TakeOutcome::TooManyOpen,
                ) => return self.poll_later(w),
                _ => return,
            }
        }
    }

    /// The app asks the ledger again in a second (an event in flight
    /// elsewhere may be given back, a full disk may take writes again).
    fn poll_later(&mut self, w: usize) {
        if !self.windows[w].app.poll_pending {
            self.windows[w].app.poll_pending = true;
            let (proc, at) = (self.windows[w].proc, self.now() + 1000 * MS);
            self.push(at, Ev::Poll(proc));
        }
    }

    pub(super) fn acting_window(&self, w: usize) -> bool {
        let s = lock(&self.m);
        let win = &self.windows[w];
        win.writer.is_some()
            && s.procs[win.proc].running(s.t)
            && win
                .shared
                .snapshot
                .get(&self.pk)
                .is_some_and(|c| c.is_leader_on(&s.clocks))
    }

    pub(super) fn turn_end(&mut self, proc: ProcId, serial: u64) {
        let Some(w) = self.window_of(proc) else {
            return;
        };
        let running = {
            let s = lock(&self.m);
            s.procs[proc].running(s.t)
        };
        let Some(turn) = self.windows[w]
            .app
            .turn
            .clone()
            .filter(|t| t.serial == serial)
        else {
            return;
        };
        if !running {
            // A stopped app finishes its turn when it runs again.
            let until = lock(&self.m).procs[proc].stopped_until;
            if lock(&self.m).procs[proc].alive {
                self.push(until, Ev::TurnEnd(proc, serial));
            }
            return;
        }
        self.windows[w].app.turn = None;
        if self.acting_window(w) {
            // The reply takes a while to reach the relay (hundreds of ms):
            // leadership may move meanwhile, and the reply is sent anyway.
            let at = self.now() + self.rng.range(20, 600) * MS;
            self.windows[w].app.sending.insert(turn.id.clone());
            self.push(at, Ev::Sent(proc, turn.id));
        } else {
            self.record(w, WorkOp::GiveBack(turn.id));
        }
        self.react(w);
    }

    /// A reply reaches the relay: answered, and recorded done whatever the
    /// window's leadership is by now. A window killed, quit or gone from
    /// the key meanwhile never sent it, nor one frozen past the stale
    /// bound (docs/work-ledger.md: what remains).
    pub(super) fn sent(&mut self, proc: ProcId, id: String) {
        let Some(w) = self.window_of(proc) else {
            return;
        };
        let (alive, running, joined, until) = {
            let s = lock(&self.m);
            let p = &s.procs[proc];
            (
                p.alive,
                p.running(s.t),
                !p.left.contains(&self.pk),
                p.stopped_until,
            )
        };
        if !alive || !joined || self.windows[w].writer.is_none() {
            return;
        }
        if !self.windows[w].app.sending.contains(&id) {
            return;
        }
        if !running {
            // Frozen past the stale bound: its relay connection is gone,
            // and a takeover owes what a hung holder took at once.
            // The app learns it when it runs again, and gives the mention
            // back.
            let wait = until.saturating_sub(self.now());
            if wait <= self.opts.stale.as_nanos() as u64 {
                let by = lock(&self.m).procs[proc].instance_id.clone();
                let n = u64::from_str_radix(&id, 16).unwrap_or(u64::MAX);
                *self.reply_frozen.entry((by, n)).or_default() += wait;
                self.push(until, Ev::Sent(proc, id));
            } else {
                self.windows[w].app.sending.remove(&id);
                self.push(until, Ev::SendFailed(proc, id));
            }
            return;
        }
        let t = self.now();
        let n = u64::from_str_radix(&id, 16).unwrap_or(u64::MAX);
        let by = lock(&self.m).procs[proc].instance_id.clone();
        let answers = self.answers.entry(n).or_default();
        answers.push((by.clone(), t));
        self.last_answer = t;
        // Across hosts the run's driver counts the answers of every host.
        if answers.len() == 2 && self.host.is_none() {
            let first = answers[0].clone();
            if self.forced_takes.contains(&(proc, id.clone())) {
                self.forced_by_disk += 1;
            } else if self.frozen_regrants.contains(&id) {
                self.frozen_reply += 1;
            } else {
                self.violation.get_or_insert(Violation::new(
                    t,
                    Invariant::AnsweredTwice,
                    format!(
                        "mention {n} by {} at {} ms and by {by}",
                        first.0,
                        first.1 / MS
                    ),
                ));
            }
        }
        self.windows[w].app.sending.remove(&id);
        self.windows[w].app.drop_mention(&id);
        if self.windows[w].extended {
            // Until its line is on disk (see `disk_forced`).
            lock(&self.m).procs[proc]
                .unwritten_done
                .entry(id.clone())
                .or_insert(t);
        }
        self.record(w, WorkOp::Done(id));
        self.react(w);
    }

    /// Whether a take of `id` granted now to `by` is forced by the disk:
    /// granted while it refuses writes (a fail-safe leader past the stale
    /// bound grants unrecorded), or after a grant of another window that
    /// was, while no `done` of it can be read: whoever leads beside it
    /// cannot know of it.
    fn granted_unrecorded(&mut self, id: &str, by: &str) -> bool {
        let now = crate::sim::world::write_fault(&lock(&self.m)).is_some();
        // Sorted by id: only this id's grants, not a day's worth of them.
        let before = (self
            .unrecorded_grants
            .range((id.to_owned(), String::new())..))
        .take_while(|(i, _)| i == id)
        .any(|(_, b)| b != by);
        if now {
            self.unrecorded_grants
                .insert((id.to_owned(), by.to_owned()));
        }
        if !(now || before) {
            return false;
        }
        // (Our own take line is in the file by now: only a `done` tells.)
        let s = lock(&self.m);
        let readable = s.faults.eio_until <= s.t;
        let done_line = format!(r#"{{"op":"done","id":"{id}""#);
        let seen_done = readable
            && (s.ledgers.get(&self.pk)).is_some_and(|l| {
                l.windows(done_line.len())
                    .any(|x| x == done_line.as_bytes())
            });
        !seen_done
    }

    /// Whether another window's reply to `id`, decided while it could act,
    /// waits on its way for that window to run again (see
    /// [`super::Outcome::frozen_reply`]).
    fn reply_waits_frozen(&self, id: &str, proc: ProcId) -> bool {
        let s = lock(&self.m);
        (self.windows.iter())
            .any(|x| x.proc != proc && x.app.sending.contains(id) && !s.procs[x.proc].running(s.t))
    }

    /// Whether a take of mention `id` granted now is forced by the disk
    /// to answer it again: a window answered it, its `done` is not on disk
    /// (the disk refused the line, or the ledger could not be read to
    /// check the take), and it had no round since the reply in which the
    /// disk took writes: it died, quit, froze or starved first (see
    /// [`super::Outcome::forced_by_disk`]). A window that had one and did
    /// not write its line is a finding.
    fn disk_forced(&self, id: &str) -> bool {
        let n = u64::from_str_radix(id, 16).unwrap_or(u64::MAX);
        let Some(answers) = self.answers.get(&n) else {
            return false;
        };
        let s = lock(&self.m);
        answers.iter().all(|(by, _)| {
            s.procs.iter().any(|p| {
                matches!(p.kind, Kind::Window { .. })
                    && p.instance_id == *by
                    && p.unwritten_done
                        .get(id)
                        .is_some_and(|&sent| p.writable_round_at < sent)
            })
        })
    }

    /// A reply that never reached the relay: its app gives the mention back
    /// (when it runs again, if it was stopped once more meanwhile).
    pub(super) fn send_failed(&mut self, proc: ProcId, id: String) {
        let Some(w) = self.window_of(proc) else {
            return;
        };
        let (alive, running, until) = {
            let s = lock(&self.m);
            let p = &s.procs[proc];
            (p.alive, p.running(s.t), p.stopped_until)
        };
        if !alive || self.windows[w].writer.is_none() {
            return;
        }
        if !running {
            self.push(until, Ev::SendFailed(proc, id));
            return;
        }
        self.record(w, WorkOp::GiveBack(id));
        self.react(w);
    }

    /// A `done` or a `giveBack` of window `w` (its answer is not needed).
    fn record(&mut self, w: usize, op: WorkOp) {
        let pk = self.pk;
        let what = format!("{op:?}");
        let answer = self.call(w, |r| Command::Work(pk, op, WorkReply::Flag(r)));
        self.note(w, || format!("{what}: {answer:?}"));
    }

    /// One line of `--trace` for window `w`: a change it read, a take, a
    /// done or a give-back.
    fn note(&self, w: usize, line: impl FnOnce() -> String) {
        if self.trace {
            let id = lock(&self.m).procs[self.windows[w].proc]
                .instance_id
                .clone();
            println!("{:>10.3} s  {id}: {}", self.now() as f64 / 1e9, line());
        }
    }
}
