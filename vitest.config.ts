import { defineConfig } from 'vitest/config'

export default defineConfig({
  test: {
    include: ['test-js/**/*.test.ts'],
    // mockIPC installs window.__TAURI_INTERNALS__: a DOM-like global is needed.
    environment: 'happy-dom'
  }
})
