use tauri_plugin_leader_election::LeaderElectionExt;

mod reply; // the exactly-once step below; leave it out if you do not need it

const AGENT: &str = "5c0075c0075c0075c0075c0075c0075c0075c0075c0075c0075c0075c0075c00"; // its pubkey

pub fn run() {
    // Joined at launch. Agents learned later (at login): `app.leader_election().join(pubkey)`
    // joins one from Rust, `allow_agent(pubkey)` lets the webviews join it themselves.
    let leader_election = tauri_plugin_leader_election::Builder::new().agent(AGENT);
    tauri::Builder::default()
        .plugin(leader_election.build())
        .setup(|app| {
            let election = app.leader_election();
            println!("leading {AGENT}: {}", election.is_leader(AGENT)?); // 1. leader or not
            let mut changes = election.subscribe(); // 2. every change, as it happens
            tauri::async_runtime::spawn(async move {
                while let Ok(c) = changes.recv().await {
                    println!("{} leads here: {} ({:?})", c.pubkey, c.is_leader, c.reason);
                }
            });
            Ok(()) // 3 and 4: election.claim(AGENT)? takes over, election.release(AGENT)? steps back
        })
        .invoke_handler(tauri::generate_handler![reply::reply])
        .run(tauri::generate_context!())
        .expect("error while running tauri application");
}
