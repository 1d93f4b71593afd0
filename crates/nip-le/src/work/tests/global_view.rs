//! What the global level (etcd) reports, against the ledger.

use super::*;

#[test]
fn what_the_global_level_reports_decides_before_the_ledger() {
    let mut m = holding(3);
    let ix = Index::default();
    let q = queue(&[("done-there", 1), ("taken-there", 1), ("free", 1)]);
    let shared = SharedWork {
        done: ["done-there".to_owned()].into(),
        taken: ["taken-there".to_owned()].into(),
    };
    // Unread: nothing owed, nothing granted.
    m.heard_global(None, true, None, false);
    assert!(m.owed(&q, true, (Some(&ix), 0), NOBODY).is_empty());
    assert_eq!(
        take(&m, "free", Some(&ix), NOBODY),
        TakeStep::Answer(TakeOutcome::Unavailable)
    );
    m.heard_global(Some(Arc::new(shared)), false, None, false);
    assert_eq!(m.owed(&q, true, (Some(&ix), 0), NOBODY), ["free"]);
    assert_eq!(
        take(&m, "done-there", Some(&ix), NOBODY),
        TakeStep::Answer(TakeOutcome::Done)
    );
    let there = take(&m, "taken-there", Some(&ix), NOBODY);
    assert_eq!(there, TakeStep::Answer(TakeOutcome::AlreadyTaken));
    // A gain from a host whose work is unknown: only what is published
    // from then on; a read of the records ends that.
    let q = queue(&[("old", T), ("new", T + 10)]);
    m.heard_global(None, false, Some(T + 5), false);
    assert_eq!(m.owed(&q, true, (Some(&ix), 0), NOBODY), ["new"]);
    m.heard_global(Some(Arc::new(SharedWork::default())), false, None, false);
    assert_eq!(m.owed(&q, true, (Some(&ix), 0), NOBODY), ["old", "new"]);
}

#[cfg(feature = "etcd")]
#[test]
fn the_global_records_leave_our_own_takes_to_our_ledger() {
    let recs = [
        RecordView {
            id: "a",
            done: true,
            instance_id: "w",
        },
        RecordView {
            id: "b",
            done: false,
            instance_id: "us",
        },
        RecordView {
            id: "c",
            done: false,
            instance_id: "w",
        },
    ];
    let (w, others) = SharedWork::from_records(recs, "us");
    assert_eq!(w.done.iter().collect::<Vec<_>>(), ["a"]);
    assert_eq!(w.taken.iter().collect::<Vec<_>>(), ["c"]);
    assert!(others);
    let (_, others) = SharedWork::from_records(recs[..2].iter().copied(), "us");
    assert!(!others);
    assert!(!gives_up_on_records(
        Duration::from_secs(1),
        Duration::from_secs(2)
    ));
    assert!(gives_up_on_records(
        Duration::from_secs(2),
        Duration::from_secs(2)
    ));
}

#[test]
fn a_fall_back_owes_from_the_hosts_unknown_start_though_we_led_later() {
    // Real-process chaos across hosts (1 run in 8 under load): etcd went
    // quiet while another host held the key; our host's leader was killed
    // and its successor led after two mentions were published; at the
    // fall-back it owed from a TTL before etcd went quiet, but no earlier
    // than it led, so nobody answered the two (our ledger shows what our
    // host's leaders did before us: it covers them).
    let led_at = T + 1_000;
    let mut m = machine();
    assert_eq!(m.lead(led_at, true, Some(4), true), Lead::Open { epoch: 4 });
    let ix = Index::default();
    let _ = m.opened(Some(&ix), NOBODY, led_at);
    let q = queue(&[
        ("old", T - 10),
        ("before-us", T + 500),
        ("after", T + 2_000),
    ]);
    m.heard_global(None, false, Some(T), false);
    assert_eq!(
        m.owed(&q, true, (Some(&ix), 0), NOBODY),
        ["before-us", "after"]
    );
    // Our own ledger unreadable: nothing covers our predecessors either.
    assert_eq!(m.owed(&q, true, (None, 0), NOBODY), ["after"]);
}

#[test]
fn our_dones_the_records_lack_go_out_again_newest_first_and_bounded() {
    let mut ops = vec![
        Settle::Done.op("old", 1, T),
        Settle::Done.op("new", 1, T + 5),
        Settle::Done.op("there", 1, T + 9),
        take_op("open", 1, "tok"),
    ];
    let shared = SharedWork {
        done: ["there".to_owned()].into(),
        taken: ["new".to_owned()].into(),
    };
    assert_eq!(shared.lacks_done(&index(&ops), 0), ["new", "old"]);
    // Older than half the retention: its record may have expired, as meant.
    assert_eq!(shared.lacks_done(&index(&ops), T + 1), ["new"]);
    ops.extend(
        (0..MAX_DONES_AGAIN + 5).map(|i| Settle::Done.op(&format!("x{i}"), 1, T + 100 + i as u64)),
    );
    let again = shared.lacks_done(&index(&ops), 0);
    assert_eq!(again.len(), MAX_DONES_AGAIN);
    assert_eq!(again[0], format!("x{}", MAX_DONES_AGAIN + 4));
}
