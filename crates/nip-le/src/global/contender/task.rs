//! The contender's machine: per key, what we hold in etcd, what we know
//! of the holder, and what we told the writer. Its inputs are the
//! writer's messages, the watch's changes and the passing of time on an
//! injected [`Clock`]; its outputs are calls on an [`Etcd`] and news for
//! the writer, each carrying the permit the writer is to apply. It owns
//! no thread and reads no real clock: the app's shell runs it on a thread
//! ([`super::Contender`]), the simulator in virtual time.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::elector::cache;
use crate::elector::global_level::{GlobalNews, Tell};
use crate::elector::{ChangeReason, GlobalStatus};
use crate::pubkey::AgentPubkey;

use super::super::etcd::{ErrorKind, Etcd, EtcdError};
use super::super::seen::Seen;
use super::super::EtcdConfig;
use super::entry::{Entry, Holding};
use super::outbox::WorkOutbox;
use super::{Inbox, Value};

/// The clocks the task reads.
pub(crate) trait Clock: Send {
    /// The monotonic clock (timers).
    fn now(&self) -> Instant;
    /// The clock permits are counted on ([`cache::boot_nanos`]: it keeps
    /// running through suspend, as etcd's lease clock does).
    fn boot_nanos(&self) -> u64;
    /// Wall time, unix ms (stamps for the writer's news).
    fn unix_ms(&self) -> u64;
}

/// The process's clocks.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
    fn boot_nanos(&self) -> u64 {
        cache::boot_nanos()
    }
    fn unix_ms(&self) -> u64 {
        crate::elector::writer_unix_ms(std::time::SystemTime::now())
    }
}

/// How often what was seen of etcd is kept at most.
pub(crate) const KEEP_EVERY: Duration = Duration::from_millis(100);

/// The longest wait between two calls that etcd refuses in a row.
pub(super) const MAX_REFUSAL_WAIT: Duration = Duration::from_secs(10);

/// The machine.
pub(crate) struct Task {
    pub(super) cfg: EtcdConfig,
    pub(super) our_id: String,
    pub(super) stand_down: Duration,
    pub(super) gw: Arc<dyn Etcd>,
    tell: Tell,
    pub(super) clock: Box<dyn Clock>,
    pub(super) entries: BTreeMap<AgentPubkey, Entry>,
    /// The last time etcd answered anything.
    pub(super) last_contact: Instant,
    /// etcd's last word was no: it is there, and waiting out the backoff
    /// before asking again is no silence.
    pub(super) refused: bool,
    /// The highest store revision etcd has shown us: one below it means
    /// etcd lost data.
    pub(super) known_revision: u64,
    /// After etcd lost data, nobody takes a key before this: a lease etcd
    /// forgot may still back a permit until then.
    pub(super) rewound_until: Option<Instant>,
    /// The cluster id etcd answered with (0: none yet): another one is a
    /// new cluster, which lost whatever the old one held.
    pub(super) known_cluster: u64,
    /// Data losses noticed, this host's windows counted (see
    /// [`crate::global::seen`]).
    pub(super) losses: u64,
    /// What was last handed out to be kept, and when.
    pub(super) kept: (Seen, Option<Instant>),
    /// Our work records in etcd (see [`super::work`]).
    pub(super) work: WorkOutbox,
    /// How long done records are kept.
    pub(super) retention: Duration,
    /// Giving everything up: a hand-over no longer waits for records.
    pub(super) shutting_down: bool,
    /// Where what we hold is listed for a renewer beside us (see
    /// [`super::renewer`]); `None`: none runs.
    pub(crate) leases: Option<Arc<super::renewer::Leases>>,
}

impl Task {
    /// A task for `cfg` (validated), speaking for window `our_id`.
    pub(crate) fn new(
        cfg: EtcdConfig,
        our_id: &str,
        stand_down: Duration,
        gw: Arc<dyn Etcd>,
        tell: Tell,
        clock: Box<dyn Clock>,
    ) -> Self {
        Self {
            last_contact: clock.now(),
            refused: false,
            cfg,
            our_id: our_id.to_owned(),
            stand_down,
            gw,
            tell,
            clock,
            entries: BTreeMap::new(),
            known_revision: 0,
            rewound_until: None,
            known_cluster: 0,
            losses: 0,
            kept: (Seen::default(), None),
            work: WorkOutbox::default(),
            retention: crate::config::DEFAULT_WORK_RETENTION,
            shutting_down: false,
            leases: None,
        }
    }

    /// One input (or none: time passed), then whatever every key needs
    /// now, then news of every permit that changed without a word (see
    /// [`Task::step_all`]).
    /// In the unit tests every step ends with each key inside its phase.
    #[cfg(test)]
    pub(crate) fn step(&mut self, input: Option<Inbox>) {
        self.step_all(input);
        if let Some(broken) = self.phase_violation() {
            panic!("a key outside its phase: {broken}");
        }
    }

    /// Every input waiting (in order), then whatever every key needs now,
    /// then news of every permit that changed without a word. Inputs that
    /// waited together are all taken in before anything is done on etcd:
    /// a host leadership the writer gained and lost again while this task
    /// was busy (a slow link) is never acted on (the simulator with slow
    /// links and no renewer: the stale gain took the sibling's key and the
    /// loss that followed deleted it under the sibling that still acted,
    /// and another host took it;
    /// `slow_links_never_make_two_holders_with_or_without_the_renewer_across_300_seeds`). A panic on
    /// the way (a bug, here or in a call) closes every permit before the
    /// task goes on: no permit outlives the machine's grip on it, and the
    /// next steps look at every key again.
    pub(crate) fn step_all(&mut self, inputs: impl IntoIterator<Item = Inbox>) {
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            for i in inputs {
                self.handle(i);
            }
            self.step_once();
        }));
        if run.is_err() {
            tracing::error!("etcd contender: a step panicked; every permit is closed");
            self.close_all();
        }
    }

    /// After a panic: nothing is held as far as the writer knows, and every
    /// key is looked at again.
    fn close_all(&mut self) {
        let keys: Vec<AgentPubkey> = self.entries.keys().copied().collect();
        for pk in keys {
            if let Some(e) = self.entries.get_mut(&pk) {
                e.holding = Holding::Nothing;
                e.verify = true;
                e.grant(PermitState::NotHeld, 0);
            }
            self.tell(pk, Some(ChangeReason::Lost));
        }
    }

    fn step_once(&mut self) {
        let keys: Vec<AgentPubkey> = self.entries.keys().copied().collect();
        for pk in keys {
            let now = self.clock.now();
            if self.entries[&pk].swap_at.is_some_and(|t| now >= t) {
                self.hand_over_confirmed(pk);
            }
            self.settle(pk);
            self.reread_work(pk);
        }
        self.keep_work();
        let quiet: Vec<AgentPubkey> = self
            .entries
            .iter()
            .filter(|(_, e)| {
                let refusal_news =
                    e.last_error != e.told_error && (e.refusals > 0 || e.last_error.is_none());
                e.permit != e.told || refusal_news
            })
            .map(|(pk, _)| *pk)
            .collect();
        for pk in quiet {
            self.tell(pk, None);
        }
    }

    /// How long the task may wait for its next input.
    pub(crate) fn wait(&self) -> Duration {
        let now = self.clock.now();
        self.next_due().saturating_duration_since(now)
    }

    /// When the task must look again at the latest.
    pub(crate) fn next_due(&self) -> Instant {
        let now = self.clock.now();
        let mut due = now + Duration::from_secs(1);
        for e in self.entries.values().filter(|e| e.leads) {
            let times = [
                e.held().map(|h| h.renew_at),
                e.retry_at,
                e.claim_until,
                (!e.falling_back() && e.held().is_none()).then(|| self.last_contact + self.cfg.ttl),
                e.work_again_at.filter(|_| e.held().is_some()),
            ];
            for t in times.into_iter().flatten().filter(|t| *t > now) {
                due = due.min(t);
            }
        }
        let swaps = self.entries.values().filter_map(|e| e.swap_at);
        for t in self
            .work_due()
            .into_iter()
            .chain(self.keep_due())
            .chain(swaps)
            .filter(|t| *t > now)
        {
            due = due.min(t);
        }
        due.max(now)
    }

    fn handle(&mut self, msg: Inbox) {
        let now = self.clock.now();
        match msg {
            Inbox::Lead {
                pk,
                leads,
                locked,
                revoke,
                tenure,
            } => {
                let e = self.entries.entry(pk).or_insert_with(Entry::new);
                let was = e.leads;
                e.leads = leads;
                e.locked = locked;
                e.tenure = tenure;
                if was && leads {
                    // Only the lock changed. Without it (the NIP's
                    // fail-safe) we give up a key we hold: the sibling
                    // that holds the lock continues it, and must find
                    // nobody else acting on it (the teeth's
                    // `unlocked_keeps_lease`).
                    if !locked && e.held().is_some() && !mutated!(UnlockedKeepsLease) {
                        self.step_back_for(pk, false, Some(ChangeReason::Lost));
                    } else {
                        // The writer closed its permit when the lock went:
                        // it gets the one that stands (a fall-back's).
                        self.tell(pk, None);
                    }
                    return;
                }
                if !leads {
                    self.step_back(pk, revoke);
                } else if now.saturating_duration_since(self.last_contact) >= self.cfg.ttl {
                    // A window that did not lead its host asked etcd
                    // nothing: the silence that decides a fallback counts
                    // from now, when we need etcd.
                    self.last_contact = now;
                }
            }
            Inbox::Claim(pk) => {
                let e = self.entries.entry(pk).or_insert_with(Entry::new);
                e.claim_until = Some(now + self.stand_down);
            }
            Inbox::Withdrawn(pk) => self.hand_over_confirmed(pk),
            Inbox::Took { pk, id } => self.took(pk, id),
            Inbox::Settled { pk, id, done } => self.settled(pk, id, done),
            Inbox::Synced => {
                for e in self.entries.values_mut() {
                    e.verify = true;
                    e.retry_at = None;
                }
            }
            Inbox::Change(c) => {
                self.last_contact = now;
                // A watch (even on a lagging member) delivers committed
                // revisions only: every later call answers at one as high.
                self.known_revision = self.known_revision.max(c.revision);
                self.changed(c)
            }
        }
    }

    /// Whether keys may be taken now (not right after a data loss).
    pub(super) fn may_take(&self) -> bool {
        self.rewound_until.is_none_or(|t| self.clock.now() >= t)
    }

    /// How long etcd has been silent.
    pub(super) fn silence(&self) -> Duration {
        self.clock
            .now()
            .saturating_duration_since(self.last_contact)
    }

    fn status(&self, e: &Entry) -> GlobalStatus {
        GlobalStatus {
            host_id: self.cfg.host_id.clone(),
            holder: e.holder.clone(),
            fallback: e.falling_back(),
            last_error: e.last_error.clone(),
        }
    }

    pub(super) fn tell(&mut self, pk: AgentPubkey, reason: Option<ChangeReason>) {
        self.tell_with(pk, reason, None, false);
    }

    /// [`Task::tell`], saying whether a gain came from another host (what
    /// was published before `unknown_before_ms` it may have answered) and
    /// whether the writer must confirm that it closed the permit.
    pub(super) fn tell_with(
        &mut self,
        pk: AgentPubkey,
        reason: Option<ChangeReason>,
        unknown_before_ms: Option<u64>,
        confirm: bool,
    ) {
        let at_ms = self.clock.unix_ms();
        let Some(work) = self.entries.get_mut(&pk).map(|e| e.work_news.take()) else {
            return;
        };
        let e = &self.entries[&pk];
        let news = GlobalNews {
            work,
            work_unread: e.work_unread && e.held().is_some(),
            reason,
            unknown_before_ms,
            status: self.status(e),
            permit: e.permit,
            tenure: e.tenure,
            confirm,
            at_ms,
        };
        (self.tell)(pk, news);
        if let Some(e) = self.entries.get_mut(&pk) {
            e.told = e.permit;
            e.told_error.clone_from(&e.last_error);
        }
    }

    /// Records a call's outcome for `pk`: contact on success, a retry
    /// delay and the error on failure. `cluster`: the cluster id etcd
    /// answered as.
    pub(super) fn noted<T>(
        &mut self,
        pk: AgentPubkey,
        cluster: u64,
        r: Result<T, EtcdError>,
    ) -> Option<T> {
        // An answer from a new cluster is not acted on: the caller checked
        // `may_take` before it knew.
        let r = if self.same_cluster(cluster) {
            r
        } else {
            Err(EtcdError::refused("etcd answered as a new cluster"))
        };
        let now = self.clock.now();
        let retry = self.retry_delay();
        let e = self.entries.get_mut(&pk)?;
        match r {
            Ok(v) => {
                self.last_contact = now;
                self.refused = false;
                e.last_error = None;
                e.refusals = 0;
                Some(v)
            }
            Err(err) if err.kind == ErrorKind::Refused => {
                // etcd answered: it is there, so its silence (the only road
                // to the fall-back) does not grow, and nothing is acted on
                // across hosts until it says yes. Said once, retried with
                // backoff.
                self.last_contact = now;
                self.refused = true;
                let text = err.to_string();
                if e.last_error.as_deref() != Some(text.as_str()) {
                    tracing::warn!(pubkey = %pk, "etcd refused: {text} (not acting across hosts, and not falling back: etcd answers)");
                }
                e.last_error = Some(text);
                let wait = retry.saturating_mul(1 << e.refusals.min(8));
                e.refusals = e.refusals.saturating_add(1);
                e.retry_at = Some(now + wait.min(MAX_REFUSAL_WAIT));
                None
            }
            Err(err) => {
                self.refused = false;
                e.refusals = 0;
                tracing::debug!(pubkey = %pk, "etcd: {err}");
                e.last_error = Some(err.to_string());
                e.retry_at = Some(now + retry);
                None
            }
        }
    }

    pub(super) fn value(&self) -> Vec<u8> {
        serde_json::to_vec(&Value {
            host_id: self.cfg.host_id.clone(),
            instance_id: self.our_id.clone(),
        })
        .unwrap_or_default()
    }

    /// A TTL etcd answered, bounded by the one we ask for: etcd only ever
    /// raises a TTL to its own minimum (below any TTL we accept), so a
    /// longer one is forged or corrupt (it arrives as an int64 of seconds)
    /// and must never stretch a permit or overflow a timer.
    pub(super) fn bounded(&self, ttl: Duration) -> Duration {
        ttl.min(self.cfg.ttl)
    }

    /// How long to wait before calling etcd again after a failure.
    pub(super) fn retry_delay(&self) -> Duration {
        (self.cfg.ttl / 20).max(Duration::from_millis(50))
    }

    /// What we hold now, for the renewer.
    pub(crate) fn listed(&self) -> super::renewer::Listed {
        let keys = self
            .entries
            .iter()
            .filter_map(|(pk, e)| {
                let h = e.held()?;
                Some((
                    *pk,
                    super::renewer::KeyLease {
                        lease: h.lease,
                        revision: h.revision,
                        tenure: e.tenure,
                        due: h.renew_at,
                    },
                ))
            })
            .collect();
        super::renewer::Listed {
            keys,
            takes: self.work.take_lease.filter(|_| !self.work.mine.is_empty()),
            revision: self.known_revision,
            cluster: self.known_cluster,
        }
    }

    /// Lists what we hold for the renewer (if one runs): before a call
    /// that may take long, and after every step.
    pub(crate) fn list_leases(&self) {
        if let Some(l) = &self.leases {
            l.set(self.listed());
        }
    }
}

/// What a permit lets the writer do, for the moves.
pub(super) use crate::elector::global_level::PermitState;
