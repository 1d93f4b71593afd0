//! `nip-le-lab chaos`: extended and spec-only instances on one lock directory,
//! with a mention feed, under random SIGKILL, SIGTERM, SIGSTOP/SIGCONT,
//! restarts and cooperative claims; with `--hosts N`, instances spread over
//! simulated hosts that share a real etcd, which is paused too; with
//! `--children`, every extended window has a [`harness`] child carrying its
//! instance id. Four parts: the fault [`plan`], the
//! [`runner`] that carries it out on real processes, the pure [`analysis`]
//! of what the instances reported and replied, and the [`report`].
//!
//! It fails on a duplicate reply (split-brain with user impact) that the
//! NIP's own rules do not force (see [`analysis`]). Misses are reported:
//! no live leader after a death or during a hang, and the zero-leader gap of
//! a handoff.

pub mod analysis;
pub mod disk_full;
pub mod etcd_faults;
pub mod harness;
pub mod instance_logs;
pub mod outcome;
pub mod plan;
pub mod report;
pub mod runner;
pub mod slow;

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use nip_le_cli::drive::cluster::{random_pubkey, RunOptions};
use nip_le_cli::lines::ReplyLine;
use nip_le_cli::unix_ms;

/// Options of `nip-le-lab chaos`.
#[derive(Args, Debug)]
pub struct ChaosArgs {
    /// How long to inject faults, in seconds.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Extended-mode instances.
    #[arg(long, default_value_t = 4)]
    extended: usize,
    /// Spec-only instances [default: 2, or 0 with --turn-ms].
    #[arg(long)]
    spec: Option<usize>,
    /// Simulated agent turns of this many milliseconds (`nip-le run
    /// --turn-ms`): every instance queues every mention and the leader works
    /// them through the work ledger; at the end the cluster is resumed and
    /// drained, and any duplicate or miss among extended instances fails.
    #[arg(long)]
    turn_ms: Option<u64>,
    /// Mean pause between faults and mentions, in milliseconds.
    #[arg(long, default_value_t = 250)]
    pace_ms: u64,
    /// Refresh interval [default: 300 ms for chaos].
    #[arg(long, default_value_t = 300)]
    refresh_ms: u64,
    /// Stale bound [default: 1200 ms for chaos].
    #[arg(long, default_value_t = 1200)]
    stale_ms: u64,
    /// Stand-down timeout [default: 1200 ms for chaos].
    #[arg(long, default_value_t = 1200)]
    stand_down_ms: u64,
    /// Seed of the fault plan [default: from the clock and pid].
    #[arg(long)]
    seed: Option<u64>,
    /// Keep the temporary directory (lock dir, feed, replies, ledger) and
    /// print its path.
    #[arg(long)]
    keep: bool,
    /// Where the lock directories go (default: the run's temporary
    /// directory): a filesystem that can fill up, as
    /// `scripts/chaos-disk-full.sh` gives it, while the feed and the
    /// replies stay where the run's own writes succeed.
    #[arg(long)]
    locks_on: Option<std::path::PathBuf>,
    /// Fill the filesystem of `--locks-on` for this many seconds every
    /// `--fill-every-s` (it must be one the run may fill: a small tmpfs,
    /// see `scripts/chaos-disk-full.sh`). Duplicates answered by a window
    /// leading by the NIP's fail-safe while it was full are counted apart.
    #[arg(long, requires = "locks_on")]
    fill_locks_fs_s: Option<u64>,
    /// See `--fill-locks-fs-s`.
    #[arg(long, default_value_t = 16)]
    fill_every_s: u64,
    /// Simulated hosts (a lock dir and a host id each) sharing a real etcd
    /// on loopback (Debian's etcd-server): instances are dealt to hosts in
    /// turn and run with `--etcd`, and etcd itself is paused now and then.
    #[arg(long, default_value_t = 1)]
    hosts: usize,
    /// Cross-host runs: etcd members (a cluster on loopback whose peer
    /// traffic the lab can cut): members are also restarted, and one at a
    /// time cut from the others.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=5))]
    etcd_members: u64,
    /// Cross-host runs: etcd as production runs it, TLS with client
    /// certificates required and users (the windows' role covers the key
    /// prefix only), with a certificate authority made for the run.
    #[arg(long)]
    etcd_secure: bool,
    /// Give every extended window a harness child that carries its
    /// instance id (INTEROP.md's writer, run with `python3`): it rewrites
    /// the record with its own pid every refresh and truncates the file
    /// when it exits; children are killed, stopped and restarted too.
    #[arg(long, conflicts_with = "hosts")]
    children: bool,
    /// Cross-host runs: the etcd lease TTL in seconds.
    #[arg(long, default_value_t = 2)]
    etcd_ttl_s: u64,
    /// The extended instances' `--backend` (`portable`: what macOS and
    /// Windows run) [default: $NIP_LE_BACKEND or native].
    #[arg(long)]
    backend: Option<nip_le::Backend>,
}

/// Runs chaos; fails on a split-brain the NIP does not force.
pub fn chaos(a: ChaosArgs) -> Result<ExitCode, nip_le::Error> {
    let io =
        |path: std::path::PathBuf| move |e: std::io::Error| nip_le::Error::Io { path, source: e };
    let tmp = tempfile::Builder::new()
        .prefix("nip-le-chaos-")
        .tempdir()
        .map_err(io(std::env::temp_dir()))?;
    let timings = nip_le_cli::cli::TimingArgs {
        refresh_ms: Some(a.refresh_ms),
        stale_ms: Some(a.stale_ms),
        stand_down_ms: Some(a.stand_down_ms),
        reply_flight_ms: None,
        mode: None,
        backend: a.backend,
    };
    // The same validation every instance will apply.
    let locks_on = a
        .locks_on
        .clone()
        .unwrap_or_else(|| tmp.path().to_path_buf());
    let cfg = nip_le_cli::cli::config_from(Some(locks_on.join("locks")), &timings, None)?;
    let mentions = tmp.path().join("mentions.jsonl");
    let replies = tmp.path().join("replies.jsonl");
    for f in [&mentions, &replies] {
        std::fs::File::create(f).map_err(io(f.clone()))?;
    }
    let exe = std::env::current_exe().map_err(io("<exe>".into()))?;
    let mut opts = RunOptions::new(&exe, &cfg.lock_dir, random_pubkey()).timings(
        a.refresh_ms,
        a.stale_ms,
        a.stand_down_ms,
    );
    opts.feed = Some((mentions.clone(), replies.clone()));
    // Claims travel as the desktop sends them, through the relay.
    opts.relay = Some(tmp.path().join("relay.jsonl"));
    if let Some(t) = a.turn_ms {
        opts.extra_args = vec!["--turn-ms".into(), t.to_string()];
    }
    opts.extra_args
        .extend(["--backend".into(), cfg.backend.as_str().into()]);
    let spec = a.spec.unwrap_or(if a.turn_ms.is_some() || a.hosts > 1 {
        0
    } else {
        2
    });
    let seed = a
        .seed
        .unwrap_or_else(|| unix_ms() ^ (u64::from(std::process::id()) << 32));
    println!(
        "nip-le-lab chaos: {} extended ({} backend) + {spec} spec instances, {} s, refresh {} ms, stale {} ms{}, seed {seed}",
        a.extended,
        cfg.backend.as_str(),
        a.seconds,
        a.refresh_ms,
        a.stale_ms,
        a.turn_ms.map_or(String::new(), |t| format!(", turns of {t} ms"))
    );
    let mut plan = plan::Plan::new(seed, a.stale_ms);
    if a.children {
        plan = plan.with_children();
        println!("  every extended window has a harness child carrying its id");
    }
    let mut logs = None;
    let mut runner = if a.hosts > 1 {
        use etcd_faults::SharedEtcd;
        let members = a.etcd_members as usize;
        let etcd = if a.etcd_secure {
            let secure = crate::etcd_secure::Secure::new(tmp.path()).map_err(io(tmp.path().into()))?;
            SharedEtcd::Cluster(
                crate::etcd::Cluster::start_secure(members, secure).map_err(io("<etcd>".into()))?,
            )
        } else if members > 1 {
            SharedEtcd::Cluster(crate::etcd::Cluster::start(members).map_err(io("<etcd>".into()))?)
        } else {
            SharedEtcd::One(crate::etcd::Etcd::start().map_err(io("<etcd>".into()))?)
        };
        println!(
            "  {} hosts sharing etcd ({} member{} at {}; lease TTL {} s); etcd is paused and members restarted now and then{}",
            a.hosts,
            members,
            if members > 1 { "s" } else { "" },
            etcd.urls_for(0).join(", "),
            a.etcd_ttl_s,
            if members > 1 { ", one at a time cut from the others" } else { "" }
        );
        if a.etcd_secure {
            println!("  etcd over TLS with client certificates required, and users: the windows' role covers /nip-le/ only");
        }
        plan = plan
            .with_etcd_pauses(a.etcd_ttl_s * 1000)
            .with_etcd_members(members);
        let hosts = (0..a.hosts)
            .map(|h| {
                let mut o = opts.clone();
                o.lock_dir = locks_on.join(format!("locks-host{h}"));
                for url in etcd.urls_for(h) {
                    o.extra_args.extend(["--etcd".into(), url]);
                }
                o.extra_args.extend(etcd.window_args());
                o.extra_args.extend([
                    "--host-id".into(),
                    format!("host{h}"),
                    "--etcd-ttl-s".into(),
                    a.etcd_ttl_s.to_string(),
                ]);
                o
            })
            .collect();
        let faults = etcd_faults::EtcdFaults::new(etcd);
        let dir = tmp.path().join("instance-logs");
        logs = Some(instance_logs::InstanceLogs::new(dir.clone()).map_err(io(dir))?);
        println!("  each window logs its etcd calls (NIP_LE_LOG {:?} unless set): a failing duplicate prints its repliers' lines", instance_logs::FILTER);
        runner::Runner::start_on_hosts(hosts, Some(faults), logs.clone(), mentions, a.extended, spec)
    } else {
        runner::Runner::start(opts.clone(), mentions, a.extended, spec)
    }
    .map_err(io(exe.clone()))?;
    if a.children {
        let h = harness::Harness::new(
            tmp.path(),
            &cfg.lock_dir,
            opts.pubkey.as_str(),
            a.refresh_ms,
            a.stale_ms,
        )
        .map_err(io(tmp.path().join("harness.py")))?;
        runner = runner.with_children(h).map_err(io("python3".into()))?;
    }
    if let (Some(full), Some(dir)) = (a.fill_locks_fs_s, &a.locks_on) {
        let every = Duration::from_secs(a.fill_every_s);
        let filler = disk_full::DiskFiller::new(dir.clone(), Duration::from_secs(full), every);
        runner = runner.with_filler(filler);
    }
    runner
        .run(&mut plan, a.seconds, a.pace_ms)
        .map_err(io(exe.clone()))?;
    let faults = runner.counts_line();
    let settle = Duration::from_millis(a.stale_ms + 3 * a.refresh_ms);
    // With turns, the queue left at the end is worked off: let it drain.
    let max_drain = match a.turn_ms {
        Some(t) => Duration::from_secs(120).min(Duration::from_millis(t * 1000 + 30_000)),
        None => Duration::ZERO,
    };
    let replies_file = replies.clone();
    let outcome = runner
        .finish(settle, max_drain, |out| {
            let answered = ReplyLine::read_all(&replies_file);
            out.sent
                .iter()
                .all(|(id, _)| answered.iter().any(|r| r.mention_id() == *id))
        })
        .map_err(io(exe.clone()))?;
    let mut outcome = outcome;
    // A whole TTL of silence before the fall-back, and the hosts settle
    // again after etcd returns.
    outcome.etcd_grace_ms = 2 * a.etcd_ttl_s * 1000 + 1000;
    outcome.etcd_members = a.etcd_members as usize;
    let summary = analysis::analyse(&outcome, &ReplyLine::read_all(&replies), a.refresh_ms);
    if let Some(logs) = &logs {
        print_repliers_logs(&summary, logs);
    }
    if a.keep {
        let timeline = tmp.path().join("timeline.txt");
        if let Err(e) = std::fs::write(&timeline, report::timeline(&outcome)) {
            eprintln!("chaos: {}: {e}", timeline.display());
        }
        println!("  files kept in {}", tmp.keep().display());
    }
    if a.turn_ms.is_some() {
        println!("  the slowest mentions (ms from publication):");
        for line in slow::slowest(&outcome, &ReplyLine::read_all(&replies), 5) {
            println!("    {line}");
        }
    }
    let passed = match a.turn_ms {
        Some(_) => report::print_turns(&summary, a.seconds, &faults, spec == 0),
        None => report::print(&summary, a.seconds, &faults),
    };
    Ok(if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// For each unexplained duplicate, what each replier logged from 3 s before
/// the mention to 2 s after its reply.
fn print_repliers_logs(summary: &analysis::Summary, logs: &instance_logs::InstanceLogs) {
    for (at, repliers) in &summary.unexplained_replies {
        for (id, t) in repliers {
            println!("  {id}'s log from 3 s before the mention to 2 s after its reply:");
            for line in logs.excerpt(id, at.saturating_sub(3000), t.saturating_add(2000)) {
                println!("    {line}");
            }
        }
    }
}
