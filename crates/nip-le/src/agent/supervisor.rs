//! The supervisor's thread: it feeds the rules ([`AgentMachine`]) with the
//! leadership (looked up at every wake-up and every `poll`, so it follows
//! the key across a leave and a new join) and the child's exits, and
//! carries out what they decide.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::{Instant, SystemTime};

use tokio::sync::broadcast;

use super::machine::{Action, AgentMachine, Input, State};
use super::orphan;
use super::process::{self, Agent};
use super::{AgentCommand, AgentEvent, AgentReport};
use crate::elector::{Elector, LeaderView};
use crate::error::{Error, Result};
use crate::pubkey::AgentPubkey;

enum Msg {
    Exited(u32),
    Stop,
}

/// A leader-gated agent process for one agent key (see [`super`]).
/// Dropping it (or [`AgentSupervisor::stop`]) stops the child and waits
/// for it: the grace and a poll, plus the grace and a second while a dead
/// window's agent is being stopped, and for as long as a SIGKILLed child
/// takes to exit.
#[derive(Debug)]
pub struct AgentSupervisor {
    tx: mpsc::Sender<Msg>,
    thread: Option<JoinHandle<()>>,
    events: broadcast::Sender<AgentReport>,
    /// Subscribed before the thread started: the first `subscribe` gets it.
    first: Mutex<Option<broadcast::Receiver<AgentReport>>>,
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Msg::Exited(_) => "Exited",
            Msg::Stop => "Stop",
        })
    }
}

impl AgentSupervisor {
    /// Supervises `cmd` for `pubkey`, which `elector` must have joined: the
    /// command runs while the elector may act for the key.
    pub fn start(elector: &Elector, pubkey: &AgentPubkey, cmd: AgentCommand) -> Result<Self> {
        cmd.validate().map_err(Error::AgentCommand)?;
        // Joined now (an error otherwise); followed across a leave and a
        // new join from then on.
        elector.leader_flag(pubkey)?;
        let flag = elector.leader_view(pubkey);
        let id = elector.instance_id().as_str().to_owned();
        let config = elector.config();
        let (tx, rx) = mpsc::channel();
        let (events, first) = broadcast::channel(256);
        let run = Run {
            cmd,
            id,
            pubkey: *pubkey,
            dir: config.lock_dir.clone(),
            dies_with_us: config.backend.linux_fast_paths(),
            flag,
            rx,
            tx: tx.clone(),
            events: events.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("nip-le-agent".into())
            .spawn(move || run.run())
            .map_err(|e| Error::io("<agent supervisor thread>", e))?;
        Ok(Self {
            tx,
            thread: Some(thread),
            events,
            first: Mutex::new(Some(first)),
        })
    }

    /// Reports of what the agent process does: the first call's receiver
    /// has every report since [`AgentSupervisor::start`] (the first
    /// `started` included), later ones those from the moment they
    /// subscribe.
    pub fn subscribe(&self) -> broadcast::Receiver<AgentReport> {
        let first = self.first.lock().ok().and_then(|mut f| f.take());
        first.unwrap_or_else(|| self.events.subscribe())
    }

    /// Stops the child (SIGTERM, the grace, SIGKILL) and the supervisor.
    pub fn stop(mut self) {
        self.shut();
    }

    /// Asks the supervisor to stop without waiting: stop several at once,
    /// then drop (or [`AgentSupervisor::stop`]) each to wait.
    pub fn request_stop(&self) {
        let _ = self.tx.send(Msg::Stop);
    }

    fn shut(&mut self) {
        let _ = self.tx.send(Msg::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for AgentSupervisor {
    fn drop(&mut self) {
        self.shut();
    }
}

/// The supervisor thread's state.
struct Run {
    cmd: AgentCommand,
    id: String,
    pubkey: AgentPubkey,
    /// Where the agent mark lives (the lock directory).
    dir: PathBuf,
    /// Linux's native backend: the kernel kills the child with us.
    dies_with_us: bool,
    flag: LeaderView,
    rx: mpsc::Receiver<Msg>,
    tx: mpsc::Sender<Msg>,
    events: broadcast::Sender<AgentReport>,
}

impl Run {
    fn run(self) {
        let mut m = AgentMachine::new(self.cmd.timings);
        let mut agent: Option<Agent> = None;
        let mut stopping = false;
        let mut inputs = VecDeque::from([Input::Look]);
        loop {
            let may_act = !stopping && self.flag.is_leader();
            while let Some(input) = inputs.pop_front() {
                for action in m.step(input, may_act, Instant::now()) {
                    self.carry_out(action, &mut agent, &mut inputs, stopping);
                }
            }
            if stopping && matches!(m.state(), State::Idle) {
                return;
            }
            let now = Instant::now();
            let wake = m
                .next_deadline()
                .map_or(self.cmd.poll, |d| d.saturating_duration_since(now))
                .min(self.cmd.poll);
            let msg = match self.rx.recv_timeout(wake) {
                Ok(msg) => msg,
                Err(RecvTimeoutError::Timeout) => {
                    inputs.push_back(Input::Look);
                    continue;
                }
                // Unreachable while we hold `tx`; stop all the same.
                Err(RecvTimeoutError::Disconnected) => Msg::Stop,
            };
            match msg {
                Msg::Stop => {
                    stopping = true;
                    inputs.push_back(Input::Look);
                }
                Msg::Exited(pid) => {
                    let by_us = matches!(m.state(), State::Stopping { pid: p, .. } if p == pid);
                    let killed = m.killed();
                    if let Some(a) = agent.take_if(|a| a.pid() == pid) {
                        let status = a.reap();
                        let event = match (by_us, status) {
                            (true, _) => AgentEvent::Stopped { pid, killed },
                            (false, Ok(s)) => {
                                let (code, signal) = process::ended(&s);
                                AgentEvent::Exited { pid, code, signal }
                            }
                            (false, Err(_)) => AgentEvent::Exited {
                                pid,
                                code: None,
                                signal: None,
                            },
                        };
                        self.report(event);
                    }
                    inputs.push_back(Input::Exited(pid));
                }
            }
        }
    }

    fn carry_out(
        &self,
        action: Action,
        agent: &mut Option<Agent>,
        inputs: &mut VecDeque<Input>,
        stopping: bool,
    ) {
        match action {
            Action::Spawn => {
                // A dead window's agent first (we have no child now).
                let grace = self.cmd.timings.grace;
                if let Some((pid, killed)) =
                    orphan::stop_orphan(&self.dir, &self.pubkey, None, grace)
                {
                    self.report(AgentEvent::OrphanStopped { pid, killed });
                    // That took a while: we may no longer act.
                    if stopping || !self.flag.is_leader() {
                        inputs.push_back(Input::SpawnCancelled);
                        return;
                    }
                }
                let tx = self.tx.clone();
                let spawned = Agent::spawn(&self.cmd, &self.id, self.dies_with_us, move |pid| {
                    let _ = tx.send(Msg::Exited(pid));
                });
                match spawned {
                    Ok(a) => {
                        let pid = a.pid();
                        self.mark(pid);
                        *agent = Some(a);
                        self.report(AgentEvent::Started { pid });
                        inputs.push_back(Input::Spawned(pid));
                    }
                    Err(e) => {
                        tracing::warn!(pubkey = %self.pubkey, "cannot start the agent: {e}");
                        self.report(AgentEvent::SpawnFailed {
                            error: e.to_string(),
                        });
                        inputs.push_back(Input::SpawnFailed);
                    }
                }
            }
            Action::Terminate(pid) => {
                if let Some(a) = agent.as_mut().filter(|a| a.pid() == pid) {
                    a.terminate();
                }
            }
            Action::Kill(pid) => {
                if let Some(a) = agent.as_mut().filter(|a| a.pid() == pid) {
                    tracing::warn!(pubkey = %self.pubkey, pid, "the agent outlived its grace: killed");
                    a.kill();
                }
            }
        }
    }

    /// Names our new child in the agent mark, for a successor.
    fn mark(&self, pid: u32) {
        let Some(start) = orphan::start_time(pid) else {
            return; // gone already: its exit is on the way
        };
        let mark = orphan::AgentMark {
            instance_id: self.id.clone(),
            pid,
            start,
            boot: crate::host::here().boot.clone(),
        };
        if let Err(e) = orphan::write_mark(&self.dir, &self.pubkey, &mark) {
            tracing::warn!(pubkey = %self.pubkey, "cannot write the agent mark: {e}");
        }
    }

    fn report(&self, event: AgentEvent) {
        let at_ms = crate::elector::writer_unix_ms(SystemTime::now());
        let _ = self.events.send(AgentReport {
            pubkey: self.pubkey,
            at_ms,
            event,
        });
    }
}
