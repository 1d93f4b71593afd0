//! The key machine's one entry point: [`KeyMachine::step`] takes an input
//! and the time and gives its decision as data. Nothing else mutates the
//! machine; the writer only carries decisions out.
//!
//! One evaluation is a short exchange, not one call, because the NIP's
//! acquire is decided while the writer holds the lock file's exclusion
//! with the content it read under it:
//!
//! 1. [`Input::Evaluate`] → [`Decision::Begun`]: expire the stand-down and
//!    our pending claim; a fresh local lead request aimed at someone else
//!    makes the holder stand down first (once per request: the step-down
//!    inputs below, then [`Input::Serve`]);
//! 2. [`Input::Look`] → [`Decision::Look`]: acquire under the exclusion, or
//!    only read (while standing down);
//! 3. [`Input::Peek`] → [`Decision::WouldWrite`] (extension, on an
//!    unguarded read: whether the locked look can be skipped), and
//!    [`Input::Locked`] → [`Decision::Write`] under the exclusion: take the
//!    lock, refresh it, or leave it alone;
//! 4. [`Input::Seen`] → [`Decision::Concluded`]: the new view (leader or
//!    not, and why), the self-fencing validity, the holder to watch and the
//!    request to remove.
//!
//! Stepping down is [`Input::StepDown`], then [`Input::Release`] under the
//! exclusion ([`Decision::Release`]), then [`Input::Released`]. An input
//! out of its order (a look with no evaluation begun) decides nothing:
//! the safe answer (read only, write nothing) is what the writer gets.

use crate::control::LeadRequest;
use crate::election::TakeReason;
use crate::epoch::Mark;
use crate::presence::Sibling;
use crate::record::LockContent;

use super::{Begin, Cause, Conclusion, KeyMachine, Look, Now, Probes, Seen, StepDown, Write};

/// One input of the key machine.
pub(crate) enum Input<'a> {
    /// An evaluation begins, with the local lead request on file (if any)
    /// and whether the process that posted it is gone (its pid dead).
    Evaluate {
        cause: Cause,
        request: Option<&'a LeadRequest>,
        claimant_gone: bool,
    },
    /// The step-down that [`Decision::Begun`] asked for serves this
    /// request.
    Serve(Option<String>),
    /// How to look at the lock.
    Look,
    /// An unguarded read: would the locked look write?
    Peek {
        content: &'a LockContent,
        probes: &'a dyn Probes,
    },
    /// Under the store's exclusion: the content, the store's epoch mark,
    /// our presence token.
    Locked {
        content: &'a LockContent,
        floor: Mark,
        token: Option<&'a str>,
        probes: &'a dyn Probes,
    },
    /// What the look saw: the evaluation ends.
    Seen(Seen),
    /// The one step-down path begins (release, stand-down, leave,
    /// shutdown).
    StepDown,
    /// Under the exclusion, on the step-down path: give the lock up iff
    /// the file names us, to `heir` if a live sibling takes it.
    Release {
        content: &'a LockContent,
        floor: Mark,
        heir: Option<&'a Sibling>,
    },
    /// What the store holds after the step-down.
    Released(Result<LockContent, String>),
    /// The user's claim begins: it ends any stand-down of ours.
    ClaimStarted,
    /// The claim waits for the holder, with our lead request's nonce once
    /// written.
    ClaimPending(Option<String>),
    /// `resume()`: ends a stand-down.
    Resume,
    /// The holder's silence proves nothing (a peer held the exclusion for
    /// the whole lock wait, so the holder could not write either): the
    /// hang timer starts again, and once more when the exclusion is next
    /// found free (see [`KeyMachine::exclusion_held`]).
    RestartHangTimer,
    /// Our round came late (we were paused or starved): the hang timer
    /// starts again, once per unchanged record (see
    /// [`KeyMachine::pause_noticed`]).
    Paused,
    /// The work ledger shows this epoch issued (extension): a new holder's
    /// epoch is above it, even when the epoch mark was lost (deleted, a
    /// restored backup), or a take would be granted at an epoch the ledger
    /// already holds takes of.
    LedgerEpoch(u64),
    /// An error for the status, until the next look replaces it.
    Error(String),
}

/// What the machine decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Nothing to carry out.
    Nothing,
    /// The evaluation began; stand down first if this says so.
    Begun(Option<StepDown>),
    /// How to look.
    Look(Look),
    /// Whether a locked look would write.
    WouldWrite(bool),
    /// What to write under the exclusion, and why we take the lock.
    Write(Write, Option<TakeReason>),
    /// What to write on the step-down path, and whether a record of ours
    /// was given up.
    Release(Write, bool),
    /// The new view.
    Concluded(Conclusion),
}

impl Decision {
    /// The step-down [`Decision::Begun`] asks for.
    pub(crate) fn step_down(self) -> Option<StepDown> {
        match self {
            Decision::Begun(s) => s,
            _ => None,
        }
    }
    /// The look (only a read, unless the machine said otherwise).
    pub(crate) fn look(self) -> Look {
        match self {
            Decision::Look(l) => l,
            _ => Look::Read,
        }
    }
    /// Whether to write (no, unless the machine said so).
    pub(crate) fn would_write(self) -> bool {
        matches!(self, Decision::WouldWrite(true))
    }
    /// The write under the exclusion (none, unless the machine said so).
    pub(crate) fn write(self) -> (Write, Option<TakeReason>) {
        match self {
            Decision::Write(w, t) => (w, t),
            _ => (Write::Keep, None),
        }
    }
    /// The write of the step-down path (none, unless the machine said so).
    pub(crate) fn release(self) -> (Write, bool) {
        match self {
            Decision::Release(w, r) => (w, r),
            _ => (Write::Keep, false),
        }
    }
    /// The conclusion, if the evaluation ended.
    pub(crate) fn conclusion(self) -> Option<Conclusion> {
        match self {
            Decision::Concluded(c) => Some(c),
            _ => None,
        }
    }
}

/// An evaluation in progress.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Evaluation {
    cause: Cause,
    request: Option<LeadRequest>,
    begin: Begin,
    look: Option<Look>,
}

impl KeyMachine {
    /// One input at `now`: the decision, as data.
    pub(crate) fn step(&mut self, input: Input<'_>, now: Now) -> Decision {
        match input {
            Input::Evaluate {
                cause,
                request,
                claimant_gone,
            } => {
                // A claim whose claimant is gone is void: nobody stands
                // down for it, nor waits for it to be taken (chaos: a
                // holder that took over a hung one stood down for a claim
                // whose claimant was killed, and nobody led until it
                // expired).
                let request = request.filter(|_| !claimant_gone);
                self.same_id.floor = None;
                self.same_id.vacated = false;
                self.rewrote_ours = false;
                let begin = self.begin(now, request);
                let step_down = begin.step_down.clone();
                self.evaluation = Some(Evaluation {
                    cause,
                    request: request.cloned(),
                    begin,
                    look: None,
                });
                Decision::Begun(step_down)
            }
            Input::Serve(nonce) => {
                self.serve_request(nonce);
                Decision::Nothing
            }
            Input::Look => {
                let Some(mut e) = self.evaluation.take() else {
                    return Decision::Nothing;
                };
                let look = self.look(now, e.cause, e.request.as_ref(), &e.begin);
                e.look = Some(look);
                self.evaluation = Some(e);
                Decision::Look(look)
            }
            Input::Peek { content, probes } => match self.current_look() {
                Some(look) => Decision::WouldWrite(self.would_write(content, now, look, probes)),
                None => Decision::Nothing,
            },
            Input::Locked {
                content,
                floor,
                token,
                probes,
            } => {
                self.raise_epoch_floor(floor.epoch);
                self.same_id.floor = Some(floor);
                match self.current_look() {
                    Some(look) => {
                        let (w, t) = self.decide(content, now, look, token, probes);
                        Decision::Write(w, t)
                    }
                    None => Decision::Nothing,
                }
            }
            Input::Seen(seen) => match self.evaluation.take() {
                Some(Evaluation {
                    cause,
                    begin,
                    look: Some(look),
                    ..
                }) => Decision::Concluded(self.conclude(cause, &begin, look, seen, now.mono)),
                _ => Decision::Nothing,
            },
            Input::StepDown => {
                self.step_down(now);
                Decision::Nothing
            }
            Input::Release {
                content,
                floor,
                heir,
            } => {
                self.raise_epoch_floor(floor.epoch);
                self.same_id.floor = Some(floor);
                let (w, r) = self.decide_release(content, now, heir);
                Decision::Release(w, r)
            }
            Input::Released(result) => {
                self.released(result);
                Decision::Nothing
            }
            Input::ClaimStarted => {
                self.claim_started();
                Decision::Nothing
            }
            Input::ClaimPending(nonce) => {
                self.claim_pending_from(now, nonce);
                Decision::Nothing
            }
            Input::Resume => {
                self.resume();
                Decision::Nothing
            }
            Input::RestartHangTimer => {
                self.exclusion_held(now.mono);
                Decision::Nothing
            }
            Input::Paused => {
                self.pause_noticed(now.mono);
                Decision::Nothing
            }
            Input::LedgerEpoch(e) => {
                self.raise_epoch_floor(e);
                Decision::Nothing
            }
            Input::Error(e) => {
                self.last_error = Some(e);
                Decision::Nothing
            }
        }
    }

    fn current_look(&self) -> Option<Look> {
        self.evaluation.as_ref().and_then(|e| e.look)
    }
}
