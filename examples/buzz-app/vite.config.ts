import { fileURLToPath } from 'node:url'
import { defineConfig } from 'vite'

// The API package comes from `tauri-plugin-leader-election-api` in
// package.json (a file: dependency on this checkout, as the README tells an
// app to install it); it must have been built (`npm ci && npm run build` at
// the repository root).
export default defineConfig({
  root: fileURLToPath(new URL('.', import.meta.url)),
  resolve: {
    // The linked package and the app each have @tauri-apps/api: use one.
    dedupe: ['@tauri-apps/api']
  },
  build: {
    outDir: 'dist',
    emptyOutDir: true,
    target: 'safari13'
  },
  clearScreen: false
})
