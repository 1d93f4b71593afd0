//! Runs across hosts: several hosts, each a one-host run of its own (its
//! windows' real writers on its own simulated machine, its own fault
//! plan), sharing one simulated etcd that each window's real contender
//! machine calls through its host's link. The driver keeps every host at
//! the run's time, publishes the relay's mentions to every window of every
//! host, draws the faults between hosts and etcd (a host cut off, a flaky
//! link that loses requests and answers, watches that lose their place,
//! etcd out of reach for everyone, etcd restarts, claims from another
//! host; on request, data loss, forged answers and slow links that keep a
//! host's contenders busy), and checks the agent across hosts after every
//! step.
//!
//! Checked: never two windows that hold etcd's key at once; acting on two
//! hosts at once only under the fall-back policy (counted apart); no
//! silence past the bound of the faults in force; every mention answered
//! and each host's own invariants (two acting windows over a host's
//! record, epochs, panics, hot loops). Exactly once is counted, and failed
//! with [`HostsOptions::strict_once`], but for two exceptions counted
//! apart: a second answer given under the fall-back (both hosts acted, as
//! the policy allows; the turn counts by when it was taken), and a mention
//! taken or answered on a host whose link to etcd was cut or lossy then
//! (its take or done could not reach etcd before another host gained the
//! agent, or ever, if its window went first).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::global::WhenUnreachable;
use crate::pubkey::AgentPubkey;

use super::check::{Invariant, Violation};
use super::cluster::{HostLink, Outcome, Sim};
use super::plan::{Mix, Options};
use super::rng::Rng;

use super::etcd::SimEtcd;
pub use super::hosts_outcome::HostsOutcome;

const MS: u64 = 1_000_000;

/// A run across hosts.
#[derive(Debug, Clone, PartialEq)]
pub struct HostsOptions {
    /// How many hosts.
    pub hosts: usize,
    /// Each host's run: its windows, timings and fault mix (its own
    /// mentions are off: the driver publishes).
    pub per_host: Options,
    /// The etcd lease's TTL.
    pub ttl: Duration,
    /// What a host leader does while etcd is out of reach.
    pub policy: WhenUnreachable,
    /// Mean interval of faults between hosts and etcd, ms (0: none).
    pub etcd_fault_every_ms: u64,
    /// Mean mention interval, ms.
    pub mention_every_ms: u64,
    /// Fail a seed on a mention answered twice or never.
    pub strict_once: bool,
    /// Also draw etcd losing every key, lease and revision.
    pub data_loss: bool,
    /// Also draw links whose answers are forged (TTLs and revisions near
    /// `u64::MAX`).
    pub hostile: bool,
    /// Also draw slow links: a host's contenders busy with work records
    /// for one to three TTLs (their renewers still run).
    pub slow_link: bool,
    /// Each window runs a renewer beside its contender (as the app does);
    /// off only to show what it is for.
    pub renewer: bool,
}

impl HostsOptions {
    /// Three hosts of two extended windows, the NIP's timings, etcd's
    /// default TTL, process and disk faults on every host and link faults
    /// between.
    pub fn new(seconds: u64) -> Self {
        let mut per_host = Options::extended(seconds);
        per_host.extended = 2;
        per_host.mention_every_ms = 0;
        per_host.fault_every_ms = 8000;
        per_host.mix = Mix {
            clocks: false,
            children: false,
            ..Mix::ALL
        };
        Self {
            hosts: 3,
            per_host,
            ttl: crate::global::DEFAULT_TTL,
            policy: WhenUnreachable::FallBack,
            etcd_fault_every_ms: 6000,
            mention_every_ms: 2000,
            strict_once: false,
            data_loss: false,
            hostile: false,
            slow_link: false,
            renewer: true,
        }
    }
}

/// One answer: its host, and the window, the time and when that window
/// took the mention.
type Answer = (usize, (String, u64, u64));

/// A fault between the hosts and etcd.
#[derive(Debug, Clone, PartialEq)]
enum LinkFault {
    /// A host cannot reach etcd for `d` ns.
    Cut { host: usize, d: u64 },
    /// No host reaches etcd for `d` ns.
    CutAll { d: u64 },
    /// A host's calls fail with chance `p` for `d` ns.
    Flaky { host: usize, d: u64, p: f64 },
    /// A host's watches lose their place.
    WatchReset { host: usize },
    /// Etcd restarts for `d` ns (out of reach, leases kept).
    Restart { d: u64 },
    /// Etcd loses every key, lease and revision.
    DataLoss,
    /// A host's answers are forged for `d` ns.
    Hostile { host: usize, d: u64 },
    /// A host's contenders are busy for `d` ns (a slow link, many
    /// records).
    Slow { host: usize, d: u64 },
    /// A user on a host claims the agent.
    Claim { host: usize },
}

#[derive(Debug, Clone)]
enum Ev {
    Publish(u64),
    Fault(LinkFault),
}

/// The driver.
struct Hosts {
    sims: Vec<Sim>,
    etcd: Arc<SimEtcd>,
    t: Arc<AtomicU64>,
    rng: Rng,
    o: HostsOptions,
    queue: BTreeMap<(u64, u64), Ev>,
    seq: u64,
    published: Vec<(u64, u64)>,
    end: u64,
    revision: u64,
    quiet_from: u64,
    silent_since: Option<u64>,
    overlap_since: Option<u64>,
    /// Spans in which some window acted under the fall-back (not holding
    /// etcd's key), and the one open now.
    fallback_spans: Vec<(u64, u64)>,
    fallback_since: Option<u64>,
    /// Spans in which a host's link to etcd was cut or lossy: (host, from,
    /// until).
    cut_spans: Vec<(usize, u64, u64)>,
    /// The window that acted with etcd's key last.
    last_holder: Option<String>,
    out: HostsOutcome,
    trace: bool,
}

/// Runs one seed across hosts; `trace` prints every fault and change.
pub fn run(seed: u64, o: &HostsOptions, trace: bool) -> HostsOutcome {
    super::cluster::install_panic_counter();
    let mut rng = Rng::new(seed);
    let pk = AgentPubkey::parse(&format!("{:064x}", u128::from(rng.next_u64()) | 1))
        .expect("64 hex digits");
    let t = Arc::new(AtomicU64::new(0));
    let etcd = SimEtcd::new(o.hosts, Arc::clone(&t), rng.fork());
    let sims = (0..o.hosts)
        .map(|i| {
            let name = format!("{}", (b'a' + i as u8) as char);
            let mut link = HostLink::new(i, name, Arc::clone(&etcd), o.ttl, o.policy, pk);
            link.renewer = o.renewer;
            let mut sim = Sim::on_host(rng.next_u64(), o.per_host.clone(), Some(link));
            sim.trace = trace;
            sim
        })
        .collect();
    let mut h = Hosts {
        sims,
        etcd,
        t,
        rng,
        end: o.per_host.seconds * 1000 * MS,
        o: o.clone(),
        queue: BTreeMap::new(),
        seq: 0,
        published: Vec::new(),
        revision: 0,
        quiet_from: 0,
        silent_since: None,
        overlap_since: None,
        fallback_spans: Vec::new(),
        fallback_since: None,
        cut_spans: Vec::new(),
        last_holder: None,
        out: HostsOutcome::default(),
        trace,
    };
    h.plan();
    h.run()
}

impl Hosts {
    fn push(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        self.queue.insert((at, self.seq), ev);
    }

    fn plan(&mut self) {
        let mut n = 0;
        let mut at = 500 * MS;
        let every = self.o.mention_every_ms;
        while every > 0 && at < self.end {
            self.push(at, Ev::Publish(n));
            n += 1;
            at += self.rng.range(every / 2, every * 3 / 2) * MS;
        }
        let every = self.o.etcd_fault_every_ms;
        let ttl = self.o.ttl.as_nanos() as u64;
        let mut at = 2000 * MS;
        while every > 0 && at < self.end {
            let host = self.rng.pick(self.o.hosts).unwrap_or(0);
            let d = self.rng.range(MS, 3 * ttl);
            let f = match self.rng.range(0, 12) {
                0..=2 => LinkFault::Cut { host, d },
                3 => LinkFault::CutAll { d: d / 2 },
                4..=5 => LinkFault::Flaky {
                    host,
                    d,
                    p: self.rng.range(10, 60) as f64 / 100.0,
                },
                6 => LinkFault::WatchReset { host },
                7 => LinkFault::Restart {
                    d: self.rng.range(MS, ttl),
                },
                8 if self.o.data_loss => LinkFault::DataLoss,
                9 if self.o.hostile => LinkFault::Hostile { host, d },
                10 if self.o.slow_link => LinkFault::Slow {
                    host,
                    d: self.rng.range(ttl, 3 * ttl),
                },
                _ => LinkFault::Claim { host },
            };
            self.push(at, Ev::Fault(f));
            at += self.rng.range(every / 2, every * 3 / 2) * MS;
        }
    }

    /// The quiet tail after the plans.
    fn tail(&self) -> u64 {
        let p = &self.o.per_host;
        let ns = |d: Duration| d.as_nanos() as u64;
        ns(2 * p.stale + p.stand_down + 2 * p.refresh + 3 * self.o.ttl)
            + (2 * p.turn_ms + 1000) * MS
    }

    fn run(mut self) -> HostsOutcome {
        loop {
            let host_next = (0..self.sims.len())
                .filter_map(|i| self.sims[i].next_event().map(|t| (t, i)))
                .min();
            let own_next = self.queue.first_key_value().map(|(&(t, _), _)| t);
            let at = match (host_next, own_next) {
                (None, None) => break,
                (Some((a, _)), Some(b)) => a.min(b),
                (Some((a, _)), None) => a,
                (None, Some(b)) => b,
            };
            let tail = self.end + self.tail();
            if self.out.violation.is_some() || (at > tail && self.over(at, tail)) {
                break;
            }
            self.t.store(at, Ordering::Relaxed);
            for s in &mut self.sims {
                s.advance_to(at);
            }
            if own_next == Some(at) {
                let (_, ev) = self.queue.pop_first().expect("peeked");
                self.handle(at, ev);
            } else if let Some((_, i)) = host_next {
                self.sims[i].step();
            }
            let revision = self.etcd.revision();
            if revision != self.revision && self.trace {
                for line in self.etcd.describe_since(self.revision.min(revision) + 1) {
                    println!("{:>10.3} s  {line}", at as f64 / 1e9);
                }
            }
            if revision != self.revision {
                self.revision = revision;
                for s in &mut self.sims {
                    s.etcd_changed(at);
                }
            }
            self.check(at);
        }
        self.finish()
    }

    fn handle(&mut self, t: u64, ev: Ev) {
        match ev {
            Ev::Publish(n) => {
                self.published.push((n, t));
                for s in &mut self.sims {
                    s.publish(n, t);
                }
            }
            Ev::Fault(f) => {
                if t > self.end {
                    return;
                }
                self.out.faults += 1;
                if self.trace {
                    println!("{:>10.3} s  link fault {f:?}", t as f64 / 1e9);
                }
                match f {
                    LinkFault::Cut { host, d } => {
                        self.cut_spans.push((host, t, t + d));
                        self.etcd.cut(host, t + d);
                        self.quiet_from = self.quiet_from.max(t + d);
                    }
                    LinkFault::CutAll { d } => {
                        for host in 0..self.sims.len() {
                            self.cut_spans.push((host, t, t + d));
                            self.etcd.cut(host, t + d);
                        }
                        self.quiet_from = self.quiet_from.max(t + d);
                    }
                    LinkFault::Flaky { host, d, p } => {
                        self.cut_spans.push((host, t, t + d));
                        self.etcd.flaky(host, t + d, p);
                        self.quiet_from = self.quiet_from.max(t + d);
                    }
                    LinkFault::WatchReset { host } => self.sims[host].watches_reset(),
                    LinkFault::Restart { d } => {
                        let hosts = self.sims.len();
                        self.cut_spans.extend((0..hosts).map(|h| (h, t, t + d)));
                        self.etcd.restart(d);
                        self.quiet_from = self.quiet_from.max(t + d);
                    }
                    LinkFault::DataLoss => {
                        self.etcd.lose_everything();
                        self.quiet_from = self.quiet_from.max(t);
                    }
                    LinkFault::Hostile { host, d } => {
                        self.etcd.hostile(host, t + d);
                        self.quiet_from = self.quiet_from.max(t + d);
                    }
                    LinkFault::Slow { host, d } => {
                        // Its records reach etcd late, as over a cut link.
                        self.cut_spans.push((host, t, t + d));
                        self.sims[host].slow_link(t + d);
                        self.quiet_from = self.quiet_from.max(t + d);
                    }
                    LinkFault::Claim { host } => {
                        if let Some(target) = self.sims[host].claim_here() {
                            for (i, s) in self.sims.iter_mut().enumerate() {
                                if i != host {
                                    s.frame_from_afar(&target);
                                }
                            }
                            self.quiet_from = self.quiet_from.max(t);
                        }
                    }
                }
            }
        }
    }

    /// In the quiet tail: every mention answered, or two minutes without
    /// an answer.
    fn over(&self, at: u64, tail: u64) -> bool {
        let last_answer = self.sims.iter().map(Sim::last_answer).max().unwrap_or(0);
        at > tail.max(last_answer) + 120_000 * MS || self.answered().len() == self.published.len()
    }

    /// Whether one of `by` was taken or answered on a host whose link to
    /// etcd was cut or lossy then (its record could not reach etcd).
    fn done_cut_off(&self, by: &[Answer]) -> bool {
        let cut = |h: usize, t: u64| {
            (self.cut_spans.iter()).any(|&(host, a, b)| host == h && a <= t && t <= b)
        };
        by.iter()
            .any(|&(h, (_, at, took))| cut(h, at) || cut(h, took))
    }

    /// Every answer: per mention, the host, window and time of each.
    fn answered(&self) -> BTreeMap<u64, Vec<Answer>> {
        let mut all: BTreeMap<u64, Vec<Answer>> = BTreeMap::new();
        for (i, s) in self.sims.iter().enumerate() {
            for (n, by) in s.answers() {
                for (id, at) in by {
                    let took = s.took_at(id, *n).unwrap_or(*at);
                    all.entry(*n)
                        .or_default()
                        .push((i, (id.clone(), *at, took)));
                }
            }
        }
        all
    }

    fn check(&mut self, t: u64) {
        if self.out.violation.is_some() {
            return;
        }
        for (i, s) in self.sims.iter().enumerate() {
            if let Some(v) = s.host_violation() {
                self.out.violation = Some(Violation::new(
                    v.at,
                    v.what,
                    format!("host {}: {}", (b'a' + i as u8) as char, v.detail),
                ));
                return;
            }
        }
        let mut acting = Vec::new();
        for (i, s) in self.sims.iter().enumerate() {
            s.acting(&mut |a| acting.push((i, a)));
        }
        let holders: Vec<String> = (acting.iter().filter(|(_, a)| a.global))
            .map(|(i, a)| self.sims[*i].window_id(a.window))
            .collect();
        if let [one] = &holders[..] {
            if self.last_holder.as_ref().is_some_and(|l| l != one) {
                self.out.key_moves += 1;
            }
            self.last_holder = Some(one.clone());
        }
        if holders.len() >= 2 {
            self.out.violation = Some(Violation::new(
                t,
                Invariant::TwoEtcdHolders,
                format!("{holders:?} act, each holding the key"),
            ));
            return;
        }
        if acting.iter().any(|(_, a)| !a.global) {
            self.fallback_since.get_or_insert(t);
        } else if let Some(since) = self.fallback_since.take() {
            self.fallback_spans.push((since, t));
        }
        let two_hosts = acting.iter().any(|(i, _)| *i != acting[0].0);
        if two_hosts {
            self.overlap_since.get_or_insert(t);
        } else if let Some(since) = self.overlap_since.take() {
            self.out.fallback_overlap_ns += t - since;
        }
        if two_hosts && self.o.policy == WhenUnreachable::StaySilent {
            let ids: Vec<String> = acting
                .iter()
                .map(|(i, a)| self.sims[*i].window_id(a.window))
                .collect();
            self.out.violation = Some(Violation::new(
                t,
                Invariant::TwoActingHosts,
                format!("{ids:?} act under the stay-silent policy"),
            ));
            return;
        }
        let able = self.sims.iter().any(Sim::able);
        if !acting.is_empty() || !able {
            self.silent_since = None;
            return;
        }
        // A fault on one host excuses silence only while every host has
        // one: a healthy host takes the agent within the bound (a host
        // leader that fenced itself and kept its etcd lease kept every
        // other host from it, found this way).
        let quiet_from = self
            .sims
            .iter()
            .map(Sim::quiet_from)
            .min()
            .unwrap_or(0)
            .max(self.quiet_from);
        let began = *self.silent_since.get_or_insert(t);
        let silence = t.saturating_sub(began.max(quiet_from));
        self.out.longest_silence_ns = self.out.longest_silence_ns.max(silence);
        let host_bound = self.sims.iter().map(|s| s.bound_at(t)).max().unwrap_or(0);
        let bound = host_bound + 2 * self.o.ttl.as_nanos() as u64 + 1000 * MS;
        if silence > bound {
            self.out.violation = Some(Violation::new(
                t,
                Invariant::Silence,
                format!(
                    "nobody acted on any host for {} ms (bound {} ms)",
                    silence / MS,
                    bound / MS
                ),
            ));
        }
    }

    fn finish(mut self) -> HostsOutcome {
        let answered = self.answered();
        let t = self.t.load(Ordering::Relaxed);
        if let Some(since) = self.fallback_since.take() {
            self.fallback_spans.push((since, t));
        }
        let spans = std::mem::take(&mut self.fallback_spans);
        // A turn taken under the fall-back is the fall-back's, however late
        // it ends (its window may have been stopped meanwhile).
        let under_fallback = |at: u64| spans.iter().any(|&(a, b)| a <= at && at <= b);
        let mut first_twice = None;
        for (n, by) in &answered {
            let hosts: BTreeSet<usize> = by.iter().map(|(h, _)| *h).collect();
            let fallback = hosts.len() > 1
                && by
                    .iter()
                    .any(|(_, (_, at, took))| under_fallback(*at) || under_fallback(*took));
            let cut_off = hosts.len() > 1 && !fallback && self.done_cut_off(by);
            // A reply on its way whose window froze for two thirds of a
            // TTL or more: its take record's lease, renewed every TTL/3,
            // may lapse before the reply goes out (fence the take, not the
            // done; the host level's bound is the stale bound, etcd's the
            // TTL).
            let ttl = self.o.ttl.as_nanos() as u64 / 3 * 2;
            let frozen = hosts.len() > 1
                && !fallback
                && !cut_off
                && (by.iter()).any(|(h, (id, _, _))| self.sims[*h].reply_frozen(id, *n) >= ttl);
            // Within a host, what the host's own run excuses: a grant the
            // disk forced (two fail-safe leaders of a read-only directory),
            // or one made while another reply to it waited frozen.
            let forced = hosts.len() == 1
                && by.len() > 1
                && (by.iter()).any(|(h, (id, _, _))| self.sims[*h].grant_excused(id, *n));
            let excused = fallback || cut_off || frozen || forced;
            if hosts.len() > 1 {
                self.out.twice_across_hosts += 1;
                self.out.twice_under_fallback += u64::from(fallback);
                self.out.twice_done_cut_off += u64::from(cut_off);
                self.out.twice_frozen_reply += u64::from(frozen);
            } else if by.len() > 1 {
                self.out.twice_within_a_host += 1;
                self.out.twice_forced_within_a_host += u64::from(forced);
            }
            if by.len() > 1 && !excused && first_twice.is_none() {
                first_twice = Some(format!("mention {n} by {by:?}"));
            }
        }
        self.out.mentions = self.published.len() as u64;
        self.out.answered = answered.len() as u64;
        let never = self
            .published
            .iter()
            .filter(|(n, _)| !answered.contains_key(n))
            .count();
        self.out.unanswered = never as u64;
        if self.o.strict_once && self.out.violation.is_none() {
            if let Some(twice) = first_twice {
                self.out.violation = Some(Violation::new(t, Invariant::AnsweredTwice, twice));
            } else if let Some(&(n, at)) = self
                .published
                .iter()
                .find(|(n, _)| !answered.contains_key(n))
            {
                self.out.violation = Some(Violation::new(
                    t,
                    Invariant::NeverAnswered,
                    format!("mention {n} published at {} ms", at / MS),
                ));
            }
        }
        self.out.etcd_calls = self.etcd.calls.load(Ordering::Relaxed);
        self.out.etcd_failed = self.etcd.failed.load(Ordering::Relaxed);
        for s in self.sims {
            let o: Outcome = s.outcome();
            self.out.faults += o.faults;
        }
        self.out
    }
}
