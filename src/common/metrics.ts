import { collectDefaultMetrics, Counter, Gauge, Histogram, Registry } from 'prom-client';

/** One registry per process; metrics are created once, on first use, so several app instances in one process share them. */
export const registry = new Registry();
collectDefaultMetrics({ register: registry });

function getOrCreate<T>(name: string, make: () => T): T {
  return (registry.getSingleMetric(name) as T | undefined) ?? make();
}

export function counter<L extends string>(name: string, help: string, labelNames: readonly L[]): Counter<L> {
  return getOrCreate(name, () => new Counter({ name, help, labelNames, registers: [registry] }));
}

/** `collect` runs at each scrape: for values read then (from the database, the pool) rather than kept up to date. */
export function gauge<L extends string>(
  name: string,
  help: string,
  labelNames: readonly L[] = [],
  collect?: (this: Gauge<L>) => void | Promise<void>,
): Gauge<L> {
  return getOrCreate(name, () => new Gauge({ name, help, labelNames, registers: [registry], collect }));
}

export function histogram<L extends string>(name: string, help: string, labelNames: readonly L[], buckets?: number[]): Histogram<L> {
  return getOrCreate(name, () => new Histogram({ name, help, labelNames, buckets, registers: [registry] }));
}

export const httpDuration = histogram(
  'http_request_duration_seconds',
  'HTTP request duration',
  ['method', 'route', 'status'],
  [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
);
