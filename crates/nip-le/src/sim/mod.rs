//! A deterministic simulator of the election (feature `sim`), in the
//! manner of FoundationDB's and TigerBeetle's simulation testing: the real
//! writer of every window (its machine, announcements, fencing, the work
//! ledger) runs against a simulated machine in virtual time, one thread,
//! one seed. Real-process chaos checks the shells and the kernel; this
//! checks the rules, thousands of times faster, in a fault space no real
//! box reaches (ENOSPC, EIO, a read-only directory, starved wake-ups, pid
//! reuse, suspends, wall-clock steps, lost and duplicated relay frames).
//!
//! * `state`: the machine (files with `flock` semantics, processes,
//!   clocks, faults);
//! * `world`: a window's world on that machine;
//! * `harness`: the NIP's own writer, as Buzz's harness runs it;
//! * `app`: a window's app working its queue through the ledger;
//! * `plan`: the cluster, the timings and the random fault plan;
//! * `check`: the invariants;
//! * `etcd`: the etcd the hosts of a run share, and each host's link;
//! * `cluster`: the driver of one host;
//! * `hosts`: runs across hosts, on a simulated etcd, and
//!   `hosts_outcome` what one found.
//!
//! The `nip-le sim` command runs seeds and prints the replay command of a
//! failing one; `cargo test` runs a seed budget.

mod app;
mod check;
mod cluster;
mod etcd;
mod harness;
mod hosts;
mod hosts_outcome;
mod invariant;
mod plan;
mod rng;
mod state;
mod world;

pub use check::Violation;
pub use cluster::Outcome;
pub use hosts::{run as run_hosts, HostsOptions, HostsOutcome};
pub use invariant::Invariant;
pub use plan::{Fault, Mix, Options};

/// Runs one seed.
pub fn run(seed: u64, options: &Options) -> Outcome {
    run_traced(seed, options, false)
}

/// Runs one seed; `trace` prints every fault and every change on stdout.
pub fn run_traced(seed: u64, options: &Options, trace: bool) -> Outcome {
    cluster::install_panic_counter();
    let mut sim = cluster::Sim::new(seed, options.clone());
    sim.trace = trace;
    sim.run()
}
