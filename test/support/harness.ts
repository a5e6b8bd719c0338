import { randomBytes } from 'node:crypto';
import { existsSync, writeFileSync } from 'node:fs';
import { Agent, type IncomingMessage, type ServerResponse } from 'node:http';
import { join } from 'node:path';
import { expect } from '@jest/globals';
import type { NestFastifyApplication } from '@nestjs/platform-fastify';
import { DataSource } from 'typeorm';
import { createApp } from '../../src/app.factory.js';
import { signToken } from '../../src/auth/jwt.js';
import type { Role } from '../../src/auth/principal.js';
import { AppConfig, loadConfig } from '../../src/config/app-config.js';
import { ensureDatabase, migrate } from '../../src/database/bootstrap-database.js';
import { dataSourceOptions } from '../../src/database/data-source-options.js';
import { type Answer, ContractChecker } from './contract.js';
import { dropTestDatabase, pickEnv } from './database.js';

export { dropTestDatabase, pickEnv };

/** Where each app records the answers it checked (created by the jest global setup). */
const SEEN_DIR = 'test-results/contract-coverage';

export const TEST_SECRET = 'test-secret-0123456789abcdef';

/** A config for tests: its own database, quiet logs, no cron. */
export function testConfig(overrides: Record<string, string> = {}): AppConfig {
  const dbName = `ce_test_${process.pid}_${randomBytes(4).toString('hex')}`;
  return loadConfig({
    DB_NAME: dbName,
    JWT_SECRET: TEST_SECRET,
    LOG_LEVEL: 'warn',
    SCHEDULER_ENABLED: 'false',
    WEBHOOK_RELAY_ENABLED: 'false',
    BULK_RUNNER_ENABLED: 'false',
    RATE_LIMIT_ENABLED: 'false',
    NODE_ENV: 'test',
    DB_POOL_SIZE: '20',
    // The deadline is tested in deadlines.spec.ts; elsewhere a loaded machine's slowness must not become a 503.
    REQUEST_TIMEOUT_MS: '60000',
    ...pickEnv('DB_HOST', 'DB_PORT', 'DB_USER', 'DB_PASSWORD'),
    ...overrides,
  });
}

/** Creates and migrates the config's database (the same migrations the service runs). */
export async function createTestDatabase(config: AppConfig): Promise<void> {
  await ensureDatabase(config);
  await migrate(config);
}

export interface TestApp {
  app: NestFastifyApplication;
  config: AppConfig;
  url: string;
  /** A separate connection pool for assertions and fault injection, never the app's own. */
  db: DataSource;
  close(): Promise<void>;
  /** Checks an answer the server sent before any route ran (read off a raw socket) like every other. */
  checkAnswer(answer: Answer): void;
}

/** A migrated database of its own and the real app listening on a free port. Call close() in afterAll. */
export async function startTestApp(overrides: Record<string, string> = {}, existing?: AppConfig): Promise<TestApp> {
  const config = existing ?? testConfig(overrides);
  if (!existing) await createTestDatabase(config);
  const app = await createApp(config);
  const contract = checkAnswers(app);
  await app.listen({ port: 0, host: '127.0.0.1' });
  const address = app.getHttpServer().address() as { port: number };
  const db = new DataSource({ ...dataSourceOptions(config), poolSize: 5 });
  await db.initialize();
  return {
    app,
    config,
    url: `http://127.0.0.1:${address.port}`,
    db,
    async close() {
      await app.close();
      await db.destroy();
      if (!existing) await dropTestDatabase(config);
      contract.finish();
    },
    checkAnswer: (answer) => contract.check(answer, `${answer.method} ${answer.route ?? '(no route)'}`),
  };
}

/**
 * Answers checked against the committed OpenAPI document, and what departs from it: a suite
 * calls finish() at its end, which records what was seen for the coverage report and fails naming
 * the test, the request, the status and each mismatch. The harness's apps and the fault suite's
 * client (test/faults/support/http.ts) both check through one.
 */
export class ContractLog {
  readonly checker = new ContractChecker();
  private readonly problems = new Map<string, number>();

  /** `request` names it in a mismatch (`GET /coupons/1`). */
  check(answer: Answer, request: string): void {
    let found: string[];
    try {
      found = this.checker.check(answer);
    } catch (err) {
      found = [`the checker failed: ${(err as Error).message}`];
    }
    if (found.length > 0) {
      const problem = `[${expect.getState().currentTestName ?? 'outside a test'}] ${request} -> ${answer.status}: ${found.join('; ')}`;
      this.problems.set(problem, (this.problems.get(problem) ?? 0) + 1);
    }
  }

  finish(): void {
    recordSeen(this.checker.seen);
    this.checker.seen.clear();
    if (this.problems.size === 0) return;
    const lines = [...this.problems].map(([problem, n]) => (n > 1 ? `${problem} (${n} times)` : problem));
    this.problems.clear();
    throw new Error(`${lines.length} kind(s) of answer do not match docs/openapi.json:\n${lines.slice(0, 50).join('\n')}`);
  }
}

const isJson = (contentType: string | undefined) => /^application\/json\s*(;|$)/i.test(contentType ?? '');

/** The route of a request the app may answer ahead of Fastify (ahead-of-fastify.ts). */
function aheadRouteOf(req: IncomingMessage): string | undefined {
  const url = req.url ?? '';
  if (req.method === 'POST') return /^\/coupons\/[0-9]+\/grab$/.test(url) ? '/coupons/:couponId/grab' : undefined;
  const read = req.method === 'GET' ? /^\/coupons(\/[0-9]+)?(\?|$)/.exec(url) : null;
  return read ? (read[1] === undefined ? '/coupons' : '/coupons/:couponId') : undefined;
}

/**
 * Every answer the app sends is checked as it leaves the server, so every e2e suite checks the
 * contract on all its traffic: Fastify's answers in onSend, and the page, the list and the grab
 * answered ahead of Fastify (ahead-of-fastify.ts) when their answer has gone.
 */
function checkAnswers(app: NestFastifyApplication): ContractLog {
  const log = new ContractLog();
  const fastify = app.getHttpAdapter().getInstance();
  const viaFastify = new WeakSet<IncomingMessage>();
  fastify.addHook('onSend', (req, reply, payload, done) => {
    viaFastify.add(req.raw);
    log.check(
      {
        method: req.method,
        route: req.routeOptions.url,
        status: reply.statusCode,
        headers: reply.getHeaders(),
        body: typeof payload === 'string' || Buffer.isBuffer(payload) ? payload : undefined,
        requestBody: isJson(req.headers['content-type']) ? req.body : undefined,
      },
      `${req.method} ${req.routeOptions.url ?? req.url}`,
    );
    done(null, payload);
  });
  fastify.server.prependListener('request', (req: IncomingMessage, res: ServerResponse) => {
    const route = aheadRouteOf(req);
    if (!route) return;
    // Node's writeHead takes headers that getHeaders() then does not show.
    const writeHead = res.writeHead.bind(res) as (...args: unknown[]) => ServerResponse;
    const end = res.end.bind(res) as (...args: unknown[]) => ServerResponse;
    let headers: Record<string, unknown> = {};
    let body: Buffer | string | undefined;
    res.writeHead = ((...args: unknown[]) => {
      const given = args.find((a) => typeof a === 'object' && a !== null && !Array.isArray(a)) as Record<string, unknown> | undefined;
      headers = Object.fromEntries(Object.entries(given ?? {}).map(([k, v]) => [k.toLowerCase(), v]));
      return writeHead(...args);
    }) as typeof res.writeHead;
    res.end = ((...args: unknown[]) => {
      if (Buffer.isBuffer(args[0]) || typeof args[0] === 'string') body = args[0];
      return end(...args);
    }) as typeof res.end;
    res.once('finish', () => {
      // The reads are answered 200 only; Fastify's own refusals of a malformed path skip onSend, and are not checked here either.
      if (viaFastify.has(req) || (req.method === 'GET' && res.statusCode !== 200)) return;
      const answer = { method: req.method as string, route, status: res.statusCode, headers: { ...res.getHeaders(), ...headers }, body };
      log.check(answer, `${req.method} ${route} (ahead of Fastify)`);
    });
  });
  return log;
}

/** For the run's coverage report (test/support/contract-coverage.mjs); absent when jest ran without its global setup. */
function recordSeen(seen: Set<string>): void {
  if (!existsSync(SEEN_DIR) || seen.size === 0) return;
  writeFileSync(join(SEEN_DIR, `${process.pid}-${randomBytes(4).toString('hex')}.json`), JSON.stringify([...seen]));
}

export function tokenFor(userId: string, roles: Role[] = [], ttlSeconds = 3600): string {
  return signToken(TEST_SECRET, userId, roles, ttlSeconds);
}
export const adminToken = () => tokenFor('admin-1', ['admin']);
export const serviceToken = () => tokenFor('order-service', ['service']);
export const bearer = (token: string) => ({ Authorization: `Bearer ${token}` });

/**
 * For bursts of thousands of requests: all are in flight at once from the test's side, over at most
 * 256 kept-alive sockets, so the listen backlog of a loaded 2-core machine does not reset connections.
 */
export const burstAgent = new Agent({ keepAlive: true, maxSockets: 256 });
