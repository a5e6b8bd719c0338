// npm run bench:driver [-- --statements 20000 --rounds 3]
// What mysql2's `trace` option costs this process per statement, through TypeORM as the service
// uses it (its data source options, a pool of DB_POOL_SIZE, that many statements in flight; not the
// request-deadline wrapper database.module.ts adds, the same for both settings). With
// `trace` on (mysql2's default) every statement captures a stack trace before it is sent; the service
// turns it off (data-source-options.ts). Rounds alternate the two settings; CPU is this process's.
import { parseArgs } from 'node:util';
import { DataSource } from 'typeorm';
import { loadConfig } from '../src/config/app-config.js';
import { dataSourceOptions } from '../src/database/data-source-options.js';

const { values: opt } = parseArgs({
  options: { statements: { type: 'string', default: '20000' }, rounds: { type: 'string', default: '3' } },
});
const STATEMENTS = Number.parseInt(opt.statements ?? '', 10);
const ROUNDS = Number.parseInt(opt.rounds ?? '', 10);
if (![STATEMENTS, ROUNDS].every((n) => Number.isInteger(n) && n > 0)) {
  console.error('--statements and --rounds take positive integers');
  process.exit(2);
}

// The `mysql` schema always exists: nothing here needs the service's tables.
const config = loadConfig({ ...process.env, DB_NAME: 'mysql' });
const options = dataSourceOptions(config);

/** CPU of this process per statement, µs, with `trace` as given. */
async function cpuPerStatement(trace: boolean): Promise<number> {
  const ds = new DataSource({ ...options, migrations: [], extra: { ...options.extra, trace } });
  await ds.initialize();
  try {
    const inFlight = config.DB_POOL_SIZE;
    const each = Math.ceil(STATEMENTS / inFlight);
    const burst = async (n: number) => {
      await Promise.all(
        Array.from({ length: inFlight }, async () => {
          for (let i = 0; i < n; i++) await ds.query('SELECT ? AS n', [i]);
        }),
      );
    };
    await burst(Math.ceil(each / 10)); // warm-up: connections opened, code optimized
    const before = process.cpuUsage();
    await burst(each);
    const used = process.cpuUsage(before);
    return (used.user + used.system) / (each * inFlight);
  } finally {
    await ds.destroy();
  }
}

const rows: string[] = [];
const ratios: number[] = [];
for (let round = 1; round <= ROUNDS; round++) {
  // Alternating which goes first, so a machine getting busier favours neither.
  const order = round % 2 === 1 ? [true, false] : [false, true];
  const cpu: Record<string, number> = {};
  for (const trace of order) cpu[String(trace)] = await cpuPerStatement(trace);
  const ratio = cpu.false / cpu.true;
  ratios.push(ratio);
  rows.push(`| ${round} | ${cpu.true.toFixed(1)} | ${cpu.false.toFixed(1)} | ${ratio.toFixed(2)} |`);
}
const median = [...ratios].sort((a, b) => a - b)[Math.floor(ratios.length / 2)];
console.log(`Command: \`npm run bench:driver -- --statements ${STATEMENTS} --rounds ${ROUNDS}\` · ${new Date().toISOString()}\n`);
console.log('| round | trace on: CPU µs per statement | trace off | off ÷ on |');
console.log('|--:|--:|--:|--:|');
for (const row of rows) console.log(row);
console.log(`| median | | | ${median.toFixed(2)} |`);
