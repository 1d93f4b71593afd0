//! The checks after every step (see [`crate::sim::check`]), and at the end.

use super::*;

impl Sim {
    pub(super) fn check(&mut self) {
        if self.violation.is_some() {
            return;
        }
        self.check_claims();
        let mut acting = Vec::new();
        let mut able = false;
        // The earliest an able window can have known the record it would
        // judge: a window that starts or resumes from a stop (the pause
        // rule restarts its hang timers) learns it only then.
        let mut known_since = u64::MAX;
        for w in 0..self.windows.len() {
            let win = &self.windows[w];
            if win.writer.is_none() {
                // Gone: neither able nor acting.
                continue;
            }
            let (running, id, since) = {
                let s = lock(&self.m);
                let p = &s.procs[win.proc];
                (
                    p.running(s.t) && !p.left.contains(&self.pk),
                    p.instance_id.clone(),
                    p.started.max(p.stopped_until),
                )
            };
            if running && win.writer.is_some() {
                able = true;
                known_since = known_since.min(since);
            }
            if self.acting_window(w) {
                // A window that leads by the NIP's fail-safe (its last
                // look found no record: a torn or emptied file) is the
                // NIP's accepted transient, not a holder.
                let holds = self.windows[w]
                    .shared
                    .snapshot
                    .get(&self.pk)
                    .is_some_and(|c| {
                        c.status(std::time::SystemTime::now())
                            .holder
                            .is_some_and(|h| h.is_us)
                    });
                let extended = self.windows[w].extended && holds;
                acting.push(Actor { id, extended });
            }
        }
        let s = lock(&self.m);
        for h in &self.harnesses {
            let p = &s.procs[h.proc];
            if p.running(s.t) && h.leader {
                acting.push(Actor {
                    id: p.instance_id.clone(),
                    extended: false,
                });
            }
        }
        let file = s
            .files
            .get(&self.pk)
            .map_or(crate::record::LockContent::Absent, |f| f.content());
        let t = s.t;
        let state_violation = s.violations.first().cloned();
        drop(s);
        if let Some(v) = state_violation {
            self.violation = Some(v);
            return;
        }
        if self.panics > 0 {
            self.violation = Some(Violation::new(
                t,
                Invariant::Panic,
                "a writer panicked".into(),
            ));
            return;
        }
        let bound = self.silence_bound(t);
        self.violation = self.checker.step(
            t,
            &self.pk,
            &file,
            &acting,
            // Across hosts a host that does not hold etcd's key is silent
            // by design: the driver checks silence for the agent.
            able && self.host.is_none(),
            self.quiet_from.max(known_since),
            bound,
        );
    }

    /// A claim is honoured when its claimant holds the lock and acts within
    /// the stand-down
    /// (no invariant: under the plain NIP a bystander may win the released
    /// lock; the rate is what the budget checks).
    fn check_claims(&mut self) {
        if self.claims_open.is_empty() {
            return;
        }
        let t = self.now();
        let stand_down = self.opts.stand_down.as_nanos() as u64;
        let open = std::mem::take(&mut self.claims_open);
        let holder = lock(&self.m)
            .files
            .get(&self.pk)
            .and_then(|f| f.content().record().map(|r| r.instance_id.clone()));
        for (w, at) in open {
            let id = lock(&self.m).procs[self.windows[w].proc]
                .instance_id
                .clone();
            if self.acting_window(w) && holder.as_deref() == Some(id.as_str()) {
                self.claims.1 += 1;
            } else if t <= at + stand_down {
                self.claims_open.push((w, at));
            }
        }
    }

    pub(super) fn silence_bound(&self, t: u64) -> u64 {
        let o = &self.opts;
        let ns = |d: Duration| d.as_nanos() as u64;
        let mixed = o.spec > 0 || o.harnesses > 0;
        let mut b = if mixed {
            ns(o.stale + o.stand_down + 2 * o.refresh) + 1000 * MS
        } else {
            ns(o.stale + 2 * o.lock_wait) + 300 * MS
        };
        if t < self.last_claim + ns(o.stand_down + o.stale) {
            b += ns(o.stand_down);
        }
        let since = t.saturating_sub(b);
        let late = |f: fn(&(u64, u64, u64)) -> bool| {
            let recent = self.starved.values().filter(|s| s.0 > since);
            recent.filter(|s| f(s)).map(|s| s.2).max()
        };
        // Wake-ups late by a random amount: a few rounds' worth.
        if let Some(l) = late(|s| s.1 < s.2) {
            b += 4 * l;
        }
        // Every wake-up that late (past the pause rule's slack): the hang
        // timer starts when a late round first sees the holder's last
        // record and again, once, at the next late round (each a refresh
        // and a lateness away at most), and the deadline's own wake-up
        // comes late too: a hung holder is replaced within the stale
        // bound, two refreshes and three rounds' lateness.
        if let Some(l) = late(|s| s.1 == s.2) {
            b += 2 * ns(o.refresh) + 3 * l;
        }
        b
    }

    pub(super) fn check_all_answered(&mut self) {
        let any = self
            .windows
            .iter()
            .any(|w| w.writer.is_some() && w.extended);
        if !any || !self.opts.exactly_once() {
            return;
        }
        let t = self.now();
        let replaced = lock(&self.m).unkept_replaced.clone();
        for &(n, at) in &self.published {
            // Answered after such a writer was replaced, though published
            // before: it may have answered it (see
            // `Outcome::answered_after_ledgerless`).
            let first = (self.answers.get(&n)).and_then(|a| a.iter().map(|a| a.1).min());
            if first.is_some_and(|f| replaced.iter().any(|&r| at < r && r <= f)) {
                self.answered_after_ledgerless += 1;
            }
            // A harness child's record that no `held` line names reads as
            // a writer's without a ledger, who may have answered what was
            // published before (see `State::unkept_replaced`). Counted,
            // not failed.
            if !self.answers.contains_key(&n) && replaced.iter().any(|&r| at < r) {
                self.skipped_after_ledgerless += 1;
                continue;
            }
            if !self.answers.contains_key(&n) && self.cap_dropped.contains(&n) {
                self.dropped_by_cap += 1;
                continue;
            }
            if !self.answers.contains_key(&n) {
                self.violation = Some(Violation::new(
                    t,
                    Invariant::NeverAnswered,
                    format!("mention {n} published at {} ms", at / MS),
                ));
                return;
            }
        }
    }
}
