import { afterEach, beforeEach, expect } from '@jest/globals';
import type { DataSource } from 'typeorm';
import { checkInvariants } from '../../src/ledger/invariants.js';
import { createdCoupons } from './factories.js';

/**
 * After each test, API.md's invariants on the coupons that test created, and on those its file
 * created before the first test (shared by all of them). One broken test then fails alone instead
 * of every test after it; the whole-database check stays in the fault suite and the benchmark.
 */
export function checkInvariantsAfterEach(db: () => DataSource): void {
  let shared: string[] | undefined;
  let mark = 0;
  beforeEach(() => {
    shared ??= [...createdCoupons];
    mark = createdCoupons.length;
  });
  afterEach(async () => {
    expect(await checkInvariants(db(), { couponIds: [...(shared ?? []), ...createdCoupons.slice(mark)] })).toEqual([]);
  });
}
