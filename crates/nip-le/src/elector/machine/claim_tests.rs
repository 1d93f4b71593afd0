//! Claims: the holder stands down once per request, a bystander leaves the
//! lock to the claimant, stand-downs and claims expire, and a claim whose
//! claimant is gone is void.

use super::tests::{evaluate, machine, Clock, ALIVE};
use super::*;
use crate::control::LeadRequest;

#[test]
fn holder_stands_down_once_per_request_and_bystanders_do_not_take_the_free_lock() {
    let c = Clock::new();
    let mut holder = machine(true, "me");
    let mut f = LockContent::Absent;
    evaluate(&mut holder, &mut f, c.now(), Cause::Join, None, &ALIVE);
    let req = LeadRequest::new("target");
    let b = holder.begin(c.now(), Some(&req));
    let sd = b.step_down.clone().expect("the holder stands down");
    assert_eq!(
        (sd.reason, sd.target.as_deref()),
        (ChangeReason::StoodDown, Some("target"))
    );
    holder.step_down(c.now());
    holder.serve_request(sd.nonce);
    let (w, released) = holder.decide_release(&f, c.now(), None);
    assert!(released && matches!(w, Write::Clear(_)));
    holder.released(Ok(LockContent::Empty));
    f = LockContent::Empty;
    assert_eq!(
        holder.look(c.now(), Cause::Tick, Some(&req), &b),
        Look::Read
    );
    // The same request never makes it stand down twice.
    assert!(holder.begin(c.now(), Some(&req)).step_down.is_none());
    // A bystander neither takes the released lock nor fail-safe-leads.
    let mut by = machine(true, "bystander");
    let out = evaluate(&mut by, &mut f, c.now(), Cause::Tick, Some(&req), &ALIVE);
    assert!(!out.leader);
    assert_eq!(f, LockContent::Empty);
    // The target takes it and completes its claim.
    let mut t = machine(true, "target");
    t.claim_pending_from(c.now(), Some(req.nonce.clone()));
    let out = evaluate(&mut t, &mut f, c.now(), Cause::Tick, Some(&req), &ALIVE);
    assert_eq!((out.leader, out.reason), (true, ChangeReason::Claimed));
    assert_eq!(out.remove_request.as_deref(), Some(req.nonce.as_str()));
}

#[test]
fn stand_down_and_pending_claims_expire_on_the_injected_clock() {
    let mut c = Clock::new();
    let mut m = machine(false, "me");
    m.step_down(c.now());
    m.claim_pending_from(c.now(), None);
    let until = c.now().mono + Duration::from_secs(10);
    assert_eq!(m.stand_down_until(), Some(until));
    assert_eq!(m.pending_until(), Some(until));
    c.advance(Duration::from_secs(10) - Duration::from_millis(1));
    m.begin(c.now(), None);
    assert_eq!(m.stand_down_until(), Some(until), "not yet");
    c.advance(Duration::from_millis(1));
    m.begin(c.now(), None);
    assert_eq!((m.stand_down_until(), m.pending_until()), (None, None));
}

#[test]
fn stale_requests_are_ignored() {
    let mut c = Clock::new();
    let mut m = machine(true, "me");
    let mut f = LockContent::Absent;
    evaluate(&mut m, &mut f, c.now(), Cause::Join, None, &ALIVE);
    let req = LeadRequest::new("target");
    c.advance(Duration::from_secs(11));
    // The request was made at the real now; our clock is 11 s later.
    let b = m.begin(c.now(), Some(&req));
    assert!(b.step_down.is_none() && !b.other_wants_it);
}

#[test]
fn a_claim_whose_claimant_is_gone_is_void() {
    // Chaos: a holder that took over a hung one stood down for a claim
    // whose claimant had been killed meanwhile, and nobody led until the
    // claim expired (2.6 s after the hung holder's last write, at a 1.2 s
    // stale bound).
    let c = Clock::new();
    let mut holder = machine(true, "me");
    let mut f = LockContent::Absent;
    evaluate(&mut holder, &mut f, c.now(), Cause::Join, None, &ALIVE);
    let req = LeadRequest::new("target");
    let ask = |m: &mut KeyMachine, gone: bool| {
        m.step(
            Input::Evaluate {
                cause: Cause::Tick,
                request: Some(&req),
                claimant_gone: gone,
            },
            c.now(),
        )
        .step_down()
    };
    assert!(
        ask(&mut holder.clone(), false).is_some(),
        "a live claimant's"
    );
    assert!(ask(&mut holder, true).is_none(), "a dead claimant's");
    // Nor does a bystander leave a hung holder to a dead claimant.
    let by = machine(true, "bystander");
    let may_take = |gone: bool| {
        let mut m = by.clone();
        let _ = ask(&mut m, gone);
        match m.step(Input::Look, c.now()).look() {
            Look::Acquire {
                may_take_others, ..
            } => may_take_others,
            Look::Read => false,
        }
    };
    assert!(!may_take(false), "the live claimant's turn");
    assert!(may_take(true));
}
