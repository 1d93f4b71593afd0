//! The two backends in one process: the portable one (what macOS and
//! Windows run, selectable on Linux) hands over, claims and writes records
//! as the native one does, and electors of both share a lock directory.

mod common;

use nip_le::{ChangeReason, ClaimOutcome, Elector};

use common::*;

#[test]
fn extended_release_and_shutdown_hand_the_lock_to_a_live_sibling() {
    release_and_shutdown_hand_over(pair_with(extended));
}

#[test]
fn portable_release_and_shutdown_hand_the_lock_to_a_live_sibling() {
    release_and_shutdown_hand_over(pair_with(portable));
}

/// Both backends in one lock directory: each reads the other's presence.
#[test]
fn native_and_portable_hand_over_to_each_other() {
    release_and_shutdown_hand_over(pair_of(extended, portable));
    release_and_shutdown_hand_over(pair_of(portable, extended));
}

fn release_and_shutdown_hand_over((t, a, b): (tempfile::TempDir, Elector, Elector)) {
    let k = pk('1');
    a.join(&k).unwrap();
    b.join(&k).unwrap();
    let path = nip_le::lockfile::lock_path(t.path(), &k);
    let holder = || {
        nip_le::lockfile::read_unguarded(&path)
            .unwrap()
            .record()
            .cloned()
    };
    let first = holder().unwrap();
    assert_eq!(first.instance_id, "a");
    let e1 = first.epoch.expect("extended records carry an epoch");
    assert!(first.live.is_some());
    let mut rb = b.subscribe();
    // Release: the file goes straight to b, never empty; b leads by the watch.
    assert!(a.release(&k).unwrap());
    let now = holder().expect("never emptied while a sibling lives");
    assert_eq!(now.instance_id, "b");
    assert_eq!(now.epoch, Some(e1 + 1));
    assert!(wait_until(|| b.is_leader(&k)));
    assert!(!a.is_leader(&k));
    let c = rb.blocking_recv().unwrap();
    assert_eq!(
        (c.is_leader, c.reason, c.epoch),
        (true, ChangeReason::HandedOver, Some(e1 + 1))
    );
    // Refreshes keep the epoch.
    b.refresh_now();
    assert_eq!(holder().unwrap().epoch, Some(e1 + 1));
    // Shutdown of the leader hands over too.
    a.resume(&k).unwrap();
    b.shutdown();
    assert_eq!(holder().unwrap().instance_id, "a");
    assert!(wait_until(|| a.is_leader(&k)));
    assert_eq!(holder().unwrap().epoch, Some(e1 + 2));
}

#[test]
fn extended_claim_is_handed_straight_to_the_target() {
    claim_hands_over(pair_with(extended));
}

#[test]
fn portable_claim_is_handed_straight_to_the_target() {
    claim_hands_over(pair_with(portable));
}

fn claim_hands_over((_t, a, b): (tempfile::TempDir, Elector, Elector)) {
    let k = pk('1');
    a.join(&k).unwrap();
    b.join(&k).unwrap();
    let mut ra = a.subscribe();
    // The claim request wakes a through the directory watch: no refresh call.
    let outcome = b.claim(&k).unwrap();
    assert!(matches!(
        outcome,
        ClaimOutcome::Pending | ClaimOutcome::Claimed
    ));
    assert!(wait_until(|| b.is_leader(&k)), "the target never led");
    assert!(!a.is_leader(&k));
    let c = ra.blocking_recv().unwrap();
    assert_eq!((c.is_leader, c.reason), (false, ChangeReason::StoodDown));
}

/// The portable backend writes what Windows writes: a presence file of its
/// own (no slot in the token), no boot id; and a leader that leaves its
/// presence (an elector shut down without a sibling) is seen by the
/// directory watch, not by a refresh.
#[test]
fn portable_records_carry_a_presence_file_token_and_no_boot() {
    let (t, a, b) = pair_with(portable);
    let k = pk('2');
    a.join(&k).unwrap();
    let path = nip_le::lockfile::lock_path(t.path(), &k);
    let rec = nip_le::lockfile::read_unguarded(&path)
        .unwrap()
        .record()
        .cloned()
        .unwrap();
    let token = rec.live.expect("a presence token");
    assert!(!token.contains("-s"), "{token}");
    assert!(t.path().join(format!("{token}.live")).exists());
    assert!(!t.path().join("presence.live").exists());
    assert_eq!(rec.boot, None);
    assert!(rec.host.is_some());
    b.join(&k).unwrap();
    assert!(!b.is_leader(&k));
    a.shutdown();
    assert!(wait_until(|| b.is_leader(&k)), "b never led");
}
