// The demo window's frontend: plain TypeScript, no framework.
import { invoke } from '@tauri-apps/api/core'
import { listen } from '@tauri-apps/api/event'
import { getCurrentWindow } from '@tauri-apps/api/window'
import {
  LeaderGate,
  claim,
  onAgent,
  status as leStatus,
  type ElectionStatus,
  type LeadershipChange,
  type SupervisedAgent
} from 'tauri-plugin-leader-election-api'

type Agent = { name: string; pubkey: string }
type Config = { agents: Agent[]; feedDir: string; staleMs: number; refreshMs: number; turnMs: number; instanceId: string; pid: number; supervised: string | null }
type Mention = { id: string; agent: string; text: string; from: string; atMs: number }
type Reply = { mention: string; agent: string; instanceId: string; atMs: number }

const $ = <T extends HTMLElement>(id: string): T => document.getElementById(id) as T
const short = (id: string | null | undefined): string => (id ? id.slice(0, 8) : '—')

let config: Config
let gate: LeaderGate
let statuses = new Map<string, ElectionStatus>()
let supervised = new Map<string, SupervisedAgent>()
const reacted = new Set<string>()
/** Every window queues every mention, per agent, in arrival order. */
const queues = new Map<string, Mention[]>()
/** The mention whose agent turn is running in this window, per agent. */
const thinking = new Map<string, string>()
/** Agents whose queue is being worked right now. */
const working = new Set<string>()
/** Agents whose queue was asked to be worked while it was. */
const rerun = new Set<string>()
/** Per agent, the leadership the queue was last filtered for. */
const filteredFor = new Map<string, number>()
/**
 * Per agent, what the ledger did not owe this window when it looked: done,
 * in flight with another window (owed once given back), or published before
 * a fail-safe lead (owed once this window holds the lock at an epoch). No
 * change event marks the last two: asked again every few seconds.
 */
const parked = new Map<string, Mention[]>()
let openMenu: string | null = null

function toast(text: string): void {
  const t = $('toast')
  t.textContent = text
  t.hidden = false
}

function renderSidebar(): void {
  const ul = $('agents')
  ul.replaceChildren()
  for (const a of config.agents) {
    const leads = gate.isLeader(a.pubkey)
    const li = document.createElement('li')
    li.className = `agent ${leads ? 'leader' : 'observer'}`
    li.dataset.testid = `agent-${a.pubkey}`
    li.dataset.leader = String(leads)
    li.innerHTML = `<span class="crown" data-testid="crown-${a.pubkey}">${leads ? '♛' : ''}</span><span class="name">${a.name}</span>`
    const more = document.createElement('button')
    more.className = 'more'
    more.textContent = '…'
    more.dataset.testid = `menu-${a.pubkey}`
    more.onclick = () => {
      openMenu = openMenu === a.pubkey ? null : a.pubkey
      renderSidebar()
    }
    li.append(more)
    if (openMenu === a.pubkey) {
      const menu = document.createElement('div')
      menu.className = 'menu'
      const title = document.createElement('div')
      title.className = 'title'
      title.textContent = 'Leadership'
      const item = document.createElement('button')
      item.dataset.testid = `claim-${a.pubkey}`
      item.textContent = leads ? 'This window leads' : `Lead from this window (${short(config.instanceId)})`
      item.disabled = leads
      item.onclick = async () => {
        openMenu = null
        renderSidebar()
        try {
          const outcome = await claim(a.pubkey)
          // No optimistic flip: the crown follows the leadership event.
          toast(`Claim for ${a.name}: ${outcome}`)
        } catch (e) {
          toast(`Claim failed: ${JSON.stringify(e)}`)
        }
      }
      menu.append(title, item)
      li.append(menu)
    }
    ul.append(li)
  }
}

function renderStatus(): void {
  const tbody = $('status-rows')
  tbody.replaceChildren()
  for (const a of config.agents) {
    const s = statuses.get(a.pubkey)
    const leads = gate.isLeader(a.pubkey)
    const age = s?.holder?.ageMs ?? null
    const live = age !== null && age <= config.staleMs
    const h = s?.holder
    // The devtools view: who holds it (instance id, pid, host, epoch), the
    // ledger this window keeps while it leads, and its agent process.
    const where = h ? ` pid ${h.pid}${h.host ? ` on ${h.host}` : ''}${h.epoch !== null ? ` epoch ${h.epoch}` : ''}` : ''
    const w = s?.work
    const p = supervised.get(a.pubkey)
    const proc = !p ? '—' : p.pid !== null ? `running, pid ${p.pid}` : p.last ? p.last.what.replace('_', ' ') : 'waiting to lead'
    const tr = document.createElement('tr')
    tr.dataset.testid = `status-${a.pubkey}`
    tr.innerHTML = `<td>${a.name}</td>
      <td class="${leads ? 'leader-role' : 'observer-role'}" data-testid="role-${a.pubkey}">${leads ? 'leader' : 'observer'}${s?.standingDown ? ' (standing down)' : ''}</td>
      <td data-testid="holder-${a.pubkey}">${short(h?.instanceId)}${h?.isUs ? ' (this window)' : ''}<small>${where}</small></td>
      <td>${age === null ? '—' : `${(age / 1000).toFixed(1)} s`}</td>
      <td class="${live ? 'live' : 'stale'}">${s?.lockState === 'record' ? (live ? 'live' : 'stale') : s?.lockState ?? '—'}</td>
      <td data-testid="work-${a.pubkey}">${w ? `${w.taken} in flight · ${w.done} done · ${w.givenBack} given back` : '—'}</td>
      <td data-testid="process-${a.pubkey}">${proc}</td>`
    tbody.append(tr)
  }
}

async function renderFeed(): Promise<void> {
  const snap = await invoke<{ mentions: Mention[]; replies: Reply[] }>('feed_snapshot')
  const replies = new Map<string, Reply[]>()
  for (const r of snap.replies) replies.set(r.mention, [...(replies.get(r.mention) ?? []), r])
  const ul = $('mentions')
  ul.replaceChildren()
  for (const m of [...snap.mentions].reverse()) {
    const rs = replies.get(m.id) ?? []
    const agent = config.agents.find((a) => a.pubkey === m.agent)
    const li = document.createElement('li')
    li.dataset.testid = `mention-${m.id}`
    li.dataset.replies = String(rs.length)
    const cls = rs.length === 1 ? 'replies-1' : rs.length === 0 ? 'replies-0' : 'replies-dup'
    li.innerHTML = `<b>@${agent?.name ?? short(m.agent)}</b> ${m.text} ${reacted.has(m.id) ? '👀' : ''}
      <span class="${cls}">— ${rs.length} repl${rs.length === 1 ? 'y' : 'ies'}${rs.length ? ` by ${rs.map((r) => short(r.instanceId)).join(', ')}` : ''}</span>`
    ul.append(li)
  }
}

async function refreshStatus(): Promise<void> {
  const s = await leStatus()
  statuses = new Map(s.agents.map((a) => [a.pubkey, a]))
  supervised = new Map(s.supervised.map((a) => [a.pubkey, a]))
  renderStatus()
}

function queueOf(agent: string): Mention[] {
  let q = queues.get(agent)
  if (!q) {
    q = []
    queues.set(agent, q)
  }
  return q
}

function renderQueue(): void {
  const ul = $('queue')
  ul.replaceChildren()
  for (const a of config.agents) {
    for (const m of queueOf(a.pubkey)) {
      const li = document.createElement('li')
      li.dataset.testid = `queued-${m.id}`
      const busy = thinking.get(a.pubkey) === m.id
      li.className = busy ? 'thinking' : ''
      li.textContent = `@${a.name}: ${m.text}${busy ? ' — thinking…' : ''}`
      ul.append(li)
    }
  }
}

/** The simulated agent turn: `turnMs` of "thinking", given up the moment this window stops leading. */
async function turn(agent: string): Promise<boolean> {
  const end = Date.now() + config.turnMs
  while (Date.now() < end) {
    if (!gate.isLeader(agent)) return false
    await new Promise((r) => setTimeout(r, 50))
  }
  return gate.isLeader(agent)
}

/**
 * Works `agent`'s queue while this window leads it, one turn at a time,
 * through the work ledger: what is owed after a change of leader, a take
 * before each turn, the reply, then done at once. Losing leadership mid-turn
 * cancels the turn (the gate gives the mention back to the next leader).
 */
async function work(agent: string): Promise<void> {
  // A supervised agent process answers this agent's mentions, not turns here.
  if (agent === config.supervised) return
  if (working.has(agent)) {
    rerun.add(agent)
    return
  }
  working.add(agent)
  try {
    while (gate.isLeader(agent) && queueOf(agent).length > 0) {
      const since = leaderSince.get(agent) ?? 0
      if (filteredFor.get(agent) !== since) {
        // A new leadership judges the whole queue, what was parked included.
        queues.set(agent, [...(parked.get(agent) ?? []), ...queueOf(agent)])
        const asked = queueOf(agent).slice()
        const owed = new Set(await gate.dispatchable(agent, asked.map((m) => ({ id: m.id, publishedMs: m.atMs }))))
        // Mentions that arrived while the ledger was asked were not in the
        // question: keep them (dropping them lost an owed mention).
        const askedIds = new Set(asked.map((m) => m.id))
        queues.set(agent, queueOf(agent).filter((m) => !askedIds.has(m.id) || owed.has(m.id)))
        parked.set(agent, asked.filter((m) => !owed.has(m.id)))
        filteredFor.set(agent, since)
        renderQueue()
        continue
      }
      const m = queueOf(agent)[0]
      const taken = await gate.take(agent, m.id)
      if (taken.outcome === 'done') {
        queueOf(agent).shift()
        continue
      }
      if (taken.outcome === 'not_leader') break
      if (taken.outcome === 'unavailable') {
        // The disk refuses the take: ask again in a moment.
        setTimeout(() => void work(agent), 1000)
        break
      }
      thinking.set(agent, m.id)
      renderQueue()
      const finished = await turn(agent)
      thinking.delete(agent)
      if (!finished) break
      // The last check, the reply and `done` happen in Rust, where the
      // reply is sent: the gate's view can lag the engine's under load.
      const sent = await invoke<boolean>('reply', { mention: m.id, agent })
      if (!sent) break
      gate.sent(agent, m.id) // `reply` recorded it done: no second done
      queueOf(agent).shift()
      renderQueue()
      await renderFeed()
    }
  } finally {
    working.delete(agent)
    renderQueue()
  }
  // A gain (or a mention) that came while this loop was winding down found
  // it running and returned: run again for it, or the queue waits for the
  // next mention.
  if (rerun.delete(agent)) void work(agent)
}

/** Asks the ledger again about what it did not owe: what it owes now goes back in the queue. */
async function recheckParked(agent: string): Promise<void> {
  const left = parked.get(agent) ?? []
  if (left.length === 0 || !gate.isLeader(agent) || filteredFor.get(agent) !== (leaderSince.get(agent) ?? 0)) return
  const owed = new Set(await gate.dispatchable(agent, left.map((m) => ({ id: m.id, publishedMs: m.atMs }))))
  if (owed.size === 0) return
  parked.set(agent, (parked.get(agent) ?? []).filter((m) => !owed.has(m.id)))
  queues.set(agent, [...left.filter((m) => owed.has(m.id)), ...queueOf(agent)])
  renderQueue()
  void work(agent)
}

/** Since when (the change's atMs) this window has led each agent. */
const leaderSince = new Map<string, number>()

async function onMention(m: Mention): Promise<void> {
  queueOf(m.agent).push(m)
  // NIP-LE (b): only the leader adds the 👀 reaction at queue acceptance.
  if (gate.mayReact(m.agent)) reacted.add(m.id)
  renderQueue()
  // NIP-LE (a): only the leader promotes queued events to agent turns.
  void work(m.agent)
  await renderFeed()
}

async function main(): Promise<void> {
  config = await invoke<Config>('demo_config')
  $('instance-id').textContent = config.instanceId
  $('pid').textContent = String(config.pid)
  gate = await LeaderGate.create()
  if (config.supervised) {
    // The supervised agent process of this window: its pid while it runs.
    const el = $('agent-process')
    el.closest('section')!.hidden = false
    await onAgent((r) => {
      el.dataset.pid = r.what === 'started' ? String(r.pid) : ''
      el.textContent = r.what === 'started' ? `running, pid ${r.pid}` : `${r.what.replace('_', ' ')} (pid ${'pid' in r ? r.pid : '—'})`
    })
  }
  // Every change this window saw, for the end-to-end tests.
  const log: LeadershipChange[] = []
  ;(window as unknown as { __leaderLog: LeadershipChange[] }).__leaderLog = log
  gate.subscribe((c: LeadershipChange) => {
    log.push(c)
    if (c.isLeader) {
      if (!leaderSince.has(c.pubkey)) leaderSince.set(c.pubkey, c.atMs)
      void work(c.pubkey)
    } else {
      leaderSince.delete(c.pubkey)
    }
    if (c.reason === 'claimed') toast(`This window now leads ${config.agents.find((a) => a.pubkey === c.pubkey)?.name}`)
    renderSidebar()
    void refreshStatus()
  })
  gate.onCancelTurn((pubkey, eventIds) => {
    const banner = $('banner')
    const gave = eventIds.length ? ` (${eventIds.length} mention${eventIds.length === 1 ? '' : 's'} handed back)` : ''
    banner.textContent = `Another window took over ${config.agents.find((a) => a.pubkey === pubkey)?.name}: this window's in-flight turn was cancelled${gave}.`
    banner.dataset.testid = 'banner'
    banner.hidden = false
  })
  await listen<Mention>('demo://mention', (e) => void onMention(e.payload))
  // As a client fetches recent events when it connects: queue them; the
  // ledger says which are still owed when this window leads.
  for (const m of (await invoke<{ mentions: Mention[] }>('feed_snapshot')).mentions) queueOf(m.agent).push(m)
  for (const a of config.agents) if (gate.isLeader(a.pubkey)) {
    leaderSince.set(a.pubkey, 0)
    void work(a.pubkey)
  }

  const composer = $('composer')
  for (const a of config.agents) {
    const b = document.createElement('button')
    b.textContent = `Mention @${a.name}`
    b.dataset.testid = `send-${a.pubkey}`
    b.onclick = () => void invoke('send_mention', { agent: a.pubkey, text: `hello @${a.name}` })
    composer.append(b)
  }
  $('spawn-child').onclick = async () => {
    const a = config.agents[0]
    const r = await invoke<{ instanceId: string; isLeader: boolean; pid: number; inherited: boolean }>('spawn_child', { pubkey: a.pubkey })
    $('child-result').textContent =
      `child pid ${r.pid}: instance id ${r.instanceId} (${r.instanceId === config.instanceId ? 'same as this window' : 'DIFFERENT'}), ` +
      `${r.isLeader ? 'leads' : 'observes'} ${a.name} (window: ${gate.isLeader(a.pubkey) ? 'leads' : 'observes'})`
  }

  // A normal close: the app exits and the plugin releases this window's locks.
  $('close-window').onclick = () => void getCurrentWindow().close()

  renderSidebar()
  renderQueue()
  await refreshStatus()
  await renderFeed()
  setInterval(() => void refreshStatus(), 1000)
  setInterval(() => void renderFeed(), 1000)
  setInterval(() => config.agents.forEach((a) => void recheckParked(a.pubkey)), 2000)
  document.body.dataset.ready = 'true'
}

void main()
