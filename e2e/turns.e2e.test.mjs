// End-to-end: the work ledger across changes of leader, in real webviews.
// Three example-app windows work one agent's queue with turns long enough
// (1.2 s) to be interrupted: a claim mid-turn, a SIGKILL mid-turn and a
// graceful close mid-turn. Every mention must be answered exactly once.

import { after, before, test } from 'node:test'
import assert from 'node:assert/strict'
import fs from 'node:fs'
import path from 'node:path'

import { By } from 'selenium-webdriver'

import {
  SCOUT,
  byTestId,
  claimFrom,
  launch,
  leaders,
  live,
  replies,
  screenshots,
  sleep,
  teardown,
  tmp,
  waitFor
} from './harness.mjs'

const TURN_MS = 1200
const MENTIONS = 5

before(() => launch(3, { BUZZ_DEMO_TURN_MS: String(TURN_MS) }, 'turns'))
after(teardown)

/** The mention `w` is in a turn on right now, if any. */
async function thinkingOn(w) {
  const busy = await w.driver.findElements(By.css('#queue li.thinking'))
  if (busy.length === 0) return null
  return (await busy[0].getAttribute('data-testid')).replace(/^queued-/, '')
}

/** Waits for the one leader of SCOUT to be in a turn; returns it and the mention. */
async function leaderInTurn(what) {
  return waitFor(what, 20_000, async () => {
    const l = await leaders(SCOUT)
    if (l.length !== 1) return null
    const id = await thinkingOn(l[0])
    return id ? { w: l[0], id } : null
  })
}

/** The ids of the mentions sent for SCOUT, from the shared feed file. */
function sentMentions() {
  const feed = path.join(tmp, 'feed', 'mentions.jsonl')
  if (!fs.existsSync(feed)) return []
  return fs
    .readFileSync(feed, 'utf8')
    .split('\n')
    .filter((l) => l.trim())
    .map((l) => JSON.parse(l))
    .filter((m) => m.agent === SCOUT)
    .map((m) => m.id)
}

function repliesPer(ids) {
  const counts = new Map(ids.map((id) => [id, 0]))
  for (const r of replies()) if (counts.has(r.mention)) counts.set(r.mention, counts.get(r.mention) + 1)
  return counts
}

test('queued mentions survive a claim, a SIGKILL and a graceful close mid-turn, each answered exactly once', async () => {
  const [first] = await waitFor('one leader of SCOUT', 5_000, async () => {
    const l = await leaders(SCOUT)
    return l.length === 1 ? l : null
  })
  const sender = live().find((w) => w !== first)
  // One click, one mention; a click WebKit drops under load (seen once in
  // CI: 4 of 5 arrived) is made again, only after waiting for its mention.
  for (let i = 0; i < MENTIONS; i++) {
    for (let attempt = 0; sentMentions().length <= i; attempt++) {
      assert.ok(attempt < 3, `mention ${i + 1} never reached the feed`)
      await sender.driver.findElement(byTestId(`send-${SCOUT}`)).click()
      await waitFor(`mention ${i + 1} in the feed`, 5_000, async () => sentMentions().length > i).catch(() => {})
    }
  }
  // Deadlines below are generous: a loaded 2-core machine runs three
  // WebKit windows here; they bound waiting, they measure nothing.
  let seen = []
  const ids = await waitFor(`${MENTIONS} mentions in the feed`, 15_000, async () => {
    seen = sentMentions()
    return seen.length === MENTIONS ? seen : null
  }).catch((e) => {
    throw new Error(`${e.message}; the feed holds ${seen.length}: ${JSON.stringify(seen)}`)
  })

  // 1. A claim mid-turn: the old leader cancels and hands its mention back.
  const a = await leaderInTurn('the first leader to start a turn')
  await screenshots('first-turn')
  const claimer = live().find((w) => w !== a.w)
  await claimFrom(claimer, SCOUT)
  await waitFor('the claimer to lead', 10_000, async () => (await leaders(SCOUT))[0] === claimer)
  const banner = await a.w.driver.findElement(byTestId('banner'))
  await waitFor('the cancel banner', 10_000, async () => /handed back/.test(await banner.getText()))
  console.log(`# claim while ${a.w.name} was on ${a.id}: ${await banner.getText()}`)

  // 2. A SIGKILL mid-turn: the mention the dead window took is owed again.
  const b = await leaderInTurn('the claimer to start a turn')
  assert.equal(b.w, claimer)
  await screenshots('claimer-turn')
  process.kill(b.w.pid, 'SIGKILL')
  b.w.alive = false
  await b.w.driver.quit().catch(() => {})
  console.log(`# SIGKILL of ${b.w.name} while on ${b.id}`)

  // 3. A graceful close mid-turn: the last window finishes the queue.
  const c = await leaderInTurn('a survivor to start a turn')
  await screenshots('survivor-turn')
  const closing = c.w.driver.findElement(byTestId('close-window')).click().catch(() => {})
  c.w.alive = false
  await closing
  await c.w.driver.quit().catch(() => {})
  console.log(`# graceful close of ${c.w.name} while on ${c.id}`)

  const [last] = live()
  await waitFor('every mention to be answered', MENTIONS * TURN_MS + 30_000, async () =>
    [...repliesPer(ids).values()].every((n) => n >= 1)
  )
  // No late duplicate: the last window's queue runs dry and stays answered once.
  await waitFor('the last queue to run dry', 15_000, async () => (await last.driver.findElements(By.css('#queue li'))).length === 0)
  await sleep(TURN_MS)
  const counts = repliesPer(ids)
  assert.ok([...counts.values()].every((n) => n === 1), `replies per mention: ${JSON.stringify([...counts])}`)
  await screenshots('all-answered')
  const rendered = await waitFor('the last window to render every reply', 15_000, async () => {
    for (const id of ids) if ((await last.driver.findElement(byTestId(`mention-${id}`)).getAttribute('data-replies')) !== '1') return null
    return true
  })
  assert.ok(rendered)
})

// Issue 18, item 4: a reload loses the page's turn (and its in-flight set)
// while the process and its epoch stay; the take must end with the page
// that took it (`LeaderElection::page_gone` on the new page load), so the
// reloaded page answers the mention once, soon, instead of never (the take
// would otherwise stay in flight for the ledger's retention).
test('a mention in a turn when its leading window reloads is answered once, soon', async () => {
  const [w] = await waitFor('one leader of SCOUT', 10_000, async () => {
    const l = await leaders(SCOUT)
    return l.length === 1 ? l : null
  })
  const before = new Set(sentMentions())
  await w.driver.findElement(byTestId(`send-${SCOUT}`)).click()
  const id = await waitFor('the new mention in the feed', 10_000, async () => sentMentions().find((m) => !before.has(m)) ?? null)
  const onIt = await waitFor(`${w.name} to start a turn on ${id}`, 20_000, async () => ((await thinkingOn(w)) === id ? id : null))
  await w.driver.navigate().refresh()
  const reloaded = Date.now()
  console.log(`# reload of ${w.name} while on ${onIt}`)
  await waitFor(`${w.name} ready again`, 30_000, async () => (await w.driver.findElement(By.css('body')).getAttribute('data-ready')) === 'true')
  // Generous: the reload itself and one turn; without the give-back it
  // would never come.
  await waitFor(`${id} answered after the reload`, 20_000 + 2 * TURN_MS, async () => (repliesPer([id]).get(id) ?? 0) >= 1)
  console.log(`# ${id} answered ${Date.now() - reloaded} ms after the reload`)
  await sleep(2 * TURN_MS)
  assert.equal(repliesPer([id]).get(id), 1, `replies to ${id}`)
  await screenshots('reloaded')
})
