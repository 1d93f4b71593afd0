//! The work ledger at its bound: one long tenure answers many mentions
//! published over hours (64-hex ids, the app passing its queue to `owed`
//! and each event's publication time to `take_event`), so the ledger
//! passes its rewrite budget and marks what it sheds settled. Measured: a
//! mention's take + done on an empty ledger and at the bound, the largest
//! the file grew, and what a successor (another window, claiming) owes of
//! the whole queue plus the mentions published after: those alone.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nip_le::{Config, Elector, InstanceId, Mode, QueuedEvent};

use nip_le_cli::drive::cluster::random_pubkey;

/// What the row prints.
pub struct WorkBound {
    /// Mentions answered in the tenure.
    pub answered: usize,
    /// Take + done of a mention, µs p50 / p99, on an empty ledger.
    pub empty_us: (f64, f64),
    /// The same at the bound (after the tenure).
    pub bound_us: (f64, f64),
    /// The largest the ledger file was, bytes.
    pub largest: u64,
    /// How long the tenure took.
    pub tenure: Duration,
    /// Of the tenure's mentions, how many the successor owed.
    pub owed_again: usize,
    /// Of the mentions published after, how many the successor owed.
    pub owed_new: (usize, usize),
}

fn err(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `n` take + done of fresh mentions published at `published`, µs each.
fn take_done(w: &nip_le::Work, tag: &str, n: usize, published: u64) -> std::io::Result<Vec<f64>> {
    let mut us = Vec::with_capacity(n);
    for i in 0..n {
        let e = QueuedEvent {
            id: format!("{tag}-{i}"),
            published_ms: Some(published),
        };
        let t = Instant::now();
        let took = w.take_event(&e).map_err(err)?;
        if !took.granted() {
            return Err(err(format!("take refused: {took:?}")));
        }
        w.done(&e.id).map_err(err)?;
        us.push(t.elapsed().as_nanos() as f64 / 1000.0);
    }
    us.sort_by(f64::total_cmp);
    Ok(us)
}

/// One tenure of `mentions` (see the module).
pub fn work_bound(mentions: usize) -> std::io::Result<WorkBound> {
    let tmp = tempfile::tempdir()?;
    let mut c = Config::new(tmp.path());
    c.mode = Mode::Extended;
    let a = Elector::start(c.clone(), InstanceId::new("tenure").map_err(err)?).map_err(err)?;
    let pk = random_pubkey();
    a.join(&pk).map_err(err)?;
    let w = a.work(&pk).map_err(err)?;
    let now = now_ms();
    let empty = take_done(&w, "empty", 1000, now - 3_600_000)?;
    // Published over the six hours before the last twenty minutes.
    let span = 6 * 3_600_000u64;
    let first = now - span - 20 * 60_000;
    let queue: Vec<QueuedEvent> = (0..mentions)
        .map(|i| QueuedEvent {
            id: format!("{i:064x}"),
            published_ms: Some(first + span * i as u64 / mentions as u64),
        })
        .collect();
    let path = nip_le::ledger::ledger_path(tmp.path(), &pk);
    let (mut largest, started) = (0, Instant::now());
    for chunk in queue.chunks(1000) {
        for id in w.owed(chunk).map_err(err)? {
            let e = chunk
                .iter()
                .find(|e| e.id == id)
                .expect("owed from the chunk");
            let took = w.take_event(e).map_err(err)?;
            if !took.granted() {
                return Err(err(format!("take refused in the tenure: {took:?}")));
            }
            w.done(&id).map_err(err)?;
        }
        largest = largest.max(std::fs::metadata(&path).map_or(0, |m| m.len()));
    }
    let tenure = started.elapsed();
    let bound = take_done(&w, "bound", 1000, now_ms() - 15 * 60_000)?;
    // Five mentions published after; another window claims and is asked
    // about the whole queue.
    let fresh: Vec<QueuedEvent> = (0..5)
        .map(|k| QueuedEvent {
            id: format!("new-{k}"),
            published_ms: Some(now_ms() + k),
        })
        .collect();
    let b = Elector::start(c, InstanceId::new("successor").map_err(err)?).map_err(err)?;
    b.join(&pk).map_err(err)?;
    b.claim(&pk).map_err(err)?;
    let wb = b.work(&pk).map_err(err)?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !wb.may_act() {
        if Instant::now() > deadline {
            return Err(err("the successor never led"));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let whole: Vec<QueuedEvent> = queue.iter().chain(&fresh).cloned().collect();
    let owed = wb.owed(&whole).map_err(err)?;
    let owed_new = owed.iter().filter(|id| id.starts_with("new-")).count();
    Ok(WorkBound {
        answered: mentions,
        empty_us: (super::pct(&empty, 50.0), super::pct(&empty, 99.0)),
        bound_us: (super::pct(&bound, 50.0), super::pct(&bound, 99.0)),
        largest,
        tenure,
        owed_again: owed.len() - owed_new,
        owed_new: (owed_new, fresh.len()),
    })
}
