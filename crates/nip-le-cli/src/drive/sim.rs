//! `nip-le sim`: seeds of the deterministic simulator. Each seed is one
//! cluster and one fault plan in virtual time; a failing seed prints the
//! one command that replays it. The last line is a summary.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use nip_le::global::WhenUnreachable;
use nip_le::sim::{self, HostsOptions, Options};

/// Which cluster a seed runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Cluster {
    /// Three extended windows working a queue: leadership and exactly once.
    Extended,
    /// Extended and spec windows beside a harness peer: leadership only.
    Mixed,
    /// Spec-mode windows only: leadership, and how often claims win.
    Spec,
    /// Hosts of two extended windows each on one simulated etcd (`--hosts`,
    /// `--policy`): the real contenders, link faults between hosts and
    /// etcd, never two holders of the key, no silence, every mention
    /// answered.
    Hosts,
}

/// What a host leader does while etcd is out of reach (see
/// `nip_le::WhenUnreachable`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Policy {
    /// Every host leader acts for its host.
    FallBack,
    /// Nobody acts until etcd answers.
    StaySilent,
}

/// A kind of fault (see `nip_le::sim::Mix`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FaultKind {
    /// Kills, quits, stops, leaves, claims.
    Processes,
    /// A peer hanging while it holds the lock file's flock.
    Holds,
    /// Pauses, suspends, wall steps.
    Clocks,
    /// ENOSPC, EIO, read-only, a power loss.
    Files,
    /// Late wake-ups.
    Starvation,
    /// Pid reuse.
    Pids,
    /// Agent harness children sharing their window's instance id, exiting and
    /// restarting.
    Children,
}

/// A fault across hosts drawn only on request (its findings are open).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ExtraKind {
    /// Etcd loses every key, lease and revision.
    DataLoss,
    /// A host's etcd answers are forged (TTLs, revisions near u64::MAX).
    Hostile,
    /// A host's link is slow: its contenders are busy with work records
    /// for one to three TTLs, while their renewers still run.
    SlowLink,
}

/// Flags of `nip-le sim`.
#[derive(Args, Debug, Clone)]
pub struct SimArgs {
    /// How many seeds.
    #[arg(long, default_value_t = 100)]
    pub seeds: u64,
    /// Simulated seconds of faults per seed (a quiet tail follows).
    #[arg(long, default_value_t = 120)]
    pub seconds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The cluster.
    #[arg(long, value_enum, default_value_t = Cluster::Extended)]
    pub cluster: Cluster,
    /// Print one line per seed.
    #[arg(long)]
    pub verbose: bool,
    /// Print every fault and leadership change of each seed.
    #[arg(long)]
    pub trace: bool,
    /// Kinds of fault left out of the plans: processes, holds, clocks,
    /// files, starvation, pids, children (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub without: Vec<FaultKind>,
    /// Hosts of a `--cluster hosts` run.
    #[arg(long, default_value_t = 3)]
    pub hosts: usize,
    /// The etcd policy of a `--cluster hosts` run.
    #[arg(long, value_enum, default_value_t = Policy::FallBack)]
    pub policy: Policy,
    /// In a `--cluster hosts` run, fail a seed on a mention answered twice
    /// or never, but for a second answer under the fall-back or after a
    /// first from a host whose link to etcd was cut or lossy (counted
    /// apart).
    #[arg(long)]
    pub strict_once: bool,
    /// Mean interval between mentions, ms (each draws half to one and a
    /// half of it); default: the cluster's (2000 ms for a queue).
    #[arg(long)]
    pub mention_ms: Option<u64>,
    /// Mean agent turn, ms (each draws a quarter to twice it); default:
    /// 1500 ms.
    #[arg(long)]
    pub turn_ms: Option<u64>,
    /// Most mentions each app keeps queued (0: all), the oldest dropped
    /// first, as Buzz's harness keeps 500 per channel; a mention never
    /// answered that an app dropped is counted apart.
    #[arg(long, default_value_t = 0)]
    pub queue_cap: usize,
    /// The work ledger's rewrite budget, bytes (default: the engine's 8
    /// MiB, which no run reaches): each rewrite past it marks answered
    /// events settled, and the apps pass each event's publication time to
    /// the take, as `LeaderGate` does.
    #[arg(long, value_name = "BYTES")]
    pub ledger_budget: Option<usize>,
    /// With --ledger-budget, how far behind now (ms) a rewrite may mark
    /// answered events settled (default: the engine's 10 minutes).
    #[arg(long, value_name = "MS", requires = "ledger_budget")]
    pub settle_lag_ms: Option<u64>,
    /// In a `--cluster hosts` run, faults drawn besides the default ones:
    /// data-loss, hostile, slow-link (comma-separated).
    #[arg(long = "with", value_delimiter = ',')]
    pub with: Vec<ExtraKind>,
    /// In a `--cluster hosts` run, no renewer beside the windows'
    /// contenders (what the app runs): shows what it is for.
    #[arg(long)]
    pub no_renewer: bool,
}

/// The flag values of `kinds`, comma-separated.
fn names<T: ValueEnum>(kinds: &[T]) -> String {
    let names: Vec<String> = kinds
        .iter()
        .map(|k| {
            k.to_possible_value()
                .expect("no skipped values")
                .get_name()
                .to_owned()
        })
        .collect();
    names.join(",")
}

impl SimArgs {
    /// The options of one seed.
    pub fn options(&self) -> Options {
        let mut o = match self.cluster {
            Cluster::Extended => Options::extended(self.seconds),
            Cluster::Mixed => Options::mixed(self.seconds),
            Cluster::Spec => Options::spec(self.seconds),
            Cluster::Hosts => HostsOptions::new(self.seconds).per_host,
        };
        if let Some(ms) = self.mention_ms.filter(|_| o.mention_every_ms > 0) {
            o.mention_every_ms = ms.max(2);
        }
        if let Some(ms) = self.turn_ms {
            o.turn_ms = ms.max(4);
        }
        o.queue_cap = self.queue_cap;
        o.ledger_budget = self.ledger_budget;
        if let Some(ms) = self.settle_lag_ms {
            o.settle_lag = Duration::from_millis(ms);
        }
        for k in &self.without {
            match k {
                FaultKind::Processes => o.mix.processes = false,
                FaultKind::Holds => o.mix.holds = false,
                FaultKind::Clocks => o.mix.clocks = false,
                FaultKind::Files => o.mix.files = false,
                FaultKind::Starvation => o.mix.starvation = false,
                FaultKind::Pids => o.mix.pids = false,
                FaultKind::Children => o.mix.children = false,
            }
        }
        o
    }

    /// The options of one seed of a run across hosts.
    pub fn hosts_options(&self) -> HostsOptions {
        let mut o = HostsOptions::new(self.seconds);
        let one = self.options();
        o.per_host.mix = one.mix;
        o.per_host.turn_ms = one.turn_ms;
        o.per_host.queue_cap = one.queue_cap;
        if let Some(ms) = self.mention_ms {
            o.mention_every_ms = ms.max(2);
        }
        o.hosts = self.hosts.clamp(1, 26);
        o.strict_once = self.strict_once;
        o.data_loss = self.with.contains(&ExtraKind::DataLoss);
        o.hostile = self.with.contains(&ExtraKind::Hostile);
        o.slow_link = self.with.contains(&ExtraKind::SlowLink);
        o.renewer = !self.no_renewer;
        o.policy = match self.policy {
            Policy::FallBack => WhenUnreachable::FallBack,
            Policy::StaySilent => WhenUnreachable::StaySilent,
        };
        o
    }

    /// The flags that replay this run's options.
    fn replay_flags(&self) -> String {
        let cluster = self.cluster.to_possible_value().expect("no skipped values");
        let mut f = format!(
            "--cluster {} --seconds {}",
            cluster.get_name(),
            self.seconds
        );
        if !self.without.is_empty() {
            f += &format!(" --without {}", names(&self.without));
        }
        if let Some(ms) = self.mention_ms {
            f += &format!(" --mention-ms {ms}");
        }
        if let Some(ms) = self.turn_ms {
            f += &format!(" --turn-ms {ms}");
        }
        if self.queue_cap > 0 {
            f += &format!(" --queue-cap {}", self.queue_cap);
        }
        if let Some(b) = self.ledger_budget {
            f += &format!(" --ledger-budget {b}");
        }
        if let Some(ms) = self.settle_lag_ms {
            f += &format!(" --settle-lag-ms {ms}");
        }
        if self.cluster == Cluster::Hosts {
            let policy = self.policy.to_possible_value().expect("no skipped values");
            f += &format!(" --hosts {} --policy {}", self.hosts, policy.get_name());
            if self.strict_once {
                f += " --strict-once";
            }
            if !self.with.is_empty() {
                f += &format!(" --with {}", names(&self.with));
            }
            if self.no_renewer {
                f += " --no-renewer";
            }
        }
        f
    }
}

/// What a batch of seeds found.
#[derive(Debug, Default)]
pub struct Summary {
    /// Seeds run.
    pub seeds: u64,
    /// The failing seeds and what broke.
    pub failed: Vec<(u64, sim::Violation)>,
    /// Simulated seconds in all.
    pub simulated: Duration,
    /// Wall time.
    pub wall: Duration,
    /// Faults injected.
    pub faults: u64,
    /// Mentions answered.
    pub answered: u64,
    /// Claims made, and honoured (the claimant acted within the
    /// stand-down).
    pub claims: (u64, u64),
    /// Mentions answered twice because the disk refused the first
    /// answer's `done` until its window was gone (see
    /// `nip_le::sim::Outcome::forced_by_disk`).
    pub forced_by_disk: u64,
    /// Mentions never answered, published before a harness child's record
    /// that no `held` line names (see
    /// `nip_le::sim::Outcome::skipped_after_ledgerless`).
    pub skipped_after_ledgerless: u64,
    /// Mentions published before such a record was replaced and answered
    /// after: a duplicate if that writer answered them (see
    /// `nip_le::sim::Outcome::answered_after_ledgerless`).
    pub answered_after_ledgerless: u64,
    /// Mentions answered twice by a reply frozen on its way past a
    /// takeover (see `nip_le::sim::Outcome::frozen_reply`).
    pub frozen_reply: u64,
    /// Mentions never answered that an app dropped from its capped queue
    /// (see `nip_le::sim::Outcome::dropped_by_cap`).
    pub dropped_by_cap: u64,
    /// The largest a work ledger file grew in any seed, bytes.
    pub ledger_peak_bytes: u64,
    /// Every answered mention's latency (ms), its seed and number.
    pub latencies: Vec<(u64, u64, u64)>,
    /// Across hosts: see [`Across`].
    pub across: Option<Across>,
}

/// What runs across hosts counted (exactly once is not promised there
/// yet).
#[derive(Debug, Default, Clone, Copy)]
pub struct Across {
    /// Mentions answered by windows of two hosts.
    pub twice_across_hosts: u64,
    /// Of which one answer came under the fall-back.
    pub twice_under_fallback: u64,
    /// Of which the first came from a host cut off from etcd before its
    /// done was recorded.
    pub twice_done_cut_off: u64,
    /// Of which one was a reply on its way from a window frozen for two
    /// thirds of a TTL or more.
    pub twice_frozen_reply: u64,
    /// Mentions answered twice within one host.
    pub twice_within_a_host: u64,
    /// Of which forced by the disk or by a reply frozen on its way.
    pub twice_forced_within_a_host: u64,
    /// Mentions never answered.
    pub unanswered: u64,
    /// Time windows of two hosts acted at once (the fall-back), ms.
    pub overlap_ms: u64,
    /// Times the window acting with etcd's key changed.
    pub key_moves: u64,
}

/// Runs `args.seeds` seeds from `args.seed`.
pub fn run_seeds(args: &SimArgs) -> Summary {
    let options = args.options();
    let start = Instant::now();
    let mut sum = Summary::default();
    if args.cluster == Cluster::Hosts {
        return run_host_seeds(args);
    }
    for seed in args.seed..args.seed.saturating_add(args.seeds) {
        let out = sim::run_traced(seed, &options, args.trace);
        sum.seeds += 1;
        sum.faults += out.faults;
        sum.answered += out.answered;
        sum.claims.0 += out.claims;
        sum.claims.1 += out.claims_honoured;
        sum.forced_by_disk += out.forced_by_disk;
        sum.skipped_after_ledgerless += out.skipped_after_ledgerless;
        sum.answered_after_ledgerless += out.answered_after_ledgerless;
        sum.frozen_reply += out.frozen_reply;
        sum.dropped_by_cap += out.dropped_by_cap;
        (sum.latencies).extend(out.latencies_ms.iter().map(|&(ms, n)| (ms, seed, n)));
        sum.ledger_peak_bytes = sum.ledger_peak_bytes.max(out.ledger_peak_bytes);
        sum.simulated += Duration::from_secs(args.seconds);
        if args.verbose {
            println!(
                "seed {seed}: {} faults, {}/{} answered, {} holder changes, {} rounds, longest silence {} ms{}",
                out.faults,
                out.answered,
                out.mentions,
                out.holder_changes,
                out.rounds,
                out.longest_silence_ns / 1_000_000,
                out.violation.as_ref().map_or(String::new(), |v| format!(": {v}")),
            );
        }
        if let Some(v) = out.violation {
            sum.failed.push((seed, v));
        }
    }
    sum.wall = start.elapsed();
    sum
}

/// [`run_seeds`] of a run across hosts.
fn run_host_seeds(args: &SimArgs) -> Summary {
    let options = args.hosts_options();
    let start = Instant::now();
    let mut sum = Summary::default();
    let mut across = Across::default();
    for seed in args.seed..args.seed.saturating_add(args.seeds) {
        let out = sim::run_hosts(seed, &options, args.trace);
        sum.seeds += 1;
        sum.faults += out.faults;
        sum.answered += out.answered;
        sum.simulated += Duration::from_secs(args.seconds);
        across.twice_across_hosts += out.twice_across_hosts;
        across.twice_under_fallback += out.twice_under_fallback;
        across.twice_done_cut_off += out.twice_done_cut_off;
        across.twice_frozen_reply += out.twice_frozen_reply;
        across.twice_within_a_host += out.twice_within_a_host;
        across.twice_forced_within_a_host += out.twice_forced_within_a_host;
        across.unanswered += out.unanswered;
        across.overlap_ms += out.fallback_overlap_ns / 1_000_000;
        across.key_moves += out.key_moves;
        if args.verbose {
            println!(
                "seed {seed}: {} faults, {}/{} answered ({} on two hosts, {} twice on one), {} ms on two hosts, {}/{} etcd calls failed, longest silence {} ms{}",
                out.faults,
                out.answered,
                out.mentions,
                out.twice_across_hosts,
                out.twice_within_a_host,
                out.fallback_overlap_ns / 1_000_000,
                out.etcd_failed,
                out.etcd_calls,
                out.longest_silence_ns / 1_000_000,
                out.violation.as_ref().map_or(String::new(), |v| format!(": {v}")),
            );
        }
        if let Some(v) = out.violation {
            sum.failed.push((seed, v));
        }
    }
    sum.across = Some(across);
    sum.wall = start.elapsed();
    sum
}

/// The `sim` command.
pub fn sim(args: SimArgs) -> Result<ExitCode, nip_le::Error> {
    let mut sum = run_seeds(&args);
    let cluster = args.cluster.to_possible_value().expect("no skipped values");
    for (seed, v) in &sum.failed {
        println!("seed {seed} failed: {v}");
        println!(
            "  replay: nip-le sim {} --seeds 1 --seed {seed} --trace",
            args.replay_flags()
        );
    }
    let speed = sum.simulated.as_secs_f64() / sum.wall.as_secs_f64().max(1e-9);
    println!(
        "sim: {} seeds × {} s ({} cluster), {} faults, {} mentions answered, {} failed, {:.0} simulated s per wall s",
        sum.seeds,
        args.seconds,
        cluster.get_name(),
        sum.faults,
        sum.answered,
        sum.failed.len(),
        speed
    );
    // Every option of the run, so that a replay needs nothing else: the
    // seed derives from them only the fault plan, the mentions and turns,
    // and the agent's key.
    if args.cluster == Cluster::Hosts {
        println!("options: {:?}", args.hosts_options());
    } else {
        println!("options: {:?}", args.options());
    }
    if sum.claims.0 > 0 {
        println!(
            "claims: {} made, {} honoured (the claimant acted within the stand-down)",
            sum.claims.0, sum.claims.1
        );
    }
    if sum.forced_by_disk > 0 {
        println!(
            "forced by the disk: {} mentions answered twice, a done refused until its window was gone or a take granted unrecorded while the disk refused writes (counted, not failed)",
            sum.forced_by_disk
        );
    }
    if !sum.latencies.is_empty() {
        let mut l = std::mem::take(&mut sum.latencies);
        l.sort_unstable();
        let at = |q: f64| l[((l.len() - 1) as f64 * q).round() as usize].0;
        let slowest: Vec<String> = (l.iter().rev().take(3))
            .map(|(ms, seed, n)| format!("{ms} ms (seed {seed}, mention {n})"))
            .collect();
        println!(
            "mention → first answer: p50 {} ms, p99 {} ms, max {}; stale bound {} ms",
            at(0.5),
            at(0.99),
            slowest.join(", "),
            args.options().stale.as_millis()
        );
    }
    if sum.dropped_by_cap > 0 {
        println!(
            "dropped by the apps' queue caps: {} mentions never answered (counted, not failed)",
            sum.dropped_by_cap
        );
    }
    if sum.ledger_peak_bytes > 0 {
        println!(
            "work ledger: largest file {:.1} MiB; the simulator's peak memory {}",
            sum.ledger_peak_bytes as f64 / (1024.0 * 1024.0),
            peak_memory().unwrap_or_else(|| "unknown".into())
        );
    }
    if sum.frozen_reply > 0 {
        println!(
            "frozen replies: {} mentions answered twice, a reply decided while its window could act held on its way by a freeze past a takeover (counted, not failed)",
            sum.frozen_reply
        );
    }
    if sum.skipped_after_ledgerless > 0 {
        println!(
            "after a writer without a ledger: {} mentions never answered, published before a harness child's record that no held line names (its window's refused by the disk, or never written), which may have answered them (counted, not failed)",
            sum.skipped_after_ledgerless
        );
    }
    if sum.answered_after_ledgerless > 0 {
        println!(
            "after a writer without a ledger: {} mentions published before it was replaced and answered after, which it may have answered too (Buzz's harness drains its backlog when it gains; counted, not failed)",
            sum.answered_after_ledgerless
        );
    }
    if let Some(a) = sum.across {
        println!(
            "across hosts: {} mentions answered on two hosts ({} under the fall-back, {} taken or answered on a host whose link to etcd was cut or lossy, {} a reply on its way from a window frozen for 2/3 of a TTL), {} twice on one host ({} forced by the disk or a frozen reply), {} never, {} ms with two hosts acting (fall-back), the key moved {} times",
            a.twice_across_hosts, a.twice_under_fallback, a.twice_done_cut_off, a.twice_frozen_reply, a.twice_within_a_host, a.twice_forced_within_a_host, a.unanswered, a.overlap_ms, a.key_moves
        );
    }
    Ok(if sum.failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// This process's peak resident memory (Linux's `VmHWM`), for a long run's
/// report.
fn peak_memory() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(format!("{:.0} MiB", kib as f64 / 1024.0))
}
