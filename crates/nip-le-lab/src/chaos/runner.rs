//! The runner: carries the plan's faults out on real `nip-le run` processes
//! and records every incarnation's life (start, stops, end) and views, and
//! every mention sent. What happened is judged later, by the analysis.

use std::collections::HashMap;
use std::io::Write;
use std::time::{Duration, Instant};

use nip_le::Mode;

use super::disk_full::DiskFiller;
use super::etcd_faults::EtcdFaults;
use super::harness::Harness;
use super::instance_logs::InstanceLogs;
use super::outcome::{Life, Outcome};
use super::plan::{Fault, Plan, View};
use nip_le_cli::drive::cluster::{Instance, RunOptions};
use nip_le_cli::lines::MentionLine;
use nip_le_cli::unix_ms;

/// A place in the cluster that an instance occupies, restarted after death.
struct Slot {
    mode: Mode,
    host: usize,
    inst: Option<Instance>,
    lives: Vec<Life>,
    stopped_since: Option<u64>,
    cont_at: Option<Instant>,
    restart_at: Option<Instant>,
    /// Runs with harness children: the window's child, whether it is
    /// stopped with the window, and when a new one starts after a fault.
    child: Option<Instance>,
    child_stopped: bool,
    child_restart_at: Option<Instant>,
}

/// A harness child whose window was killed: it lives on until `until`,
/// then exits (SIGTERM when `graceful`, else SIGKILL).
struct Orphan {
    child: Instance,
    until: Instant,
    graceful: bool,
    /// When its window was killed (unix ms), if it led then: the child
    /// holds the lock on with the window's instance id until it exits.
    led_from: Option<u64>,
}

/// The cluster under faults.
pub struct Runner {
    /// Per host, the options of each mode.
    opts: Vec<HashMap<Mode, RunOptions>>,
    mentions: std::path::PathBuf,
    slots: Vec<Slot>,
    out: Outcome,
    /// Cross-host runs: the etcd every host shares, and its faults.
    etcd: Option<EtcdFaults>,
    /// Runs with harness children: how to start one, and the children
    /// whose windows were killed.
    harness: Option<Harness>,
    orphans: Vec<Orphan>,
    /// `--fill-locks-fs`: what fills the lock directories' filesystem.
    filler: Option<DiskFiller>,
    /// Cross-host runs: each instance's log in a file of its own.
    logs: Option<InstanceLogs>,
}

impl Runner {
    /// Starts `extended` + `spec` instances with `opts` (the mode is added
    /// per instance).
    pub fn start(
        opts: RunOptions,
        mentions: std::path::PathBuf,
        extended: usize,
        spec: usize,
    ) -> std::io::Result<Self> {
        Self::start_on_hosts(vec![opts], None, None, mentions, extended, spec)
    }

    /// [`Runner::start`] over simulated hosts: `hosts[h]` are the options
    /// of host `h` (its lock dir, its `--etcd … --host-id`); instances are
    /// dealt to hosts in turn. `etcd` is what they share, paused by
    /// [`Fault::EtcdPause`]; `logs`, where each instance logs.
    pub fn start_on_hosts(
        hosts: Vec<RunOptions>,
        etcd: Option<EtcdFaults>,
        logs: Option<InstanceLogs>,
        mentions: std::path::PathBuf,
        extended: usize,
        spec: usize,
    ) -> std::io::Result<Self> {
        let per_host = hosts
            .into_iter()
            .map(|opts| {
                let mut per_mode = HashMap::new();
                for mode in [Mode::Extended, Mode::Spec] {
                    let mut o = opts.clone();
                    o.extra_args.extend(["--mode".into(), mode.as_str().into()]);
                    per_mode.insert(mode, o);
                }
                per_mode
            })
            .collect();
        let mut r = Self {
            opts: per_host,
            mentions,
            slots: Vec::new(),
            out: Outcome::default(),
            etcd,
            harness: None,
            orphans: Vec::new(),
            filler: None,
            logs,
        };
        let modes = std::iter::repeat_n(Mode::Extended, extended)
            .chain(std::iter::repeat_n(Mode::Spec, spec));
        for mode in modes {
            let n = r.slots.len();
            let host = n % r.opts.len();
            let (inst, life) = r.spawn(mode, host, n)?;
            r.slots.push(Slot {
                mode,
                host,
                inst: Some(inst),
                lives: vec![life],
                stopped_since: None,
                cont_at: None,
                restart_at: None,
                child: None,
                child_stopped: false,
                child_restart_at: None,
            });
        }
        Ok(r)
    }

    /// Gives every extended window a harness child carrying its id, now
    /// and whenever the window is restarted.
    pub fn with_children(mut self, harness: Harness) -> std::io::Result<Self> {
        self.harness = Some(harness);
        for i in 0..self.slots.len() {
            self.spawn_child(i)?;
        }
        Ok(self)
    }

    /// Starts slot `i`'s harness child, when the run has them and the slot
    /// holds a live extended window.
    fn spawn_child(&mut self, i: usize) -> std::io::Result<()> {
        let slot = &mut self.slots[i];
        slot.child_restart_at = None;
        let (Some(h), Some(inst), Mode::Extended) = (&self.harness, &slot.inst, slot.mode) else {
            return Ok(());
        };
        slot.child = Some(h.spawn(format!("child{i}"), &inst.instance_id)?);
        slot.child_stopped = false;
        Ok(())
    }

    fn spawn(&self, mode: Mode, host: usize, n: usize) -> std::io::Result<(Instance, Life)> {
        // With logs, the id is given, so its file is named before it starts.
        let id = self.logs.as_ref().map(|_| uuid::Uuid::new_v4().to_string());
        let mut cmd = self.opts[host][&mode].command(id.as_deref());
        if let (Some(logs), Some(id)) = (&self.logs, &id) {
            logs.attach(&mut cmd, id)?;
        }
        let inst = Instance::spawn(
            format!("{}{n}", mode.as_str()),
            cmd,
            Duration::from_secs(10),
        )?;
        let life = Life {
            instance_id: inst.instance_id.clone(),
            mode,
            host,
            start: unix_ms(),
            end: None,
            stops: Vec::new(),
            fresh_stops: Vec::new(),
            claims: Vec::new(),
            views: Vec::new(),
            said: Vec::new(),
        };
        Ok((inst, life))
    }

    /// Injects faults from `plan` for `secs` seconds, about every `pace_ms`.
    pub fn run(&mut self, plan: &mut Plan, secs: u64, pace_ms: u64) -> std::io::Result<()> {
        let start = Instant::now();
        let end = start + Duration::from_secs(secs);
        let mut last_progress = Instant::now();
        while Instant::now() < end {
            std::thread::sleep(Duration::from_millis(plan.pause_ms(pace_ms)));
            self.resume_and_restart()?;
            if let Some(f) = plan.next(&self.view()) {
                self.inject(f)?;
            }
            if last_progress.elapsed() > Duration::from_secs(10) {
                last_progress = Instant::now();
                println!("[{:>4}s] {}", start.elapsed().as_secs(), self.counts_line());
                let _ = std::io::stdout().flush();
            }
        }
        Ok(())
    }

    /// "SIGKILL 3, claim 5, …".
    pub fn counts_line(&self) -> String {
        self.out
            .counts
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn view(&self) -> View {
        let running: Vec<usize> = (0..self.slots.len())
            .filter(|&i| self.slots[i].inst.is_some() && self.slots[i].stopped_since.is_none())
            .collect();
        let leader = running
            .iter()
            .copied()
            .find(|&i| self.slots[i].inst.as_ref().and_then(Instance::is_leader) == Some(true));
        View { running, leader }
    }

    /// Fills the lock directories' filesystem now and then (see
    /// [`DiskFiller`]).
    pub fn with_filler(mut self, filler: DiskFiller) -> Self {
        self.filler = Some(filler);
        self
    }

    /// Resumes stopped instances whose time has come; restarts dead ones.
    fn resume_and_restart(&mut self) -> std::io::Result<()> {
        if let Some(f) = self.filler.as_mut() {
            f.tick(&mut self.out);
        }
        let now = Instant::now();
        if let Some(e) = self.etcd.as_mut() {
            e.tick(false, &mut self.out);
        }
        for slot in self.slots.iter_mut() {
            if slot.cont_at.is_some_and(|t| t <= now) {
                cont(slot);
            }
        }
        for o in std::mem::take(&mut self.orphans) {
            if o.until <= now {
                self.end_orphan(o);
            } else {
                self.orphans.push(o);
            }
        }
        for i in 0..self.slots.len() {
            if self.slots[i].restart_at.is_some_and(|t| t <= now) {
                let (inst, life) = self.spawn(self.slots[i].mode, self.slots[i].host, i)?;
                let slot = &mut self.slots[i];
                slot.inst = Some(inst);
                slot.lives.push(life);
                slot.restart_at = None;
                *self.out.counts.entry("restart").or_default() += 1;
                self.spawn_child(i)?;
            }
            let slot = &self.slots[i];
            if slot.child_restart_at.is_some_and(|t| t <= now) && slot.stopped_since.is_none() {
                self.spawn_child(i)?;
                *self.out.counts.entry("child restart").or_default() += 1;
            }
        }
        Ok(())
    }

    fn inject(&mut self, f: Fault) -> std::io::Result<()> {
        let now = Instant::now();
        match f {
            Fault::Mention => self.mention()?,
            Fault::Kill {
                slot,
                restart_ms,
                orphan_ms,
                orphan_graceful,
            } => {
                let s = &mut self.slots[slot];
                record_views(s);
                let was = s.inst.as_ref().and_then(Instance::is_leader) == Some(true);
                let led_from = was.then(unix_ms);
                if let Some(mut inst) = s.inst.take() {
                    let _ = inst.kill_and_reap();
                }
                s.child_restart_at = None;
                if let Some(child) = s.child.take() {
                    if std::mem::take(&mut s.child_stopped) {
                        let _ = child.signal(libc::SIGCONT);
                    }
                    self.orphans.push(Orphan {
                        child,
                        until: now + Duration::from_millis(orphan_ms),
                        graceful: orphan_graceful,
                        led_from,
                    });
                    *self.out.counts.entry("orphaned child").or_default() += 1;
                }
                let t = unix_ms();
                if let Some(l) = s.lives.last_mut() {
                    l.end = Some(t);
                }
                s.restart_at = Some(now + Duration::from_millis(restart_ms));
                self.out.deaths.push((t, was));
                *self.out.counts.entry("SIGKILL").or_default() += 1;
            }
            Fault::Term { slot, restart_ms } => {
                let s = &mut self.slots[slot];
                // A quitting app stops its harness first.
                s.child_restart_at = None;
                if let Some(child) = s.child.take() {
                    end_child(child, true);
                }
                if let Some(inst) = s.inst.as_mut() {
                    let _ = inst.signal(libc::SIGTERM);
                    let _ = inst.wait_exit(Duration::from_secs(5));
                }
                let t = unix_ms();
                record_views(s);
                s.inst = None;
                if let Some(l) = s.lives.last_mut() {
                    l.end = Some(t);
                }
                s.restart_at = Some(now + Duration::from_millis(restart_ms));
                *self.out.counts.entry("SIGTERM").or_default() += 1;
            }
            Fault::Stop {
                slot,
                hold_ms,
                with_child,
            } => {
                let s = &mut self.slots[slot];
                if let Some(inst) = &s.inst {
                    let _ = inst.signal(libc::SIGSTOP);
                }
                if let (Some(child), true) = (&s.child, with_child) {
                    let _ = child.signal(libc::SIGSTOP);
                    s.child_stopped = true;
                }
                s.stopped_since = Some(unix_ms());
                s.cont_at = Some(now + Duration::from_millis(hold_ms));
                *self.out.counts.entry("SIGSTOP/SIGCONT").or_default() += 1;
            }
            Fault::ChildKill { slot, restart_ms } | Fault::ChildTerm { slot, restart_ms } => {
                let s = &mut self.slots[slot];
                let graceful = matches!(f, Fault::ChildTerm { .. });
                if let Some(child) = s.child.take() {
                    end_child(child, graceful);
                    s.child_restart_at = Some(now + Duration::from_millis(restart_ms));
                    let kind = if graceful {
                        "child SIGTERM"
                    } else {
                        "child SIGKILL"
                    };
                    *self.out.counts.entry(kind).or_default() += 1;
                }
            }
            Fault::Claim { slot } => {
                let s = &mut self.slots[slot];
                if let Some(inst) = s.inst.as_mut() {
                    let _ = inst.send("claim");
                    if let Some(l) = s.lives.last_mut() {
                        l.claims.push(unix_ms());
                    }
                }
                *self.out.counts.entry("claim").or_default() += 1;
            }
            Fault::EtcdPause { hold_ms } => {
                if let Some(e) = self.etcd.as_mut() {
                    e.pause(hold_ms, &mut self.out)?;
                }
            }
            Fault::EtcdRestart { member } => {
                if let Some(e) = self.etcd.as_mut() {
                    e.restart(member, &mut self.out)?;
                }
            }
            Fault::EtcdPartition { member, hold_ms } => {
                if let Some(e) = self.etcd.as_mut() {
                    e.partition(member, hold_ms, &mut self.out);
                }
            }
        }
        Ok(())
    }

    fn end_orphan(&mut self, o: Orphan) {
        end_child(o.child, o.graceful);
        if let Some(from) = o.led_from {
            self.out.orphan_holds.push((from, unix_ms()));
        }
    }

    fn cont_etcd(&mut self) {
        if let Some(e) = self.etcd.as_mut() {
            e.tick(true, &mut self.out);
        }
    }

    fn mention(&mut self) -> std::io::Result<()> {
        let id = format!("m{}", self.out.sent.len());
        let at = unix_ms();
        let line = MentionLine {
            id: id.clone().into(),
            at_ms: Some(at),
        };
        let text = format!(
            "{}\n",
            serde_json::to_string(&line).map_err(std::io::Error::other)?
        );
        std::fs::OpenOptions::new()
            .append(true)
            .open(&self.mentions)?
            .write_all(text.as_bytes())?;
        self.out.sent.push((id, at));
        *self.out.counts.entry("mention").or_default() += 1;
        Ok(())
    }

    /// Resumes everything and restarts what was killed, lets the cluster
    /// settle for `settle` and then until `drained` says so (at most
    /// `max_drain` more), stops every instance and returns what was
    /// recorded.
    pub fn finish(
        mut self,
        settle: Duration,
        max_drain: Duration,
        drained: impl Fn(&Outcome) -> bool,
    ) -> std::io::Result<Outcome> {
        if let Some(mut f) = self.filler.take() {
            f.free(&mut self.out);
        }
        self.cont_etcd();
        for slot in self.slots.iter_mut() {
            if slot.stopped_since.is_some() {
                cont(slot);
            }
        }
        for o in std::mem::take(&mut self.orphans) {
            self.end_orphan(o);
        }
        for i in 0..self.slots.len() {
            if self.slots[i].inst.is_none() {
                let (inst, life) = self.spawn(self.slots[i].mode, self.slots[i].host, i)?;
                self.slots[i].inst = Some(inst);
                self.slots[i].lives.push(life);
                self.slots[i].restart_at = None;
            }
            if self.slots[i].child.is_none() {
                self.spawn_child(i)?;
            }
        }
        std::thread::sleep(settle);
        let end = Instant::now() + max_drain;
        while Instant::now() < end && !drained(&self.out) {
            std::thread::sleep(Duration::from_millis(50));
        }
        for slot in self.slots.iter_mut() {
            record_views(slot);
            if let Some(mut inst) = slot.inst.take() {
                let _ = inst.kill_and_reap();
            }
            if let Some(mut child) = slot.child.take() {
                let _ = child.kill_and_reap();
            }
            if let Some(l) = slot.lives.last_mut() {
                l.end.get_or_insert(unix_ms());
            }
        }
        self.out.lives = self.slots.into_iter().flat_map(|s| s.lives).collect();
        Ok(self.out)
    }
}

/// Ends a harness child: SIGTERM and a wait (it truncates the file if its
/// record is there), or SIGKILL.
fn end_child(mut child: Instance, graceful: bool) {
    if graceful {
        // A child stopped with its window must run to exit gracefully.
        let _ = child.signal(libc::SIGCONT);
        let _ = child.signal(libc::SIGTERM);
        if child.wait_exit(Duration::from_secs(5)).is_some() {
            return;
        }
    }
    let _ = child.kill_and_reap();
}

fn cont(slot: &mut Slot) {
    if let Some(inst) = &slot.inst {
        let _ = inst.signal(libc::SIGCONT);
    }
    let child_stopped = std::mem::take(&mut slot.child_stopped);
    if let (Some(child), true) = (&slot.child, child_stopped) {
        let _ = child.signal(libc::SIGCONT);
    }
    let since = slot.stopped_since.take().unwrap_or_else(unix_ms);
    if let Some(l) = slot.lives.last_mut() {
        let span = (since, unix_ms());
        l.stops.push(span);
        if slot.child.is_some() && !child_stopped {
            l.fresh_stops.push(span);
        }
    }
    slot.cont_at = None;
}

fn record_views(slot: &mut Slot) {
    let Some(inst) = &slot.inst else { return };
    let Some(life) = slot.lives.last_mut() else {
        return;
    };
    let views = inst.views();
    life.views = views.iter().map(|l| (l.at_ms, l.is_leader)).collect();
    life.said = views
        .iter()
        .map(|l| (l.at_ms, format!("{:?} {:?}", l.level, l.reason)))
        .collect();
}
