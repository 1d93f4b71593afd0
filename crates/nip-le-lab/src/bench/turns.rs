//! The rows about work across a change of leader: instances run `nip-le run
//! --turn-ms` on one mention feed, as the example app works its queue. In
//! extended mode the work ledger hands what was queued or in flight to the
//! next leader; in spec mode a new leader only knows "published after I
//! led", which is what these rows measure against.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use super::scenarios::{random_below, Bench, Feed};
use super::{Row, Variant};
use nip_le_cli::drive::cluster::{first_new_leader, wait_until, Instance};
use nip_le_cli::lines::{Line, ReplyLine, TurnOutcome};
use nip_le_cli::unix_ms;

/// Mentions queued before the claim of [`Bench::queued_claim`].
pub const QUEUED: usize = 8;
/// Turn length of [`Bench::queued_claim`]: the queue outlasts a spec claim
/// at the NIP's default refresh (the holder reads the claim at its next
/// tick, the claimant acquires at its own: up to two intervals, 10 s).
const QUEUED_TURN_MS: u64 = 1_500;
/// Turn length of [`Bench::sigkill_mid_turn`]: long enough that the kill
/// lands inside it and the re-dispatch is measured before it would end.
const LONG_TURN_MS: u64 = 2_000;

/// Appends mentions `ids` to the feed in `dir`, published now.
pub(super) fn publish(dir: &Path, ids: &[String]) -> std::io::Result<()> {
    let at = unix_ms();
    let lines: String = ids
        .iter()
        .map(|id| format!("{{\"id\":\"{id}\",\"at_ms\":{at}}}\n"))
        .collect();
    std::fs::OpenOptions::new()
        .append(true)
        .open(dir.join("mentions.jsonl"))?
        .write_all(lines.as_bytes())
}

/// Per mention id in the feed of `dir`, when each reply was written.
pub(super) fn replies(dir: &Path) -> BTreeMap<String, Vec<u64>> {
    let mut m: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for r in ReplyLine::read_all(&dir.join("replies.jsonl")) {
        m.entry(r.mention_id()).or_default().push(r.at_ms);
    }
    m
}

/// When `inst` reported, after `cursor`, that it began a turn on `id`.
fn started(inst: &Instance, cursor: usize, id: &str, within: Duration) -> Option<u64> {
    inst.wait_for(within, |reports| {
        reports.iter().skip(cursor).find_map(|r| match &r.line {
            Line::Turn {
                id: i,
                outcome: TurnOutcome::Started,
                at_ms,
                ..
            } if i.as_str() == Some(id) => Some(*at_ms),
            _ => None,
        })
    })
}

impl Bench {
    /// [`QUEUED`] mentions queued, a claim from an observer while the leader
    /// works them: of the mentions still unanswered when the claimant began
    /// to lead, the share answered exactly once (%).
    pub fn queued_claim(&self, v: &Variant, row: &mut Row) -> std::io::Result<()> {
        if v.before {
            return Ok(()); // an earlier build has no --turn-ms
        }
        let (tmp, _pk, mut insts, leader) = self.cluster_with(v, 3, Feed::Turns(QUEUED_TURN_MS))?;
        let ids: Vec<String> = (0..QUEUED).map(|i| format!("q{i}")).collect();
        let c = insts[leader].cursor();
        publish(tmp.path(), &ids)?;
        if started(&insts[leader], c, &ids[0], Duration::from_secs(5)).is_none() {
            row.violations.push("the leader started no turn".into());
            return Ok(());
        }
        std::thread::sleep(random_below(Duration::from_millis(QUEUED_TURN_MS)));
        let target = (leader + 1) % insts.len();
        let c = insts[target].cursor();
        insts[target].send("claim")?;
        let Some(handover) = insts[target]
            .wait_after(c, self.bound(), |r| r.is_leader() == Some(true))
            .and_then(|r| r.at_ms())
        else {
            row.violations.push("target never led".into());
            return Ok(());
        };
        // Time for every turn, then a little more for a late duplicate.
        let turns = Duration::from_millis(QUEUED_TURN_MS * QUEUED as u64);
        wait_until(turns + Duration::from_secs(2), || {
            replies(tmp.path()).len() == QUEUED
        });
        std::thread::sleep(Duration::from_millis(QUEUED_TURN_MS * 2));
        let r = replies(tmp.path());
        let queued: Vec<&String> = ids
            .iter()
            .filter(|id| {
                r.get(*id)
                    .is_none_or(|at| at.iter().all(|&t| t >= handover))
            })
            .collect();
        if queued.is_empty() {
            row.shortfall(v, "the queue ran dry before the handover".into());
            return Ok(());
        }
        let once = queued
            .iter()
            .filter(|id| r.get(**id).map(Vec::len) == Some(1));
        row.samples
            .push(100.0 * once.count() as f64 / queued.len() as f64);
        let missed = ids.iter().filter(|id| !r.contains_key(*id)).count();
        let twice = r.values().filter(|at| at.len() > 1).count();
        if missed > 0 {
            row.shortfall(v, format!("{missed} of {QUEUED} missed"));
        }
        if twice > 0 {
            row.shortfall(v, format!("{twice} of {QUEUED} answered twice"));
        }
        Ok(())
    }

    /// The leader is SIGKILLed in a turn: how long until another instance
    /// begins that turn again.
    pub fn sigkill_mid_turn(&self, v: &Variant, row: &mut Row) -> std::io::Result<()> {
        if v.before {
            return Ok(());
        }
        let (tmp, _pk, mut insts, leader) = self.cluster_with(v, 3, Feed::Turns(LONG_TURN_MS))?;
        let id = "k0".to_owned();
        let c = insts[leader].cursor();
        publish(tmp.path(), std::slice::from_ref(&id))?;
        if started(&insts[leader], c, &id, Duration::from_secs(5)).is_none() {
            row.violations.push("the leader started no turn".into());
            return Ok(());
        }
        std::thread::sleep(random_below(Duration::from_millis(LONG_TURN_MS / 4)));
        let cursors: Vec<_> = insts.iter().map(Instance::cursor).collect();
        let t0 = unix_ms();
        insts[leader].kill_and_reap()?;
        let Some((next, _)) = first_new_leader(&insts, &cursors, Some(leader), self.bound()) else {
            row.violations.push("no survivor led".into());
            return Ok(());
        };
        let within = Duration::from_millis(LONG_TURN_MS / 2);
        match started(&insts[next], cursors[next], &id, within) {
            Some(at) => row.samples.push(at.saturating_sub(t0) as f64),
            None => row.shortfall(v, "the turn was never begun again".into()),
        }
        Ok(())
    }
}
