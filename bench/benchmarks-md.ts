import { existsSync, readFileSync, writeFileSync } from 'node:fs';

/**
 * Replaces one benchmark's section of BENCHMARKS.md (between its markers), leaving every other
 * section alone; a section not there yet goes at the end.
 */
export function updateBenchmarksMd(id: string, writtenBy: string, markdown: string): void {
  const file = 'BENCHMARKS.md';
  const begin = `<!-- ${id}:begin (written by ${writtenBy}) -->`;
  const end = `<!-- ${id}:end -->`;
  const section = `${begin}\n${markdown}\n${end}`;
  const text = existsSync(file) ? readFileSync(file, 'utf8') : '# Benchmarks\n';
  const a = text.indexOf(begin);
  const b = text.indexOf(end);
  writeFileSync(file, a >= 0 && b > a ? text.slice(0, a) + section + text.slice(b + end.length) : `${text.trimEnd()}\n\n${section}\n`);
}
