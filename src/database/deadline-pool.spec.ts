import { describe, expect, it } from '@jest/globals';
import { pollUntil, withDeadline } from './deadline-pool.js';

/** pollUntil(ms) measured from now, inside a request whose deadline is `deadlineInMs` away (or in a job). */
function window(ms: number, deadlineInMs?: number): number {
  let until = 0;
  const start = Date.now();
  if (deadlineInMs === undefined) until = pollUntil(ms);
  else withDeadline({ at: start + deadlineInMs, answered: false }, () => (until = pollUntil(ms)));
  return until - start;
}

describe('pollUntil', () => {
  it('waits the whole time in a job, or when the request has time to spare', () => {
    expect(window(3000)).toBeGreaterThanOrEqual(3000);
    expect(window(3000, 60_000)).toBeGreaterThanOrEqual(3000);
  });

  it("stops early enough before the request's deadline for one more statement and the answer", () => {
    // The deadline's 250 ms margin for writing a 503, and 500 ms for the last look.
    const w = window(3000, 3000);
    expect(w).toBeLessThanOrEqual(2250);
    expect(w).toBeGreaterThan(2000);
    expect(window(3000, 500)).toBeLessThanOrEqual(0);
  });
});
