import { performance } from 'node:perf_hooks';
import { runWithDeadline } from '../database/deadline-pool.js';

/** What the cache holds for a key: the value and when the read that produced it was sent (or the change made). */
export interface Observation<V> {
  value: V;
  /** performance.now() when the read was sent or the change committed: the value is at least this recent. */
  at: number;
  /** Orders observations and local changes: a read sent before a change cannot replace what the change set. */
  seq: number;
}

interface Entry<V> {
  current?: Observation<V>;
  loading?: { seq: number; promise: Promise<Observation<V>> };
  /** Reads sent before this sequence number started before a change of this instance: their results are not kept. */
  floor: number;
}

/**
 * Values read from the database and served from memory for at most `ttlMs()` after the read that
 * produced them was sent. From half the TTL on, one read refreshes the value in the background while
 * it is still served, so a steady stream of requests never waits for the database; only a request
 * that finds no value younger than the TTL waits, sharing the one read in flight with the others.
 * Changes made through this instance replace the value at once (`set`) or drop it (`invalidate`),
 * and a read sent before such a change can no longer replace it when it comes back.
 */
export class FreshCache<V> {
  private readonly entries = new Map<string, Entry<V>>();
  private seq = 0;

  constructor(
    private readonly ttlMs: () => number,
    private readonly read: (key: string) => Promise<V>,
    private readonly maxKeys = 10_000,
  ) {}

  /** The value, no older than the TTL (or than the read it waited for). */
  get(key: string): Promise<Observation<V>> {
    const fresh = this.fresh(key);
    return fresh ? Promise.resolve(fresh) : this.load(key, this.entry(key), false);
  }

  /** The value if one younger than the TTL is held, without starting any read. */
  peek(key: string): Observation<V> | undefined {
    const current = this.entries.get(key)?.current;
    return current && performance.now() - current.at < this.ttlMs() ? current : undefined;
  }

  /**
   * The value if one younger than the TTL is held, starting the background refresh when it is past
   * half the TTL; undefined otherwise (nothing is read then).
   */
  fresh(key: string): Observation<V> | undefined {
    const e = this.entries.get(key);
    const current = e?.current;
    if (!e || !current) return undefined;
    const ttl = this.ttlMs();
    const age = performance.now() - current.at;
    if (age >= ttl) return undefined;
    if (age >= ttl / 2 && !e.loading) this.load(key, e, true).catch(() => undefined);
    return current;
  }

  /**
   * fresh(), or while a read replaces it, a value up to twice the TTL old: for the grab path, which
   * must not stop at the database (ahead of its rate limiter) whenever a refresh is slow, but must
   * not take a template so old that a coupon paused through another instance is still grabbed (an
   * instance served a quiet coupon's template seconds old). Undefined when get() would have to wait.
   */
  held(key: string): Observation<V> | undefined {
    const fresh = this.fresh(key);
    if (fresh) return fresh;
    const e = this.entries.get(key);
    const ttl = this.ttlMs();
    if (!e?.current || performance.now() - e.current.at >= 2 * ttl) return undefined;
    this.load(key, e, true).catch(() => undefined);
    return e.current;
  }

  /** A value this instance knows to be current now (it committed the change that made it so). */
  set(key: string, value: V): void {
    const e = this.entry(key);
    e.current = { value, at: performance.now(), seq: ++this.seq };
    e.floor = e.current.seq;
  }

  /** Forgets the value: the next request reads it again, with a read sent after this call. */
  invalidate(key: string): void {
    const e = this.entries.get(key);
    if (!e) return;
    e.current = undefined;
    e.floor = ++this.seq;
  }

  private entry(key: string): Entry<V> {
    let e = this.entries.get(key);
    if (!e) {
      // Ids nobody asked for again are dropped in bulk rather than tracked one by one.
      if (this.entries.size >= this.maxKeys) this.entries.clear();
      this.entries.set(key, (e = { floor: 0 }));
    }
    return e;
  }

  /**
   * The read in flight if it was sent after the last change of this instance, else a new one. A
   * background refresh runs with a job's limits: it is nobody's request, and a request that started
   * it may be answered long before it ends.
   */
  private load(key: string, e: Entry<V>, background: boolean): Promise<Observation<V>> {
    if (e.loading && e.loading.seq >= e.floor) return e.loading.promise;
    const seq = ++this.seq;
    const at = performance.now();
    const promise = (background ? runWithDeadline({ at: 0, answered: true }, () => this.read(key)) : this.read(key)).then(
      (value) => {
        if (e.loading?.seq === seq) e.loading = undefined;
        const observed = { value, at, seq };
        if (seq >= e.floor && (!e.current || e.current.seq < seq)) e.current = observed;
        return observed;
      },
      (err: unknown) => {
        if (e.loading?.seq === seq) e.loading = undefined;
        throw err;
      },
    );
    e.loading = { seq, promise };
    return promise;
  }
}
