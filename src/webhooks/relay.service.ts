import { Injectable, Logger, OnApplicationBootstrap, OnModuleDestroy } from '@nestjs/common';
import { DataSource } from 'typeorm';
import { gauge } from '../common/metrics.js';
import { AppConfig } from '../config/app-config.js';
import { LeaseService } from '../database/lease.js';
import { TransactionService } from '../database/transaction.service.js';
import { FanOut, readCursor } from './fan-out.js';
import { DeliveryPurge } from './purge.js';
import { Sender } from './sender.js';
import { firstRowAtAfter } from '../ledger/state-log.js';

const pending = gauge('webhook_events_pending', 'Deliveries not yet delivered nor given up (on the relaying instance; 0 on the others)');
const lag = gauge(
  'webhook_relay_lag_seconds',
  'How far behind the relay is: the age of the oldest state-log row not read yet, or how long the earliest due delivery to an enabled endpoint has waited for its attempt (on the relaying instance)',
);
const leading = gauge('webhook_relay_leader', '1 on the instance that relays webhooks, 0 on the others');

export const RELAY_LEASE = 'webhook-relay';

/** How often a stand-by instance tries to become the relay. */
const LEADER_CHECK_MS = 1000;
const GAUGE_EVERY_MS = 1000;
/** How often deliveries of deleted endpoints are looked for when there were none: an endpoint may be deleted on another instance. */
const PURGE_CHECK_MS = 1000;

/** Lets a loop sleep until its poll interval ends or someone has work for it. */
class Waker {
  woken = false;
  private resolve: (() => void) | null = null;

  wake(): void {
    this.woken = true;
    this.resolve?.();
  }

  /** Until `ms` pass, wake() is called or `signal` aborts; nothing is left pending after it. */
  wait(ms: number, signal: AbortSignal): Promise<void> {
    return new Promise<void>((resolve) => {
      if (signal.aborted) return resolve();
      const done = () => {
        clearTimeout(timer);
        signal.removeEventListener('abort', done);
        this.resolve = null;
        resolve();
      };
      const timer = setTimeout(done, ms);
      signal.addEventListener('abort', done, { once: true });
      this.resolve = done;
    });
  }
}

const sleep = (ms: number, signal: AbortSignal) => new Waker().wait(ms, signal);

/**
 * The webhook relay: fan-out (state log -> deliveries) and sending, on one instance at a time: the
 * holder of the `webhook-relay` job lease, like the expiry sweep's. When the relay's process dies
 * (kill -9 included) it stops renewing, and within LEASE_TTL_MS another instance takes over,
 * starting from the durable cursor and the PENDING deliveries. Should two overlap (a holder stalled
 * past its lease), fan-out stays exactly-once by its unique key and a send may repeat, same id.
 * Nothing here runs inside a business transaction: a slow receiver costs the grab path nothing.
 */
@Injectable()
export class WebhookRelay implements OnApplicationBootstrap, OnModuleDestroy {
  private readonly logger = new Logger(WebhookRelay.name);
  private readonly stopping = new AbortController();
  private running: Promise<void> = Promise.resolve();
  readonly fanOut: FanOut;
  readonly sender: Sender;
  private readonly purge: DeliveryPurge;
  private readonly fanOutWake = new Waker();
  private readonly sendWake = new Waker();
  private readonly flushWake = new Waker();
  private readonly purgeWake = new Waker();

  constructor(
    private readonly dataSource: DataSource,
    tx: TransactionService,
    private readonly config: AppConfig,
    private readonly leases: LeaseService,
  ) {
    this.fanOut = new FanOut(dataSource, tx, config);
    this.sender = new Sender(dataSource, tx, config, () => this.flushWake.wake());
    this.purge = new DeliveryPurge(dataSource, tx);
  }

  onApplicationBootstrap(): void {
    if (this.config.WEBHOOK_RELAY_ENABLED) this.running = this.lead();
  }

  async onModuleDestroy(): Promise<void> {
    this.stopping.abort();
    await this.running;
    await this.sender.close();
    await this.fanOut.close();
  }

  private async lead(): Promise<void> {
    while (!this.stopping.signal.aborted) {
      try {
        const lease = await this.leases.tryAcquire(RELAY_LEASE);
        if (lease) {
          try {
            await this.relayWhileHeld(AbortSignal.any([lease.signal, this.stopping.signal]));
          } finally {
            await lease.release();
          }
        }
      } catch (err) {
        this.logger.warn(`Webhook relay: ${(err as Error).message}`);
      }
      await sleep(LEADER_CHECK_MS, this.stopping.signal);
    }
  }

  private async relayWhileHeld(signal: AbortSignal): Promise<void> {
    this.logger.log('Webhook relay: this instance relays');
    leading.set(1);
    try {
      await this.run(signal);
    } finally {
      leading.set(0);
      pending.set(0);
      lag.set(0);
    }
  }

  /**
   * The relay until `signal`: four loops (read the log, write outcomes back, start attempts, remove
   * deleted endpoints' deliveries), so that none waits for the others' database round trips. Attempts in flight are then abandoned (they stay PENDING).
   */
  async run(signal: AbortSignal): Promise<void> {
    this.fanOut.reset();
    let gaugesAt = 0;
    await Promise.all([
      this.loop(this.fanOutWake, signal, async () => {
        const { created, more } = await this.fanOut.pass();
        if (created > 0) this.sendWake.wake();
        if (Date.now() - gaugesAt >= GAUGE_EVERY_MS) {
          gaugesAt = Date.now();
          await this.updateGauges();
        }
        return more;
      }),
      // Outcomes are written while new attempts start: a slot is free once its outcome is written.
      this.loop(this.flushWake, signal, async () => {
        if (await this.sender.flush()) this.sendWake.wake();
        return false;
      }),
      this.loop(this.sendWake, signal, async () => {
        await this.sender.dispatch(signal);
        return false;
      }),
      this.loop(this.purgeWake, signal, () => this.purge.step(), PURGE_CHECK_MS),
    ]);
    await this.sender.flush().catch(() => undefined);
  }

  /** Runs `step` until `signal`: again at once when it says there is more or was woken meanwhile, else after `idleMs`. */
  private async loop(waker: Waker, signal: AbortSignal, step: () => Promise<boolean>, idleMs = this.config.WEBHOOK_POLL_MS): Promise<void> {
    let failing = false;
    while (!signal.aborted) {
      waker.woken = false;
      let more: boolean;
      try {
        more = await step();
        if (failing) this.logger.log('Webhook relay: database reachable again');
        failing = false;
      } catch (err) {
        if (!failing) this.logger.warn(`Webhook relay pass failed, retrying: ${(err as Error).message}`);
        failing = true;
        await sleep(1000, signal);
        continue;
      }
      if (!more && !waker.woken) await waker.wait(idleMs, signal);
    }
  }

  private async updateGauges(): Promise<void> {
    const db = this.dataSource.manager;
    const [p] = (await db.query(`SELECT COUNT(*) AS n FROM webhook_delivery WHERE status = 'PENDING'`)) as { n: string }[];
    pending.set(Number(p.n));
    // Enabled endpoints only: a disabled one's deliveries wait for an operator, not for the relay,
    // and counted here they kept the lag rising (an alert on it never cleared). Each endpoint's
    // earliest due time is the first entry of its idx_due range: ORDER BY ... LIMIT 1, since MariaDB
    // reads a correlated MIN() over the whole range (90,000 rows an endpoint on a backlog).
    const [d] = (await db.query(
      `SELECT MIN((SELECT d.next_attempt_at FROM webhook_delivery d WHERE d.endpoint_id = e.id AND d.status = 'PENDING'
                   ORDER BY d.next_attempt_at LIMIT 1)) AS due
       FROM webhook_endpoint e WHERE e.enabled = 1`,
    )) as { due: Date | null }[];
    const unread = await firstRowAtAfter(db, this.fanOut.position ?? (await readCursor(db)));
    const oldest = Math.min(d.due?.getTime() ?? Infinity, unread?.getTime() ?? Infinity);
    lag.set(Number.isFinite(oldest) ? Math.max(0, (Date.now() - oldest) / 1000) : 0);
  }
}
