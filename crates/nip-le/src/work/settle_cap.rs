//! How far a rewrite may mark answered events settled (the ledger's
//! settled mark, see `ledger::Ledger::compact`): never past an event that
//! is still owed. Every window queues every event, so the oldest event the
//! holder's queue holds unanswered bounds what any successor could be
//! owed; the holder notes it at each `owed` (`WorkMachine::settle_cap`).

use super::SharedWork;
use crate::elector::types::QueuedEvent;
use crate::ledger::{self, Index};

/// The publication time of the oldest event of `queue`, published since
/// `horizon_ms`, that `index` does not show answered nor below its floor
/// and the global level does not show done (`u64::MAX`: none). Events of
/// unknown time are no floor's, whatever it says.
pub(super) fn oldest_unsettled(
    queue: &[QueuedEvent],
    index: &Index,
    shared: Option<&SharedWork>,
    horizon_ms: u64,
) -> u64 {
    let floor = index.floor();
    (queue.iter())
        .filter_map(|e| Some((e.id.as_str(), e.published_ms.filter(|p| *p >= horizon_ms)?)))
        .filter(|(id, p)| {
            let state = index.state(id);
            let below_floor = state.is_none() && floor.is_some_and(|f| *p < f);
            let done_elsewhere = shared.is_some_and(|w| w.done.contains(*id));
            state != Some(ledger::State::Done) && !below_floor && !done_elsewhere
        })
        .map(|(_, p)| p)
        .min()
        .unwrap_or(u64::MAX)
}
