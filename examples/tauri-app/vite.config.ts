import { fileURLToPath } from 'node:url'
import { defineConfig } from 'vite'

// Built from the repository root (`npm run build:example`), so the example
// uses the root's node_modules and the plugin's guest-js source directly.
export default defineConfig({
  root: fileURLToPath(new URL('.', import.meta.url)),
  resolve: {
    alias: {
      'tauri-plugin-leader-election-api': fileURLToPath(new URL('../../guest-js/index.ts', import.meta.url))
    },
    dedupe: ['@tauri-apps/api']
  },
  build: {
    outDir: 'dist',
    emptyOutDir: true,
    target: 'safari13'
  },
  clearScreen: false
})
