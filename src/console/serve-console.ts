import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import fastifyStatic from '@fastify/static';
import type { NestFastifyApplication } from '@nestjs/platform-fastify';
import type { FastifyReply, FastifyRequest } from 'fastify';

/**
 * The console talks to this origin only: scripts, styles, fonts and API calls all come from here,
 * so it works offline and a script injected from elsewhere cannot run. Ant Design writes its styles
 * into <style> elements at run time, hence 'unsafe-inline' for styles alone.
 */
const CSP = [
  "default-src 'self'",
  "style-src 'self' 'unsafe-inline'",
  "img-src 'self' data:",
  "connect-src 'self'",
  "frame-ancestors 'none'",
  "base-uri 'none'",
  "form-action 'self'",
].join('; ');

/** `npm run build` writes the console to <package root>/dist/console, whether the server runs from src (tests) or dist. */
export function consoleDir(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, 'package.json'))) {
    const parent = dirname(dir);
    if (parent === dir) break;
    dir = parent;
  }
  return join(dir, 'dist', 'console');
}

function securityHeaders(reply: FastifyReply): void {
  void reply.header('content-security-policy', CSP).header('x-content-type-options', 'nosniff').header('referrer-policy', 'no-referrer');
}

/**
 * GET /console: the operators' single-page app, built by Vite. Hashed assets are cached for good;
 * every other path under /console/ is a page of the app and gets index.html (never cached, so a new
 * build shows at the next load).
 */
export async function serveConsole(app: NestFastifyApplication, root = consoleDir()): Promise<void> {
  const fastify = app.getHttpAdapter().getInstance();
  if (!existsSync(join(root, 'index.html'))) {
    const notBuilt = (_req: FastifyRequest, reply: FastifyReply) =>
      void reply.status(404).send({ code: 'NOT_FOUND', message: 'The console is not built: run npm run build' });
    fastify.get('/console', notBuilt);
    fastify.get('/console/*', notBuilt);
    return;
  }
  await app.register(fastifyStatic, {
    root,
    prefix: '/console/',
    wildcard: false,
    index: false,
    // The build's .br and .gz copies (console/vite.config.ts), chosen by Accept-Encoding, with Vary;
    // not files of their own at their own addresses.
    preCompressed: true,
    globIgnore: ['**/*.br', '**/*.gz'],
    cacheControl: false,
    setHeaders: (reply, path) => {
      securityHeaders(reply);
      void reply.header('cache-control', path.includes('/assets/') ? 'public, max-age=31536000, immutable' : 'no-cache');
    },
  });
  const page = (req: FastifyRequest, reply: FastifyReply) => {
    if (req.url.startsWith('/console/assets/')) {
      return reply.status(404).send({ code: 'NOT_FOUND', message: `No such file: ${req.url}` });
    }
    securityHeaders(reply);
    return reply.header('cache-control', 'no-cache').sendFile('index.html', root, { cacheControl: false });
  };
  fastify.get('/console', page);
  fastify.get('/console/*', page);
}
