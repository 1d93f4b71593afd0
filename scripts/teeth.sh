#!/usr/bin/env bash
# The teeth (docs/simulator.md#teeth): every defect a fix removed, put
# back alone (`nip_le::mutant`, compiled in by the `mutants` feature),
# is caught. The simulator's guards are seeds in
# crates/nip-le/tests/teeth.rs; the defects the simulator does not reach
# are listed below, each with the unit test that must fail with it on
# (the seeds run in `cargo test`; this runs the unit tests' guards).
# tests/teeth.rs checks that every defect has exactly one guard, there or
# here. A step of the test command, after `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."
export NIP_LE_LOG=off

# The engine's unit tests as the test command's `cargo test` built them:
# the CLI's dev-dependency compiles the defects in (off unless
# NIP_LE_MUTANT names one), so nothing is built again here.
bin=$(cargo test --workspace --exclude leader-election-example --exclude readme-app --exclude buzz-shaped-example \
  --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "nip_le" \
            and m["target"]["kind"] == ["lib"] and m.get("executable"):
        print(m["executable"])')
[ -x "$bin" ] || { echo "teeth: no unit-test binary of the engine" >&2; exit 1; }

failed=0
# guard <defect> <unit test, its full path>: the test fails with the
# defect put back (without it, it passed in `cargo test`).
guard() {
  local defect=$1 test=$2
  if NIP_LE_MUTANT=$defect "$bin" -q --exact "$test" >/dev/null 2>&1; then
    echo "  $defect put back: $test still passes" >&2
    failed=1
  else
    echo "  $defect: caught by $test"
  fi
}
# unguarded <defect> <why>: counted by tests/teeth.rs as its one entry, said here.
unguarded() { echo "  $1: no guard ($2)"; }
echo "the defects the simulator does not reach, each caught by a unit test"
guard regained elector::machine::announce::tests::a_lead_regained_after_an_unannounced_lapse_is_announced_fenced_first
guard lost elector::machine::announce::tests::every_way_of_ceasing_to_act_cancels_the_turn_and_observers_cancel_nothing
guard hang elector::machine::tests::an_observer_that_finds_the_exclusion_held_gives_the_holder_a_fresh_window
guard take_as_hold_ends elector::machine::tests::an_observer_whose_deadline_falls_as_a_hold_ends_gives_the_holder_a_window_after_it
guard handoff elector::machine::tests::a_handed_over_record_we_could_not_confirm_is_fenced
guard revoke_claim global::contender::tests::a_granted_claims_lease_is_never_revoked_by_its_poster_once_it_backs_the_key
guard revoke_sibling global::contender::tests::stepping_back_never_revokes_a_lease_a_sibling_now_holds_the_key_with
guard child_ledger elector::machine::same_id_tests::a_busy_look_at_a_file_our_child_is_rewriting_keeps_us_holding
guard take_back elector::machine::same_id_tests::a_file_our_child_emptied_is_taken_back_at_our_epoch_unless_a_later_one_was_issued
guard no_release_mark elector::machine::same_id_tests::our_release_marks_our_epoch_released
guard childs_take elector::machine::model::two_windows_with_harness_children_never_act_together_in_any_interleaving
guard held_flush_unsynced ledger::tests::dones_give_backs_and_held_lines_are_synced_takes_only_written_unless_refused_lines_go_with_them
guard taken_left_to_floor work::tests::before_a_ledgerless_floor_our_windows_unanswered_takes_are_owed
guard no_floor_line work::tests::floor::a_ledgerless_writers_floor_binds_every_later_holder
guard unreadable_grants ledger::tests::an_unreadable_ledger_delays_takes_for_the_stale_bound_then_never_silences_the_agent
guard unlocked_keeps_lease global::contender::tests::fail_safe::a_host_leader_that_loses_the_lock_file_gives_up_the_key_it_holds
guard granted_unlocked global::contender::tests::fail_safe::a_claim_granted_to_a_host_leader_without_the_lock_file_is_left_to_the_sibling
guard drop_unanswered_hand_over global::contender::tests::hardening::a_hand_over_etcd_did_not_answer_is_tried_again
guard empty_held_leads elector::machine::tests::an_empty_file_whose_exclusion_a_peer_holds_is_being_written_until_the_stale_bound
guard flood_of_takes work::tests::in_hand::a_grant_stays_in_hand_until_settled_and_its_done_is_written_even_unrecorded
guard sync_failure_hidden ledger::tests::sync_fault::a_settle_whose_sync_fails_is_written_applied_and_reported_not_durable
guard fallback_permit_held_again global::contender::tests::silence::a_hand_over_owed_through_a_fall_back_that_etcd_then_refuses_holds_the_key_without_the_fall_backs_permit
# Reached by no seed of the search and no unit test (next: a unit test each):
unguarded spec_ticks 'latency only: a spec claimant waits a refresh more; no invariant breaks'
unguarded spec_clears 'no seed of the search since the same-id rules changed; the model check misses it'
unguarded claim_on_siblings_lease 'no seed of 2,000 across hosts: the watch shows the claim too, and that hand-over asks the writer first'
[ "$failed" = 0 ] || { echo "teeth: a defect put back passed its guard (above)" >&2; exit 1; }
