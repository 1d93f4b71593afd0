//! The wake sources' unit tests.

use super::*;

#[test]
fn names_in_the_lock_dir() {
    let pk = "ab".repeat(32);
    let k = AgentPubkey::parse(&pk).unwrap();
    assert_eq!(name_event(&format!("{pk}.lock")), Some(NameEvent::Key(k)));
    assert_eq!(name_event(&format!("{pk}.claim")), Some(NameEvent::Key(k)));
    assert_eq!(
        name_event("12-0123456789abcdef.live"),
        Some(NameEvent::Presence("12-0123456789abcdef".into()))
    );
    assert_eq!(
        name_event(".12-0123456789abcdef-s4.gone"),
        Some(NameEvent::Presence("12-0123456789abcdef-s4".into()))
    );
    for other in [
        format!("{pk}.12-0123456789abcdef.live"),
        "presence.live".to_owned(),
        ".12-0123456789abcdef.live.tmp".to_owned(),
        format!("{pk}.../x.live"),
        format!("{pk}.lock.tmp"),
        ".claim-123".to_owned(),
        "x.lock".to_owned(),
    ] {
        assert_eq!(name_event(&other), None, "{other}");
    }
}

/// Set in the holder process the tests below start.
const HOLDER_ENV: &str = "NIP_LE_TEST_PRESENCE_HOLDER";

/// Not a test of its own: the holder process of the tests below (this test
/// binary again, running only this function). It creates a presence in the
/// directory it is given, prints its token and sleeps until killed.
#[test]
#[ignore = "the holder process the holder-watch tests start"]
fn presence_holder_process() {
    let Some(dir) = std::env::var_os(HOLDER_ENV) else {
        return;
    };
    let p = crate::presence::files::Presence::create(Path::new(&dir), "holder").unwrap();
    println!("token {}", p.token());
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// A live holder in `dir`, in a process of its own, and its token.
fn spawn_holder(dir: &Path) -> (std::process::Child, String) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "elector::wake::tests::presence_holder_process",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(HOLDER_ENV, dir)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = std::io::BufReader::new(child.stdout.take().unwrap());
    let token = out
        .lines()
        .map_while(Result::ok)
        // libtest prints the test's name first, on the same line.
        .find_map(|l| l.rsplit_once("token ").map(|(_, t)| t.trim().to_owned()))
        .expect("the holder prints its token");
    (child, token)
}

/// Waits (up to `deadline`) until `sources` wakes for `key`.
fn woken_for(sources: &mut WakeSources<()>, key: &AgentPubkey, deadline: Duration) -> bool {
    let end = std::time::Instant::now() + deadline;
    while let Some(left) = end.checked_duration_since(std::time::Instant::now()) {
        if sources.wait(Some(left)).keys.contains(key) {
            return true;
        }
    }
    false
}

/// The portable backend with a holder poll of an hour: only a watch on the
/// process itself can report its death within the test's deadline.
fn portable_without_a_poll(dir: &Path) -> WakeSources<()> {
    WakeSources::new(dir, Backend::Portable, Duration::from_secs(3600)).unwrap()
}

#[test]
fn a_killed_holder_is_reported_at_once_on_the_portable_backend_without_a_poll() {
    let tmp = tempfile::tempdir().unwrap();
    let key = AgentPubkey::parse(&"ab".repeat(32)).unwrap();
    let (mut holder, token) = spawn_holder(tmp.path());
    let mut sources = portable_without_a_poll(tmp.path());
    sources.watch_holder(&key, Some(&token));
    assert!(sources.watching(&token));
    // Alive: nothing wakes us.
    assert!(!woken_for(&mut sources, &key, Duration::from_millis(300)));
    holder.kill().unwrap();
    assert!(
        woken_for(&mut sources, &key, Duration::from_secs(10)),
        "the holder's death was not reported"
    );
    assert!(!sources.watching(&token));
    holder.wait().unwrap();
}

#[test]
fn a_holder_gone_before_the_watch_is_looked_at_again_and_a_stopped_watch_ends() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (
        AgentPubkey::parse(&"ab".repeat(32)).unwrap(),
        AgentPubkey::parse(&"cd".repeat(32)).unwrap(),
    );
    let (mut gone, gone_token) = spawn_holder(tmp.path());
    gone.kill().unwrap();
    gone.wait().unwrap();
    let (mut live, live_token) = spawn_holder(tmp.path());
    let mut sources = portable_without_a_poll(tmp.path());
    sources.watch_holder(&a, Some(&gone_token));
    assert!(woken_for(&mut sources, &a, Duration::from_secs(10)));
    assert!(!sources.watching(&gone_token));
    // A watch of a live holder stops (and joins its thread) at once.
    sources.watch_holder(&b, Some(&live_token));
    assert!(sources.watching(&live_token));
    sources.watch_holder(&b, None);
    assert!(!sources.watching(&live_token));
    sources.stop_all();
    live.kill().unwrap();
    live.wait().unwrap();
}

/// The portable watch reports what FSEvents and `ReadDirectoryChangesW`
/// report: a lock file written, never one only opened for writing and
/// closed (every take opens the lock file read-write: with `CLOSE_WRITE`
/// watched, each woke every elector in the directory). On Windows it is
/// that watch itself.
#[test]
fn the_portable_watch_wakes_for_a_write_and_not_for_an_open_for_writing() {
    use std::io::Write;
    let tmp = tempfile::tempdir().unwrap();
    let key = AgentPubkey::parse(&"ab".repeat(32)).unwrap();
    let path = lockfile::lock_path(tmp.path(), &key);
    std::fs::write(&path, b"").unwrap();
    let mut sources = portable_without_a_poll(tmp.path());
    assert!(sources.watch_dir());
    drop(std::fs::OpenOptions::new().write(true).open(&path).unwrap());
    assert!(
        !woken_for(&mut sources, &key, Duration::from_millis(300)),
        "an open for writing woke the watch"
    );
    let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all(b"{}").unwrap();
    assert!(
        woken_for(&mut sources, &key, Duration::from_secs(10)),
        "a write did not wake the watch"
    );
    sources.stop_all();
}
