// What an operator meets before the first request: settings, .env, database errors, the scripts.
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { createServer, type AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import mysql from 'mysql2/promise';
import { verifyToken } from '../src/auth/jwt.js';
import { AppConfig, ConfigError, loadConfig, readEnvFile } from '../src/config/app-config.js';
import { DatabaseUnreachableError, ensureDatabase, lostWhileStarting } from '../src/database/bootstrap-database.js';
import { dropTestDatabase, testConfig } from './support/harness.js';
import { freePort } from './support/net.js';
import { startTcpProxy } from './support/tcp-proxy.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));

/** process.env must stay Node's own object (loadEnvFile writes to it), so it is restored key by key. */
function restoreEnv(saved: Record<string, string | undefined>): void {
  for (const name of Object.keys(process.env)) if (!(name in saved)) delete process.env[name];
  Object.assign(process.env, saved);
}

describe('settings are refused at boot with the name of the setting', () => {
  it.each([
    ['EXPIRE_CRON', 'every minute'],
    ['EXPIRE_CRON', '61 * * * * *'],
    ['RECONCILE_CRON', '0 0 25 * * *'],
    // Valid, but no date matches: the job's start threw, a stack trace instead of the setting's name.
    ['RECONCILE_CRON', '0 0 0 31 2 *'],
    ['EXPIRE_CRON', '0 0 0 30 2 *'],
    ['RECONCILE_TIMEZONE', 'Mars/Base'],
    // Number() would have read these as 3102, 3000 and 7.
    ['PORT', '0x0C1E'],
    ['PORT', '3e3'],
    ['PORT', ' 7'],
    ['PORT', '0'],
    ['DB_POOL_SIZE', '20.5'],
    ['REDIS_URL', 'http://cache:6379'],
    ['REDIS_URL', 'redis://'],
    ['REDIS_URL', 'cache 6379'],
    // ioredis would send SELECT sessions, which Redis refuses.
    ['REDIS_URL', 'redis://cache:6379/sessions'],
    ['WEBHOOK_ALLOWED_HOSTS', 'http://bad_host!!,,'],
    ['WEBHOOK_ALLOWED_HOSTS', 'hooks.example.com/path'],
    ['METRICS_TOKEN', ''],
    ['DB_HOST', ''],
    ['DB_HOST', ' '],
  ])('%s=%j', (name, value) => {
    expect(() => loadConfig({ [name]: value })).toThrow(ConfigError);
    expect(() => loadConfig({ [name]: value })).toThrow(new RegExp(`${name}: ${name} must`));
  });

  it('says only that a value is not a number, not also that it is out of range', () => {
    expect(() => loadConfig({ PORT: 'abc' })).toThrow(/^Invalid configuration:\n {2}PORT: PORT must be an integer number$/);
  });

  it('takes an optional setting left empty (REDIS_URL= in a .env file) as unset, and accepts the usual forms', () => {
    const empty = loadConfig({ REDIS_URL: '', WEBHOOK_ALLOWED_HOSTS: '', CORS_ORIGINS: '' });
    expect([empty.REDIS_URL, empty.WEBHOOK_ALLOWED_HOSTS, empty.CORS_ORIGINS]).toEqual([undefined, undefined, undefined]);
    // Every form ioredis connects to.
    for (const url of [
      'redis://127.0.0.1:6379',
      'redis://:secret@cache:6379/2',
      'rediss://user:pw@cache.example.com',
      'redis:6379',
      'localhost',
      '6379',
      '/var/run/redis.sock',
    ])
      expect(loadConfig({ REDIS_URL: url }).REDIS_URL).toBe(url);
    for (const hosts of ['hooks.example.com, *.partner.test,10.0.0.5', 'hooks_svc.internal,', '[::1],hooks.example.com.'])
      expect(loadConfig({ WEBHOOK_ALLOWED_HOSTS: hosts }).WEBHOOK_ALLOWED_HOSTS).toBe(hosts);
    expect(loadConfig({ DB_HOST: 'db-1.internal', PORT: '8080' })).toMatchObject({ DB_HOST: 'db-1.internal', PORT: 8080 });
  });

  it('accepts cron expressions with seconds, aliases and IANA zones', () => {
    const c = loadConfig({ EXPIRE_CRON: '*/10 * * * * *', RECONCILE_CRON: '@daily', RECONCILE_TIMEZONE: 'Asia/Shanghai' });
    expect([c.EXPIRE_CRON, c.RECONCILE_CRON, c.RECONCILE_TIMEZONE]).toEqual(['*/10 * * * * *', '@daily', 'Asia/Shanghai']);
  });

  it('production refuses placeholder secrets, not only the default', () => {
    for (const secret of ['change-me-to-a-long-random-secret', 'CHANGEME-0123456789abcdef', 'placeholder-secret-value-xyz']) {
      expect(() => loadConfig({ NODE_ENV: 'production', JWT_SECRET: secret })).toThrow(/JWT_SECRET/);
    }
    expect(loadConfig({ NODE_ENV: 'production', JWT_SECRET: '9f2c4e7a1b8d6f3e0a5c9b2d7e4f1a6c' }).JWT_SECRET).toHaveLength(32);
  });
});

describe('.env.example', () => {
  const lines = readFileSync(join(ROOT, '.env.example'), 'utf8').split('\n');
  const listed = new Map(
    lines.flatMap((l) => {
      const m = /^#? ?([A-Z][A-Z0-9_]*)=(.*)$/.exec(l);
      return m ? [[m[1], m[2]] as const] : [];
    }),
  );

  it('lists exactly the settings AppConfig reads, each with its default and a line saying what it means', () => {
    const defaults = new AppConfig() as unknown as Record<string, unknown>;
    expect([...listed.keys()].sort()).toEqual(Object.keys(defaults).sort());
    for (const [name, value] of listed) {
      expect([name, value]).toEqual([name, defaults[name] === undefined ? '' : String(defaults[name])]);
      const at = lines.findIndex((l) => l.startsWith(`# ${name}=`) || l.startsWith(`${name}=`));
      // The meaning is the comment above the setting (or above the group it belongs to).
      const above = lines.slice(0, at).reverse();
      const meaning = above.find((l) => !/^#? ?[A-Z][A-Z0-9_]*=/.test(l));
      expect([name, meaning?.startsWith('# ')]).toEqual([name, true]);
    }
  });

  it('parses as a .env file whose values load and validate', () => {
    const dir = mkdtempSync(join(tmpdir(), 'ce-env-'));
    const file = join(dir, '.env');
    // Every setting with a default, uncommented (one without a default stays unset: an empty HOST or LOG_FORMAT is refused).
    const body = lines.map((l) => l.replace(/^# ([A-Z][A-Z0-9_]*=.)/, '$1')).join('\n');
    writeFileSync(file, body);
    const saved = { ...process.env };
    try {
      for (const name of listed.keys()) delete process.env[name];
      readEnvFile(file);
      const c = loadConfig();
      expect(c.EXPIRE_CRON).toBe('0 * * * * *');
      expect(c.PORT).toBe(3000);
    } finally {
      restoreEnv(saved);
    }
  });
});

describe('readEnvFile', () => {
  const dir = mkdtempSync(join(tmpdir(), 'ce-env-'));
  const file = join(dir, '.env');
  const saved = { ...process.env };
  afterEach(() => restoreEnv(saved));

  it('fills process.env from the file, and a variable set in the shell wins', () => {
    writeFileSync(file, 'GRAB_GROUP_MAX=17\nDB_NAME=from_file\n');
    delete process.env.GRAB_GROUP_MAX;
    process.env.DB_NAME = 'from_shell';
    readEnvFile(file);
    const c = loadConfig();
    expect([c.GRAB_GROUP_MAX, c.DB_NAME]).toEqual([17, 'from_shell']);
  });

  it('a bad value from the file is refused like one from the shell', () => {
    writeFileSync(file, 'RECONCILE_TIMEZONE=Mars/Base\n');
    delete process.env.RECONCILE_TIMEZONE;
    readEnvFile(file);
    expect(() => loadConfig()).toThrow(/RECONCILE_TIMEZONE/);
  });

  it('a byte order mark before the first name is not part of it; a file it cannot read is one line naming it', () => {
    writeFileSync(file, '\uFEFFDB_NAME=after_a_bom\n');
    delete process.env.DB_NAME;
    readEnvFile(file);
    expect(loadConfig().DB_NAME).toBe('after_a_bom');
    expect(() => readEnvFile(dir)).toThrow(new ConfigError(`Cannot read ${dir}: EISDIR`));
  });

  it('no file, no change', () => {
    expect(() => readEnvFile(join(dir, 'missing.env'))).not.toThrow();
  });
});

describe('database errors at start say what happened', () => {
  it('a wrong password names the user and what to check', async () => {
    const c = testConfig({ DB_PASSWORD: 'certainly-not-the-password' });
    const err = await ensureDatabase(c).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(DatabaseUnreachableError);
    expect((err as Error).message).toMatch(new RegExp(`denied access to user '${c.DB_USER}'.*Check DB_USER and DB_PASSWORD`));
    expect((err as Error).message).not.toMatch(/Cannot reach/);
  });

  it('nothing listening names the address', async () => {
    const err = await ensureDatabase(testConfig({ DB_HOST: '127.0.0.1', DB_PORT: '1' })).catch((e: unknown) => e);
    expect((err as Error).message).toMatch(/Cannot reach MySQL at 127\.0\.0\.1:1 .*ECONNREFUSED/);
  });

  // The host is lost after the start's first connections: 1 is ensureDatabase's (lost while migrating), 2 adds the migrations'
  // (lost while the app's data source connects), 5 is within the pool's warm-up (a lifecycle hook).
  it.each([1, 2, 5])(
    'the database lost after %i connection(s) of a start: one line naming the host, exit 1',
    async (acceptAtMost) => {
      const c = testConfig();
      const proxy = await startTcpProxy({ host: c.DB_HOST, port: c.DB_PORT }, { acceptAtMost });
      try {
        await promisify(execFile)(process.execPath, ['scripts/ensure-built.mjs'], { cwd: ROOT });
        const r = await promisify(execFile)(process.execPath, ['dist/src/main.js'], {
          cwd: ROOT,
          env: {
            ...process.env,
            DB_NAME: c.DB_NAME,
            DB_HOST: '127.0.0.1',
            DB_PORT: String(proxy.port),
            PORT: String(await freePort()),
            LOG_LEVEL: 'silent',
          },
        }).then(
          () => ({ code: 0, stderr: '' }),
          (err: { code: number; stderr: string }) => err,
        );
        expect(r.code).toBe(1);
        expect(r.stderr).toMatch(new RegExp(`^coupon-engine: Lost MySQL at 127\\.0\\.0\\.1:${proxy.port} while starting \\(`));
        expect(r.stderr).not.toMatch(/\n\s+at /);
      } finally {
        await proxy.close();
        await dropTestDatabase(c);
      }
    },
    120_000,
  );

  it('a server at max_connections while the pool opens names DB_POOL_SIZE and max_connections, not an outage to wait out', () => {
    const refused = Object.assign(new Error('Too many connections'), { code: 'ER_CON_COUNT_ERROR', errno: 1040 });
    const c = loadConfig({ DB_POOL_SIZE: '500' });
    expect(() => lostWhileStarting(c)(refused)).toThrow(
      /^MySQL at 127\.0\.0\.1:3306 refused more connections while starting \(ER_CON_COUNT_ERROR: Too many connections\)\. This instance opens DB_POOL_SIZE \(500\) \+ 1; lower DB_POOL_SIZE or raise the server's max_connections/,
    );
  });

  it('an account allowed only into its existing database needs no CREATE privilege', async () => {
    const c = testConfig();
    const root = await mysql.createConnection({ host: c.DB_HOST, port: c.DB_PORT, user: c.DB_USER, password: c.DB_PASSWORD });
    const user = `ce_ops_${process.pid}`;
    try {
      await root.query(`CREATE DATABASE \`${c.DB_NAME}\``);
      await root.query(`CREATE USER ?@'%' IDENTIFIED BY 'pw-0123456789'`, [user]);
      await root.query(`GRANT SELECT ON \`${c.DB_NAME}\`.* TO ?@'%'`, [user]);
      await expect(ensureDatabase({ ...c, DB_USER: user, DB_PASSWORD: 'pw-0123456789' })).resolves.toBeUndefined();
      const missing = { ...c, DB_NAME: `${c.DB_NAME}_x`, DB_USER: user, DB_PASSWORD: 'pw-0123456789' };
      // The fault suite's read_only scenario (same server, another test file) refuses a CREATE from non-SUPER accounts for a few seconds.
      let err: Error;
      do err = (await ensureDatabase(missing).catch((e: unknown) => e)) as Error;
      while (/read-only/.test(err.message) && (await new Promise((r) => setTimeout(r, 500, true))));
      expect(err.message).toMatch(new RegExp(`User '${user}' may not create or use database ${missing.DB_NAME}`));
    } finally {
      await root.query(`DROP USER IF EXISTS ?@'%'`, [user]);
      await root.end();
      await dropTestDatabase(c);
    }
  });
});

// The scripts as an operator runs them (npm run -s ...), from a build the first call makes.
describe('npm scripts', () => {
  const npm = (args: string[], env: Record<string, string> = {}) =>
    // FORCE_COLOR=0: with CI set, TypeORM's CLI colours the file name it prints (chalk turns colour on for CI).
    promisify(execFile)('npm', ['run', '-s', ...args], { cwd: ROOT, env: { ...process.env, FORCE_COLOR: '0', ...env } }).then(
      ({ stdout, stderr }) => ({ code: 0, stdout, stderr }),
      (err: { code: number; stdout: string; stderr: string }) => ({ code: err.code, stdout: err.stdout, stderr: err.stderr }),
    );
  const secret = 'ops-test-secret-0123456789';

  it('token: several roles, a service token, and no rebuild on a built tree', async () => {
    await npm(['token', '--', '--user', 'warmup'], { JWT_SECRET: secret });
    const built = statSync(join(ROOT, 'dist/scripts/token.js')).mtimeMs;
    const both = await npm(['token', '--', '--user', 'ops', '--role', 'service,admin'], { JWT_SECRET: secret });
    expect(both.code).toBe(0);
    expect(verifyToken(secret, both.stdout.trim(), 3600)).toEqual({ userId: 'ops', roles: ['service', 'admin'] });
    expect(both.stderr).not.toMatch(/compiling/);
    expect(statSync(join(ROOT, 'dist/scripts/token.js')).mtimeMs).toBe(built);
    const service = await npm(['token', '--', '--user', 'order-service', '--role', 'service'], { JWT_SECRET: secret });
    expect(verifyToken(secret, service.stdout.trim(), 3600)).toEqual({ userId: 'order-service', roles: ['service'] });
  }, 180_000);

  it('token: --help, and mistakes answered with usage, not a stack trace', async () => {
    const help = await npm(['token', '--', '--help']);
    expect(help.code).toBe(0);
    expect(help.stdout).toMatch(/usage: npm run -s token -- --user <id>/);
    for (const args of [
      ['--user', 'a', '--role', 'root'],
      ['--bogus'],
      ['--role', 'admin'],
      ['--user', 'a', '--ttl', 'soon'],
      ['--user', 'a', '--ttl', '99999999'],
    ]) {
      const r = await npm(['token', '--', ...args]);
      expect([args, r.code]).toEqual([args, 2]);
      expect(r.stderr).toMatch(/^token: .*\n\nusage:/);
      expect(r.stderr).not.toMatch(/\n\s+at /);
    }
  }, 120_000);

  it('migration:show on a database that does not exist yet creates it and lists the migrations as pending', async () => {
    const c = testConfig();
    try {
      const r = await npm(['migration:show'], { DB_NAME: c.DB_NAME });
      expect(r.code).toBe(0);
      expect(r.stdout).toMatch(/\[ \] InitialSchema1764460800000/);
      const run = await npm(['migration:run'], { DB_NAME: c.DB_NAME });
      expect(run.code).toBe(0);
      expect((await npm(['migration:show'], { DB_NAME: c.DB_NAME })).stdout).toMatch(/\[X\] \d+ InitialSchema1764460800000/);
    } finally {
      await dropTestDatabase(c);
    }
  }, 120_000);

  it('migration:run with a wrong password: one line saying so, exit 1', async () => {
    const r = await npm(['migration:run'], { DB_PASSWORD: 'certainly-not-the-password' });
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/^coupon-engine: MySQL at .* denied access to user/);
    expect(r.stderr).not.toMatch(/\n\s+at /);
  }, 120_000);

  it('npm start on a port another process holds: one line naming the address, exit 1', async () => {
    const c = testConfig();
    const taken = createServer();
    await new Promise<void>((resolve) => taken.listen(0, '127.0.0.1', resolve));
    const port = (taken.address() as AddressInfo).port;
    try {
      await promisify(execFile)(process.execPath, ['scripts/ensure-built.mjs'], { cwd: ROOT });
      const r = await promisify(execFile)(process.execPath, ['dist/src/main.js'], {
        cwd: ROOT,
        env: { ...process.env, DB_NAME: c.DB_NAME, HOST: '127.0.0.1', PORT: String(port), LOG_LEVEL: 'silent' },
      }).then(
        () => ({ code: 0, stderr: '' }),
        (err: { code: number; stderr: string }) => err,
      );
      expect(r.code).toBe(1);
      expect(r.stderr).toBe(
        `coupon-engine: Cannot listen on 127.0.0.1:${port}: another process is listening there (choose another PORT, or stop it)\n`,
      );
    } finally {
      taken.close();
      await dropTestDatabase(c);
    }
  }, 120_000);

  it('migration:create writes an empty migration where it is told', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'ce-mig-'));
    const r = await npm(['migration:create', '--', join(dir, 'AddThing')]);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/Migration .*-AddThing\.ts has been generated successfully/);
  }, 120_000);
});
