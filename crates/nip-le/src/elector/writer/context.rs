//! What the writer owns besides the keys: the configuration, the world,
//! our presence lock, and the probes of other participants it answers the
//! machine's questions with.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use crate::config::Config;
use crate::liveness::Liveness;
use crate::presence::{HolderPresence, PeerPresence};
use crate::pubkey::AgentPubkey;

use super::super::global_level::GlobalLevel;
use super::super::machine::{Probes, Rules};
use super::super::world::{PresenceLock, World};
use super::Shared;

/// Everything the writer owns besides the keys.
pub(super) struct Ctx {
    pub(super) config: Config,
    pub(super) rules: Rules,
    pub(super) our_id: Arc<str>,
    pub(super) shared: Arc<Shared>,
    /// Files, clocks and wake-ups.
    pub(super) world: Box<dyn World>,
    /// Extension: our presence lock, listing the keys we take part in
    /// (none in spec mode, or while it cannot be created: then the NIP's
    /// rules apply to us).
    pub(super) presence: Option<Box<dyn PresenceLock>>,
    /// Whether a failure to create the presence was logged already.
    presence_warned: bool,
    /// The keys our presence must list.
    pub(super) joined: BTreeSet<AgentPubkey>,
    /// Whether the presence file lags behind `joined`.
    pub(super) presence_dirty: bool,
    /// The keys the presence file lists now (its last successful write).
    listed: BTreeSet<AgentPubkey>,
    /// Holders probed since the last answer: a holder of several keys is
    /// probed once per command, not once per key.
    pub(super) probed: RefCell<HashMap<String, HolderPresence>>,
    /// The global level (etcd), when configured.
    pub(super) global_level: Option<Box<dyn GlobalLevel>>,
}

impl Ctx {
    pub(super) fn new(
        config: Config,
        rules: Rules,
        our_id: Arc<str>,
        shared: Arc<Shared>,
        world: Box<dyn World>,
        global_level: Option<Box<dyn GlobalLevel>>,
    ) -> Self {
        Self {
            config,
            rules,
            our_id,
            shared,
            world,
            presence: None,
            presence_warned: false,
            joined: BTreeSet::new(),
            presence_dirty: false,
            listed: BTreeSet::new(),
            probed: RefCell::new(HashMap::new()),
            global_level,
        }
    }

    pub(super) fn token(&self) -> Option<&str> {
        self.presence.as_ref().map(|p| p.token())
    }

    /// Our token, for a record or a take of `pk`: only while the presence
    /// file lists `pk`. Peers read a token that their probe does not find
    /// in the election as a holder gone, and would take over at once (the
    /// simulator: a presence that a full disk kept from listing a key
    /// joined again, and two acting windows); without it the NIP's rules
    /// judge the record.
    pub(super) fn token_for(&self, pk: &AgentPubkey) -> Option<&str> {
        self.token().filter(|_| self.listed.contains(pk))
    }

    /// Extension: makes sure we have a presence file listing exactly the
    /// joined keys. Without one (full disk, read-only directory) we still
    /// take part, by the NIP's rules: our records carry no token and peers
    /// judge them by pid and claimed_at. Called on join and leave, before
    /// any write of our record, and after each command (to retry a
    /// presence that could not be created).
    pub(super) fn flush_presence(&mut self) {
        if !self.rules.profile.presence || !(self.presence_dirty || self.presence.is_none()) {
            return;
        }
        if self.presence.is_none() && self.joined.is_empty() {
            return;
        }
        if self.presence.is_none() {
            let keys = self.joined.iter().copied().collect();
            match self.world.create_presence(&self.our_id, keys) {
                Ok(p) => self.presence = Some(p),
                Err(e) => {
                    if !std::mem::replace(&mut self.presence_warned, true) {
                        tracing::warn!("no presence lock, NIP rules only: {e}");
                    }
                    return;
                }
            }
        }
        if let Some(p) = self.presence.as_mut() {
            match p.set_keys(self.joined.iter().copied().collect()) {
                Ok(()) => {
                    self.presence_dirty = false;
                    self.listed = self.joined.clone();
                }
                Err(e) => tracing::warn!("cannot update the presence file: {e}"),
            }
        }
    }
}

/// Probes with real I/O. Between ticks, a holder whose death we are
/// watching (for any key it holds) is alive until the watch fires: no need
/// to open its presence file again. Ticks always probe, so a missed event
/// (or a holder that left one key without writing it) costs at most a
/// refresh interval.
pub(super) struct FileProbes<'a> {
    ctx: &'a Ctx,
    pubkey: &'a AgentPubkey,
    trust_watch: bool,
}

impl<'a> FileProbes<'a> {
    pub(super) fn new(ctx: &'a Ctx, pubkey: &'a AgentPubkey, trust_watch: bool) -> Self {
        Self {
            ctx,
            pubkey,
            trust_watch,
        }
    }
}

impl Probes for FileProbes<'_> {
    fn pid(&self, pid: u32) -> Liveness {
        self.ctx.world.probe_pid(pid)
    }
    fn presence(&self, token: &str) -> PeerPresence {
        if self.trust_watch && self.ctx.world.watching(token) {
            return PeerPresence::Alive;
        }
        let mut probed = self.ctx.probed.borrow_mut();
        probed
            .entry(token.to_owned())
            .or_insert_with(|| self.ctx.world.probe_holder(token))
            .in_election(self.pubkey)
    }
    fn others_present(&self) -> bool {
        self.ctx
            .token()
            .is_some_and(|t| !self.ctx.world.live_siblings(self.pubkey, t).is_empty())
    }
    fn present_as(&self, id: &str) -> Option<String> {
        let ours = self.ctx.token()?;
        (self.ctx.world.live_siblings(self.pubkey, ours).into_iter())
            .find(|s| s.instance_id == id)
            .map(|s| s.token)
    }
}
