import { describe, expect, it } from '@jest/globals';
import { CronTime } from 'cron';
import { dueAt } from './cron-job.js';

describe('dueAt: the fire time a tick is for', () => {
  const at = (iso: string) => new Date(iso);

  it('is the time the tick was due, however late its timer fired', () => {
    const nightly = new CronTime('0 30 3 * * *', 'UTC');
    const due = at('2026-12-02T03:30:00.000Z');
    expect(dueAt(nightly, 'UTC', due, at('2026-12-02T03:30:00.000Z'))).toEqual(due);
    expect(dueAt(nightly, 'UTC', due, at('2026-12-02T03:30:04.700Z'))).toEqual(due);
    expect(dueAt(nightly, 'UTC', due, at('2026-12-03T03:29:59.999Z'))).toEqual(due);
  });

  it('moves past the ticks dropped while a run was going, to the latest one due', () => {
    const everySecond = new CronTime('* * * * * *', 'UTC');
    expect(dueAt(everySecond, 'UTC', at('2026-12-02T10:00:00.000Z'), at('2026-12-02T10:00:03.400Z'))).toEqual(
      at('2026-12-02T10:00:03.000Z'),
    );
  });

  it('reads the expression in its time zone', () => {
    const shanghai = new CronTime('0 30 3 * * *', 'Asia/Shanghai');
    // 03:30 in Shanghai is 19:30 UTC the day before.
    expect(dueAt(shanghai, 'Asia/Shanghai', at('2026-12-01T19:30:00.000Z'), at('2026-12-02T19:30:01.000Z'))).toEqual(
      at('2026-12-02T19:30:00.000Z'),
    );
  });
});
