use super::*;

const MS: Duration = Duration::from_millis(1);

fn m() -> AgentMachine {
    AgentMachine::new(AgentTimings {
        grace: 500 * MS,
        backoff_min: 100 * MS,
        backoff_max: 2_000 * MS,
        busy_min: 10 * MS,
        busy_max: 40 * MS,
    })
}

const ACT: Lead = Lead {
    may_act: true,
    host_leader: true,
};
const HOST: Lead = Lead {
    may_act: false,
    host_leader: true,
};
const NONE: Lead = Lead {
    may_act: false,
    host_leader: false,
};

#[test]
fn runs_only_while_we_may_act_one_call_at_a_time() {
    let (mut m, t0) = (m(), Instant::now());
    assert!(
        m.step(Input::Look, NONE, t0).is_empty(),
        "never started unled"
    );
    assert_eq!(m.step(Input::Look, ACT, t0), vec![Action::Start]);
    assert!(
        m.step(Input::Look, ACT, t0).is_empty(),
        "one start at a time"
    );
    assert!(m.step(Input::Started(7), ACT, t0).is_empty());
    // Leadership lost: stopped at once, and nothing else until it is gone.
    assert_eq!(m.step(Input::Look, NONE, t0 + MS), vec![Action::Stop(7)]);
    assert!(m.step(Input::Look, NONE, t0 + 2 * MS).is_empty());
    // Regained meanwhile: nothing new starts while the old one stops.
    assert!(m.step(Input::Look, ACT, t0 + 3 * MS).is_empty());
    assert!(m
        .step(
            Input::Exited {
                pid: 99,
                busy: false
            },
            ACT,
            t0
        )
        .is_empty());
    // Gone: only now a new one starts, with no backoff (we stopped it).
    assert_eq!(
        m.step(Input::Stopped(7), ACT, t0 + 4 * MS),
        vec![Action::Start]
    );
}

#[test]
fn a_stop_during_a_start_waits_for_the_start_then_stops_what_it_started() {
    let (mut m, t0) = (m(), Instant::now());
    assert_eq!(m.step(Input::Look, ACT, t0), vec![Action::Start]);
    assert!(
        m.step(Input::Look, NONE, t0).is_empty(),
        "nothing to stop yet"
    );
    assert_eq!(m.step(Input::Started(3), NONE, t0), vec![Action::Stop(3)]);
    assert_eq!(m.state(), State::Stopping { pid: 3 });
    // An exit racing the stop ends it as well.
    assert!(m
        .step(
            Input::Exited {
                pid: 3,
                busy: false
            },
            NONE,
            t0
        )
        .is_empty());
    assert_eq!(m.state(), State::Idle);
}

#[test]
fn an_exit_while_we_may_act_restarts_after_a_doubling_bounded_backoff() {
    let (mut m, mut t) = (m(), Instant::now());
    m.step(Input::Look, ACT, t);
    let mut delays = Vec::new();
    for pid in 1..=8 {
        m.step(Input::Started(pid), ACT, t);
        t += 10 * MS;
        let exit = Input::Exited { pid, busy: false };
        assert!(m.step(exit, ACT, t).is_empty());
        let until = m.next_deadline().unwrap();
        delays.push((until - t).as_millis());
        assert!(m.step(Input::Look, ACT, until - MS).is_empty(), "early");
        assert_eq!(m.step(Input::Look, ACT, until), vec![Action::Start]);
        t = until;
    }
    assert_eq!(delays, vec![100, 200, 400, 800, 1600, 2000, 2000, 2000]);
    // A long run starts the backoff afresh.
    m.step(Input::Started(9), ACT, t);
    t += 2_000 * MS;
    m.step(
        Input::Exited {
            pid: 9,
            busy: false,
        },
        ACT,
        t,
    );
    assert_eq!(m.next_deadline(), Some(t + 100 * MS));
    // Leadership lost while backing off: nothing starts.
    assert!(m.step(Input::Look, NONE, t + 200 * MS).is_empty());
    assert_eq!(m.state(), State::Idle);
}

#[test]
fn busy_answers_are_retried_soon_until_the_lease_is_free_or_the_lead_lost() {
    let (mut m, mut t) = (m(), Instant::now());
    m.step(Input::Look, ACT, t);
    let mut delays = Vec::new();
    for n in 0..5 {
        // Refused at the start, or the agent exits at once for it.
        let busy = if n % 2 == 0 {
            Input::StartFailed { busy: true }
        } else {
            m.step(Input::Started(n), ACT, t);
            Input::Exited { pid: n, busy: true }
        };
        assert!(m.step(busy, ACT, t).is_empty());
        let until = m.next_deadline().unwrap();
        delays.push((until - t).as_millis());
        assert_eq!(m.step(Input::Look, ACT, until), vec![Action::Start]);
        t = until;
    }
    assert_eq!(delays, vec![10, 20, 40, 40, 40], "bounded by busy_max");
    // Started at last and run long: the next busy answer begins at
    // busy_min again, and busy answers never lengthen the failure backoff.
    m.step(Input::Started(50), ACT, t);
    t += 2_000 * MS;
    m.step(
        Input::Exited {
            pid: 50,
            busy: true,
        },
        ACT,
        t,
    );
    assert_eq!(m.next_deadline(), Some(t + 10 * MS));
    m.step(Input::Look, ACT, t + 10 * MS);
    m.step(Input::StartFailed { busy: false }, ACT, t + 10 * MS);
    assert_eq!(m.next_deadline(), Some(t + 110 * MS), "first failure");
    // The lead lost while backing off: no more retries.
    assert!(m.step(Input::Look, NONE, t + 20 * MS).is_empty());
    assert_eq!(m.state(), State::Idle);
}

#[test]
fn a_failed_start_backs_off_and_a_stray_exit_is_ignored() {
    let (mut m, t) = (m(), Instant::now());
    m.step(Input::Look, ACT, t);
    assert!(m
        .step(Input::StartFailed { busy: false }, ACT, t)
        .is_empty());
    assert_eq!(m.next_deadline(), Some(t + 100 * MS));
    assert_eq!(m.step(Input::Look, ACT, t + 100 * MS), vec![Action::Start]);
    m.step(Input::Started(3), ACT, t + 100 * MS);
    let stray = Input::Exited {
        pid: 99,
        busy: false,
    };
    assert!(m.step(stray, ACT, t + 200 * MS).is_empty());
    assert!(matches!(m.state(), State::Running { pid: 3, .. }));
}

#[test]
fn a_host_leader_that_may_not_act_looks_for_a_dead_windows_agent_once_per_lead() {
    let (mut m, t) = (m(), Instant::now());
    assert_eq!(m.step(Input::Look, HOST, t), vec![Action::CheckOrphans]);
    assert!(
        m.step(Input::Look, HOST, t).is_empty(),
        "one look at a time"
    );
    assert!(m.step(Input::OrphansChecked, HOST, t).is_empty());
    assert!(
        m.step(Input::Look, HOST, t).is_empty(),
        "once per host lead"
    );
    // Lost and regained: looked for again.
    assert!(m.step(Input::Look, NONE, t).is_empty());
    assert_eq!(m.step(Input::Look, HOST, t), vec![Action::CheckOrphans]);
    // Acting meanwhile: the start (which stops an orphan first) follows.
    assert_eq!(m.step(Input::OrphansChecked, ACT, t), vec![Action::Start]);
    // An observer of the host never looks.
    let mut o = super::AgentMachine::new(AgentTimings::default());
    assert!(o.step(Input::Look, NONE, t).is_empty());
}

#[test]
fn timings_are_validated() {
    AgentTimings::default().validate().unwrap();
    for bad in [
        AgentTimings {
            grace: Duration::ZERO,
            ..Default::default()
        },
        AgentTimings {
            backoff_min: Duration::from_secs(60),
            ..Default::default()
        },
        AgentTimings {
            busy_min: Duration::from_secs(1),
            ..Default::default()
        },
        AgentTimings {
            grace: Duration::MAX,
            ..Default::default()
        },
    ] {
        assert!(bad.validate().is_err(), "{bad:?}");
    }
}

#[test]
fn a_start_cancelled_for_a_lost_lead_is_no_failure() {
    let (mut m, t) = (m(), Instant::now());
    assert_eq!(m.step(Input::Look, ACT, t), vec![Action::Start]);
    assert!(m.step(Input::StartCancelled, NONE, t).is_empty());
    assert_eq!(m.state(), State::Idle);
    assert_eq!(
        m.step(Input::Look, ACT, t),
        vec![Action::Start],
        "no backoff"
    );
}
