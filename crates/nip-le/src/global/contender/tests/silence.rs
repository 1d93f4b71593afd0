//! A hand-over still owed when etcd falls silent: the host acts alone
//! meanwhile (the fall-back), and whatever etcd answers once it is back,
//! the key's phase and the permit agree.

use super::*;
use crate::global::contender::phase::Phase;

/// `a` holds the key and stands down for `b`'s claim; its writer has not
/// confirmed yet.
fn standing_down() -> (ManualClock, MemoryEtcd, Host, Host, Arc<Cut>) {
    let (clock, etcd) = rig();
    let gw = Arc::new(Cut::on(&etcd));
    let cut = Arc::clone(&gw.cut);
    let mut a = Host::on(
        &etcd,
        &clock,
        "a",
        "a-window",
        WhenUnreachable::FallBack,
        gw.clone(),
        cut,
    );
    let mut b = Host::new(&etcd, &clock, "b", WhenUnreachable::FallBack);
    a.lead(true, false);
    b.lead(true, false);
    pump_all(&mut [&mut a, &mut b]);
    assert!(a.acts() && !b.acts());
    claim_seen(&etcd, &mut a, &mut b);
    assert_eq!(a.task.entries[&pk()].phase(), Phase::HandingOver);
    (clock, etcd, a, b, gw)
}

#[test]
fn a_hand_over_owed_through_a_fall_back_that_etcd_then_refuses_holds_the_key_without_the_fall_backs_permit(
) {
    let (clock, etcd, mut a, mut b, gw) = standing_down();
    // etcd is silent to a for a whole TTL; its leader changed meanwhile
    // (each new leader extends every lease), so a's lease lives on.
    gw.cut.store(true, Ordering::SeqCst);
    let step = TTL / 10;
    for _ in 0..12 {
        clock.advance(step);
        etcd.extend_leases(step);
        a.task.step(None);
    }
    let e = &a.task.entries[&pk()];
    assert!(e.handing_over() && e.falling_back(), "{:?}", e.phase());
    assert_eq!(e.permit.state, PermitState::FallBack, "a acts alone");
    // b's claim ran out and was withdrawn: the swap that a owes finds the
    // key still a's as it left it.
    b.pump();
    assert!(etcd
        .get(&format!("/nip-le/{}/claim", pk()))
        .unwrap()
        .is_none());
    // etcd answers a again, but a renewal's answer is lost; a's writer
    // confirms now.
    gw.cut.store(false, Ordering::SeqCst);
    gw.lose_renewals.store(true, Ordering::SeqCst);
    a.task.step(Some(Inbox::Withdrawn(pk())));
    let e = &a.task.entries[&pk()];
    assert_eq!(e.phase(), Phase::Held);
    assert_eq!(
        e.permit.state,
        PermitState::NotHeld,
        "held again, the fall-back's permit is closed until a renewal"
    );
    gw.lose_renewals.store(false, Ordering::SeqCst);
    clock.advance(step);
    a.pump();
    assert!(a.acts(), "a renewal opens the permit on the lease");
    assert_eq!(a.task.entries[&pk()].permit.state, PermitState::Held);
}
