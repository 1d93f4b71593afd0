//! Supervised agent processes ([`nip_le::agent`]): at most one per agent
//! key, each run only while this window may act for its agent, their
//! reports merged into one stream (emitted to webviews as
//! [`crate::AGENT_EVENT`]). Only the app's Rust side starts them: no
//! webview command can make the app run a program.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use nip_le::agent::{AgentCommand, AgentReport, AgentSupervisor};
use nip_le::{AgentPubkey, Elector};
use tokio::sync::broadcast;

use crate::error::Result;

/// The supervisors of one window.
#[derive(Debug)]
pub(crate) struct Agents {
    running: Mutex<HashMap<AgentPubkey, AgentSupervisor>>,
    reports: broadcast::Sender<AgentReport>,
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
    /// Supervises `cmd` for `pubkey` (joined), replacing (and first
    /// stopping) an earlier command of that agent.
    pub(crate) fn supervise(
        &self,
        elector: &Elector,
        pubkey: AgentPubkey,
        cmd: AgentCommand,
    ) -> Result<()> {
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(old) = running.remove(&pubkey) {
            old.stop();
        }
        let sup = AgentSupervisor::start(elector, &pubkey, cmd)?;
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
        running.insert(pubkey, sup);
        Ok(())
    }

    /// Stops `pubkey`'s agent (SIGTERM, its grace, SIGKILL); whether one
    /// was supervised.
    pub(crate) fn stop(&self, pubkey: &AgentPubkey) -> bool {
        let sup = self
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(pubkey);
        sup.map(AgentSupervisor::stop).is_some()
    }

    /// Stops every agent.
    pub(crate) fn stop_all(&self) {
        let all: Vec<_> = self
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain()
            .map(|(_, s)| s)
            .collect();
        for s in all {
            s.stop();
        }
    }

    /// Every agent's reports from now on.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<AgentReport> {
        self.reports.subscribe()
    }
}
