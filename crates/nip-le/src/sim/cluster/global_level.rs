//! The global level in a run across hosts: each window's real
//! contender machine ([`crate::global::contender::Task`]) on its host's
//! clocks, calling the run's simulated etcd through its host's link, its
//! watch cursor fed from that etcd. The contender lives and dies with its
//! window's process: stopped with it, killed with it (its lease then
//! expires in etcd), shut down with it. Beside it runs its renewer
//! ([`crate::global::contender::renewer`]), which renews what the task is
//! late for while a slow link keeps the task busy (a host's contenders then
//! step only once the link is fast again).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::elector::global_level::GlobalLevel;
use crate::global::contender::renewer::{self, Renewer};
use crate::global::contender::watch::Cursor;
use crate::global::contender::{Clock, Inbox, Task};
use crate::global::{EtcdConfig, WhenUnreachable};

use super::super::etcd::SimEtcd;
use super::*;
use crate::global::seen::Seen;

/// A host's part in a run across hosts.
pub(crate) struct HostLink {
    /// Its index among the run's hosts.
    pub index: usize,
    /// Its host id (also the prefix of its windows' instance ids).
    pub name: String,
    pub etcd: Arc<SimEtcd>,
    pub ttl: Duration,
    pub policy: WhenUnreachable,
    /// The run's agent.
    pub pk: AgentPubkey,
    contenders: BTreeMap<ProcId, Contended>,
    /// Per process: its scheduled contender step (generation).
    due: BTreeMap<ProcId, (u64, u64)>,
    /// What the host's windows kept of etcd (the lock directory's
    /// `etcd-seen`, which outlives every window).
    seen: Seen,
    /// Each window runs a renewer beside its contender (the app's shell
    /// does; off only to show what it is for).
    pub renewer: bool,
    /// The host's link is slow until then: its contenders are busy with
    /// work records and take no step (their renewers still run).
    slow_until: u64,
}

impl HostLink {
    /// Host `index`, named `name`, on `etcd`.
    pub fn new(
        index: usize,
        name: String,
        etcd: Arc<SimEtcd>,
        ttl: Duration,
        policy: WhenUnreachable,
        pk: AgentPubkey,
    ) -> Self {
        Self {
            index,
            name,
            etcd,
            ttl,
            policy,
            pk,
            contenders: BTreeMap::new(),
            due: BTreeMap::new(),
            seen: Seen::default(),
            renewer: true,
            slow_until: 0,
        }
    }
}

struct Contended {
    task: Task,
    cursor: Cursor,
    slot: Arc<Mutex<Slot>>,
    /// The renewer beside the task, and what it needs to know.
    renewer: Renewer,
    cfg: EtcdConfig,
    id: String,
}

/// What the window's writer said to its global level, for the next step.
#[derive(Default)]
struct Slot {
    inbox: VecDeque<Inbox>,
    shutdown: bool,
}

fn slot(s: &Mutex<Slot>) -> std::sync::MutexGuard<'_, Slot> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

/// The writer's handle.
struct SimGlobal {
    host_id: String,
    slot: Arc<Mutex<Slot>>,
}

impl GlobalLevel for SimGlobal {
    fn host_id(&self) -> &str {
        &self.host_id
    }
    fn host_leader(
        &mut self,
        pk: AgentPubkey,
        leads: bool,
        locked: bool,
        revoke: bool,
        tenure: u64,
    ) {
        slot(&self.slot).inbox.push_back(Inbox::Lead {
            pk,
            leads,
            locked,
            revoke,
            tenure,
        });
    }
    fn claim(&mut self, pk: AgentPubkey) {
        slot(&self.slot).inbox.push_back(Inbox::Claim(pk));
    }
    fn withdrawn(&mut self, pk: AgentPubkey) {
        slot(&self.slot).inbox.push_back(Inbox::Withdrawn(pk));
    }
    fn took(&mut self, pk: AgentPubkey, id: &str) {
        let id = id.to_owned();
        slot(&self.slot).inbox.push_back(Inbox::Took { pk, id });
    }
    fn settled(&mut self, pk: AgentPubkey, id: &str, done: bool) {
        let id = id.to_owned();
        slot(&self.slot)
            .inbox
            .push_back(Inbox::Settled { pk, id, done });
    }
    fn shutdown(&mut self) {
        slot(&self.slot).shutdown = true;
    }
}

/// A host's clocks, as the contender reads them.
struct HostClock(Machine);

impl Clock for HostClock {
    fn now(&self) -> Instant {
        let s = lock(&self.0);
        s.instant(s.mono())
    }
    fn boot_nanos(&self) -> u64 {
        use crate::elector::cache::Clocks;
        lock(&self.0).clocks.boot_nanos()
    }
    fn unix_ms(&self) -> u64 {
        crate::elector::writer_unix_ms(lock(&self.0).wall())
    }
}

impl Sim {
    /// The global level of a new window `proc` named `id`, if the run spans
    /// hosts.
    pub(super) fn global_level_for(
        &mut self,
        proc: ProcId,
        id: &str,
    ) -> Option<Box<dyn GlobalLevel>> {
        let h = self.host.as_mut()?;
        let mut cfg = EtcdConfig::new(vec!["http://sim:0".into()], h.name.clone());
        cfg.ttl = h.ttl;
        cfg.when_unreachable = h.policy;
        let m = Arc::clone(&self.m);
        let tell = Box::new(move |pk, news| {
            let mut s = lock(&m);
            let t = s.t;
            s.procs[proc].inbox.push(Command::Global(pk, news));
            s.wakeups.push((proc, t));
        });
        let mut task = Task::new(
            cfg.clone(),
            id,
            self.opts.stand_down,
            h.etcd.client(h.index),
            tell,
            Box::new(HostClock(Arc::clone(&self.m))),
        );
        task.remember(h.seen);
        let slot = Arc::new(Mutex::new(Slot::default()));
        h.contenders.insert(
            proc,
            Contended {
                task,
                cursor: Cursor::default(),
                slot: Arc::clone(&slot),
                renewer: Renewer::default(),
                cfg,
                id: id.to_owned(),
            },
        );
        let global_level = SimGlobal {
            host_id: h.name.clone(),
            slot,
        };
        let every = h.renewer.then(|| renewer::tick(h.ttl).as_nanos() as u64);
        if let Some(every) = every {
            let at = self.now() + every;
            self.push(at, Ev::Renewer(proc));
        }
        Some(Box::new(global_level))
    }

    /// The host's link is slow until `until`: its contenders are busy.
    pub(crate) fn slow_link(&mut self, until: u64) {
        if let Some(h) = self.host.as_mut() {
            h.slow_until = h.slow_until.max(until);
        }
    }

    /// `proc`'s renewer looks at what its contender holds, renews what
    /// the contender is late for, and tells the writer; it runs while its
    /// process runs, and ends with its contender.
    pub(super) fn renewer_due(&mut self, proc: ProcId) {
        let t = self.now();
        let (alive, running, until) = {
            let s = lock(&self.m);
            let p = &s.procs[proc];
            (p.alive, p.running(s.t), p.stopped_until)
        };
        let clock = HostClock(Arc::clone(&self.m));
        let (now, boot) = (clock.now(), || clock.boot_nanos());
        let Some(h) = self.host.as_mut() else {
            return;
        };
        let every = renewer::tick(h.ttl).as_nanos() as u64;
        let (index, etcd) = (h.index, Arc::clone(&h.etcd));
        let Some(c) = h.contenders.get_mut(&proc).filter(|_| alive) else {
            return;
        };
        if !running {
            self.push(until.max(t + every), Ev::Renewer(proc));
            return;
        }
        let listed = c.task.listed();
        let client = etcd.client(index);
        let told = (c.renewer).look(&listed, now, &boot, &*client, (&c.cfg, &c.id));
        if !told.is_empty() {
            let mut s = lock(&self.m);
            for (pk, r) in told {
                s.procs[proc].inbox.push(Command::Renewed(pk, r));
            }
            s.wakeups.push((proc, t));
        }
        self.push(t + every, Ev::Renewer(proc));
    }

    /// After a round of `proc`'s writer: its contender runs at once if the
    /// writer told it something (`stopped`: the writer shut down, and its
    /// contender with it, before the process exits).
    pub(super) fn after_round(&mut self, proc: ProcId, stopped: bool) {
        let Some(h) = self.host.as_mut() else {
            return;
        };
        let Some(c) = h.contenders.get(&proc) else {
            return;
        };
        let (told, shutdown) = {
            let s = slot(&c.slot);
            (!s.inbox.is_empty(), s.shutdown)
        };
        if stopped || shutdown {
            self.contender_step(proc);
            let h = self.host.as_mut().expect("checked");
            if let Some(mut c) = h.contenders.remove(&proc) {
                c.task.give_up_all();
            }
            return;
        }
        if told {
            let t = self.now();
            self.schedule_contender(proc, t);
        }
    }

    /// `proc`'s contender dies with its process (a kill): its lease is
    /// left to expire.
    pub(super) fn contender_killed(&mut self, proc: ProcId) {
        if let Some(h) = self.host.as_mut() {
            h.contenders.remove(&proc);
            h.due.remove(&proc);
        }
    }

    pub(super) fn schedule_contender(&mut self, proc: ProcId, at: u64) {
        let t = self.now();
        let at = at.max(t);
        let Some(h) = self.host.as_mut() else {
            return;
        };
        if h.due.get(&proc).is_some_and(|&(cur, _)| cur <= at) {
            return;
        }
        self.gens += 1;
        let gen = self.gens;
        let h = self.host.as_mut().expect("checked");
        h.due.insert(proc, (at, gen));
        self.push(at, Ev::Contender(proc, gen));
    }

    /// A scheduled contender step, if it is still the latest one.
    pub(super) fn contender_due(&mut self, proc: ProcId, gen: u64) {
        let Some(h) = self.host.as_mut() else {
            return;
        };
        if h.due.get(&proc).map(|d| d.1) != Some(gen) {
            return;
        }
        h.due.remove(&proc);
        let (alive, running, until) = {
            let s = lock(&self.m);
            let p = &s.procs[proc];
            (p.alive, p.running(s.t), p.stopped_until)
        };
        let slow = self.host.as_ref().map_or(0, |h| h.slow_until);
        if !alive {
            self.contender_killed(proc);
        } else if !running {
            self.schedule_contender(proc, until);
        } else if slow > lock(&self.m).t {
            self.schedule_contender(proc, slow);
        } else {
            self.contender_step(proc);
        }
    }

    /// One step of `proc`'s contender: what its writer said and what its
    /// watch saw (in an order the seed draws), then whatever is due.
    fn contender_step(&mut self, proc: ProcId) {
        let watch_first = self.rng.chance(0.5);
        let Some(h) = self.host.as_mut() else {
            return;
        };
        let (index, etcd) = (h.index, Arc::clone(&h.etcd));
        let Some(c) = h.contenders.get_mut(&proc) else {
            return;
        };
        let told: Vec<Inbox> = slot(&c.slot).inbox.drain(..).collect();
        let mut seen = Vec::new();
        for _ in 0..2 {
            match etcd.watch_message(index, "/nip-le/", c.cursor.start()) {
                Some(m) => seen.extend(c.cursor.message(m)),
                None => break,
            }
        }
        let inputs: Vec<Inbox> = if watch_first {
            seen.into_iter().chain(told).collect()
        } else {
            told.into_iter().chain(seen).collect()
        };
        if self.trace && !inputs.is_empty() {
            let (id, t) = {
                let s = lock(&self.m);
                (s.procs[proc].instance_id.clone(), s.t)
            };
            for i in &inputs {
                println!("{:>10.3} s  {id}: contender input {i:?}", t as f64 / 1e9);
            }
        }
        // A panic in the contender (content no check foresaw) is a
        // violation; the task is dropped with it, as its thread would be.
        super::IN_WRITER.with(|s| s.set(true));
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            c.task.step_all(inputs);
            if let Some(kept) = c.task.seen_to_keep() {
                h.seen = h.seen.merge(kept);
            }
            (c.task.next_due(), c.task.phase_violation())
        }));
        super::IN_WRITER.with(|s| s.set(false));
        let Ok((next, phase)) = run else {
            h.contenders.remove(&proc);
            let t = self.now();
            let id = lock(&self.m).procs[proc].instance_id.clone();
            self.violation.get_or_insert(Violation::new(
                t,
                Invariant::Panic,
                format!("{id}'s etcd contender panicked"),
            ));
            return;
        };
        if let Some(what) = phase {
            let t = self.now();
            let id = lock(&self.m).procs[proc].instance_id.clone();
            self.violation.get_or_insert(Violation::new(
                t,
                Invariant::ContenderPhase,
                format!("{id}'s etcd contender: {what}"),
            ));
        }
        let at = lock(&self.m).t_of(next);
        self.schedule_contender(proc, at);
    }

    /// Etcd changed at `t`: every contender's watch brings it within a
    /// delay the seed draws.
    pub(crate) fn etcd_changed(&mut self, t: u64) {
        let Some(h) = self.host.as_ref() else {
            return;
        };
        let procs: Vec<ProcId> = h.contenders.keys().copied().collect();
        for p in procs {
            let d = self.rng.range(0, 50) * MS;
            self.schedule_contender(p, t + d);
        }
    }

    /// Every watch of this host loses its place (a compaction, a
    /// cancelled stream): the contenders look at every key again.
    pub(crate) fn watches_reset(&mut self) {
        if let Some(h) = self.host.as_mut() {
            for c in h.contenders.values_mut() {
                c.cursor.lost();
            }
        }
        let t = self.now();
        self.etcd_changed(t);
    }
}
