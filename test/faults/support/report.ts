import { appendFileSync } from 'node:fs';
import { join } from 'node:path';
import { ROOT } from './server.js';

export interface Figures {
  scenario: string;
  requests: number;
  faults: number;
  violations: number;
  acknowledgedWritesLost: number;
  [detail: string]: string | number;
}

export const FIGURES_FILE = join(ROOT, 'node_modules/.cache/coupon-engine-faults/figures.jsonl');

/** One line per scenario on the console and in FIGURES_FILE, from which docs/reliability.md takes its numbers. */
export function report(f: Figures): void {
  appendFileSync(FIGURES_FILE, `${JSON.stringify({ at: new Date().toISOString(), ...f })}\n`);
  console.log(
    `[faults] ${Object.entries(f)
      .map(([k, v]) => `${k}=${v}`)
      .join(' ')}`,
  );
}
