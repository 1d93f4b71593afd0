//! Thin IPC commands over [`LeaderElection`]. In Tauri v2 a command that is
//! not `async` runs on the main thread, so:
//! * `is_leader`, `status` and `instance_id` are synchronous and provably
//!   non-blocking: they read the engine's published snapshot (atomic loads,
//!   no lock held across I/O, no file touched);
//! * every command that changes something is `async` and waits for the
//!   engine's writer on the blocking pool, never on the main thread.

use tauri::{command, AppHandle, Runtime};

use crate::error::{Error, Result};
use crate::models::Status;
use crate::{
    ClaimOutcome, ControlResult, LeaderElection, LeaderElectionExt, QueuedEvent, TakeOutcome,
};

async fn blocking<R: Runtime, T: Send + 'static>(
    app: &AppHandle<R>,
    f: impl FnOnce(LeaderElection) -> Result<T> + Send + 'static,
) -> Result<T> {
    let le = app.leader_election().clone();
    tauri::async_runtime::spawn_blocking(move || f(le))
        .await
        .map_err(|e| Error::Task(e.to_string()))?
}

#[command]
pub(crate) fn is_leader<R: Runtime>(app: AppHandle<R>, pubkey: String) -> Result<bool> {
    app.leader_election().is_leader(&pubkey)
}

#[command]
pub(crate) fn instance_id<R: Runtime>(app: AppHandle<R>) -> String {
    app.leader_election().instance_id().to_owned()
}

#[command]
pub(crate) fn status<R: Runtime>(app: AppHandle<R>) -> Status {
    app.leader_election().status()
}

#[command]
pub(crate) async fn join<R: Runtime>(app: AppHandle<R>, pubkey: String) -> Result<bool> {
    blocking(&app, move |le| le.join(&pubkey)).await
}

#[command]
pub(crate) async fn leave<R: Runtime>(app: AppHandle<R>, pubkey: String) -> Result<()> {
    blocking(&app, move |le| le.leave(&pubkey)).await
}

#[command]
pub(crate) async fn claim<R: Runtime>(app: AppHandle<R>, pubkey: String) -> Result<ClaimOutcome> {
    blocking(&app, move |le| le.claim(&pubkey)).await
}

#[command]
pub(crate) async fn release<R: Runtime>(app: AppHandle<R>, pubkey: String) -> Result<bool> {
    blocking(&app, move |le| le.release(&pubkey)).await
}

#[command]
pub(crate) async fn handle_control_frame<R: Runtime>(
    app: AppHandle<R>,
    pubkey: String,
    frame: String,
) -> Result<Option<ControlResult>> {
    blocking(&app, move |le| le.handle_control_frame(&pubkey, &frame)).await
}

#[command]
pub(crate) async fn take<R: Runtime>(
    app: AppHandle<R>,
    pubkey: String,
    event_id: String,
) -> Result<TakeOutcome> {
    blocking(&app, move |le| le.take(&pubkey, &event_id)).await
}

#[command]
pub(crate) async fn done<R: Runtime>(
    app: AppHandle<R>,
    pubkey: String,
    event_id: String,
) -> Result<bool> {
    blocking(&app, move |le| le.done(&pubkey, &event_id)).await
}

#[command]
pub(crate) async fn give_back<R: Runtime>(
    app: AppHandle<R>,
    pubkey: String,
    event_id: String,
) -> Result<()> {
    blocking(&app, move |le| le.give_back(&pubkey, &event_id)).await
}

#[command]
pub(crate) async fn owed<R: Runtime>(
    app: AppHandle<R>,
    pubkey: String,
    queue: Vec<QueuedEvent>,
) -> Result<Vec<String>> {
    blocking(&app, move |le| le.owed(&pubkey, &queue)).await
}
