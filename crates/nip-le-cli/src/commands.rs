//! The user's commands, shared by the `nip-le` binary and the lab's
//! (which adds its own): one parser, one dispatch, one way to fail.

use std::process::ExitCode;

use clap::Subcommand;

use crate::{cli, drive};

/// What `nip-le` does.
#[derive(Subcommand)]
pub enum UserCommand {
    /// Join one election and report leadership as JSON lines on stdout.
    Run(Box<cli::run::RunArgs>),
    /// List every lock file in a directory with its holder and state.
    Status(cli::status::StatusArgs),
    /// Spawn several instances in a temporary directory and narrate an
    /// election: failover, cooperative claim, graceful exit.
    Demo(drive::demo::DemoArgs),
    /// Run seeds of the deterministic simulator: the real writers of
    /// several windows, harness peers and their apps on a simulated machine
    /// in virtual time, with faults; exit 1 on any violation.
    Sim(drive::sim::SimArgs),
}

/// Logs to stderr, filtered by `NIP_LE_LOG` (`warn` by default).
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("NIP_LE_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
}

/// Runs one of the user's commands.
pub fn run(command: UserCommand) -> Result<ExitCode, nip_le::Error> {
    if matches!(command, UserCommand::Status(_) | UserCommand::Sim(_)) {
        quiet_on_a_closed_pipe();
    }
    match command {
        UserCommand::Run(a) => cli::run::run(*a),
        UserCommand::Status(a) => cli::status::status(a),
        UserCommand::Demo(a) => drive::demo::demo(a),
        UserCommand::Sim(a) => drive::sim::sim(a),
    }
}

/// The exit code of a command's result: its own, or 2 with the error on
/// stderr.
pub fn exit_code(result: Result<ExitCode, nip_le::Error>) -> ExitCode {
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
