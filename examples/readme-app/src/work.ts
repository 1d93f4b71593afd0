import { invoke } from '@tauri-apps/api/core'
import { LeaderGate, type QueuedEvent } from 'tauri-plugin-leader-election-api'

// A stand-in for your agent's turn (null: cancelled); console.log marks your app's other parts.
const runTurn = async (agent: string, id: string): Promise<string | null> => `${agent}: re ${id}`
const queues = new Map<string, QueuedEvent[]>() // every window queues every mention

async function work(gate: LeaderGate, agent: string): Promise<void> { // (a) dispatch what is owed
  for (const id of await gate.dispatchable(agent, queues.get(agent) ?? [])) {
    if ((await gate.take(agent, id)).outcome !== 'granted') continue // done, taken, or not leading
    const text = await runTurn(agent, id)
    const sent = text !== null && (await invoke<boolean>('reply', { agent, id, text }).catch(() => false))
    if (sent) gate.sent(agent, id) // `reply` recorded it done
    else await gate.giveBack(agent, id) // owed again, to whoever leads
  }
}

/** Starts the gate; resolves to the function to call with each mention ({ id, publishedMs }). */
export async function start(): Promise<(agent: string, e: QueuedEvent) => void> {
  const gate = await LeaderGate.create() // listens, then reads status() once
  gate.subscribe((c) => { if (c.isLeader) void work(gate, c.pubkey) }) // each change that makes us lead
  gate.onCancelTurn((agent) => console.log('cancel the turn of', agent)) // its events are given back
  setInterval(() => queues.forEach((_, agent) => void work(gate, agent)), 5_000) // given back elsewhere
  setInterval(() => queues.forEach((_, a) => gate.mayHeartbeat(a) && console.log('heartbeat', a)), 60_000) // (c)
  return function onMention(agent, e) {
    queues.set(agent, [...(queues.get(agent) ?? []), e])
    if (gate.mayReact(agent)) console.log('add 👀 to', e.id) // (b)
    void work(gate, agent)
  }
}
