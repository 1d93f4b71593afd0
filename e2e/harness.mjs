// Shared by the end-to-end suites: Xvfb, one tauri-driver per example-app
// window, and helpers to read what each window shows. Every suite gets its
// own temporary lock directory and feed (node --test runs each file in a
// process of its own).

import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import fs from 'node:fs'
import net from 'node:net'
import os from 'node:os'
import path from 'node:path'

import { Builder, By } from 'selenium-webdriver'

export const ROOT = path.resolve(import.meta.dirname, '..')
export const APP = process.env.E2E_APP ?? path.join(ROOT, 'target/debug/leader-election-example')
/** The Buzz-shaped example (examples/buzz-app). */
export const BUZZ_APP = process.env.E2E_BUZZ_APP ?? path.join(ROOT, 'target/debug/buzz-shaped-example')
export const ARTIFACTS = process.env.E2E_ARTIFACTS ?? path.join(ROOT, 'target/e2e-artifacts')
export const SCOUT = '5c0075c0075c0075c0075c0075c0075c0075c0075c0075c0075c0075c0075c00'
export const SCRIBE = '5c41be5c41be5c41be5c41be5c41be5c41be5c41be5c41be5c41be5c41be5c41'
export const AGENTS = [SCOUT, SCRIBE]
// Short timings through the app's own config (the plugin validates them).
export const REFRESH_MS = 200
export const STALE_MS = 1500
export const STAND_DOWN_MS = 1500
/** Slack for three WebKit processes on a loaded 2-core machine. */
export const FAILOVER_BOUND_MS = REFRESH_MS + 2000

export const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'le-e2e-'))
const children = []
/** @type {{ name: string, driver: import('selenium-webdriver').WebDriver, pid: number, alive: boolean }[]} */
export const windows = []
let step = 0
/** A prefix for this suite's screenshots. */
let suite = ''

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

export async function waitFor(what, timeoutMs, fn) {
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

/**
 * How long a new WebDriver session may take (a loaded machine: seconds).
 * `E2E_FIRST_SESSION_MS` shortens the first attempt only, to run the
 * path that starts a window again (`E2E_FIRST_SESSION_MS=1 bash scripts/e2e.sh`).
 */
const SESSION_MS = 60_000
const FIRST_SESSION_MS = Number(process.env.E2E_FIRST_SESSION_MS) || SESSION_MS

class NoAnswer extends Error {}

/** Resolves as `p` does, or rejects with {@link NoAnswer} after `ms`. */
async function within(ms, what, p) {
  let timer
  const late = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new NoAnswer(`${what}: no answer in ${ms} ms`)), ms)
  })
  try {
    return await Promise.race([p, late])
  } finally {
    clearTimeout(timer)
  }
}

/** Whether `pid` has exited: gone, or a zombie (it has written everything; nobody may reap it). Never 0 or a negative pid: that would address a process group. */
function exited(pid) {
  if (!Number.isInteger(pid) || pid <= 0) return true
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8')
    return stat.slice(stat.lastIndexOf(')') + 2).startsWith('Z')
  } catch {
    return true
  }
}

/** `pid` and every process below it (by parent pid), deepest last. */
function tree(pid) {
  const parents = new Map()
  for (const e of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(e)) continue
    try {
      const stat = fs.readFileSync(`/proc/${e}/stat`, 'utf8')
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1])
      parents.set(Number(e), ppid)
    } catch {
      // gone meanwhile
    }
  }
  const out = [pid]
  for (let i = 0; i < out.length; i++) {
    for (const [child, parent] of parents) if (parent === out[i]) out.push(child)
  }
  return out
}

/** Ends a driver and what it started: SIGTERM to all, then SIGKILL to what is left after 10 s. */
async function endTree(pid) {
  const pids = tree(pid).filter((p) => Number.isInteger(p) && p > 0)
  const signal = (sig) => {
    for (const p of pids) {
      try {
        process.kill(p, sig)
      } catch {
        // gone
      }
    }
  }
  signal('SIGTERM')
  const end = Date.now() + 10_000
  while (!pids.every(exited) && Date.now() < end) await sleep(50)
  signal('SIGKILL')
}

/** A listening socket on a port the kernel picked. */
function listenAnywhere() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer()
    srv.once('error', reject)
    srv.listen(0, '127.0.0.1', () => resolve(srv))
  })
}

/**
 * `n` distinct ports nobody listens on right now. All are held until all
 * are picked: one port closed and picked again would be handed out twice
 * (a tauri-driver given the same port twice spins and never serves).
 */
async function freePorts(n) {
  const servers = []
  for (let i = 0; i < n; i++) servers.push(await listenAnywhere())
  const ports = servers.map((s) => s.address().port)
  await Promise.all(servers.map((s) => new Promise((r) => s.close(r))))
  return ports
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

export const live = () => windows.filter((w) => w.alive)
export const byTestId = (id) => By.css(`[data-testid="${id}"]`)

/** Text of an element; the page re-renders often, so a stale node is looked up again. */
export async function text(w, testId) {
  for (let attempt = 0; ; attempt++) {
    try {
      return (await w.driver.findElement(byTestId(testId)).getText()).trim()
    } catch (e) {
      if (e?.name !== 'StaleElementReferenceError' || attempt >= 20) throw e
    }
  }
}

export const role = (w, agent) => text(w, `role-${agent}`)
export const crown = (w, agent) => text(w, `crown-${agent}`)

export async function leaders(agent) {
  const out = []
  for (const w of live()) if ((await role(w, agent)).startsWith('leader')) out.push(w)
  return out
}

/** A PNG of every live window, saved as a test artifact. */
export async function screenshots(label) {
  step += 1
  for (const w of live()) {
    const png = await w.driver.takeScreenshot()
    fs.writeFileSync(path.join(ARTIFACTS, `${suite}${String(step).padStart(2, '0')}-${label}-${w.name}.png`), png, 'base64')
  }
}

/** Claims `agent` from window `w` through its sidebar menu; resolves when the item was clicked (the time of the click). */
export async function claimFrom(w, agent) {
  // The sidebar re-renders on every change: find and act in one retried step.
  await waitFor('the agent menu to open', 5_000, async () => {
    await w.driver.findElement(byTestId(`menu-${agent}`)).click()
    return true
  })
  await waitFor('the Leadership item', 5_000, async () =>
    /Lead from this window/.test(await w.driver.findElement(byTestId(`claim-${agent}`)).getText())
  )
  let clicked = 0
  await waitFor('the Leadership item to be clicked', 5_000, async () => {
    const item = await w.driver.findElement(byTestId(`claim-${agent}`))
    clicked = Date.now()
    await item.click()
    return true
  })
  return clicked
}

/** The reply lines the feed holds: `{mention, agent, instanceId, atMs}`. */
export function replies() {
  const file = path.join(tmp, 'feed', 'replies.jsonl')
  if (!fs.existsSync(file)) return []
  return fs
    .readFileSync(file, 'utf8')
    .split('\n')
    .filter((l) => l.trim())
    .map((l) => JSON.parse(l))
}

/** The last screenshots of every window, side by side (needs ImageMagick). */
export async function sideBySide(label) {
  const shots = live().map((w) => path.join(ARTIFACTS, `${suite}${String(step).padStart(2, '0')}-${label}-${w.name}.png`))
  await new Promise((resolve) => {
    const c = spawn('convert', [...shots, '+append', path.join(ARTIFACTS, `three-windows.png`)], { stdio: 'ignore' })
    c.on('error', resolve)
    c.on('exit', resolve)
  })
}

/**
 * Starts `n` example-app windows (each with its own tauri-driver and XDG
 * directories) on one display, sharing this suite's lock directory and feed.
 * `env` adds to the app's environment (e.g. its turn length); `name`
 * prefixes the suite's screenshots.
 */
export async function launch(n = 3, env = {}, name = '', app = APP) {
  suite = name ? `${name}-` : ''
  fs.mkdirSync(ARTIFACTS, { recursive: true })
  assert.ok(fs.existsSync(app), `build the example app first: ${app}`)
  const display = process.env.DISPLAY || (await startXvfb())
  const shared = {
    ...process.env,
    DISPLAY: display,
    BUZZ_LEADER_LOCK_DIR: path.join(tmp, 'locks'),
    BUZZ_DEMO_FEED_DIR: path.join(tmp, 'feed'),
    BUZZ_DEMO_REFRESH_MS: String(REFRESH_MS),
    BUZZ_DEMO_STALE_MS: String(STALE_MS),
    BUZZ_DEMO_STAND_DOWN_MS: String(STAND_DOWN_MS),
    ...env
  }
  delete shared.BUZZ_INSTANCE_ELECTION_ID
  for (let i = 0; i < n; i++) {
    const name = `w${i + 1}`
    const xdg = path.join(tmp, name)
    const backend = backendOf(i, shared.NIP_LE_BACKEND)
    let driver
    for (let attempt = 1; !driver; attempt++) {
      // One driver per window: a tauri-driver serves one session at a time.
      const [port, nativePort] = await freePorts(2)
      const proc = start(
        'tauri-driver',
        ['--port', String(port), '--native-port', String(nativePort)],
        {
          ...shared,
          XDG_DATA_HOME: path.join(xdg, 'data'),
          XDG_CACHE_HOME: path.join(xdg, 'cache'),
          XDG_CONFIG_HOME: path.join(xdg, 'config'),
          BUZZ_DEMO_WINDOW_X: String(i * 640),
          ...(backend ? { NIP_LE_BACKEND: backend } : {})
        },
        `tauri-driver-${name}${attempt > 1 ? `-${attempt}` : ''}.log`
      )
      await waitFor(`tauri-driver on ${port}`, 10_000, () => portOpen(port))
      const session = new Builder()
        .usingServer(`http://127.0.0.1:${port}/`)
        .withCapabilities({ browserName: 'wry', 'tauri:options': { application: app } })
        .build()
      // Settled late (after its attempt was ended), it must not reject unheard.
      session.catch(() => {})
      try {
        driver = await within(attempt === 1 ? FIRST_SESSION_MS : SESSION_MS, `${name}'s WebDriver session`, session)
      } catch (e) {
        // WebKitWebDriver once started the app and never answered the new
        // session (CI, the portable e2e run: the suite hung for good). The
        // session is the harness's, not what is tested: end that attempt's
        // app (gracefully, so it stops its agent and releases its locks)
        // and its drivers, and start the window once more.
        if (attempt >= 2 || !(e instanceof NoAnswer)) throw e
        console.log(`# ${e.message}: starting ${name} again`)
        await endTree(proc.pid)
      }
    }
    await waitFor(`${name} ready`, 30_000, async () => (await driver.findElement(By.css('body')).getAttribute('data-ready')) === 'true')
    // A pid read before the page rendered would be 0, and kill(0) signals
    // our whole process group: wait for a real one.
    const pid = await waitFor(`${name}'s pid`, 10_000, async () => {
      const n = Number(await driver.findElement(By.id('pid')).getText())
      return Number.isInteger(n) && n > 0 ? n : null
    })
    windows.push({ name, driver, pid, alive: true })
  }
  // The windows run the backend this run asked for (NIP_LE_BACKEND): the
  // portable one leaves a presence file per window, the native one a slot
  // each in one shared file.
  const locks = path.join(tmp, 'locks')
  const portable = [...Array(n).keys()].filter((i) => backendOf(i, shared.NIP_LE_BACKEND) === 'portable').length
  await waitFor(`${portable} portable and ${n - portable} native presences in the lock dir`, 10_000, () => {
    const names = fs.existsSync(locks) ? fs.readdirSync(locks) : []
    const own = names.filter((f) => /^\d+-[0-9a-f]{16}\.live$/.test(f)).length
    return own === portable && names.includes('presence.live') === portable < n
  })
}

/**
 * The backend of window `i` for the run's `NIP_LE_BACKEND`: `mixed` makes
 * every second window (w2, w4, ...) portable and the others native, so one
 * run drives both backends' code and their hand-overs to each other.
 */
function backendOf(i, asked) {
  if (asked === 'mixed') return i % 2 === 1 ? 'portable' : 'native'
  return asked
}

/**
 * Ends every window, driver and Xvfb, and removes the suite's files;
 * `beforeRemove` runs once the windows are gone (a suite ends what else it
 * started that writes there).
 */
export async function teardown(beforeRemove) {
  for (const w of windows) {
    if (w.alive) await w.driver.quit().catch(() => {})
  }
  for (const c of children.reverse()) c.kill('SIGTERM')
  // The apps release their locks on the way out: let them finish writing
  // before the directory goes (a loaded machine takes a while).
  const end = Date.now() + 10_000
  while (Date.now() < end && !windows.every((w) => exited(w.pid))) await sleep(50)
  // (`after(teardown)` passes node's test context: not a hook.)
  if (typeof beforeRemove === 'function') await beforeRemove()
  fs.rmSync(tmp, { recursive: true, force: true, maxRetries: 10, retryDelay: 100 })
}
