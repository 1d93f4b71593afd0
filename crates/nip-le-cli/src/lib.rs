//! The `nip-le` command and its lab, as a library so that the tests drive
//! the same code:
//! * [`lines`]: the JSON lines `nip-le run` prints, shared by writer and
//!   readers;
//! * [`cli`]: `run` (one instance of an election) and `status` (a lock
//!   directory, classified);
//! * [`lab`]: driving real processes: the cluster driver, the feed follower,
//!   and `demo`, `bench` and `chaos`.
//!
//! None of this is linked by apps: the engine is the `nip-le` crate.

pub mod cli;
pub mod lab;
pub mod lines;

/// Wall-clock unix milliseconds, the unit of every `at_ms`.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}
