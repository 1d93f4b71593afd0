//! An agent left behind on a host whose lead went elsewhere, on a real etcd
//! with real processes: host a runs the agent (a-w1, beside its sibling
//! a-w2), host b runs b-w1. a-w1 hangs (SIGSTOP). Its etcd lease (TTL 2 s)
//! runs out before its host's stale bound (3 s), so b-w1 takes the agent;
//! a-w1's agent, in a session of its own, answers on. a-w2, which takes
//! host a's lock at the stale bound but not the etcd key (b holds it), stops
//! it: without that it would answer beside b's until a-w1 resumed.
#![cfg(target_os = "linux")]

mod support;

use std::time::Duration;

use nip_le::Level;
use nip_le_cli::drive::cluster::{wait_until, Instance, RunOptions};
use nip_le_cli::lines::Line;
use support::*;

/// (agent pid, first reply, last reply) per agent that answered.
fn spans(replies: &std::path::Path) -> Vec<(u32, u64, u64)> {
    let mut by: std::collections::BTreeMap<u32, (u64, u64)> = Default::default();
    for l in std::fs::read_to_string(replies).unwrap_or_default().lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(l) else {
            continue;
        };
        let (pid, at) = (
            v["agent_pid"].as_u64().unwrap_or(0) as u32,
            v["at_ms"].as_u64().unwrap_or(0),
        );
        let e = by.entry(pid).or_insert((at, at));
        e.0 = e.0.min(at);
        e.1 = e.1.max(at);
    }
    let mut out: Vec<(u32, u64, u64)> = by.into_iter().map(|(p, (a, b))| (p, a, b)).collect();
    out.sort_by_key(|s| s.1);
    out
}

#[test]
fn a_hung_windows_agent_is_stopped_by_its_host_sibling_when_the_agent_goes_to_another_host() {
    let Some(etcd) = etcd_or_skip() else { return };
    let s = Scratch::new();
    let (mentions, replies) = (
        s.tmp.path().join("mentions.jsonl"),
        s.tmp.path().join("replies.jsonl"),
    );
    std::fs::write(&mentions, b"").unwrap();
    let exe = env!("CARGO_BIN_EXE_nip-le-lab");
    let window = |host: &str, w: usize| {
        let dir = s.tmp.path().join(host);
        let agent_cmd = format!(
            "{exe} stand-in-agent --pubkey {} --relay-url wss://relay.example --lease-dir {} --mentions {} --replies {}",
            s.pubkey,
            dir.join("leases").display(),
            mentions.display(),
            replies.display()
        );
        let mut o =
            RunOptions::new(exe, dir.join("locks"), s.pubkey).timings(REFRESH_MS, 3_000, 3_000);
        o.extra_args = vec![
            "--etcd".into(),
            etcd.url(),
            "--host-id".into(),
            host.into(),
            "--etcd-ttl-s".into(),
            "2".into(),
            "--relay".into(),
            s.tmp.path().join("relay.jsonl").display().to_string(),
            "--agent-cmd".into(),
            agent_cmd,
            "--agent-grace-ms".into(),
            "300".into(),
            "--agent-busy-exit-code".into(),
            "1".into(),
        ];
        let id = format!("{host}-w{w}");
        Instance::spawn(&id, o.command(Some(&id)), Duration::from_secs(10))
            .expect("nip-le run starts")
    };
    let mut a1 = window("a", 1);
    assert!(wait_until(Duration::from_secs(10), || a1
        .views()
        .last()
        .is_some_and(|l| l.is_leader && l.level == Level::Global)));
    let (mut a2, mut b1) = (window("a", 2), window("b", 1));
    assert!(wait_until(Duration::from_secs(5), || a2.is_leader()
        == Some(false)
        && b1.is_leader() == Some(false)));
    let publishing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let publisher = {
        let (p, m) = (std::sync::Arc::clone(&publishing), mentions.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            while p.load(std::sync::atomic::Ordering::SeqCst) {
                use std::io::Write;
                let line = format!("{{\"id\":\"m{n}\",\"at_ms\":{}}}\n", nip_le_cli::unix_ms());
                let mut f = std::fs::OpenOptions::new().append(true).open(&m).unwrap();
                f.write_all(line.as_bytes()).unwrap();
                n += 1;
                std::thread::sleep(Duration::from_millis(25));
            }
        })
    };
    assert!(wait_until(Duration::from_secs(5), || running_agent(&a1).is_some()));
    let orphan = running_agent(&a1).unwrap();
    // a-w1 hangs; its agent answers on; its lease runs out first.
    let a_lock = nip_le::lockfile::lock_path(&s.tmp.path().join("a/locks"), &s.pubkey);
    stop_outside_flock(&a1, &a_lock);
    assert!(
        wait_until(Duration::from_secs(10), || b1
            .views()
            .last()
            .is_some_and(|l| l.is_leader && l.level == Level::Global)),
        "b never took the agent: b {:#?}\na2 {:#?}",
        b1.reports(),
        a2.reports()
    );
    assert!(
        wait_until(Duration::from_secs(5), || dead(orphan)),
        "the hung window's agent kept running on host a"
    );
    assert!(wait_until(Duration::from_secs(5), || running_agent(&b1).is_some()));
    // Reported once the orphan is gone: the line follows its death.
    let stopped_by_sibling = wait_until(Duration::from_secs(2), || {
        a2.reports().iter().any(|r| {
            matches!(&r.line, Line::Agent { agent: nip_le::agent::AgentEvent::OrphanStopped { pid, .. }, .. } if *pid == orphan)
        })
    });
    assert!(
        stopped_by_sibling,
        "a-w2 did not stop the orphan: {:#?}",
        a2.reports()
    );
    assert!(
        a2.views()
            .iter()
            .all(|l| !(l.is_leader && l.level == Level::Global)),
        "a-w2 acted across hosts: it stopped the orphan as a start does, not as a host leader"
    );
    assert_eq!(running_agent(&a2), None, "a-w2 ran an agent beside b's");
    std::thread::sleep(Duration::from_millis(500));
    publishing.store(false, std::sync::atomic::Ordering::SeqCst);
    publisher.join().unwrap();
    // From the stop on, only b's agent answered.
    let spans = spans(&replies);
    let last_of_orphan = spans
        .iter()
        .find(|(p, _, _)| *p == orphan)
        .map(|s| s.2)
        .unwrap();
    let b_agent = running_agent(&b1).unwrap();
    let b_span = spans
        .iter()
        .find(|(p, _, _)| *p == b_agent)
        .copied()
        .unwrap();
    assert!(last_of_orphan < b_span.2, "{spans:?}");
    a1.signal(libc::SIGCONT).unwrap();
    for i in [&mut a1, &mut a2, &mut b1] {
        let _ = i.signal(libc::SIGTERM);
        let _ = i.wait_exit(Duration::from_secs(10));
    }
}
