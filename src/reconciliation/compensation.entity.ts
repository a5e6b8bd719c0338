import { Column, Entity, JoinColumn, ManyToOne, PrimaryGeneratedColumn } from 'typeorm';
import type { CompensationAction } from './diagnosis.js';
import { Discrepancy } from './discrepancy.entity.js';

export const COMPENSATION_STATUSES = ['PENDING', 'DONE', 'REJECTED'] as const;
export type CompensationStatus = (typeof COMPENSATION_STATUSES)[number];

/** `result.done` of a decision that changed no data (an approval that did names its action there). */
export const NOTHING_DONE = {
  rejected: 'nothing: rejected',
  reviewed: 'nothing: approved as reviewed; the data was not changed by this compensation',
} as const;

@Entity('compensation')
export class Compensation {
  @PrimaryGeneratedColumn({ type: 'bigint', unsigned: true })
  id!: string;

  @Column({ name: 'discrepancy_id', type: 'bigint', unsigned: true })
  discrepancyId!: string;

  @ManyToOne(() => Discrepancy, { createForeignKeyConstraints: false })
  @JoinColumn({ name: 'discrepancy_id' })
  discrepancy!: Discrepancy;

  @Column({ type: 'varchar', length: 32 })
  action!: CompensationAction;

  /** JSON: what the action will do, and what it expects to find. */
  @Column({ type: 'text' })
  params!: string;

  @Column({ type: 'varchar', length: 16 })
  status!: CompensationStatus;

  @Column({ name: 'decided_by', type: 'varchar', length: 64, nullable: true })
  decidedBy!: string | null;

  @Column({ name: 'decision_reason', type: 'varchar', length: 500, nullable: true })
  decisionReason!: string | null;

  @Column({ name: 'decided_at', type: 'datetime', precision: 3, nullable: true })
  decidedAt!: Date | null;

  /** JSON: what approval did (rows removed from the log are kept here). */
  @Column({ type: 'text', nullable: true })
  result!: string | null;

  @Column({ name: 'created_at', type: 'datetime', precision: 3 })
  createdAt!: Date;
}

export function toCompensationView(c: Compensation) {
  const d = c.discrepancy;
  return {
    id: c.id,
    status: c.status,
    action: c.action,
    params: JSON.parse(c.params) as unknown,
    decidedBy: c.decidedBy,
    decisionReason: c.decisionReason,
    decidedAt: c.decidedAt ? c.decidedAt.toISOString() : null,
    result: c.result === null ? null : (JSON.parse(c.result) as unknown),
    createdAt: c.createdAt.toISOString(),
    discrepancy: {
      id: d.id,
      runId: d.runId,
      type: d.type,
      couponId: d.couponId,
      userCouponId: d.userCouponId,
      redemptionId: d.redemptionId,
      details: JSON.parse(d.details) as unknown,
      open: d.openKey !== null,
      createdAt: d.createdAt.toISOString(),
    },
  };
}
export type CompensationView = ReturnType<typeof toCompensationView>;
