#!/usr/bin/env bash
# The simulator's teeth (docs/simulator.md): puts back, one at a time, a
# defect that an earlier change fixed, in a scratch worktree of HEAD, and
# counts the seeds of the CI budget that find it: a defect of one host's
# election against the one-host runs (300 extended + 250 mixed), a defect
# of the etcd contender against the runs across hosts (200 fall-back + 60
# stay-silent); 120 s each, without file and clock faults (durability
# defects: without clock faults only). Not part
# of the test command: it builds the CLI once per defect (a few minutes in
# all). Without arguments, the unchanged HEAD runs first as a baseline.
#
#   bash scripts/sim-teeth.sh                 # every defect
#   bash scripts/sim-teeth.sh regained lost   # some
set -euo pipefail
cd "$(dirname "$0")/.."
top=$(pwd)
work=$(mktemp -d)
trap 'git -C "$top" worktree remove --force "$work/tree" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git worktree add --detach -q "$work/tree" HEAD
cd "$work/tree"
# Warnings of the mutated code are expected noise.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$top/target/teeth}" NIP_LE_LOG=off RUSTFLAGS="-A warnings"
E=crates/nip-le/src/elector
G=crates/nip-le/src/global/contender

# name → file and a perl substitution (-0: the whole file at once).
declare -A FILE SUB
FILE[regained]=$E/machine/announce.rs;   SUB[regained]='s/\n        if leader \{\n/\n        if false && leader {\n/'
FILE[lost]=$E/types.rs;                  SUB[lost]='s/\| ChangeReason::Lost\n/| ChangeReason::Released\n/'
FILE[hang]=$E/machine/mod.rs;            SUB[hang]='s/if !self.rules.profile.monotonic_hang \|\| self.holds_lock \{/if true {/'
FILE[leave]=$E/writer/mod.rs;            SUB[leave]='s/let mut key = self.keys.remove\(pk\)(.*?)\n(.*?)\n        self.forget\(key\);\n/let key = self.keys.get_mut(pk)$1\n$2\n/s'
FILE[handoff]=$E/machine/conclude.rs;    SUB[handoff]='s/(\} else if !self.held_before \{.*?)Validity::Fenced/$1Validity::Always/s'
FILE[busy_renew]=$E/machine/conclude.rs; SUB[busy_renew]='s/(\} else if busy && self.held_before && self.wrote_last\(&content\) \{.*?)Validity::Keep/$1Validity::Renew/s'
FILE[hot_loop]=$E/machine/conclude.rs;   SUB[hot_loop]='s/let judged = self.record_judged\(\);/let judged = false;/'
FILE[spec_ticks]=$E/writer/key.rs;       SUB[spec_ticks]='s/if ctx.rules.profile.read_first && \(wrote \|\| !self.m.holds_lock\(\)\) \{/if wrote || !self.m.holds_lock() {/'
# Across hosts: a permit that outlives its lease; the fall-back whatever
# the policy; a host leader that continues another host's live lease; a
# hand-over that moves the key before the holder's writer stopped acting.
FILE[no_fence]=$G/task.rs;               SUB[no_fence]='s/let safe = ttl - ttl \/ 10;/let safe = ttl * 4;/'
FILE[fallback_always]=$G/moves.rs;       SUB[fallback_always]='s/let fall_back = silent && e.leads && policy == WhenUnreachable::FallBack;/let fall_back = silent && e.leads;/'
FILE[steal]=$G/moves.rs;                 SUB[steal]='s/if foreign_host && kv.lease != 0 \{/if false \&\& foreign_host \&\& kv.lease != 0 {/'
FILE[early_handover]=$G/moves.rs;        SUB[early_handover]='s/self.tell_with\(pk, Some\(ChangeReason::StoodDown\), false, true\);/self.hand_over_confirmed(pk); self.tell_with(pk, Some(ChangeReason::StoodDown), false, false);/'
# Found by the simulator across hosts (seeds 131 and 157): a granted
# claim's lease revoked by its poster; a lease revoked under a sibling that
# continued it, and a same-host claim handed over onto it.
FILE[revoke_claim]=$G/moves.rs;          SUB[revoke_claim]='s/if e.claim_lease == Some\(kv.lease\) \{/if false {/; s/Ok\(Some\(kv\)\) if kv.lease == lease => \{\}/Ok(Some(kv)) if false \&\& kv.lease == lease => {}/'
FILE[revoke_sibling]=$G/moves.rs;        SUB[revoke_sibling]='s/Some\(Some\(kv\)\) if kv.lease == lease && holder_of/Some(Some(kv)) if false \&\& kv.lease == lease \&\& holder_of/; s/\|\| claimant.host_id == self.cfg.host_id\n\s*//; s/if h.lease != claim.lease \{/if true {/'
# Harness children that share their windows' instance ids (issue 18, item 1; the
# rules in elector/machine/same_id.rs): the ledger dropped on a child's
# rewrite, the rewrite not repaired on the wake-up, a file the child
# emptied not taken back (or taken back at a new epoch), observers that do
# not wait for its holder, a release that does not mark the epoch, a
# joiner that does not wait for a holder it never saw, a spec writer in
# between that ends the wait, a child's take adopted without its rules,
# and a holder's child taken for a writer without a ledger.
FILE[child_ledger]=$E/machine/mod.rs;    SUB[child_ledger]='s/self.same_id.held_epoch.filter\(\|_\| self.holds_lock\)/self.observed.record().and_then(|r| r.epoch).filter(|_| self.holds_lock)/'
FILE[child_rewrite]=$E/machine/mod.rs;   SUB[child_rewrite]='s/\(write_own \|\| self.childs_record\(content\)\)/write_own/'
FILE[take_back]=$E/machine/mod.rs;       SUB[take_back]='s/if self.ours_vacated\(content\) \{/if false {/'
FILE[child_epoch]=$E/machine/mod.rs;     SUB[child_epoch]='s/let epoch = kept.unwrap_or_else\(\|\| self.next_epoch\(content\)\);/let epoch = if reason == TakeReason::Ours { record_epoch.unwrap_or(self.epoch) } else { self.next_epoch(content) };/'
FILE[no_wait]=$E/machine/same_id.rs;     SUB[no_wait]='s/let waits = candidate/let waits = false \&\& candidate/'
FILE[unknown_holder]=$E/machine/same_id.rs; SUB[unknown_holder]='s/if candidate && self.same_id.holder.is_none\(\) \{/if false {/'
FILE[spec_clears]=$E/machine/same_id.rs; SUB[spec_clears]='s/\(None, _\) => \{\}/(None, _) => self.same_id.holder = None,/'
FILE[no_release_mark]=$E/machine/conclude.rs; SUB[no_release_mark]='s/let mark = self.release_mark\(content\);/let mark = None;/'
FILE[childs_take]=$E/machine/conclude.rs; SUB[childs_take]='s/&& !self.held_before\n            && took.is_none\(\);/\&\& false;/'
FILE[ledgerless_child]=$E/writer/work.rs; SUB[ledgerless_child]='s/is_some_and\(\|by\| \{/is_some_and(|by| true || {/'
# A take that ends with its taker (issue 18, items 2 and 4): a done
# refused once leadership moved, takes of a live taker owed at once, a
# holder that does not read a former holder's late done, and a stand-down
# that gives its takes back while a reply may be on its way.
FILE[done_fenced]=$E/writer/work.rs;     SUB[done_fenced]='s/\(Some\(epoch\), _\) => epoch,/(Some(epoch), _) if leads => epoch,/'
FILE[no_in_flight]=$E/writer/work.rs;    SUB[no_in_flight]='s/let lives = \|t: &str\| probes.presence\(t\) == PeerPresence::Alive;/let lives = |_t: \&str| false;/'
FILE[no_tail]=$E/writer/work.rs;         SUB[no_tail]='s/if let Err\(e\) = l.refresh\(now_ms\) \{/if let Err(e) = Ok::<(), crate::ledger::LedgerError>(()) {/'
FILE[stand_down_gives_back]=$E/writer/key.rs; SUB[stand_down_gives_back]='s/        if departing \{/        if true {/'
# A pause that restarts the hang timer on every late round (issue 18,
# item 5): only the starvation faults show it.
FILE[pause_every_round]=$E/machine/mod.rs; SUB[pause_every_round]='s/if self.pause_restarted.as_ref\(\) != Some\(r\) \{/if true {/'
# Durability (issue 18, item 3), against the runs with file faults: a take
# granted before its line is on disk, refused lines dropped when we stop
# leading, or when we leave the key, a settle dropped while the ledger
# cannot be read, a fail-safe leader that records no done of its earlier
# take, or grants at once, an unreadable ledger granting at once, a line
# glued onto a fragment lost, and an epoch issued since our last look
# taken for the holder we saw.
L=crates/nip-le/src/ledger
FILE[take_unsynced]=$E/writer/work.rs;   SUB[take_unsynced]='s/match l.append_now\(&op\) \{/match l.append(\&op).or(Ok::<(), crate::error::Error>(())) {/'
FILE[loss_drops_lines]=$E/writer/work.rs; SUB[loss_drops_lines]='s/(and_then\(\|w\| w.ledger\) \{\n\s*)self.unwritten.keep\(l\);/${1}drop(l);/'
FILE[leave_drops_lines]=$E/writer/mod.rs; SUB[leave_drops_lines]='s/if !unwritten.is_empty\(\) \{/if false {/'
FILE[unsettled_lost]=$E/writer/unwritten.rs; SUB[unsettled_lost]='s/self.unsettled.push\(\(what, id.to_owned\(\), at_ms\)\);/let _ = (what, at_ms);/'
FILE[failsafe_done]=$E/writer/work.rs;   SUB[failsafe_done]='s/if !ctx.rules.profile.ledger \{\n(\s*)\/\/ Spec mode: no ledger applies./if !ctx.rules.profile.ledger || (self.work.is_none() \&\& leads) {\n${1}\/\/ Spec mode: no ledger applies./'
FILE[failsafe_take]=$E/writer/work.rs;   SUB[failsafe_take]='s/let waits = ctx.rules.profile.ledger/let waits = false \&\& ctx.rules.profile.ledger/'
FILE[unreadable_grants]=$L/index.rs;     SUB[unreadable_grants]='s/now_ms.saturating_sub\(unreadable_since\) > bound/true/'
FILE[glued_line]=$L/index.rs;            SUB[glued_line]='s/    \(at > 0\)\n/    (at > usize::MAX - 1)\n/'
FILE[unseen_epoch]=$E/machine/same_id.rs; SUB[unseen_epoch]='s/let stale_holder = self/let stale_holder = false \&\& self/'
# With power losses (a file fault too): a done or give-back not synced,
# refused lines flushed by an unsynced line without a sync, and a lead
# regained at a new epoch that drops the former epoch's refused lines.
# (Takes are not synced: with them synced as well, 0 of 300 seeds differ.)
FILE[done_not_synced]=$L/mod.rs;         SUB[done_not_synced]='s/matches!\(op, Op::Done \{ .. \} \| Op::GiveBack \{ .. \}\) \|\| !self.pending.is_empty\(\)/!self.pending.is_empty()/'
FILE[held_flush_unsynced]=$L/mod.rs;     SUB[held_flush_unsynced]='s/ \|\| !self.pending.is_empty\(\)\n/\n/'
FILE[regain_drops_lines]=$E/writer/work.rs; SUB[regain_drops_lines]='s/(simulator: a give-back lost so, its event never answered\).\n\s*)self.drop_work\(\);/${1}self.work = None;/'
# The work machine after a writer without a ledger (issue 30), with every
# fault kind drawn: what is queued after our first look owed only by its
# publishedMs, what our windows took and did not answer left to the
# floor, no `floor` line for the holders after us (counted, not failed:
# "published before it was replaced and answered after"); and a fail-safe
# take under a gone taker's higher epoch written without the give-back
# that lets the index apply it.
W=crates/nip-le/src/work
FILE[late_by_published]=$W/machine.rs;   SUB[late_by_published]='s/let late = \|id: &str\| first_look.is_some_and\(\|l\| l.late\(id\)\);/let late = |_id: \&str| false;/'
FILE[taken_left_to_floor]=$W/machine.rs; SUB[taken_left_to_floor]='s/let ours = \|id: &str\| index.is_some_and\(\|ix\| ix.state\(id\).is_some\(\)\);/let ours = |_id: \&str| false;/'
FILE[no_floor_line]=$W/machine.rs;       SUB[no_floor_line]='s/let floor = self.first_look.as_ref\(\)\?.floor\(\)\?;/let floor = self.first_look.as_ref()?.floor().filter(|_| false)?;/'
FILE[hidden_take]=$W/ledger_lines.rs;    SUB[hidden_take]='s/Some\(\(gone, _\)\) if gone > epoch => \{/Some((gone, _)) if false \&\& gone > epoch => {/'
declare -A RUNS
for d in late_by_published taken_left_to_floor no_floor_line hidden_take; do RUNS[$d]="extended::3000:- mixed::250:-"; done
for d in done_not_synced held_flush_unsynced regain_drops_lines take_unsynced loss_drops_lines leave_drops_lines unsettled_lost failsafe_done failsafe_take unreadable_grants glued_line unseen_epoch; do RUNS[$d]="extended::300:clocks mixed::250:clocks"; done
for d in no_fence fallback_always steal early_handover revoke_claim revoke_sibling; do RUNS[$d]="hosts:fall-back:200 hosts:stay-silent:60"; done
RUNS[pause_every_round]="extended::300:processes,holds,clocks,files,pids,children"
# Latency only: no invariant breaks; the spec cluster's claims tell it.
RUNS[spec_ticks]="extended::300 mixed::250 spec::300"

defects=("$@")
[ ${#defects[@]} -gt 0 ] || defects=(none regained lost hang leave handoff busy_renew hot_loop spec_ticks no_fence fallback_always steal early_handover revoke_claim revoke_sibling child_ledger child_rewrite take_back child_epoch no_wait unknown_holder spec_clears no_release_mark childs_take ledgerless_child done_fenced no_in_flight no_tail stand_down_gives_back pause_every_round take_unsynced loss_drops_lines leave_drops_lines unsettled_lost failsafe_done failsafe_take unreadable_grants glued_line unseen_epoch done_not_synced held_flush_unsynced regain_drops_lines late_by_published taken_left_to_floor no_floor_line hidden_take)
FILE[none]=; SUB[none]=
RUNS[none]="extended::300 mixed::250 spec::300 hosts:fall-back:200 hosts:stay-silent:60 extended::300:clocks mixed::250:clocks extended::3000:- mixed::250:-"
for d in "${defects[@]}"; do
  git checkout -q -- .
  [ "$d" = none ] || perl -0pi -e "${SUB[$d]}" "${FILE[$d]}"
  if [ "$d" != none ] && git diff --quiet; then
    echo "$d: the mutation no longer applies (${FILE[$d]} changed): update this script" >&2
    exit 1
  fi
  cargo build -q -p nip-le-cli
  for run in ${RUNS[$d]:-extended::300 mixed::250}; do
    IFS=: read -r cluster policy seeds without <<<"$run"
    flags=(--cluster "$cluster")
    [ -z "$policy" ] || flags+=(--policy "$policy")
    # `-`: every fault kind drawn.
    without="${without:-files,clocks}"
    [ "$without" = - ] || flags+=(--without "$without")
    out=$("$CARGO_TARGET_DIR/debug/nip-le" sim "${flags[@]}" --seeds "$seeds" --seconds 120 \
      2>/dev/null || true)
    n=$(grep -c 'failed:' <<<"$out" || true)
    first=$(grep -m1 'failed:' <<<"$out" || true)
    claims=$(grep -m1 '^claims:' <<<"$out" || true)
    again=$(grep -m1 -o '[0-9]* mentions published before it was replaced' <<<"$out" || true)
    echo "$d, $cluster${policy:+ $policy}: $n of $seeds seeds fail; first: ${first:-none}${claims:+; $claims}${again:+; $again and answered after}"
  done
done
