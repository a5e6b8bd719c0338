import { Column, Entity, PrimaryGeneratedColumn } from 'typeorm';
import { bigintAsNumber } from '../database/transformers.js';

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
  };
}
export type RunView = ReturnType<typeof toRunView>;
