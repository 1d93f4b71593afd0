//! The lab: what measures and attacks the election with real processes,
//! beside the user's `nip-le` (whose library, `nip_le_cli`, drives the
//! processes: `nip_le_cli::drive`).
//! * [`bench`](mod@bench): every latency and cost row, spec and extended
//!   side by side;
//! * [`chaos`]: random faults on a mixed cluster, with a pure analysis;
//! * [`etcd`]: a real etcd on loopback for the cross-host tests, and
//!   [`etcd_secure`] its production setup (TLS with client certificates,
//!   users);
//! * [`slow_link`]: a TCP proxy that delays every byte (etcd far away);
//! * [`stand_in`]: a stand-in for upstream's agent harness and its
//!   instance lease, for the supervised-agent tests.
//!
//! Never published, never linked by apps.

pub mod bench;
#[cfg(unix)]
pub mod chaos;
pub mod etcd;
pub mod etcd_secure;
mod peer_net;
mod ports;
pub mod slow_link;
pub mod stand_in;
