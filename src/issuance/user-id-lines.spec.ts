import { Readable } from 'node:stream';
import { CSV_MAX_LINE_CHARS, userIdLines } from './user-id-lines.js';

/** The lines of an upload that arrives in these chunks. */
async function lines(...chunks: string[]): Promise<[number, string][]> {
  const out: [number, string][] = [];
  for await (const l of userIdLines(Readable.from(chunks.map((c) => Buffer.from(c))))) out.push([l.lineNo, l.text]);
  return out;
}

describe('userIdLines', () => {
  it('ends lines at LF, CRLF and CR alone, a CRLF split over two chunks counting once', async () => {
    expect(await lines('user_id\na\r\nb\rc\n')).toEqual([
      [2, 'a'],
      [3, 'b'],
      [4, 'c'],
    ]);
    expect(await lines('a\r', '\nb\r', 'c')).toEqual([
      [1, 'a'],
      [2, 'b'],
      [3, 'c'],
    ]);
    expect(await lines('\uFEFFa', 'b\n\n  c  ')).toEqual([
      [1, 'ab'],
      [3, 'c'],
    ]);
  });

  it('a body that fails mid-way (the client reset the connection) is the client’s 400, not an outage', async () => {
    const body = new Readable({ read() {} });
    body.push('a\nb');
    setImmediate(() => body.destroy(Object.assign(new Error('aborted'), { code: 'ECONNRESET' })));
    const seen: string[] = [];
    const reading = (async () => {
      for await (const l of userIdLines(body)) seen.push(l.text);
    })();
    await expect(reading).rejects.toMatchObject({
      code: 'VALIDATION_FAILED',
      details: { fields: { body: ['was cut off before its end'] } },
    });
    expect(seen).toEqual(['a']);
  });

  it('keeps an overlong line to CSV_MAX_LINE_CHARS characters, untrimmed so it stays invalid, and goes on after it', async () => {
    const chunk = 'x'.repeat(65_536);
    const found = await lines(` ok`, ...Array.from({ length: 64 }, () => chunk), ' \nnext\n');
    expect(found.map(([n, t]) => [n, t.length])).toEqual([
      [1, CSV_MAX_LINE_CHARS],
      [2, 4],
    ]);
    expect(found[0][1].startsWith(' okx')).toBe(true);
    expect(await lines(`${' '.repeat(CSV_MAX_LINE_CHARS)}abc`)).toEqual([[1, ' '.repeat(CSV_MAX_LINE_CHARS)]]);
  });
});
