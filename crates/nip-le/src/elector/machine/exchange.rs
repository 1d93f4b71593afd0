//! What one evaluation exchanges with the writer (see [`super::step`]):
//! how to look, what to write under the store's exclusion, what the look
//! saw, and the conclusion with its self-fencing validity.

use crate::election::TakeReason;
use crate::record::{LockContent, LockRecord};

use super::super::types::ChangeReason;

/// A step-down that `begin` decided on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct StepDown {
    pub reason: ChangeReason,
    /// The instance the lock should go to, when one asked for it.
    pub target: Option<String>,
    /// The local lead request this step-down serves, if any.
    pub nonce: Option<String>,
}

/// The outcome of [`KeyMachine::begin`](super::KeyMachine::begin).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Begin {
    /// A fresh local lead request names another instance.
    pub other_wants_it: bool,
    /// Stand down for it first.
    pub step_down: Option<StepDown>,
}

/// How to look at the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Look {
    /// Read-decide-write under the store's exclusion.
    Acquire {
        /// We may take a free or abandoned lock that is not ours (no other
        /// instance's lead request stands in the way).
        may_take_others: bool,
        /// We may rewrite our own record (a refresh). False for wake-ups.
        write_own: bool,
    },
    /// Only read (we are standing down).
    Read,
}

/// What the store did under its exclusion, for `decide`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Write {
    /// Leave the file as it is.
    Keep,
    /// Replace the content with these bytes, which encode `record`.
    Put(Vec<u8>, LockRecord),
    /// Truncate to zero bytes (the NIP's release), first raising the
    /// epoch mark to this (extension: it tells observers that the holder
    /// released, not its child; see [`same_id`](super::same_id)).
    Clear(Option<u64>),
}

/// What a look found, for `conclude`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Seen {
    /// The content after the look, or why it could not be read.
    pub content: Result<LockContent, String>,
    /// Why we wrote our record, if we did.
    pub took: Option<TakeReason>,
    /// Whether the locked look succeeded (a failed one fell back to a read).
    pub locked: bool,
    /// The locked look failed because a peer held the store's exclusion
    /// for the whole lock wait: nobody else can have written meanwhile.
    pub busy: bool,
    /// The error of a failed locked look.
    pub error: Option<String>,
}

/// How the self-fencing deadline changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Validity {
    /// Unchanged.
    Keep,
    /// Never fenced (spec mode, or a fail-safe leader holding no lock).
    Always,
    /// Valid for [`Rules::validity`](super::rules::Rules::validity) from the moment of our write.
    Renew,
    /// Fenced until our next write: we hold a record we did not write
    /// ourselves (handed to us) and could not confirm it.
    Fenced,
}

/// The outcome of an evaluation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Conclusion {
    pub leader: bool,
    pub reason: ChangeReason,
    /// Report even if `leader` did not change (first look, completed claim).
    pub always: bool,
    pub validity: Validity,
    /// Extension: the presence token of the holder to watch for its death.
    pub watch: Option<String>,
    /// Our local lead request to remove, now that it is done.
    pub remove_request: Option<String>,
    /// We refreshed a record that was exactly the one we wrote last: nobody
    /// else can have led since, however long we were paused, so a lapse
    /// of our validity meanwhile is no break in our lead.
    pub unbroken: bool,
    /// We took the lock over from a holder that died, hung or left (even
    /// when that completes a claim).
    pub took_over: bool,
}
