// The demo window's frontend: plain TypeScript, no framework.
import { invoke } from '@tauri-apps/api/core'
import { listen } from '@tauri-apps/api/event'
import { getCurrentWindow } from '@tauri-apps/api/window'
import {
  LeaderGate,
  claim,
  status as leStatus,
  type ElectionStatus,
  type LeadershipChange
} from 'tauri-plugin-leader-election-api'

type Agent = { name: string; pubkey: string }
type Config = { agents: Agent[]; feedDir: string; staleMs: number; refreshMs: number; instanceId: string; pid: number }
type Mention = { id: string; agent: string; text: string; from: string; atMs: number }
type Reply = { mention: string; agent: string; instanceId: string; atMs: number }

const $ = <T extends HTMLElement>(id: string): T => document.getElementById(id) as T
const short = (id: string | null | undefined): string => (id ? id.slice(0, 8) : '—')

let config: Config
let gate: LeaderGate
let statuses = new Map<string, ElectionStatus>()
const seenMentions: Mention[] = []
const reacted = new Set<string>()
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
    const tr = document.createElement('tr')
    tr.dataset.testid = `status-${a.pubkey}`
    tr.innerHTML = `<td>${a.name}</td>
      <td class="${leads ? 'leader-role' : 'observer-role'}" data-testid="role-${a.pubkey}">${leads ? 'leader' : 'observer'}${s?.standingDown ? ' (standing down)' : ''}</td>
      <td data-testid="holder-${a.pubkey}">${short(s?.holder?.instanceId)}${s?.holder?.isUs ? ' (this window)' : ''}</td>
      <td>${age === null ? '—' : `${(age / 1000).toFixed(1)} s`}</td>
      <td class="${live ? 'live' : 'stale'}">${s?.lockState === 'record' ? (live ? 'live' : 'stale') : s?.lockState ?? '—'}</td>`
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
  renderStatus()
}

async function onMention(m: Mention): Promise<void> {
  seenMentions.push(m)
  // NIP-LE (b): only the leader adds the 👀 reaction at queue acceptance.
  if (gate.mayReact(m.agent)) reacted.add(m.id)
  // NIP-LE (a): only the leader promotes the event to an agent prompt.
  if (gate.mayDispatch(m.agent)) await invoke('reply', { mention: m.id, agent: m.agent })
  await renderFeed()
}

async function main(): Promise<void> {
  config = await invoke<Config>('demo_config')
  $('instance-id').textContent = config.instanceId
  $('pid').textContent = String(config.pid)
  gate = await LeaderGate.create()
  // Every change this window saw, for the end-to-end tests.
  const log: LeadershipChange[] = []
  ;(window as unknown as { __leaderLog: LeadershipChange[] }).__leaderLog = log
  gate.subscribe((c: LeadershipChange) => {
    log.push(c)
    if (c.reason === 'claimed') toast(`This window now leads ${config.agents.find((a) => a.pubkey === c.pubkey)?.name}`)
    renderSidebar()
    void refreshStatus()
  })
  gate.onCancelTurn((pubkey) => {
    const banner = $('banner')
    banner.textContent = `Another window took over ${config.agents.find((a) => a.pubkey === pubkey)?.name}: this window's in-flight turn was cancelled.`
    banner.dataset.testid = 'banner'
    banner.hidden = false
  })
  await listen<Mention>('demo://mention', (e) => void onMention(e.payload))

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
      `child pid ${r.pid}: election id ${r.instanceId} (${r.instanceId === config.instanceId ? 'same as this window' : 'DIFFERENT'}), ` +
      `${r.isLeader ? 'leads' : 'observes'} ${a.name} (window: ${gate.isLeader(a.pubkey) ? 'leads' : 'observes'})`
  }

  // A normal close: the app exits and the plugin releases this window's locks.
  $('close-window').onclick = () => void getCurrentWindow().close()

  renderSidebar()
  await refreshStatus()
  await renderFeed()
  setInterval(() => void refreshStatus(), 1000)
  setInterval(() => void renderFeed(), 1000)
  document.body.dataset.ready = 'true'
}

void main()
