//! The engine's own [`AgentRunner`]: a plain command line, for apps whose
//! agent is one program (and for `nip-le run --agent-cmd`). Apps with a
//! process manager of their own (Buzz's desktop) implement the seam
//! themselves.
//!
//! * started held back, named in the agent mark, then let run (see
//!   `process`), with `BUZZ_INSTANCE_ELECTION_ID` set to the window's instance id;
//! * in a session and process group of its own (Unix) or a Job Object
//!   (Windows); on Linux's native backend the kernel kills it with its
//!   window (`PR_SET_PDEATHSIG`), on Windows its job does;
//! * stopped with SIGTERM to its group, SIGKILL after the grace (Windows:
//!   its job is ended at once), and what it left in its group or session
//!   is killed when it is reaped.

use std::collections::HashMap;
use std::sync::mpsc;

use super::agent_command::AgentCommand;
use super::process::{self, Agent};
use super::runner::{AgentExit, AgentRunner, AgentStart, StartError, StopOutcome};

/// Runs an [`AgentCommand`].
#[derive(Debug)]
pub struct CommandRunner {
    cmd: AgentCommand,
    /// Linux's native backend: the kernel kills the agent with us.
    dies_with_us: bool,
    running: HashMap<u32, Running>,
}

/// One agent this runner started.
struct Running {
    agent: Agent,
    /// Told once the process has exited (not reaped).
    gone: mpsc::Receiver<()>,
    instance_id: String,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("pid", &self.agent.pid())
            .finish()
    }
}

impl CommandRunner {
    /// Runs `cmd` for an elector of `backend`: on Linux's native backend
    /// the kernel kills the agent with its app (the portable backend runs
    /// what macOS and Windows run, where a successor stops it).
    pub fn new(cmd: AgentCommand, backend: crate::Backend) -> Self {
        Self {
            cmd,
            dies_with_us: backend.linux_fast_paths(),
            running: HashMap::new(),
        }
    }
}

impl AgentRunner for CommandRunner {
    fn start(&mut self, start: &AgentStart) -> Result<u32, StartError> {
        let (tx, gone) = mpsc::channel();
        let exits = start.exits();
        let mut agent = Agent::spawn(
            &self.cmd,
            start.instance_id(),
            self.dies_with_us,
            move |pid| {
                let _ = tx.send(());
                exits.exited(pid);
            },
        )
        .map_err(|e| StartError::Failed(format!("cannot start the agent: {e}")))?;
        let pid = agent.pid();
        // Named before it can act; then let run.
        start.started(pid);
        if let Err(e) = agent.release() {
            agent.kill();
            let _ = gone.recv();
            let _ = agent.reap(start.instance_id());
            return Err(StartError::Failed(format!("cannot start the agent: {e}")));
        }
        self.running.insert(
            pid,
            Running {
                agent,
                gone,
                instance_id: start.instance_id().to_owned(),
            },
        );
        Ok(pid)
    }

    fn stop(&mut self, pid: u32) -> StopOutcome {
        let Some(mut r) = self.running.remove(&pid) else {
            return StopOutcome::default();
        };
        r.agent.terminate();
        let killed = r.gone.recv_timeout(self.cmd.timings.grace).is_err();
        if killed {
            tracing::warn!(pid, "the agent outlived its grace: killed");
            r.agent.kill();
            let _ = r.gone.recv();
        }
        let _ = r.agent.reap(&r.instance_id);
        StopOutcome { killed }
    }

    fn exited(&mut self, pid: u32) -> AgentExit {
        let Some(r) = self.running.remove(&pid) else {
            return AgentExit::default();
        };
        match r.agent.reap(&r.instance_id) {
            Ok(status) => {
                let (code, signal) = process::ended(&status);
                AgentExit {
                    code,
                    signal,
                    busy: code.is_some() && code == self.cmd.busy_exit_code,
                }
            }
            Err(_) => AgentExit::default(),
        }
    }
}

impl Drop for CommandRunner {
    /// Nothing this runner started outlives it.
    fn drop(&mut self) {
        let pids: Vec<u32> = self.running.keys().copied().collect();
        for pid in pids {
            self.stop(pid);
        }
    }
}
