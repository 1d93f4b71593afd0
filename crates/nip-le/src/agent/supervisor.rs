//! The supervisor's thread: it feeds the rules ([`AgentMachine`]) with the
//! election's view of the key (at every change of it, and every
//! [`POLL`] at the latest, so it follows the key across a leave and a new
//! join) and the runner's answers, and carries out what the rules decide
//! by calling the runner, one call at a time.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::broadcast;

use super::machine::{Action, AgentMachine, Input, Lead, State};
use super::runner::{AgentExits, AgentRunner, AgentStart, StartError};
use super::{orphan, AgentCommand, AgentEvent, AgentReport, AgentTimings, CommandRunner};
use crate::elector::agent_hold::AgentHold;
use crate::elector::{Elector, LeaderView};
use crate::error::{Error, Result};
use crate::pubkey::AgentPubkey;

/// The longest the supervisor goes without looking at the election (it
/// also looks at every change event of its key).
pub const POLL: Duration = Duration::from_millis(50);

/// What reaches the supervisor's thread.
enum Msg {
    /// The runner's agent with this pid exited by itself.
    Exited(u32),
    /// The election's view of the key may have changed.
    Look,
    /// Stop the agent and the supervisor.
    Stop,
}

/// A leader-gated agent process for one agent key (see [`super`]).
/// Dropping it (or [`AgentSupervisor::stop`]) stops the agent and waits
/// for it.
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
            Msg::Look => "Look",
            Msg::Stop => "Stop",
        })
    }
}

impl AgentSupervisor {
    /// Runs `cmd` for `pubkey` (which `elector` must have joined) while the
    /// elector may act for it, through a [`CommandRunner`].
    pub fn command(elector: &Elector, pubkey: &AgentPubkey, cmd: AgentCommand) -> Result<Self> {
        cmd.validate().map_err(Error::AgentCommand)?;
        let timings = cmd.timings;
        let runner = CommandRunner::new(cmd, elector.config().backend);
        Self::start(elector, pubkey, runner, timings)
    }

    /// Runs `pubkey`'s agent through `runner` while `elector` may act for
    /// the key (which it must have joined), with the restart and busy
    /// backoffs of `timings` (its `grace` is the orphan stop's).
    pub fn start(
        elector: &Elector,
        pubkey: &AgentPubkey,
        runner: impl AgentRunner,
        timings: AgentTimings,
    ) -> Result<Self> {
        timings.validate().map_err(Error::AgentCommand)?;
        // Joined now (an error otherwise); followed across a leave and a
        // new join from then on.
        elector.leader_flag(pubkey)?;
        let (tx, rx) = mpsc::channel();
        let (events, first) = broadcast::channel(256);
        follow_changes(elector, *pubkey, tx.clone());
        let run = Run {
            runner: Box::new(runner),
            timings,
            start: AgentStart {
                pubkey: *pubkey,
                instance_id: elector.instance_id().as_str().to_owned(),
                lock_dir: elector.config().lock_dir.clone(),
                exits: {
                    let tx = tx.clone();
                    AgentExits::new(move |pid| drop(tx.send(Msg::Exited(pid))))
                },
            },
            dir: elector.config().lock_dir.clone(),
            flag: elector.leader_view(pubkey),
            hold: elector.agent_hold(pubkey),
            rx,
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

    /// Reports of what the agent does: the first call's receiver has every
    /// report since the supervisor started (the first `started` included),
    /// later ones those from the moment they subscribe.
    pub fn subscribe(&self) -> broadcast::Receiver<AgentReport> {
        let first = self.first.lock().ok().and_then(|mut f| f.take());
        first.unwrap_or_else(|| self.events.subscribe())
    }

    /// Stops the agent (the runner's stop) and the supervisor.
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

/// Wakes the supervisor at every change event of `pubkey`, from a thread
/// of its own, until the elector or the supervisor is gone.
fn follow_changes(elector: &Elector, pubkey: AgentPubkey, tx: mpsc::Sender<Msg>) {
    let mut changes = elector.subscribe();
    let spawned = std::thread::Builder::new()
        .name("nip-le-agent-changes".into())
        .spawn(move || {
            use tokio::sync::broadcast::error::RecvError;
            loop {
                match changes.blocking_recv() {
                    Ok(c) if c.pubkey != pubkey => continue,
                    Ok(_) | Err(RecvError::Lagged(_)) => {
                        if tx.send(Msg::Look).is_err() {
                            return;
                        }
                    }
                    Err(RecvError::Closed) => return,
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(%pubkey, "the agent follows the election every {POLL:?} only: {e}");
    }
}

/// The supervisor thread's state.
struct Run {
    runner: Box<dyn AgentRunner>,
    timings: AgentTimings,
    start: AgentStart,
    /// Where the agent mark lives (the lock directory).
    dir: PathBuf,
    flag: LeaderView,
    /// Tells the election that our agent runs (see `agent_hold`).
    hold: AgentHold,
    rx: mpsc::Receiver<Msg>,
    events: broadcast::Sender<AgentReport>,
}

impl Run {
    fn lead(&self, stopping: bool) -> Lead {
        if stopping {
            return Lead::default();
        }
        Lead {
            may_act: self.flag.is_leader(),
            host_leader: self.flag.leads_host(),
        }
    }

    fn run(mut self) {
        let mut m = AgentMachine::new(self.timings);
        let mut stopping = false;
        let mut inputs = VecDeque::from([Input::Look]);
        loop {
            while let Some(input) = inputs.pop_front() {
                // Looked up for every input: a start or stop takes a while.
                let lead = self.lead(stopping);
                for action in m.step(input, lead, Instant::now()) {
                    let answer = self.carry_out(action, stopping);
                    inputs.push_back(answer);
                }
            }
            if stopping && matches!(m.state(), State::Idle) {
                return;
            }
            let now = Instant::now();
            let wake = m
                .next_deadline()
                .map_or(POLL, |d| d.saturating_duration_since(now))
                .min(POLL);
            let msg = match self.rx.recv_timeout(wake) {
                Ok(msg) => msg,
                Err(RecvTimeoutError::Timeout) => Msg::Look,
                // Unreachable while we hold `tx`; stop all the same.
                Err(RecvTimeoutError::Disconnected) => Msg::Stop,
            };
            match msg {
                Msg::Stop => {
                    stopping = true;
                    inputs.push_back(Input::Look);
                }
                Msg::Look => inputs.push_back(Input::Look),
                Msg::Exited(pid) => {
                    // Reaped by the stop when we asked for one.
                    if matches!(m.state(), State::Running { pid: p, .. } if p == pid) {
                        let exit = self.runner.exited(pid);
                        self.hold.end();
                        self.report(AgentEvent::Exited {
                            pid,
                            code: exit.code,
                            signal: exit.signal,
                            busy: exit.busy,
                        });
                        inputs.push_back(Input::Exited {
                            pid,
                            busy: exit.busy,
                        });
                    }
                }
            }
        }
    }

    /// Carries `action` out through the runner; its answer, for the rules.
    fn carry_out(&mut self, action: Action, stopping: bool) -> Input {
        match action {
            Action::Start => self.start(stopping),
            Action::Stop(pid) => {
                let outcome = self.runner.stop(pid);
                self.hold.end();
                self.report(AgentEvent::Stopped {
                    pid,
                    killed: outcome.killed,
                });
                Input::Stopped(pid)
            }
            Action::CheckOrphans => {
                self.stop_orphan();
                Input::OrphansChecked
            }
        }
    }

    /// A dead window's agent first, then ours, marked as running before it
    /// starts (so that a step-down waits for it) and only if we still may
    /// act then.
    fn start(&mut self, stopping: bool) -> Input {
        self.stop_orphan();
        let flag = &self.flag;
        if stopping || !self.hold.begin(|| flag.is_leader()) {
            return Input::StartCancelled;
        }
        match self.runner.start(&self.start) {
            Ok(pid) => {
                self.report(AgentEvent::Started { pid });
                Input::Started(pid)
            }
            Err(e) => {
                self.hold.end();
                let busy = matches!(e, StartError::Busy(_));
                if busy {
                    tracing::debug!(pubkey = %self.start.pubkey, "the agent's lease is held elsewhere: {e}");
                } else {
                    tracing::warn!(pubkey = %self.start.pubkey, "cannot start the agent: {e}");
                }
                self.report(AgentEvent::StartFailed {
                    error: e.to_string(),
                    busy,
                });
                Input::StartFailed { busy }
            }
        }
    }

    /// Stops what the agent mark names, if it is a dead window's agent.
    fn stop_orphan(&self) {
        let grace = self.timings.grace;
        if let Some((pid, killed)) = orphan::stop_orphan(&self.dir, &self.start.pubkey, None, grace)
        {
            self.report(AgentEvent::OrphanStopped { pid, killed });
        }
    }

    fn report(&self, event: AgentEvent) {
        let at_ms = crate::elector::writer_unix_ms(SystemTime::now());
        let _ = self.events.send(AgentReport {
            pubkey: self.start.pubkey,
            at_ms,
            event,
        });
    }
}
