//! The leader-gated agent process (`nip-le run --agent-cmd`), with real
//! processes and real signals: three windows supervise a stand-in for
//! upstream's harness (`nip-le-lab stand-in-agent`: the same instance lease,
//! and a reply to every mention published while it runs). Claims, SIGKILL
//! and graceful close of windows, SIGKILL and SIGTERM of the agent: the
//! agent only ever runs for the window that leads, a SIGKILLed or hung
//! window's agent is stopped, no two agents ever answer in overlapping
//! spans, no mention is answered twice, and nothing the agents started (a
//! worker each keeps in its session) outlives the windows.
#![cfg(target_os = "linux")]

mod support;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nip_le::agent::AgentEvent;
use nip_le_cli::drive::cluster::{wait_until, Instance, RunOptions};
use nip_le_cli::lines::Line;
use support::*;

/// The agent lines an instance printed: (at_ms, event).
fn agent_events(i: &Instance) -> Vec<(u64, AgentEvent)> {
    i.reports()
        .into_iter()
        .filter_map(|r| match r.line {
            Line::Agent { at_ms, agent, .. } => Some((at_ms, agent)),
            _ => None,
        })
        .collect()
}

/// The single window that leads and whose agent answered a mention
/// published after `after_ms`: its index and agent pid.
fn serving(insts: &[Instance], replies: &Path, after_ms: u64, deadline: Duration) -> (usize, u32) {
    let mut found = None;
    let ok = wait_until(deadline, || {
        let leaders: Vec<usize> = (0..insts.len())
            .filter(|&i| !insts[i].exited() && insts[i].is_leader() == Some(true))
            .collect();
        let [l] = leaders[..] else { return false };
        let Some(pid) = running_agent(&insts[l]) else {
            return false;
        };
        let answered = read_replies(replies)
            .iter()
            .any(|r| r.pid == pid && r.at_ms > after_ms);
        found = Some((l, pid));
        answered
    });
    assert!(ok, "no leader's agent answering (last seen {found:?})");
    // Let it serve a while: more mentions, more chances to answer twice.
    std::thread::sleep(Duration::from_millis(300));
    found.unwrap()
}

#[derive(Debug, Clone)]
struct Reply {
    mention: String,
    instance_id: String,
    pid: u32,
    at_ms: u64,
}

fn read_replies(path: &Path) -> Vec<Reply> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|v| Reply {
            mention: v["mention"].as_str().unwrap_or_default().to_owned(),
            instance_id: v["instance_id"].as_str().unwrap_or_default().to_owned(),
            pid: v["agent_pid"].as_u64().unwrap_or_default() as u32,
            at_ms: v["at_ms"].as_u64().unwrap_or_default(),
        })
        .collect()
}

/// The live processes that carry one of `ids` as their instance id.
fn carrying(ids: &[String]) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if dead(pid) {
            continue;
        }
        let env = std::fs::read(e.path().join("environ")).unwrap_or_default();
        let carries = env.split(|b| *b == 0).any(|v| {
            ids.iter()
                .any(|id| v == format!("{}={id}", nip_le::ELECTION_ID_ENV).as_bytes())
        });
        if carries {
            out.push(pid);
        }
    }
    out
}

/// Kills, when the test ends (passed or not), every process whose command
/// line names the scratch directory: an agent that outlived its window
/// must not keep the test's output open.
struct Strays(String);

impl Drop for Strays {
    fn drop(&mut self) {
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains(&self.0) {
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

#[test]
fn the_agent_runs_only_for_the_leader_and_answers_each_mention_once() {
    let s = Scratch::new();
    let _strays = Strays(s.tmp.path().display().to_string());
    let mentions = s.tmp.path().join("mentions.jsonl");
    let replies = s.tmp.path().join("replies.jsonl");
    std::fs::write(&mentions, b"").unwrap();
    let exe = env!("CARGO_BIN_EXE_nip-le-lab");
    let agent_cmd = format!(
        "{exe} stand-in-agent --pubkey {} --relay-url wss://relay.example --lease-dir {} --mentions {} --replies {} --worker --lease-release-ms 200",
        s.pubkey,
        s.tmp.path().join("leases").display(),
        mentions.display(),
        replies.display()
    );
    let opts: RunOptions = {
        let mut o = s.opts();
        o.extra_args = vec![
            "--agent-cmd".into(),
            agent_cmd,
            "--agent-grace-ms".into(),
            "300".into(),
            "--agent-backoff-ms".into(),
            "20".into(),
            "--agent-backoff-max-ms".into(),
            "200".into(),
            "--agent-busy-exit-code".into(),
            "1".into(),
        ];
        o
    };
    let mut insts: Vec<Instance> = (0..3)
        .map(|i| s.spawn_with(&format!("w{i}"), opts.clone()))
        .collect();

    // The relay fans a mention out every 30 ms throughout.
    let publishing = Arc::new(AtomicBool::new(true));
    let publisher = {
        let (publishing, mentions) = (Arc::clone(&publishing), mentions.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            while publishing.load(Ordering::SeqCst) {
                let line = format!("{{\"id\":\"m{n}\",\"at_ms\":{}}}\n", nip_le_cli::unix_ms());
                use std::io::Write;
                std::fs::OpenOptions::new()
                    .append(true)
                    .open(&mentions)
                    .unwrap()
                    .write_all(line.as_bytes())
                    .unwrap();
                n += 1;
                std::thread::sleep(Duration::from_millis(30));
            }
        })
    };
    let deadline = Duration::from_secs(10);
    let (mut leader, mut agent) = serving(&insts, &replies, 0, deadline);

    // 1. A claim from an observer: the old agent is stopped, the claimer's
    //    runs (after the old one left the lease).
    let claimer = (leader + 1) % 3;
    insts[claimer].send("claim").unwrap();
    assert!(wait_until(deadline, || insts[claimer].is_leader() == Some(true)));
    assert!(
        wait_until(Duration::from_secs(2), || dead(agent)),
        "the old leader's agent was stopped"
    );
    let t = nip_le_cli::unix_ms();
    let (l, a) = serving(&insts, &replies, t, deadline);
    assert_eq!(l, claimer, "the claimer serves");
    (leader, agent) = (l, a);
    // Its agent is named for a successor: the window whose agent had just
    // ended once removed the mark the claimer wrote in that moment.
    assert_eq!(
        nip_le::agent::orphan::read_mark(&s.lock_dir, &s.pubkey).map(|m| m.pid),
        Some(agent),
        "the agent mark names the serving agent"
    );

    // 2. SIGKILL of the leading window: its agent is stopped, and a
    //    survivor's agent takes over. Native Linux: the kernel killed the
    //    agent with its window, and the successor stops the worker it
    //    left in its session. Portable (what macOS and Windows run): the
    //    successor stops both, named by the mark.
    insts[leader].kill_and_reap().unwrap();
    assert!(
        wait_until(deadline, || dead(agent)),
        "the SIGKILLed window's agent kept running"
    );
    let t = nip_le_cli::unix_ms();
    let (l, a) = serving(&insts, &replies, t, deadline);
    let stopped_by_successor = agent_events(&insts[l])
        .iter()
        .any(|(_, e)| matches!(e, AgentEvent::OrphanStopped { pid, .. } if *pid == agent));
    assert!(stopped_by_successor, "the orphan's session was not stopped");
    let dead_id = insts[leader].instance_id.clone();
    assert!(
        wait_until(deadline, || carrying(std::slice::from_ref(&dead_id))
            .is_empty()),
        "the SIGKILLed window's agent left {:?} running",
        carrying(&[dead_id])
    );
    insts[leader] = s.spawn_with("w-respawned", opts.clone());
    (leader, agent) = (l, a);

    // 2b. SIGSTOP of the leading window: its agent, in a session of its
    //     own, keeps running until the successor, which takes the lock at
    //     the stale bound, stops it before starting its own.
    stop_outside_flock(&insts[leader], &s.lock_path());
    assert!(
        wait_until(deadline, || dead(agent)),
        "the hung window's agent kept running"
    );
    insts[leader].signal(libc::SIGCONT).unwrap();
    let t = nip_le_cli::unix_ms();
    let (l, a) = serving(&insts, &replies, t, deadline);
    assert_ne!(l, leader, "the hung window led again");
    assert!(agent_events(&insts[l])
        .iter()
        .any(|(_, e)| matches!(e, AgentEvent::OrphanStopped { pid, .. } if *pid == agent)));
    (leader, agent) = (l, a);

    // 3. SIGKILL, then SIGTERM, of the agent itself: restarted while its
    //    window leads, and reported as exited.
    for sig in [libc::SIGKILL, libc::SIGTERM] {
        unsafe { libc::kill(agent as i32, sig) };
        // SIGTERM lets it answer what it is reading: wait until it is gone.
        assert!(wait_until(Duration::from_secs(2), || dead(agent)));
        let t = nip_le_cli::unix_ms();
        let (l, a) = serving(&insts, &replies, t, deadline);
        assert_eq!(l, leader, "the leader did not change");
        assert_ne!(a, agent, "a new agent process");
        assert!(agent_events(&insts[leader])
            .iter()
            .any(|(_, e)| matches!(e, AgentEvent::Exited { pid, .. } if *pid == agent)));
        agent = a;
    }

    // 4. A graceful close of the leading window: the agent is stopped
    //    first, then the lead handed over.
    insts[leader].signal(libc::SIGTERM).unwrap();
    assert!(insts[leader].wait_exit(Duration::from_secs(5)).is_some());
    assert!(agent_events(&insts[leader])
        .iter()
        .any(|(_, e)| matches!(e, AgentEvent::Stopped { pid, killed: false } if *pid == agent)));
    let t = nip_le_cli::unix_ms();
    let (l, last) = serving(&insts, &replies, t, deadline);
    assert_ne!(l, leader);
    let last_started = agent_events(&insts[l])
        .iter()
        .filter_map(|(at, e)| {
            matches!(e, AgentEvent::Started { pid } if *pid == last).then_some(*at)
        })
        .max()
        .unwrap();

    std::thread::sleep(Duration::from_millis(500));
    publishing.store(false, Ordering::SeqCst);
    publisher.join().unwrap();
    let stopped_publishing = nip_le_cli::unix_ms();
    std::thread::sleep(Duration::from_millis(300));

    // Once the last agent runs, every mention is answered (the stand-in
    // answers what is published while it runs).
    let replied: std::collections::HashSet<String> = read_replies(&replies)
        .into_iter()
        .map(|r| r.mention)
        .collect();
    let owed: Vec<String> = std::fs::read_to_string(&mentions)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| {
            let at = v["at_ms"].as_u64().unwrap_or(0);
            at > last_started + 100 && at + 100 < stopped_publishing
        })
        .map(|v| v["id"].as_str().unwrap().to_owned())
        .collect();
    assert!(owed.len() >= 10, "{owed:?}");
    let missed: Vec<_> = owed.iter().filter(|m| !replied.contains(*m)).collect();
    assert!(
        missed.is_empty(),
        "missed while the last agent ran: {missed:?}"
    );

    // Each mention answered at most once, every reply from a supervised
    // agent carrying its window's instance id, and no two agents answering
    // in overlapping spans.
    let all = read_replies(&replies);
    let mut per_mention: HashMap<&str, usize> = HashMap::new();
    for r in &all {
        *per_mention.entry(&r.mention).or_default() += 1;
    }
    let twice: Vec<_> = per_mention.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "answered twice: {twice:?}");
    let ids: Vec<String> = insts.iter().map(|i| i.instance_id.clone()).collect();
    let mut spans: HashMap<u32, (u64, u64)> = HashMap::new();
    for r in &all {
        assert!(
            !r.instance_id.is_empty(),
            "the agent got no instance id: {r:?}"
        );
        let e = spans.entry(r.pid).or_insert((r.at_ms, r.at_ms));
        e.0 = e.0.min(r.at_ms);
        e.1 = e.1.max(r.at_ms);
    }
    let mut spans: Vec<(u64, u64, u32)> = spans.into_iter().map(|(p, (a, b))| (a, b, p)).collect();
    spans.sort();
    for w in spans.windows(2) {
        assert!(
            w[0].1 <= w[1].0,
            "agents {} and {} answered in overlapping spans: {spans:?}",
            w[0].2,
            w[1].2
        );
    }
    println!(
        "{} replies from {} agent processes, windows {ids:?}",
        all.len(),
        spans.len()
    );
    let started = Instant::now();
    let all_ids: Vec<String> = insts.iter().map(|i| i.instance_id.clone()).collect();
    for i in insts.iter_mut().filter(|i| !i.exited()) {
        let _ = i.signal(libc::SIGTERM);
        let _ = i.wait_exit(Duration::from_secs(5));
    }
    assert!(started.elapsed() < Duration::from_secs(15));
    // Nothing any agent started outlives the windows.
    assert!(
        wait_until(Duration::from_secs(3), || carrying(&all_ids).is_empty()),
        "left behind: {:?}",
        carrying(&all_ids)
    );
}
