import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vite';
import { compression } from 'vite-plugin-compression2';

const root = fileURLToPath(new URL('.', import.meta.url));
// `npm run console:dev` serves the console with hot reload and sends API calls to a server on :3000.
const api = process.env.CONSOLE_API ?? 'http://127.0.0.1:3000';

export default defineConfig({
  root,
  base: '/console/',
  // Vite's own transform (oxc) compiles the JSX; nothing here needs a React plugin.
  oxc: { jsx: { runtime: 'automatic' } },
  // Brotli and gzip copies beside each file, which the server sends to browsers that take them
  // (src/console/serve-console.ts): the 2 MB script goes as about a quarter of that.
  plugins: [compression({ algorithms: ['brotliCompress', 'gzip'], threshold: 1024, skipIfLargerOrEqual: true })],
  build: {
    outDir: fileURLToPath(new URL('../dist/console', import.meta.url)),
    emptyOutDir: true,
    chunkSizeWarningLimit: 2500,
    rolldownOptions: {
      // Ant Design marks its modules "use client" for React Server Components; a client bundle has no use for it.
      onLog(level, log, handler) {
        if (log.code === 'MODULE_LEVEL_DIRECTIVE') return;
        handler(level, log);
      },
    },
  },
  server: { proxy: { '/admin': api, '/coupons': api, '/docs-json': api } },
});
