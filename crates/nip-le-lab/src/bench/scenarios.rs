//! The rows of `nip-le-lab bench`, one function per scenario, each run against
//! one [`Variant`] (an executable and a mode) with real processes and real
//! signals. Latencies are taken from the instances' own reports (`at_ms`,
//! stamped when their cached answer changed) against the moment the bench
//! acted, on the same clock. Faults land at a random point of the refresh
//! cycle, as real crashes do.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use nip_le::{AgentPubkey, Backend, Config, Elector, InstanceId, Mode, QueuedEvent};

use super::{Row, Variant};
use nip_le_cli::drive::cluster::{
    first_new_leader, lock_holder, random_pubkey, wait_until, Instance, RunOptions,
};
use nip_le_cli::unix_ms;

/// A uniformly random duration below `d`.
pub(super) fn random_below(d: Duration) -> Duration {
    Duration::from_micros((uuid::Uuid::new_v4().as_u128() % d.as_micros().max(1)) as u64)
}

/// What the instances of a bench cluster do with a mention feed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Feed {
    /// No feed.
    None,
    /// Reply to each mention at once while leading.
    Replies,
    /// `--turn-ms`: work the queue one turn at a time.
    Turns(u64),
    /// No feed and no relay follower (whose 5 ms poll would be all an idle
    /// observer does): nothing runs but the election.
    Quiet,
}

/// The bench's timings, shared by every scenario.
pub struct Bench {
    /// The validated timings every instance runs with.
    pub cfg: Config,
}

impl Bench {
    fn opts(&self, dir: &Path, pk: AgentPubkey, v: &Variant) -> RunOptions {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let mut o = RunOptions::new(&v.exe, dir, pk).timings(
            ms(self.cfg.refresh),
            ms(self.cfg.stale),
            ms(self.cfg.stand_down),
        );
        o.extra_args = vec!["--mode".into(), v.mode.as_str().into()];
        if let Some(b) = v.backend {
            o.extra_args.extend(["--backend".into(), b.as_str().into()]);
        }
        if !v.relay {
            // A build without `--relay`: its claims use the lead request in
            // both modes.
            return o;
        }
        // Claims travel as the desktop sends them, through the relay.
        o.relay(dir.join("relay.jsonl"))
    }

    /// `n` instances of one election, settled with exactly one leader.
    pub(super) fn cluster(
        &self,
        v: &Variant,
        n: usize,
    ) -> std::io::Result<(tempfile::TempDir, AgentPubkey, Vec<Instance>, usize)> {
        self.cluster_with(v, n, Feed::None)
    }

    /// [`Bench::cluster`]; with a [`Feed`], the instances follow the feed
    /// `mentions.jsonl` (replies in `replies.jsonl`) of the returned
    /// directory.
    pub(super) fn cluster_with(
        &self,
        v: &Variant,
        n: usize,
        feed: Feed,
    ) -> std::io::Result<(tempfile::TempDir, AgentPubkey, Vec<Instance>, usize)> {
        let tmp = tempfile::tempdir()?;
        let pk = random_pubkey();
        let mut o = self.opts(tmp.path(), pk, v);
        if feed == Feed::Quiet {
            o.relay = None;
        } else if feed != Feed::None {
            let mentions = tmp.path().join("mentions.jsonl");
            std::fs::write(&mentions, b"")?;
            o.feed = Some((mentions, tmp.path().join("replies.jsonl")));
        }
        if let Feed::Turns(t) = feed {
            o.extra_args.extend(["--turn-ms".into(), t.to_string()]);
        }
        let mut insts = Vec::new();
        for i in 0..n {
            insts.push(Instance::spawn(
                format!("i{i}"),
                o.command(None),
                Duration::from_secs(10),
            )?);
        }
        let lock = nip_le::lockfile::lock_path(tmp.path(), &pk);
        let mut leader = None;
        wait_until(self.cfg.stale * 3, || {
            let l: Vec<usize> = (0..n)
                .filter(|&i| insts[i].is_leader() == Some(true))
                .collect();
            leader = match l.as_slice() {
                [one]
                    if insts.iter().all(|i| i.is_leader().is_some())
                        && lock_holder(&lock).as_deref()
                            == Some(insts[*one].instance_id.as_str()) =>
                {
                    Some(*one)
                }
                _ => None,
            };
            leader.is_some()
        });
        let leader = leader.ok_or_else(|| std::io::Error::other("cluster did not settle"))?;
        Ok((tmp, pk, insts, leader))
    }

    pub(super) fn bound(&self) -> Duration {
        self.cfg.stale + self.cfg.stand_down + self.cfg.refresh * 3
    }

    pub fn sigkill(&self, v: &Variant, row: &mut Row) -> std::io::Result<()> {
        let (_tmp, _pk, mut insts, leader) = self.cluster(v, 3)?;
        std::thread::sleep(random_below(self.cfg.refresh));
        let cursors: Vec<_> = insts.iter().map(Instance::cursor).collect();
        let t0 = unix_ms();
        insts[leader].kill_and_reap()?;
        match first_new_leader(&insts, &cursors, Some(leader), self.bound()) {
            Some((_, at)) => row.samples.push(at.saturating_sub(t0) as f64),
            None => row.violations.push("no survivor led".into()),
        }
        Ok(())
    }

    pub fn graceful(&self, v: &Variant, row: &mut Row) -> std::io::Result<()> {
        let (tmp, pk, mut insts, leader) = self.cluster(v, 3)?;
        std::thread::sleep(random_below(self.cfg.refresh));
        let cursors: Vec<_> = insts.iter().map(Instance::cursor).collect();
        // Watch the file while the handover happens: was it ever empty?
        let lock = nip_le::lockfile::lock_path(tmp.path(), &pk);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (stop2, lock2) = (stop.clone(), lock.clone());
        let monitor = std::thread::spawn(move || {
            let mut emptied = false;
            while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
                if std::fs::metadata(&lock2)
                    .map(|m| m.len() == 0)
                    .unwrap_or(false)
                {
                    emptied = true;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            emptied
        });
        let t0 = unix_ms();
        #[cfg(unix)]
        insts[leader].signal(libc::SIGTERM)?;
        let _ = insts[leader].wait_exit(Duration::from_secs(10));
        let released_at = insts[leader]
            .views()
            .iter()
            .rev()
            .find(|l| !l.is_leader)
            .map(|l| l.at_ms);
        let next = first_new_leader(&insts, &cursors, Some(leader), self.bound());
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let emptied = monitor.join().unwrap_or(true);
        match next {
            Some((_, at)) => {
                row.samples.push(at.saturating_sub(t0) as f64);
                if released_at.is_some_and(|r| at < r) {
                    row.violations.push("two leaders at once".into());
                }
            }
            None => row.violations.push("no survivor led".into()),
        }
        if emptied {
            let what = "file emptied while a sibling lived".to_owned();
            // The NIP itself empties the file on release: expected there.
            if v.mode == Mode::Spec {
                row.notes.push(what);
            } else {
                row.violations.push(what);
            }
        }
        Ok(())
    }

    pub fn claim(&self, v: &Variant, row: &mut Row) -> std::io::Result<()> {
        let (_tmp, _pk, mut insts, leader) = self.cluster(v, 3)?;
        std::thread::sleep(random_below(self.cfg.refresh));
        let target = (leader + 1) % insts.len();
        let c = insts[target].cursor();
        let t0 = unix_ms();
        insts[target].send("claim")?;
        match insts[target].wait_after(c, self.bound(), |r| r.is_leader() == Some(true)) {
            Some(r) => row
                .samples
                .push(r.at_ms().unwrap_or(t0).saturating_sub(t0) as f64),
            None => row.violations.push("target never led".into()),
        }
        Ok(())
    }

    pub fn foreign_write(&self, v: &Variant, row: &mut Row) -> std::io::Result<()> {
        let tmp = tempfile::tempdir()?;
        let pk = random_pubkey();
        let lock = nip_le::lockfile::lock_path(tmp.path(), &pk);
        nip_le::lockfile::ensure_dir(tmp.path()).map_err(std::io::Error::other)?;
        // A live foreign holder (this process), refreshed by hand.
        std::fs::write(
            &lock,
            nip_le::record::encode_record("foreign", std::process::id(), SystemTime::now(), None),
        )?;
        let inst = Instance::spawn(
            "i0",
            self.opts(tmp.path(), pk, v).command(None),
            Duration::from_secs(10),
        )?;
        wait_until(Duration::from_secs(5), || inst.is_leader() == Some(false));
        std::thread::sleep(random_below(self.cfg.refresh));
        let c = inst.cursor();
        let t0 = unix_ms();
        std::fs::write(&lock, b"")?; // the foreign holder releases
        match inst.wait_after(c, self.bound(), |r| r.is_leader() == Some(true)) {
            Some(r) => row
                .samples
                .push(r.at_ms().unwrap_or(t0).saturating_sub(t0) as f64),
            None => row.violations.push("release never seen".into()),
        }
        Ok(())
    }

    pub fn sigstop(&self, v: &Variant, row: &mut Row) -> std::io::Result<()> {
        let (_tmp, _pk, insts, leader) = self.cluster(v, 2)?;
        std::thread::sleep(random_below(self.cfg.refresh));
        let cursors: Vec<_> = insts.iter().map(Instance::cursor).collect();
        let t0 = unix_ms();
        #[cfg(unix)]
        insts[leader].signal(libc::SIGSTOP)?;
        let next = first_new_leader(
            &insts,
            &cursors,
            Some(leader),
            self.bound() + self.cfg.stale,
        );
        let c = insts[leader].cursor();
        #[cfg(unix)]
        insts[leader].signal(libc::SIGCONT)?;
        match next {
            Some((_, at)) => {
                let ms = at.saturating_sub(t0);
                row.samples.push(ms as f64);
                // The last refresh came up to one interval before the stop.
                if ms < self.cfg.stale.saturating_sub(self.cfg.refresh).as_millis() as u64 {
                    row.violations
                        .push(format!("live leader replaced after {ms} ms"));
                }
            }
            None => row.violations.push("hung leader never replaced".into()),
        }
        // Once resumed it must report the loss within a refresh (and, in
        // extended mode, it fenced itself the whole time).
        if insts[leader]
            .wait_after(c, self.cfg.refresh * 2, |r| r.is_leader() == Some(false))
            .is_none()
        {
            row.violations
                .push("resumed leader did not report the loss".into());
        }
        Ok(())
    }

    pub fn start_together(
        &self,
        v: &Variant,
        procs: usize,
        keys: usize,
        row: &mut Row,
    ) -> std::io::Result<()> {
        let t0 = Instant::now();
        let cluster = self.settled_cluster(v, procs, keys, row)?;
        if cluster.is_some() {
            row.samples.push(t0.elapsed().as_secs_f64() * 1000.0);
        }
        Ok(())
    }

    /// `procs` processes, each joined to the same `keys` keys, started
    /// together and waited for until every process reported on every key
    /// and exactly one leads each (`None`, with a violation, if that took
    /// over 30 s). Nobody may ever have said "leader" of a key besides its
    /// one leader.
    pub(super) fn settled_cluster(
        &self,
        v: &Variant,
        procs: usize,
        keys: usize,
        row: &mut Row,
    ) -> std::io::Result<Option<(tempfile::TempDir, Vec<Instance>)>> {
        let tmp = tempfile::tempdir()?;
        let pks: Vec<AgentPubkey> = (0..keys).map(|_| random_pubkey()).collect();
        let mut o = self.opts(tmp.path(), pks[0], v);
        for k in &pks[1..] {
            o.extra_args.extend(["--pubkey".into(), k.as_str().into()]);
        }
        let mut insts = Vec::new();
        for i in 0..procs {
            insts.push(Instance::spawn_detached(format!("p{i}"), o.command(None))?);
        }
        let keys_hex: Vec<String> = pks.iter().map(|k| k.as_str().to_owned()).collect();
        let settled = wait_until(Duration::from_secs(30), || {
            keys_hex.iter().all(|k| {
                let views: Vec<Option<bool>> = insts.iter().map(|i| i.is_leader_of(k)).collect();
                views.iter().all(Option::is_some)
                    && views.iter().filter(|v| **v == Some(true)).count() == 1
            })
        });
        let mut extra = 0;
        for k in &keys_hex {
            let ever = insts
                .iter()
                .filter(|i| i.views().iter().any(|l| l.pubkey == *k && l.is_leader))
                .count();
            extra += ever.saturating_sub(1);
        }
        if extra > 0 {
            row.violations
                .push(format!("{extra} extra leaders reported"));
        }
        if !settled {
            row.violations.push("did not settle in 30 s".into());
            return Ok(None);
        }
        Ok(Some((tmp, insts)))
    }

    /// The machine slept longer than the stale bound: on waking, the live
    /// leader's `claimed_at` is old for everyone until its next refresh.
    /// Simulated with a live holder (this process, holding a presence lock)
    /// whose record is an hour old; counts whether an observer moved
    /// leadership within the leader's next refresh window (1 = moved).
    pub fn slept(&self, v: &Variant, row: &mut Row) -> std::io::Result<()> {
        if v.before {
            // The simulated sleeper holds a presence in this build's format,
            // which an earlier build may not read: not comparable.
            return Ok(());
        }
        let tmp = tempfile::tempdir()?;
        let pk = random_pubkey();
        nip_le::lockfile::ensure_dir(tmp.path()).map_err(std::io::Error::other)?;
        let backend = v.backend.unwrap_or_default();
        let mut holder = nip_le::presence::Presence::create(tmp.path(), "slept-leader", backend)
            .map_err(std::io::Error::other)?;
        holder.set_keys([pk]).map_err(std::io::Error::other)?;
        let record = nip_le::record::encode_record(
            "slept-leader",
            std::process::id(),
            SystemTime::now() - Duration::from_secs(3600),
            Some(nip_le::record::RecordExt {
                epoch: 1,
                live: holder.token(),
            }),
        );
        let lock = nip_le::lockfile::lock_path(tmp.path(), &pk);
        std::fs::write(&lock, &record)?;
        let inst = Instance::spawn(
            "observer",
            self.opts(tmp.path(), pk, v).command(None),
            Duration::from_secs(10),
        )?;
        // Until the woken leader's first refresh (within one interval) the
        // claim looks an hour old; then it refreshes as any live leader does.
        let mut moved = wait_until(self.cfg.refresh, || inst.is_leader() == Some(true));
        let fresh = nip_le::record::encode_record(
            "slept-leader",
            std::process::id(),
            SystemTime::now(),
            Some(nip_le::record::RecordExt {
                epoch: 1,
                live: holder.token(),
            }),
        );
        if !moved && lock_holder(&lock).as_deref() == Some("slept-leader") {
            std::fs::write(&lock, &fresh)?;
        }
        moved |= wait_until(self.cfg.refresh, || inst.is_leader() == Some(true));
        row.samples.push(if moved { 1.0 } else { 0.0 });
        if moved && v.mode == Mode::Extended {
            row.violations
                .push("a slept but live leader was replaced".into());
        }
        drop(holder);
        Ok(())
    }

    /// Voluntary context switches per second of an idle observer.
    pub fn idle(&self, v: &Variant, row: &mut Row) -> std::io::Result<()> {
        let (_tmp, _pk, insts, leader) = self.cluster_with(v, 2, Feed::Quiet)?;
        let obs = &insts[(leader + 1) % 2];
        let switches = |pid: u32| -> u64 {
            let mut total = 0;
            if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
                for t in tasks.flatten() {
                    if let Ok(s) = std::fs::read_to_string(t.path().join("status")) {
                        total += s
                            .lines()
                            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                            .and_then(|v| v.trim().parse::<u64>().ok())
                            .unwrap_or(0);
                    }
                }
            }
            total
        };
        let window = self.cfg.refresh * 2;
        let before = switches(obs.pid);
        std::thread::sleep(window);
        let after = switches(obs.pid);
        row.samples
            .push(after.saturating_sub(before) as f64 / window.as_secs_f64());
        Ok(())
    }
}

/// In-process costs of the current build: `is_leader` through a
/// [`nip_le::LeaderFlag`] (ns, median of 200 batches of 100k calls) and a
/// refresh of one key we lead, round trip through the writer (µs, median of
/// 2000), and one mention's take and done (µs, median and p99 of 1000).
pub fn in_process(mode: Mode, backend: Backend) -> std::io::Result<InProcess> {
    let tmp = tempfile::tempdir()?;
    let mut c = Config::new(tmp.path());
    c.mode = mode;
    c.backend = backend;
    let e = Elector::start(c, InstanceId::random()).map_err(std::io::Error::other)?;
    let pk = random_pubkey();
    e.join(&pk).map_err(std::io::Error::other)?;
    let flag = e.leader_flag(&pk).map_err(std::io::Error::other)?;
    let mut batches = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        let mut n = 0u32;
        for _ in 0..100_000 {
            n += std::hint::black_box(&flag).is_leader() as u32;
        }
        std::hint::black_box(n);
        batches.push(t.elapsed().as_nanos() as f64 / 100_000.0);
    }
    let mut acq = Vec::new();
    for _ in 0..2000 {
        let t = Instant::now();
        e.refresh_now();
        acq.push(t.elapsed().as_nanos() as f64 / 1000.0);
    }
    // One mention's way through the work ledger: take, then done, each a
    // synced append in extended mode (nothing in spec mode).
    let work = e.work(&pk).map_err(std::io::Error::other)?;
    let mut per_mention = Vec::new();
    for i in 0..1000 {
        let id = format!("bench-{i}");
        let t = Instant::now();
        let took = work.take(&id).map_err(std::io::Error::other)?;
        if !took.granted() {
            return Err(std::io::Error::other(format!("take refused: {took:?}")));
        }
        work.done(&id).map_err(std::io::Error::other)?;
        per_mention.push(t.elapsed().as_nanos() as f64 / 1000.0);
    }
    per_mention.sort_by(f64::total_cmp);
    let p99 = super::pct(&per_mention, 99.0);
    // A backlog: 10,000 mentions owed (and the ledger holding the 1,000
    // above), worked the way an app does: which are owed, take the first,
    // done. Each `owed` walks the whole queue.
    let mut queue: Vec<QueuedEvent> = (0..OWED)
        .map(|i| QueuedEvent {
            id: format!("owed-{i}"),
            published_ms: None,
        })
        .collect();
    let mut backlog = Vec::new();
    for _ in 0..1000 {
        let t = Instant::now();
        let owed = work.owed(&queue).map_err(std::io::Error::other)?;
        let Some(id) = owed.first() else {
            return Err(std::io::Error::other("nothing owed of the backlog"));
        };
        let took = work.take(id).map_err(std::io::Error::other)?;
        if !took.granted() {
            return Err(std::io::Error::other(format!("take refused: {took:?}")));
        }
        work.done(id).map_err(std::io::Error::other)?;
        backlog.push(t.elapsed().as_nanos() as f64 / 1000.0);
        // The app drops what it answered; a new mention keeps 10,000 owed.
        let done_id = id.clone();
        queue.retain(|e| e.id != done_id);
        queue.push(QueuedEvent {
            id: format!("owed-{}", OWED + backlog.len()),
            published_ms: None,
        });
    }
    backlog.sort_by(f64::total_cmp);
    Ok(InProcess {
        is_leader_ns: super::median(batches),
        refresh_us: super::median(acq),
        take_done_us: (super::pct(&per_mention, 50.0), p99),
        backlog_us: (super::pct(&backlog, 50.0), super::pct(&backlog, 99.0)),
    })
}

/// Mentions owed in the backlog row.
pub const OWED: usize = 10_000;

/// The in-process figures.
pub struct InProcess {
    /// `LeaderFlag::is_leader`, ns median.
    pub is_leader_ns: f64,
    /// A refresh through the writer, µs median.
    pub refresh_us: f64,
    /// Take + done of a mention, µs p50 and p99.
    pub take_done_us: (f64, f64),
    /// `owed` of 10,000 + take + done, µs p50 and p99.
    pub backlog_us: (f64, f64),
}
