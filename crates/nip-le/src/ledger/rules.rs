//! The rules over an index that answer a holder: what of its queue it
//! owes, and when it grants without a ledger it cannot read.

use std::time::Duration;

use super::index::{Index, Verdict};

/// Whether a holder whose ledger it cannot read (since `unreadable_since`,
/// unix ms) grants takes without it, unrecorded: only once that has lasted
/// longer than `bound` (the stale bound). A disk that fails for a moment
/// (EIO) only delays the agent; a ledger that stays unreadable (oversized,
/// not a regular file) never silences it.
pub fn grants_without_ledger(unreadable_since: u64, now_ms: u64, bound: Duration) -> bool {
    let bound = u64::try_from(bound.as_millis()).unwrap_or(u64::MAX);
    mutated!(UnreadableGrants) || now_ms.saturating_sub(unreadable_since) > bound
}

/// Of a queue of `(event id, published unix ms)`, in order, the events the
/// holder at `epoch` owes: those `index` does not show as done, taken at
/// `epoch`, or taken by a taker that `lives` (every event, without a
/// ledger); and, when `published_since` is set (the predecessor kept no
/// ledger we can read: spec mode, the harness, another host, or ours is
/// unreadable), only those published since then (or of unknown time):
/// older ones it may have answered. The ledger's [`Index::floor`] applies
/// the same to what it does not show, for every holder after the one that
/// wrote it.
pub fn owed<'a>(
    queue: impl IntoIterator<Item = (&'a str, Option<u64>)>,
    index: Option<&Index>,
    epoch: u64,
    published_since: Option<u64>,
    lives: &dyn Fn(&str) -> bool,
) -> Vec<String> {
    queue
        .into_iter()
        .filter(|(_, p)| match (published_since, p) {
            (Some(since), Some(p)) => *p >= since,
            _ => true,
        })
        .filter(|(id, p)| {
            index.is_none_or(|ix| match (ix.floor(), p) {
                (Some(floor), Some(p)) if *p < floor => ix.state(id).is_some(),
                _ => true,
            })
        })
        .filter(|(id, _)| index.is_none_or(|ix| ix.verdict_with(id, epoch, lives) == Verdict::Owed))
        .map(|(id, _)| id.to_owned())
        .collect()
}
