import { readFileSync } from 'node:fs'
import { dirname } from 'node:path'

import { nodeResolve } from '@rollup/plugin-node-resolve'
import terser from '@rollup/plugin-terser'
import typescript from '@rollup/plugin-typescript'

const pkg = JSON.parse(readFileSync(new URL('./package.json', import.meta.url), 'utf8'))

// The global script, as the official plugins ship it: an IIFE that puts the
// API on `window.__TAURI__.leaderElection` for apps with `withGlobalTauri`
// and no bundler. build.rs hands it to Tauri (`global_api_script_path`), so
// it is committed and packaged with the crate.
const iifeName = '__TAURI_PLUGIN_LEADER_ELECTION__'

export default [
  {
    input: 'guest-js/index.ts',
    output: [
      { file: pkg.exports['.'].import, format: 'esm' },
      { file: pkg.exports['.'].require, format: 'cjs' }
    ],
    plugins: [
      typescript({
        noEmit: false,
        declaration: true,
        declarationDir: dirname(pkg.exports['.'].import),
        rootDir: 'guest-js'
      })
    ],
    external: [/^@tauri-apps\/api/]
  },
  {
    input: 'guest-js/index.ts',
    output: {
      format: 'iife',
      name: iifeName,
      file: 'api-iife.js',
      banner: "if ('__TAURI__' in window) {",
      footer: `Object.defineProperty(window.__TAURI__, 'leaderElection', { value: ${iifeName} }) }`
    },
    plugins: [typescript({ noEmit: false, declaration: false, rootDir: 'guest-js' }), nodeResolve(), terser()]
  }
]
