// End-to-end: three real example-app windows (WebKitGTK) driven through
// tauri-driver + WebKitWebDriver under Xvfb, sharing one temporary lock
// directory. Run by scripts/e2e.sh (which installs and builds what it needs).
//
// Client: selenium-webdriver, the reference W3C client. It is one small npm
// package with nothing to compile (a Rust client would add minutes of build
// on 2 cores), and node's built-in test runner reports the results.

import { after, before, test } from 'node:test'
import assert from 'node:assert/strict'

import { By } from 'selenium-webdriver'

import {
  AGENTS,
  FAILOVER_BOUND_MS,
  REFRESH_MS,
  SCOUT,
  byTestId,
  claimFrom,
  crown,
  launch,
  leaders,
  live,
  replies,
  role,
  screenshots,
  sideBySide,
  sleep,
  teardown,
  text,
  waitFor
} from './harness.mjs'

before(async () => {
  // Short agent turns: these scenarios are about leadership.
  await launch(3, { BUZZ_DEMO_TURN_MS: '200' })
})

after(teardown)

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
  const clicked = await claimFrom(claimer, SCOUT)
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
  const counts = new Map()
  for (const r of replies()) counts.set(r.mention, (counts.get(r.mention) ?? 0) + 1)
  assert.ok([...counts.values()].every((n) => n === 1), `replies per mention: ${JSON.stringify([...counts])}`)
  // The status panel (the plugin's one status command): the leader counts
  // the ledger it keeps, the observers keep none.
  const [leader] = await leaders(SCOUT)
  await waitFor(`${leader.name}'s panel to count 3 answered mentions`, 5_000, async () => {
    const m = /(\d+) done/.exec(await text(leader, `work-${SCOUT}`))
    return m !== null && Number(m[1]) >= 3
  })
  for (const w of live()) if (w !== leader) assert.equal(await text(w, `work-${SCOUT}`), '—', `${w.name} keeps no ledger`)
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
