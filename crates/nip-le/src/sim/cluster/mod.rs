//! The driver of one run: the real writers of several windows, harness
//! peers and their apps on one simulated machine, an event queue in
//! virtual time, the faults of the plan, and the checks after every step.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;

use crate::config::{Config, Mode};
use crate::elector::{Command, LeadershipChange, Shared, TakeOutcome, WorkOp, WorkReply, Writer};
use crate::pubkey::AgentPubkey;

use super::app::{mention_id, App};
use super::check::{Actor, Checker, Invariant, Violation};
use super::harness::{Harness, Next};
use super::plan::{Fault, Options, Plan};
use super::rng::Rng;
use super::state::{Kind, ProcId, State};
use super::world::{lock, write_fault, Machine, SimWorld};

mod across;
mod apps;
mod checks;
mod faults;
mod global_level;
mod outcome;
mod procs;

pub(crate) use global_level::HostLink;
pub use outcome::Outcome;

const MS: u64 = 1_000_000;

/// What happens at one instant.
#[derive(Debug, Clone)]
enum Ev {
    /// A window's writer runs a round (if this is still its latest one).
    Round(ProcId, u64),
    HarnessTick(usize),
    HarnessFinish(usize),
    Fault(Fault),
    /// Mention `n` is published.
    Publish(u64),
    /// The relay brings mention `n` to a window.
    Deliver(ProcId, u64),
    /// A window's turn ends (turn serial).
    TurnEnd(ProcId, u64),
    /// A window's reply to a mention reaches the relay.
    Sent(ProcId, String),
    /// A window's app asks for owed work again (its poll timer).
    Poll(ProcId),
    /// A window's app learns that its reply never reached the relay.
    SendFailed(ProcId, String),
    /// A relay `claim_leadership` frame reaches a process.
    Frame(ProcId, String),
    /// A suspended machine wakes: the monotonic clock lost `d` ns.
    Wake(u64),
    /// A window starts (a restart): its instance id.
    Start(String, bool),
    /// A window that left joins again.
    Rejoin(ProcId),
    /// A window's etcd contender runs a step (if this is still its latest).
    Contender(ProcId, u64),
    /// A window's renewer beside its contender looks at what it holds.
    Renewer(ProcId),
    /// A window (its process) starts an agent harness child with its id.
    StartChild(ProcId),
    /// A harness peer starts (after a power loss).
    StartPeer(String),
}

/// One window.
struct Window {
    proc: ProcId,
    writer: Option<Writer>,
    shared: Arc<Shared>,
    rx: broadcast::Receiver<LeadershipChange>,
    app: App,
    extended: bool,
    /// Its agent harness child, if any (index in [`Sim::harnesses`]).
    child: Option<usize>,
}

/// One run.
pub struct Sim {
    m: Machine,
    rng: Rng,
    opts: Options,
    pk: AgentPubkey,
    queue: BTreeMap<(u64, u64), Ev>,
    seq: u64,
    windows: Vec<Window>,
    harnesses: Vec<Harness>,
    /// Per process: its scheduled round (time, generation).
    rounds: BTreeMap<ProcId, (u64, u64)>,
    gens: u64,
    /// Per process: starved until, by at least and at most this much per
    /// wake-up.
    starved: BTreeMap<ProcId, (u64, u64, u64)>,
    checker: Checker,
    quiet_from: u64,
    last_claim: u64,
    suspended_until: u64,
    /// When the last reply was sent.
    last_answer: u64,
    published: Vec<(u64, u64)>,
    answers: BTreeMap<u64, Vec<(String, u64)>>,
    /// When each window last took each mention (across hosts: a turn
    /// taken under the fall-back is the fall-back's, however late it ends).
    took_at: BTreeMap<(String, u64), u64>,
    faults_done: u64,
    end: u64,
    /// Print every fault and change (`--trace`).
    pub trace: bool,
    /// Windows' panics seen (caught by the writer itself).
    pub panics: u64,
    /// The first violation, which ends the run.
    pub violation: Option<Violation>,
    /// In a run across hosts: this host's link to etcd.
    host: Option<HostLink>,
    /// Writer rounds run.
    rounds_run: u64,
    /// The same instant's rounds in a row, and that instant.
    same_instant: (u32, u64),
    /// Claims not yet honoured: the claimant's window and when.
    claims_open: Vec<(usize, u64)>,
    /// Claims made and honoured.
    claims: (u64, u64),
    /// See [`Outcome::forced_by_disk`].
    forced_by_disk: u64,
    /// See [`Outcome::skipped_after_ledgerless`].
    skipped_after_ledgerless: u64,
    /// See [`Outcome::answered_after_ledgerless`].
    answered_after_ledgerless: u64,
    /// See [`Outcome::frozen_reply`].
    frozen_reply: u64,
    /// Mentions some app dropped from its capped queue
    /// ([`Options::queue_cap`]).
    cap_dropped: std::collections::BTreeSet<u64>,
    /// See [`Outcome::dropped_by_cap`].
    dropped_by_cap: u64,
    /// Mentions granted while another window's reply to them waited,
    /// frozen, on its way.
    frozen_regrants: std::collections::BTreeSet<String>,
    /// Until when the power is off (see [`Fault::PowerLoss`]).
    power_back: u64,
    /// Mentions taken again while the disk forced it (see
    /// `Sim::disk_forced`).
    forced_takes: std::collections::BTreeSet<(ProcId, String)>,
    /// Mentions granted while the disk refused writes (no line of the
    /// take could be written), by whom.
    unrecorded_grants: std::collections::BTreeSet<(String, String)>,
    /// How long a reply waited, on its way, for its frozen window (by
    /// window and mention, virtual ns).
    reply_frozen: BTreeMap<(String, u64), u64>,
}

impl Sim {
    /// A run of `seed` with `opts`.
    pub fn new(seed: u64, opts: Options) -> Self {
        Self::on_host(seed, opts, None)
    }

    /// A run of `seed` with `opts`, as one host of a run across hosts when
    /// `host` is given (its windows' instance ids then begin with the host's name;
    /// the run's driver publishes the mentions and checks the agent).
    pub(crate) fn on_host(seed: u64, opts: Options, host: Option<HostLink>) -> Self {
        let mut rng = Rng::new(seed);
        let pk = AgentPubkey::parse(&format!("{:064x}", u128::from(rng.next_u64()) | 1))
            .expect("64 hex digits");
        let m: Machine = Arc::new(std::sync::Mutex::new(State::new(&opts)));
        let end = opts.seconds * 1000 * MS;
        let pk = host.as_ref().map_or(pk, |h| h.pk);
        if let Some(h) = &host {
            lock(&m).host = h.name.clone();
        }
        let mut sim = Self {
            m,
            rng,
            opts,
            pk,
            queue: BTreeMap::new(),
            seq: 0,
            windows: Vec::new(),
            harnesses: Vec::new(),
            rounds: BTreeMap::new(),
            gens: 0,
            starved: BTreeMap::new(),
            checker: Checker::default(),
            quiet_from: 0,
            last_claim: 0,
            suspended_until: 0,
            last_answer: 0,
            published: Vec::new(),
            answers: BTreeMap::new(),
            took_at: BTreeMap::new(),
            faults_done: 0,
            end,
            trace: false,
            panics: 0,
            violation: None,
            host,
            rounds_run: 0,
            same_instant: (0, u64::MAX),
            claims_open: Vec::new(),
            claims: (0, 0),
            forced_by_disk: 0,
            skipped_after_ledgerless: 0,
            answered_after_ledgerless: 0,
            frozen_reply: 0,
            cap_dropped: Default::default(),
            dropped_by_cap: 0,
            frozen_regrants: Default::default(),
            forced_takes: Default::default(),
            unrecorded_grants: Default::default(),
            reply_frozen: Default::default(),
            power_back: 0,
        };
        sim.setup();
        sim
    }

    fn push(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        self.queue.insert((at, self.seq), ev);
    }

    fn now(&self) -> u64 {
        lock(&self.m).t
    }

    fn setup(&mut self) {
        let o = self.opts.clone();
        let prefix = self.host.as_ref().map_or(String::new(), |h| h.name.clone());
        for i in 0..o.extended + o.spec {
            let at = self.rng.range(0, 50 * MS);
            self.push(at, Ev::Start(format!("{prefix}w{i}"), i < o.extended));
        }
        for i in 0..o.harnesses {
            self.start_harness(format!("h{i}"));
        }
        let plan = Plan::random(&mut self.rng, &o);
        for (at, f) in plan.faults {
            self.push(at, Ev::Fault(f));
        }
        let mut n = 0;
        let mut at = 500 * MS;
        while o.mention_every_ms > 0 && at < self.end {
            self.push(at, Ev::Publish(n));
            n += 1;
            at += self
                .rng
                .range(o.mention_every_ms / 2, o.mention_every_ms * 3 / 2)
                * MS;
        }
    }

    fn config(&self, extended: bool) -> Config {
        let mut c = Config::new("/sim");
        c.refresh = self.opts.refresh;
        c.stale = self.opts.stale;
        c.stand_down = self.opts.stand_down;
        c.lock_wait = self.opts.lock_wait;
        c.mode = if extended { Mode::Extended } else { Mode::Spec };
        c
    }

    /// Sends a command to window `w` and runs its round at once, as a
    /// caller blocked on the writer's answer would see it.
    fn call<T>(
        &mut self,
        w: usize,
        command: impl FnOnce(crate::elector::Reply<T>) -> Command,
    ) -> Option<T> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        {
            let mut s = lock(&self.m);
            let proc = self.windows[w].proc;
            if !s.procs[proc].running(s.t) {
                return None;
            }
            s.procs[proc].inbox.push(command(tx));
        }
        self.round_only(w);
        rx.try_recv().ok().and_then(Result::ok)
    }

    /// A mention's `created_at` as the relay stamps it (unix ms, on the
    /// true clock: the machine's wall steps do not move it), for a mention
    /// published at `at` (virtual ns). Was the virtual ms since the run
    /// began, older than every unix time: a holder that fell back to
    /// "published since we led" then owed nothing ever again.
    fn relay_ms(&self, at: u64) -> u64 {
        let wall0 = lock(&self.m).wall0;
        let base = wall0
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        u64::try_from(base.as_millis()).unwrap_or(0) + at / MS
    }

    fn window_of(&self, proc: ProcId) -> Option<usize> {
        self.windows.iter().position(|w| w.proc == proc)
    }

    /// A round, then the app reads what it announced.
    fn run_round(&mut self, w: usize) {
        self.round_only(w);
        if self.windows[w].writer.is_some() {
            self.react(w);
        }
    }

    fn round_only(&mut self, w: usize) {
        let Some(writer) = self.windows[w].writer.as_mut() else {
            return;
        };
        let before = panic_count();
        IN_WRITER.with(|s| s.set(true));
        let go = writer.round();
        IN_WRITER.with(|s| s.set(false));
        self.panics += panic_count() - before;
        let next = writer.next_tick();
        let proc = self.windows[w].proc;
        {
            let mut s = lock(&self.m);
            if write_fault(&s).is_none() {
                s.procs[proc].writable_round_at = s.t;
            }
        }
        self.after_round(proc, !go);
        if !go {
            self.windows[w].writer = None;
            lock(&self.m).procs[proc].alive = false;
            return;
        }
        self.rounds.remove(&proc);
        if let Some(next) = next {
            let at = lock(&self.m).t_of(next);
            self.schedule(proc, at);
        }
    }

    fn schedule(&mut self, proc: ProcId, at: u64) {
        let t = self.now();
        let mut at = at.max(t);
        if let Some(&(until, least, most)) = self.starved.get(&proc) {
            if at < until {
                at += self.rng.range(least, most);
            }
        }
        if self.rounds.get(&proc).is_some_and(|&(cur, _)| cur <= at) {
            return;
        }
        self.gens += 1;
        self.rounds.insert(proc, (at, self.gens));
        self.push(at, Ev::Round(proc, self.gens));
    }

    /// Runs to the end; returns what it found.
    pub fn run(mut self) -> Outcome {
        // A day-long run takes hours of real time: one line per simulated
        // hour (target `nip_le::sim::progress`) says how far it is.
        let mut hour = 0;
        while let Some(at) = self.next_at() {
            if at / (3_600_000 * MS) > hour {
                hour = at / (3_600_000 * MS);
                let (ledger_bytes, ledger_peak) = {
                    let s = lock(&self.m);
                    let now = s.ledgers.get(&self.pk).map_or(0, Vec::len);
                    (now, s.ledger_peak)
                };
                tracing::info!(target: "nip_le::sim::progress", hour, answered = self.answers.len(), published = self.published.len(), ledger_bytes, ledger_peak, "simulated");
            }
            self.step();
        }
        self.finish()
    }

    /// When the next event happens; `None` once the run is over (the plan
    /// and its quiet tail done, or a violation found).
    pub(crate) fn next_at(&self) -> Option<u64> {
        let (&(at, _), _) = self.queue.first_key_value()?;
        // The quiet tail lasts until every mention is answered (a backlog
        // drains one turn at a time), or until two minutes pass without an
        // answer.
        let tail = self.end + self.settle();
        let drained = self.answers.len() == self.published.len();
        let stuck = at > tail.max(self.last_answer) + 120_000 * MS;
        let over = self.violation.is_some() || (at > tail && (drained || stuck));
        (!over).then_some(at)
    }

    /// Runs the next event and the checks after it.
    pub(crate) fn step(&mut self) {
        let Some(((at, _), ev)) = self.queue.pop_first() else {
            return;
        };
        lock(&self.m).advance(at);
        if let Ev::Round(proc, _) = ev {
            self.rounds_run += 1;
            let (same, last_at) = self.same_instant;
            self.same_instant = (if at == last_at { same + 1 } else { 0 }, at);
            if self.same_instant.0 > 10_000 {
                let id = lock(&self.m).procs[proc].instance_id.clone();
                self.violation = Some(Violation::new(
                    at,
                    Invariant::HotLoop,
                    format!("{id}'s writer wakes again at once, forever"),
                ));
                return;
            }
        }
        self.handle(ev);
        self.drain_wakeups();
        self.check();
    }

    /// The run's end: the last checks and what it found.
    pub(crate) fn finish(mut self) -> Outcome {
        if self.violation.is_none() && self.host.is_none() {
            self.check_all_answered();
        }
        let latencies_ms = (self.published.iter())
            .filter_map(|&(n, at)| {
                let first = self.answers.get(&n)?.iter().map(|a| a.1).min()?;
                Some((first.saturating_sub(at) / MS, n))
            })
            .collect();
        let s = lock(&self.m);
        Outcome {
            latencies_ms,
            violation: self
                .violation
                .clone()
                .or_else(|| s.violations.first().cloned()),
            faults: self.faults_done,
            mentions: self.published.len() as u64,
            answered: self.answers.len() as u64,
            holder_changes: s.holder_changes,
            fail_safe_ns: self.checker.tally.fail_safe_ns,
            stale_cache_ns: self.checker.tally.stale_cache_ns,
            longest_silence_ns: self.checker.tally.longest_silence_ns,
            rounds: self.rounds_run,
            forced_by_disk: self.forced_by_disk,
            skipped_after_ledgerless: self.skipped_after_ledgerless,
            answered_after_ledgerless: self.answered_after_ledgerless,
            frozen_reply: self.frozen_reply,
            dropped_by_cap: self.dropped_by_cap,
            ledger_peak_bytes: s.ledger_peak as u64,
            claims: self.claims.0,
            claims_honoured: self.claims.1,
        }
    }

    /// The quiet tail after the plan, in which every mention must get its
    /// answer.
    fn settle(&self) -> u64 {
        let o = &self.opts;
        (2 * o.stale + o.stand_down + 2 * o.refresh).as_nanos() as u64 + (2 * o.turn_ms + 1000) * MS
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Round(proc, gen) => {
                if self.rounds.get(&proc).map(|r| r.1) != Some(gen) {
                    return;
                }
                self.rounds.remove(&proc);
                let (running, until) = {
                    let s = lock(&self.m);
                    (s.procs[proc].running(s.t), s.procs[proc].stopped_until)
                };
                if !running {
                    if lock(&self.m).procs[proc].alive {
                        self.schedule(proc, until);
                    }
                    return;
                }
                if let Some(w) = self.window_of(proc) {
                    self.run_round(w);
                }
            }
            Ev::HarnessTick(h) => self.harness_step(h, false),
            Ev::HarnessFinish(h) => self.harness_step(h, true),
            Ev::Fault(f) => {
                if self.trace {
                    println!("{:>10.3} s  fault {f:?}", self.now() as f64 / 1e9);
                }
                if lock(&self.m).t <= self.end {
                    self.faults_done += 1;
                    self.fault(f);
                }
            }
            Ev::Publish(n) => {
                let t = self.now();
                self.publish(n, t);
            }
            Ev::Deliver(proc, n) => {
                // Published in order of `n`.
                let i = self.published.partition_point(|p| p.0 < n);
                let published = self
                    .published
                    .get(i)
                    .filter(|p| p.0 == n)
                    .map_or(0, |p| p.1);
                if let Some(w) = self.window_of(proc) {
                    if self.windows[w].writer.is_some() {
                        let relay_ms = self.relay_ms(published);
                        let cap = self.opts.queue_cap;
                        if let Some(d) = self.windows[w].app.receive(&mention_id(n), relay_ms, cap)
                        {
                            self.cap_dropped
                                .insert(u64::from_str_radix(&d, 16).unwrap_or(u64::MAX));
                        }
                        let running = {
                            let s = lock(&self.m);
                            s.procs[proc].running(s.t)
                        };
                        if running {
                            self.react(w);
                        }
                    }
                }
            }
            Ev::TurnEnd(proc, serial) => self.turn_end(proc, serial),
            Ev::Sent(proc, id) => self.sent(proc, id),
            Ev::SendFailed(proc, id) => self.send_failed(proc, id),
            Ev::Poll(proc) => {
                if let Some(w) = self.window_of(proc) {
                    self.windows[w].app.poll_pending = false;
                    self.react(w);
                }
            }
            Ev::Frame(proc, target) => {
                if let Some(w) = self.window_of(proc) {
                    let pk = self.pk;
                    let _ = self.call(w, |r| Command::ClaimFrame(pk, target, r));
                } else if let Some(h) = self.harnesses.iter().position(|h| h.proc == proc) {
                    let mut s = lock(&self.m);
                    if s.procs[proc].running(s.t) {
                        self.harnesses[h].claim_frame(&mut s, &target);
                    }
                }
            }
            Ev::Wake(d) => {
                let mut s = lock(&self.m);
                s.mono_lag += d;
                let t = s.t;
                s.advance(t);
            }
            // Nothing starts while the power is off.
            Ev::Start(id, extended) if self.now() < self.power_back => {
                let at = self.power_back;
                self.push(at, Ev::Start(id, extended));
            }
            Ev::Start(id, extended) => self.start_window(id, extended),
            Ev::Rejoin(proc) => self.rejoin(proc),
            Ev::Contender(proc, gen) => self.contender_due(proc, gen),
            Ev::Renewer(proc) => self.renewer_due(proc),
            Ev::StartChild(proc) => self.start_child(proc),
            Ev::StartPeer(id) => self.start_harness(id),
        }
    }

    fn drain_wakeups(&mut self) {
        let wakeups = std::mem::take(&mut lock(&self.m).wakeups);
        for (proc, at) in wakeups {
            if self.window_of(proc).is_some() {
                self.schedule(proc, at);
            }
        }
    }
}

thread_local! {
    static PANICS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    static IN_WRITER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn panic_count() -> u64 {
    PANICS.with(|p| p.get())
}

/// Counts the panics inside a writer's round (the writer catches them and
/// carries on; a simulation must still see each one) and keeps them quiet.
pub(super) fn install_panic_counter() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if IN_WRITER.with(|s| s.get()) {
                PANICS.with(|p| p.set(p.get() + 1));
            } else {
                previous(info);
            }
        }));
    });
}
