// The agent cards of the Buzz-shaped example (Buzz: the Agents page,
// `ManagedAgentActions.tsx`). Every card says whether this app runs the
// agent's harness; "Run here" claims the agent for this app process, which
// the election turns into: the other app stops its harness, then this one
// starts its own. The webview starts nothing itself: the app's Rust side
// runs the harness through the runner seam.
import { invoke } from '@tauri-apps/api/core'
import { LeaderGate, claim, instanceId, onAgent, status, type AgentReport } from 'tauri-plugin-leader-election-api'

type Card = { pubkey: string; name: string }

const harness = new Map<string, string>()
const $ = (id: string): HTMLElement => document.getElementById(id) as HTMLElement
const short = (pk: string): string => `${pk.slice(0, 8)}…${pk.slice(-4)}`

function showError(e: unknown): void {
  const p = $('error')
  p.textContent = String((e as { message?: string })?.message ?? e)
  p.hidden = false
}

function onReport(r: AgentReport): void {
  switch (r.what) {
    case 'started':
      harness.set(r.pubkey, `running here (pid ${r.pid})`)
      break
    case 'start_failed':
      harness.set(r.pubkey, r.busy ? 'waiting for the lease' : `cannot start: ${r.error}`)
      break
    default:
      harness.set(r.pubkey, 'not running here')
  }
}

async function main(): Promise<void> {
  $('instance-id').textContent = await instanceId()
  $('pid').textContent = String((await status()).pid)
  const gate = await LeaderGate.create()
  await onAgent(onReport)
  let cards: Card[] = []
  const render = (): void => {
    const root = $('cards')
    root.replaceChildren(
      ...cards.map((c) => {
        const el = document.createElement('article')
        el.className = 'card'
        el.dataset.testid = `card-${c.pubkey}`
        const leads = gate.isLeader(c.pubkey)
        const known = gate.knows(c.pubkey)
        el.innerHTML = `<h2></h2><code></code>
          <p><span class="role" data-testid="role-${c.pubkey}"></span>
          · <span data-testid="harness-${c.pubkey}"></span></p>
          <button data-testid="run-here-${c.pubkey}">Run here</button>
          <button data-testid="remove-${c.pubkey}">Delete</button>`
        el.querySelector('h2')!.textContent = c.name
        el.querySelector('code')!.textContent = short(c.pubkey)
        const role = el.querySelector('.role') as HTMLElement
        role.textContent = !known ? 'starting…' : leads ? 'runs here' : `runs in ${short(gate.holder(c.pubkey) ?? '?')}`
        role.classList.add(leads ? 'leader' : 'observer')
        el.querySelector(`[data-testid="harness-${c.pubkey}"]`)!.textContent = harness.get(c.pubkey) ?? 'not running here'
        const run = el.querySelector(`[data-testid="run-here-${c.pubkey}"]`) as HTMLButtonElement
        run.disabled = leads
        run.onclick = () => void claim(c.pubkey).catch(showError)
        const del = el.querySelector(`[data-testid="remove-${c.pubkey}"]`) as HTMLButtonElement
        del.onclick = () => void invoke('remove_agent', { pubkey: c.pubkey }).catch(showError)
        return el
      })
    )
  }
  gate.subscribe(render)
  await onAgent(render)
  const reload = async (): Promise<void> => {
    cards = await invoke<Card[]>('agents')
    await gate.refresh()
    render()
  }
  $('add').onsubmit = (ev) => {
    ev.preventDefault()
    const pubkey = ($('add-pubkey') as HTMLInputElement).value.trim().toLowerCase()
    const name = ($('add-name') as HTMLInputElement).value.trim() || short(pubkey)
    void invoke('add_agent', { pubkey, name }).then(reload).catch(showError)
  }
  $('quit').onclick = () => void invoke('quit')
  await reload()
  document.body.dataset.ready = 'true'
  setInterval(() => void reload().catch(showError), 1000)
}

main().catch(showError)
