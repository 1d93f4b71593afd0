//! `nip-le`: run an instance of the election, inspect a lock directory, or
//! run the lab (a narrated demo, the benchmark, chaos). The interface is
//! fixed; outside tools drive it.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use nip_le_cli::{cli, lab};

/// NIP-LE leader election for agents shared by several app instances.
#[derive(Parser)]
#[command(name = "nip-le", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Join one election and report leadership as JSON lines on stdout.
    Run(Box<cli::run::RunArgs>),
    /// List every lock file in a directory with its holder and state.
    Status(cli::status::StatusArgs),
    /// Spawn several instances in a temporary directory and narrate an
    /// election: failover, cooperative claim, graceful exit.
    Demo(lab::demo::DemoArgs),
    /// Measure failover, handoff, claim and more in spec and extended mode,
    /// side by side, and print a table.
    Bench(lab::bench::BenchArgs),
    /// Random SIGKILL/SIGTERM/SIGSTOP, restarts and claims against a mixed
    /// cluster with a mention feed; fails on split-brain the NIP does not force.
    #[cfg(unix)]
    Chaos(lab::chaos::ChaosArgs),
    /// Run seeds of the deterministic simulator: the real writers of
    /// several windows, harness peers and their apps on a simulated machine
    /// in virtual time, with faults; exit 1 on any violation.
    Sim(lab::sim::SimArgs),
    /// Stand in for upstream's agent harness (its instance lease, and a
    /// reply to every mention while it runs), for `run --agent-cmd` tests.
    StandInAgent(lab::stand_in::StandInArgs),
    /// A worker of the stand-in agent: waits until it is signalled.
    #[command(hide = true)]
    StandInWorker(lab::stand_in::WorkerArgs),
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("NIP_LE_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let command = Cli::parse().command;
    if matches!(command, Command::Status(_) | Command::Sim(_)) {
        quiet_on_a_closed_pipe();
    }
    let result = match command {
        Command::Run(a) => cli::run::run(*a),
        Command::Status(a) => cli::status::status(a),
        Command::Demo(a) => lab::demo::demo(a),
        Command::Bench(a) => lab::bench::bench(a),
        #[cfg(unix)]
        Command::Chaos(a) => lab::chaos::chaos(a),
        Command::Sim(a) => lab::sim::sim(a),
        Command::StandInAgent(a) => lab::stand_in::stand_in(a),
        Command::StandInWorker(a) => Ok(lab::stand_in::worker(a)),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("nip-le: {e}");
            ExitCode::from(2)
        }
    }
}

/// A report piped into `head` (or any reader that stops early) ends the
/// process quietly, as other Unix tools do, instead of a panic on the
/// closed pipe. Only for the commands that print a report: `run` owns a
/// lock and releases it on the way out, whatever its reader does.
fn quiet_on_a_closed_pipe() {
    #[cfg(unix)]
    // SAFETY: restoring the default action of one signal, before any
    // thread is started.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
