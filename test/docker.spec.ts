// No Docker engine runs here, so the image is checked by its recipe: the rules of issue 17 read
// from the Dockerfile, .dockerignore and docker-compose.yml, and the build's output checked for
// what the runtime stage keeps.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import ignoreModule from '@balena/dockerignore';
import { parse } from 'yaml';
import { loadConfig } from '../src/config/app-config.js';

// The package's types declare an ES default export; its code is `module.exports = factory`.
const dockerignore = ignoreModule as unknown as typeof ignoreModule.default;
const ROOT = fileURLToPath(new URL('..', import.meta.url));
const read = (f: string) => readFileSync(join(ROOT, f), 'utf8');

interface Instruction {
  op: string;
  args: string;
}
/** Dockerfile instructions per stage, continuation lines joined, comments dropped. */
function stages(): Instruction[][] {
  const lines = read('Dockerfile')
    .replace(/\\\n/g, ' ')
    .split('\n')
    .filter((l) => l.trim() !== '' && !l.trimStart().startsWith('#'));
  const out: Instruction[][] = [];
  for (const line of lines) {
    const [, op, args] = /^\s*(\S+)\s*(.*)$/.exec(line) ?? [];
    if (op.toUpperCase() === 'FROM') out.push([]);
    out[out.length - 1].push({ op: op.toUpperCase(), args });
  }
  return out;
}

describe('Dockerfile', () => {
  const all = stages();
  const runtime = all[all.length - 1];
  const args = (op: string) => runtime.filter((i) => i.op === op).map((i) => i.args);

  it('is a multi-stage build whose runtime stage installs nothing and prunes nothing', () => {
    expect(all.length).toBeGreaterThanOrEqual(2);
    expect(args('RUN')).toEqual([]);
  });

  it('runs as a non-root user, exposes the port and has a health check on /health', () => {
    const users = args('USER');
    expect(users).toHaveLength(1);
    expect(users[0]).not.toMatch(/^(root|0)(:|$)/);
    expect(args('EXPOSE')).toEqual(['3000']);
    expect(args('HEALTHCHECK').join(' ')).toMatch(/CMD .*\/health/);
    // The user is set before the command, so the server never runs as root.
    expect(runtime.findIndex((i) => i.op === 'USER')).toBeLessThan(runtime.findIndex((i) => i.op === 'CMD'));
  });

  it('runs node directly (PID 1 gets SIGTERM), with the flags of start:prod', () => {
    const scripts = (JSON.parse(read('package.json')) as { scripts: Record<string, string> }).scripts;
    const cmd = JSON.parse(args('CMD')[0]) as string[];
    expect(`exec ${cmd.join(' ')}`).toBe(scripts['start:prod']);
  });

  it('keeps production dependencies from a stage that installed only those, and what migration:*, token and check:invariants run', () => {
    const copies = args('COPY');
    const from = (stage: string) => all.find((s) => new RegExp(`AS ${stage}$`, 'i').test(s[0].args));
    const depsStage = /--from=(\S+) .*node_modules/.exec(copies.join('\n'))?.[1];
    expect(depsStage).toBeDefined();
    expect(from(depsStage as string)?.some((i) => i.op === 'RUN' && /npm ci .*--omit=dev/.test(i.args))).toBe(true);
    const copied = copies.map((c) => c.replace(/--\S+\s+/g, '').split(/\s+/)[0]);
    expect(copied).toEqual(expect.arrayContaining(['/app/dist', 'package.json', 'scripts/ensure-built.mjs']));
    const pkg = JSON.parse(read('package.json')) as { scripts: Record<string, string>; dependencies: Record<string, string> };
    // The CLI the migration scripts call, and what they and token / check:invariants run, in dist/.
    expect(pkg.dependencies.typeorm).toBeDefined();
    for (const name of ['migration:run', 'migration:show', 'migration:revert', 'token', 'check:invariants']) {
      const script = pkg.scripts[name];
      const target = /(dist\/\S+\.js)/.exec(script)?.[1];
      expect([name, target]).toEqual([name, expect.stringMatching(/^dist\//)]);
    }
  });

  it('copies only sources the build context lets through', () => {
    const ig = dockerignore({ ignorecase: false }).add(read('.dockerignore'));
    const build = all[0].filter((i) => i.op === 'COPY' && !i.args.startsWith('--from'));
    const sources = build.flatMap((i) => i.args.split(/\s+/).slice(0, -1));
    for (const s of sources) expect([s, ig.ignores(s.replace(/\/$/, ''))]).toEqual([s, false]);
  });
});

describe('.dockerignore', () => {
  const ig = dockerignore({ ignorecase: false }).add(read('.dockerignore'));
  it.each([
    '.git',
    '.git/HEAD',
    '.env',
    '.env.production',
    'node_modules/x/index.js',
    'dist/src/main.js',
    'test/grab.spec.ts',
    'test/faults/crash.spec.ts',
    'bench/run.ts',
    'coverage/lcov.info',
  ])('leaves out %s', (path) => expect(ig.ignores(path)).toBe(true));
  it.each([
    'src/main.ts',
    'package.json',
    'package-lock.json',
    'scripts/token.ts',
    'ormconfig.ts',
    'src/ledger/invariants.ts',
    'tsconfig.build.json',
  ])('keeps %s', (path) => expect(ig.ignores(path)).toBe(false));
});

describe('docker-compose.yml', () => {
  const compose = parse(read('docker-compose.yml')) as { services: { app: { environment: Record<string, string> } } };
  const env = compose.services.app.environment;

  it('sets no JWT secret of its own: compose refuses to start without one from the operator', () => {
    expect(env.JWT_SECRET).toMatch(/^\$\{JWT_SECRET:\?[^}]+\}$/);
  });

  it('its settings pass validation, and production refuses any literal placeholder secret it might have carried', () => {
    const literal = Object.fromEntries(Object.entries(env).filter(([, v]) => !String(v).startsWith('${')));
    expect(() => loadConfig({ ...literal, NODE_ENV: 'production', JWT_SECRET: 'a1f9c3e7b5d2084f6a1c3e5b7d9f0a2c' })).not.toThrow();
    for (const placeholder of ['change-me-to-a-long-random-secret', 'changeme-changeme-changeme']) {
      expect(() => loadConfig({ ...literal, NODE_ENV: 'production', JWT_SECRET: placeholder })).toThrow(/JWT_SECRET/);
    }
  });
});
