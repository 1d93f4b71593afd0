//! `nip-le`: run an instance of the election, inspect a lock directory,
//! narrate a demo, or replay the simulator's seeds. The interface is fixed;
//! outside tools drive it. (The lab's benchmark, chaos and stand-ins are
//! `nip-le-lab`, in `crates/nip-le-lab`.)

use std::process::ExitCode;

use clap::Parser;
use nip_le_cli::commands::{self, UserCommand};

/// NIP-LE leader election for agents shared by several app instances.
#[derive(Parser)]
#[command(name = "nip-le", version, about)]
struct Cli {
    #[command(subcommand)]
    command: UserCommand,
}

fn main() -> ExitCode {
    commands::init_logging();
    commands::exit_code(commands::run(Cli::parse().command))
}
