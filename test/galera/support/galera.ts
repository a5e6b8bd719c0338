import { ChildProcess, spawn, spawnSync } from 'node:child_process';
import { cpSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import mysql from 'mysql2/promise';
import { freePort } from '../../support/net.js';

export const GALERA_PROVIDER = '/usr/lib/galera/libgalera_smm.so';
const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/**
 * Group communication timeouts far below the defaults (suspect 5 s, inactive 15 s), so the cluster
 * drops a killed node in about 2 s instead of stalling writes for 6 s or more; loopback has no
 * jitter to be tolerant of. docs/cluster.md explains each.
 */
export const FAST_FAILURE_DETECTION = [
  'evs.keepalive_period=PT0.3S',
  'evs.inactive_check_period=PT0.5S',
  'evs.suspect_timeout=PT1.5S',
  'evs.inactive_timeout=PT3S',
  'evs.install_timeout=PT3S',
];

export interface GaleraNode {
  name: string;
  port: number;
  dataDir: string;
  /** kill -9 of the node's mariadbd. */
  kill(): Promise<void>;
  readonly alive: boolean;
}

export interface GaleraCluster {
  nodes: GaleraNode[];
  /** `127.0.0.1:p1,127.0.0.1:p2,...` starting at node `first` and wrapping around: that instance's DB_HOSTS. */
  hostsFrom(first: number): string;
  /** A root connection to a node, with causal reads (wsrep_sync_wait), so it sees every commit the cluster acknowledged. */
  connect(node: number): Promise<mysql.Connection>;
  stop(): Promise<void>;
}

/** Installs Debian's galera-4 if the provider library is missing (apt-get update once). */
export function ensureGaleraInstalled(): void {
  if (existsSync(GALERA_PROVIDER)) return;
  if (process.getuid?.() !== 0) throw new Error(`${GALERA_PROVIDER} is missing and this is not root: apt-get install galera-4`);
  for (const args of [['update'], ['install', '-y', '--no-install-recommends', 'galera-4']]) {
    const r = spawnSync('apt-get', args, { stdio: 'inherit', env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive' } });
    if (r.status !== 0) throw new Error(`apt-get ${args.join(' ')} failed (${r.status})`);
  }
  if (!existsSync(GALERA_PROVIDER)) throw new Error(`galera-4 installed but ${GALERA_PROVIDER} is still missing`);
}

const started = new Set<ChildProcess>();
const dirs = new Set<string>();
/** Whatever happens to the test process (a failure, a crash, Ctrl-C), no mariadbd or data directory outlives it. */
function teardownEverything(): void {
  for (const child of started) child.kill('SIGKILL');
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
}
process.on('exit', teardownEverything);
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.once(signal, () => {
    teardownEverything();
    process.exit(128 + (signal === 'SIGINT' ? 2 : 15));
  });
}

function run(cmd: string, args: string[]): void {
  const r = spawnSync(cmd, args, { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(' ')} failed (${r.status}): ${r.stderr}${r.stdout}`);
}

async function waitFor<T>(what: string, ms: number, probe: () => Promise<T | undefined>): Promise<T> {
  const deadline = Date.now() + ms;
  let last: unknown;
  for (;;) {
    try {
      const v = await probe();
      if (v !== undefined) return v;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline) throw new Error(`${what} not ready after ${ms} ms: ${String(last ?? 'no answer')}`);
    await sleep(200);
  }
}

async function status(port: number, name: string): Promise<string | undefined> {
  const conn = await mysql.createConnection({ host: '127.0.0.1', port, user: 'root', connectTimeout: 1000 });
  try {
    const [rows] = await conn.query<mysql.RowDataPacket[]>(`SHOW GLOBAL STATUS LIKE ?`, [name]);
    return rows[0]?.Value as string | undefined;
  } finally {
    await conn.end();
  }
}

/**
 * Starts a 3-node MariaDB Galera cluster on loopback ports, data under a private /tmp directory, as
 * the mysql user. No state transfer is needed: node 1 is initialised and bootstrapped once, stopped,
 * and its data directory copied to the others, so all three start with the same cluster state.
 */
export async function startGaleraCluster(size = 3): Promise<GaleraCluster> {
  ensureGaleraInstalled();
  const root = mkdtempSync(join(tmpdir(), 'ce-galera-'));
  dirs.add(root);
  const asRoot = process.getuid?.() === 0;
  if (asRoot) run('chown', ['mysql:mysql', root]);
  const ports = await Promise.all(Array.from({ length: size }, async () => ({ sql: await freePort(), gcomm: await freePort() })));
  const gcomm = `gcomm://${ports.map((p) => `127.0.0.1:${p.gcomm}`).join(',')}`;
  const children: (ChildProcess | null)[] = new Array<ChildProcess | null>(size).fill(null);
  const dataDir = (i: number) => join(root, `node${i + 1}`);

  const startNode = async (i: number, bootstrap: boolean) => {
    const d = dataDir(i);
    const args = [
      '--no-defaults',
      ...(asRoot ? ['--user=mysql'] : []),
      `--datadir=${d}`,
      `--port=${ports[i].sql}`,
      '--bind-address=127.0.0.1',
      `--socket=${join(d, 'mysqld.sock')}`,
      `--pid-file=${join(d, 'mysqld.pid')}`,
      `--log-error=${join(d, 'error.log')}`,
      '--binlog-format=ROW',
      '--innodb-autoinc-lock-mode=2',
      '--innodb-buffer-pool-size=64M',
      '--innodb-flush-log-at-trx-commit=2',
      '--max-connections=400',
      '--performance-schema=OFF',
      '--wsrep-on=ON',
      `--wsrep-provider=${GALERA_PROVIDER}`,
      '--wsrep-cluster-name=coupon-engine-test',
      `--wsrep-cluster-address=${bootstrap ? 'gcomm://' : gcomm}`,
      `--wsrep-node-name=node${i + 1}`,
      `--wsrep-node-address=127.0.0.1:${ports[i].gcomm}`,
      `--wsrep-provider-options=${[
        `base_port=${ports[i].gcomm}`,
        `gmcast.listen_addr=tcp://127.0.0.1:${ports[i].gcomm}`,
        `ist.recv_addr=127.0.0.1:${await freePort()}`,
        'gcache.size=64M',
        ...FAST_FAILURE_DETECTION,
      ].join(';')}`,
      `--wsrep-sst-receive-address=127.0.0.1:${await freePort()}`,
      ...(bootstrap ? ['--wsrep-new-cluster'] : []),
    ];
    const child = spawn('/usr/sbin/mariadbd', args, { stdio: 'ignore' });
    started.add(child);
    child.once('exit', () => started.delete(child));
    children[i] = child;
    await waitFor(`node${i + 1}`, 60_000, async () => {
      if (child.exitCode !== null) throw new Error(`exited ${child.exitCode}: ${readFileSync(join(d, 'error.log'), 'utf8').slice(-2000)}`);
      return (await status(ports[i].sql, 'wsrep_ready')) === 'ON' ? true : undefined;
    });
  };
  const stopNode = async (i: number, signal: NodeJS.Signals) => {
    const child = children[i];
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise<void>((ok) => child.once('exit', () => ok()));
    child.kill(signal);
    await exited;
  };

  try {
    run('mariadb-install-db', [
      '--no-defaults',
      ...(asRoot ? ['--user=mysql'] : []),
      `--datadir=${dataDir(0)}`,
      '--auth-root-authentication-method=normal',
      '--skip-test-db',
    ]);
    await startNode(0, true);
    const boot = await mysql.createConnection({ host: '127.0.0.1', port: ports[0].sql, user: 'root' });
    // The harness connects over TCP as root@127.0.0.1, like the CI's single server.
    await boot.query(`CREATE USER IF NOT EXISTS 'root'@'127.0.0.1'`);
    await boot.query(`GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION`);
    await boot.end();
    await stopNode(0, 'SIGTERM');
    for (let i = 1; i < size; i++) {
      cpSync(dataDir(0), dataDir(i), { recursive: true });
      const grastate = join(dataDir(i), 'grastate.dat');
      writeFileSync(grastate, readFileSync(grastate, 'utf8').replace(/safe_to_bootstrap:\s*1/, 'safe_to_bootstrap: 0'));
      rmSync(join(dataDir(i), 'gvwstate.dat'), { force: true });
    }
    if (asRoot) run('chown', ['-R', 'mysql:mysql', root]);
    await startNode(0, true);
    await Promise.all(Array.from({ length: size - 1 }, (_, i) => startNode(i + 1, false)));
    await waitFor('cluster of 3', 60_000, async () =>
      (await status(ports[0].sql, 'wsrep_cluster_size')) === String(size) ? true : undefined,
    );
  } catch (err) {
    await Promise.all(children.map((_, i) => stopNode(i, 'SIGKILL')));
    rmSync(root, { recursive: true, force: true });
    dirs.delete(root);
    throw err;
  }

  const nodes: GaleraNode[] = ports.map((p, i) => ({
    name: `node${i + 1}`,
    port: p.sql,
    dataDir: dataDir(i),
    kill: () => stopNode(i, 'SIGKILL'),
    get alive() {
      const c = children[i];
      return c !== null && c.exitCode === null && c.signalCode === null;
    },
  }));
  return {
    nodes,
    hostsFrom: (first) => Array.from({ length: size }, (_, k) => `127.0.0.1:${ports[(first + k) % size].sql}`).join(','),
    async connect(node) {
      const conn = await mysql.createConnection({
        host: '127.0.0.1',
        port: ports[node].sql,
        user: 'root',
        supportBigNumbers: true,
        bigNumberStrings: true,
      });
      await conn.query('SET SESSION wsrep_sync_wait = 1');
      return conn;
    },
    async stop() {
      await Promise.all(children.map((_, i) => stopNode(i, 'SIGKILL')));
      rmSync(root, { recursive: true, force: true });
      dirs.delete(root);
    },
  };
}
