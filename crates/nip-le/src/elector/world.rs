//! Everything the writer asks of the world outside its own state: the
//! clocks, the lock store, the probes of other participants, our presence,
//! lead requests, the work ledger's storage and the wake-ups. An app runs
//! [`SystemWorld`] (real files, real clocks, `mio`); the simulator
//! (feature `sim`) runs the same writer against a world of its own, in
//! virtual time, with faults. No rule lives here: only I/O and time.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::config::{Backend, Config};
use crate::control::{self, LeadRequest};
use crate::error::Result;
use crate::host::{self, Here};
use crate::ledger::{self, FileLedger, LedgerStorage};
use crate::liveness::{self, Liveness};
use crate::lockfile;
use crate::presence::{self, HolderPresence, Presence, Sibling};
use crate::pubkey::AgentPubkey;

use super::cache::{self, Clocks};
use super::command::Command;
use super::machine::Now;
use super::store::{LockStore, StoreFactory};
use super::wake::{WakeSources, Woken};

/// Our presence lock (see [`crate::presence`]), as the writer uses it.
pub(crate) trait PresenceLock: Send {
    /// The token our records carry in `live`.
    fn token(&self) -> &str;
    /// Lists exactly `keys` as the elections we take part in.
    fn set_keys(&mut self, keys: Vec<AgentPubkey>) -> Result<()>;
}

impl PresenceLock for Presence {
    fn token(&self) -> &str {
        Presence::token(self)
    }
    fn set_keys(&mut self, keys: Vec<AgentPubkey>) -> Result<()> {
        Presence::set_keys(self, keys)
    }
}

/// The writer's view of the world. One per writer; called from the
/// writer's thread only.
pub(crate) trait World: Send {
    /// The time now, both clocks.
    fn now(&self) -> Now;
    /// The clocks the key cells' deadlines are counted on.
    fn clocks(&self) -> &dyn Clocks;
    /// Our process id.
    fn pid(&self) -> u32;
    /// Our host and boot.
    fn here(&self) -> Arc<Here>;
    /// A fresh random number (nonces, tokens).
    fn random(&mut self) -> u128;

    /// Creates the lock directory if needed.
    fn ensure_dir(&mut self) -> Result<()>;
    /// The store of a newly joined key.
    fn store(&mut self, pk: &AgentPubkey) -> Box<dyn LockStore>;
    /// The storage of a key's work ledger.
    fn ledger(&self, pk: &AgentPubkey) -> Box<dyn LedgerStorage>;

    /// Is the process with this pid running?
    fn probe_pid(&self, pid: u32) -> Liveness;
    /// What the presence of `token` says, without blocking.
    fn probe_holder(&self, token: &str) -> HolderPresence;
    /// The live participants of `pk`'s election but `except_token`.
    fn live_siblings(&self, pk: &AgentPubkey, except_token: &str) -> Vec<Sibling>;
    /// Creates our presence lock, listing `keys` if that saves a write
    /// (the writer lists them with [`PresenceLock::set_keys`] after, which
    /// writes nothing when they are listed already).
    fn create_presence(
        &mut self,
        instance_id: &str,
        keys: Vec<AgentPubkey>,
    ) -> Result<Box<dyn PresenceLock>>;

    /// The local lead request on file for `pk`, if a valid one exists.
    fn read_request(&self, pk: &AgentPubkey) -> Option<LeadRequest>;
    /// Publishes a lead request for `pk`.
    fn write_request(&mut self, pk: &AgentPubkey, req: &LeadRequest) -> Result<()>;
    /// Removes `pk`'s request if it is still the one with `nonce`.
    fn remove_request(&mut self, pk: &AgentPubkey, nonce: &str);

    /// Blocks until something arrives or `timeout` passes.
    fn wait(&mut self, timeout: Option<Duration>) -> Woken<Command>;
    /// Watches `pk`'s lock file for writes.
    fn watch_lock_file(&mut self, pk: &AgentPubkey);
    /// Stops watching `pk`'s lock file.
    fn unwatch_lock_file(&mut self, pk: &AgentPubkey);
    /// Watches the holder of `pk`'s lock (its presence token) for its
    /// death; `None` stops watching.
    fn watch_holder(&mut self, pk: &AgentPubkey, token: Option<&str>);
    /// Whether the holder with `token` is watched: its death will wake us.
    fn watching(&self, token: &str) -> bool;
    /// Stops every watch.
    fn stop_all(&mut self);
}

/// The real world: the lock directory on disk, the process's clocks, and
/// the wake sources of [`super::wake`].
pub(crate) struct SystemWorld {
    dir: PathBuf,
    backend: Backend,
    sources: WakeSources<Command>,
    stores: StoreFactory,
    pid: u32,
}

impl SystemWorld {
    pub(crate) fn new(
        config: &Config,
        sources: WakeSources<Command>,
        stores: StoreFactory,
    ) -> Self {
        Self {
            dir: config.lock_dir.clone(),
            backend: config.backend,
            sources,
            stores,
            pid: liveness::current_pid(),
        }
    }
}

impl World for SystemWorld {
    fn now(&self) -> Now {
        Now {
            mono: Instant::now(),
            wall: SystemTime::now(),
        }
    }
    fn clocks(&self) -> &dyn Clocks {
        &cache::SystemClocks
    }
    fn pid(&self) -> u32 {
        self.pid
    }
    fn here(&self) -> Arc<Here> {
        let mut here = host::here().clone();
        // Portable Linux runs what Windows runs: no boot id in records.
        if cfg!(target_os = "linux") && !self.backend.linux_fast_paths() {
            here.boot = None;
        }
        Arc::new(here)
    }
    fn random(&mut self) -> u128 {
        uuid::Uuid::new_v4().as_u128()
    }

    fn ensure_dir(&mut self) -> Result<()> {
        lockfile::ensure_dir(&self.dir)
    }
    fn store(&mut self, pk: &AgentPubkey) -> Box<dyn LockStore> {
        (self.stores)(pk)
    }
    fn ledger(&self, pk: &AgentPubkey) -> Box<dyn LedgerStorage> {
        Box::new(FileLedger::new(ledger::ledger_path(&self.dir, pk)))
    }

    fn probe_pid(&self, pid: u32) -> Liveness {
        liveness::probe(pid)
    }
    fn probe_holder(&self, token: &str) -> HolderPresence {
        presence::probe_holder(&self.dir, token)
    }
    fn live_siblings(&self, pk: &AgentPubkey, except_token: &str) -> Vec<Sibling> {
        presence::live_siblings(&self.dir, pk, except_token)
    }
    fn create_presence(
        &mut self,
        instance_id: &str,
        keys: Vec<AgentPubkey>,
    ) -> Result<Box<dyn PresenceLock>> {
        Ok(Box::new(Presence::create_listing(
            &self.dir,
            instance_id,
            self.backend,
            keys,
        )?))
    }

    fn read_request(&self, pk: &AgentPubkey) -> Option<LeadRequest> {
        control::read_lead_request(&control::lead_request_path(&self.dir, pk))
    }
    fn write_request(&mut self, pk: &AgentPubkey, req: &LeadRequest) -> Result<()> {
        control::write_lead_request(&control::lead_request_path(&self.dir, pk), req)
    }
    fn remove_request(&mut self, pk: &AgentPubkey, nonce: &str) {
        control::remove_lead_request(&control::lead_request_path(&self.dir, pk), nonce)
    }

    fn wait(&mut self, timeout: Option<Duration>) -> Woken<Command> {
        self.sources.wait(timeout)
    }
    fn watch_lock_file(&mut self, pk: &AgentPubkey) {
        self.sources
            .watch_lock_file(pk, &lockfile::lock_path(&self.dir, pk));
    }
    fn unwatch_lock_file(&mut self, pk: &AgentPubkey) {
        self.sources.unwatch_lock_file(pk);
    }
    fn watch_holder(&mut self, pk: &AgentPubkey, token: Option<&str>) {
        self.sources.watch_holder(pk, token);
    }
    fn watching(&self, token: &str) -> bool {
        self.sources.watching(token)
    }
    fn stop_all(&mut self) {
        self.sources.stop_all();
    }
}
