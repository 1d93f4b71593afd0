//! `nip-le-lab`: the user's commands of `nip-le` (so that the lab's
//! instances and the tests run one binary), and the lab's own: the
//! benchmark, chaos and the harness stand-in.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use nip_le_cli::commands::{self, UserCommand};
use nip_le_lab as lab;

/// The lab of NIP-LE leader election.
#[derive(Parser)]
#[command(name = "nip-le-lab", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    #[command(flatten)]
    User(UserCommand),
    /// Measure failover, handoff, claim and more in spec and extended mode,
    /// side by side, and print a table.
    Bench(lab::bench::BenchArgs),
    /// Random SIGKILL/SIGTERM/SIGSTOP, restarts and claims against a mixed
    /// cluster with a mention feed; fails on split-brain the NIP does not force.
    #[cfg(unix)]
    Chaos(lab::chaos::ChaosArgs),
    /// Stand in for upstream's agent harness (its instance lease, and a
    /// reply to every mention while it runs), for `run --agent-cmd` tests.
    StandInAgent(lab::stand_in::StandInArgs),
    /// A worker of the stand-in agent: waits until it is signalled.
    #[command(hide = true)]
    StandInWorker(lab::stand_in::WorkerArgs),
    /// For the bench's floor: holds an exclusive lock on a file until killed.
    #[command(hide = true)]
    HoldLock(lab::bench::HoldLockArgs),
}

fn main() -> ExitCode {
    commands::init_logging();
    let result = match Cli::parse().command {
        Command::User(c) => commands::run(c),
        Command::Bench(a) => lab::bench::bench(a),
        #[cfg(unix)]
        Command::Chaos(a) => lab::chaos::chaos(a),
        Command::StandInAgent(a) => lab::stand_in::stand_in(a),
        Command::StandInWorker(a) => Ok(lab::stand_in::worker(a)),
        Command::HoldLock(a) => Ok(lab::bench::hold_lock(a)),
    };
    commands::exit_code(result)
}
