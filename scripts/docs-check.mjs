// The docs name only what exists, and name all of it. Compared both ways:
// * `nip-le`'s subcommands and each one's flags, from the binary's own
//   `--help`, against the synopsis at the top of docs/cli.md, and the
//   lab's own (`nip-le-lab`, beyond the user's commands it shares) against
//   the lab's synopsis there;
// * the `changed` event's fields, its `reason` values and its `level`
//   values, from the generated TypeScript bindings, against
//   docs/integration.md;
// * the plugin's commands (build.rs), the default and read-only permission
//   sets (permissions/*.toml) and every `leader-election:…` permission the
//   README and docs name.
// Usage: node scripts/docs-check.mjs [path/to/nip-le [path/to/nip-le-lab]]
// (default target/debug/nip-le and its sibling nip-le-lab). Called by
// scripts/test.sh.
import { execFileSync } from 'node:child_process'
import { readFileSync, readdirSync } from 'node:fs'

const bin = process.argv[2] ?? 'target/debug/nip-le'
const labBin = process.argv[3] ?? `${bin}-lab`
const read = (p) => readFileSync(p, 'utf8')
const problems = []
/** Reports what one side has and the other lacks. */
function compare(what, inCode, inDocs, where) {
  for (const x of inCode) if (!inDocs.has(x)) problems.push(`${what}: ${x} exists but ${where} does not name it`)
  for (const x of inDocs) if (!inCode.has(x)) problems.push(`${what}: ${where} names ${x}, which does not exist`)
}
const flagsIn = (text) => new Set([...text.matchAll(/--[a-z0-9][a-z0-9-]*/g)].map((m) => m[0]))
const ticked = (text) => new Set([...text.matchAll(/`([^`]+)`/g)].map((m) => m[1]))
/** The text of `text` from `from` up to `to` (exclusive). */
function between(text, from, to, file) {
  const i = text.indexOf(from)
  const j = i < 0 ? -1 : text.indexOf(to, i + from.length)
  if (i < 0 || j < 0) {
    problems.push(`${file}: cannot find the passage from "${from}" to "${to}"`)
    return ''
  }
  return text.slice(i + from.length, j)
}

// --- the CLI ------------------------------------------------------------
const cli = read('docs/cli.md')
/** The subcommands `exe` lists in its `--help`. */
function subcommandsOf(exe) {
  const text = execFileSync(exe, ['--help'], { encoding: 'utf8' })
  return new Set(
    [...text.split('Commands:')[1].split(/\n\S/)[0].matchAll(/^ {2}([a-z][a-z-]*) /gm)]
      .map((m) => m[1])
      .filter((c) => c !== 'help'),
  )
}
/**
 * Compares `exe`'s subcommands (less `shared`) and their flags with the
 * synopsis block of docs/cli.md whose lines start with `name `.
 */
function checkSynopsis(exe, name, shared) {
  const synopsis = cli.match(new RegExp('^```\\n(' + name + ' [\\s\\S]*?)^```', 'm'))?.[1] ?? ''
  if (!synopsis) problems.push(`docs/cli.md: no synopsis block (a plain \`\`\` block starting with \`${name} \`)`)
  const sections = new Map()
  let current = null
  for (const line of synopsis.split('\n')) {
    const head = line.match(new RegExp('^' + name + ' ([a-z-]+)')) ?? line.match(/^(ETCD):/)
    if (head) current = head[1]
    if (!current || !line.trim()) continue
    sections.set(current, (sections.get(current) ?? '') + line + '\n')
  }
  const etcdFlags = flagsIn(sections.get('ETCD') ?? '')
  sections.delete('ETCD')
  const subcommands = new Set([...subcommandsOf(exe)].filter((c) => !shared.has(c)))
  compare(`${name} subcommand`, subcommands, new Set(sections.keys()), 'docs/cli.md')
  for (const sub of subcommands) {
    if (!sections.has(sub)) continue
    // Flags as clap lists them (an option line starts with one), not those
    // a description mentions.
    const text = execFileSync(exe, [sub, '--help'], { encoding: 'utf8' })
    const listedFlags = [...text.matchAll(/^\s+(?:-\w, )?(--[a-z0-9][a-z0-9-]*)/gm)].map((m) => m[1])
    const code = new Set(listedFlags.filter((f) => f !== '--help' && f !== '--version'))
    const docsText = sections.get(sub)
    const docs = flagsIn(docsText)
    if (docsText.includes('[ETCD]')) for (const f of etcdFlags) docs.add(f)
    compare(`${name} ${sub} flag`, code, docs, 'docs/cli.md')
  }
  return subcommands
}
const userCommands = checkSynopsis(bin, 'nip-le', new Set())
const labShares = [...userCommands].filter((c) => !subcommandsOf(labBin).has(c))
if (labShares.length) problems.push(`nip-le-lab lacks the user's commands: ${labShares.join(', ')}`)
const labCommands = checkSynopsis(labBin, 'nip-le-lab', userCommands)

// --- the changed event ---------------------------------------------------
const integration = read('docs/integration.md')
const binding = (name) =>
  read(`guest-js/bindings/${name}.ts`)
    .replace(/\/\*[\s\S]*?\*\//g, '')
    .replace(/^\/\/.*$/gm, '')
const fields = new Set([...binding('LeadershipChange').matchAll(/(\w+)\s*:/g)].map((m) => m[1]))
const payload = integration.match(/`LeadershipChange` payload\s*`\{([^}]*)\}`/)?.[1]
if (payload === undefined) problems.push('docs/integration.md: no `LeadershipChange` payload `{…}` line')
compare('changed event field', fields, new Set((payload ?? '').split(',').map((f) => f.trim())), 'docs/integration.md')
const events = between(integration, '**6. Events.**', '`onLeadershipChanged(cb)`', 'docs/integration.md')
for (const f of fields) if (!events.includes(`\`${f}\``) && !events.includes(`\`${f}:`)) problems.push(`changed event field: ${f} is never explained in docs/integration.md`)
const literals = (name) => new Set([...binding(name).matchAll(/"([^"]+)"/g)].map((m) => m[1]))
compare('change reason', literals('ChangeReason'), ticked(between(events, '`reason` is one of', 'Every change', 'docs/integration.md')), 'docs/integration.md')
compare('level', literals('Level'), ticked(between(events, '`level` is the level', '`globalHolder`', 'docs/integration.md')), 'docs/integration.md')

// --- commands and permissions ---------------------------------------------
const commands = new Set([...read('build.rs').split('];')[0].matchAll(/"([a-z_]+)"/g)].map((m) => m[1]))
const allow = (c) => `allow-${c.replaceAll('_', '-')}`
const capability = between(integration, 'The default set\nallows every command:', 'A page that only displays', 'docs/integration.md')
compare('plugin command', commands, ticked(capability), 'docs/integration.md (the default set)')
const listed = (file) => new Set([...read(file).split('permissions = [')[1].split(']')[0].matchAll(/"([a-z-]+)"/g)].map((m) => m[1]))
compare('default permission', new Set([...commands].map(allow)), listed('permissions/default.toml'), 'permissions/default.toml')
const readOnly = ticked(between(integration, '`leader-election:read-only` (', ')', 'docs/integration.md'))
compare('read-only permission', listed('permissions/read-only.toml'), new Set([...readOnly].map(allow)), 'docs/integration.md')
const permissions = new Set(['default', 'read-only'])
for (const c of commands) for (const p of ['allow', 'deny']) permissions.add(`${p}-${c.replaceAll('_', '-')}`)
const docs = ['README.md', ...readdirSync('docs').map((f) => `docs/${f}`)].filter((f) => f.endsWith('.md'))
for (const file of docs) {
  for (const m of read(file).matchAll(/leader-election:([a-z*<>-]+)/g)) {
    if (/[*<]/.test(m[1])) continue // a pattern (`allow-<command>`, `allow-*`)
    if (!permissions.has(m[1])) problems.push(`${file} names the permission leader-election:${m[1]}, which does not exist`)
  }
}

if (problems.length) {
  console.error(problems.join('\n'))
  process.exit(1)
}
console.log(
  `docs match the code: ${userCommands.size} + ${labCommands.size} subcommands (nip-le, nip-le-lab) and their flags, ${fields.size} event fields, ${commands.size} commands, ${permissions.size} permissions`,
)
