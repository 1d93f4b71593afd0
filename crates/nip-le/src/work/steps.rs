//! What the work rules answer ([`super::WorkMachine`]'s decisions) and
//! what they are told: the vocabulary between the pure machine and the
//! writer's work shell that carries its decisions out.

use crate::elector::types::TakeOutcome;
use crate::ledger::Op;

/// How a turn ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settle {
    /// The reply was sent.
    Done,
    /// The turn was cancelled.
    GiveBack,
}

impl Settle {
    /// Its ledger line.
    pub(crate) fn op(self, id: &str, epoch: u64, at_ms: u64) -> Op {
        let id = id.to_owned();
        match self {
            Settle::Done => Op::Done {
                id,
                epoch,
                at_ms,
                pub_ms: None,
            },
            Settle::GiveBack => Op::GiveBack { id, epoch, at_ms },
        }
    }
}

/// What to do with the ledger after a conclusion of the key machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lead {
    /// Not holding at an epoch (any more): forget the ledger we kept (its
    /// refused lines are kept apart, see the writer's `unwritten`).
    Forget,
    /// Nothing changes.
    Keep,
    /// We hold at `epoch` now, a new one: forget the ledger we kept, open
    /// this epoch's and tell [`WorkMachine::opened`](super::WorkMachine::opened).
    Open { epoch: u64 },
    /// We lead by the NIP's fail-safe now (no lock at an epoch): forget the
    /// ledger we kept and open it again, for the fail-safe's takes.
    OpenFailSafe,
}

/// What a take needs: an answer at once, or a line on disk first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TakeStep {
    Answer(TakeOutcome),
    /// Append these lines now, in one synced write (a give-back on behalf
    /// of a gone taker whose take ours would not supersede, then ours);
    /// tell [`WorkMachine::take_written`](super::WorkMachine::take_written).
    Record(Vec<Op>),
}

/// What a settle needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SettleStep {
    Answer(bool),
    /// Append this line to the ledger of our epoch (kept, if refused, to be
    /// written later) and answer `true`.
    Record(Op),
    /// We do not hold at an epoch with a readable ledger: the line goes
    /// through the refused-lines store, which finds the take's epoch
    /// ([`settle_line`](super::ledger_lines::settle_line), with `done_anyway`); answer what it recorded, or
    /// `anyway`.
    Outside {
        anyway: bool,
        done_anyway: bool,
    },
}

/// A change in the disk's refusals of takes, to be said once per spell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Spell {
    Began,
    Ended,
    Same,
}

/// The holder a takeover displaced, as the record we replaced named it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Displaced {
    /// Its presence token (`None`: its record had none, so no take of it
    /// carries one: each is owed anyway).
    Token(Option<String>),
    /// The record could not be read: any live take may be the holder's.
    Unknown,
}
