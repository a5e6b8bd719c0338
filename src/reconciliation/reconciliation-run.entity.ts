import { Column, Entity, PrimaryGeneratedColumn } from 'typeorm';
import { bigintAsNumber, nullableBigintAsNumber } from '../database/transformers.js';

export type RunStatus = 'RUNNING' | 'COMPLETED' | 'FAILED';
export const RUN_MODES = ['FULL', 'INCREMENTAL'] as const;
export type RunMode = (typeof RUN_MODES)[number];

@Entity('reconciliation_run')
export class ReconciliationRun {
  @PrimaryGeneratedColumn({ type: 'bigint', unsigned: true })
  id!: string;

  @Column({ type: 'varchar', length: 16 })
  status!: RunStatus;

  @Column({ type: 'varchar', length: 16 })
  mode!: RunMode;

  /** The admin's user id, or "cron". */
  @Column({ name: 'triggered_by', type: 'varchar', length: 64 })
  triggeredBy!: string;

  @Column({ name: 'started_at', type: 'datetime', precision: 3 })
  startedAt!: Date;

  @Column({ name: 'finished_at', type: 'datetime', precision: 3, nullable: true })
  finishedAt!: Date | null;

  /** Rows audited: coupon stock rows, user coupons and redemptions. */
  @Column({ type: 'bigint', unsigned: true, transformer: bigintAsNumber })
  checked!: number;

  /** Discrepancies this run recorded as new (one still open from an earlier run is not counted again). */
  @Column({ type: 'int', unsigned: true })
  discrepancies!: number;

  @Column({ type: 'varchar', length: 1000, nullable: true })
  error!: string | null;

  // What a COMPLETED run counted (null otherwise, and for runs before the columns): RunTotals.
  @Column({ name: 'user_coupons', type: 'bigint', unsigned: true, nullable: true, transformer: nullableBigintAsNumber })
  userCoupons!: number | null;

  @Column({ type: 'bigint', unsigned: true, nullable: true, transformer: nullableBigintAsNumber })
  redemptions!: number | null;

  @Column({ name: 'discount_cents', type: 'bigint', unsigned: true, nullable: true, transformer: nullableBigintAsNumber })
  discountCents!: number | null;

  @Column({ name: 'refunded_redemptions', type: 'bigint', unsigned: true, nullable: true, transformer: nullableBigintAsNumber })
  refundedRedemptions!: number | null;

  @Column({ name: 'refunded_discount_cents', type: 'bigint', unsigned: true, nullable: true, transformer: nullableBigintAsNumber })
  refundedDiscountCents!: number | null;
}

/**
 * The ledger as a completed run read it, chunk by chunk (each chunk one snapshot: a use committed
 * during the run may fall either side): user coupons, the USED redemptions and the discount they
 * gave, and those of them refunded, with their discount. For finance's daily figures: the
 * difference between two nights' runs is what the day added.
 */
export interface RunTotals {
  userCoupons: number;
  redemptions: number;
  discountCents: number;
  refundedRedemptions: number;
  refundedDiscountCents: number;
}

export function toRunView(r: ReconciliationRun) {
  return {
    id: r.id,
    status: r.status,
    mode: r.mode,
    triggeredBy: r.triggeredBy,
    startedAt: r.startedAt.toISOString(),
    finishedAt: r.finishedAt ? r.finishedAt.toISOString() : null,
    checked: r.checked,
    discrepancies: r.discrepancies,
    error: r.error,
    totals:
      r.userCoupons === null
        ? null
        : {
            userCoupons: r.userCoupons,
            redemptions: r.redemptions ?? 0,
            discountCents: r.discountCents ?? 0,
            refundedRedemptions: r.refundedRedemptions ?? 0,
            refundedDiscountCents: r.refundedDiscountCents ?? 0,
          },
  };
}
export type RunView = ReturnType<typeof toRunView>;
