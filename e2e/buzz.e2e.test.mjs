// End-to-end: the Buzz-shaped example (examples/buzz-app) as Buzz runs:
// four app processes of one user, agents from a shared store, each agent's
// harness (`nip-le stand-in-agent`: upstream's instance lease, a worker in
// its session, a lease freed up to 2 s after SIGTERM) started by the app's
// own process manager through the runner seam. Claims from the agent card,
// a SIGKILL and a SIGSTOP of the app that runs an agent, a graceful quit
// and an agent created at runtime. Sampled every 20 ms throughout: at most
// one harness per agent. At the end: every mention answered, none twice,
// nothing left running. Reports the gap between one harness freeing the
// lease and the next taking it, per kind of change.

import { after, before, test } from 'node:test'
import assert from 'node:assert/strict'
import { spawnSync } from 'node:child_process'
import fs from 'node:fs'
import path from 'node:path'

import { ARTIFACTS, BUZZ_APP, ROOT, byTestId, launch, live, screenshots, sleep, teardown, text, tmp, waitFor, windows } from './harness.mjs'

const SCOUT = '5c0075c0075c0075c0075c0075c0075c0075c0075c0075c0075c0075c0075c00'
const SCRIBE = '5c41be5c41be5c41be5c41be5c41be5c41be5c41be5c41be5c41be5c41be5c41'
const LATE = '1a7e1a7e1a7e1a7e1a7e1a7e1a7e1a7e1a7e1a7e1a7e1a7e1a7e1a7e1a7e1a7e'
// A step-down waits for the harness up to min(stand-down / 2, stale - refresh)
// = 2.5 s: more than the 2 s the stand-in takes to free its lease.
const REFRESH_MS = 300
const STALE_MS = 3000
const STAND_DOWN_MS = 6000
const FEED = path.join(tmp, 'feed')
const EVENTS = path.join(tmp, 'lease-events.jsonl')
const NIP_LE = path.join(ROOT, 'target/debug/nip-le-lab')

const agents = [SCOUT, SCRIBE]
const violations = []
let samples = 0
/** The kind of change in progress, for the gaps: [atMs, label]. */
const phases = [[0, 'launch']]
const phase = (label) => phases.push([Date.now(), label])

/**
 * The pids of the harnesses (or their guardians) of this suite, per agent.
 * A child a harness is starting (its worker) shows the harness's command
 * line until it has exec'd: a process whose parent is a harness is not one.
 */
function harnesses() {
  const found = []
  for (const e of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(e)) continue
    try {
      const cmd = fs.readFileSync(`/proc/${e}/cmdline`, 'utf8').split('\0')
      if (!cmd.includes('stand-in-agent') || !cmd.includes(path.join(tmp, 'leases'))) continue
      const stat = fs.readFileSync(`/proc/${e}/stat`, 'utf8')
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
      if (fields[0] === 'Z') continue
      found.push({ pid: Number(e), ppid: Number(fields[1]), agent: cmd[cmd.indexOf('--pubkey') + 1] })
    } catch {
      // gone meanwhile
    }
  }
  const pids = new Set(found.map((f) => f.pid))
  const out = new Map()
  for (const f of found.filter((f) => !pids.has(f.ppid))) out.set(f.agent, [...(out.get(f.agent) ?? []), f.pid])
  return out
}

/** Every live process whose command line names this suite's directory. */
function leftovers() {
  const out = []
  for (const e of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(e)) continue
    try {
      const cmd = fs.readFileSync(`/proc/${e}/cmdline`, 'utf8')
      const stat = fs.readFileSync(`/proc/${e}/stat`, 'utf8')
      if (cmd.includes(tmp) && stat.slice(stat.lastIndexOf(')') + 2)[0] !== 'Z') out.push(`${e}: ${cmd.split('\0').join(' ')}`)
    } catch {
      // gone meanwhile
    }
  }
  return out
}

let sampler
function startSampling() {
  sampler = setInterval(() => {
    samples += 1
    for (const [agent, pids] of harnesses()) {
      if (pids.length > 1) violations.push(`${new Date().toISOString()} ${agent.slice(0, 8)}: ${pids.length} harnesses ${pids}`)
    }
  }, 20)
}

let n = 0
let publisher
function publish(agent) {
  const id = `buzz-e2e-${n++}`
  fs.appendFileSync(path.join(FEED, 'mentions.jsonl'), JSON.stringify({ id, agent, text: 'hi', atMs: Date.now() }) + '\n')
  return id
}

function lines(file) {
  if (!fs.existsSync(file)) return []
  return fs.readFileSync(file, 'utf8').split('\n').filter((l) => l.trim()).map((l) => JSON.parse(l))
}

const role = (w, agent) => text(w, `role-${agent}`)
/** The live window whose card says it runs `agent`, once exactly one does. */
async function runnerOf(agent, timeoutMs = 15_000) {
  return await waitFor(`one app to run ${agent.slice(0, 8)}`, timeoutMs, async () => {
    const here = []
    for (const w of live()) if ((await role(w, agent)) === 'runs here') here.push(w)
    return here.length === 1 ? here[0] : null
  })
}

/** The lease events of `agent` after `since`. */
const leasedSince = (agent, since) => lines(EVENTS).filter((e) => e.agent === agent && e.what === 'leased' && e.at_ms > since)

/** Waits until a harness of `agent` took the lease after `since` and answered a mention published after that. */
async function served(agent, since, what) {
  const leased = await waitFor(`${what}: a harness of ${agent.slice(0, 8)} leased`, 20_000, async () => leasedSince(agent, since).at(-1))
  const probe = publish(agent)
  await waitFor(`${what}: ${agent.slice(0, 8)} answers`, 10_000, async () => lines(path.join(FEED, 'replies.jsonl')).some((r) => r.mention === probe))
  return leased
}

/** Waits until every agent's harness answers a mention published now: whatever the last change moved has settled. */
async function settled(what) {
  for (const a of agents) {
    await runnerOf(a)
    const probe = publish(a)
    await waitFor(`${what}: ${a.slice(0, 8)} answers`, 20_000, async () => lines(path.join(FEED, 'replies.jsonl')).some((r) => r.mention === probe))
  }
}

/** SIGSTOPs `w` at a moment it holds no lock file's flock (see crates/nip-le-lab/tests/support: a process frozen inside it cannot be replaced). */
async function stopOutsideFlock(w, agentsOf) {
  const locks = agentsOf.map((a) => path.join(tmp, 'locks', `${a}.lock`))
  const stopped = () => fs.readdirSync(`/proc/${w.pid}/task`).every((t) => /\) [Tt]/.test(fs.readFileSync(`/proc/${w.pid}/task/${t}/stat`, 'utf8')))
  for (let tries = 0; tries < 200; tries++) {
    process.kill(w.pid, 'SIGSTOP')
    await waitFor('every thread stopped', 5_000, async () => stopped())
    const free = spawnSync('python3', ['-c', 'import fcntl,sys\nfor p in sys.argv[1:]:\n  f=open(p,"rb+"); fcntl.flock(f, fcntl.LOCK_EX|fcntl.LOCK_NB)', ...locks])
    if (free.status === 0) return
    process.kill(w.pid, 'SIGCONT')
    await sleep(2)
  }
  throw new Error(`${w.name} held a lock file's flock at every stop`)
}

before(async () => {
  fs.mkdirSync(FEED, { recursive: true })
  fs.writeFileSync(path.join(FEED, 'mentions.jsonl'), '')
  fs.writeFileSync(
    path.join(tmp, 'agents.json'),
    JSON.stringify({ agents: [{ pubkey: SCOUT, name: 'Scout' }, { pubkey: SCRIBE, name: 'Scribe' }] })
  )
  startSampling()
  await launch(
    4,
    {
      BUZZ_DEMO_STORE: path.join(tmp, 'agents.json'),
      BUZZ_DEMO_HARNESS: NIP_LE,
      BUZZ_DEMO_LEASE_DIR: path.join(tmp, 'leases'),
      BUZZ_DEMO_EVENTS: EVENTS,
      BUZZ_DEMO_REFRESH_MS: String(REFRESH_MS),
      BUZZ_DEMO_STALE_MS: String(STALE_MS),
      BUZZ_DEMO_STAND_DOWN_MS: String(STAND_DOWN_MS)
    },
    'buzz',
    BUZZ_APP
  )
  let k = 0
  publisher = setInterval(() => publish(agents[k++ % agents.length]), 100)
})

after(async () => {
  clearInterval(publisher)
  clearInterval(sampler)
  // A failed run ends its apps without a graceful exit: end what they
  // left (a harness has a session of its own) before the directory goes.
  await teardown(async () => {
    const end = Date.now() + 10_000
    while (leftovers().length > 0 && Date.now() < end) {
      for (const l of leftovers()) {
        try {
          process.kill(Number(l.split(':')[0]), 'SIGKILL')
        } catch {
          // gone meanwhile
        }
      }
      await sleep(50)
    }
  })
})

test('one harness per agent through claims, a SIGKILL, a SIGSTOP, a graceful quit and an agent created at runtime; every mention answered once; nothing left behind', { timeout: 240_000 }, async () => {
  for (const a of agents) await served(a, 0, 'launch')
  await screenshots('settled')

  // Claims from the agent card, back and forth.
  for (let i = 0; i < 4; i++) {
    const from = await runnerOf(SCOUT)
    const to = live().find((w) => w !== from)
    phase('claim')
    const t = Date.now()
    await waitFor('the Run here button', 5_000, async () => {
      await to.driver.findElement(byTestId(`run-here-${SCOUT}`)).click()
      return true
    })
    assert.equal(await runnerOf(SCOUT), to, 'the claimer runs Scout')
    await served(SCOUT, t, 'claim')
  }
  await screenshots('claimed')

  // SIGKILL of the app that runs Scout: the successor stops the orphan
  // harness it left (named by the mark), then starts its own.
  {
    const w = await runnerOf(SCOUT)
    phase('sigkill')
    const t = Date.now()
    process.kill(w.pid, 'SIGKILL')
    w.alive = false
    await served(SCOUT, t, 'sigkill')
    await settled('sigkill')
  }

  // SIGSTOP of the app that runs Scribe: its harness (a session of its
  // own) answers on until the app that takes the lock at the stale bound
  // stops it; then the frozen app resumes and finds it lost.
  {
    const w = await runnerOf(SCRIBE)
    const runs = []
    for (const a of agents) if ((await role(w, a)) === 'runs here') runs.push(a)
    phase('sigstop')
    const t = Date.now()
    await stopOutsideFlock(w, runs)
    w.alive = false
    await served(SCRIBE, t, 'sigstop')
    process.kill(w.pid, 'SIGCONT')
    w.alive = true
    await waitFor('the resumed app to see it lost', 10_000, async () => (await role(w, SCRIBE)) !== 'runs here')
    await settled('sigstop')
  }

  // A graceful quit of the app that runs Scout.
  {
    const w = await runnerOf(SCOUT)
    phase('quit')
    const t = Date.now()
    // The app may exit before the click is answered.
    await w.driver.findElement(byTestId('quit')).click().catch(() => {})
    await waitFor('the app to exit', 15_000, async () => !fs.existsSync(`/proc/${w.pid}`) || /\) Z/.test(fs.readFileSync(`/proc/${w.pid}/stat`, 'utf8')))
    w.alive = false
    await w.driver.quit().catch(() => {})
    await served(SCOUT, t, 'quit')
  }

  // An agent created at runtime in one app: every app runs it within a
  // second, through the election: one harness.
  {
    const w = live()[0]
    phase('created')
    const t = Date.now()
    await w.driver.findElement(byTestId('add-pubkey')).sendKeys(LATE)
    await w.driver.findElement(byTestId('add-name')).sendKeys('Late')
    await w.driver.findElement(byTestId('add-agent')).click()
    agents.push(LATE)
    await runnerOf(LATE)
    await served(LATE, t, 'created')
  }
  await screenshots('end')

  // Every mention answered, none twice.
  clearInterval(publisher)
  const mentions = lines(path.join(FEED, 'mentions.jsonl'))
  await waitFor('every mention answered', 20_000, async () => {
    const answered = new Set(lines(path.join(FEED, 'replies.jsonl')).map((r) => r.mention))
    return mentions.every((m) => answered.has(m.id))
  })
  const count = new Map()
  for (const r of lines(path.join(FEED, 'replies.jsonl'))) count.set(r.mention, (count.get(r.mention) ?? 0) + 1)
  const twice = [...count].filter(([, c]) => c > 1)
  assert.deepEqual(twice, [], 'answered twice')

  // Every app quits gracefully: nothing is left running.
  phase('quit all')
  for (const w of live()) {
    await w.driver.findElement(byTestId('quit')).click().catch(() => {})
  }
  await waitFor('every app and every harness gone', 20_000, async () => leftovers().length === 0).catch(() => {})
  const left = leftovers()
  for (const w of windows) w.alive = false
  clearInterval(sampler)
  assert.deepEqual(left, [], 'left behind')
  assert.deepEqual(violations, [], `more than one harness for an agent (in ${samples} samples)`)

  // The gaps between one harness freeing the lease and the next taking it.
  const gaps = {}
  const events = lines(EVENTS).sort((a, b) => a.at_ms - b.at_ms)
  const labelAt = (ms) => phases.filter(([t]) => t <= ms).at(-1)[1]
  for (const a of agents) {
    let freed = null
    for (const e of events.filter((e) => e.agent === a)) {
      if (e.what === 'released') freed = e.at_ms
      else if (freed !== null) {
        const label = labelAt(e.at_ms)
        ;(gaps[label] ??= []).push(e.at_ms - freed)
        freed = null
      }
    }
  }
  const pct = (xs, p) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.ceil((p / 100) * xs.length) - 1)]
  const table = Object.fromEntries(Object.entries(gaps).map(([k, xs]) => [k, { n: xs.length, p50: pct(xs, 50), p99: pct(xs, 99), all: xs }]))
  fs.writeFileSync(path.join(ARTIFACTS, 'buzz-gaps.json'), JSON.stringify({ samples, gaps: table, phases, events }, null, 2))
  console.log(`harness gaps (ms, lease freed -> next lease taken), ${samples} samples of at most one harness:`, JSON.stringify(table))
  // Generous bounds for a loaded CI machine; the goals (p99 <= 100 ms after
  // a claim or a quit, <= the stale bound after a hang) are reported above.
  for (const k of ['claim', 'quit']) for (const g of gaps[k] ?? []) assert.ok(g <= 1_000, `${k}: ${g} ms`)
  for (const g of gaps.sigstop ?? []) assert.ok(g <= STALE_MS, `sigstop: ${g} ms`)
})
