//! The `nip-le` command, as a library so that the lab and the tests drive
//! the same code:
//! * [`lines`]: the JSON lines `nip-le run` prints, shared by writer and
//!   readers;
//! * [`cli`]: `run` (one instance of an election) and `status` (a lock
//!   directory, classified);
//! * [`drive`]: driving real processes (the cluster driver, the feed
//!   follower, `demo`) and the simulator's seeds (`sim`);
//! * [`commands`]: the user's commands, parsed and dispatched once for
//!   `nip-le` and the lab's binary.
//!
//! None of this is linked by apps: the engine is the `nip-le` crate.

pub mod cli;
pub mod commands;
pub mod drive;
pub mod lines;

/// Wall-clock unix milliseconds, the unit of every `at_ms`.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}
