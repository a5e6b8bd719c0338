import type { DataSource } from 'typeorm';
import { couponBody } from '../../support/factories.js';
import { adminToken, tokenFor } from '../../support/harness.js';
import { createFaultDatabase, FaultDatabase } from './db.js';
import { call, mapConcurrent, Reply, sleep } from './http.js';
import { buildServer, Server, startServer } from './server.js';

export interface Operation {
  kind: 'grab' | 'redeem';
  user: string;
  /** Idempotency-Key of a grab, orderNo of a redemption. */
  key: string;
  /** The coupon a redemption uses. */
  userCouponId?: string;
  replies: Reply[];
}

const ORDER_CENTS = 50_000;
const ok = (r: Reply) => r.status === 200 || r.status === 201;
const inProgress = (r: Reply) => r.status === 409 && r.body.code === 'IDEMPOTENCY_IN_PROGRESS';

/**
 * Clients that grab a coupon and redeem it, each retrying with the same Idempotency-Key or orderNo
 * on 503 (and on "in progress") until they get a definite answer, the way API.md tells clients to.
 * Everything they were told is kept, to be checked against the database afterwards.
 */
export class GrabAndRedeemWorkload {
  readonly operations: Operation[] = [];

  constructor(
    private readonly url: () => string,
    readonly couponId: string,
    private readonly prefix: string,
  ) {}

  private definite(r: Reply): boolean {
    return r.status !== 503 && !inProgress(r);
  }

  private async untilDefinite(op: Operation, send: () => Promise<Reply>): Promise<Reply> {
    for (let attempt = 0; ; attempt++) {
      const r = await send();
      op.replies.push(r);
      if (this.definite(r) || attempt >= 300) return r;
      await sleep(50);
    }
  }

  private sendGrab(op: Operation): Promise<Reply> {
    return call(this.url(), 'POST', `/coupons/${this.couponId}/grab`, { token: tokenFor(op.user), headers: { 'idempotency-key': op.key } });
  }

  private sendRedeem(op: Operation): Promise<Reply> {
    return call(this.url(), 'POST', '/redemptions', {
      token: tokenFor(op.user),
      body: { userCouponId: op.userCouponId, orderNo: op.key, orderAmountCents: ORDER_CENTS },
    });
  }

  /** One client: new user, grab, redeem, again, until `until`. */
  async client(c: number, until: number): Promise<void> {
    for (let n = 0; Date.now() < until; n++) {
      const user = `${this.prefix}${c}-${n}`;
      const grab: Operation = { kind: 'grab', user, key: `${this.prefix}-${c}-${n}`, replies: [] };
      this.operations.push(grab);
      const g = await this.untilDefinite(grab, () => this.sendGrab(grab));
      if (g.status !== 201) continue;
      const redeem: Operation = { kind: 'redeem', user, key: `order-${c}-${n}`, userCouponId: g.body.id, replies: [] };
      this.operations.push(redeem);
      await this.untilDefinite(redeem, () => this.sendRedeem(redeem));
    }
  }

  replies(): Reply[] {
    return this.operations.flatMap((o) => o.replies);
  }

  /** Answers outside what an outage allows: 201 (200 for a repeated redemption), 503, or 409 while a duplicate is in flight. */
  unexpected(): string[] {
    return this.operations.flatMap((op) =>
      op.replies
        .filter((r) => !(r.status === 201 || r.status === 503 || inProgress(r) || (op.kind === 'redeem' && r.status === 200)))
        .map((r) => `${op.kind} ${op.key}: ${r.status} ${r.error ?? ''} ${JSON.stringify(r.body)}`),
    );
  }

  undecided(): string[] {
    return this.operations.filter((op) => !this.definite(op.replies[op.replies.length - 1])).map((op) => op.key);
  }

  /**
   * Compares what clients were told with the database: one id per key across retries, that id
   * stored, and nothing stored that nobody was told about. `lostWrites` counts acknowledged writes
   * the database does not have.
   */
  async verify(db: DataSource): Promise<{ wrong: string[]; lostWrites: number }> {
    const grabs = (await db.query(`SELECT id, user_id, idempotency_key FROM user_coupon WHERE coupon_id = ? AND source = 'GRAB'`, [
      this.couponId,
    ])) as { id: string; user_id: string; idempotency_key: string }[];
    const redemptions = (await db.query(
      `SELECT r.id, r.order_no, r.user_id FROM redemption r JOIN user_coupon uc ON uc.id = r.user_coupon_id WHERE uc.coupon_id = ?`,
      [this.couponId],
    )) as { id: string; order_no: string; user_id: string }[];
    const stored = {
      grab: new Map(grabs.map((r) => [`${r.user_id}/${r.idempotency_key}`, String(r.id)])),
      redeem: new Map(redemptions.map((r) => [`${r.user_id}/${r.order_no}`, String(r.id)])),
    };
    const wrong: string[] = [];
    let lostWrites = 0;
    for (const op of this.operations) {
      const ids = new Set(op.replies.filter(ok).map((r) => (op.kind === 'grab' ? r.body.id : r.body.redemptionId)));
      const inDb = stored[op.kind].get(`${op.user}/${op.key}`);
      if (ids.size > 1) wrong.push(`${op.kind} ${op.key} answered different ids ${[...ids].join(',')}`);
      if (ids.size === 1 && inDb !== [...ids][0]) {
        lostWrites++;
        wrong.push(`${op.kind} ${op.key} acknowledged ${[...ids][0]} but the database has ${inDb}`);
      }
      if (ids.size === 0 && inDb !== undefined)
        wrong.push(`${op.kind} ${op.key} stored ${inDb} though its definite answer was ${op.replies[op.replies.length - 1].status}`);
      if (op.kind === 'redeem' && op.replies.filter((r) => ok(r) && r.body.firstUse === true).length > 1)
        wrong.push(`redeem ${op.key} answered firstUse twice`);
    }
    const told = (kind: Operation['kind']) => this.operations.filter((o) => o.kind === kind && o.replies.some(ok)).length;
    if (grabs.length !== told('grab')) wrong.push(`${grabs.length} coupons issued, ${told('grab')} acknowledged`);
    if (redemptions.length !== told('redeem')) wrong.push(`${redemptions.length} redemptions stored, ${told('redeem')} acknowledged`);
    return { wrong, lostWrites };
  }

  /** Repeats every acknowledged operation with its key: each must answer what it answered before. Returns the keys that do not. */
  async replayAcknowledged(): Promise<string[]> {
    const acked = this.operations.filter((op) => op.replies.some(ok));
    const replays = await mapConcurrent(acked, 20, (op) => (op.kind === 'grab' ? this.sendGrab(op) : this.sendRedeem(op)));
    return acked
      .filter((op, i) => {
        const first = op.replies.find(ok) as Reply;
        const r = replays[i];
        return op.kind === 'grab'
          ? r.status !== 201 || r.body.id !== first.body.id
          : r.status !== 200 || r.body.redemptionId !== first.body.redemptionId || r.body.firstUse !== false;
      })
      .map((op) => `${op.kind} ${op.key}`);
  }
}

export interface WorkloadSetup {
  fdb: FaultDatabase;
  server: Server;
  load: GrabAndRedeemWorkload;
}

/** A database with an account of its own for one server process (so its connections can be told apart, and read_only applies), a plentiful coupon, and the workload on it. */
export async function startGrabAndRedeem(prefix: string): Promise<WorkloadSetup> {
  await buildServer();
  const fdb = await createFaultDatabase({ appUser: true });
  const server = await startServer({ dbName: fdb.name, dbUser: fdb.appUser?.name, dbPassword: fdb.appUser?.password });
  const created = await call(server.url, 'POST', '/admin/coupons', { token: adminToken(), body: couponBody({ totalStock: 100_000 }) });
  if (created.status !== 201) throw new Error(`coupon not created: ${created.status} ${JSON.stringify(created.body)}`);
  return { fdb, server, load: new GrabAndRedeemWorkload(() => server.url, created.body.id as string, prefix) };
}
