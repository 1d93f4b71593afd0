//! The ledger lines a work decision writes, as pure functions of the
//! index: a take (with the give-back that lets the index apply it), a
//! settle outside the epoch we hold, the `held` line, the `floor` line a
//! writer without a ledger leaves, and the epoch floor a ledger gives. Apart from `machine.rs` so that the shells that write
//! outside a decision (the unwritten settles, the holder's `held` line)
//! build the same lines.

use crate::ledger::{Index, Op};

use super::steps::{Settle, TakeStep};

/// The lines of a take of `id` found owed, at `epoch`. A take the index
/// would not apply (a gone taker's at a higher epoch: ours is a fail-safe
/// leader's at 0, or a holder's not fenced yet) follows a give-back on that
/// taker's behalf, or nobody would see ours, ourselves included (the
/// simulator, a day at a million mentions: two fail-safe leaders each took
/// a killed holder's event at epoch 0, and both answered it).
pub(super) fn record_take(
    index: &Index,
    (id, pub_ms, epoch): (&str, Option<u64>, u64),
    by: &str,
    at_ms: u64,
    live: Option<&str>,
) -> TakeStep {
    let take = Op::Take {
        id: id.to_owned(),
        epoch,
        by: by.to_owned(),
        at_ms,
        live: live.map(str::to_owned),
        pub_ms,
    };
    match index.taker(id) {
        Some((gone, _)) if gone > epoch && !mutated!(HiddenTake) => {
            TakeStep::Record(vec![Settle::GiveBack.op(id, gone, at_ms), take])
        }
        _ => TakeStep::Record(vec![take]),
    }
}

/// The epoch of the take of `id` by the window whose presence token is
/// `token`, if `index` shows one.
pub(crate) fn taken_by(index: &Index, id: &str, token: Option<&str>) -> Option<u64> {
    (index.taker(id))
        .filter(|(_, live)| live.is_some() && *live == token)
        .map(|(epoch, _)| epoch)
}

/// A settle outside the epoch we hold: its line at the epoch of our take,
/// if `index` shows one; a `done` of a take granted to us that no line
/// shows (`done_anyway`) at epoch 0 (a `done` is final at any epoch).
pub(crate) fn settle_line(
    index: &Index,
    id: &str,
    token: Option<&str>,
    what: Settle,
    at_ms: u64,
    done_anyway: bool,
) -> Option<Op> {
    match taken_by(index, id, token) {
        Some(epoch) => Some(what.op(id, epoch, at_ms)),
        None if done_anyway && what == Settle::Done => Some(what.op(id, 0, at_ms)),
        None => None,
    }
}

/// The `held` line of `by` at `epoch`, unless `index` has one.
pub(crate) fn held_line(index: &Index, epoch: u64, by: &str, at_ms: u64) -> Option<Op> {
    (!index.kept_at(by, epoch)).then(|| Op::Held {
        epoch,
        by: by.to_owned(),
        at_ms,
    })
}

/// The `floor` line of `by` at `epoch` for what was published before
/// `before_ms`, unless `index` has one as high.
pub(crate) fn floor_line(
    index: &Index,
    epoch: u64,
    by: &str,
    before_ms: u64,
    at_ms: u64,
) -> Option<Op> {
    (index.floor().is_none_or(|f| f < before_ms)).then(|| Op::Floor {
        epoch,
        by: by.to_owned(),
        before_ms: before_ms.min(at_ms),
        at_ms,
    })
}

/// The epoch floor a ledger gives: every epoch it shows was issued, ours
/// come above them. A hostile line near `u64::MAX` would leave no epoch
/// to issue: ignored.
pub(crate) fn epoch_floor(index: &Index) -> Option<u64> {
    let e = index.max_epoch();
    (e > 0 && e < u64::MAX / 2).then_some(e)
}
