import type { Answer } from './load.js';

export interface Latency {
  count: number;
  p50: number;
  p99: number;
  p999: number;
  max: number;
}

/** Nearest-rank percentiles, in ms: p999 of 5,000 answers is the 4,995th fastest, not an interpolation. */
export function latency(samplesMs: number[]): Latency | null {
  if (samplesMs.length === 0) return null;
  const s = Float64Array.from(samplesMs).sort();
  const at = (p: number) => s[Math.min(s.length - 1, Math.max(0, Math.ceil(p * s.length) - 1))];
  const round = (x: number) => Math.round(x * 100) / 100;
  return { count: s.length, p50: round(at(0.5)), p99: round(at(0.99)), p999: round(at(0.999)), max: round(s[s.length - 1]) };
}

/** The class an answer is counted and timed under: SUCCESS for any 2xx, TRANSPORT_ERROR for no answer, else the error code. */
export function answerClass(a: Pick<Answer, 'status' | 'code'>): string {
  if (a.status === 0) return 'TRANSPORT_ERROR';
  return a.status >= 200 && a.status < 300 ? 'SUCCESS' : (a.code ?? `HTTP_${a.status}`);
}

export function byClass(answers: readonly Answer[]): Record<string, Latency> {
  const groups = new Map<string, number[]>();
  for (const a of answers) {
    const c = answerClass(a);
    let g = groups.get(c);
    if (!g) groups.set(c, (g = []));
    g.push(a.latencyMs);
  }
  return Object.fromEntries([...groups].sort(([a], [b]) => a.localeCompare(b)).map(([c, ms]) => [c, latency(ms) as Latency]));
}
