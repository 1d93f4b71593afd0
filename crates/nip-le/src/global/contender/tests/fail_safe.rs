//! A host leader without the lock file (the NIP's fail-safe: the file
//! cannot be read or locked) leads its host beside the sibling that holds
//! the lock, which continues the agent's lease: it neither keeps a key it
//! held nor takes a free one (found by the simulator across hosts with disk
//! faults: two holders of etcd's key).

use super::*;

impl Host {
    /// The writer says we lead our host, without the lock file.
    fn lead_unlocked(&mut self) {
        self.cell.set_leader(true);
        self.task.step(Some(Inbox::Lead {
            pk: pk(),
            leads: true,
            locked: false,
            revoke: false,
            tenure: 1,
        }));
        self.pump();
    }
}

#[test]
fn a_host_leader_that_loses_the_lock_file_gives_up_the_key_it_holds() {
    let (clock, etcd) = rig();
    let mut a = Host::window(&etcd, &clock, "a", "aw0", WhenUnreachable::FallBack);
    a.lead(true, false);
    assert!(a.acts(), "it holds the key");
    a.lead_unlocked();
    assert!(
        !a.acts(),
        "the sibling that holds the lock continues the lease, alone"
    );
}

#[test]
fn a_host_leader_without_the_lock_file_never_takes_a_free_key() {
    let (clock, etcd) = rig();
    let mut a = Host::window(&etcd, &clock, "a", "aw0", WhenUnreachable::FallBack);
    a.lead_unlocked();
    assert!(
        etcd.get(&leader_key()).unwrap().is_none(),
        "the key stays for the sibling that holds the lock"
    );
    assert!(!a.acts());
}

/// A claim granted while we lead our host without the lock file is not
/// taken: the sibling that holds the lock continues it (found by the
/// simulator across hosts; the teeth's `granted_unlocked`).
#[test]
fn a_claim_granted_to_a_host_leader_without_the_lock_file_is_left_to_the_sibling() {
    let (clock, etcd) = rig();
    let mut a = Host::window(&etcd, &clock, "a", "aw0", WhenUnreachable::FallBack);
    let mut b = Host::new(&etcd, &clock, "b", WhenUnreachable::FallBack);
    a.lead(true, false);
    b.lead(true, false);
    assert!(a.acts() && !b.acts());
    b.task.step(Some(Inbox::Claim(pk())));
    b.pump();
    // Before the grant arrives, b loses the lock file (fail-safe lead).
    b.lead_unlocked();
    pump_all(&mut [&mut a, &mut b]);
    assert!(!b.acts(), "a fail-safe host leader took the granted key");
}
