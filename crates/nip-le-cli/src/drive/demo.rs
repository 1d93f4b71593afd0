//! `nip-le demo`: the README's main job. Spawns several `nip-le run`
//! instances of one agent in a temporary lock directory with a shared mention
//! feed, and narrates: who leads, a SIGKILL of the leader and the failover, a
//! cooperative claim, a graceful exit. Mentions are sent only while the
//! election is settled (the invariant must hold then); the summary counts
//! replies per mention and exits non-zero on any duplicate or miss.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use nip_le::ChangeReason;

use super::cluster::{
    first_new_leader, lock_holder, random_pubkey, wait_until, Instance, RunOptions,
};
use crate::lines::{Line, MentionLine, ReplyLine};
use crate::unix_ms;

/// Options of `nip-le demo`.
#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Number of instances (at least 3).
    #[arg(long, default_value_t = 3)]
    instances: usize,
    #[command(flatten)]
    timings: crate::cli::TimingArgs,
    /// Mentions sent in each settled phase.
    #[arg(long, default_value_t = 5)]
    mentions_per_phase: usize,
    /// Keep the temporary directory (its path is printed).
    #[arg(long)]
    keep: bool,
}

struct Demo {
    start: Instant,
    instances: usize,
    insts: Vec<Instance>,
    opts: RunOptions,
    lock_path: PathBuf,
    mentions: PathBuf,
    replies: PathBuf,
    next_mention: usize,
    sent: Vec<(String, &'static str)>,
    failures: Vec<String>,
    timings: Vec<(&'static str, Option<u64>)>,
    refresh: Duration,
    stale: Duration,
    stand_down: Duration,
}

impl Demo {
    fn say(&self, msg: &str) {
        println!("[{:>6.2}s] {msg}", self.start.elapsed().as_secs_f64());
        let _ = std::io::stdout().flush();
    }

    fn live(&self) -> impl Iterator<Item = &Instance> {
        self.insts.iter().filter(|i| !i.exited())
    }

    fn name_of(&self, instance_id: &str) -> String {
        self.insts
            .iter()
            .find(|i| i.instance_id == instance_id)
            .map(|i| i.name.clone())
            .unwrap_or_else(|| format!("foreign {instance_id}"))
    }

    /// Exactly one live instance reports leadership and the file names it.
    fn settled_leader(&self) -> Option<usize> {
        let leaders: Vec<usize> = (0..self.insts.len())
            .filter(|&i| !self.insts[i].exited() && self.insts[i].is_leader() == Some(true))
            .collect();
        let all_reported = self.live().all(|i| i.is_leader().is_some());
        match leaders.as_slice() {
            [one]
                if all_reported
                    && lock_holder(&self.lock_path).as_deref()
                        == Some(&self.insts[*one].instance_id) =>
            {
                Some(*one)
            }
            _ => None,
        }
    }

    fn wait_settled(&mut self, phase: &str) -> Option<usize> {
        let deadline = self.stale + self.stand_down + self.refresh * 3;
        let mut found = None;
        wait_until(deadline, || {
            found = self.settled_leader();
            found.is_some()
        });
        match found {
            Some(l) => {
                let observers: Vec<_> = self
                    .live()
                    .filter(|i| i.is_leader() == Some(false))
                    .map(|i| i.name.clone())
                    .collect();
                self.say(&format!(
                    "settled: {} leads; {} observe{}",
                    self.insts[l].name,
                    if observers.is_empty() {
                        "no one else".into()
                    } else {
                        observers.join(", ")
                    },
                    if observers.len() <= 1 { "s" } else { "" },
                ));
            }
            None => self.fail(format!(
                "{phase}: the election did not settle within {deadline:?}"
            )),
        }
        found
    }

    fn fail(&mut self, why: String) {
        self.say(&format!("FAILED: {why}"));
        self.failures.push(why);
    }

    /// Appends mentions to the shared feed and waits until every live
    /// instance has seen them.
    fn mentions(&mut self, phase: &'static str, n: usize) {
        let mut ids = Vec::new();
        for _ in 0..n {
            self.next_mention += 1;
            let id = format!("m{}", self.next_mention);
            let mention = MentionLine {
                id: id.clone().into(),
                at_ms: None,
            };
            let line = format!(
                "{}\n",
                serde_json::to_string(&mention).expect("strings and numbers")
            );
            if let Err(e) = std::fs::OpenOptions::new()
                .append(true)
                .open(&self.mentions)
                .and_then(|mut f| f.write_all(line.as_bytes()))
            {
                self.fail(format!("cannot append to the mention feed: {e}"));
                return;
            }
            self.sent.push((id.clone(), phase));
            ids.push(id);
            std::thread::sleep(Duration::from_millis(20));
        }
        let all_seen = wait_until(Duration::from_secs(5), || {
            self.live().all(|i| {
                let seen: Vec<_> = i
                    .reports()
                    .into_iter()
                    .filter_map(|r| match r.line {
                        Line::Mention { id, .. } => id.as_str().map(str::to_owned),
                        _ => None,
                    })
                    .collect();
                ids.iter().all(|id| seen.contains(id))
            })
        });
        if !all_seen {
            self.fail(format!(
                "{phase}: not every instance saw the mentions within 5 s"
            ));
        }
        let counts = reply_counts(&self.replies);
        let got: Vec<_> = ids
            .iter()
            .map(|id| counts.get(id).map_or(0, Vec::len))
            .collect();
        let by: Vec<_> = ids
            .iter()
            .filter_map(|id| {
                counts
                    .get(id)
                    .and_then(|v| v.first())
                    .map(|who| self.name_of(who))
            })
            .collect();
        self.say(&format!(
            "{n} mentions fanned out to {} instances → replies per mention {:?} (by {})",
            self.live().count(),
            got,
            dedup(by).join(", ")
        ));
    }

    /// Waits for a survivor of `gone` to lead and records how long after
    /// `t0` (unix ms) it did.
    fn measure_takeover(
        &mut self,
        cursors: &[usize],
        gone: usize,
        t0: u64,
        deadline: Duration,
        label: &'static str,
        after: &str,
    ) {
        match first_new_leader(&self.insts, cursors, Some(gone), deadline) {
            Some((i, at)) => {
                let ms = at.saturating_sub(t0);
                self.say(&format!("{} leads {ms} ms {after}", self.insts[i].name));
                self.timings.push((label, Some(ms)));
            }
            None => {
                self.fail(format!(
                    "{label}: no survivor took over within {deadline:?}"
                ));
                self.timings.push((label, None));
            }
        }
    }

    fn cursors(&self) -> Vec<usize> {
        self.insts.iter().map(Instance::cursor).collect()
    }
}

fn dedup(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v.dedup();
    if v.is_empty() {
        v.push("nobody".into());
    }
    v
}

fn reply_counts(replies: &Path) -> BTreeMap<String, Vec<String>> {
    let mut m: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in ReplyLine::read_all(replies) {
        m.entry(r.mention_id()).or_default().push(r.instance_id);
    }
    m
}

/// Runs the narrated demo; exits non-zero if the invariant broke.
pub fn demo(a: DemoArgs) -> Result<ExitCode, nip_le::Error> {
    if a.instances < 3 {
        eprintln!(
            "nip-le demo: --instances must be at least 3 (one is killed, one exits, one remains)"
        );
        return Ok(ExitCode::from(2));
    }
    let tmp = tempfile::Builder::new()
        .prefix("nip-le-demo-")
        .tempdir()
        .map_err(|e| nip_le::Error::Io {
            path: std::env::temp_dir(),
            source: e,
        })?;
    let lock_dir = tmp.path().join("leader-locks");
    // Same flags and validation as every instance will apply.
    let cfg = crate::cli::config_from(Some(lock_dir.clone()), &a.timings, None)?;
    let pubkey = random_pubkey();
    let mut d = Demo::new(&cfg, tmp.path(), &lock_dir, pubkey)?;
    d.say(&format!(
        "NIP-LE demo: {} instances of agent {}… in {}",
        a.instances,
        &pubkey.as_str()[..12],
        tmp.path().display()
    ));
    d.say(&format!(
        "timings: refresh {:?}, stale {:?}, stand-down {:?}; mode {}",
        cfg.refresh,
        cfg.stale,
        cfg.stand_down,
        cfg.mode.as_str()
    ));
    let n = a.mentions_per_phase;
    d.instances = a.instances;
    let phases: [(&str, Phase); 4] = [
        ("launch", Demo::launch_phase),
        ("failover", Demo::crash_phase),
        ("claim", Demo::claim_phase),
        ("graceful exit", Demo::exit_phase),
    ];
    let mut leader = None;
    for (name, phase) in phases {
        phase(&mut d, leader)?;
        leader = d.wait_settled(name);
        if leader.is_none() {
            break;
        }
        d.mentions(name, n);
    }
    finish(d, tmp, a.keep)
}

/// One step of the demo, given the settled leader before it.
type Phase = fn(&mut Demo, Option<usize>) -> Result<(), nip_le::Error>;

impl Demo {
    fn new(
        cfg: &nip_le::Config,
        tmp: &Path,
        lock_dir: &Path,
        pubkey: nip_le::AgentPubkey,
    ) -> Result<Self, nip_le::Error> {
        let mentions = tmp.join("mentions.jsonl");
        let replies = tmp.join("replies.jsonl");
        for f in [&mentions, &replies] {
            std::fs::File::create(f).map_err(|e| nip_le::Error::Io {
                path: f.clone(),
                source: e,
            })?;
        }
        let exe = std::env::current_exe().map_err(|e| nip_le::Error::Io {
            path: "<current exe>".into(),
            source: e,
        })?;
        let mut opts = RunOptions::new(exe, lock_dir, pubkey).timings(
            ms(cfg.refresh),
            ms(cfg.stale),
            ms(cfg.stand_down),
        );
        opts.extra_args = vec!["--mode".into(), cfg.mode.as_str().into()];
        opts.feed = Some((mentions.clone(), replies.clone()));
        // Claims travel as the desktop sends them, through the relay.
        opts.relay = Some(tmp.join("relay.jsonl"));
        Ok(Self {
            start: Instant::now(),
            instances: 3,
            insts: Vec::new(),
            opts,
            lock_path: nip_le::lockfile::lock_path(lock_dir, &pubkey),
            mentions,
            replies,
            next_mention: 0,
            sent: Vec::new(),
            failures: Vec::new(),
            timings: Vec::new(),
            refresh: cfg.refresh,
            stale: cfg.stale,
            stand_down: cfg.stand_down,
        })
    }

    /// Phase 1: everyone starts at once.
    fn launch_phase(d: &mut Demo, _: Option<usize>) -> Result<(), nip_le::Error> {
        for n in 0..d.instances {
            let name = ((b'A' + (n % 26) as u8) as char).to_string();
            let inst = Instance::spawn(&name, d.opts.command(None), Duration::from_secs(10))
                .map_err(|e| nip_le::Error::Io {
                    path: d.opts.exe.clone(),
                    source: e,
                })?;
            d.say(&format!(
                "started {name}: pid {}, instance id {}",
                inst.pid, inst.instance_id
            ));
            d.insts.push(inst);
        }
        Ok(())
    }

    /// Phase 2: SIGKILL the leader; no release, the survivors must notice.
    /// A crash lands at a random moment of the refresh cycle, so the kill
    /// does too.
    fn crash_phase(d: &mut Demo, leader: Option<usize>) -> Result<(), nip_le::Error> {
        let Some(leader) = leader else { return Ok(()) };
        let phase = Duration::from_millis(
            (uuid::Uuid::new_v4().as_u128() % d.refresh.as_millis().max(1)) as u64,
        );
        d.say(&format!(
            "waiting a random {} ms of the refresh cycle before the crash",
            phase.as_millis()
        ));
        std::thread::sleep(phase);
        let cursors = d.cursors();
        let t0 = unix_ms();
        d.say(&format!(
            "SIGKILL {} (the leader, pid {})",
            d.insts[leader].name, d.insts[leader].pid
        ));
        if let Err(e) = d.insts[leader].kill_and_reap() {
            d.fail(format!("cannot kill the leader: {e}"));
        }
        let deadline = d.stale + d.refresh * 3;
        d.measure_takeover(
            &cursors,
            leader,
            t0,
            deadline,
            "failover after SIGKILL",
            "after the kill",
        );
        Ok(())
    }

    /// Phase 3: cooperative claim from an observer (the sidebar's "claim").
    fn claim_phase(d: &mut Demo, leader: Option<usize>) -> Result<(), nip_le::Error> {
        let Some(leader) = leader else { return Ok(()) };
        let Some(claimer) = (0..d.insts.len()).find(|&i| i != leader && !d.insts[i].exited())
        else {
            d.fail("no observer left to claim".into());
            return Ok(());
        };
        let cursors = d.cursors();
        let t0 = unix_ms();
        d.say(&format!("{} asks to lead (claim)", d.insts[claimer].name));
        if let Err(e) = d.insts[claimer].send("claim") {
            d.fail(format!("cannot send claim: {e}"));
        }
        let bound = d.stand_down + d.refresh * 3;
        let stood = d.insts[leader].wait_after(cursors[leader], bound, |r| {
            r.leadership()
                .is_some_and(|l| l.reason == ChangeReason::StoodDown)
        });
        match stood.as_ref().and_then(|r| r.at_ms()) {
            Some(at) => d.say(&format!(
                "{} stood down {} ms after the claim (hard-steal: cancel its in-flight turn)",
                d.insts[leader].name,
                at.saturating_sub(t0)
            )),
            None => d.fail(format!("{} did not stand down", d.insts[leader].name)),
        }
        let led =
            d.insts[claimer].wait_after(cursors[claimer], bound, |r| r.is_leader() == Some(true));
        match led.as_ref().and_then(|r| r.leadership()) {
            Some(l) => {
                let ms = l.at_ms.saturating_sub(t0);
                d.say(&format!(
                    "{} leads {ms} ms after its claim ({})",
                    d.insts[claimer].name,
                    l.reason.as_str()
                ));
                d.timings.push(("cooperative claim", Some(ms)));
            }
            None => {
                d.fail(format!("{} never took the lead", d.insts[claimer].name));
                d.timings.push(("cooperative claim", None));
            }
        }
        Ok(())
    }

    /// Phase 4: graceful exit of the leader; it releases on SIGTERM.
    fn exit_phase(d: &mut Demo, leader: Option<usize>) -> Result<(), nip_le::Error> {
        let Some(leader) = leader else { return Ok(()) };
        let cursors = d.cursors();
        let t0 = unix_ms();
        d.say(&format!(
            "SIGTERM {} (the leader): graceful exit releases the lock",
            d.insts[leader].name
        ));
        #[cfg(unix)]
        let _ = d.insts[leader].signal(libc::SIGTERM);
        match d.insts[leader].wait_exit(Duration::from_secs(5)) {
            Some(st) if st.success() => d.say(&format!("{} stopped cleanly", d.insts[leader].name)),
            other => d.fail(format!(
                "{} did not exit cleanly: {other:?}",
                d.insts[leader].name
            )),
        }
        let deadline = d.stale + d.refresh * 3;
        d.measure_takeover(
            &cursors,
            leader,
            t0,
            deadline,
            "takeover after graceful exit",
            "after the exit",
        );
        Ok(())
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn finish(mut d: Demo, tmp: tempfile::TempDir, keep: bool) -> Result<ExitCode, nip_le::Error> {
    for i in d.insts.iter_mut() {
        let _ = i.kill_and_reap();
    }
    let counts = reply_counts(&d.replies);
    let mut per_phase: BTreeMap<&str, (usize, usize, usize, usize)> = BTreeMap::new();
    for (id, phase) in &d.sent {
        let n = counts.get(id).map_or(0, Vec::len);
        let e = per_phase.entry(phase).or_default();
        e.0 += 1;
        match n {
            1 => e.1 += 1,
            0 => e.3 += 1,
            _ => e.2 += 1,
        }
    }
    println!();
    println!("summary");
    println!(
        "  {:<22} {:>8} {:>11} {:>10} {:>7}",
        "phase", "mentions", "one reply", "duplicate", "missed"
    );
    let (mut dup, mut miss) = (0, 0);
    for (phase, (n, one, dups, misses)) in &per_phase {
        println!("  {phase:<22} {n:>8} {one:>11} {dups:>10} {misses:>7}");
        dup += dups;
        miss += misses;
    }
    for (what, ms) in &d.timings {
        match ms {
            Some(ms) => println!("  {what:<30} {ms:>6} ms"),
            None => println!("  {what:<30}   none"),
        }
    }
    if dup + miss > 0 {
        d.failures
            .push(format!("{dup} duplicate and {miss} missed replies"));
    }
    if keep {
        let p = tmp.keep();
        println!("  files kept in {}", p.display());
    }
    if d.failures.is_empty() {
        println!("invariant held: every mention got exactly one reply");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("invariant FAILED: {}", d.failures.join("; "));
        Ok(ExitCode::FAILURE)
    }
}
