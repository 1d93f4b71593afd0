//! Real `nip-le run` processes under real signals, driven and observed
//! through the same JSON lines, and the simulator's seeds: what the `demo`
//! and `sim` commands run, and what the lab (`crates/nip-le-lab`) and the
//! tests build on.
//! * [`cluster`]: spawn, signal and wait on instances;
//! * [`feed`]: follow an appended JSON-lines file (the simulated relay);
//! * [`process`]: pause, resume and kill a process by pid;
//! * [`demo`]: the narrated election of the README's main job;
//! * [`sim`]: seeds of the deterministic simulator (`nip_le::sim`), in
//!   virtual time.

pub mod cluster;
pub mod demo;
pub mod feed;
pub mod process;
pub mod sim;
