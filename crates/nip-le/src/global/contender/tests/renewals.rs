//! Renewals never wait behind work records: the task's thread busy with a
//! slow read of the records for three TTLs, the lease lives and the
//! window's permit stays open (the renewer beside the task), and without
//! the renewer both lapse.

use super::*;
use crate::global::contender::renewer::late;

/// Another window's open take of one event, so that the holder reads the
/// records again every TTL/3.
fn another_windows_take(etcd: &MemoryEtcd) {
    let key = format!("/nip-le/{}/work/e1", pk());
    let value = br#"{"op":"take","host_id":"b","instance_id":"b-window","at_ms":1}"#;
    etcd.put(&key, value, 0).unwrap();
}

/// Holds the key, then makes every read of the records take `3 × TTL`;
/// samples for that long whether the leader key lives and the permit is
/// open. Returns (key lived throughout, permit open throughout).
fn busy_for_three_ttls(renewer: bool) -> (bool, bool) {
    let etcd = MemoryEtcd::default();
    another_windows_take(&etcd);
    let calls = Arc::new(Cut::on(&etcd));
    let delay = Arc::clone(&calls.range_delay);
    let (mut c, cell) = shell_holding_on(Clients {
        calls,
        watches: Arc::new(etcd.clone()),
        renewals: renewer.then(|| Arc::new(etcd.clone()) as Arc<dyn Etcd>),
    });
    *delay.lock().unwrap() = TTL * 3;
    let (mut key_lived, mut open) = (true, true);
    let end = Instant::now() + TTL * 3;
    while Instant::now() < end {
        key_lived &= etcd.get(&leader_key()).unwrap().is_some();
        open &= cell.is_leader();
        std::thread::sleep(Duration::from_millis(20));
    }
    *delay.lock().unwrap() = Duration::ZERO;
    c.shutdown();
    (key_lived, open)
}

#[test]
fn a_task_busy_with_work_records_for_three_ttls_keeps_its_lease_and_its_permit() {
    assert_eq!(busy_for_three_ttls(true), (true, true));
}

/// The same without the renewer: the test can fail.
#[test]
fn without_the_renewer_the_lease_and_the_permit_lapse_behind_the_read() {
    assert_eq!(busy_for_three_ttls(false), (false, false));
}

#[test]
fn the_renewer_steps_in_only_when_the_task_is_late() {
    let t = Instant::now();
    let ttl = TTL;
    assert!(!late(t, None, t, ttl), "on time");
    assert!(!late(t, None, t + ttl / 24, ttl), "a little late");
    assert!(late(t, None, t + ttl / 12, ttl), "late");
    let ours = t + ttl / 12;
    assert!(!late(t, Some(ours), t + ttl / 4, ttl), "renewed it already");
    assert!(
        late(t, Some(ours), ours + ttl / 3, ttl),
        "a third of a TTL later"
    );
}
