//! # tauri-plugin-leader-election
//!
//! NIP-LE for Tauri v2: several windows of an app signed in with the same
//! agent identity elect one prompter per agent key through a local lock file,
//! so a mention fanned out to every window is answered once. The election
//! engine is the Tauri-free [`nip_le`] crate; this plugin adds the per-window
//! instance id, commands, the `leader-election://changed` event and release
//! of every lock on exit.
//!
//! ```
//! use tauri_plugin_leader_election::LeaderElectionExt;
//!
//! fn with_leader_election<R: tauri::Runtime>(builder: tauri::Builder<R>) -> tauri::Builder<R> {
//!     builder
//!         .plugin(
//!             tauri_plugin_leader_election::Builder::new()
//!                 .agent("a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90")
//!                 .build(),
//!         )
//!         .setup(|app| {
//!             let le = app.leader_election();
//!             // Hand this to spawned agent processes as BUZZ_INSTANCE_ELECTION_ID.
//!             println!("this window's instance id: {}", le.instance_id());
//!             Ok(())
//!         })
//! }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

use std::path::PathBuf;
use std::time::Duration;

use tauri::plugin::{Builder as PluginBuilder, TauriPlugin};
use tauri::{Emitter, Manager, RunEvent, Runtime};

mod agents;
#[cfg(test)]
mod bindings;
mod commands;
mod error;
mod leader_election;
mod models;
mod turns;

pub use error::{Error, ErrorKind, LeaderElectionError, Result};
pub use leader_election::{read_side, LeaderElection};
pub use models::{Status, SupervisedAgent};
/// The engine itself, for what the plugin does not wrap
/// ([`Error::Engine`]'s cause, the read side for agent processes, the
/// simulator), at exactly the version and features the plugin uses.
pub use nip_le;
/// The runner seam and the supervised agent's reports (see
/// [`LeaderElection::run_agent`] and [`LeaderElection::supervise_agent`]).
pub use nip_le::agent::{
    AgentCommand, AgentEvent, AgentExit, AgentExits, AgentReport, AgentRunner, AgentStart,
    AgentTimings, CommandRunner, StartError, StopOutcome,
};
/// Feature `etcd`: the cross-host configuration [`Builder::etcd_config`]
/// takes, without a direct dependency on the engine.
#[cfg(feature = "etcd")]
#[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
pub use nip_le::global::{EtcdAuth, EtcdConfig, EtcdTls, WhenUnreachable};
/// The engine's types that cross IPC or that an app handles: one vocabulary
/// from the engine to the webview.
pub use nip_le::{
    Backend, ChangeReason, ClaimOutcome, Config, ControlResult, ElectionStatus, GlobalHolder,
    GlobalStatus, HolderStatus, LeaderFlag, LeadershipChange, Level, LockState, Mode, QueuedEvent,
    StateCounts, TakeOutcome, Work, ELECTION_ID_ENV,
};

/// The event emitted to every webview on each leadership change, with a
/// [`LeadershipChange`] payload.
pub const CHANGED_EVENT: &str = "leader-election://changed";

/// The event emitted to every webview when a supervised agent process
/// starts, exits or is stopped, with an [`nip_le::agent::AgentReport`]
/// payload.
pub const AGENT_EVENT: &str = "leader-election://agent";

/// Extension trait: `app.leader_election()` on the app, its handle, windows
/// and webviews.
pub trait LeaderElectionExt<R: Runtime> {
    /// This window's [`LeaderElection`]. Panics if the plugin is not
    /// registered (as every official plugin's `Ext` does).
    fn leader_election(&self) -> &LeaderElection;
}

impl<R: Runtime, T: Manager<R>> LeaderElectionExt<R> for T {
    fn leader_election(&self) -> &LeaderElection {
        self.state::<LeaderElection>().inner()
    }
}

/// Configures the plugin. Unset timings keep the NIP's defaults (refresh 5 s,
/// stale 10 s, stand-down 10 s); the result is validated at setup.
#[derive(Debug, Default, Clone)]
pub struct Builder {
    lock_dir: Option<PathBuf>,
    refresh: Option<Duration>,
    stale: Option<Duration>,
    stand_down: Option<Duration>,
    lock_wait: Option<Duration>,
    work_retention: Option<Duration>,
    reply_flight: Option<Duration>,
    mode: Option<Mode>,
    backend: Option<Backend>,
    agents: Vec<String>,
    allowed: Vec<String>,
    instance_id: Option<String>,
    inherit_instance_id: bool,
    supervised: Vec<(String, AgentCommand)>,
    #[cfg(feature = "etcd")]
    etcd: Option<nip_le::global::EtcdConfig>,
}

impl Builder {
    /// Defaults: lock dir `$BUZZ_LEADER_LOCK_DIR` or `~/.buzz/leader-locks`,
    /// a fresh instance id (UUID v4) for this app process.
    pub fn new() -> Self {
        Self::default()
    }

    /// Overrides the lock directory (must be absolute).
    pub fn lock_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.lock_dir = Some(dir.into());
        self
    }

    /// Refresh interval (re-claim and re-read).
    pub fn refresh(mut self, d: Duration) -> Self {
        self.refresh = Some(d);
        self
    }

    /// Staleness bound for a holder's `claimed_at`; must exceed the refresh.
    pub fn stale(mut self, d: Duration) -> Self {
        self.stale = Some(d);
        self
    }

    /// Stand-down auto-expiry.
    pub fn stand_down(mut self, d: Duration) -> Self {
        self.stand_down = Some(d);
        self
    }

    /// Longest wait for a peer's exclusive file lock; below the refresh.
    pub fn lock_wait(mut self, d: Duration) -> Self {
        self.lock_wait = Some(d);
        self
    }

    /// How long the work ledger remembers a taken or done event (24 h by
    /// default): keep it above the age of the oldest event a window fetches
    /// when it connects, or such an event is owed (answered) again.
    pub fn work_retention(mut self, d: Duration) -> Self {
        self.work_retention = Some(d);
        self
    }

    /// How long a reply the app sent while it could act may take to reach
    /// the relay (1 s by default): a leader that cannot write its record
    /// stops acting this long before anyone may take over from it.
    pub fn reply_flight(mut self, d: Duration) -> Self {
        self.reply_flight = Some(d);
        self
    }

    /// `Mode::Spec` turns every extension off (plain NIP behaviour);
    /// the default, `Mode::Extended`, keeps them on.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = Some(mode);
        self
    }

    /// The platform code of extended mode: `Backend::Native` (the
    /// default, or `$NIP_LE_BACKEND`) or `Backend::Portable`, which runs on
    /// Linux what macOS and Windows run (see `docs/platforms.md`).
    pub fn backend(mut self, backend: Backend) -> Self {
        self.backend = Some(backend);
        self
    }

    /// Joins `pubkey` at launch and runs `cmd` only while this window may
    /// act for it (see [`LeaderElection::supervise_agent`]). Validated at
    /// setup.
    pub fn supervise(
        mut self,
        pubkey: impl Into<String>,
        cmd: nip_le::agent::AgentCommand,
    ) -> Self {
        self.supervised.push((pubkey.into(), cmd));
        self
    }

    /// An agent to join at launch (auto-claim). Validated at setup.
    pub fn agent(mut self, pubkey: impl Into<String>) -> Self {
        self.agents.push(pubkey.into());
        self
    }

    /// Agents to join at launch.
    pub fn agents<I: IntoIterator<Item = S>, S: Into<String>>(mut self, pubkeys: I) -> Self {
        self.agents.extend(pubkeys.into_iter().map(Into::into));
        self
    }

    /// Agents the webviews may join, leave, claim and release (and whose
    /// control frames and work ledger they may use), besides the launch
    /// agents ([`Builder::agent`]) and every agent the app joins from Rust
    /// ([`LeaderElection::join`]). Webviews can act on no other agent: a
    /// command naming one fails with `not_allowed` (deny by default), so a
    /// compromised webview cannot take the lock of an agent this app does
    /// not run. The list changes at runtime with
    /// [`LeaderElection::allow_agent`] and
    /// [`LeaderElection::disallow_agent`] (an agent learned after login).
    /// The app's own Rust code ([`LeaderElectionExt`]) is not restricted.
    /// Validated at setup.
    pub fn allow_agents<I: IntoIterator<Item = S>, S: Into<String>>(mut self, pubkeys: I) -> Self {
        self.allowed.extend(pubkeys.into_iter().map(Into::into));
        self
    }

    /// Overrides the instance id (otherwise a fresh UUID v4 per app
    /// process). It must be unique per running app process: every webview
    /// of the process shares it and its leadership.
    pub fn instance_id(mut self, id: impl Into<String>) -> Self {
        self.instance_id = Some(id.into());
        self
    }

    /// Opt-in: adopt an inherited `$BUZZ_INSTANCE_ELECTION_ID` (and fail
    /// the launch if it is set but unusable) instead of minting an id, for
    /// an app process started by another process *as that process's
    /// instance*. Off by default: the variable is how a window hands its id
    /// to the agent harness it spawns, so a Buzz built and started from an
    /// agent's shell inherits it, and adopting it would make the new app
    /// and the window that runs the agent both lead. An explicit
    /// [`Builder::instance_id`] wins over this.
    pub fn inherit_instance_id(mut self) -> Self {
        self.inherit_instance_id = true;
        self
    }

    /// Feature `etcd`: one prompter per agent across hosts. This window
    /// leads its host by the NIP's lock file as before, and then acts only
    /// while it also holds the agent's lease in the etcd cluster at
    /// `endpoints` (`http://host:port`); status and events say which level
    /// it holds. Defaults: host id = a random id kept in the lock directory
    /// (so every window of a host shares it and no two hosts do), lease
    /// TTL 10 s, fall back to host-local leadership
    /// while etcd is unreachable. See [`Builder::etcd_config`] to change
    /// them, and `docs/cross-host.md` for the failure model.
    #[cfg(feature = "etcd")]
    #[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
    pub fn etcd<I: IntoIterator<Item = S>, S: Into<String>>(mut self, endpoints: I) -> Self {
        let endpoints = endpoints.into_iter().map(Into::into).collect();
        self.etcd = Some(nip_le::global::EtcdConfig::new(endpoints, ""));
        self
    }

    /// Feature `etcd`: the whole cross-host configuration (host id, TTL,
    /// key prefix, what to do while etcd is unreachable, and its transport
    /// security: `tls` for `https://` endpoints, which needs this crate's
    /// feature `etcd-tls`, and `auth` for an etcd user; see
    /// `docs/cross-host.md`, "Transport security and trust model").
    /// Validated at setup (the TLS and password files are read then).
    #[cfg(feature = "etcd")]
    #[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
    pub fn etcd_config(mut self, config: EtcdConfig) -> Self {
        self.etcd = Some(config);
        self
    }

    /// The validated engine configuration this builder describes.
    pub fn config(&self) -> Result<nip_le::Config> {
        let mut c = match &self.lock_dir {
            Some(d) => nip_le::Config::new(d),
            None => nip_le::Config::default_from_env().map_err(nip_le::Error::from)?,
        };
        if let Some(d) = self.refresh {
            c.refresh = d;
            c.lock_wait = c.lock_wait.min(d / 2);
        }
        if let Some(d) = self.stale {
            c.stale = d;
        }
        if let Some(d) = self.stand_down {
            c.stand_down = d;
        }
        if let Some(d) = self.lock_wait {
            c.lock_wait = d;
        }
        if let Some(d) = self.work_retention {
            c.work_retention = d;
        }
        if let Some(d) = self.reply_flight {
            c.reply_flight = d;
        }
        if let Some(m) = self.mode {
            c.mode = m;
        }
        c.backend = match self.backend {
            Some(b) => b,
            None => nip_le::config::backend_from_env().map_err(nip_le::Error::from)?,
        };
        #[cfg(feature = "etcd")]
        {
            c.etcd = self.etcd.clone();
        }
        c.validate().map_err(nip_le::Error::from)?;
        Ok(c)
    }

    /// Starts the engine and joins the launch agents (all validated before
    /// any file is touched, so a typo fails the launch cleanly).
    fn start(&self) -> Result<LeaderElection> {
        let config = self.config()?;
        let id = match &self.instance_id {
            Some(id) => nip_le::InstanceId::new(id.clone()).map_err(nip_le::Error::from)?,
            None if self.inherit_instance_id => {
                nip_le::InstanceId::from_env().map_err(nip_le::Error::from)?
            }
            None => nip_le::InstanceId::random(),
        };
        let parse = |list: &[String]| {
            list.iter()
                .map(|a| nip_le::AgentPubkey::parse(a))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(nip_le::Error::from)
        };
        let (agents, allowed) = (parse(&self.agents)?, parse(&self.allowed)?);
        Ok(LeaderElection::new(
            nip_le::Elector::start(config, id)?,
            agents,
            allowed,
        ))
    }

    /// Builds the plugin.
    pub fn build<R: Runtime>(self) -> TauriPlugin<R> {
        PluginBuilder::new("leader-election")
            .invoke_handler(tauri::generate_handler![
                commands::is_leader,
                commands::claim,
                commands::release,
                commands::status,
                commands::instance_id,
                commands::join,
                commands::leave,
                commands::handle_control_frame,
                commands::take,
                commands::done,
                commands::give_back,
                commands::owed,
            ])
            .setup(move |app, _api| {
                let le = self.start()?;
                // Every engine change as CHANGED_EVENT, every supervised
                // agent's report as AGENT_EVENT.
                forward(
                    app.clone(),
                    le.subscribe(),
                    CHANGED_EVENT,
                    "leader-election-events",
                );
                forward(
                    app.clone(),
                    le.subscribe_agents(),
                    AGENT_EVENT,
                    "leader-election-agent-events",
                );
                le.join_launch_agents()?;
                for (pubkey, cmd) in &self.supervised {
                    le.supervise_agent(pubkey, cmd.clone())?;
                }
                app.manage(le);
                Ok(())
            })
            // A take ends with the page that took it (see `turns`).
            .on_page_load(|webview, payload| {
                if payload.event() == tauri::webview::PageLoadEvent::Started {
                    page_gone(webview.app_handle(), webview.label());
                }
            })
            .on_event(|app, event| match event {
                RunEvent::Exit => {
                    if let Some(le) = app.try_state::<LeaderElection>() {
                        le.shutdown();
                    }
                }
                RunEvent::WindowEvent {
                    label,
                    event: tauri::WindowEvent::Destroyed,
                    ..
                } => page_gone(app, label),
                _ => {}
            })
            .build()
    }
}

/// Gives back the takes of webview `label`'s page, off the main thread.
fn page_gone<R: Runtime>(app: &tauri::AppHandle<R>, label: &str) {
    if let Some(le) = app.try_state::<LeaderElection>() {
        let (le, label) = (le.inner().clone(), label.to_owned());
        tauri::async_runtime::spawn_blocking(move || le.page_gone(&label));
    }
}

/// The plugin with every default, and no agent at launch: the webviews may
/// act on none until the app's Rust side joins one
/// ([`LeaderElection::join`]) or allows one ([`LeaderElection::allow_agent`]),
/// for instance once the user has signed in:
///
/// ```
/// use tauri_plugin_leader_election::LeaderElectionExt;
///
/// fn signed_in<R: tauri::Runtime>(app: &tauri::AppHandle<R>, agent: &str) {
///     // The webviews may now join it, claim it and use its work ledger.
///     if let Err(e) = app.leader_election().allow_agent(agent) {
///         eprintln!("not an agent key: {e}");
///     }
/// }
/// # let _ = signed_in::<tauri::test::MockRuntime>;
/// ```
pub fn init<R: Runtime>() -> TauriPlugin<R> {
    Builder::new().build()
}

/// Emits every report of `rx` to every webview as `event`, from a thread
/// of its own, until the sender is gone.
fn forward<R: Runtime, T: serde::Serialize + Clone + Send + 'static>(
    app: tauri::AppHandle<R>,
    mut rx: tokio::sync::broadcast::Receiver<T>,
    event: &'static str,
    thread: &str,
) {
    use tokio::sync::broadcast::error::RecvError;
    let spawned = std::thread::Builder::new()
        .name(thread.into())
        .spawn(move || loop {
            match rx.blocking_recv() {
                Ok(c) => {
                    if let Err(e) = app.emit(event, c) {
                        tracing::warn!("cannot emit {event}: {e}");
                    }
                }
                Err(RecvError::Lagged(n)) => {
                    tracing::warn!("{n} {event} events dropped; status() has the current view")
                }
                Err(RecvError::Closed) => return,
            }
        });
    if let Err(e) = spawned {
        tracing::error!("cannot start the {event} thread: {e}");
    }
}
