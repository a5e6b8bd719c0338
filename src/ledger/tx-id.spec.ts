import { describe, expect, it } from '@jest/globals';
import { parseTxId, TxIds } from './tx-id.js';

describe('state-log tx ids', () => {
  it.each([
    [TxIds.grab('k-1'), { kind: 'grab', key: 'k-1' }],
    [TxIds.order('ORD-9'), { kind: 'order', orderNo: 'ORD-9' }],
    // The longest order number, counted in code points as validation counts it.
    [TxIds.order('😀'.repeat(64)), { kind: 'order', orderNo: '😀'.repeat(64) }],
    [TxIds.refund('RF-1'), { kind: 'refund', refundNo: 'RF-1' }],
    [TxIds.admin('ops:eu-1', 'void'), { kind: 'admin', adminId: 'ops:eu-1', action: 'void' }],
    [TxIds.compensation('12'), { kind: 'compensation', compensationId: '12' }],
    [TxIds.bulk('7'), { kind: 'bulk', jobId: '7' }],
  ])('parses what it builds: %s', (txId, ref) => {
    expect(parseTxId(txId)).toEqual(ref);
  });

  it('names each expiry sweep run apart', () => {
    const [a, b] = [TxIds.expirySweep(), TxIds.expirySweep()];
    expect(a).not.toEqual(b);
    expect(parseTxId(a)).toEqual({ kind: 'expiry-sweep', run: a.slice('expiry-sweep:'.length) });
  });

  it.each(['order:', `order:${'x'.repeat(65)}`, 'grab:', 'test-issue-1', 'bench', 'admin:reissue', 'ORDER:1'])(
    'refuses %s, which no writer builds',
    (txId) => {
      expect(parseTxId(txId)).toBeNull();
    },
  );
});
