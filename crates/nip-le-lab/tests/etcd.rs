//! Cross-host leadership on a real etcd (Debian's `etcd-server`, started on
//! loopback with free ports and a temporary data dir). Several simulated
//! hosts (separate lock dirs, separate host ids) share it; every window is
//! a real `nip-le run --etcd URL --host-id ID` process under real signals.
//!
//! Without an etcd binary these tests say so and pass, unless
//! `NIP_LE_REQUIRE_ETCD` is set (as `scripts/test.sh` does, after installing
//! it): then a missing etcd fails them.
#![cfg(unix)]

mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use nip_le::global::{key_history, EtcdConfig};
use nip_le::{AgentPubkey, ChangeReason, Level};
use nip_le_cli::drive::cluster::{wait_until, Instance, RunOptions};
use nip_le_cli::lines::{Leadership, Line};
use nip_le_lab::etcd::Etcd;
use support::*;

/// Lease TTL of the tests (etcd's minimum is about 2 s).
const TTL_S: u64 = 2;

/// etcd, and a scratch dir holding one lock dir per host.
struct Hosts {
    etcd: Etcd,
    tmp: tempfile::TempDir,
    pubkey: AgentPubkey,
    /// When each killed window was killed (unix ms): the end of its tenure.
    killed: HashMap<String, u64>,
}

fn now_ms() -> u64 {
    nip_le_cli::unix_ms()
}

impl Hosts {
    fn new() -> Option<Self> {
        Some(Self {
            etcd: etcd_or_skip()?,
            tmp: tempfile::tempdir().unwrap(),
            pubkey: nip_le_cli::drive::cluster::random_pubkey(),
            killed: HashMap::new(),
        })
    }

    fn opts(&self, host: &str, extra: &[&str]) -> RunOptions {
        let mut o = RunOptions::new(
            env!("CARGO_BIN_EXE_nip-le-lab"),
            self.tmp.path().join(host),
            self.pubkey,
        )
        .timings(REFRESH_MS, STALE_MS, STAND_DOWN_MS);
        o.extra_args = ["--etcd", &self.etcd.url(), "--host-id", host]
            .into_iter()
            .chain(["--etcd-ttl-s", &TTL_S.to_string()])
            .chain(extra.iter().copied())
            .map(str::to_owned)
            .collect();
        o
    }

    /// Window `w` of `host`, named `host-w`.
    fn window(&self, host: &str, w: usize, extra: &[&str]) -> Instance {
        let id = format!("{host}-w{w}");
        Instance::spawn(
            &id,
            self.opts(host, extra).command(Some(&id)),
            Duration::from_secs(10),
        )
        .expect("nip-le run starts")
    }

    fn config(&self) -> EtcdConfig {
        self.etcd.config("audit")
    }

    fn kill(&mut self, inst: &mut Instance) {
        self.killed.insert(inst.instance_id.clone(), now_ms());
        inst.kill_and_reap().unwrap();
    }
}

fn latest(inst: &Instance) -> Option<Leadership> {
    inst.views().last().cloned()
}

/// The windows that say they act at the global level now.
fn global_leaders(insts: &[&Instance]) -> Vec<String> {
    insts
        .iter()
        .filter(|i| !i.exited())
        .filter(|i| latest(i).is_some_and(|l| l.is_leader && l.level == Level::Global))
        .map(|i| i.instance_id.clone())
        .collect()
}

/// Waits until exactly one window acts, at the global level, and every
/// other has reported; returns its id.
fn one_global_leader(insts: &[&Instance], within: Duration) -> String {
    let mut last = Vec::new();
    let ok = wait_until(within, || {
        last = global_leaders(insts);
        let others_quiet = insts
            .iter()
            .filter(|i| !i.exited())
            .filter(|i| latest(i).is_some_and(|l| l.is_leader))
            .count()
            == 1;
        last.len() == 1 && others_quiet
    });
    assert!(
        ok,
        "not exactly one global leader within {within:?}: {last:?}"
    );
    last.remove(0)
}

/// One window's periods of acting at the global level: (start, end,
/// revision) in unix ms; an open period ends at its kill or at `until`.
fn tenures(inst: &Instance, killed: Option<u64>, until: u64) -> Vec<(u64, u64, u64)> {
    let mut out = Vec::new();
    let mut open: Option<(u64, u64)> = None;
    for v in inst.views() {
        let acting = v.is_leader && v.level == Level::Global;
        match (open, acting) {
            (None, true) => {
                let rev = v.global_holder.as_ref().map_or(0, |h| h.revision);
                open = Some((v.at_ms, rev));
            }
            (Some((start, rev)), false) => {
                out.push((start, v.at_ms, rev));
                open = None;
            }
            _ => {}
        }
    }
    if let Some((start, rev)) = open {
        out.push((start, killed.unwrap_or(until), rev));
    }
    out
}

/// No two windows ever acted at the global level at once, and each period
/// began at a write of the agent's etcd key that names that window.
fn audit(h: &Hosts, insts: &[&Instance]) {
    let until = now_ms();
    let history = key_history(&h.config(), &h.pubkey).expect("etcd history");
    let named: HashMap<u64, String> = history
        .iter()
        .filter_map(|w| Some((w.revision, w.holder.as_ref()?.instance_id.clone())))
        .collect();
    let mut all = Vec::new();
    for i in insts {
        for t in tenures(i, h.killed.get(&i.instance_id).copied(), until) {
            assert_eq!(
                named.get(&t.2),
                Some(&i.instance_id),
                "{} acted at revision {} which etcd's history does not give it: {history:?}",
                i.instance_id,
                t.2
            );
            all.push((i.instance_id.clone(), t));
        }
    }
    for (a, ta) in &all {
        for (b, tb) in &all {
            if a < b {
                assert!(
                    ta.1 <= tb.0 || tb.1 <= ta.0,
                    "{a} {ta:?} and {b} {tb:?} both acted at the global level"
                );
            }
        }
    }
}

/// The first view after `cursor` of `inst` that satisfies `pred`.
fn view_after(
    inst: &Instance,
    cursor: usize,
    within: Duration,
    pred: impl Fn(&Leadership) -> bool,
) -> Option<Leadership> {
    inst.wait_after(cursor, within, |r| r.leadership().is_some_and(&pred))
        .and_then(|r| r.leadership().cloned())
}

fn acts_globally(l: &Leadership) -> bool {
    l.is_leader && l.level == Level::Global
}

#[test]
fn three_hosts_of_two_windows_have_exactly_one_global_leader() {
    let Some(h) = Hosts::new() else { return };
    let windows: Vec<Instance> = ["a", "b", "c"]
        .iter()
        .flat_map(|host| [h.window(host, 1, &[]), h.window(host, 2, &[])])
        .collect();
    let refs: Vec<&Instance> = windows.iter().collect();
    let leader = one_global_leader(&refs, Duration::from_secs(10));
    // Each host has its own host leader; only one of them acts. A loaded
    // machine may report a host's election after the global one.
    let host_leaders = || {
        windows
            .iter()
            .filter(|i| latest(i).is_some_and(|l| l.level != Level::None))
            .count()
    };
    wait_until(Duration::from_secs(10), || host_leaders() >= 3);
    assert_eq!(
        host_leaders(),
        3,
        "one host leader per host: {:#?}",
        windows.iter().map(latest).collect::<Vec<_>>()
    );
    // It stays that way.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(2) {
        assert_eq!(global_leaders(&refs), vec![leader.clone()]);
        std::thread::sleep(Duration::from_millis(20));
    }
    audit(&h, &refs);
}

#[test]
fn a_killed_leader_moves_within_its_host_at_once_and_a_lost_host_within_the_ttl() {
    let Some(mut h) = Hosts::new() else { return };
    let mut windows: Vec<Instance> = ["a", "b"]
        .iter()
        .flat_map(|host| [h.window(host, 1, &[]), h.window(host, 2, &[])])
        .collect();
    let leader = one_global_leader(&windows.iter().collect::<Vec<_>>(), Duration::from_secs(10));
    let li = windows
        .iter()
        .position(|i| i.instance_id == leader)
        .unwrap();
    let host = leader.split('-').next().unwrap().to_owned();
    let sibling = windows
        .iter()
        .position(|i| i.instance_id != leader && i.instance_id.starts_with(&host))
        .unwrap();
    let cursor = windows[sibling].cursor();
    let mut dead = windows.remove(li);
    let sibling = if sibling > li { sibling - 1 } else { sibling };
    h.kill(&mut dead);
    let killed_at = h.killed[&dead.instance_id];
    // Within the host: the sibling takes the host lock (presence) and
    // continues the host's lease, without waiting for the TTL.
    let took = view_after(
        &windows[sibling],
        cursor,
        Duration::from_secs(5),
        acts_globally,
    )
    .expect("the sibling acts after the leader's SIGKILL");
    let lag = took.at_ms.saturating_sub(killed_at);
    assert!(
        lag < 500,
        "moved within the host after {lag} ms (the TTL is {TTL_S} s)"
    );
    assert_eq!(took.reason, ChangeReason::HandedOver);
    // The whole host lost: the other host leads within the TTL.
    let mut sib = windows.remove(sibling);
    let cursors: Vec<usize> = windows.iter().map(Instance::cursor).collect();
    h.kill(&mut sib);
    let killed_at = h.killed[&sib.instance_id];
    let refs: Vec<&Instance> = windows.iter().collect();
    let next = one_global_leader(&refs, Duration::from_secs(TTL_S) + MARGIN * 3);
    let ni = windows.iter().position(|i| i.instance_id == next).unwrap();
    let took = view_after(&windows[ni], cursors[ni], Duration::ZERO, acts_globally).unwrap();
    let lag = took.at_ms.saturating_sub(killed_at);
    assert!(
        lag <= TTL_S * 1000 + MARGIN.as_millis() as u64 * 2,
        "another host led {lag} ms after the host was lost"
    );
    let mut all: Vec<&Instance> = windows.iter().collect();
    all.push(&dead);
    all.push(&sib);
    audit(&h, &all);
}

#[test]
fn a_graceful_exit_hands_the_agent_to_another_host_in_milliseconds() {
    let Some(h) = Hosts::new() else { return };
    let windows = [h.window("a", 1, &[]), h.window("b", 1, &[])];
    let leader = one_global_leader(&windows.iter().collect::<Vec<_>>(), Duration::from_secs(10));
    let (li, oi) = if windows[0].instance_id == leader {
        (0, 1)
    } else {
        (1, 0)
    };
    let cursor = windows[oi].cursor();
    let lc = windows[li].cursor();
    windows[li].signal(libc::SIGTERM).unwrap();
    let released = view_after(&windows[li], lc, Duration::from_secs(5), |l| !l.is_leader)
        .expect("the leader reports its release");
    let took = view_after(&windows[oi], cursor, Duration::from_secs(5), acts_globally)
        .expect("the other host leads after a graceful exit");
    let lag = took.at_ms.saturating_sub(released.at_ms);
    assert!(lag < 300, "handoff across hosts took {lag} ms");
    audit(&h, &windows.iter().collect::<Vec<_>>());
}

#[test]
fn a_claim_from_a_window_of_another_host_completes_in_milliseconds() {
    let Some(h) = Hosts::new() else { return };
    // Host a leads (it acts before b starts); b-w2 is not even its host's
    // leader. Started is not acting: wait for a-w1's lease first.
    let first = h.window("a", 1, &[]);
    view_after(&first, 0, Duration::from_secs(10), acts_globally).expect("a-w1 leads alone");
    let mut windows = [first, h.window("b", 1, &[]), h.window("b", 2, &[])];
    let leader = one_global_leader(&windows.iter().collect::<Vec<_>>(), Duration::from_secs(10));
    assert_eq!(leader, "a-w1");
    let (lc, cc) = (windows[0].cursor(), windows[2].cursor());
    windows[2].send("claim").unwrap();
    let took = view_after(&windows[2], cc, Duration::from_secs(5), acts_globally)
        .expect("the claimant leads");
    assert_eq!(
        took.reason,
        ChangeReason::Claimed,
        "{:#?}\n{:#?}",
        windows[2].views(),
        windows[0].views()
    );
    let stood = view_after(&windows[0], lc, Duration::from_secs(1), |l| !l.is_leader)
        .expect("the holder stood down");
    assert_eq!(stood.reason, ChangeReason::StoodDown);
    let lag = took.at_ms.saturating_sub(stood.at_ms);
    assert!(lag < 300, "claim completed {lag} ms after the stand-down");
    let refs: Vec<&Instance> = windows.iter().collect();
    assert_eq!(one_global_leader(&refs, Duration::from_secs(1)), "b-w2");
    // The claim answer said it was pending until then.
    let answered = windows[2].reports().iter().any(|r| {
        matches!(
            r.line,
            Line::Claim {
                outcome: nip_le::ClaimOutcome::Pending
            }
        )
    });
    assert!(answered, "the claim was answered pending");
    audit(&h, &refs);
}

/// etcd paused for three TTLs: the holder fences itself before its lease
/// can have expired anywhere; nobody acts at the global level meanwhile;
/// one leader afterwards.
fn pause_etcd(policy: &str) {
    let Some(h) = Hosts::new() else { return };
    let extra = ["--when-etcd-unreachable", policy];
    let windows = [h.window("a", 1, &extra), h.window("b", 1, &extra)];
    let refs: Vec<&Instance> = windows.iter().collect();
    let leader = one_global_leader(&refs, Duration::from_secs(10));
    let li = windows
        .iter()
        .position(|i| i.instance_id == leader)
        .unwrap();
    let cursors: Vec<usize> = windows.iter().map(Instance::cursor).collect();
    h.etcd.signal(libc::SIGSTOP).unwrap();
    let paused_at = now_ms();
    let fenced = view_after(
        &windows[li],
        cursors[li],
        Duration::from_secs(TTL_S * 2),
        |l| !l.is_leader || l.level != Level::Global,
    )
    .expect("the holder fences itself while etcd is unreachable");
    let lag = fenced.at_ms.saturating_sub(paused_at);
    assert!(
        lag < TTL_S * 1000,
        "fenced {lag} ms after etcd stopped answering: later than the TTL"
    );
    if policy == "fall-back" {
        // Duplicates over silence: each host leader acts for its host.
        for w in &windows {
            view_after(w, 0, Duration::from_secs(TTL_S * 3), |l| {
                l.is_leader && l.level == Level::Host
            })
            .expect("falls back to host-local leadership");
        }
    } else {
        std::thread::sleep(Duration::from_secs(TTL_S * 2));
        assert!(
            windows
                .iter()
                .all(|w| latest(w).is_some_and(|l| !l.is_leader)),
            "a window acts while etcd is unreachable under stay-silent"
        );
    }
    std::thread::sleep(Duration::from_secs(TTL_S));
    h.etcd.signal(libc::SIGCONT).unwrap();
    one_global_leader(&refs, Duration::from_secs(TTL_S * 3) + MARGIN);
    audit(&h, &refs);
}

#[test]
fn etcd_paused_fences_the_holder_and_falls_back_to_host_leaders_then_recovers() {
    pause_etcd("fall-back");
}

#[test]
fn etcd_paused_under_stay_silent_fences_everyone_then_recovers() {
    pause_etcd("stay-silent");
}

#[test]
fn etcd_restarted_one_global_leader_afterwards() {
    let Some(mut h) = Hosts::new() else { return };
    let windows = [h.window("a", 1, &[]), h.window("b", 1, &[])];
    let refs: Vec<&Instance> = windows.iter().collect();
    one_global_leader(&refs, Duration::from_secs(10));
    h.etcd.restart().unwrap();
    // The lease survived in etcd's data (or expired and was re-taken):
    // either way exactly one leader, acting at the global level.
    std::thread::sleep(Duration::from_millis(500));
    one_global_leader(&refs, Duration::from_secs(TTL_S * 4));
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(1) {
        assert!(global_leaders(&refs).len() <= 1);
        std::thread::sleep(Duration::from_millis(20));
    }
    audit(&h, &refs);
}

/// Issue 21, item 5: with no `--host-id`, each host gets the random id kept
/// in its lock directory. The default was the hostname, which two hosts
/// often share (and which these "hosts", one machine, always do): each
/// then saw the key name its own host, continued the other's lease and
/// rewrote the key, back and forth every renewal. Here the holder keeps
/// the key: one write in four TTLs.
#[test]
fn two_hosts_without_a_host_id_get_their_own_and_never_take_the_key_from_each_other() {
    let Some(h) = Hosts::new() else { return };
    let window = |host: &str| {
        let mut o = h.opts(host, &[]);
        let at = o.extra_args.iter().position(|a| a == "--host-id").unwrap();
        o.extra_args.drain(at..at + 2);
        let id = format!("{host}-w0");
        Instance::spawn(&id, o.command(Some(&id)), Duration::from_secs(10)).expect("starts")
    };
    let windows = [window("x"), window("y")];
    let insts: Vec<&Instance> = windows.iter().collect();
    one_global_leader(&insts, Duration::from_secs(10));
    let ids: Vec<String> = ["x", "y"]
        .iter()
        .map(|host| {
            let p = h.tmp.path().join(host).join(nip_le::global::HOST_ID_FILE);
            std::fs::read_to_string(p).expect("a host id was kept")
        })
        .collect();
    assert_ne!(ids[0], ids[1], "two hosts, one id");
    let writes = || key_history(&h.config(), &h.pubkey).expect("history").len();
    let before = writes();
    // Renewals every TTL/3: long enough for twelve of them.
    std::thread::sleep(Duration::from_secs(4 * TTL_S));
    assert_eq!(
        writes(),
        before,
        "the key was rewritten: hosts took it from each other"
    );
    one_global_leader(&insts, Duration::from_secs(1));
}

/// Writes `n` filler records under the agent's work prefix (in batches,
/// with etcdctl, straight to etcd) and one open take of a window of
/// another host, so that a holder reads the records again every TTL/3.
fn fill_work_records(h: &Hosts, n: usize) -> bool {
    let Some(etcdctl) = ["/usr/bin/etcdctl", "/usr/local/bin/etcdctl"]
        .into_iter()
        .find(|p| std::path::Path::new(p).is_file())
    else {
        assert!(
            std::env::var_os("NIP_LE_REQUIRE_ETCD").is_none(),
            "NIP_LE_REQUIRE_ETCD is set but etcdctl (Debian's etcd-client) is missing"
        );
        eprintln!("no etcdctl: skipping");
        return false;
    };
    let prefix = format!("/nip-le/{}/work/", h.pubkey);
    let ctl = |args: &[&str], stdin: &str| {
        use std::io::Write;
        let mut c = std::process::Command::new(etcdctl)
            .env("ETCDCTL_API", "3")
            .arg("--endpoints")
            .arg(h.etcd.url())
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("etcdctl starts");
        c.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
        assert!(c.wait().unwrap().success(), "etcdctl {args:?}");
    };
    for batch in (0..n).collect::<Vec<_>>().chunks(128) {
        let puts: String = batch
            .iter()
            .map(|i| format!("put {prefix}filler-{i:06} x\n"))
            .collect();
        ctl(&["txn", "--interactive=false"], &format!("\n{puts}\n\n"));
    }
    let take = r#"{"op":"take","host_id":"b","instance_id":"b-w1","at_ms":1}"#;
    ctl(&["put", &format!("{prefix}open-take"), take], "");
    true
}

/// Renewals never wait behind work records: etcd 100 ms away each way, and
/// 10,000 records of the agent (20 pages, a round trip each: about two
/// TTLs to read them all) that the holder reads when it gains the key and
/// again every TTL/3 while another window's take is open. Its lease is
/// renewed beside the reads, so for three TTLs it acts without a break and
/// the key is written once. (Without the renewer the lease expired during
/// the first read: the key was written again and again and the window
/// never acted for long.)
#[test]
fn over_a_slow_link_a_holder_busy_reading_many_work_records_keeps_its_lease() {
    let Some(h) = Hosts::new() else { return };
    if !fill_work_records(&h, 10_000) {
        return;
    }
    let etcd_addr = h.etcd.url().trim_start_matches("http://").parse().unwrap();
    let link = nip_le_lab::slow_link::SlowLink::start(etcd_addr, Duration::from_millis(100))
        .expect("the proxy starts");
    let mut o = h.opts("a", &[]);
    for (i, a) in o.extra_args.clone().iter().enumerate() {
        if a == "--etcd" {
            o.extra_args[i + 1] = link.url();
        }
    }
    let w = Instance::spawn("a-w1", o.command(Some("a-w1")), Duration::from_secs(10))
        .expect("nip-le run starts");
    one_global_leader(&[&w], Duration::from_secs(30));
    let cursor = w.cursor();
    let since = now_ms();
    std::thread::sleep(Duration::from_secs(3 * TTL_S));
    let breaks: Vec<Leadership> = w.reports()[cursor..]
        .iter()
        .filter_map(|r| r.leadership().cloned())
        .collect();
    assert!(
        breaks.iter().all(acts_globally),
        "acting was interrupted: {breaks:#?}"
    );
    assert!(acts_globally(&latest(&w).unwrap()));
    let writes = key_history(&h.config(), &h.pubkey).unwrap();
    assert_eq!(
        writes.len(),
        1,
        "the key was written again (its lease expired) after {since}: {writes:#?}"
    );
}
