import dayjs from 'dayjs';

/**
 * A count with thousands separators: 5,000 in either language, and not the browser's own grouping
 * (a German browser's 5.000 beside amounts in yuan such as 12.50 reads as five).
 */
export const count = (n: number) => n.toLocaleString('en-US');
export const yuan = (cents: number) => (cents / 100).toFixed(cents % 100 === 0 ? 0 : 2);
/** X percent off as Chinese shops say it: 打 N 折, N the tenths the shopper pays (20% off is 8 折, 15% off 8.5 折). */
export const fold = (percentOff: number) => String((100 - percentOff) / 10);
/**
 * Times are shown in the operator's own time zone, named by its offset from UTC (UTC+08:00), each
 * time its own: operators in several zones compare notes, and a range may cross a change of
 * daylight saving time. An offset, not an abbreviation: "CST" is China, Cuba or the US central zone.
 */
export const time = (iso: string | null | undefined) => (iso ? dayjs(iso).format('YYYY-MM-DD HH:mm:ss [UTC]Z') : '—');
/** To the minute, with the year: a grab window can span years, and "01-01 00:00" alone could be any of them. */
export const shortTime = (iso: string) => dayjs(iso).format('YYYY-MM-DD HH:mm [UTC]Z');

export type Phase = 'notStarted' | 'running' | 'ended' | 'soldOut';

/**
 * Where a campaign stands for an operator: before, during or after its grab window, or out of stock.
 * Grabbing also ends when a fixed validity ends first (the server refuses grabs then: GRAB_ENDED).
 */
export function phase(
  c: { grabStartAt: string; grabEndAt: string; remainingStock: number; validity: { type: string; endAt?: string } },
  now = Date.now(),
): Phase {
  if (now < Date.parse(c.grabStartAt)) return 'notStarted';
  if (now >= Date.parse(c.grabEndAt) || (c.validity.endAt !== undefined && now >= Date.parse(c.validity.endAt))) return 'ended';
  return c.remainingStock === 0 ? 'soldOut' : 'running';
}

const ISO_TIME = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$/;

/** A value the server wrote under `key` (reconciliation's details, an explanation's values), as the console shows such values. */
export function valueText(key: string, v: string | number): string {
  if (typeof v === 'number') return key.endsWith('Cents') ? `¥${yuan(v)}` : count(v);
  return ISO_TIME.test(v) ? time(v) : v;
}
