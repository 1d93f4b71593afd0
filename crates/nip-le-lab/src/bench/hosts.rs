//! The cross-host rows: simulated hosts (a lock dir and a host id each)
//! sharing one real etcd on loopback, every window a `nip-le run --etcd`
//! process. Only the current extended build runs them (the plain NIP and
//! earlier builds have no cross-host level: their cells stay empty).
//! Latencies run from the moment the bench acted to the `at_ms` of the
//! first report of a window acting at the global level.

use std::sync::Mutex;
use std::time::Duration;

use nip_le::{AgentPubkey, Level, Mode};

use super::scenarios::{random_below, Bench};
use super::{Row, Variant};
use crate::etcd::Etcd;
use nip_le_cli::drive::cluster::{random_pubkey, wait_until, Instance, RunOptions};
use nip_le_cli::unix_ms;

/// The bench's etcd, started at the first cross-host row and stopped by
/// [`stop_etcd`] (a static is never dropped: its process would outlive
/// the bench).
static ETCD: Mutex<Option<Etcd>> = Mutex::new(None);

/// `f` on the bench's etcd, started first if need be.
fn with_etcd<T>(f: impl FnOnce(&Etcd) -> T) -> std::io::Result<T> {
    let mut etcd = ETCD.lock().unwrap_or_else(|e| e.into_inner());
    if etcd.is_none() {
        *etcd = Some(Etcd::start()?);
    }
    Ok(f(etcd.as_ref().expect("just started")))
}

/// Stops the bench's etcd, if it was started.
pub fn stop_etcd() {
    ETCD.lock().unwrap_or_else(|e| e.into_inner()).take();
}

/// Simulated hosts sharing the bench's etcd.
struct Hosts {
    _tmp: tempfile::TempDir,
    insts: Vec<Instance>,
    /// Each window's host index.
    host_of: Vec<usize>,
    leader: usize,
}

fn acts_globally(i: &Instance) -> bool {
    !i.exited()
        && i.views()
            .last()
            .is_some_and(|l| l.is_leader && l.level == Level::Global)
}

/// The first window other than `not` to act at the global level after its
/// cursor: its index and when (unix ms).
fn first_global_after(
    insts: &[Instance],
    cursors: &[usize],
    not: usize,
    within: Duration,
) -> Option<(usize, u64)> {
    let mut found = None;
    wait_until(within, || {
        found = (0..insts.len()).filter(|&i| i != not).find_map(|i| {
            insts[i].reports().iter().skip(cursors[i]).find_map(|r| {
                let l = r.leadership()?;
                (l.is_leader && l.level == Level::Global).then_some((i, l.at_ms))
            })
        });
        found.is_some()
    });
    found
}

impl Bench {
    /// The lease TTL of the cross-host rows: the stale bound, in whole
    /// seconds, at least etcd's minimum of 2 s.
    fn ttl_s(&self) -> u64 {
        self.cfg.stale.as_secs().max(2)
    }

    /// `windows[h]` windows on each host `h`, settled with one global
    /// leader; `None` for a variant without a cross-host level (the plain
    /// NIP's). An earlier build (`--before`) runs them too: `run`'s etcd
    /// flags are the same.
    fn hosts(&self, v: &Variant, windows: &[usize]) -> std::io::Result<Option<Hosts>> {
        if v.mode != Mode::Extended {
            return Ok(None);
        }
        let url = with_etcd(Etcd::url)?;
        let tmp = tempfile::tempdir()?;
        let pk: AgentPubkey = random_pubkey();
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let (mut insts, mut host_of) = (Vec::new(), Vec::new());
        for (h, &n) in windows.iter().enumerate() {
            let mut o = RunOptions::new(&v.exe, tmp.path().join(format!("host{h}")), pk).timings(
                ms(self.cfg.refresh),
                ms(self.cfg.stale),
                ms(self.cfg.stand_down),
            );
            o.extra_args = [
                "--etcd".to_owned(),
                url.clone(),
                "--host-id".into(),
                format!("host{h}"),
                "--etcd-ttl-s".into(),
                self.ttl_s().to_string(),
            ]
            .into();
            for w in 0..n {
                let id = format!("host{h}-w{w}");
                insts.push(Instance::spawn(
                    &id,
                    o.command(Some(&id)),
                    Duration::from_secs(10),
                )?);
                host_of.push(h);
            }
        }
        let mut leader = None;
        wait_until(self.cfg.stale * 3, || {
            let l: Vec<usize> = (0..insts.len())
                .filter(|&i| acts_globally(&insts[i]))
                .collect();
            let acting = insts
                .iter()
                .filter(|i| i.views().last().is_some_and(|l| l.is_leader))
                .count();
            leader = (l.len() == 1 && acting == 1).then(|| l[0]);
            leader.is_some()
        });
        let leader = leader.ok_or_else(|| std::io::Error::other("hosts did not settle"))?;
        // Faults land at a random point of the keep-alive cycle.
        std::thread::sleep(random_below(Duration::from_secs(self.ttl_s()) / 3));
        Ok(Some(Hosts {
            _tmp: tmp,
            insts,
            host_of,
            leader,
        }))
    }

    fn cross_bound(&self) -> Duration {
        Duration::from_secs(self.ttl_s()) * 2 + self.bound()
    }

    /// Two hosts of two windows: SIGKILL of the global leader → a window
    /// acts again (its sibling, continuing the host's lease).
    pub fn cross_host_kill(&self, v: &Variant, row: &mut Row) -> std::io::Result<()> {
        let Some(mut h) = self.hosts(v, &[2, 2])? else {
            return Ok(());
        };
        if let Some(i) = self.kill_leader(&mut h, row)? {
            if h.host_of[i] != h.host_of[h.leader] {
                row.violations
                    .push("another host took over from a live sibling".into());
            }
        }
        Ok(())
    }

    /// SIGKILLs the global leader; records how long until another window
    /// acts, and returns which one.
    fn kill_leader(&self, h: &mut Hosts, row: &mut Row) -> std::io::Result<Option<usize>> {
        let cursors: Vec<usize> = h.insts.iter().map(Instance::cursor).collect();
        let t0 = unix_ms();
        h.insts[h.leader].kill_and_reap()?;
        let next = first_global_after(&h.insts, &cursors, h.leader, self.cross_bound());
        match next {
            Some((_, at)) => row.samples.push(at.saturating_sub(t0) as f64),
            None => row.violations.push("nobody acted again".into()),
        }
        Ok(next.map(|(i, _)| i))
    }

    /// Two hosts of one window: the leader's whole host lost (SIGKILL of its
    /// only window) → the other host acts, after the lease TTL.
    pub fn cross_host_lost(&self, v: &Variant, row: &mut Row) -> std::io::Result<()> {
        let Some(mut h) = self.hosts(v, &[1, 1])? else {
            return Ok(());
        };
        self.kill_leader(&mut h, row).map(drop)
    }

    /// Two hosts of one window: SIGTERM of the global leader (it revokes
    /// the lease) → the other host acts.
    pub fn cross_host_graceful(&self, v: &Variant, row: &mut Row) -> std::io::Result<()> {
        let Some(h) = self.hosts(v, &[1, 1])? else {
            return Ok(());
        };
        let cursors: Vec<usize> = h.insts.iter().map(Instance::cursor).collect();
        let t0 = unix_ms();
        #[cfg(unix)]
        h.insts[h.leader].signal(libc::SIGTERM)?;
        match first_global_after(&h.insts, &cursors, h.leader, self.cross_bound()) {
            Some((_, at)) => row.samples.push(at.saturating_sub(t0) as f64),
            None => row.violations.push("the other host never acted".into()),
        }
        Ok(())
    }

    /// Two hosts of one window: `claim` on the other host's window → it
    /// acts (the holder stood down and rewrote the key for it).
    pub fn cross_host_claim(&self, v: &Variant, row: &mut Row) -> std::io::Result<()> {
        let Some(mut h) = self.hosts(v, &[1, 1])? else {
            return Ok(());
        };
        let target = 1 - h.leader;
        let cursors: Vec<usize> = h.insts.iter().map(Instance::cursor).collect();
        let t0 = unix_ms();
        h.insts[target].send("claim")?;
        match first_global_after(&h.insts, &cursors, h.leader, self.cross_bound()) {
            Some((_, at)) => row.samples.push(at.saturating_sub(t0) as f64),
            None => row.violations.push("the claimant never acted".into()),
        }
        let stood_down = h.insts[h.leader]
            .reports()
            .iter()
            .skip(cursors[h.leader])
            .any(|r| r.reason() == Some(nip_le::ChangeReason::StoodDown));
        if !stood_down {
            row.violations
                .push("the holder did not report its stand-down".into());
        }
        Ok(())
    }
}

/// One mention's way through the work ledger in process, with the etcd
/// level on and (`etcd: false`) off, in the same run: take + done as the
/// agent sees them (µs; the writer never waits for etcd), and how long
/// after `done` returned etcd has the done record, what a host that gains
/// the agent reads (µs; `None` without etcd). Medians and p99s.
pub fn in_process_work(etcd: bool, mentions: usize) -> std::io::Result<WorkCost> {
    let tmp = tempfile::tempdir()?;
    let mut c = nip_le::Config::new(tmp.path());
    let mut cfg = None;
    if etcd {
        c.etcd = Some(with_etcd(|e| e.config("bench-host"))?);
        cfg = c.etcd.clone();
    }
    let e =
        nip_le::Elector::start(c, nip_le::InstanceId::random()).map_err(std::io::Error::other)?;
    let pk = random_pubkey();
    e.join(&pk).map_err(std::io::Error::other)?;
    let flag = e.leader_flag(&pk).map_err(std::io::Error::other)?;
    if !wait_until(Duration::from_secs(10), || flag.is_leader()) {
        return Err(std::io::Error::other("never led"));
    }
    let work = e.work(&pk).map_err(std::io::Error::other)?;
    let (mut agent, mut recorded) = (Vec::new(), Vec::new());
    let mention = |id: &str| -> std::io::Result<()> {
        if !work.take(id).map_err(std::io::Error::other)?.granted() {
            return Err(std::io::Error::other(format!("take of {id} refused")));
        }
        work.done(id).map_err(std::io::Error::other).map(drop)
    };
    // As the agent sees it: nothing else runs meanwhile.
    for i in 0..mentions {
        let t = std::time::Instant::now();
        mention(&format!("agent-{i}"))?;
        agent.push(t.elapsed().as_nanos() as f64 / 1000.0);
    }
    // Until etcd has the record: one mention at a time, polled.
    for i in 0..mentions.min(100) {
        let Some(cfg) = &cfg else { break };
        let id = format!("recorded-{i}");
        mention(&id)?;
        let t = std::time::Instant::now();
        let seen = wait_until(Duration::from_secs(5), || {
            nip_le::global::work_records(cfg, &pk)
                .is_ok_and(|r| r.iter().any(|w| w.id == id && w.done))
        });
        if !seen {
            return Err(std::io::Error::other(format!(
                "the done of {id} never reached etcd"
            )));
        }
        recorded.push(t.elapsed().as_nanos() as f64 / 1000.0);
    }
    e.shutdown();
    let stats = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (!v.is_empty()).then(|| (super::pct(&v, 50.0), super::pct(&v, 99.0)))
    };
    Ok(WorkCost {
        agent: stats(agent).unwrap_or_default(),
        recorded: stats(recorded),
    })
}

/// What [`in_process_work`] measured: (median, p99) each.
#[derive(Debug, Clone, Copy)]
pub struct WorkCost {
    /// Take + done as the agent sees them, µs.
    pub agent: (f64, f64),
    /// From `done` returned until etcd has the record, µs.
    pub recorded: Option<(f64, f64)>,
}
