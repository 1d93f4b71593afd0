//! Cross-host chaos: the etcd every host shares, one member or a cluster,
//! and the faults the runner deals it: the whole of etcd paused (SIGSTOP of
//! every member: unreachable for everyone), a member killed and started
//! again, and (a cluster) one member cut from the others while clients
//! still reach it. Each is recorded in the outcome: a pause, and the
//! restart of a lone etcd, as a span in which etcd was unreachable (the
//! fall-back's); a member's restart or partition apart, since a cluster
//! keeps its majority. What a member fault costs the cluster is measured,
//! not assumed: while faults are in force the members are asked (every
//! 200 ms) whether a majority follows a leader, and a span without one
//! (the election after the leader was killed or cut, or after a cut member
//! came back with a higher term) counts as etcd unreachable too.

use std::time::{Duration, Instant};

use super::outcome::{MemberFault, Outcome};
use crate::etcd::{Cluster, Etcd};
use nip_le_cli::unix_ms;

/// The etcd of a cross-host run.
pub enum SharedEtcd {
    /// One member.
    One(Etcd),
    /// Several members on loopback, their peer traffic through the lab's
    /// proxy.
    Cluster(Cluster),
}

impl SharedEtcd {
    /// The endpoints host `h` is given: every member, the `h`-th first, so
    /// that the hosts spread over the members and a cut member is some
    /// host's first choice.
    pub fn urls_for(&self, h: usize) -> Vec<String> {
        match self {
            Self::One(e) => vec![e.url()],
            Self::Cluster(c) => {
                let n = c.len();
                let order: Vec<usize> = (0..n).map(|i| (h + i) % n).collect();
                c.urls(&order)
            }
        }
    }

    /// What a window needs besides the URLs (certificates, the user).
    pub fn window_args(&self) -> Vec<String> {
        match self {
            Self::One(_) => Vec::new(),
            Self::Cluster(c) => c.window_args(),
        }
    }

    fn signal_all(&self, sig: i32) -> std::io::Result<()> {
        match self {
            Self::One(e) => e.signal(sig),
            // Every member, even after one failed (a SIGSTOP half sent
            // would leave members stopped for ever).
            Self::Cluster(c) => {
                let sent: Vec<std::io::Result<()>> =
                    (0..c.len()).map(|i| c.signal(i, sig)).collect();
                sent.into_iter().collect()
            }
        }
    }
}

/// The etcd faults in force.
pub struct EtcdFaults {
    etcd: SharedEtcd,
    /// Every member stopped: since (unix ms), until.
    stopped: Option<(u64, Instant)>,
    /// A member cut from the others: which, since (unix ms), until.
    cut: Option<(usize, u64, Instant)>,
    /// A cluster: since when (unix ms) no majority follows a leader, the
    /// next probe, and until when to keep probing after a member fault.
    leaderless: Option<u64>,
    probe_at: Instant,
    watch_until: Instant,
}

impl EtcdFaults {
    /// Faults for `etcd`.
    pub fn new(etcd: SharedEtcd) -> Self {
        Self {
            etcd,
            stopped: None,
            cut: None,
            leaderless: None,
            probe_at: Instant::now(),
            watch_until: Instant::now(),
        }
    }

    /// SIGSTOPs every member for `hold_ms` (unless already stopped).
    pub fn pause(&mut self, hold_ms: u64, out: &mut Outcome) -> std::io::Result<()> {
        if self.stopped.is_none() {
            self.etcd.signal_all(libc::SIGSTOP)?;
            self.stopped = Some((unix_ms(), Instant::now() + Duration::from_millis(hold_ms)));
            *out.counts.entry("etcd SIGSTOP/SIGCONT").or_default() += 1;
        }
        Ok(())
    }

    /// SIGKILLs member `member` and starts it again (not while etcd is
    /// stopped). A lone etcd is unreachable meanwhile, and until it answers.
    pub fn restart(&mut self, member: usize, out: &mut Outcome) -> std::io::Result<()> {
        if self.stopped.is_some() {
            return Ok(());
        }
        let at = unix_ms();
        match &mut self.etcd {
            SharedEtcd::One(e) => {
                e.restart()?;
                out.etcd_pauses.push((at, unix_ms()));
            }
            SharedEtcd::Cluster(c) => {
                let member = member % c.len();
                c.restart(member)?;
                out.etcd_member_faults.push(MemberFault {
                    member,
                    cut: false,
                    from: at,
                    until: unix_ms(),
                });
                self.watch_until = Instant::now() + Duration::from_secs(15);
            }
        }
        *out.counts
            .entry("etcd member SIGKILL + restart")
            .or_default() += 1;
        Ok(())
    }

    /// Cuts member `member` from the others for `hold_ms` (a cluster only,
    /// one member at a time).
    pub fn partition(&mut self, member: usize, hold_ms: u64, out: &mut Outcome) {
        let SharedEtcd::Cluster(c) = &self.etcd else {
            return;
        };
        if self.cut.is_some() {
            return;
        }
        let member = member % c.len();
        c.set_cut(member, true);
        let until = Instant::now() + Duration::from_millis(hold_ms);
        self.cut = Some((member, unix_ms(), until));
        self.watch_until = until + Duration::from_secs(15);
        *out.counts.entry("etcd member partitioned").or_default() += 1;
    }

    /// Ends the pause and the partition whose time has come (all of them,
    /// with `all`).
    pub fn tick(&mut self, all: bool, out: &mut Outcome) {
        let now = Instant::now();
        self.probe(now, all, out);
        if let Some((since, until)) = self.stopped {
            if all || until <= now {
                let _ = self.etcd.signal_all(libc::SIGCONT);
                out.etcd_pauses.push((since, unix_ms()));
                self.stopped = None;
            }
        }
        if let Some((member, since, until)) = self.cut {
            if all || until <= now {
                if let SharedEtcd::Cluster(c) = &self.etcd {
                    c.set_cut(member, false);
                }
                out.etcd_member_faults.push(MemberFault {
                    member,
                    cut: true,
                    from: since,
                    until: unix_ms(),
                });
                self.cut = None;
            }
        }
    }

    /// A cluster under a member fault (or just after): whether a majority
    /// still follows a leader. Not while every member is stopped (a status
    /// call would wait; that span is counted as a pause).
    fn probe(&mut self, now: Instant, all: bool, out: &mut Outcome) {
        let SharedEtcd::Cluster(c) = &self.etcd else {
            return;
        };
        let watching = now < self.watch_until || self.leaderless.is_some();
        if self.stopped.is_some() || !watching || (now < self.probe_at && !all) {
            return;
        }
        self.probe_at = now + Duration::from_millis(200);
        match (c.serves() || all, self.leaderless) {
            (false, None) => self.leaderless = Some(unix_ms()),
            (true, Some(since)) => {
                out.etcd_pauses.push((since, unix_ms()));
                *out.counts
                    .entry("etcd without a leader (election)")
                    .or_default() += 1;
                self.leaderless = None;
            }
            _ => {}
        }
    }
}
