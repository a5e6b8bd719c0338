// Compiles the project only when a source is newer than the build, so `npm run -s token`,
// `migration:*` and `check:invariants` start at once on a built tree. Plain JavaScript: it must run
// before anything is compiled. Without sources (the Docker runtime image) the build is taken as is.
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';

const root = join(import.meta.dirname, '..');
const SOURCES = ['src', 'scripts', 'test/support', 'ormconfig.ts', 'tsconfig.json', 'tsconfig.build.json'];
// One output per entry point; tsc rewrites every output on each build.
const OUTPUT = join(root, 'dist/ormconfig.js');

function newest(path) {
  if (!existsSync(path)) return 0;
  const stat = statSync(path);
  if (!stat.isDirectory()) return stat.mtimeMs;
  return Math.max(0, ...readdirSync(path).map((name) => newest(join(path, name))));
}

if (existsSync(join(root, 'src'))) {
  const built = existsSync(OUTPUT) ? statSync(OUTPUT).mtimeMs : 0;
  if (SOURCES.some((s) => newest(join(root, s)) > built)) {
    process.stderr.write('coupon-engine: sources changed since the last build, compiling (npm run build)...\n');
    try {
      execFileSync(process.execPath, [join(root, 'node_modules/typescript/bin/tsc'), '-p', join(root, 'tsconfig.build.json')], {
        cwd: root,
        stdio: ['ignore', 'inherit', 'inherit'],
      });
    } catch {
      // tsc printed the errors.
      process.exit(1);
    }
  }
}
