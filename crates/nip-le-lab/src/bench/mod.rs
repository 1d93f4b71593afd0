//! `nip-le-lab bench`: every row of the "beyond the spec" table, in spec and
//! extended mode, in one run, with real processes (`nip-le run`) and real
//! signals. Prints p50 / p99 per row and variant, and the spec/extended
//! ratio. `--before EXE` adds the same rows run with another build of
//! `nip-le` (say, the last commit's), so a change is measured against its
//! predecessor side by side, on the same machine, in the same run.

mod faults;
mod floor;
mod hosts;
mod scale;
mod scenarios;
mod turns;
mod work_bound;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use nip_le::{Backend, Mode};

pub use floor::{hold_lock, HoldLockArgs};
use scenarios::Bench;

/// Options of `nip-le-lab bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Runs per latency row and variant (the SIGSTOP, start-together and
    /// queued rows use a quarter, at least 3: each run takes seconds).
    #[arg(long, default_value_t = 20)]
    runs: usize,
    /// Processes for the start-together and scale rows.
    #[arg(long, default_value_t = 64)]
    processes: usize,
    /// Keys per process for the start-together and scale rows.
    #[arg(long, default_value_t = 8)]
    keys: usize,
    /// Another `nip-le` executable (an earlier build) to run every row with
    /// too, in columns of its own.
    #[arg(long)]
    before: Option<PathBuf>,
    /// Only the rows whose key is listed (comma-separated): sigkill,
    /// graceful, claim, foreign, sigstop, start, scale-memory, scale-cpu,
    /// idle, slept, pause, flock,
    /// queued, turn-kill, cross-kill, cross-lost, cross-graceful,
    /// cross-claim, in-process, work-across, work-bound (a 200,000-mention
    /// tenure: take + done empty and at the bound, its successor's debt),
    /// floor (what the OS alone
    /// allows: a killed holder's lock free, a file's open + close, a killed
    /// instance's exit and lock). The cross-host rows (and
    /// work-across, the work ledger's cost with the etcd level on and off)
    /// start a real etcd (Debian's etcd-server); the cross-host rows run in
    /// the extended variants (this build's, and `--before`'s), work-across
    /// in this build only.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    #[command(flatten)]
    timings: nip_le_cli::cli::TimingArgs,
}

/// An executable and a mode: one column group of the table.
#[derive(Debug, Clone)]
pub struct Variant {
    /// Column label.
    pub label: String,
    /// The `nip-le` executable its instances run.
    pub exe: PathBuf,
    /// `--mode` of its instances.
    pub mode: Mode,
    /// `--backend` of its instances (`None`: an earlier build, which may
    /// not know the flag, or spec mode, which uses no backend).
    pub backend: Option<Backend>,
    /// An earlier build (`--before`).
    pub before: bool,
    /// Its `run` takes `--relay`: claims travel as the desktop sends them.
    pub relay: bool,
}

/// One row's samples and the violations seen while taking them.
#[derive(Debug, Default)]
pub struct Row {
    /// One number per run.
    pub samples: Vec<f64>,
    /// What went wrong, one entry per occurrence.
    pub violations: Vec<String>,
    /// What this variant is expected to do wrong (the plain NIP's own
    /// behaviour): printed, never a failure.
    pub notes: Vec<String>,
}

impl Row {
    /// Something the variant did wrong: the measured behaviour of the plain
    /// NIP or of an earlier build (a note), a failure of ours (a violation).
    pub fn shortfall(&mut self, v: &Variant, what: String) {
        if v.mode == Mode::Spec || v.before {
            self.notes.push(what);
        } else {
            self.violations.push(what);
        }
    }
}

/// The `p`th percentile of sorted samples (nearest rank).
fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    pct(&v, 50.0)
}

type Scenario = fn(&Bench, &Variant, &mut Row) -> std::io::Result<()>;
/// A row's scenario, possibly with parameters of its own.
type RowFn = Box<dyn Fn(&Bench, &Variant, &mut Row) -> std::io::Result<()>>;

/// Runs the bench and prints the table; fails on any violation.
pub fn bench(a: BenchArgs) -> Result<ExitCode, nip_le::Error> {
    let cfg = nip_le_cli::cli::config_from(Some(std::env::temp_dir()), &a.timings, None)?;
    let exe = std::env::current_exe().map_err(|e| nip_le::Error::Io {
        path: "<current exe>".into(),
        source: e,
    })?;
    let mut variants = vec![
        Variant {
            label: "spec".into(),
            exe: exe.clone(),
            mode: Mode::Spec,
            backend: None,
            before: false,
            relay: true,
        },
        Variant {
            label: "ext".into(),
            exe: exe.clone(),
            mode: Mode::Extended,
            backend: Some(Backend::Native),
            before: false,
            relay: true,
        },
        // What macOS and Windows run, on this machine.
        Variant {
            label: "portable".into(),
            exe,
            mode: Mode::Extended,
            backend: Some(Backend::Portable),
            before: false,
            relay: true,
        },
    ];
    if let Some(before) = &a.before {
        let relay = takes_relay(before);
        for (label, mode) in [("spec before", Mode::Spec), ("ext before", Mode::Extended)] {
            variants.push(Variant {
                label: label.into(),
                exe: before.clone(),
                mode,
                backend: None,
                before: true,
                relay,
            });
        }
    }
    let b = Bench { cfg: cfg.clone() };
    let slow_runs = (a.runs / 4).max(3);
    println!(
        "nip-le-lab bench: refresh {:?}, stale {:?}, stand-down {:?}, {} runs per row ({} for SIGSTOP, start-together and queued, 3 for idle, slept, pause and flock), {} cores",
        cfg.refresh,
        cfg.stale,
        cfg.stand_down,
        a.runs,
        slow_runs,
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    );
    if let Some(before) = &a.before {
        println!("before: {}", before.display());
    }
    let start_name = format!(
        "{} processes × {} keys start together → settled (ms)",
        a.processes, a.keys
    );
    let (procs, keys) = (a.processes, a.keys);
    let start_together: RowFn = Box::new(move |b, v, r| b.start_together(v, procs, keys, r));
    let scale_memory: RowFn = Box::new(move |b, v, r| b.scale_memory(v, procs, keys, r));
    let scale_cpu: RowFn = Box::new(move |b, v, r| b.scale_cpu(v, procs, keys, r));
    let rows: Vec<RowSpec> = vec![
        row(
            "sigkill",
            "SIGKILL of the leader → a survivor leads (ms)",
            Bench::sigkill,
            a.runs,
        ),
        row(
            "graceful",
            "graceful exit → a survivor leads (ms)",
            Bench::graceful,
            a.runs,
        ),
        row(
            "claim",
            "cooperative claim → the target leads (ms)",
            Bench::claim,
            a.runs,
        ),
        row(
            "foreign",
            "foreign release → reflected in is_leader (ms)",
            Bench::foreign_write,
            a.runs,
        ),
        row(
            "sigstop",
            "SIGSTOP of the leader alone → replaced (ms)",
            Bench::sigstop,
            slow_runs,
        ),
        ("start", start_name, start_together, slow_runs),
        (
            "scale-memory",
            format!(
                "{procs} processes × {keys} keys settled: largest resident memory of one (MiB)"
            ),
            scale_memory,
            3,
        ),
        (
            "scale-cpu",
            format!("{procs} processes × {keys} keys idle: CPU of all, % of one core"),
            scale_cpu,
            3,
        ),
        row(
            "idle",
            "idle observer: voluntary wake-ups per second",
            Bench::idle,
            3,
        ),
        row(
            "slept",
            "machine slept > stale, then woke: leadership moved (1 = yes)",
            Bench::slept,
            3,
        ),
        row(
            "pause",
            "whole cluster paused 3 × stale, resumed in random order → others that led",
            Bench::cluster_pause,
            3,
        ),
        row(
            "flock",
            "peer holds the lock file's flock stale + refresh → mentions answered (%)",
            Bench::flock_hold,
            3,
        ),
        row(
            "queued",
            &format!(
                "claim mid-queue ({} mentions) → still queued answered once (%)",
                turns::QUEUED
            ),
            Bench::queued_claim,
            slow_runs,
        ),
        row(
            "turn-kill",
            "SIGKILL of the leader mid-turn → the turn begun again (ms)",
            Bench::sigkill_mid_turn,
            a.runs,
        ),
        row(
            "cross-kill",
            "across hosts (2×2): SIGKILL of the global leader → acts (ms)",
            Bench::cross_host_kill,
            a.runs,
        ),
        row(
            "cross-lost",
            "across hosts (2×1): the leader's host lost → other acts (ms)",
            Bench::cross_host_lost,
            slow_runs,
        ),
        row(
            "cross-graceful",
            "across hosts (2×1): graceful exit → the other acts (ms)",
            Bench::cross_host_graceful,
            a.runs,
        ),
        row(
            "cross-claim",
            "across hosts (2×1): claim from the other host → it acts (ms)",
            Bench::cross_host_claim,
            a.runs,
        ),
    ];
    let wanted = |key: &str| a.only.is_empty() || a.only.iter().any(|o| o == key);
    let mut table = Vec::new();
    for (_, name, f, runs) in rows.iter().filter(|r| wanted(r.0)) {
        let mut cells: Vec<Row> = variants.iter().map(|_| Row::default()).collect();
        // Variants take turns run by run, so a slow phase of the machine
        // weighs on all of them alike.
        for run in 0..*runs {
            for (v, cell) in variants.iter().zip(cells.iter_mut()) {
                eprint!("\r{name} [{}] run {}/{}   ", v.label, run + 1, runs);
                if let Err(e) = f(&b, v, cell) {
                    cell.violations.push(format!("run failed: {e}"));
                }
            }
        }
        table.push((name.clone(), cells));
    }
    eprintln!("\r{:100}", "");
    let failed = print_table(&variants, &mut table);
    for (label, mode, backend) in [
        ("spec", Mode::Spec, Backend::Native),
        ("extended", Mode::Extended, Backend::Native),
        ("portable", Mode::Extended, Backend::Portable),
    ]
    .into_iter()
    .filter(|_| wanted("in-process"))
    {
        match scenarios::in_process(mode, backend) {
            Ok(r) => println!(
                "in-process [{label}]: is_leader {:.1} ns median (LeaderFlag), refresh of a led key {:.1} µs median (round trip through the writer), take + done of a mention {:.1} µs median, {:.1} µs p99; with {} owed, owed + take + done {:.1} µs median, {:.1} µs p99",
                r.is_leader_ns,
                r.refresh_us,
                r.take_done_us.0,
                r.take_done_us.1,
                scenarios::OWED,
                r.backlog_us.0,
                r.backlog_us.1,
            ),
            Err(e) => println!("in-process [{label}]: failed: {e}"),
        }
    }
    if wanted("work-bound") {
        let n = 200_000;
        match work_bound::work_bound(n) {
            Ok(r) => println!(
                "work ledger at its bound (extended): take + done of a mention {:.0} / {:.0} µs p50 / p99 on an empty ledger, {:.0} / {:.0} µs at the bound after one tenure of {} mentions ({:.1} s, the file at most {:.2} MiB); its successor owed {} of them and {} of {} published after",
                r.empty_us.0,
                r.empty_us.1,
                r.bound_us.0,
                r.bound_us.1,
                r.answered,
                r.tenure.as_secs_f64(),
                r.largest as f64 / 1048576.0,
                r.owed_again,
                r.owed_new.0,
                r.owed_new.1,
            ),
            Err(e) => println!("work ledger at its bound: failed: {e}"),
        }
    }
    if wanted("floor") {
        match floor::lock_release(a.runs, 0).and_then(|s| Ok((s, floor::open_close(a.runs)?))) {
            Ok((s, u)) => println!(
                "the OS alone: a killed holder's exclusive file lock → another process has it {:.2} ms median, {:.2} ms p99 ({} runs; the floor under the SIGKILL row); a file's open + close {:.0} µs median, {:.0} µs p99",
                pct(&s, 50.0),
                pct(&s, 99.0),
                s.len(),
                pct(&u, 50.0),
                pct(&u, 99.0),
            ),
            Err(e) => println!("the OS alone: failed: {e}"),
        }
        // A holder the size of an app process, in threads: how much of a
        // killed process's teardown its threads cost (under Wine, see
        // docs/platforms.md).
        match floor::lock_release(a.runs, floor::APP_THREADS) {
            Ok(s) => println!(
                "the OS alone, a holder with {} idle threads: its lock → another process has it {:.2} ms median, {:.2} ms p99 ({} runs)",
                floor::APP_THREADS,
                pct(&s, 50.0),
                pct(&s, 99.0),
                s.len(),
            ),
            Err(e) => println!("the OS alone, a holder with threads: failed: {e}"),
        }
        match floor::instance_release(a.runs) {
            Ok(r) => println!(
                "the OS and a real instance: a killed portable leader reaped {:.2} ms median, {:.2} ms p99; its presence lock read free {:.2} ms median, {:.2} ms p99; the slowest probe of a run {:.0} µs median, {:.0} µs p99 ({} runs)",
                pct(&r.reaped_ms, 50.0),
                pct(&r.reaped_ms, 99.0),
                pct(&r.free_ms, 50.0),
                pct(&r.free_ms, 99.0),
                pct(&r.slowest_probe_us, 50.0),
                pct(&r.slowest_probe_us, 99.0),
                r.free_ms.len(),
            ),
            Err(e) => println!("the OS and a real instance: failed: {e}"),
        }
    }
    if wanted("work-across") {
        // The same mentions with the etcd level off and on, one run.
        for etcd in [false, true] {
            let label = if etcd { "extended + etcd" } else { "extended" };
            match hosts::in_process_work(etcd, 300) {
                Ok(c) => {
                    let recorded = c.recorded.map_or(String::new(), |(m, p)| {
                        format!(
                            "; the done in etcd {m:.0} µs median, {p:.0} µs p99 after it returned"
                        )
                    });
                    println!(
                        "work across hosts [{label}]: take + done of a mention {:.1} µs median, {:.1} µs p99{recorded}",
                        c.agent.0, c.agent.1
                    );
                }
                Err(e) => println!("work across hosts [{label}]: failed: {e}"),
            }
        }
    }
    hosts::stop_etcd();
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Whether `exe run` takes `--relay` (builds before it send claims as lead
/// requests only, which a spec-mode instance does not read: without the
/// relay, a spec claim of such a build never reaches its leader).
fn takes_relay(exe: &std::path::Path) -> bool {
    std::process::Command::new(exe)
        .args(["run", "--help"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("--relay"))
}

/// A row: its key for `--only`, its label, its scenario and its runs.
type RowSpec = (&'static str, String, RowFn, usize);

fn row(key: &'static str, name: &str, f: Scenario, runs: usize) -> RowSpec {
    (key, name.to_owned(), Box::new(f), runs)
}

/// Prints the table with each cell's violations and notes; returns whether
/// any violation was seen.
fn print_table(variants: &[Variant], table: &mut [(String, Vec<Row>)]) -> bool {
    println!();
    let mut header = format!("{:<60}", "row");
    for v in variants {
        header += &format!(" | {:>11} {:>8}", format!("{} p50", v.label), "p99");
    }
    header += " | spec/ext p50";
    println!("{header}");
    let mut failed = false;
    for (name, cells) in table.iter_mut() {
        let mut line = format!("{name:<60}");
        for c in cells.iter_mut() {
            c.samples.sort_by(f64::total_cmp);
            line += &format!(
                " | {:>11} {:>8}",
                cell(pct(&c.samples, 50.0)),
                cell(pct(&c.samples, 99.0))
            );
        }
        let (s50, e50) = (pct(&cells[0].samples, 50.0), pct(&cells[1].samples, 50.0));
        line += &format!(" | {:>8}", ratio(s50, e50));
        println!("{line}");
        for (v, c) in variants.iter().zip(cells.iter()) {
            failed |= !c.violations.is_empty();
            print_counted(&v.label, "", &c.violations);
            print_counted(&v.label, " (expected)", &c.notes);
        }
    }
    failed
}

/// Each distinct entry of `what` once, with how often it happened.
fn print_counted(label: &str, suffix: &str, what: &[String]) {
    let mut kinds = what.to_vec();
    kinds.sort();
    kinds.dedup();
    for x in kinds {
        let n = what.iter().filter(|y| **y == x).count();
        println!("    {label}{suffix}: {x} ({n}×)");
    }
}

/// A percentile, or a dash when the row has no sample (a row an earlier
/// build cannot run).
fn cell(x: f64) -> String {
    if x.is_nan() {
        "—".into()
    } else {
        format!("{x:.1}")
    }
}

fn ratio(spec: f64, ext: f64) -> String {
    if spec.is_nan() || ext.is_nan() {
        return "—".into();
    }
    if ext > 0.0 && spec / ext >= 10.0 {
        format!("{:.0}×", spec / ext)
    } else if ext > 0.0 {
        format!("{:.2}×", spec / ext)
    } else {
        format!(">{spec:.0}×")
    }
}
