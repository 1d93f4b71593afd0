use tauri::AppHandle;
use tauri_plugin_leader_election::{Error, LeaderElectionExt};

#[tauri::command]
pub async fn reply(app: AppHandle, agent: String, id: String, text: String) -> Result<bool, Error> {
    tauri::async_runtime::spawn_blocking(move || {
        let work = app.leader_election().work(&agent)?;
        if !work.may_act() {
            return Ok(false); // no longer leading: not sent
        }
        println!("{agent} replies to {id}: {text}"); // your relay client sends it here
        work.done(&id)?; // at once, before anything else
        Ok(true)
    })
    .await
    .map_err(|e| Error::Task(e.to_string()))?
}
