//! What the disk refused of ours (ENOSPC, EIO, a read-only directory) in a
//! work ledger outside the epoch we hold (or while the ledger of our epoch
//! cannot be read): a `done` whose reply was sent, a give-back. Kept and
//! written on every wake-up until the disk takes it, whatever our
//! leadership and after we left the key, or a successor would answer the
//! event again (the simulator, with file faults). Only the process's end
//! loses it.

use crate::error::Error;
use crate::ledger::{Ledger, LedgerError, Op};
use crate::pubkey::AgentPubkey;
use crate::work::{settle_line, Settle};

/// Applies and appends `op`. A line the disk refuses is still applied, and
/// kept to be written as soon as the disk takes it (a warning says so);
/// the answer is then [`Error::NotDurable`], as for a line written and not
/// synced: the caller of a settle hears that its line is not durable yet.
pub(super) fn append(l: &mut Ledger, pubkey: &AgentPubkey, op: Op) -> Result<(), Error> {
    match l.append(&op) {
        Ok(()) => Ok(()),
        Err(e @ Error::NotDurable { .. }) => {
            tracing::warn!(%pubkey, "{e}");
            Err(e)
        }
        Err(e) => {
            tracing::warn!(%pubkey, "the work ledger keeps a line the disk refused, to write it later: {e}");
            Err(Error::NotDurable {
                why: format!("refused by the disk, kept to be written: {e}"),
            })
        }
    }
}

/// At most this many settles wait for a ledger that cannot be read (one
/// that stays unreadable, oversized or not a regular file, must not grow
/// memory without bound); the oldest go first, with a warning.
const MAX_UNSETTLED: usize = 1024;

/// Our refused lines and settles of one key.
#[derive(Debug, Default)]
pub(super) struct Unwritten {
    /// Lines applied there and not written yet.
    ledger: Option<Ledger>,
    /// Settles the ledger could not even be read for (whose take they end
    /// is not known yet): done at the first read.
    unsettled: Vec<(Settle, String, u64, bool)>,
    /// The ledger the last settle read, all of it written: the next one
    /// reads only what was appended since (a follower's settles each read
    /// the whole file again: a day's run in the simulator spent half its
    /// time there). Not waiting for anything: [`Unwritten::is_empty`]
    /// ignores it, and it goes with the key.
    read: Option<Ledger>,
}

impl Unwritten {
    /// Nothing is waiting.
    pub(super) fn is_empty(&self) -> bool {
        self.ledger.is_none() && self.unsettled.is_empty()
    }

    /// Keeps `l`'s refused lines, if it has any; else `l` itself, to be
    /// read on from where it is.
    pub(super) fn keep(&mut self, l: Ledger) {
        if l.has_pending() {
            let l = self.carried_into(l);
            self.ledger = Some(l);
        } else {
            self.read = Some(l);
        }
    }

    /// `l`, a ledger of the same key opened since, with the lines kept here
    /// carried into it (applied there, written first).
    pub(super) fn carried_into(&mut self, mut l: Ledger) -> Ledger {
        self.read = None;
        if let Some(older) = self.ledger.take() {
            l.carry(older);
        }
        l
    }

    /// The ledger to settle in: the one with our refused lines, else the
    /// one read last, brought up to date (what others appended since, read
    /// whole again if it was rewritten), else `open`ed.
    fn ledger(
        &mut self,
        open: &mut dyn FnMut() -> Result<Ledger, LedgerError>,
        now_ms: u64,
    ) -> Result<Ledger, LedgerError> {
        if let Some(l) = self.ledger.take() {
            return Ok(l);
        }
        if let Some(mut l) = self.read.take() {
            if l.refresh(now_ms).is_ok() {
                l.expire_if_due(now_ms);
                return Ok(l);
            }
        }
        open()
    }

    /// A `done` or give-back of ours while we do not hold the key: recorded
    /// at the epoch of our take, if the ledger shows one (`false` if not);
    /// kept while the disk refuses it or the ledger cannot be read, and
    /// then [`Error::NotDurable`].
    pub(super) fn settle(
        &mut self,
        open: &mut dyn FnMut() -> Result<Ledger, LedgerError>,
        token: Option<&str>,
        pubkey: &AgentPubkey,
        line: (Settle, &str, u64, bool),
    ) -> Result<bool, Error> {
        let (what, id, at_ms, done_anyway) = line;
        let mut l = match self.ledger(open, at_ms) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(%pubkey, "the work ledger cannot be read; the turn's end is kept, to be written later: {e}");
                if self.unsettled.len() >= MAX_UNSETTLED {
                    let (_, lost, _, _) = self.unsettled.remove(0);
                    tracing::warn!(%pubkey, event = %lost, "too many turns' ends wait for an unreadable work ledger: the oldest is dropped");
                }
                if !mutated!(UnsettledLost) {
                    self.unsettled
                        .push((what, id.to_owned(), at_ms, done_anyway));
                }
                return Err(Error::NotDurable {
                    why: format!("the work ledger cannot be read, kept to be written: {e}"),
                });
            }
        };
        let recorded = match settle_line(&l.index, id, token, what, at_ms, done_anyway) {
            Some(op) => append(&mut l, pubkey, op).map(|()| true),
            None => Ok(false),
        };
        self.keep(l);
        recorded
    }

    /// Why a line kept here is not durable yet, if one is.
    pub(super) fn degraded(&self) -> Option<String> {
        match (&self.ledger, self.unsettled.len()) {
            (Some(l), _) if l.degraded().is_some() => l.degraded().map(str::to_owned),
            (_, 0) => None,
            (_, n) => Some(format!(
                "the work ledger cannot be read: {n} turns' ends wait to be written"
            )),
        }
    }

    /// Writes what the disk takes now.
    pub(super) fn retry(
        &mut self,
        open: &mut dyn FnMut() -> Result<Ledger, LedgerError>,
        token: Option<&str>,
        pubkey: &AgentPubkey,
        now_ms: u64,
    ) {
        if !self.unsettled.is_empty() {
            // One read for them all; none while it cannot be read.
            if let Ok(mut l) = self.ledger(open, now_ms) {
                for (what, id, at_ms, done_anyway) in std::mem::take(&mut self.unsettled) {
                    if let Some(op) = settle_line(&l.index, &id, token, what, at_ms, done_anyway) {
                        let _ = append(&mut l, pubkey, op);
                    }
                }
                self.keep(l);
            }
        }
        if self.ledger.as_mut().is_some_and(|l| l.flush().is_ok()) {
            self.ledger = None;
            tracing::info!(%pubkey, "the work ledger's refused lines are written now");
        }
    }
}
