/**
 * TypeScript bindings for tauri-plugin-leader-election (NIP-LE).
 *
 * Several windows of an app signed in with the same agent identity elect one
 * prompter per agent. Gate the three leader-only paths (NIP-LE (a)–(c)):
 * prompt dispatch, the 👀 acknowledgement reaction and the heartbeat
 * self-prompt, with a {@link LeaderGate}, which answers from events without an
 * IPC round trip. Rendering and the message queue are never gated.
 *
 * Outside Tauri (the same frontend in a plain browser) every call answers as
 * a solo instance that leads every agent (the NIP's fail-safe), after one
 * console warning.
 *
 * @module
 */

import { invoke } from '@tauri-apps/api/core'
import { listen, type UnlistenFn } from '@tauri-apps/api/event'

import { SOLO_ID, solo, soloJoin, soloLeave, soloStatus } from './solo'
import type { AgentEvent } from './bindings/AgentEvent'
import type { AgentReport } from './bindings/AgentReport'
import type { ChangeReason } from './bindings/ChangeReason'
import type { ClaimOutcome } from './bindings/ClaimOutcome'
import type { ControlResult } from './bindings/ControlResult'
import type { ElectionStatus } from './bindings/ElectionStatus'
import type { ErrorKind } from './bindings/ErrorKind'
import type { GlobalHolder } from './bindings/GlobalHolder'
import type { GlobalStatus } from './bindings/GlobalStatus'
import type { HolderStatus } from './bindings/HolderStatus'
import type { LeaderElectionError } from './bindings/LeaderElectionError'
import type { LeadershipChange } from './bindings/LeadershipChange'
import type { Level } from './bindings/Level'
import type { LockState } from './bindings/LockState'
import type { QueuedEvent } from './bindings/QueuedEvent'
import type { StateCounts } from './bindings/StateCounts'
import type { Status } from './bindings/Status'
import type { SupervisedAgent } from './bindings/SupervisedAgent'
import type { TakeOutcome } from './bindings/TakeOutcome'

export type {
  AgentEvent,
  AgentReport,
  ChangeReason,
  ClaimOutcome,
  ControlResult,
  ElectionStatus,
  ErrorKind,
  GlobalHolder,
  GlobalStatus,
  HolderStatus,
  LeaderElectionError,
  LeadershipChange,
  Level,
  LockState,
  QueuedEvent,
  StateCounts,
  Status,
  SupervisedAgent,
  TakeOutcome
}

/** The event emitted to every webview on each leadership change. */
export const CHANGED_EVENT = 'leader-election://changed'

/** The event emitted to every webview when an agent process the app supervises (Rust: `supervise_agent`) starts, exits or is stopped. */
export const AGENT_EVENT = 'leader-election://agent'

const cmd = (name: string): string => `plugin:leader-election|${name}`

/** Whether this window is the prompter for `pubkey` (one IPC round trip; use a {@link LeaderGate} on hot paths): `false` for an agent this window has not joined, as the gate answers. Rejects with a {@link LeaderElectionError} for an invalid key. */
export async function isLeader(pubkey: string): Promise<boolean> {
  if (solo()) return true
  return await invoke<boolean>(cmd('is_leader'), { pubkey })
}

/** "This window wants to lead" (the sidebar's claim). Co-located windows hand over without a relay. */
export async function claim(pubkey: string): Promise<ClaimOutcome> {
  if (solo()) return 'already_leader'
  return await invoke<ClaimOutcome>(cmd('claim'), { pubkey })
}

/** Releases this window's lock (if it holds it) and stands down for the stand-down timeout. Resolves to whether a claim was released. */
export async function release(pubkey: string): Promise<boolean> {
  if (solo()) return false
  return await invoke<boolean>(cmd('release'), { pubkey })
}

/** This window's view of every agent it has joined. */
export async function status(): Promise<Status> {
  if (solo()) return soloStatus()
  return await invoke<Status>(cmd('status'))
}

/** This window's instance id: hand it to spawned agent processes as `BUZZ_INSTANCE_ELECTION_ID`. */
export async function instanceId(): Promise<string> {
  if (solo()) return SOLO_ID
  return await invoke<string>(cmd('instance_id'))
}

/** Joins an agent's election (claims at once). Resolves to whether this window leads it. */
export async function join(pubkey: string): Promise<boolean> {
  if (solo()) {
    soloJoin(pubkey)
    return true
  }
  return await invoke<boolean>(cmd('join'), { pubkey })
}

/** Leaves an agent's election, releasing its lock if this window holds it. */
export async function leave(pubkey: string): Promise<void> {
  if (solo()) {
    soloLeave(pubkey)
    return
  }
  await invoke<null>(cmd('leave'), { pubkey })
}

/**
 * Hands a relay-delivered control frame (kind 24200, decrypted content) to
 * the engine. Check NIP-AO authorisation first: only the agent's owner may
 * send control frames. Resolves to the `control_result` to send back, or
 * `null` when there is nothing to send yet (a later `claimed` change says
 * when the claim completed).
 */
export async function handleControlFrame(
  pubkey: string,
  frame: string | Record<string, unknown>
): Promise<ControlResult | null> {
  if (solo()) return null
  return await invoke<ControlResult | null>(cmd('handle_control_frame'), {
    pubkey,
    frame: typeof frame === 'string' ? frame : JSON.stringify(frame)
  })
}

/**
 * Work ledger: takes `eventId` for an agent turn. Dispatch only when the
 * outcome is `granted`: it is granted to the leader alone, at its current
 * epoch, and only if the event is neither done nor taken now, once its line
 * is on disk. `unavailable`: the disk refuses the take for now (full,
 * failing, read-only); keep the event queued and ask again in a moment.
 * `too_many_open`: this page (256) or app process (1,024) holds as many
 * unsettled takes of the agent as it may; settle some first.
 * `ledger_full`: the ledger may not grow and nothing in it may go yet; ask
 * again later. Pass `publishedMs` (the event's `created_at`, ms) when known:
 * the ledger can then mark the answer settled instead of keeping its id, so a
 * busy agent's ledger stays bounded without forgetting an answer.
 */
export async function take(pubkey: string, eventId: string, publishedMs?: number): Promise<TakeOutcome> {
  if (solo()) return { outcome: 'granted', epoch: null }
  const args = publishedMs === undefined ? { pubkey, eventId } : { pubkey, eventId, publishedMs }
  return await invoke<TakeOutcome>(cmd('take'), args)
}

/**
 * Work ledger: the reply to `eventId` was sent. Call it right after sending,
 * whatever the leadership is by then: the window that took the event may
 * record it although leadership moved while the reply was on its way.
 * Resolves to `false` when this window neither took it nor leads. Rejects
 * with kind `not_taken` when no page of this app process holds a take of it
 * (never taken here, already settled, or given back when its page went):
 * a page settles only its own process's takes. Rejects with kind
 * `not_durable` when the `done` took effect but the disk has not made it
 * durable yet (refused the write: it is written as soon as the disk takes
 * one; or failed to sync it): never send the reply again because of it.
 */
export async function done(pubkey: string, eventId: string): Promise<boolean> {
  if (solo()) return true
  return await invoke<boolean>(cmd('done'), { pubkey, eventId })
}

/**
 * Work ledger: the turn for `eventId` was cancelled; it is owed again, to
 * whoever leads. Until then the event stays in flight with this window
 * (nobody else is owed it); a page that reloads or closes gives its takes
 * back by itself. Rejects with kind `not_taken`, as {@link done} does, for an
 * event no page of this process holds.
 */
export async function giveBack(pubkey: string, eventId: string): Promise<void> {
  if (solo()) return
  await invoke<null>(cmd('give_back'), { pubkey, eventId })
}

/** Work ledger: of `queue` (in order), the events this window must dispatch now (none unless it leads). */
export async function owed(pubkey: string, queue: QueuedEvent[]): Promise<string[]> {
  if (solo()) return queue.map((e) => e.id)
  return await invoke<string[]>(cmd('owed'), { pubkey, queue })
}

/** Calls `cb` on every leadership change of this window. Resolves to the function that stops listening. */
export async function onLeadershipChanged(
  cb: (change: LeadershipChange) => void
): Promise<UnlistenFn> {
  if (solo()) return () => {}
  return await listen<LeadershipChange>(CHANGED_EVENT, (e) => {
    cb(e.payload)
  })
}

/** Calls `cb` whenever a supervised agent process starts, exits or is stopped (with its pid). Resolves to the function that stops listening. */
export async function onAgent(cb: (report: AgentReport) => void): Promise<UnlistenFn> {
  if (solo()) return () => {}
  return await listen<AgentReport>(AGENT_EVENT, (e) => {
    cb(e.payload)
  })
}

/**
 * Keeps the current answer per agent from events, so the leader-only paths
 * cost no IPC round trip:
 *
 * ```ts
 * const gate = await LeaderGate.create()
 * gate.onCancelTurn((pubkey) => cancelInFlightTurn(pubkey)) // hard-steal
 * if ((await gate.take(agent, event.id)).outcome === 'granted') dispatchPrompt(event)
 * if (gate.mayReact(agent)) addEyesReaction(event)
 * if (gate.mayHeartbeat(agent)) runHeartbeat()
 * ```
 *
 * An agent this window has not joined answers `false` (join it first); outside
 * Tauri every agent answers `true` (a solo instance).
 */
export class LeaderGate {
  private readonly leaders = new Map<string, boolean>()
  private readonly holders = new Map<string, string | null>()
  private readonly subscribers = new Set<(change: LeadershipChange) => void>()
  private readonly cancelSubscribers = new Set<(pubkey: string, eventIds: string[]) => void>()
  /** Events taken and not yet done or given back, per agent. */
  private readonly inFlight = new Map<string, Set<string>>()
  /** When each event of the last queue given to `dispatchable` was published, per agent. */
  private readonly published = new Map<string, Map<string, number>>()
  private unlisten: UnlistenFn | null = null

  private constructor() {}

  /** Starts listening, then reads the current status once. */
  static async create(): Promise<LeaderGate> {
    const gate = new LeaderGate()
    gate.unlisten = await onLeadershipChanged((c) => {
      gate.apply(c)
    })
    await gate.refresh()
    return gate
  }

  /**
   * Re-reads `status()` (e.g. after a lagging event stream). Agents that
   * changed while the read was in flight keep the newer answer from events.
   */
  async refresh(): Promise<void> {
    const seen = new Set<string>()
    const track = (c: LeadershipChange): void => {
      seen.add(c.pubkey)
    }
    this.subscribers.add(track)
    try {
      const s = await status()
      for (const a of s.agents) {
        if (!seen.has(a.pubkey)) {
          this.leaders.set(a.pubkey, a.isLeader)
          this.holders.set(a.pubkey, a.holder?.instanceId ?? null)
        }
      }
    } finally {
      this.subscribers.delete(track)
    }
  }

  /** The cached answer for `pubkey` (no IPC); `true` outside Tauri (solo). */
  isLeader(pubkey: string): boolean {
    return this.leaders.get(pubkey.toLowerCase()) ?? solo()
  }

  /** NIP-LE (a): may this window promote queued events to agent prompts? */
  mayDispatch(pubkey: string): boolean {
    return this.isLeader(pubkey)
  }

  /** NIP-LE (b): may this window add the 👀 reaction at queue acceptance? */
  mayReact(pubkey: string): boolean {
    return this.isLeader(pubkey)
  }

  /** NIP-LE (c): may this window fire the autonomous heartbeat prompt? */
  mayHeartbeat(pubkey: string): boolean {
    return this.isLeader(pubkey)
  }

  /** Whether this gate has an answer for `pubkey` (i.e. the agent is joined). */
  knows(pubkey: string): boolean {
    return this.leaders.has(pubkey.toLowerCase())
  }

  /** The instance id of the window that holds `pubkey`'s lock, when known. */
  holder(pubkey: string): string | null {
    return this.holders.get(pubkey.toLowerCase()) ?? null
  }

  /** Every change, after the gate has applied it. Returns an unsubscribe function. */
  subscribe(cb: (change: LeadershipChange) => void): () => void {
    this.subscribers.add(cb)
    return () => this.subscribers.delete(cb)
  }

  /**
   * Called when this window must cancel its in-flight turn (hard-steal),
   * with the events it had taken: the gate has already given them back, so
   * the new leader answers them.
   */
  onCancelTurn(cb: (pubkey: string, eventIds: string[]) => void): () => void {
    this.cancelSubscribers.add(cb)
    return () => this.cancelSubscribers.delete(cb)
  }

  /**
   * Of `queue` (the agent's queued events, in order), the ones this window
   * must dispatch now. Call it on every change that makes this window
   * leader, then `take` each before dispatching it.
   */
  async dispatchable(pubkey: string, queue: QueuedEvent[]): Promise<string[]> {
    if (!this.isLeader(pubkey)) return []
    const times = new Map<string, number>()
    for (const e of queue) if (e.publishedMs != null) times.set(e.id, e.publishedMs)
    this.published.set(pubkey.toLowerCase(), times)
    return await owed(pubkey.toLowerCase(), queue)
  }

  /**
   * Takes `eventId` for a turn (see {@link take}) and tracks it as in flight.
   * Its publication time is the one the last {@link dispatchable} queue gave,
   * unless `publishedMs` says.
   */
  async take(pubkey: string, eventId: string, publishedMs?: number): Promise<TakeOutcome> {
    const key = pubkey.toLowerCase()
    if (!this.isLeader(key)) return { outcome: 'not_leader' }
    const outcome = await take(key, eventId, publishedMs ?? this.published.get(key)?.get(eventId))
    if (outcome.outcome === 'granted') this.flying(key).add(eventId)
    return outcome
  }

  /** The reply to `eventId` was sent (see {@link done}). */
  async done(pubkey: string, eventId: string): Promise<boolean> {
    const key = pubkey.toLowerCase()
    this.flying(key).delete(eventId)
    return await done(key, eventId)
  }

  /**
   * The reply to `eventId` was sent, and recorded done by the app's Rust
   * side (the command that sent it called `Work::done` right after the
   * send, as the README's `reply` command does): the gate stops tracking it
   * as in flight, with no IPC. {@link LeaderGate.done} would record it again.
   */
  sent(pubkey: string, eventId: string): void {
    this.flying(pubkey.toLowerCase()).delete(eventId)
  }

  /** Gives `eventId` back after a cancelled turn (see {@link giveBack}). */
  async giveBack(pubkey: string, eventId: string): Promise<void> {
    const key = pubkey.toLowerCase()
    this.flying(key).delete(eventId)
    await giveBack(key, eventId)
  }

  /** The events this window has taken for `pubkey` and not yet completed. */
  inFlightOf(pubkey: string): string[] {
    return [...this.flying(pubkey.toLowerCase())]
  }

  private flying(key: string): Set<string> {
    let s = this.inFlight.get(key)
    if (!s) {
      s = new Set()
      this.inFlight.set(key, s)
    }
    return s
  }

  /** Stops listening. */
  dispose(): void {
    this.unlisten?.()
    this.unlisten = null
  }

  private apply(c: LeadershipChange): void {
    this.leaders.set(c.pubkey, c.isLeader)
    this.holders.set(c.pubkey, c.leaderInstanceId)
    for (const s of [...this.subscribers]) s(c)
    if (c.mustCancelTurn) {
      const ids = this.inFlightOf(c.pubkey)
      this.inFlight.delete(c.pubkey)
      // Owed again: whoever leads now answers them.
      for (const id of ids) void giveBack(c.pubkey, id).catch(() => {})
      for (const s of [...this.cancelSubscribers]) s(c.pubkey, ids)
    }
  }
}
