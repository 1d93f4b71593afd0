//! Calls a step-down answers once the lock has moved (see [`super::drain`]),
//! and what an ended step-down answers them with.

use super::Reply;

/// A call answered once the lock has moved.
pub(super) enum DrainReply {
    /// `release`: whether a record of ours was given up.
    Released(Reply<bool>),
    /// `stand_down`, `leave`.
    Done(Reply<()>),
}

impl DrainReply {
    pub(super) fn answer(self, released: bool) {
        match self {
            DrainReply::Released(r) => drop(r.send(Ok(released))),
            DrainReply::Done(r) => drop(r.send(Ok(()))),
        }
    }
}

/// A step-down that waited and is over.
pub(super) struct Finished {
    /// The key is to be left.
    pub departing: bool,
    /// The calls that waited...
    pub replies: Vec<DrainReply>,
    /// ... and their answer: whether a record of ours was given up.
    pub released: bool,
}

impl Finished {
    pub(super) fn answer(self) {
        for r in self.replies {
            r.answer(self.released);
        }
    }
}
