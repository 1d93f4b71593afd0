// End-to-end: three real example-app windows (WebKitGTK) driven through
// tauri-driver + WebKitWebDriver under Xvfb, sharing one temporary lock
// directory. Run by scripts/e2e.sh (which installs and builds what it needs).
//
// Client: selenium-webdriver, the reference W3C client. It is one small npm
// package with nothing to compile (a Rust client would add minutes of build
// on 2 cores), and node's built-in test runner reports the results.

import { after, before, test } from 'node:test'
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import fs from 'node:fs'
import net from 'node:net'
import os from 'node:os'
import path from 'node:path'

import { Builder, By } from 'selenium-webdriver'

const ROOT = path.resolve(import.meta.dirname, '..')
const APP = process.env.E2E_APP ?? path.join(ROOT, 'target/debug/leader-election-example')
const ARTIFACTS = process.env.E2E_ARTIFACTS ?? path.join(ROOT, 'target/e2e-artifacts')
const SCOUT = '5c0075c0075c0075c0075c0075c0075c0075c0075c0075c0075c0075c0075c00'
const SCRIBE = '5c41be5c41be5c41be5c41be5c41be5c41be5c41be5c41be5c41be5c41be5c41'
const AGENTS = [SCOUT, SCRIBE]
// Short timings through the app's own config (the plugin validates them).
const REFRESH_MS = 200
const STALE_MS = 1500
const STAND_DOWN_MS = 1500
/** Slack for three WebKit processes on a loaded 2-core machine. */
const FAILOVER_BOUND_MS = REFRESH_MS + 2000

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'le-e2e-'))
const children = []
/** @type {{ name: string, driver: import('selenium-webdriver').WebDriver, pid: number, alive: boolean }[]} */
const windows = []
let step = 0

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

async function waitFor(what, timeoutMs, fn) {
  const end = Date.now() + timeoutMs
  let last
  for (;;) {
    try {
      last = await fn()
      if (last) return last
    } catch (e) {
      last = e
    }
    if (Date.now() > end) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what} (last: ${last})`)
    await sleep(25)
  }
}

/** A port nobody listens on right now. */
function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer()
    srv.once('error', reject)
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address()
      srv.close(() => resolve(port))
    })
  })
}

/** Starts Xvfb on a display number it picks itself (-displayfd). */
async function startXvfb() {
  const log = fs.openSync(path.join(ARTIFACTS, 'xvfb.log'), 'w')
  const xvfb = spawn('Xvfb', ['-displayfd', '3', '-screen', '0', '1920x1080x24', '-nolisten', 'tcp'], {
    stdio: ['ignore', log, log, 'pipe']
  })
  children.push(xvfb)
  let out = ''
  xvfb.stdio[3].on('data', (d) => (out += d))
  const n = await waitFor('Xvfb to report its display', 10_000, async () => (/\n/.test(out) ? out.trim() : null))
  return `:${n}`
}

function portOpen(port) {
  return new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1')
    s.on('connect', () => {
      s.destroy()
      resolve(true)
    })
    s.on('error', () => resolve(false))
  })
}

function start(cmd, args, env, log) {
  const out = fs.openSync(path.join(ARTIFACTS, log), 'w')
  const child = spawn(cmd, args, { env, stdio: ['ignore', out, out] })
  children.push(child)
  return child
}

const live = () => windows.filter((w) => w.alive)
const byTestId = (id) => By.css(`[data-testid="${id}"]`)

/** Text of an element; the page re-renders often, so a stale node is looked up again. */
async function text(w, testId) {
  for (let attempt = 0; ; attempt++) {
    try {
      return (await w.driver.findElement(byTestId(testId)).getText()).trim()
    } catch (e) {
      if (e?.name !== 'StaleElementReferenceError' || attempt >= 20) throw e
    }
  }
}

const role = (w, agent) => text(w, `role-${agent}`)
const crown = (w, agent) => text(w, `crown-${agent}`)

async function leaders(agent) {
  const out = []
  for (const w of live()) if ((await role(w, agent)).startsWith('leader')) out.push(w)
  return out
}

/** A PNG of every live window, saved as a test artifact. */
async function screenshots(label) {
  step += 1
  for (const w of live()) {
    const png = await w.driver.takeScreenshot()
    fs.writeFileSync(path.join(ARTIFACTS, `${String(step).padStart(2, '0')}-${label}-${w.name}.png`), png, 'base64')
  }
}

/** The last screenshots of every window, side by side (needs ImageMagick). */
async function sideBySide(label) {
  const shots = live().map((w) => path.join(ARTIFACTS, `${String(step).padStart(2, '0')}-${label}-${w.name}.png`))
  await new Promise((resolve) => {
    const c = spawn('convert', [...shots, '+append', path.join(ARTIFACTS, `three-windows.png`)], { stdio: 'ignore' })
    c.on('error', resolve)
    c.on('exit', resolve)
  })
}

before(async () => {
  fs.rmSync(ARTIFACTS, { recursive: true, force: true })
  fs.mkdirSync(ARTIFACTS, { recursive: true })
  assert.ok(fs.existsSync(APP), `build the example app first: ${APP}`)
  const display = process.env.DISPLAY || (await startXvfb())
  const shared = {
    ...process.env,
    DISPLAY: display,
    BUZZ_LEADER_LOCK_DIR: path.join(tmp, 'locks'),
    BUZZ_DEMO_FEED_DIR: path.join(tmp, 'feed'),
    BUZZ_DEMO_REFRESH_MS: String(REFRESH_MS),
    BUZZ_DEMO_STALE_MS: String(STALE_MS),
    BUZZ_DEMO_STAND_DOWN_MS: String(STAND_DOWN_MS)
  }
  delete shared.BUZZ_INSTANCE_ELECTION_ID
  for (let i = 0; i < 3; i++) {
    const name = `w${i + 1}`
    const xdg = path.join(tmp, name)
    // One driver per window: a tauri-driver serves one session at a time.
    const port = await freePort()
    const nativePort = await freePort()
    start(
      'tauri-driver',
      ['--port', String(port), '--native-port', String(nativePort)],
      {
        ...shared,
        XDG_DATA_HOME: path.join(xdg, 'data'),
        XDG_CACHE_HOME: path.join(xdg, 'cache'),
        XDG_CONFIG_HOME: path.join(xdg, 'config'),
        BUZZ_DEMO_WINDOW_X: String(i * 640)
      },
      `tauri-driver-${name}.log`
    )
    await waitFor(`tauri-driver on ${port}`, 10_000, () => portOpen(port))
    const driver = await new Builder()
      .usingServer(`http://127.0.0.1:${port}/`)
      .withCapabilities({ browserName: 'wry', 'tauri:options': { application: APP } })
      .build()
    await waitFor(`${name} ready`, 30_000, async () => (await driver.findElement(By.css('body')).getAttribute('data-ready')) === 'true')
    const pid = Number(await driver.findElement(By.id('pid')).getText())
    windows.push({ name, driver, pid, alive: true })
  }
})

after(async () => {
  for (const w of windows) {
    if (w.alive) await w.driver.quit().catch(() => {})
  }
  for (const c of children.reverse()) c.kill('SIGTERM')
  fs.rmSync(tmp, { recursive: true, force: true })
})

test('exactly one window leads each agent; the others observe', async () => {
  for (const agent of AGENTS) {
    const l = await waitFor(`one leader of ${agent.slice(0, 6)}`, 5_000, async () => {
      const l = await leaders(agent)
      return l.length === 1 ? l : null
    })
    for (const w of live()) {
      const leads = w === l[0]
      assert.equal(await crown(w, agent), leads ? '♛' : '', `${w.name} crown for ${agent.slice(0, 6)}`)
      assert.equal(await role(w, agent), leads ? 'leader' : 'observer', `${w.name} role`)
    }
  }
  await screenshots('launch')
})

test('claiming from an observer window moves the crown within one second and tells the old leader to cancel', async () => {
  const [old] = await leaders(SCOUT)
  const claimer = live().find((w) => w !== old)
  // The sidebar re-renders on every change: find and act in one retried step.
  await waitFor('the agent menu to open', 5_000, async () => {
    await claimer.driver.findElement(byTestId(`menu-${SCOUT}`)).click()
    return true
  })
  await waitFor('the Leadership item', 5_000, async () =>
    /Lead from this window/.test(await claimer.driver.findElement(byTestId(`claim-${SCOUT}`)).getText())
  )
  await screenshots('claim-menu')
  let clicked = 0
  await waitFor('the Leadership item to be clicked', 5_000, async () => {
    const item = await claimer.driver.findElement(byTestId(`claim-${SCOUT}`))
    clicked = Date.now()
    await item.click()
    return true
  })
  await waitFor('the crown in the claiming window', 1_000, async () => (await crown(claimer, SCOUT)) === '♛')
  const took = Date.now() - clicked
  await waitFor('the old leader to show it lost', 1_000, async () => (await role(old, SCOUT)) !== 'leader' && (await crown(old, SCOUT)) === '')
  const banner = await old.driver.findElement(byTestId('banner'))
  assert.equal(await banner.isDisplayed(), true)
  assert.match(await banner.getText(), /in-flight turn was cancelled/)
  assert.deepEqual(await leaders(SCOUT), [claimer])
  await screenshots('claimed')
  await sideBySide('claimed')
  console.log(`# claim → crown in ${took} ms`)
})

test('killing the leader process hands leadership to another window within the failover bound', async () => {
  const [leader] = await leaders(SCOUT)
  const killed = Date.now()
  process.kill(leader.pid, 'SIGKILL')
  leader.alive = false
  await leader.driver.quit().catch(() => {})
  const [next] = await waitFor('a surviving leader', FAILOVER_BOUND_MS, async () => {
    const l = await leaders(SCOUT)
    return l.length === 1 ? l : null
  })
  const took = Date.now() - killed
  assert.notEqual(next, leader)
  await screenshots('after-kill')
  console.log(`# SIGKILL → survivor leads in ${took} ms`)
})

test('mentions fanned out to every window are replied to exactly once', async () => {
  const sender = live()[live().length - 1]
  const before = new Set()
  for (const li of await sender.driver.findElements(By.css('[data-testid^="mention-"]'))) before.add(await li.getAttribute('data-testid'))
  for (let i = 0; i < 3; i++) {
    await sender.driver.findElement(byTestId(`send-${SCOUT}`)).click()
    await sleep(150)
  }
  // Every window renders every new mention, each with exactly one reply.
  for (const w of live()) {
    await waitFor(`${w.name} to render 3 answered mentions`, 5_000, async () => {
      const items = await w.driver.findElements(By.css('[data-testid^="mention-"]'))
      const fresh = []
      for (const li of items) if (!before.has(await li.getAttribute('data-testid'))) fresh.push(li)
      if (fresh.length !== 3) return false
      for (const li of fresh) if ((await li.getAttribute('data-replies')) !== '1') return false
      return true
    })
  }
  // And no late duplicate shows up afterwards.
  await sleep(REFRESH_MS * 3)
  const replies = fs
    .readFileSync(path.join(tmp, 'feed', 'replies.jsonl'), 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l))
  const counts = new Map()
  for (const r of replies) counts.set(r.mention, (counts.get(r.mention) ?? 0) + 1)
  assert.ok([...counts.values()].every((n) => n === 1), `replies per mention: ${JSON.stringify([...counts])}`)
  await screenshots('mentions')
})

test('a window closed gracefully hands leadership over with never two leaders', async () => {
  const [leader] = await leaders(SCOUT)
  const others = live().filter((w) => w !== leader)
  assert.ok(others.length >= 1)
  const closed = Date.now()
  // The window's own close button: a normal close (CloseRequested → exit),
  // so the plugin's exit hook runs. (WebDriver's Close Window ends the
  // process without it.)
  const closing = leader.driver.findElement(byTestId('close-window')).click().catch(() => {})
  leader.alive = false
  // Sample every remaining window while the handover happens.
  let maxLeaders = 0
  const [next] = await waitFor('a new leader after the graceful close', FAILOVER_BOUND_MS, async () => {
    const l = await leaders(SCOUT)
    maxLeaders = Math.max(maxLeaders, l.length)
    return l.length === 1 ? l : null
  })
  await closing
  await leader.driver.quit().catch(() => {})
  assert.ok(maxLeaders <= 1, `saw ${maxLeaders} leaders at once`)
  // The successor's own log: it started leading only after the close began.
  const log = await next.driver.executeScript('return window.__leaderLog')
  const became = log.filter((c) => c.pubkey === SCOUT && c.isLeader).pop()
  assert.ok(became && became.atMs >= closed, `successor led since ${became?.atMs}, close at ${closed}`)
  // The old leader stopped and then gave the lock up: handed it straight to
  // this window (extended mode) or released it (spec). A dead-pid or stale
  // takeover ('failover') would mean no graceful release happened.
  assert.ok(['handed_over', 'acquired'].includes(became.reason), `successor's reason: ${became.reason}`)
  await screenshots('after-close')
  console.log(`# graceful close → successor leads in ${became.atMs - closed} ms (${became.reason})`)
})
