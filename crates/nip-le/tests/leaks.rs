//! Wake sources are owned and closed: a thousand join/leave cycles next to a
//! live leader leave the process with as many threads and open files as
//! before, and shutdown returns to the count before the elector started,
//! on both backends: the portable one (what macOS and Windows run) watches
//! the leader with a polling thread that must stop at every leave. (Its own
//! test binary, one test, the backends one after the other: nothing else
//! runs in this process meanwhile.)

#![cfg(target_os = "linux")]

use std::time::Duration;

use nip_le::{AgentPubkey, Backend, Config, Elector, InstanceId};

fn count(dir: &str) -> usize {
    std::fs::read_dir(dir).unwrap().count()
}

fn threads() -> usize {
    count("/proc/self/task")
}

/// Open files, the least of a few looks: the writers (a 50 ms refresh)
/// hold a lock file open for a moment while they refresh, which is not a
/// leak; a leaked descriptor shows in every look.
fn fds() -> usize {
    (0..5)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(7));
            count("/proc/self/fd")
        })
        .min()
        .unwrap_or(0)
}

#[test]
fn threads_and_fds_stay_flat_across_join_leave_and_return_after_shutdown() {
    for backend in [Backend::Native, Backend::Portable] {
        flat_across_join_leave(backend);
    }
}

fn flat_across_join_leave(backend: Backend) {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = Config::new(tmp.path());
    c.backend = backend;
    c.refresh = Duration::from_millis(50);
    c.stale = Duration::from_millis(500);
    c.lock_wait = Duration::from_millis(20);
    let k = AgentPubkey::parse(&"7".repeat(64)).unwrap();
    let (t0, f0) = (threads(), fds());
    // A live leader (with a presence lock): every join of ours watches it.
    let leader = Elector::start(c.clone(), InstanceId::new("leader").unwrap()).unwrap();
    assert!(leader.join(&k).unwrap());
    let me = Elector::start(c, InstanceId::new("me").unwrap()).unwrap();
    assert!(!me.join(&k).unwrap());
    me.leave(&k).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let (t1, f1) = (threads(), fds());
    for n in 0..1000 {
        assert!(
            !me.join(&k).unwrap(),
            "cycle {n}: the live leader is respected"
        );
        me.leave(&k).unwrap();
    }
    std::thread::sleep(Duration::from_millis(100));
    let (t2, f2) = (threads(), fds());
    assert_eq!(t2, t1, "threads after 1000 join/leave cycles");
    assert_eq!(f2, f1, "open files after 1000 join/leave cycles");
    me.shutdown();
    leader.shutdown();
    // The `notify` watcher's thread is told to stop when the watcher is
    // dropped but not joined (the crate offers no join): give it a moment.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while threads() > t0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let (t3, f3) = (threads(), fds());
    println!(
        "{}: threads {t0} → {t1} → {t2} → {t3}; fds {f0} → {f1} → {f2} → {f3}",
        backend.as_str()
    );
    assert_eq!(t3, t0, "threads after shutdown");
    assert_eq!(f3, f0, "open files after shutdown");
    // Nothing of ours is left in the lock directory but the lock file, its
    // epoch mark, the work ledgers' directory and, natively,
    // the shared presence file, whose slots are all free (portable presence
    // files are removed).
    let mut names: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let mut expected = vec![
        format!("{}.epoch", k.as_str()),
        format!("{}.lock", k.as_str()),
        "work".to_owned(),
    ];
    if backend == Backend::Native {
        expected.push("presence.live".to_owned());
    }
    expected.sort();
    assert_eq!(names, expected, "{}", backend.as_str());
    // In it, the work ledger (the leader's `held` line) and its empty
    // append hold.
    let mut work: Vec<String> = std::fs::read_dir(tmp.path().join("work"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    work.sort();
    let ledger = format!("{}.work", k.as_str());
    assert_eq!(work, [ledger.clone(), format!("{ledger}.hold")]);
    assert!(nip_le::presence::live_siblings(tmp.path(), &k, "").is_empty());
}
