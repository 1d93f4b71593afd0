//! The NIP's own writer, as Buzz's branch harness runs it (facts in
//! `INTEROP.md`), written from that description and not from our rules so
//! that the two are tested against each other: every refresh a blocking
//! `flock`, takeable when empty, malformed, its own id, a dead pid or a
//! `claimed_at` over 10 s old (a future one is not stale), an in-place
//! write (truncate, then write: a lock-free reader can see the file empty
//! in between), then a cached read that answers "leader" until the next
//! refresh. Release truncates when the record names it; a
//! `claim_leadership` frame for another instance stands it down for 10 s.
//! A harness child of a window shares the window's instance id with a pid of its
//! own.

use std::time::Duration;

use crate::pubkey::AgentPubkey;
use crate::record::{encode_record, LockContent};

use super::state::{ProcId, State};

/// The harness's stale bound and stand-down (the NIP's defaults; it has no
/// configuration).
const STALE: Duration = Duration::from_secs(10);
const STAND_DOWN: u64 = 10_000_000_000;

/// One harness process in one agent's election.
#[derive(Debug)]
pub struct Harness {
    /// Its process.
    pub proc: ProcId,
    /// The agent.
    pub pk: AgentPubkey,
    /// What its last read said (what its prompt path, 👀 and heartbeat use).
    pub leader: bool,
    /// Acquire is suppressed until then.
    pub stand_down_until: u64,
}

/// What a harness asks the driver to do next.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// Its next refresh, at this time.
    Tick(u64),
    /// Its in-place write completes at this time (the `flock` is held until
    /// then).
    Finish(u64),
    /// It waits on the `flock` another process holds until then.
    Retry(u64),
}

impl Harness {
    /// A harness for `pk` in process `proc`.
    pub fn new(proc: ProcId, pk: AgentPubkey) -> Self {
        Self {
            proc,
            pk,
            leader: false,
            stand_down_until: 0,
        }
    }

    /// One refresh: acquire (unless standing down), then re-read.
    /// `half_write` is how long its in-place write takes.
    pub fn tick(&mut self, s: &mut State, half_write: u64, refresh: u64) -> Next {
        let t = s.t;
        if self.stand_down_until > t {
            self.read(s);
            return Next::Tick(t + refresh);
        }
        let (id, pid) = (
            s.procs[self.proc].instance_id.clone(),
            s.procs[self.proc].pid,
        );
        let wall = s.wall();
        let f = s.files.entry(self.pk).or_default();
        if f.held_until > t {
            return Next::Retry(f.held_until);
        }
        if let Some(bytes) = f.pending.take() {
            f.bytes = bytes;
        }
        let content = f.content();
        let takeable = match &content {
            LockContent::Record(r) => {
                r.instance_id == id
                    || !s.procs.iter().any(|p| p.alive && p.pid == r.pid)
                    || match r.claimed_at.instant() {
                        None => true,
                        Some(at) => wall.duration_since(at).is_ok_and(|age| age > STALE),
                    }
            }
            _ => true,
        };
        if !takeable {
            self.read(s);
            return Next::Tick(t + refresh);
        }
        let f = s.files.entry(self.pk).or_default();
        f.bytes.clear();
        f.exists = true;
        f.pending = Some(encode_record(&id, pid, wall, None));
        f.held_until = t + half_write;
        s.file_event(&self.pk, 0);
        Next::Finish(t + half_write)
    }

    /// The second half of the in-place write, then the cached read.
    pub fn finish(&mut self, s: &mut State, refresh: u64) -> Next {
        let f = s.files.entry(self.pk).or_default();
        if let Some(bytes) = f.pending.take() {
            f.bytes = bytes;
            f.held_until = 0;
            s.wrote(&self.pk, self.proc);
            s.file_event(&self.pk, 0);
        }
        self.read(s);
        Next::Tick(s.t + refresh)
    }

    /// The read side, cached until the next refresh.
    pub fn read(&mut self, s: &State) {
        let id = &s.procs[self.proc].instance_id;
        self.leader = match s.files.get(&self.pk).map(|f| f.content()) {
            Some(LockContent::Record(r)) => r.instance_id == *id,
            _ => true,
        };
    }

    /// Graceful exit: truncate iff the record names it.
    pub fn release(&mut self, s: &mut State) {
        let id = s.procs[self.proc].instance_id.clone();
        let f = s.files.entry(self.pk).or_default();
        if let Some(bytes) = f.pending.take() {
            f.bytes = bytes;
            f.held_until = 0;
        }
        if f.content().record().is_some_and(|r| r.instance_id == id) {
            f.bytes.clear();
            s.file_event(&self.pk, 0);
        }
        self.leader = false;
    }

    /// A `claim_leadership` frame for `target`.
    pub fn claim_frame(&mut self, s: &mut State, target: &str) {
        if self.leader && target != s.procs[self.proc].instance_id {
            self.stand_down_until = s.t + STAND_DOWN;
            self.release(s);
        }
    }
}
