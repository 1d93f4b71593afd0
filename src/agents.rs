//! Supervised agent processes ([`nip_le::agent`]): at most one per agent
//! key, each run only while this window may act for its agent, their
//! reports merged into one stream (emitted to webviews as
//! [`crate::AGENT_EVENT`]). Only the app's Rust side starts them: no
//! webview command can make the app run a program.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use nip_le::agent::{AgentReport, AgentRunner, AgentSupervisor, AgentTimings};
use nip_le::{AgentPubkey, Elector};
use tokio::sync::broadcast;

use crate::error::Result;

/// The supervisors of one window.
#[derive(Debug)]
pub(crate) struct Agents {
    running: Mutex<Running>,
    reports: broadcast::Sender<AgentReport>,
}

/// The supervisors, and whether the window is shutting down (then no new
/// one starts).
#[derive(Debug, Default)]
struct Running {
    by_key: HashMap<AgentPubkey, AgentSupervisor>,
    closed: bool,
}

impl Default for Agents {
    fn default() -> Self {
        Self {
            running: Mutex::default(),
            reports: broadcast::channel(256).0,
        }
    }
}

impl Agents {
    /// Runs `pubkey`'s (joined) agent through `runner`, replacing (and
    /// first stopping) an earlier runner of that agent.
    pub(crate) fn supervise(
        &self,
        elector: &Elector,
        pubkey: AgentPubkey,
        runner: impl AgentRunner,
        timings: AgentTimings,
    ) -> Result<()> {
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        if running.closed {
            return Err(nip_le::Error::ShutDown.into());
        }
        if let Some(old) = running.by_key.remove(&pubkey) {
            old.stop();
        }
        let sup = AgentSupervisor::start(elector, &pubkey, runner, timings)?;
        let (mut rx, tx) = (sup.subscribe(), self.reports.clone());
        let forwarder = std::thread::Builder::new()
            .name("leader-election-agent-reports".into())
            .spawn(move || {
                use tokio::sync::broadcast::error::RecvError;
                loop {
                    match rx.blocking_recv() {
                        Ok(r) => {
                            let _ = tx.send(r);
                        }
                        Err(RecvError::Lagged(_)) => {}
                        // That supervisor stopped.
                        Err(RecvError::Closed) => return,
                    }
                }
            });
        if let Err(e) = forwarder {
            tracing::warn!("agent reports will not be forwarded: {e}");
        }
        running.by_key.insert(pubkey, sup);
        Ok(())
    }

    /// Stops `pubkey`'s agent (SIGTERM, its grace, SIGKILL); whether one
    /// was supervised.
    pub(crate) fn stop(&self, pubkey: &AgentPubkey) -> bool {
        let sup = self
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .by_key
            .remove(pubkey);
        sup.map(AgentSupervisor::stop).is_some()
    }

    /// Stops every agent, all at once (one grace in all, not one each),
    /// and lets no new one start.
    pub(crate) fn stop_all(&self) {
        let all: Vec<_> = {
            let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
            running.closed = true;
            running.by_key.drain().map(|(_, s)| s).collect()
        };
        for s in &all {
            s.request_stop();
        }
        for s in all {
            s.stop();
        }
    }

    /// Every agent's reports from now on.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<AgentReport> {
        self.reports.subscribe()
    }
}
