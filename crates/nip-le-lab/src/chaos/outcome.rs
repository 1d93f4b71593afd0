//! What a chaos run recorded: every incarnation's life and views, every
//! mention sent, and the faults' spans. The runner and each fault's shell
//! write it; the analysis and the report read it.

use std::collections::BTreeMap;

use nip_le::Mode;

/// One incarnation of an instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Life {
    /// Its instance id.
    pub instance_id: String,
    /// Its mode.
    pub mode: Mode,
    /// Its (simulated) host.
    pub host: usize,
    /// Start, unix ms.
    pub start: u64,
    /// End (killed, exited, or the run's end), unix ms.
    pub end: Option<u64>,
    /// (stop, cont) intervals, unix ms.
    pub stops: Vec<(u64, u64)>,
    /// Of those, the ones its harness child ran through: their shared
    /// record stayed fresh, so nothing could take the lock over.
    pub fresh_stops: Vec<(u64, u64)>,
    /// When a claim was sent to it (its user claimed the agent), unix ms.
    pub claims: Vec<u64>,
    /// Leadership reports: (at_ms, is_leader).
    pub views: Vec<(u64, bool)>,
    /// The same reports as said: (at_ms, "level reason"), to explain a
    /// duplicate.
    pub said: Vec<(u64, String)>,
}

/// A fault of one member of an etcd cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberFault {
    /// Which member.
    pub member: usize,
    /// Cut from the others (clients still reach it, and a write sent to it
    /// waits for the call's timeout), or else killed and started again
    /// (its clients move on at once).
    pub cut: bool,
    /// From, unix ms.
    pub from: u64,
    /// Until, unix ms.
    pub until: u64,
}

/// Everything the runner recorded.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Every incarnation of every slot.
    pub lives: Vec<Life>,
    /// Mentions sent: (id, unix ms).
    pub sent: Vec<(String, u64)>,
    /// SIGKILLs: (unix ms, whether the victim was leading).
    pub deaths: Vec<(u64, bool)>,
    /// How many faults of each kind.
    pub counts: BTreeMap<&'static str, u64>,
    /// Cross-host runs: when etcd was stopped, (stop, cont) in unix ms.
    pub etcd_pauses: Vec<(u64, u64)>,
    /// Cross-host runs: how long after a pause etcd still counts as
    /// unreachable (the fall-back policy acts on a whole TTL of silence,
    /// and the hosts settle again after), ms.
    pub etcd_grace_ms: u64,
    /// Cross-host runs on a cluster: a member restarted or partitioned;
    /// the majority still serves, so nothing is excused by them.
    pub etcd_member_faults: Vec<MemberFault>,
    /// Cross-host runs: etcd's members (host `h` asks member
    /// `h % etcd_members` first).
    pub etcd_members: usize,
    /// Runs with harness children: from the SIGKILL of a leading window
    /// to its child's exit, unix ms. The child holds the lock with the
    /// window's instance id meanwhile, as the NIP lets it, and answers nothing
    /// here (in Buzz's desktop, the harness is what answers).
    pub orphan_holds: Vec<(u64, u64)>,
    /// `--fill-locks-fs`: when the lock directories' filesystem was full,
    /// (from, until) in unix ms.
    pub disk_full: Vec<(u64, u64)>,
}
