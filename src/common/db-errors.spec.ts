import { isDatabaseOutage, outageMessage } from './db-errors.js';

describe('outageMessage', () => {
  const driver = (fields: { errno?: number; code?: string }) => Object.assign(new Error('driver'), fields);

  it('tells a lock held too long and a deadline passed apart from a database out of reach', () => {
    const cases = [
      [driver({ errno: 1205, code: 'ER_LOCK_WAIT_TIMEOUT' }), /held by other work/],
      [driver({ errno: 1213, code: 'ER_LOCK_DEADLOCK' }), /held by other work/],
      [driver({ code: 'PROTOCOL_SEQUENCE_TIMEOUT' }), /did not answer within the request's deadline/],
      [driver({ code: 'POOL_ACQUIRE_TIMEOUT' }), /did not answer within the request's deadline/],
      [driver({ code: 'ECONNREFUSED' }), /not available right now/],
      [{ driverError: driver({ errno: 1205 }) }, /held by other work/],
    ] as const;
    for (const [err, message] of cases) {
      expect(isDatabaseOutage(err)).toBe(true);
      expect(outageMessage(err)).toMatch(message);
    }
  });
});
