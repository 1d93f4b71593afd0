/**
 * Outside Tauri (the same frontend served to a plain browser, or a test
 * without IPC mocks) there is no election to ask: the bindings answer as a
 * solo instance, the NIP's fail-safe, which leads every agent. One console
 * warning says so, the first time.
 *
 * @module
 */

import type { ElectionStatus } from './bindings/ElectionStatus'
import type { Status } from './bindings/Status'

let warned = false

/** Whether there is no Tauri IPC here (checked at every call: test mocks install it late). */
export function solo(): boolean {
  const here = globalThis as { __TAURI_INTERNALS__?: unknown }
  if (here.__TAURI_INTERNALS__ !== undefined) return false
  if (!warned) {
    warned = true
    console.warn(
      'tauri-plugin-leader-election: not running inside Tauri; answering as a solo instance that leads every agent (NIP-LE fail-safe)'
    )
  }
  return true
}

/** The agents joined in this page while solo. */
const joined = new Set<string>()

/** Remembers `pubkey` as joined (solo). */
export function soloJoin(pubkey: string): void {
  joined.add(pubkey.toLowerCase())
}

/** Forgets `pubkey` (solo). */
export function soloLeave(pubkey: string): void {
  joined.delete(pubkey.toLowerCase())
}

/** The id of this solo page. */
export const SOLO_ID = 'solo'

/** The status of a solo instance: it leads every agent joined here. */
export function soloStatus(): Status {
  const agents: ElectionStatus[] = [...joined].map((pubkey) => ({
    pubkey,
    isLeader: true,
    lockState: 'absent',
    holder: null,
    standingDown: false,
    claimPending: false,
    lastError: null,
    level: 'host',
    global: null,
    work: null,
    workDegraded: null
  }))
  return { instanceId: SOLO_ID, pid: 0, networkFs: null, agents, supervised: [] }
}
