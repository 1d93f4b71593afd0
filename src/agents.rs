//! Supervised agent processes ([`nip_le::agent`]): at most one per agent
//! key, each run only while this window may act for its agent, their
//! reports merged into one stream (emitted to webviews as
//! [`crate::AGENT_EVENT`]). Only the app's Rust side starts them: no
//! webview command can make the app run a program.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use nip_le::agent::{AgentEvent, AgentReport, AgentRunner, AgentSupervisor, AgentTimings};
use nip_le::{AgentPubkey, Elector};
use tokio::sync::broadcast;

use crate::error::Result;
use crate::models::SupervisedAgent;

/// The supervisors of one window.
#[derive(Debug)]
pub(crate) struct Agents {
    running: Mutex<Running>,
    reports: broadcast::Sender<AgentReport>,
    /// Each supervised agent's last report, for the status: its own lock,
    /// never held across a stop (which waits for a process), so reading
    /// the status never waits.
    last: Arc<Mutex<BTreeMap<AgentPubkey, Option<AgentReport>>>>,
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
            last: Arc::default(),
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
        lock(&self.last).insert(pubkey, None);
        let (mut rx, tx) = (sup.subscribe(), self.reports.clone());
        let last = Arc::clone(&self.last);
        let forwarder = std::thread::Builder::new()
            .name("leader-election-agent-reports".into())
            .spawn(move || {
                use tokio::sync::broadcast::error::RecvError;
                loop {
                    match rx.blocking_recv() {
                        Ok(r) => {
                            if let Some(slot) = lock(&last).get_mut(&r.pubkey) {
                                *slot = Some(r.clone());
                            }
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
        lock(&self.last).remove(pubkey);
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
        lock(&self.last).clear();
        for s in &all {
            s.request_stop();
        }
        for s in all {
            s.stop();
        }
    }

    /// Every supervised agent, ordered by pubkey, with its pid while it
    /// runs and its last report.
    pub(crate) fn status(&self) -> Vec<SupervisedAgent> {
        lock(&self.last)
            .iter()
            .map(|(pubkey, last)| SupervisedAgent {
                pubkey: pubkey.as_str().to_owned(),
                pid: match last.as_ref().map(|r| &r.event) {
                    Some(AgentEvent::Started { pid }) => Some(*pid),
                    _ => None,
                },
                last: last.clone(),
            })
            .collect()
    }

    /// Every agent's reports from now on.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<AgentReport> {
        self.reports.subscribe()
    }
}

/// A poisoned lock still holds a usable map (every update is one insert).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
