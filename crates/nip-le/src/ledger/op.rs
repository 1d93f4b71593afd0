//! One ledger line ([`Op`]): its JSON form, as the module docs show it.

use serde::{Deserialize, Serialize};

/// One ledger line.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// The holder at `epoch` dispatched the event.
    Take {
        /// The event id.
        id: String,
        /// The holder's fencing epoch.
        epoch: u64,
        /// The holder's instance id (informational).
        #[serde(default)]
        by: String,
        /// When, unix ms.
        at_ms: u64,
        /// Extension: the taker's presence token. While it takes part in
        /// the election, the take is in flight (its reply may be on its
        /// way); when it is gone, the event is owed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        live: Option<String>,
        /// When the event was published (unix ms, the sender's clock), if
        /// the taker said: what lets a rewrite mark it settled instead of
        /// remembering it (see `Index::settle_to`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub_ms: Option<u64>,
    },
    /// The reply was sent.
    Done {
        /// The event id.
        id: String,
        /// The holder's fencing epoch.
        epoch: u64,
        /// When, unix ms.
        at_ms: u64,
        /// When the event was published, as its take said (written by a
        /// rewrite, which keeps it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub_ms: Option<u64>,
    },
    /// Extension: the holder `by` at `epoch` keeps this ledger (written
    /// when it joins the key, at epoch 0, and when it first leads at an
    /// epoch).
    Held {
        /// The holder's fencing epoch.
        epoch: u64,
        /// The holder's instance id.
        by: String,
        /// When, unix ms.
        at_ms: u64,
    },
    /// Extension: the holder `by` at `epoch` replaced a writer that kept
    /// no ledger (the harness, spec mode), who may have answered what was
    /// published before `before_ms` (unix ms): an event published before
    /// then that the ledger does not show is owed to no later holder
    /// either, as it is not to `by` (see [`super::Index::floor`]).
    Floor {
        /// The holder's fencing epoch.
        epoch: u64,
        /// The holder's instance id.
        by: String,
        /// What was published before this (unix ms) may have been answered.
        before_ms: u64,
        /// When, unix ms.
        at_ms: u64,
    },
    /// The turn was cancelled: the event is owed again.
    GiveBack {
        /// The event id.
        id: String,
        /// The holder's fencing epoch.
        epoch: u64,
        /// When, unix ms.
        at_ms: u64,
    },
}

impl Op {
    /// One line, or the whole line at its end when a writer that failed mid-way
    /// (ENOSPC) left a fragment without its newline and another process
    /// appended onto it: a line begins with `{"op":`, which a serialised
    /// string can never contain (its quotes are escaped), so the last such
    /// start is where the glued line begins.
    pub(super) fn parse(line: &[u8]) -> Option<Op> {
        if let Ok(op) = serde_json::from_slice::<Op>(line) {
            return Some(op);
        }
        const START: &[u8] = b"{\"op\":";
        let at = line.windows(START.len()).rposition(|w| w == START)?;
        (at > 0 && !mutated!(GluedLine))
            .then(|| serde_json::from_slice::<Op>(&line[at..]).ok())
            .flatten()
    }

    pub(super) fn id(&self) -> &str {
        match self {
            Op::Take { id, .. } | Op::Done { id, .. } | Op::GiveBack { id, .. } => id,
            Op::Held { by, .. } | Op::Floor { by, .. } => by,
        }
    }
    pub(super) fn at_ms(&self) -> u64 {
        match self {
            Op::Take { at_ms, .. }
            | Op::Done { at_ms, .. }
            | Op::GiveBack { at_ms, .. }
            | Op::Held { at_ms, .. }
            | Op::Floor { at_ms, .. } => *at_ms,
        }
    }
    /// The line written for it.
    pub fn to_line(&self) -> Vec<u8> {
        let mut l = serde_json::to_vec(self).expect("strings and integers always serialise");
        l.push(b'\n');
        l
    }
}
