//! Who runs on the machine: windows (each with its real writer, its app
//! and, across hosts, its contender), their agent harness children, and
//! harness peers.

use super::*;

impl Sim {
    pub(super) fn start_window(&mut self, id: String, extended: bool) {
        let proc = {
            let mut s = lock(&self.m);
            let pid = s.fresh_pid();
            let mut p = crate::sim::state::Proc::new(pid, id.clone(), Kind::Window { extended });
            // A suspended machine starts nothing until it wakes.
            p.stopped_until = self.suspended_until;
            p.started = s.t;
            s.procs.push(p);
            s.procs.len() - 1
        };
        let shared = Arc::new(Shared::new());
        let rx = shared.events.subscribe();
        let world = SimWorld::new(Arc::clone(&self.m), proc, self.rng.fork());
        let global_level = self.global_level_for(proc, &id);
        let writer = Writer::new(
            self.config(extended),
            Arc::from(id.as_str()),
            Arc::clone(&shared),
            Box::new(world),
            global_level,
        );
        // What the relay brings a client that connects: the recent events,
        // as many as its queue keeps.
        let mut app = App::default();
        let cap = self.opts.queue_cap;
        let from = if cap == 0 {
            0
        } else {
            self.published.len().saturating_sub(cap)
        };
        for &(n, at) in &self.published[from..] {
            app.receive(&mention_id(n), self.relay_ms(at), cap);
        }
        self.windows.push(Window {
            proc,
            writer: Some(writer),
            shared,
            rx,
            app,
            extended,
            child: None,
        });
        if extended && self.opts.mix.children {
            let t = self.now().max(self.suspended_until);
            self.push(t, Ev::StartChild(proc));
        }
        // A window that starts learns the holder's record only now: its
        // hang timer starts here.
        let t = self.now();
        self.quiet_from = self.quiet_from.max(t.max(self.suspended_until));
        self.join_when_running(proc);
    }

    /// The app of `proc` joins the key as soon as its process runs (the
    /// answer is not waited for: the change events say what it did).
    pub(super) fn join_when_running(&mut self, proc: ProcId) {
        let (tx, _rx) = std::sync::mpsc::sync_channel(1);
        let at = {
            let mut s = lock(&self.m);
            s.procs[proc].inbox.push(Command::Join(vec![self.pk], tx));
            s.t.max(s.procs[proc].stopped_until)
        };
        self.schedule(proc, at);
    }

    /// Window `proc` starts an agent harness child with its id (if the
    /// window still runs and has none).
    pub(super) fn start_child(&mut self, proc: ProcId) {
        let Some(w) = self.window_of(proc) else {
            return;
        };
        let alive = lock(&self.m).procs[proc].alive;
        let has = self.windows[w]
            .child
            .is_some_and(|h| lock(&self.m).procs[self.harnesses[h].proc].alive);
        if !alive || self.windows[w].writer.is_none() || has {
            return;
        }
        let id = lock(&self.m).procs[proc].instance_id.clone();
        self.start_harness(id);
        self.windows[w].child = Some(self.harnesses.len() - 1);
    }

    pub(super) fn start_harness(&mut self, id: String) {
        let proc = {
            let mut s = lock(&self.m);
            let pid = s.fresh_pid();
            s.procs
                .push(crate::sim::state::Proc::new(pid, id, Kind::Harness));
            s.procs.len() - 1
        };
        self.harnesses.push(Harness::new(proc, self.pk));
        let h = self.harnesses.len() - 1;
        let t = self.now();
        self.push(t, Ev::HarnessTick(h));
    }

    pub(super) fn harness_step(&mut self, h: usize, finish: bool) {
        let (refresh, half) = (
            Duration::from_secs(5).as_nanos() as u64,
            self.rng.range(10_000, 2 * MS),
        );
        let next = {
            let mut s = lock(&self.m);
            let proc = self.harnesses[h].proc;
            if !s.procs[proc].alive {
                return;
            }
            if !s.procs[proc].running(s.t) {
                let until = s.procs[proc].stopped_until;
                drop(s);
                let ev = if finish {
                    Ev::HarnessFinish(h)
                } else {
                    Ev::HarnessTick(h)
                };
                self.push(until, ev);
                return;
            }
            if finish {
                self.harnesses[h].finish(&mut s, refresh)
            } else {
                self.harnesses[h].tick(&mut s, half, refresh)
            }
        };
        match next {
            Next::Tick(at) | Next::Retry(at) => self.push(at, Ev::HarnessTick(h)),
            Next::Finish(at) => self.push(at, Ev::HarnessFinish(h)),
        }
    }
}
