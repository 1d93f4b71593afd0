//! The handle an app uses (through [`crate::LeaderElectionExt`]) and the
//! commands use: the engine's elector, with string pubkeys validated at the
//! boundary.

use std::collections::BTreeSet;
use std::sync::{Arc, PoisonError, RwLock};

use nip_le::agent::{AgentRunner, AgentTimings, CommandRunner};
use nip_le::{AgentPubkey, Elector, LeaderFlag, LeadershipChange};
use tokio::sync::broadcast;

use crate::error::Result;
use crate::models::Status;
use crate::{ClaimOutcome, ControlResult, QueuedEvent, TakeOutcome, Work};

/// This window's participation in the elections of its agents. Cheap to
/// clone; all clones share one engine.
///
/// Reads (`is_leader`, `gate`, `status`, `instance_id`) never wait and never
/// touch a file: call them anywhere, the main thread included. Calls that
/// change something (`join`, `leave`, `claim`, `release`,
/// `handle_control_frame`, `refresh`) wait for the engine's writer thread,
/// which does the file I/O (each operation bounded by the lock wait): call
/// them off the main thread, as the plugin's commands do.
#[derive(Clone, Debug)]
pub struct LeaderElection {
    /// Supervised agent processes (see [`crate::agents`]). First: dropped
    /// (and so stopped) before the elector releases the locks.
    agents: Arc<crate::agents::Agents>,
    elector: Arc<Elector>,
    /// The agents the builder named, joined at setup.
    launch_agents: Arc<[AgentPubkey]>,
    /// The agents webviews may act on: the launch agents, the builder's
    /// allow-list, every agent the app joined from Rust, and those it
    /// allowed at runtime. Everything else is denied to them.
    webview_agents: Arc<RwLock<BTreeSet<AgentPubkey>>>,
    /// The takes of each webview's page (see [`crate::turns`]).
    turns: Arc<crate::turns::Turns>,
}

fn key(pubkey: &str) -> Result<AgentPubkey> {
    Ok(AgentPubkey::parse(pubkey).map_err(nip_le::Error::from)?)
}

impl LeaderElection {
    pub(crate) fn new(
        elector: Elector,
        launch_agents: Vec<AgentPubkey>,
        allowed: Vec<AgentPubkey>,
    ) -> Self {
        let webview_agents = launch_agents.iter().cloned().chain(allowed).collect();
        Self {
            elector: Arc::new(elector),
            launch_agents: launch_agents.into(),
            webview_agents: Arc::new(RwLock::new(webview_agents)),
            turns: Arc::default(),
            agents: Arc::default(),
        }
    }

    /// Whether a webview may act on `pubkey` (join, leave, claim, release,
    /// control frames, the work ledger): only on the agents the app allows
    /// (the launch agents, [`crate::Builder::allow_agents`], the agents it
    /// joined from Rust and [`LeaderElection::allow_agent`]). The app's own
    /// Rust code is not restricted.
    pub fn check_webview_may_act(&self, pubkey: &str) -> Result<()> {
        let k = key(pubkey)?;
        let allowed = self
            .webview_agents
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        if allowed.contains(&k) {
            Ok(())
        } else {
            Err(crate::Error::NotAllowed(k))
        }
    }

    /// Lets the webviews act on `pubkey` from now on: join, leave, claim
    /// and release it, hand its control frames over and use its work
    /// ledger. For an agent the app learns after launch (after login);
    /// [`LeaderElection::join`] from Rust allows its agent too. Idempotent;
    /// fails only for an invalid pubkey.
    pub fn allow_agent(&self, pubkey: &str) -> Result<()> {
        self.allow(key(pubkey)?);
        Ok(())
    }

    fn allow(&self, k: AgentPubkey) {
        self.webview_agents
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(k);
    }

    /// The webviews may no longer act on `pubkey` (every command naming it
    /// fails with `not_allowed`), a launch agent included. The window stays
    /// in its election: [`LeaderElection::leave`] ends that. Returns whether
    /// the agent was allowed.
    pub fn disallow_agent(&self, pubkey: &str) -> Result<bool> {
        let k = key(pubkey)?;
        Ok(self
            .webview_agents
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&k))
    }

    /// Joins the builder's agents, in one message to the engine.
    pub(crate) fn join_launch_agents(&self) -> Result<()> {
        self.elector.join_all(&self.launch_agents)?;
        Ok(())
    }

    /// This window's instance id. Pass it to agent processes you spawn in
    /// `BUZZ_INSTANCE_ELECTION_ID` ([`crate::ELECTION_ID_ENV`]) so they act
    /// as this window.
    pub fn instance_id(&self) -> &str {
        self.elector.instance_id().as_str()
    }

    /// Whether this window is the prompter for `pubkey` (cached: no I/O, no
    /// wait). `false` for an agent it has not joined, as a [`LeaderFlag`]
    /// and the TypeScript `LeaderGate` answer; errors only for an invalid
    /// key.
    pub fn is_leader(&self, pubkey: &str) -> Result<bool> {
        Ok(self.elector.is_leader(&key(pubkey)?))
    }

    /// A handle whose `is_leader()` is an atomic load or two, for the
    /// dispatch, 👀 and heartbeat paths (NIP-LE (a)–(c)).
    pub fn gate(&self, pubkey: &str) -> Result<LeaderFlag> {
        Ok(self.elector.leader_flag(&key(pubkey)?)?)
    }

    /// Joins an agent's election and claims at once, and lets the webviews
    /// act on it (see [`LeaderElection::allow_agent`]). Idempotent. Waits
    /// for the writer: call it off the UI thread.
    pub fn join(&self, pubkey: &str) -> Result<bool> {
        let k = key(pubkey)?;
        let leads = self.elector.join(&k)?;
        self.allow(k);
        Ok(leads)
    }

    /// Leaves an agent's election, releasing its lock if this window held it.
    pub fn leave(&self, pubkey: &str) -> Result<()> {
        Ok(self.elector.leave(&key(pubkey)?)?)
    }

    /// The user's claim: "this window wants to lead" (the sidebar's claim).
    /// Co-located windows hand over without a relay; see
    /// [`nip_le::Elector::claim`].
    pub fn claim(&self, pubkey: &str) -> Result<ClaimOutcome> {
        Ok(self.elector.claim(&key(pubkey)?)?)
    }

    /// Releases the lock if this window holds it and stands down for the
    /// stand-down timeout. Returns whether a record of ours was released.
    pub fn release(&self, pubkey: &str) -> Result<bool> {
        Ok(self.elector.release(&key(pubkey)?)?)
    }

    /// Handles a relay-delivered control frame (decrypted JSON) for `pubkey`
    /// and returns the `control_result` to send back, if any. Check NIP-AO
    /// authorisation (the frame comes from the agent's owner) first.
    pub fn handle_control_frame(&self, pubkey: &str, frame: &str) -> Result<Option<ControlResult>> {
        Ok(self.elector.handle_control_frame(&key(pubkey)?, frame)?)
    }

    /// The agent's work ledger (exactly-once dispatch across leadership
    /// changes): `take` before a turn, `done` after the reply, `give_back`
    /// on `mustCancelTurn`, `owed` on becoming leader. See [`Work`].
    pub fn work(&self, pubkey: &str) -> Result<Work> {
        Ok(self.elector.work(&key(pubkey)?)?)
    }

    /// Takes `event_id` for a turn (see [`Work::take`]).
    pub fn take(&self, pubkey: &str, event_id: &str) -> Result<TakeOutcome> {
        Ok(self.work(pubkey)?.take(event_id)?)
    }

    /// Takes a queued event for a turn, with when it was published (see
    /// [`Work::take_event`]: what keeps a busy agent's ledger bounded
    /// without forgetting an answer).
    pub fn take_event(&self, pubkey: &str, event: &QueuedEvent) -> Result<TakeOutcome> {
        Ok(self.work(pubkey)?.take_event(event)?)
    }

    /// Whether the page in `webview` may take one more event of `pubkey`:
    /// it holds fewer than [`crate::turns::MAX_PAGE_TAKES`] unsettled, so
    /// that one page cannot use up the process's share of the agent.
    pub(crate) fn page_has_room(&self, webview: &str, pubkey: &str) -> Result<bool> {
        Ok(self.turns.count(webview, key(pubkey)?.as_str()) < crate::turns::MAX_PAGE_TAKES)
    }

    /// Records that the reply to `event_id` was sent (see [`Work::done`]).
    pub fn done(&self, pubkey: &str, event_id: &str) -> Result<bool> {
        Ok(self.work(pubkey)?.done(event_id)?)
    }

    /// Gives `event_id` back after a cancelled turn (see
    /// [`Work::give_back`]).
    pub fn give_back(&self, pubkey: &str, event_id: &str) -> Result<()> {
        Ok(self.work(pubkey)?.give_back(event_id)?)
    }

    /// A webview's page took `event_id` (the `take` command): the take
    /// ends with the page, see [`LeaderElection::page_gone`].
    pub(crate) fn page_took(&self, webview: &str, pubkey: &str, event_id: &str) -> Result<()> {
        self.turns.took(webview, key(pubkey)?.as_str(), event_id);
        Ok(())
    }

    /// A page settles `event_id` (the `done` or `give_back` command) with
    /// `settle`: only a take a page of this process holds, which ends once
    /// `settle` took effect (it succeeded, or its line is applied but not
    /// durable yet: `NotDurable`). A take that `settle` failed on stays, so
    /// the page may retry and a page that goes gives it back.
    pub(crate) fn page_settles<T>(
        &self,
        pubkey: &str,
        event_id: &str,
        settle: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        let k = key(pubkey)?;
        if !self.turns.holds(k.as_str(), event_id) {
            return Err(crate::Error::NotTaken {
                pubkey: k,
                event_id: event_id.to_owned(),
            });
        }
        let out = settle();
        if matches!(
            out,
            Ok(_) | Err(crate::Error::Engine(nip_le::Error::NotDurable { .. }))
        ) {
            self.turns.ended(k.as_str(), event_id);
        }
        out
    }

    /// The page in webview `label` is gone (reloaded, navigated away or
    /// closed; the plugin calls this itself on page load and on a closed
    /// window): every event it took and did not finish is given back, owed
    /// again at once. Returns how many. Waits for the engine's writer:
    /// call it off the main thread.
    pub fn page_gone(&self, label: &str) -> usize {
        let takes = self.turns.forget(label);
        for (pubkey, id) in &takes {
            if let Err(e) = self.give_back(pubkey, id) {
                tracing::warn!(%pubkey, "cannot give back a take of a page that is gone: {e}");
            }
        }
        takes.len()
    }

    /// Of `queue`, the events this window must dispatch now (see
    /// [`Work::owed`]).
    pub fn owed(&self, pubkey: &str, queue: &[QueuedEvent]) -> Result<Vec<String>> {
        Ok(self.work(pubkey)?.owed(queue)?)
    }

    /// Looks at every joined agent's lock now, without waiting for the
    /// refresh tick.
    pub fn refresh(&self) {
        self.elector.refresh_now();
    }

    /// A snapshot of every joined agent (cached: no I/O, no wait).
    pub fn status(&self) -> Status {
        Status {
            instance_id: self.instance_id().to_owned(),
            pid: std::process::id(),
            network_fs: self.elector.network_fs().map(str::to_owned),
            agents: self.elector.status(),
            supervised: self.agents.status(),
        }
    }

    /// Every later leadership change of this window, for the app's Rust side.
    pub fn subscribe(&self) -> broadcast::Receiver<LeadershipChange> {
        self.elector.subscribe()
    }

    /// Releases every lock this window holds and stops the engine. Called
    /// on `RunEvent::Exit`; idempotent.
    pub fn shutdown(&self) {
        // Each agent's lock moves as soon as that agent has stopped (the
        // election waits for it), so a successor's agent finds the instance
        // lease free; then the supervisors end.
        self.elector.shutdown();
        self.agents.stop_all();
    }

    /// Runs `cmd` only while this app process may act for `pubkey`
    /// (joining it first), through the engine's [`CommandRunner`]: see
    /// [`LeaderElection::run_agent`]. Replaces an earlier runner of that
    /// agent.
    ///
    /// ```
    /// use tauri_plugin_leader_election::{AgentCommand, LeaderElectionExt, Result};
    ///
    /// fn signed_in<R: tauri::Runtime>(app: &tauri::AppHandle<R>, agent: &str) -> Result<()> {
    ///     let mut cmd = AgentCommand::new("buzz-acp", ["--agent", agent]);
    ///     cmd.timings.grace = std::time::Duration::from_secs(5);
    ///     app.leader_election().supervise_agent(agent, cmd)
    /// }
    /// # let _ = signed_in::<tauri::test::MockRuntime>;
    /// ```
    pub fn supervise_agent(&self, pubkey: &str, cmd: nip_le::agent::AgentCommand) -> Result<()> {
        cmd.validate().map_err(nip_le::Error::AgentCommand)?;
        let timings = cmd.timings;
        let runner = CommandRunner::new(cmd, self.elector.config().backend);
        self.run_agent(pubkey, runner, timings)
    }

    /// Runs `pubkey`'s agent process through the app's own `runner` (its
    /// process manager, implementing [`AgentRunner`]) only while this app
    /// process may act for the agent, joining it first: started when we
    /// may; stopped on every loss; a start answered "busy" (the
    /// predecessor's agent still holds its instance lease) retried within
    /// `timings.busy_min`..`busy_max`; a failed start or an agent that
    /// exits by itself retried after a backoff; a claim by another window,
    /// a release or a leave gives the lock up only once the agent has
    /// stopped. Replaces (after stopping) an earlier runner of that agent.
    /// Call [`LeaderElection::stop_agent`] before leaving an agent for
    /// good. What each platform guarantees when the app itself is killed:
    /// `docs/platforms.md`; the whole table: `docs/buzz.md`.
    ///
    /// ```
    /// use tauri_plugin_leader_election::{
    ///     AgentExit, AgentRunner, AgentStart, AgentTimings, LeaderElectionExt, Result,
    ///     StartError, StopOutcome,
    /// };
    ///
    /// /// The app's process manager (Buzz's would start its harness).
    /// struct Harness;
    ///
    /// impl AgentRunner for Harness {
    ///     fn start(&mut self, start: &AgentStart) -> std::result::Result<u32, StartError> {
    ///         // Spawn held back, then `start.started(pid)`, then let it run.
    ///         Err(StartError::Failed(format!("no harness for {}", start.pubkey())))
    ///     }
    ///     fn stop(&mut self, _pid: u32) -> StopOutcome {
    ///         StopOutcome::default()
    ///     }
    ///     fn exited(&mut self, _pid: u32) -> AgentExit {
    ///         AgentExit::default()
    ///     }
    /// }
    ///
    /// fn restored<R: tauri::Runtime>(app: &tauri::AppHandle<R>, agent: &str) -> Result<()> {
    ///     app.leader_election().run_agent(agent, Harness, AgentTimings::default())
    /// }
    /// # let _ = restored::<tauri::test::MockRuntime>;
    /// ```
    pub fn run_agent(
        &self,
        pubkey: &str,
        runner: impl AgentRunner,
        timings: AgentTimings,
    ) -> Result<()> {
        self.join(pubkey)?;
        self.agents
            .supervise(&self.elector, key(pubkey)?, runner, timings)
    }

    /// Stops `pubkey`'s supervised agent; whether there was one.
    pub fn stop_agent(&self, pubkey: &str) -> Result<bool> {
        Ok(self.agents.stop(&key(pubkey)?))
    }

    /// What the supervised agents do (started, exited, stopped, with their
    /// pids), from now on; the plugin emits the same to webviews as
    /// [`crate::AGENT_EVENT`].
    pub fn subscribe_agents(&self) -> broadcast::Receiver<nip_le::agent::AgentReport> {
        self.agents.subscribe()
    }
}

/// For agent processes a window spawned with its instance id (in
/// `BUZZ_INSTANCE_ELECTION_ID`): whether that window leads `pubkey` now, by
/// the NIP's read side (one unguarded read of the lock file in the default
/// lock directory, `$BUZZ_LEADER_LOCK_DIR` or `~/.buzz/leader-locks`). It
/// joins nothing and writes nothing: a child that joined would be the same
/// instance as its window, and its exit would release the window's lock.
pub fn read_side(pubkey: &str) -> Result<bool> {
    let pk = key(pubkey)?;
    let dir = nip_le::config::default_lock_dir().map_err(nip_le::Error::from)?;
    let id = nip_le::InstanceId::from_env().map_err(nip_le::Error::from)?;
    Ok(nip_le::read_side(&dir, &pk, id.as_str()))
}
