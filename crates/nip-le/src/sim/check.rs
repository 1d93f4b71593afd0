//! The invariants, checked after every step of a run: never two acting
//! windows outside the NIP's own fail-safe and stale-cache windows (those
//! are counted apart), no silence longer than the bound of the faults in
//! force, epochs that never go backwards (checked where the file is
//! written, see [`super::state::State::wrote`]), no panic, and every
//! mention answered exactly once (see [`super::app`]).

use std::collections::BTreeMap;

pub use super::invariant::Invariant;
use crate::pubkey::AgentPubkey;
use crate::record::LockContent;

/// One broken invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Virtual time, ns.
    pub at: u64,
    /// Which invariant.
    pub what: Invariant,
    /// The particulars.
    pub detail: String,
}

impl Violation {
    /// A violation at `at`.
    pub fn new(at: u64, what: Invariant, detail: String) -> Self {
        Self { at, what, detail }
    }
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = self.at / 1_000_000;
        write!(
            f,
            "{} at {}.{:03} s: {}",
            self.what,
            ms / 1000,
            ms % 1000,
            self.detail
        )
    }
}

/// Who acts for a key at one instant.
#[derive(Debug, Clone)]
pub struct Actor {
    /// Its instance id.
    pub id: String,
    /// An extended window (the others are spec windows and harnesses,
    /// whose cached answers the NIP lets lag by a refresh).
    pub extended: bool,
}

/// What the checker counted besides violations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    /// Time with two or more acting while the file read as fail-safe
    /// (absent, empty, malformed: the NIP's "every instance leads").
    pub fail_safe_ns: u64,
    /// Time with two or more acting where one is a spec window or a
    /// harness whose cached read lags (the NIP's refresh bound).
    pub stale_cache_ns: u64,
    /// Longest silence (nobody acting while a window could), ns.
    pub longest_silence_ns: u64,
}

/// Two or more acting, classified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Overlap {
    None,
    FailSafe,
    StaleCache,
}

/// The per-key memory of the checks.
#[derive(Debug, Default)]
pub struct Checker {
    /// Per key: when the current silence began.
    silent_since: BTreeMap<AgentPubkey, u64>,
    /// Per key: the overlap seen at the last step and since when.
    overlap: BTreeMap<AgentPubkey, (u64, Overlap)>,
    /// What was counted.
    pub tally: Tally,
}

impl Checker {
    /// One step for `pk` at `t`: `acting` are the processes that act now,
    /// `able` whether any window could act (runs and has joined),
    /// `quiet_from` the end of the last fault that may silence the agent,
    /// `bound` the longest silence allowed after it.
    #[allow(clippy::too_many_arguments)]
    pub fn step(
        &mut self,
        t: u64,
        pk: &AgentPubkey,
        file: &LockContent,
        acting: &[Actor],
        able: bool,
        quiet_from: u64,
        bound: u64,
    ) -> Option<Violation> {
        let overlap = match acting {
            [] | [_] => Overlap::None,
            _ if !matches!(file, LockContent::Record(_)) => Overlap::FailSafe,
            _ if acting.iter().filter(|a| a.extended).count() >= 2 => {
                let ids: Vec<&str> = acting.iter().map(|a| a.id.as_str()).collect();
                let holder = file.record().map_or("", |r| r.instance_id.as_str());
                return Some(Violation::new(
                    t,
                    Invariant::TwoActingWindows,
                    format!("{ids:?} act while the record names {holder}"),
                ));
            }
            _ => Overlap::StaleCache,
        };
        // The overlap seen at the last step lasted until now.
        if let Some((since, kind)) = self.overlap.remove(pk) {
            let lasted = t.saturating_sub(since);
            match kind {
                Overlap::FailSafe => self.tally.fail_safe_ns += lasted,
                Overlap::StaleCache => self.tally.stale_cache_ns += lasted,
                Overlap::None => {}
            }
        }
        if overlap != Overlap::None {
            self.overlap.insert(*pk, (t, overlap));
        }
        if acting.is_empty() && able {
            let began = *self.silent_since.entry(*pk).or_insert(t);
            let from = began.max(quiet_from);
            let silence = t.saturating_sub(from);
            self.tally.longest_silence_ns = self.tally.longest_silence_ns.max(silence);
            if silence > bound {
                return Some(Violation::new(
                    t,
                    Invariant::Silence,
                    format!(
                        "nobody acted for {} ms (bound {} ms)",
                        silence / 1_000_000,
                        bound / 1_000_000
                    ),
                ));
            }
        } else {
            self.silent_since.remove(pk);
        }
        None
    }
}
