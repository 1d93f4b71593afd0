//! What a run across hosts found (see [`super::hosts`]).

use super::check::Violation;

/// What a run across hosts found.
#[derive(Debug, Clone, Default)]
pub struct HostsOutcome {
    /// The first broken invariant, if any (prefixed with its host).
    pub violation: Option<Violation>,
    /// Faults injected: on the hosts and between hosts and etcd.
    pub faults: u64,
    /// Mentions published.
    pub mentions: u64,
    /// Of which answered at least once.
    pub answered: u64,
    /// Mentions never answered.
    pub unanswered: u64,
    /// Mentions answered by windows of two hosts.
    pub twice_across_hosts: u64,
    /// Of which one answer came while a window acted under the fall-back
    /// (etcd out of its reach): the policy's price, counted apart.
    pub twice_under_fallback: u64,
    /// Of which one was taken or answered on a host whose link to etcd was
    /// cut or lossy then (under the tail of its permit): its take or done
    /// could not be recorded before the link came back, and not at all if
    /// the window was gone by then. Counted apart.
    pub twice_done_cut_off: u64,
    /// Of which one answer was a reply on its way whose window froze for
    /// two thirds of a TTL or more before it went out (its take record's
    /// lease, renewed every TTL/3, may have lapsed).
    pub twice_frozen_reply: u64,
    /// Mentions answered twice within one host.
    pub twice_within_a_host: u64,
    /// Of which the second grant was forced by the disk or made while the
    /// first reply waited frozen (as within one host's run).
    pub twice_forced_within_a_host: u64,
    /// Time windows of two hosts acted at once under the fall-back, ns.
    pub fallback_overlap_ns: u64,
    /// Longest silence, ns.
    pub longest_silence_ns: u64,
    /// Etcd calls, and those that failed.
    pub etcd_calls: u64,
    /// See [`HostsOutcome::etcd_calls`].
    pub etcd_failed: u64,
    /// Times the window acting with etcd's key changed.
    pub key_moves: u64,
}
