//! `nip-le run --agent-cmd`: a command that runs only while this window
//! leads its first key ([`nip_le::agent`]), reported as `agent` lines.

use std::sync::mpsc;
use std::time::Duration;

use clap::Args;
use nip_le::agent::{AgentCommand, AgentSupervisor};
use nip_le::{AgentPubkey, Elector};

use super::msg::Msg;
use crate::lines::Line;

/// The supervised agent's flags.
#[derive(Args, Debug, Default)]
pub struct AgentArgs {
    /// A command line to run only while this window leads the first key,
    /// with BUZZ_INSTANCE_ELECTION_ID set to its instance id. Split as a
    /// POSIX shell would (quotes, backslashes); no shell runs it.
    #[arg(long)]
    pub agent_cmd: Option<String>,
    /// Grace between the agent's SIGTERM and its SIGKILL, in milliseconds
    /// [default: 5000].
    #[arg(long, requires = "agent_cmd")]
    pub agent_grace_ms: Option<u64>,
    /// First restart delay after the agent exits while we lead, in
    /// milliseconds; it doubles up to --agent-backoff-max-ms [default: 250].
    #[arg(long, requires = "agent_cmd")]
    pub agent_backoff_ms: Option<u64>,
    /// Longest restart delay, in milliseconds [default: 10000].
    #[arg(long, requires = "agent_cmd")]
    pub agent_backoff_max_ms: Option<u64>,
    /// The exit code with which the agent says its instance lease is held
    /// elsewhere (the predecessor's agent is still stopping): such an exit
    /// is retried within 25 to 100 ms, not backed off [default: none].
    #[arg(long, requires = "agent_cmd")]
    pub agent_busy_exit_code: Option<i32>,
}

impl AgentArgs {
    /// The validated command, when `--agent-cmd` was given.
    pub fn command(&self) -> Result<Option<AgentCommand>, nip_le::Error> {
        let Some(line) = &self.agent_cmd else {
            return Ok(None);
        };
        let words = shell_words::split(line)
            .map_err(|e| nip_le::Error::AgentCommand(format!("{line:?}: {e}")))?;
        let Some((program, args)) = words.split_first() else {
            return Err(nip_le::Error::AgentCommand("empty --agent-cmd".into()));
        };
        let mut c = AgentCommand::new(program, args);
        let ms = Duration::from_millis;
        if let Some(v) = self.agent_grace_ms {
            c.timings.grace = ms(v);
        }
        if let Some(v) = self.agent_backoff_ms {
            c.timings.backoff_min = ms(v);
        }
        if let Some(v) = self.agent_backoff_max_ms {
            c.timings.backoff_max = ms(v);
        }
        c.busy_exit_code = self.agent_busy_exit_code;
        c.validate().map_err(nip_le::Error::AgentCommand)?;
        Ok(Some(c))
    }
}

/// The supervised agent and the thread that forwards its reports.
pub(super) struct Supervised {
    sup: AgentSupervisor,
    forwarder: std::thread::JoinHandle<()>,
}

impl Supervised {
    /// Stops the agent, then waits until its last report (`stopped`) is
    /// with the main loop.
    pub(super) fn stop(self) {
        self.sup.stop();
        let _ = self.forwarder.join();
    }
}

/// Starts the supervisor and forwards its reports to the main loop.
pub(super) fn supervise(
    elector: &Elector,
    pubkey: &AgentPubkey,
    cmd: AgentCommand,
    tx: mpsc::Sender<Msg>,
) -> Result<Supervised, nip_le::Error> {
    let sup = AgentSupervisor::command(elector, pubkey, cmd)?;
    let mut reports = sup.subscribe();
    let forwarder = std::thread::spawn(move || {
        use tokio::sync::broadcast::error::RecvError;
        loop {
            match reports.blocking_recv() {
                Ok(r) => {
                    let line = Line::Agent {
                        pubkey: r.pubkey.to_string(),
                        at_ms: r.at_ms,
                        agent: r.event,
                    };
                    if tx.send(Msg::Report(line)).is_err() {
                        return;
                    }
                }
                Err(RecvError::Lagged(_)) => {}
                // The supervisor stopped.
                Err(RecvError::Closed) => return,
            }
        }
    });
    Ok(Supervised { sup, forwarder })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_lines_are_split_and_validated() {
        let a = AgentArgs {
            agent_cmd: Some(r#"buzz-acp --relay "wss://r.example/a b" x\ y"#.into()),
            agent_grace_ms: Some(100),
            ..AgentArgs::default()
        };
        let c = a.command().unwrap().unwrap();
        assert_eq!(c.program, "buzz-acp");
        assert_eq!(c.args, ["--relay", "wss://r.example/a b", "x y"]);
        assert_eq!(c.timings.grace, Duration::from_millis(100));
        for bad in ["", "   ", "a 'unclosed"] {
            let a = AgentArgs {
                agent_cmd: Some(bad.into()),
                ..AgentArgs::default()
            };
            assert!(a.command().is_err(), "{bad:?}");
        }
        let a = AgentArgs {
            agent_cmd: Some("x".into()),
            agent_backoff_ms: Some(0),
            ..AgentArgs::default()
        };
        assert!(a.command().is_err());
    }
}
