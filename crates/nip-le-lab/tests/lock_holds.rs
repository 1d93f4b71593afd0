//! A peer hanging on the lock file's lock (this test process, holding it
//! from a thread: an `flock`, or Windows' `LockFileEx`) must not move leadership, during the hold or when it lets go,
//! and every mention published meanwhile is answered once when it does. The
//! holder fences itself at the deadline of its last write (a renewal during
//! the hold let an observer that never tried to lock take over while the
//! holder still acted: docs/simulator.md), so the agent is silent for the
//! rest of the hold, never doubled.

mod support;

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

use nip_le_cli::drive::cluster::{wait_until, Instance};
use nip_le_cli::lines::ReplyLine;
use support::*;

/// Whether another process holds the exclusive `flock` of `path`.
fn held_by_someone(path: &std::path::Path) -> bool {
    matches!(
        nip_le::lockfile::LockedFile::open_and_lock(path, Duration::ZERO),
        Err(nip_le::Error::LockTimeout { .. })
    )
}

#[test]
fn a_peer_hanging_on_the_file_lock_moves_no_leadership_and_loses_no_mention() {
    let s = Scratch::new();
    let (mut opts, mentions, replies) = s.fed_opts(b"");
    // Windows that queue every mention and work it through the ledger.
    opts.extra_args = vec!["--turn-ms".into(), "20".into()];
    let insts: Vec<Instance> = (0..3)
        .map(|i| s.spawn_with(&format!("i{i}"), opts.clone()))
        .collect();
    assert!(wait_until(Duration::from_secs(10), || leaders(&insts)
        .len()
        == 1
        && insts.iter().all(|i| i.is_leader().is_some())));
    let leader = insts
        .iter()
        .position(|i| i.is_leader() == Some(true))
        .unwrap();
    let cursors: Vec<usize> = insts.iter().map(Instance::cursor).collect();
    // Three stale bounds of a peer stuck inside its critical section.
    let hold_ms = 3 * STALE_MS;
    let path = s.lock_path();
    let peer = std::thread::spawn(move || {
        let held = nip_le::lockfile::LockedFile::open_and_lock(&path, Duration::from_secs(5))
            .expect("the peer takes the lock");
        std::thread::sleep(Duration::from_millis(hold_ms));
        drop(held);
    });
    assert!(wait_until(Duration::from_secs(5), || held_by_someone(
        &s.lock_path()
    )));
    // Mentions keep arriving during the hold, past the point where the
    // holder would have fenced itself.
    let ids: Vec<String> = (0..6).map(|i| format!("held{i}")).collect();
    for id in &ids {
        let line = format!("{{\"id\":\"{id}\",\"at_ms\":{}}}\n", nip_le_cli::unix_ms());
        std::fs::OpenOptions::new()
            .append(true)
            .open(&mentions)
            .unwrap()
            .write_all(line.as_bytes())
            .unwrap();
        std::thread::sleep(Duration::from_millis(hold_ms / 8));
    }
    assert!(
        held_by_someone(&s.lock_path()),
        "the hold ended before the last mention"
    );
    let answered = || {
        let mut m: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for r in ReplyLine::read_all(&replies) {
            m.entry(r.mention_id()).or_default().push(r.instance_id);
        }
        m
    };
    // Nobody else leads during the hold: the observers that find the lock
    // held give the holder a fresh window.
    assert!(
        (0..3).all(|i| i == leader || !ever_led_after(&insts[i], cursors[i])),
        "leadership moved during the hold"
    );
    peer.join().unwrap();
    // The holder's first write after the hold unfences it: what was
    // published meanwhile is answered then, once, by the holder.
    assert!(
        wait_until(Duration::from_secs(5), || ids
            .iter()
            .all(|id| answered().contains_key(id))),
        "not answered after the hold: {:?}",
        answered()
    );
    for id in &ids {
        assert_eq!(
            answered()[id],
            vec![insts[leader].instance_id.clone()],
            "{id}"
        );
    }
    // The hold is over: nobody judges the holder hung for it.
    assert!(
        !wait_until(Duration::from_millis(2 * STALE_MS), || (0..3)
            .any(|i| i != leader && ever_led_after(&insts[i], cursors[i]))),
        "leadership moved when the hold ended"
    );
    assert_eq!(
        s.holder().as_deref(),
        Some(insts[leader].instance_id.as_str())
    );
    assert_eq!(insts[leader].is_leader(), Some(true));
}

/// The first record of a crowd start: its writer holds the lock of a file
/// still empty while it makes the epoch mark durable (long on a loaded
/// disk). A window that joins meanwhile waits for the record instead of
/// fail-safe-leading beside the writer (a clean-clone run saw a second of
/// sixteen windows started together lead for a moment); one that hangs
/// there for the stale bound never silences the agent.
#[test]
fn a_window_joining_while_a_peer_holds_the_lock_of_an_empty_file_waits_then_fails_safe() {
    let s = Scratch::new();
    let path = s.lock_path();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let held = nip_le::lockfile::LockedFile::open_and_lock(&path, Duration::from_secs(5))
        .expect("the peer takes the lock of an empty file");
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
    let w = s.spawn("w");
    assert!(wait_until(Duration::from_secs(5), || w
        .is_leader()
        .is_some()));
    assert_eq!(w.is_leader(), Some(false), "led beside the writer");
    // The hold outlasts the stale bound: the NIP's fail-safe, once.
    let led = w.wait_after(0, ms(STALE_MS) + MARGIN + MARGIN, |r| {
        r.is_leader() == Some(true)
    });
    let led = led.expect("a writer hung on an empty file silenced the agent");
    assert_eq!(led.reason(), Some(nip_le::ChangeReason::FailSafe));
    drop(held);
}
