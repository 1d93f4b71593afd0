//! The simulator's teeth: every defect a fix removed (`nip_le::mutant`),
//! put back alone, fails the simulator seed named as its guard below,
//! and the same seed passes without it. Defects the simulator does not
//! reach are guarded by the unit tests `scripts/teeth.sh` names, which
//! it runs with the defect on and expects to fail. Run by the test
//! command (`bash scripts/teeth.sh`):
//!
//! ```text
//! cargo test -p nip-le --features sim,mutants --test teeth
//! ```
//!
//! A guard seed that no longer fails (the fault plan changed) is found
//! again by the search, which prints a new row for `GUARDS`:
//!
//! ```text
//! NIP_LE_TEETH_SEARCH=hang,lost cargo test -p nip-le --features sim,mutants \
//!   --test teeth -- --ignored --nocapture search
//! ```
#![cfg(all(feature = "sim", feature = "mutants"))]

use std::collections::BTreeSet;

use nip_le::global::WhenUnreachable;
use nip_le::mutant::{self, Mutant};
use nip_le::sim::{self, HostsOptions, Mix, Options};

/// Simulated seconds of every run (the CI budget's).
const SECONDS: u64 = 120;

/// Which faults a run draws.
#[derive(Debug, Clone, Copy)]
enum Faults {
    /// Every kind.
    All,
    /// All but clock faults (durability defects).
    NoClocks,
    /// Neither file nor clock faults (the election's defects).
    NoFilesClocks,
    /// Starved wake-ups only (the hang timer's defects).
    Starvation,
}

/// One run of the simulator.
#[derive(Debug, Clone, Copy)]
enum Run {
    /// Three extended windows working a queue.
    Extended(Faults),
    /// Extended and spec windows and harness peers.
    Mixed(Faults),
    /// Hosts contending on a simulated etcd under a policy.
    Hosts(WhenUnreachable),
    /// Extended windows, every fault, a work ledger kept to a 2 KiB
    /// rewrite budget with a 2 s settle lag (the settled mark at work).
    SmallLedger,
}

use Faults::*;
use Run::*;

/// Each defect the simulator catches, the run and the first seed that
/// caught it.
const GUARDS: &[(Mutant, Run, u64)] = &[
    // write after leave at 65.883 s: w2 wrote a key it had left
    (Mutant::Leave, Extended(NoFilesClocks), 2),
    // two acting windows at 76.126 s: ["w0rr", "w1rr", "w0rr"] act while the record names w1rr
    (Mutant::BusyRenew, Extended(All), 1564),
    // hot loop at 62.040 s: w2rr's writer wakes again at once, forever
    (Mutant::HotLoop, Extended(NoFilesClocks), 10),
    // two holders of etcd's key at 10.337 s: ["aw1", "bw1"] act, each holding the key
    (Mutant::NoFence, Hosts(WhenUnreachable::FallBack), 1),
    // two acting hosts at 10.652 s: ["aw1", "bw1"] act under the stay-silent policy
    (
        Mutant::FallbackAlways,
        Hosts(WhenUnreachable::StaySilent),
        1,
    ),
    // two holders of etcd's key at 0.019 s: ["aw1", "cw1"] act, each holding the key
    (Mutant::Steal, Hosts(WhenUnreachable::FallBack), 1),
    // two holders of etcd's key at 63.709 s: ["aw1r", "cw1"] act, each holding the key
    (Mutant::EarlyHandover, Hosts(WhenUnreachable::FallBack), 2),
    // two acting windows at 107.712 s: ["w1", "w0rr"] act while the record names w0rr
    (Mutant::ChildRewrite, Extended(NoFilesClocks), 107),
    // epoch issued twice at 30.015 s: epoch 1 named w2, then w1
    (Mutant::ChildEpoch, Extended(NoFilesClocks), 2),
    // two acting windows at 109.748 s: ["w0rr", "w2rr"] act while the record names w2rr
    (Mutant::NoWait, Extended(NoFilesClocks), 2),
    // two acting windows at 101.838 s: ["w2", "w0r"] act while the record names w0r
    (Mutant::UnknownHolder, Extended(NoClocks), 212),
    // never answered at 283.382 s: mention 3 published at 6677 ms
    (Mutant::LedgerlessChild, Extended(NoFilesClocks), 11),
    // never answered at 283.929 s: mention 54 published at 110436 ms
    (Mutant::DoneFenced, Extended(NoFilesClocks), 1),
    // answered twice at 23.011 s: mention 9 by w1 at 21950 ms and by w0
    (Mutant::NoInFlight, Extended(NoFilesClocks), 12),
    // never answered at 283.724 s: mention 53 published at 107073 ms
    (Mutant::NoTail, Extended(NoFilesClocks), 220),
    // answered twice at 23.011 s: mention 9 by w1 at 21950 ms and by w0
    (Mutant::StandDownGivesBack, Extended(NoFilesClocks), 12),
    // silence at 98.063 s: nobody acted for 45148 ms (bound 44858 ms)
    (Mutant::PauseEveryRound, Extended(Starvation), 4),
    // answered twice at 120.241 s: mention 35 by w0rr at 118815 ms and by w0rr
    (Mutant::TakeUnsynced, Extended(NoClocks), 46),
    // answered twice at 119.239 s: mention 35 by w1 at 83358 ms and by w0r
    (Mutant::LossDropsLines, Extended(NoClocks), 12),
    // answered twice at 139.641 s: mention 21 by w2r at 85223 ms and by w2rr
    (Mutant::LeaveDropsLines, Extended(NoClocks), 169),
    // answered twice at 99.731 s: mention 9 by w0 at 17138 ms and by w1rr
    (Mutant::UnsettledLost, Extended(NoClocks), 91),
    // answered twice at 106.037 s: mention 16 by w0 at 47784 ms and by w1rr
    (Mutant::FailsafeDone, Extended(NoClocks), 29),
    // answered twice at 133.929 s: mention 19 by w1rr at 133216 ms and by w0r
    (Mutant::FailsafeTake, Extended(NoClocks), 51),
    // never answered at 302.674 s: mention 25 published at 47762 ms
    (Mutant::GluedLine, Extended(NoClocks), 61),
    // two acting windows at 26.295 s: ["w1", "w0"] act while the record names w0
    (Mutant::UnseenEpoch, Extended(All), 236),
    // answered twice at 91.090 s: mention 38 by w2rr at 82344 ms and by w0rrr
    (Mutant::DoneNotSynced, Extended(NoClocks), 5),
    // never answered at 283.917 s: mention 51 published at 100533 ms
    (Mutant::LateByPublished, Extended(All), 504),
    // answered twice at 138.066 s: mention 9 by w0r at 137815 ms and by w2rrr
    (Mutant::HiddenTake, Extended(All), 76),
    // never answered at 310.847 s: mention 21 published at 41713 ms
    (Mutant::RegainDropsLines, Extended(NoClocks), 49),
    // two acting windows at 84.322 s: ["w1", "w0"] act while the record names w1
    (Mutant::PauseKeepsVacatedDeadline, Extended(NoClocks), 858),
    // answered twice at 15.609 s: mention 7 by w1 at 15399 ms and by w2
    (Mutant::NoReplyFlight, Extended(NoClocks), 14949),
    // two acting windows at 90.180 s: ["w1r", "w0rr"] act while the record names w0rr
    (Mutant::JoinerTakesChildByPid, Extended(NoClocks), 4641),
    // two holders of etcd's key at 49.676 s: ["cw1", "cw0r"] act, each holding the key
    (
        Mutant::UnlockedAcquires,
        Hosts(WhenUnreachable::FallBack),
        155,
    ),
    // never answered at 324.926 s: mention 0 published at 500 ms
    (Mutant::HeldNotSynced, Extended(NoClocks), 286),
    // a contender's key outside its phase at 102.614 s: host b: bw0's etcd contender: <key>: holds a lease without leading its host (Held)
    (
        Mutant::HeldAfterStepBack,
        Hosts(WhenUnreachable::FallBack),
        855,
    ),
    // answered twice at 51.112 s: mention 0 by w0 at 1646 ms and by w1rr
    (Mutant::ForgetAnswered, SmallLedger, 1),
    // never answered at 283.787 s: mention 42 published at 84764 ms
    (Mutant::FullWedge, SmallLedger, 97),
];

fn mix(f: Faults) -> Mix {
    let mut m = Mix::ALL;
    match f {
        All => {}
        NoClocks => m.clocks = false,
        NoFilesClocks => (m.clocks, m.files) = (false, false),
        Starvation => {
            m = Mix {
                processes: false,
                holds: false,
                clocks: false,
                files: false,
                starvation: true,
                pids: false,
                children: false,
            }
        }
    }
    m
}

/// The violation `seed` of `run` ends in, if any.
fn violation(run: Run, seed: u64) -> Option<String> {
    match run {
        Extended(f) | Mixed(f) => {
            let mut o = match run {
                Extended(_) => Options::extended(SECONDS),
                _ => Options::mixed(SECONDS),
            };
            o.mix = mix(f);
            sim::run(seed, &o).violation.map(|v| v.to_string())
        }
        Hosts(policy) => {
            let mut o = HostsOptions::new(SECONDS);
            o.policy = policy;
            sim::run_hosts(seed, &o, false)
                .violation
                .map(|v| v.to_string())
        }
        SmallLedger => {
            let mut o = Options::extended(SECONDS);
            o.ledger_budget = Some(2048);
            o.settle_lag = std::time::Duration::from_secs(2);
            sim::run(seed, &o).violation.map(|v| v.to_string())
        }
    }
}

/// The defects `scripts/teeth.sh` hands to unit tests (`guard`), and
/// those it says no test catches (`unguarded`, with the reason).
fn listed_in_script() -> BTreeSet<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/teeth.sh");
    let script = std::fs::read_to_string(path).expect("scripts/teeth.sh");
    script
        .lines()
        .filter_map(|l| {
            l.strip_prefix("guard ")
                .or_else(|| l.strip_prefix("unguarded "))
        })
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_defect_put_back_fails_its_guard_seed_and_only_with_it() {
    let mut wrong = Vec::new();
    for &(m, run, seed) in GUARDS {
        mutant::set(Some(m));
        let with = violation(run, seed);
        mutant::set(None);
        let without = violation(run, seed);
        match (with, without) {
            (Some(_), None) => {}
            (None, _) => wrong.push(format!(
                "{}: seed {seed} of {run:?} no longer catches it (search again, see the file's docs)",
                m.name()
            )),
            (Some(_), Some(v)) => wrong.push(format!(
                "{}: seed {seed} of {run:?} fails without the defect too: {v}",
                m.name()
            )),
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn every_defect_has_one_guard() {
    let in_script = listed_in_script();
    let mut wrong = Vec::new();
    for &m in Mutant::ALL {
        let seeds = GUARDS.iter().filter(|g| g.0 == m).count();
        let unit = in_script.contains(m.name());
        if seeds + usize::from(unit) != 1 {
            wrong.push(format!(
                "{}: {seeds} guard seeds, {} in scripts/teeth.sh",
                m.name(),
                if unit { "listed" } else { "not listed" }
            ));
        }
    }
    for name in &in_script {
        if Mutant::from_name(name).is_none() {
            wrong.push(format!("scripts/teeth.sh names no defect: {name}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The runs a search tries, in order, with their number of seeds.
const SEARCH: &[(Run, u64)] = &[
    (Extended(NoFilesClocks), 300),
    (Mixed(NoFilesClocks), 250),
    (Extended(NoClocks), 300),
    (Mixed(NoClocks), 250),
    (Extended(Starvation), 300),
    (Extended(All), 3000),
    (Mixed(All), 250),
    (SmallLedger, 300),
];

const SEARCH_HOSTS: &[(Run, u64)] = &[
    (Hosts(WhenUnreachable::FallBack), 200),
    (Hosts(WhenUnreachable::StaySilent), 60),
];

/// Prints a `GUARDS` row for each defect named in `NIP_LE_TEETH_SEARCH`
/// (comma-separated, or `all`): the first seed of the first run that
/// fails with it and passes without it.
#[test]
#[ignore = "a search, not a check: see the file's docs"]
fn search() {
    let asked = std::env::var("NIP_LE_TEETH_SEARCH").unwrap_or_default();
    let defects: Vec<Mutant> = if asked == "all" {
        Mutant::ALL.to_vec()
    } else {
        asked
            .split(',')
            .filter(|s| !s.is_empty())
            .map(|s| Mutant::from_name(s).unwrap_or_else(|| panic!("no defect named {s}")))
            .collect()
    };
    for m in defects {
        let across_hosts = matches!(
            m,
            Mutant::NoFence
                | Mutant::FallbackAlways
                | Mutant::Steal
                | Mutant::EarlyHandover
                | Mutant::RevokeClaim
                | Mutant::RevokeSibling
                | Mutant::UnlockedKeepsLease
                | Mutant::UnlockedAcquires
                | Mutant::ClaimOnSiblingsLease
                | Mutant::DropUnansweredHandOver
                | Mutant::GrantedUnlocked
                | Mutant::HeldAfterStepBack
        );
        let runs = if across_hosts { SEARCH_HOSTS } else { SEARCH };
        let found = runs.iter().find_map(|&(run, seeds)| {
            (1..=seeds).find_map(|seed| {
                mutant::set(Some(m));
                let with = violation(run, seed);
                mutant::set(None);
                with.filter(|_| violation(run, seed).is_none())
                    .map(|v| (run, seed, v))
            })
        });
        match found {
            Some((run, seed, v)) => {
                let run = format!("{run:?}").replace("Hosts(", "Hosts(WhenUnreachable::");
                println!("    (Mutant::{m:?}, {run}, {seed}), // {v}")
            }
            None => println!("    // {}: no seed of the search fails", m.name()),
        }
    }
}
