//! One window's view of the simulated machine: the [`World`] the real
//! writer runs against in a simulation, its lock store, ledger storage and
//! presence lock. Each call does what the kernel and the filesystem would,
//! with the faults in force; none decides anything about the election.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::control::LeadRequest;
use crate::elector::cache::Clocks;
use crate::elector::store::LockStore;
use crate::elector::{Command, Now, PresenceLock, Updated, Wake, World, Write};
use crate::error::{Error, Result};
use crate::ledger::{LedgerError, LedgerStorage};
use crate::liveness::Liveness;
use crate::presence::{HolderPresence, Sibling};
use crate::pubkey::AgentPubkey;
use crate::record::LockContent;
use crate::sim::Invariant;

use super::rng::Rng;
use super::state::{ProcId, SimClocks, State};

/// The machine, shared by every process of a run (one thread drives them
/// all; the lock is never contended).
pub type Machine = Arc<Mutex<State>>;

/// Locks the machine (a poisoned lock is still the machine: a panic in a
/// writer is a finding, not a reason to stop looking).
pub fn lock(m: &Machine) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How long a file event takes to reach a watcher.
const EVENT_DELAY: u64 = 200_000;

fn io(kind: std::io::ErrorKind, what: &str) -> Error {
    Error::io("/sim", std::io::Error::new(kind, what.to_owned()))
}

/// Why a write fails now, if it does.
pub(crate) fn write_fault(s: &State) -> Option<Error> {
    if s.faults.readonly_until > s.t {
        Some(io(
            std::io::ErrorKind::PermissionDenied,
            "read-only file system",
        ))
    } else if s.faults.eio_until > s.t {
        Some(io(std::io::ErrorKind::Other, "EIO"))
    } else if s.faults.enospc_until > s.t {
        Some(io(std::io::ErrorKind::StorageFull, "ENOSPC"))
    } else {
        None
    }
}

/// A window's world.
pub struct SimWorld {
    m: Machine,
    me: ProcId,
    clocks: SimClocks,
    rng: Rng,
}

impl SimWorld {
    /// The world of process `me`.
    pub fn new(m: Machine, me: ProcId, rng: Rng) -> Self {
        let clocks = lock(&m).clocks.clone();
        Self { m, me, clocks, rng }
    }
}

impl World for SimWorld {
    fn now(&self) -> Now {
        let s = lock(&self.m);
        Now {
            mono: s.instant(s.mono()),
            wall: s.wall(),
        }
    }
    fn clocks(&self) -> &dyn Clocks {
        &self.clocks
    }
    fn pid(&self) -> u32 {
        lock(&self.m).procs[self.me].pid
    }
    fn here(&self) -> Arc<crate::host::Here> {
        // One simulated host per machine (its name, a fixed boot).
        Arc::new(crate::host::Here {
            host: Some(lock(&self.m).host.clone()),
            boot: Some("sim-boot".into()),
        })
    }
    fn random(&mut self) -> u128 {
        (u128::from(self.rng.next_u64()) << 64) | u128::from(self.rng.next_u64())
    }

    fn ensure_dir(&mut self) -> Result<()> {
        Ok(())
    }
    fn store(&mut self, pk: &AgentPubkey) -> Box<dyn LockStore> {
        Box::new(SimStore {
            m: Arc::clone(&self.m),
            me: self.me,
            pk: *pk,
        })
    }
    fn ledger(&self, pk: &AgentPubkey) -> Box<dyn LedgerStorage> {
        Box::new(SimLedger {
            m: Arc::clone(&self.m),
            pk: *pk,
            me: self.me,
            seen: None,
        })
    }

    fn probe_pid(&self, pid: u32) -> Liveness {
        if lock(&self.m).pid_alive(pid) {
            Liveness::Alive
        } else {
            Liveness::Dead
        }
    }
    fn probe_holder(&self, token: &str) -> HolderPresence {
        let s = lock(&self.m);
        match s
            .procs
            .iter()
            .find(|p| p.alive && p.token.as_deref() == Some(token))
        {
            Some(p) => HolderPresence::Alive(Some(p.presence_keys.clone())),
            None => HolderPresence::Gone,
        }
    }
    fn live_siblings(&self, pk: &AgentPubkey, except_token: &str) -> Vec<Sibling> {
        let s = lock(&self.m);
        s.procs
            .iter()
            .filter(|p| p.alive && p.presence_keys.contains(pk))
            .filter_map(|p| {
                let token = p.token.as_deref()?;
                (token != except_token).then(|| Sibling {
                    token: token.to_owned(),
                    instance_id: p.instance_id.clone(),
                    pid: p.pid,
                })
            })
            .collect()
    }
    /// Lists nothing at creation: the writer's `set_keys` that follows
    /// lists the keys, with its own faults, as it always did.
    fn create_presence(
        &mut self,
        _instance_id: &str,
        _keys: Vec<AgentPubkey>,
    ) -> Result<Box<dyn PresenceLock>> {
        let rand = self.rng.next_u64() | 1;
        let mut s = lock(&self.m);
        if let Some(e) = write_fault(&s) {
            return Err(e);
        }
        let p = &mut s.procs[self.me];
        let token = format!("{}-{rand:016x}", p.pid);
        p.token = Some(token.clone());
        Ok(Box::new(SimPresence {
            m: Arc::clone(&self.m),
            me: self.me,
            token,
        }))
    }

    fn read_request(&self, pk: &AgentPubkey) -> Option<LeadRequest> {
        lock(&self.m).requests.get(pk).cloned()
    }
    fn write_request(&mut self, pk: &AgentPubkey, req: &LeadRequest) -> Result<()> {
        let mut s = lock(&self.m);
        if let Some(e) = write_fault(&s) {
            return Err(e);
        }
        s.requests.insert(*pk, req.clone());
        s.file_event(pk, EVENT_DELAY);
        Ok(())
    }
    fn remove_request(&mut self, pk: &AgentPubkey, nonce: &str) {
        let mut s = lock(&self.m);
        if write_fault(&s).is_none() && s.requests.get(pk).is_some_and(|r| r.nonce == nonce) {
            s.requests.remove(pk);
            s.file_event(pk, EVENT_DELAY);
        }
    }

    fn wait(&mut self, _timeout: Option<Duration>) -> Wake<Command> {
        let mut s = lock(&self.m);
        let p = &mut s.procs[self.me];
        Wake::of(
            std::mem::take(&mut p.inbox),
            std::mem::take(&mut p.wake_keys),
        )
    }
    fn watch_lock_file(&mut self, pk: &AgentPubkey) {
        let mut s = lock(&self.m);
        let p = &mut s.procs[self.me];
        if p.extended() {
            p.watch_files.insert(*pk);
        }
    }
    fn unwatch_lock_file(&mut self, pk: &AgentPubkey) {
        lock(&self.m).procs[self.me].watch_files.remove(pk);
    }
    fn watch_holder(&mut self, pk: &AgentPubkey, token: Option<&str>) {
        let mut s = lock(&self.m);
        let Some(token) = token else {
            s.procs[self.me].holder_watch.remove(pk);
            return;
        };
        let holder_alive = s
            .procs
            .iter()
            .any(|p| p.alive && p.token.as_deref() == Some(token));
        let t = s.t;
        let p = &mut s.procs[self.me];
        if !p.extended() {
            return;
        }
        if holder_alive {
            p.holder_watch.insert(*pk, token.to_owned());
        } else {
            // Like a pidfd of a process already gone: look again.
            p.holder_watch.remove(pk);
            p.wake_keys.insert(*pk);
            s.wakeups.push((self.me, t));
        }
    }
    fn watching(&self, token: &str) -> bool {
        lock(&self.m).procs[self.me]
            .holder_watch
            .values()
            .any(|t| t == token)
    }
    fn stop_all(&mut self) {
        let mut s = lock(&self.m);
        let p = &mut s.procs[self.me];
        p.watch_files.clear();
        p.holder_watch.clear();
    }
}

/// A window's lock store: the file with `flock` semantics and the mark.
struct SimStore {
    m: Machine,
    me: ProcId,
    pk: AgentPubkey,
}

impl LockStore for SimStore {
    fn read(&self) -> Result<LockContent> {
        let s = lock(&self.m);
        if s.faults.eio_until > s.t {
            return Err(io(std::io::ErrorKind::Other, "EIO"));
        }
        Ok(s.files
            .get(&self.pk)
            .map_or(LockContent::Absent, |f| f.content()))
    }

    fn update(
        &mut self,
        decide: &mut dyn FnMut(&LockContent, crate::epoch::Mark) -> Write,
    ) -> Result<Updated> {
        let (content, floor) = {
            let mut s = lock(&self.m);
            if s.faults.eio_until > s.t {
                return Err(io(std::io::ErrorKind::Other, "EIO"));
            }
            let (t, wait) = (s.t, s.lock_wait);
            let f = s.files.entry(self.pk).or_default();
            if f.held_until > t + wait {
                return Err(Error::LockTimeout {
                    path: "/sim".into(),
                    waited: Duration::from_nanos(wait),
                });
            }
            // A peer's hold that ends within our wait: its write lands first.
            if let Some(bytes) = f.pending.take() {
                f.bytes = bytes;
            }
            f.held_until = 0;
            let content = f.content();
            let floor = match content.record().and_then(|r| r.epoch) {
                Some(_) => crate::epoch::Mark::default(),
                None => f.mark,
            };
            (content, floor)
        };
        // The machine is unlocked while deciding: the decision probes it.
        let write = decide(&content, floor);
        let mut s = lock(&self.m);
        if write != Write::Keep {
            if s.procs[self.me].left.contains(&self.pk) {
                let what = format!("{} wrote a key it had left", s.procs[self.me].instance_id);
                let v = super::check::Violation::new(s.t, Invariant::WriteAfterLeave, what);
                s.violations.push(v);
            }
            if let Some(e) = write_fault(&s) {
                return Err(e);
            }
        }
        let f = s.files.entry(self.pk).or_default();
        let updated = match write {
            Write::Keep => Updated {
                content,
                wrote: false,
            },
            Write::Put(bytes, record) => {
                if let Some(e) = record.epoch {
                    f.mark = f.mark.raised(e);
                }
                let before = content
                    .record()
                    .filter(|r| r.epoch.is_none() && record.epoch.is_some());
                let unkept = before.map(|r| r.instance_id.clone()).filter(|by| {
                    *by != record.instance_id
                        && (s.unkept.contains(by) || !s.kept.contains(by))
                        && !(s.procs.iter()).any(|p| {
                            // Its window takes part in the key (a presence
                            // that lists it): the successor can tell.
                            p.alive
                                && matches!(p.kind, super::state::Kind::Window { .. })
                                && p.instance_id == *by
                                && p.token.is_some()
                                && p.presence_keys.contains(&self.pk)
                        })
                });
                if unkept.is_some() {
                    let t = s.t;
                    s.unkept_replaced.push(t);
                }
                let f = s.files.entry(self.pk).or_default();
                f.bytes = bytes;
                f.exists = true;
                Updated {
                    content: LockContent::Record(record),
                    wrote: true,
                }
            }
            Write::Clear(mark) => {
                if let Some(e) = mark {
                    f.mark = f.mark.released_at(e);
                }
                f.bytes.clear();
                f.exists = true;
                Updated {
                    content: LockContent::Empty,
                    wrote: true,
                }
            }
        };
        if updated.wrote {
            s.wrote(&self.pk, self.me);
            s.file_event(&self.pk, EVENT_DELAY);
        }
        Ok(updated)
    }
}

/// A key's ledger bytes, with the faults in force.
struct SimLedger {
    m: Machine,
    pk: AgentPubkey,
    /// The writing process, for the checker's account of refused lines.
    me: ProcId,
    /// The file last read ([`State::ledger_files`]).
    seen: Option<u64>,
}

/// The ledger lines in `bytes`.
fn ops(bytes: &[u8]) -> impl Iterator<Item = crate::ledger::Op> + '_ {
    (bytes.split(|&b| b == b'\n')).filter_map(|l| serde_json::from_slice(l).ok())
}

/// The ids of the `done` lines in `bytes`.
fn dones(bytes: &[u8]) -> Vec<String> {
    (ops(bytes))
        .filter_map(|op| match op {
            crate::ledger::Op::Done { id, .. } => Some(id),
            _ => None,
        })
        .collect()
}

/// The `held` lines in `bytes`: whose.
fn helds(bytes: &[u8]) -> Vec<String> {
    (ops(bytes))
        .filter_map(|op| match op {
            crate::ledger::Op::Held { by, .. } => Some(by),
            _ => None,
        })
        .collect()
}

/// Notes a ledger's new length: its peak, and a violation the first time
/// it passes the read cap (past it no process reads it: every later holder
/// dispatches without it).
fn grown(s: &mut State, len: usize) {
    let cap = usize::try_from(crate::ledger::MAX_LEDGER_BYTES).unwrap_or(usize::MAX);
    if len > cap && s.ledger_peak <= cap {
        let what = format!("{len} bytes, the cap is {cap}");
        let v = super::check::Violation::new(s.t, Invariant::LedgerPastReadCap, what);
        s.violations.push(v);
    }
    s.ledger_peak = s.ledger_peak.max(len);
}

/// Notes which of `me`'s `done` and `held` lines the disk took.
fn written(s: &mut State, me: ProcId, bytes: &[u8]) {
    let unwritten = &mut s.procs[me].unwritten_done;
    for id in dones(bytes) {
        unwritten.remove(&id);
    }
    for by in helds(bytes) {
        s.unkept.remove(&by);
        s.kept.insert(by);
    }
}

impl std::fmt::Debug for SimLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimLedger").field("pk", &self.pk).finish()
    }
}

impl LedgerStorage for SimLedger {
    fn read(&mut self) -> std::result::Result<Vec<u8>, LedgerError> {
        let s = lock(&self.m);
        if s.faults.eio_until > s.t {
            return Err(LedgerError::Unreadable("EIO".into()));
        }
        self.seen = Some(s.ledger_files.get(&self.pk).copied().unwrap_or(0));
        let all = s.ledgers.get(&self.pk).map_or(&[][..], Vec::as_slice);
        // As a real file: past the cap it is not read (a day's run grew one
        // past it unnoticed while this read everything).
        if all.len() as u64 > crate::ledger::MAX_LEDGER_BYTES {
            return Err(LedgerError::Oversized);
        }
        Ok(all.to_vec())
    }
    /// Only the tail (the default reads the whole file: a day's run copied
    /// its ledger at every take).
    fn read_from(&mut self, offset: u64) -> std::result::Result<Vec<u8>, LedgerError> {
        let s = lock(&self.m);
        if s.faults.eio_until > s.t {
            return Err(LedgerError::Unreadable("EIO".into()));
        }
        let file = s.ledger_files.get(&self.pk).copied().unwrap_or(0);
        if self.seen.is_some_and(|seen| seen != file) {
            return Err(LedgerError::Rewritten);
        }
        self.seen = Some(file);
        let all = s.ledgers.get(&self.pk).map_or(&[][..], Vec::as_slice);
        if all.len() as u64 > crate::ledger::MAX_LEDGER_BYTES {
            return Err(LedgerError::Oversized);
        }
        let from = usize::try_from(offset).map_err(|_| LedgerError::Rewritten)?;
        all.get(from..)
            .map(<[u8]>::to_vec)
            .ok_or(LedgerError::Rewritten)
    }
    fn read_tail(&mut self, max: u64) -> std::result::Result<Vec<u8>, LedgerError> {
        let s = lock(&self.m);
        if s.faults.eio_until > s.t {
            return Err(LedgerError::Unreadable("EIO".into()));
        }
        self.seen = Some(s.ledger_files.get(&self.pk).copied().unwrap_or(0));
        let all = s.ledgers.get(&self.pk).map_or(&[][..], Vec::as_slice);
        if all.len() as u64 <= crate::ledger::MAX_LEDGER_BYTES {
            return Ok(all.to_vec());
        }
        let from = all
            .len()
            .saturating_sub(usize::try_from(max).unwrap_or(usize::MAX));
        Ok(crate::ledger::after_first_newline(all[from..].to_vec()))
    }
    fn append(&mut self, line: &[u8], durable: bool) -> Result<()> {
        let mut s = lock(&self.m);
        if let Some(e) = write_fault(&s) {
            s.unkept.extend(helds(line));
            // A disk that fills takes part of a write, as a real one may: a
            // fragment without its newline. Then it is full: the writes
            // after it take nothing (taking half of each, the simulated
            // ledger grew past its read cap during one long fault, which
            // no real disk allows).
            if s.faults.enospc_until > s.t
                && s.faults.readonly_until <= s.t
                && s.faults.eio_until <= s.t
                && std::mem::take(&mut s.faults.enospc_room)
            {
                let part = line.len() / 2;
                let l = s.ledgers.entry(self.pk).or_default();
                l.extend_from_slice(&line[..part]);
                let len = l.len();
                grown(&mut s, len);
            }
            return Err(e);
        }
        let l = s.ledgers.entry(self.pk).or_default();
        l.extend_from_slice(line);
        let len = l.len();
        grown(&mut s, len);
        if durable {
            // `fdatasync`: everything written so far is on disk.
            s.ledger_synced.insert(self.pk, len);
        }
        written(&mut s, self.me, line);
        Ok(())
    }
    fn limits(&self) -> crate::ledger::Limits {
        lock(&self.m).ledger_limits
    }
    fn replace(&mut self, body: &[u8]) -> Result<()> {
        let mut s = lock(&self.m);
        if let Some(e) = write_fault(&s) {
            return Err(e);
        }
        s.ledgers.insert(self.pk, body.to_vec());
        let file = s.ledger_files.entry(self.pk).or_default();
        *file += 1;
        self.seen = Some(*file);
        // The temporary file and the directory are synced around the rename.
        s.ledger_synced.insert(self.pk, body.len());
        written(&mut s, self.me, body);
        Ok(())
    }
}

/// A window's presence lock: held while the process lives.
struct SimPresence {
    m: Machine,
    me: ProcId,
    token: String,
}

impl PresenceLock for SimPresence {
    fn token(&self) -> &str {
        &self.token
    }
    fn set_keys(&mut self, keys: Vec<AgentPubkey>) -> Result<()> {
        let mut s = lock(&self.m);
        if let Some(e) = write_fault(&s) {
            return Err(e);
        }
        s.procs[self.me].presence_keys = keys;
        Ok(())
    }
}

impl Drop for SimPresence {
    fn drop(&mut self) {
        let mut s = lock(&self.m);
        let p = &mut s.procs[self.me];
        if p.token.as_deref() == Some(self.token.as_str()) {
            p.token = None;
            p.presence_keys.clear();
        }
        s.holder_gone(&self.token, EVENT_DELAY);
    }
}
