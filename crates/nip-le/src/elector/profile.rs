//! The one place that reads the mode: which components of the election
//! each mode turns on. Everything else asks for a component by name, so
//! what spec mode switches off is read here, once.

use crate::config::Mode;

/// The components of the election a mode turns on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Profile {
    /// Our presence lock, named by our records, and the presence rules for
    /// the records of others (a live holder is never evicted for a slept
    /// machine; a gone one is taken over at once).
    pub presence: bool,
    /// Hang judgement on our own monotonic clock (the hang deadline, pause
    /// notice, a fresh window when a peer holds the `flock`) instead of
    /// the wall-clock stale rule alone.
    pub monotonic_hang: bool,
    /// Watches: the directory, each lock file, each holder's death.
    pub watch: bool,
    /// Fencing epochs in records and the epoch mark beside the lock file.
    pub epochs: bool,
    /// Self-fencing: a holder acts only within the validity of its last
    /// write.
    pub self_fencing: bool,
    /// On release, the lock goes straight to a live sibling.
    pub handoff: bool,
    /// Local lead requests: a claim reaches co-located holders without the
    /// relay.
    pub lead_requests: bool,
    /// The work ledger.
    pub ledger: bool,
    /// Read first and lock only to write; an observer's look (prompted by
    /// the holder's refresh) counts as its tick.
    pub read_first: bool,
}

impl Profile {
    /// What `mode` turns on.
    pub(crate) fn of(mode: Mode) -> Self {
        let on = mode == Mode::Extended;
        Self {
            presence: on,
            monotonic_hang: on,
            watch: on,
            epochs: on,
            self_fencing: on,
            handoff: on,
            lead_requests: on,
            ledger: on,
            read_first: on,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_mode_turns_every_extension_off_and_extended_mode_every_one_on() {
        let spec = Profile::of(Mode::Spec);
        let ext = Profile::of(Mode::Extended);
        let all = |p: Profile| {
            [
                p.presence,
                p.monotonic_hang,
                p.watch,
                p.epochs,
                p.self_fencing,
                p.handoff,
                p.lead_requests,
                p.ledger,
                p.read_first,
            ]
        };
        assert!(all(spec).iter().all(|on| !on));
        assert!(all(ext).iter().all(|on| *on));
    }
}
