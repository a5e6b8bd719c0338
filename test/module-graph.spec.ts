import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, normalize, relative, sep } from 'node:path';

const SRC = join(dirname(new URL(import.meta.url).pathname), '..', 'src');

function sources(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? sources(join(dir, e.name)) : e.name.endsWith('.ts') ? [join(dir, e.name)] : [],
  );
}

const folderOf = (file: string) => relative(SRC, file).split(sep)[0];

/** folder -> the other src/ folders its files import. Files directly in src/ (the app root) wire everything and are left out. */
function importGraph(): Map<string, Set<string>> {
  const graph = new Map<string, Set<string>>();
  for (const file of sources(SRC)) {
    if (!relative(SRC, file).includes(sep)) continue;
    for (const m of readFileSync(file, 'utf8').matchAll(/from '(\.{1,2}\/[^']+)'/g)) {
      const target = normalize(join(dirname(file), m[1]));
      if (!target.startsWith(SRC + sep) || !relative(SRC, target).includes(sep)) continue;
      const [from, to] = [folderOf(file), folderOf(target)];
      if (from !== to) graph.set(from, (graph.get(from) ?? new Set()).add(to));
    }
  }
  return graph;
}

describe('module folders under src/', () => {
  const graph = importGraph();

  it('import each other in one direction only', () => {
    const mutual = [...graph].flatMap(([a, tos]) => [...tos].filter((b) => a < b && graph.get(b)?.has(a)).map((b) => `${a} <-> ${b}`));
    expect(mutual).toEqual([]);
    expect(graph.get('coupon')?.has('ledger')).toBe(true);
  });

  it('the ledger imports no feature module', () => {
    expect([...(graph.get('ledger') ?? [])].sort()).toEqual(['common', 'database']);
  });
});
