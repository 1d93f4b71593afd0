//! The lab: real `nip-le run` processes under real signals, driven and
//! observed through the same JSON lines.
//! * [`cluster`]: spawn, signal and wait on instances;
//! * [`feed`]: follow an appended JSON-lines file (the simulated relay);
//! * [`demo`]: the narrated election of the README's main job;
//! * [`bench`](mod@bench): every latency and cost row, spec and extended side by side;
//! * [`chaos`]: random faults on a mixed cluster, with a pure analysis.
//! * [`etcd`]: a real etcd on loopback for the cross-host tests, and
//!   [`etcd_secure`] its production setup (TLS with client certificates,
//!   users);
//! * [`slow_link`]: a TCP proxy that delays every byte (etcd far away);
//! * [`sim`]: seeds of the deterministic simulator (`nip_le::sim`), in
//!   virtual time;
//! * [`stand_in`]: a stand-in for upstream's agent harness and its
//!   instance lease, for the supervised-agent tests.

pub mod bench;
#[cfg(unix)]
pub mod chaos;
pub mod cluster;
pub mod demo;
pub mod etcd;
pub mod etcd_secure;
pub mod feed;
mod peer_net;
mod ports;
pub mod process;
pub mod sim;
pub mod slow_link;
pub mod stand_in;
