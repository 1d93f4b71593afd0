//! `is_leader` must not allocate (it sits on every dispatch, 👀 and
//! heartbeat check). A counting global allocator proves it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    // Allocations made by this thread only: the engine's own threads (the
    // refresh loop, the watch) may allocate meanwhile.
    static ALLOCS: Cell<usize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|n| n.set(n.get() + 1));
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static A: Counting = Counting;

#[test]
fn is_leader_does_not_allocate_in_either_mode() {
    for mode in [nip_le::Mode::Spec, nip_le::Mode::Extended] {
        let tmp = tempfile::tempdir().unwrap();
        let mut c = nip_le::Config::new(tmp.path());
        c.mode = mode;
        c.refresh = std::time::Duration::from_secs(60);
        c.stale = std::time::Duration::from_secs(120);
        let e = nip_le::Elector::start(c, nip_le::InstanceId::random()).unwrap();
        let pk = nip_le::AgentPubkey::parse(&"ab".repeat(32)).unwrap();
        assert!(e.join(&pk).unwrap());
        let flag = e.leader_flag(&pk).unwrap();
        let before = ALLOCS.with(Cell::get);
        let mut n = 0;
        for _ in 0..10_000 {
            n += flag.is_leader() as u32 + e.is_leader(&pk) as u32;
        }
        let after = ALLOCS.with(Cell::get);
        assert_eq!(n, 20_000);
        assert_eq!(after - before, 0, "[{}] is_leader allocated", mode.as_str());
    }
}
