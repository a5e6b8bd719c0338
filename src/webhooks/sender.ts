import { Logger } from '@nestjs/common';
import { Webhook } from 'standardwebhooks';
import { Agent, request } from 'undici';
import type { DataSource, EntityManager } from 'typeorm';
import { counter, gauge } from '../common/metrics.js';
import { type AppConfig, parseAllowedHosts, retryDelays } from '../config/app-config.js';
import { execute, type TransactionService } from '../database/transaction.service.js';
import { eventId } from './events.js';
import { ADDRESS_REFUSED, guardedLookup, hostAllowed, refusedAddress } from './url-policy.js';
import { EARLIER_PENDING, type EndpointRow, enabledEndpoints } from './webhook.store.js';

const delivered = counter('webhook_events_delivered_total', 'Deliveries answered 2xx', []);
const retried = counter('webhook_events_retried_total', 'Delivery attempts that failed and were scheduled again', []);
const failed = counter('webhook_events_failed_total', 'Deliveries given up after their last retry', []);
const disabled = counter('webhook_endpoints_disabled_total', 'Endpoints disabled after deliveries in a row failed every retry', []);
const attemptsInFlight = gauge('webhook_deliveries_in_flight', 'Delivery attempts waiting for an answer');

interface Due {
  id: string;
  log_id: string;
  payload: string;
  attempts: number;
  final_attempt: number;
}

interface Outcome {
  deliveryId: string;
  endpointId: string;
  /** The delivery's attempts with this one: written only if the row still has one fewer (this attempt is its latest). */
  attempts: number;
  /** The delivery's last attempt whatever the retry schedule says (an operator's resend). */
  final: boolean;
  at: Date;
  durationMs: number;
  statusCode: number | null;
  error: string | null;
  /** Put back after a delivery write that failed: its COMMIT may have taken effect, so an empty rewrite does not mean "not ours". */
  requeued?: boolean;
}

const ok = (o: Outcome) => o.statusCode !== null && o.statusCode >= 200 && o.statusCode < 300;

/**
 * Sends due deliveries, each attempt a POST signed per Standard Webhooks, outside any transaction;
 * their outcomes are written back in batches. A delivery is due when it is PENDING, its time has
 * come, and no earlier event of the same user coupon is still PENDING for that endpoint (in flight
 * or waiting for a retry): so one coupon's events arrive in log order and a failing event holds back
 * only its own coupon's later events. An attempt stays "in flight" in memory until its outcome is
 * written, so it is never sent twice by this process; after a crash it is PENDING and sent again
 * with the same webhook-id.
 */
export class Sender {
  private readonly logger = new Logger(Sender.name);
  /** Per endpoint, the deliveries whose attempt has not been written back yet. */
  private readonly inFlight = new Map<string, Set<string>>();
  private outcomes: Outcome[] = [];
  private readonly signers = new Map<string, Webhook>();
  /** Per relay signal, the controllers of its attempts in flight (attemptsUnder). */
  private readonly attemptsOf = new WeakMap<AbortSignal, Set<AbortController>>();
  /** Endpoints whose failed_in_row was above 0 when last read: a success there must reset it. */
  private failing = new Set<string>();
  /** Outcomes whose deliveries are written but whose endpoint counts (failed in a row, disabling) are not yet. */
  private endpointNews: Outcome[] = [];
  private readonly delays: number[];
  private readonly allowedHosts: string[];
  /**
   * undici's request() on a keep-alive pool of its own: fetch() cost the relay three to five times
   * the CPU per POST (its Request, Headers and Response objects, a timer signal per call), measured
   * on 5,000 POSTs to a local receiver.
   */
  private readonly http: Agent;

  constructor(
    private readonly dataSource: DataSource,
    private readonly tx: TransactionService,
    private readonly config: AppConfig,
    private readonly wake: () => void,
  ) {
    this.delays = retryDelays(config);
    this.allowedHosts = parseAllowedHosts(config.WEBHOOK_ALLOWED_HOSTS);
    // No per-phase timeouts: each attempt has one deadline for connecting, the headers and the body.
    // guardedLookup: no delivery to the cloud metadata service and the like, whatever a name resolves to.
    this.http = new Agent({ connections: config.WEBHOOK_MAX_IN_FLIGHT, connect: { lookup: guardedLookup } });
  }

  close(): Promise<void> {
    return this.http.close();
  }

  get idle(): boolean {
    return this.outcomes.length === 0 && this.endpointNews.length === 0 && [...this.inFlight.values()].every((s) => s.size === 0);
  }

  /**
   * Starts the attempts that are due and fit in each endpoint's WEBHOOK_MAX_IN_FLIGHT. The index of
   * the per-coupon check is forced: MariaDB 10.11 planned it on (endpoint_id, log_id), reading every
   * earlier delivery of the endpoint for each candidate, so one pick of 100 on a backlog of 10,000
   * took 30-85 ms and the relay delivered 173 events/s on a quiet machine.
   */
  async dispatch(signal: AbortSignal): Promise<void> {
    const now = new Date();
    const endpoints = await enabledEndpoints(this.dataSource.manager);
    this.failing = new Set(endpoints.filter((ep) => Number(ep.failed_in_row) > 0).map((ep) => String(ep.id)));
    for (const ep of endpoints) {
      const busy = this.inFlight.get(String(ep.id)) ?? new Set<string>();
      this.inFlight.set(String(ep.id), busy);
      const free = this.config.WEBHOOK_MAX_IN_FLIGHT - busy.size;
      if (free <= 0) continue;
      const skip = [...busy];
      const due = (await this.dataSource.query(
        `SELECT d.id, d.log_id, d.payload, d.attempts, d.final_attempt FROM webhook_delivery d
         WHERE d.endpoint_id = ? AND d.status = 'PENDING' AND d.next_attempt_at <= ?
           AND EXISTS (SELECT 1 FROM webhook_endpoint e WHERE e.id = d.endpoint_id AND e.enabled = 1)
           ${skip.length > 0 ? `AND d.id NOT IN (${skip.map(() => '?').join(', ')})` : ''}
           AND NOT EXISTS (SELECT 1 FROM ${EARLIER_PENDING})
         ORDER BY d.next_attempt_at, d.id LIMIT ?`,
        [ep.id, now, ...skip, free],
      )) as Due[];
      for (const d of due) {
        busy.add(String(d.id));
        attemptsInFlight.inc();
        void this.attempt(ep, d, signal).then((o) => {
          attemptsInFlight.dec();
          if (o === null) busy.delete(String(d.id));
          else this.outcomes.push(o);
          this.wake();
        });
      }
    }
  }

  /** One POST. Null when the relay stopped mid-attempt: the delivery stays PENDING and is sent again. */
  private async attempt(ep: EndpointRow, d: Due, signal: AbortSignal): Promise<Outcome | null> {
    const at = new Date();
    const started = performance.now();
    const outcome = (statusCode: number | null, error: string | null): Outcome => ({
      deliveryId: String(d.id),
      endpointId: String(ep.id),
      attempts: Number(d.attempts) + 1,
      final: Number(d.final_attempt) === 1,
      at,
      durationMs: Math.round(performance.now() - started),
      statusCode,
      error,
    });
    // The allow-list may have been tightened since the endpoint was saved; an address (no lookup to guard) is checked here.
    const { hostname } = new URL(ep.url);
    if (!hostAllowed(hostname, this.allowedHosts)) return outcome(null, 'host not in WEBHOOK_ALLOWED_HOSTS');
    const refused = refusedAddress(hostname);
    if (refused) return outcome(null, `${hostname} is ${refused}`);
    const id = eventId(String(d.log_id));
    let signer = this.signers.get(ep.secret);
    if (!signer) this.signers.set(ep.secret, (signer = new Webhook(ep.secret)));
    // One deadline for the whole attempt (undici's headersTimeout and bodyTimeout bound each wait, so a
    // receiver trickling its body would hold an attempt for ever), on a controller the relay's stop
    // aborts too.
    const stop = new AbortController();
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      stop.abort();
    }, this.config.WEBHOOK_TIMEOUT_MS);
    const attempts = this.attemptsUnder(signal);
    attempts.add(stop);
    if (signal.aborted) stop.abort();
    try {
      const res = await request(ep.url, {
        method: 'POST',
        dispatcher: this.http,
        headers: {
          'content-type': 'application/json',
          'user-agent': 'coupon-engine-webhooks',
          'webhook-id': id,
          'webhook-timestamp': String(Math.floor(at.getTime() / 1000)),
          'webhook-signature': signer.sign(id, at, d.payload),
        },
        body: d.payload,
        // request() follows no redirect: one could lead anywhere, past the allow-list, so it is an answer like any other non-2xx.
        signal: stop.signal,
      });
      // Without the signal, a body cut short by it would end the dump as if the answer were complete.
      await res.body.dump({ limit: 128 * 1024, signal: stop.signal });
      return outcome(res.statusCode, res.statusCode >= 200 && res.statusCode < 300 ? null : `HTTP ${res.statusCode}`);
    } catch (err) {
      if (signal.aborted) return null;
      const e = err as Error & { code?: string };
      const error = timedOut
        ? `no answer within ${this.config.WEBHOOK_TIMEOUT_MS} ms`
        : e.code === ADDRESS_REFUSED
          ? e.message
          : (e.code ?? e.message);
      return outcome(null, error.slice(0, 255));
    } finally {
      clearTimeout(timer);
      attempts.delete(stop);
    }
  }

  /**
   * The attempts in flight under a relay's signal, which one listener on it aborts all at once. A
   * listener per attempt put more than 10 on the signal whenever more than 10 attempts were in
   * flight, and Node warned of a leak (MaxListenersExceededWarning) on stderr. AbortSignal.any()
   * would link them too, but on a long-lived signal it keeps every composite alive in Node 20
   * (nodejs/node#55351, #54614).
   */
  private attemptsUnder(signal: AbortSignal): Set<AbortController> {
    let attempts = this.attemptsOf.get(signal);
    if (!attempts) {
      const all = (attempts = new Set());
      this.attemptsOf.set(signal, all);
      signal.addEventListener('abort', () => all.forEach((stop) => stop.abort()), { once: true });
    }
    return attempts;
  }

  /**
   * Writes back the outcomes that came in (true if there were any), then what they change on their
   * endpoints. Each of the two transactions keeps its own work for next time when it fails, so a
   * committed delivery outcome is never written (or counted) twice.
   */
  async flush(): Promise<boolean> {
    if (this.outcomes.length === 0 && this.endpointNews.length === 0) return false;
    const batch = this.outcomes;
    this.outcomes = [];
    const now = new Date();
    if (batch.length > 0) {
      let written: Outcome[];
      try {
        written = await this.tx.inTransaction((em) => this.writeDeliveries(em, batch, now));
      } catch (err) {
        for (const o of batch) o.requeued = true;
        this.outcomes = batch.concat(this.outcomes);
        throw err;
      }
      for (const o of batch) this.inFlight.get(o.endpointId)?.delete(o.deliveryId);
      // An outcome not written now is another attempt's (a relay that lost its lease sent it too) and
      // counts nowhere, unless its own earlier write may have committed unanswered.
      const taken = new Set(written);
      const settled = batch.filter((o) => taken.has(o) || o.requeued);
      // Counted once committed: a transaction rerun after a deadlock would count its outcomes twice.
      for (const o of settled) (ok(o) ? delivered : this.givenUp(o) ? failed : retried).inc();
      // The common case, successes on endpoints with nothing to reset, needs no endpoint write at all.
      this.endpointNews.push(...settled.filter((o) => this.givenUp(o) || (ok(o) && this.failing.has(o.endpointId))));
    }
    const news = this.endpointNews;
    this.endpointNews = [];
    let disabledNow: { id: string; reason: string }[] = [];
    if (news.length > 0) {
      try {
        disabledNow = await this.tx.inTransaction((em) => this.writeEndpoints(em, news, now));
      } catch (err) {
        this.endpointNews = news.concat(this.endpointNews);
        throw err;
      }
    }
    for (const d of disabledNow) {
      disabled.inc();
      this.logger.warn(`Webhook ${d.id} disabled: ${d.reason}`);
    }
    return true;
  }

  /** The outcome is a failure after the last retry: the delivery is FAILED. */
  private givenUp(o: Outcome): boolean {
    return !ok(o) && (o.final || this.delays[o.attempts - 1] === undefined);
  }

  /**
   * Returns the outcomes written: those of deliveries still pending (not deleted with their endpoint
   * meanwhile) with no attempt written since this one started. So an outcome is written once, even
   * when its flush is retried after a COMMIT that was lost but took effect; and one written late (by
   * a relay whose lease another instance took over) cannot close a delivery an operator has since
   * made due again, whose attempt would then never be sent.
   */
  private async writeDeliveries(em: EntityManager, all: readonly Outcome[], now: Date): Promise<Outcome[]> {
    // Locked, so that an endpoint deleted meanwhile (its deliveries with it) leaves no attempt rows behind.
    const live = (await em.query(`SELECT id, attempts FROM webhook_delivery WHERE id IN (?) AND status = 'PENDING' FOR UPDATE`, [
      all.map((o) => o.deliveryId),
    ])) as { id: string; attempts: number }[];
    const attemptsOf = new Map(live.map((r) => [String(r.id), Number(r.attempts)]));
    const batch = all.filter((o) => attemptsOf.get(o.deliveryId) === o.attempts - 1);
    if (batch.length === 0) return batch;
    await em.query(
      `INSERT INTO webhook_delivery_attempt (delivery_id, attempted_at, status_code, error, duration_ms) VALUES ${batch.map(() => '(?, ?, ?, ?, ?)').join(', ')}`,
      batch.flatMap((o) => [o.deliveryId, o.at, o.statusCode, o.error, o.durationMs]),
    );
    const done = batch.filter(ok);
    for (const code of new Set(done.map((o) => o.statusCode))) {
      const ids = done.filter((o) => o.statusCode === code).map((o) => o.deliveryId);
      await em.query(
        `UPDATE webhook_delivery SET status = 'DELIVERED', attempts = attempts + 1, last_status_code = ?, last_error = NULL,
         next_attempt_at = NULL, delivered_at = ? WHERE id IN (${ids.map(() => '?').join(', ')}) AND status = 'PENDING'`,
        [code, now, ...ids],
      );
    }
    for (const o of batch.filter((x) => !ok(x))) {
      const delay = this.delays[o.attempts - 1];
      const giveUp = this.givenUp(o);
      // Up to a tenth more, so deliveries that failed together do not all come back in the same instant.
      const next = giveUp ? null : new Date(now.getTime() + delay * 1000 * (1 + Math.random() / 10));
      await em.query(
        `UPDATE webhook_delivery SET status = ?, attempts = attempts + 1, last_status_code = ?, last_error = ?, next_attempt_at = ?
         WHERE id = ? AND status = 'PENDING'`,
        [giveUp ? 'FAILED' : 'PENDING', o.statusCode, o.error, next, o.deliveryId],
      );
    }
    return batch;
  }

  /**
   * A success resets the endpoint's count of deliveries failed in a row; a delivery given up adds
   * one, and at WEBHOOK_DISABLE_AFTER_FAILURES the endpoint is disabled, with the reason on it.
   */
  private async writeEndpoints(em: EntityManager, batch: readonly Outcome[], now: Date): Promise<{ id: string; reason: string }[]> {
    const disabledNow: { id: string; reason: string }[] = [];
    for (const endpointId of new Set(batch.map((o) => o.endpointId))) {
      const mine = batch.filter((o) => o.endpointId === endpointId);
      const givenUp = mine.filter((o) => this.givenUp(o));
      if (mine.some(ok)) await em.query(`UPDATE webhook_endpoint SET failed_in_row = 0 WHERE id = ? AND failed_in_row <> 0`, [endpointId]);
      if (givenUp.length === 0) continue;
      this.failing.add(endpointId);
      const last = givenUp[givenUp.length - 1];
      const limit = this.config.WEBHOOK_DISABLE_AFTER_FAILURES;
      const reason = `${limit} deliveries in a row failed every retry (last: ${last.statusCode === null ? last.error : `HTTP ${last.statusCode}`})`;
      await em.query(`UPDATE webhook_endpoint SET failed_in_row = failed_in_row + ? WHERE id = ?`, [givenUp.length, endpointId]);
      const changed = await execute(
        em,
        `UPDATE webhook_endpoint SET enabled = 0, disabled_reason = ?, disabled_at = ?, updated_at = ? WHERE id = ? AND enabled = 1 AND failed_in_row >= ?`,
        [reason.slice(0, 255), now, now, endpointId, limit],
      );
      if (changed === 1) disabledNow.push({ id: endpointId, reason });
    }
    return disabledNow;
  }
}
