import { describe, expect, it, vi } from 'vitest'

import {
  LeaderGate,
  claim,
  done,
  handleControlFrame,
  instanceId,
  isLeader,
  join,
  leave,
  onAgent,
  onLeadershipChanged,
  owed,
  release,
  status,
  take
} from '../guest-js/index'

const A = 'a'.repeat(64)

// No mockIPC here: this is the frontend in a plain browser.
describe('outside Tauri', () => {
  it('answers as a solo instance that leads every agent, with one warning', async () => {
    const warn = vi.spyOn(console, 'warn').mockImplementation(() => {})
    expect((globalThis as { __TAURI_INTERNALS__?: unknown }).__TAURI_INTERNALS__).toBeUndefined()
    expect(await join(A)).toBe(true)
    expect(await isLeader(A)).toBe(true)
    expect(await isLeader('b'.repeat(64))).toBe(true)
    expect(await claim(A)).toBe('already_leader')
    expect(await instanceId()).toBe('solo')
    const s = await status()
    expect(s.agents.map((a) => [a.pubkey, a.isLeader])).toEqual([[A, true]])
    expect(await take(A, 'e1')).toEqual({ outcome: 'granted', epoch: null })
    expect(await done(A, 'e1')).toBe(true)
    expect(await owed(A, [{ id: 'e1', publishedMs: 1 }, { id: 'e2', publishedMs: 2 }])).toEqual(['e1', 'e2'])
    expect(await handleControlFrame(A, { type: 'claim_leadership', targetInstanceId: 'x' })).toBeNull()
    expect(await release(A)).toBe(false)
    const unlisten = await onLeadershipChanged(() => {})
    unlisten()
    const unlistenAgents = await onAgent(() => {})
    unlistenAgents()
    const gate = await LeaderGate.create()
    expect(gate.isLeader(A)).toBe(true)
    expect(gate.mayDispatch('c'.repeat(64))).toBe(true)
    expect(gate.mayReact(A) && gate.mayHeartbeat(A)).toBe(true)
    expect((await gate.take(A, 'e3')).outcome).toBe('granted')
    await leave(A)
    expect((await status()).agents).toEqual([])
    expect(warn).toHaveBeenCalledTimes(1)
    expect(String(warn.mock.calls[0][0])).toContain('solo instance')
    gate.dispose()
    warn.mockRestore()
  })
})
