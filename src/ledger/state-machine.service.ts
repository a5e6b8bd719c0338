import { Injectable } from '@nestjs/common';
import { EntityManager } from 'typeorm';
import { AppError } from '../common/errors.js';
import { counter } from '../common/metrics.js';
import { execute } from '../database/transaction.service.js';
import { isLegal, UserCouponStatus } from './transitions.js';

const transitions = counter(
  'user_coupon_transitions_total',
  'User coupon status transitions written, by from/to (a transaction rolled back afterwards still counts)',
  ['from', 'to'],
);

export interface LogRow {
  userCouponId: string;
  from: UserCouponStatus | null;
  to: UserCouponStatus;
  txId: string;
  reason?: string | null;
  at: Date;
}

/** Writes state-log rows. Every status change and every issuance goes through here, inside the caller's transaction. */
export async function writeLog(em: EntityManager, rows: readonly LogRow[]): Promise<void> {
  if (rows.length === 0) return;
  await em.query(
    `INSERT INTO user_coupon_state_log (user_coupon_id, from_status, to_status, tx_id, reason, created_at) VALUES ${rows.map(() => '(?, ?, ?, ?, ?, ?)').join(', ')}`,
    rows.flatMap((r) => [r.userCouponId, r.from, r.to, r.txId.slice(0, 191), r.reason?.slice(0, 255) ?? null, r.at]),
  );
  for (const r of rows) transitions.inc({ from: r.from ?? 'null', to: r.to });
}

@Injectable()
export class StateMachineService {
  /**
   * Moves one user coupon from `from` to `to`: refused if the table forbids it, a compare-and-set on
   * the current status (0 rows: someone else moved it first, STATUS_CONFLICT), and a log row in
   * the same transaction.
   */
  async transit(
    em: EntityManager,
    userCouponId: string,
    from: UserCouponStatus,
    to: UserCouponStatus,
    txId: string,
    reason?: string | null,
    at = new Date(),
  ): Promise<void> {
    if (!isLegal(from, to)) {
      throw new AppError('ILLEGAL_TRANSITION', `A coupon cannot move from ${from} to ${to}`, { userCouponId, from, to });
    }
    const changed = await execute(
      em,
      `UPDATE user_coupon SET status = ?, used_at = IF(? = 'USED', ?, used_at), updated_at = ? WHERE id = ? AND status = ?`,
      [to, to, at, at, userCouponId, from],
    );
    if (changed !== 1) {
      throw new AppError('STATUS_CONFLICT', `User coupon ${userCouponId} is no longer ${from}`, { userCouponId, from, to });
    }
    await writeLog(em, [{ userCouponId, from, to, txId, reason, at }]);
  }
}
