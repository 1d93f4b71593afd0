use tauri::AppHandle;
use tauri_plugin_leader_election::{Error, LeaderElectionExt};

const AGENT: &str = "5c0075c0075c0075c0075c0075c0075c0075c0075c0075c0075c0075c0075c00"; // its pubkey

#[tauri::command]
async fn reply(app: AppHandle, agent: String, id: String, text: String) -> Result<bool, Error> {
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

pub fn run() {
    // Joined at launch. Agents learned later (at login): `app.leader_election().join(pubkey)`
    // joins one from Rust, `allow_agent(pubkey)` lets the webviews join it themselves.
    let leader_election = tauri_plugin_leader_election::Builder::new().agent(AGENT);
    tauri::Builder::default()
        .plugin(leader_election.build())
        .invoke_handler(tauri::generate_handler![reply])
        .run(tauri::generate_context!())
        .expect("error while running tauri application");
}
