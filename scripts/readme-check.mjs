#!/usr/bin/env node
// The README's code blocks are the files of a new app, examples/readme-app,
// which the test command builds (cargo build -p readme-app, clippy with the
// workspace: tauri-build also rejects a permission that does not exist) and
// type-checks (tsc -p examples/readme-app/tsconfig.json, against guest-js).
// This script checks that those files are exactly the README's blocks, and
// what a build cannot see:
// * every rust, ts, toml and json block names the file it belongs in (a
//   backquoted path in the paragraph before it); sh blocks are commands;
// * the Cargo.toml block is a [dependencies] table naming the plugin by a
//   path to a checkout (there is no public repository for a git form);
// * the capability block parses and grants only leader-election permissions
//   that permissions/ defines;
// * the README keeps the test command CI runs (bash scripts/test.sh);
// * every relative link of the README and docs/ reaches a file, and its
//   #anchor a heading there.
// `node scripts/readme-check.mjs --write` rewrites the app's files from the
// README instead of comparing them.
import { readFileSync, writeFileSync, readdirSync, existsSync, statSync } from 'node:fs'
import { dirname, join, relative, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..')
const app = join(root, 'examples/readme-app')
const write = process.argv.includes('--write')
const CHECKOUT = '/path/to/checkout'
const failures = []
const fail = (msg) => failures.push(msg)

const readme = readFileSync(join(root, 'README.md'), 'utf8')
const lines = readme.split('\n')

// --- the fenced blocks, and the file each belongs in ------------------------
const targets = {
  'src-tauri/Cargo.toml': 'toml',
  'src-tauri/capabilities/default.json': 'json',
  'src-tauri/src/lib.rs': 'rust',
  'src-tauri/src/reply.rs': 'rust',
  'src/main.ts': 'ts',
  'src/work.ts': 'ts'
}
const blocks = []
for (let i = 0; i < lines.length; i++) {
  const open = /^```(\S*)/.exec(lines[i])
  if (!open) continue
  const lang = open[1].split(',')[0]
  let end = i + 1
  while (end < lines.length && !lines[end].startsWith('```')) end++
  if (end === lines.length) {
    fail(`README.md:${i + 1}: a code block is never closed`)
    break
  }
  // The paragraph before the block.
  let p = i - 1
  while (p >= 0 && lines[p].trim() === '') p--
  let start = p
  while (start > 0 && lines[start - 1].trim() !== '' && !lines[start - 1].startsWith('```')) start--
  const paragraph = lines.slice(start, p + 1).join(' ')
  const named = Object.keys(targets).filter((t) => paragraph.includes('`' + t + '`'))
  blocks.push({ line: i + 1, lang, text: lines.slice(i + 1, end).join('\n') + '\n', named })
  i = end
}

const files = {}
for (const b of blocks) {
  if (b.lang === 'sh') continue
  const target = b.named.find((t) => targets[t] === b.lang)
  if (!target) {
    fail(`README.md:${b.line}: a \`${b.lang || 'plain'}\` block that names none of ${Object.keys(targets).join(', ')} in the paragraph before it: the test command would not check it`)
    continue
  }
  if (files[target]) fail(`README.md:${b.line}: a second block for ${target}`)
  files[target] = b
}
for (const t of Object.keys(targets)) if (!files[t]) fail(`README.md: no \`${targets[t]}\` block for ${t}`)

const sh = blocks.filter((b) => b.lang === 'sh').map((b) => b.text).join('\n')
if (!/^bash scripts\/test\.sh\b/m.test(sh)) fail('README.md: no `bash scripts/test.sh` line in a sh block (CI runs the README\'s test command)')
if (!readFileSync(join(root, '.ci/run'), 'utf8').includes('scripts/test.sh')) fail('.ci/run does not run scripts/test.sh')
if (!sh.includes(CHECKOUT)) fail(`README.md: the npm commands do not install from ${CHECKOUT}, the checkout the Cargo.toml block names`)

// --- src-tauri/Cargo.toml: a [dependencies] table, the plugin by path --------
const generated = {}
if (files['src-tauri/Cargo.toml']) {
  const b = files['src-tauri/Cargo.toml']
  const body = b.text.split('\n').filter((l) => l.trim() !== '' && !l.trim().startsWith('#'))
  if (body[0] !== '[dependencies]') fail(`README.md:${b.line}: the Cargo.toml block must be a [dependencies] table`)
  const deps = body.slice(1)
  let plugin = false
  for (const d of deps) {
    const m = /^([A-Za-z0-9_-]+) = (.*)$/.exec(d)
    if (!m) {
      fail(`README.md:${b.line}: not a dependency line: ${d}`)
      continue
    }
    if (m[1] !== 'tauri-plugin-leader-election') continue
    plugin = true
    if (!new RegExp(`^\\{ path = "${CHECKOUT}" \\}$`).test(m[2]))
      fail(`README.md:${b.line}: the plugin must be { path = "${CHECKOUT}" } (there is no public repository, so no git form): ${m[2]}`)
  }
  if (!plugin) fail(`README.md:${b.line}: the Cargo.toml block does not name tauri-plugin-leader-election`)
  generated['src-tauri/Cargo.toml'] = `# Written by scripts/readme-check.mjs --write: a new app's Cargo.toml whose
# [dependencies] end with the README's (${CHECKOUT} being this checkout).
# Edit the README, not this file.
[package]
name = "readme-app"
version = "0.1.0"
description = "The README's code blocks as a new Tauri app, built by the test command"
edition.workspace = true
license.workspace = true
rust-version.workspace = true
publish = false

[lib]
name = "readme_app_lib"

[build-dependencies]
tauri-build = { version = "2", features = [] }

[dependencies]
tauri = { version = "2", features = [] }
${deps.map((d) => d.replace(CHECKOUT, '../../..')).join('\n')}
`
}

// --- the capability: it parses, and names permissions that exist --------------
if (files['src-tauri/capabilities/default.json']) {
  const b = files['src-tauri/capabilities/default.json']
  const known = new Set(['default'])
  const walk = (dir) => {
    for (const e of readdirSync(dir)) {
      const p = join(dir, e)
      if (statSync(p).isDirectory()) walk(p)
      else if (p.endsWith('.toml')) for (const m of readFileSync(p, 'utf8').matchAll(/^identifier = "([^"]+)"/gm)) known.add(m[1])
    }
  }
  walk(join(root, 'permissions'))
  try {
    const cap = JSON.parse(b.text)
    if (typeof cap.identifier !== 'string') fail(`README.md:${b.line}: the capability has no identifier`)
    if (!Array.isArray(cap.windows)) fail(`README.md:${b.line}: the capability names no windows`)
    const perms = Array.isArray(cap.permissions) ? cap.permissions : []
    const ours = perms.filter((p) => typeof p === 'string' && p.startsWith('leader-election:'))
    if (ours.length === 0) fail(`README.md:${b.line}: the capability grants no leader-election permission`)
    for (const p of ours) {
      const id = p.slice('leader-election:'.length)
      if (!known.has(id)) fail(`README.md:${b.line}: ${p} is not a permission of permissions/ (${[...known].sort().join(', ')})`)
    }
  } catch (e) {
    fail(`README.md:${b.line}: the capability is not JSON: ${e.message}`)
  }
  generated['src-tauri/capabilities/default.json'] = b.text
}
for (const t of ['src-tauri/src/lib.rs', 'src-tauri/src/reply.rs', 'src/main.ts', 'src/work.ts']) if (files[t]) generated[t] = files[t].text

// --- the app's files are the README's ---------------------------------------
for (const [t, text] of Object.entries(generated)) {
  const path = join(app, t)
  if (write) {
    writeFileSync(path, text)
    continue
  }
  const have = existsSync(path) ? readFileSync(path, 'utf8') : null
  if (have === text) continue
  const a = (have ?? '').split('\n')
  const b = text.split('\n')
  let n = 0
  while (n < a.length && a[n] === b[n]) n++
  fail(`examples/readme-app/${t} is not the README's block (line ${n + 1}: ${JSON.stringify(a[n] ?? '<missing>')} vs the README's ${JSON.stringify(b[n] ?? '<end>')}); run node scripts/readme-check.mjs --write`)
}

// --- relative links of the README and docs/ ------------------------------------
const slug = (h) => h.trim().toLowerCase().replace(/[^\p{L}\p{N} _-]/gu, '').replace(/ /g, '-')
const anchors = new Map()
const anchorsOf = (file) => {
  if (!anchors.has(file)) {
    const set = new Set()
    let fence = false
    for (const l of readFileSync(file, 'utf8').split('\n')) {
      if (l.startsWith('```')) fence = !fence
      const m = !fence && /^#{1,6} (.*)$/.exec(l)
      if (m) set.add(slug(m[1].replace(/`/g, '')))
    }
    anchors.set(file, set)
  }
  return anchors.get(file)
}
const docs = [join(root, 'README.md'), join(root, 'SECURITY.md'), join(root, 'CHANGELOG.md')]
for (const e of readdirSync(join(root, 'docs'))) if (e.endsWith('.md')) docs.push(join(root, 'docs', e))
for (const file of docs) {
  let fence = false
  readFileSync(file, 'utf8').split('\n').forEach((l, i) => {
    if (l.startsWith('```')) fence = !fence
    if (fence) return
    for (const m of l.matchAll(/\]\(([^)\s]+)\)/g)) {
      const link = m[1]
      if (/^[a-z]+:/.test(link)) continue
      const [path, anchor] = link.split('#')
      const target = path ? resolve(dirname(file), path) : file
      const where = `${relative(root, file)}:${i + 1}`
      if (!existsSync(target)) fail(`${where}: the link ${link} reaches no file`)
      else if (anchor && target.endsWith('.md') && !anchorsOf(target).has(anchor)) fail(`${where}: the link ${link} reaches no heading of ${relative(root, target)}`)
    }
  })
}

if (failures.length) {
  for (const f of failures) console.error(f)
  process.exit(1)
}
console.log(
  write
    ? `wrote ${Object.keys(generated).length} files of examples/readme-app from the README`
    : `the README's ${blocks.length} code blocks: ${Object.keys(generated).length} are examples/readme-app's files, the rest commands; links resolve`
)
