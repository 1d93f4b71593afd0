import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest'
import { clearMocks, mockIPC } from '@tauri-apps/api/mocks'
import { emit } from '@tauri-apps/api/event'

import {
  AGENT_EVENT,
  CHANGED_EVENT,
  LeaderGate,
  claim,
  handleControlFrame,
  instanceId,
  isLeader,
  join,
  leave,
  onAgent,
  onLeadershipChanged,
  release,
  status,
  type AgentReport,
  type LeadershipChange,
  type Status
} from '../guest-js/index'

const A = 'a'.repeat(64)
const B = 'b'.repeat(64)

type Call = { cmd: string; args: unknown }
let calls: Call[] = []
let statusReply: Status

function change(pubkey: string, isLeader: boolean, reason: LeadershipChange['reason'], mustCancelTurn = false): LeadershipChange {
  return { pubkey, isLeader, leaderInstanceId: isLeader ? 'me' : 'other', reason, mustCancelTurn, epoch: null, atMs: Date.now() }
}

beforeEach(() => {
  calls = []
  statusReply = {
    instanceId: 'me',
    pid: 42,
    lockDir: '/tmp/locks',
    agents: [
      { pubkey: A, isLeader: true, lockState: 'record', holder: { instanceId: 'me', pid: 42, claimedAt: null, ageMs: 10, isUs: true }, standingDown: false, claimPending: false, lastError: null },
      { pubkey: B, isLeader: false, lockState: 'record', holder: { instanceId: 'other', pid: 7, claimedAt: null, ageMs: 10, isUs: false }, standingDown: false, claimPending: false, lastError: null }
    ]
  }
  mockIPC(
    (cmd, args) => {
      calls.push({ cmd, args })
      switch (cmd) {
        case 'plugin:leader-election|is_leader':
          return true
        case 'plugin:leader-election|claim':
          return 'pending'
        case 'plugin:leader-election|release':
          return true
        case 'plugin:leader-election|status':
          return statusReply
        case 'plugin:leader-election|instance_id':
          return 'me'
        case 'plugin:leader-election|join':
          return false
        case 'plugin:leader-election|leave':
          return null
        case 'plugin:leader-election|handle_control_frame':
          return { type: 'claim_leadership', status: 'claimed' }
        case 'plugin:leader-election|take':
          return { outcome: 'granted', epoch: 7 }
        case 'plugin:leader-election|done':
          return true
        case 'plugin:leader-election|give_back':
          return null
        case 'plugin:leader-election|owed':
          return (args as { queue: { id: string }[] }).queue.map((e) => e.id).filter((id) => id !== 'answered')
        default:
          return undefined
      }
    },
    { shouldMockEvents: true }
  )
})

afterEach(() => {
  clearMocks()
})

const pluginCalls = (): Call[] => calls.filter((c) => c.cmd.startsWith('plugin:leader-election|'))

describe('command wrappers', () => {
  it('invoke the plugin commands with their arguments', async () => {
    expect(await isLeader(A)).toBe(true)
    expect(await claim(A)).toBe('pending')
    expect(await release(A)).toBe(true)
    expect(await instanceId()).toBe('me')
    expect(await join(B)).toBe(false)
    await leave(B)
    expect((await status()).instanceId).toBe('me')
    expect(pluginCalls().map((c) => c.cmd)).toEqual([
      'plugin:leader-election|is_leader',
      'plugin:leader-election|claim',
      'plugin:leader-election|release',
      'plugin:leader-election|instance_id',
      'plugin:leader-election|join',
      'plugin:leader-election|leave',
      'plugin:leader-election|status'
    ])
    expect(pluginCalls()[0].args).toEqual({ pubkey: A })
    expect(pluginCalls()[4].args).toEqual({ pubkey: B })
  })

  it('handleControlFrame sends frames as strings and returns the result to send', async () => {
    const frame = { type: 'claim_leadership', targetInstanceId: 'me' }
    expect(await handleControlFrame(A, frame)).toEqual({ type: 'claim_leadership', status: 'claimed' })
    expect(await handleControlFrame(A, JSON.stringify(frame))).toEqual({ type: 'claim_leadership', status: 'claimed' })
    const sent = pluginCalls().map((c) => c.args as { pubkey: string; frame: string })
    expect(sent[0]).toEqual({ pubkey: A, frame: JSON.stringify(frame) })
    expect(sent[1]).toEqual(sent[0])
  })

  it('onLeadershipChanged delivers payloads until unlistened', async () => {
    const seen: LeadershipChange[] = []
    const unlisten = await onLeadershipChanged((c) => seen.push(c))
    await emit(CHANGED_EVENT, change(A, false, 'lost'))
    unlisten()
    await emit(CHANGED_EVENT, change(A, true, 'acquired'))
    expect(seen).toHaveLength(1)
    expect(seen[0].reason).toBe('lost')
  })

  it('onAgent delivers supervised agent reports until unlistened', async () => {
    const seen: AgentReport[] = []
    const unlisten = await onAgent((r) => seen.push(r))
    await emit(AGENT_EVENT, { pubkey: A, atMs: 1, what: 'started', pid: 42 })
    await emit(AGENT_EVENT, { pubkey: A, atMs: 2, what: 'stopped', pid: 42, killed: false })
    unlisten()
    await emit(AGENT_EVENT, { pubkey: A, atMs: 3, what: 'started', pid: 43 })
    expect(seen.map((r) => r.what)).toEqual(['started', 'stopped'])
  })
})

describe('LeaderGate', () => {
  it('starts from status, then follows events with no IPC per check', async () => {
    const gate = await LeaderGate.create()
    expect(gate.isLeader(A)).toBe(true)
    expect(gate.isLeader(B)).toBe(false)
    expect(gate.isLeader(A.toUpperCase())).toBe(true)
    expect(gate.holder(B)).toBe('other')
    const before = pluginCalls().length
    for (let i = 0; i < 1000; i++) {
      gate.mayDispatch(A)
      gate.mayReact(A)
      gate.mayHeartbeat(A)
    }
    expect(pluginCalls().length).toBe(before)

    await emit(CHANGED_EVENT, change(B, true, 'claimed'))
    expect(gate.mayDispatch(B)).toBe(true)
    expect(gate.holder(B)).toBe('me')
    await emit(CHANGED_EVENT, change(A, false, 'lost'))
    expect(gate.mayDispatch(A)).toBe(false)
    expect(gate.mayReact(A)).toBe(false)
    expect(gate.mayHeartbeat(A)).toBe(false)
    gate.dispose()
    await emit(CHANGED_EVENT, change(A, true, 'acquired'))
    expect(gate.isLeader(A)).toBe(false)
  })

  it('answers false for agents it does not know', async () => {
    const gate = await LeaderGate.create()
    expect(gate.knows('c'.repeat(64))).toBe(false)
    expect(gate.mayDispatch('c'.repeat(64))).toBe(false)
    gate.dispose()
  })

  it('tells the window to cancel its in-flight turn on a hard-steal', async () => {
    const gate = await LeaderGate.create()
    const cancelled = vi.fn()
    const changes = vi.fn()
    gate.onCancelTurn(cancelled)
    const unsubscribe = gate.subscribe(changes)
    await emit(CHANGED_EVENT, change(A, false, 'stood_down', true))
    expect(cancelled).toHaveBeenCalledWith(A, [])
    expect(gate.isLeader(A)).toBe(false)
    await emit(CHANGED_EVENT, change(B, false, 'lost'))
    expect(cancelled).toHaveBeenCalledTimes(1)
    expect(changes).toHaveBeenCalledTimes(2)
    unsubscribe()
    await emit(CHANGED_EVENT, change(B, true, 'failover'))
    expect(changes).toHaveBeenCalledTimes(2)
    gate.dispose()
  })

  it('takes an event with the publication time its queue gave, so the ledger can mark the answer settled', async () => {
    const gate = await LeaderGate.create()
    expect(await gate.dispatchable(A, [{ id: 'e3', publishedMs: 42 }, { id: 'e4' }])).toEqual(['e3', 'e4'])
    await gate.take(A, 'e3')
    await gate.take(A, 'e4')
    await gate.take(A, 'e5', 7)
    const takes = pluginCalls().filter((c) => c.cmd === 'plugin:leader-election|take').slice(-3)
    expect(takes.map((c) => c.args)).toEqual([
      { pubkey: A, eventId: 'e3', publishedMs: 42 },
      { pubkey: A, eventId: 'e4' },
      { pubkey: A, eventId: 'e5', publishedMs: 7 },
    ])
    gate.dispose()
  })

  it('takes, completes and gives back work, and gives back the in-flight turn on a hard-steal', async () => {
    const gate = await LeaderGate.create()
    // Not the leader of B: no IPC, no take.
    const before = pluginCalls().length
    expect(await gate.take(B, 'e0')).toEqual({ outcome: 'not_leader' })
    expect(await gate.dispatchable(B, [{ id: 'e0' }])).toEqual([])
    expect(pluginCalls().length).toBe(before)
    // The leader of A: what it owes, then a turn.
    expect(await gate.dispatchable(A.toUpperCase(), [{ id: 'e1' }, { id: 'answered', publishedMs: 5 }, { id: 'e2' }])).toEqual(['e1', 'e2'])
    expect(await gate.take(A, 'e1')).toEqual({ outcome: 'granted', epoch: 7 })
    expect(await gate.take(A, 'e2')).toEqual({ outcome: 'granted', epoch: 7 })
    expect(gate.inFlightOf(A)).toEqual(['e1', 'e2'])
    expect(await gate.done(A, 'e1')).toBe(true)
    expect(gate.inFlightOf(A)).toEqual(['e2'])
    const owedCall = pluginCalls().find((c) => c.cmd === 'plugin:leader-election|owed')
    expect(owedCall?.args).toEqual({ pubkey: A, queue: [{ id: 'e1' }, { id: 'answered', publishedMs: 5 }, { id: 'e2' }] })
    const takeCall = pluginCalls().find((c) => c.cmd === 'plugin:leader-election|take')
    expect(takeCall?.args).toEqual({ pubkey: A, eventId: 'e1' })

    // Hard-steal mid-turn: e2 is given back and the cancel callback is told.
    const cancelled = vi.fn()
    gate.onCancelTurn(cancelled)
    await emit(CHANGED_EVENT, change(A, false, 'stood_down', true))
    expect(cancelled).toHaveBeenCalledWith(A, ['e2'])
    expect(gate.inFlightOf(A)).toEqual([])
    await new Promise((r) => setTimeout(r, 0))
    const given = pluginCalls().filter((c) => c.cmd === 'plugin:leader-election|give_back')
    expect(given.map((c) => c.args)).toEqual([{ pubkey: A, eventId: 'e2' }])
    gate.dispose()
  })

  it('forgets a turn the Rust side recorded done, with no IPC, and gives back only the rest on a hard-steal', async () => {
    const gate = await LeaderGate.create()
    expect(await gate.take(A, 'e1')).toEqual({ outcome: 'granted', epoch: 7 })
    expect(await gate.take(A, 'e2')).toEqual({ outcome: 'granted', epoch: 7 })
    const before = pluginCalls().length
    gate.sent(A.toUpperCase(), 'e1') // send_reply called Work::done in Rust
    expect(pluginCalls().length).toBe(before)
    expect(gate.inFlightOf(A)).toEqual(['e2'])
    await emit(CHANGED_EVENT, change(A, false, 'stood_down', true))
    await new Promise((r) => setTimeout(r, 0))
    const given = pluginCalls().filter((c) => c.cmd === 'plugin:leader-election|give_back')
    expect(given.map((c) => c.args)).toEqual([{ pubkey: A, eventId: 'e2' }])
    expect(pluginCalls().some((c) => c.cmd === 'plugin:leader-election|done')).toBe(false)
    gate.dispose()
  })

  it('keeps an event that arrives while its status read is in flight', async () => {
    let releaseStatus: (s: Status) => void = () => {}
    clearMocks()
    mockIPC(
      (cmd) => {
        if (cmd === 'plugin:leader-election|status') {
          return new Promise<Status>((resolve) => {
            releaseStatus = resolve
          })
        }
        return undefined
      },
      { shouldMockEvents: true }
    )
    const creating = LeaderGate.create()
    await new Promise((r) => setTimeout(r, 0))
    // A change lands before the (older) status snapshot does.
    await emit(CHANGED_EVENT, change(A, false, 'stood_down', true))
    releaseStatus(statusReply) // says A leads: stale
    const gate = await creating
    expect(gate.isLeader(A)).toBe(false)
    expect(gate.isLeader(B)).toBe(false)
    gate.dispose()
  })
})
