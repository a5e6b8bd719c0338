import { Readable } from 'node:stream';
import { csvDecoder, csvHeader, CSV_MAX_LINE_CHARS, userIdLines } from './user-id-lines.js';

/** The lines of an upload that arrives in these chunks. */
async function lines(...chunks: (string | Buffer)[]): Promise<[number, string][]> {
  return linesOf(userIdLines(Readable.from(chunks.map((c) => (typeof c === 'string' ? Buffer.from(c) : c)))));
}
async function linesOf(source: AsyncIterable<{ lineNo: number; text: string }>): Promise<[number, string][]> {
  const out: [number, string][] = [];
  for await (const l of source) out.push([l.lineNo, l.text]);
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

  it('takes a line in double quotes without them, as a spreadsheet exports a quoted column, a quoted header too', async () => {
    expect(await lines('"user_id"\n"u-1"\n  " u-2 "\n"a"b"\n"\n""\n')).toEqual([
      [2, 'u-1'],
      [3, 'u-2'],
      // Not one quoted field: left as it is, an invalid user id.
      [4, '"a"b"'],
      [5, '"'],
    ]);
  });

  it('passes over a first line user_id or userId unless told; id, uid and user are user ids', async () => {
    for (const header of ['user_id', 'userId', 'USERID']) expect(await lines(`${header}\nu-1\n`)).toEqual([[2, 'u-1']]);
    for (const id of ['id', 'uid', 'user'])
      expect(await lines(`${id}\nu-1\n`)).toEqual([
        [1, id],
        [2, 'u-1'],
      ]);
  });

  it("follows RFC 4180's header parameter: present passes over the first line whatever it is, absent keeps it", async () => {
    const as = (header: 'present' | 'absent', text: string) =>
      linesOf(userIdLines(Readable.from([Buffer.from(text)]), csvDecoder(undefined), header));
    expect(await as('present', '\nu-0\nu-1\n')).toEqual([[3, 'u-1']]);
    expect(await as('absent', 'user_id\nu-1\n')).toEqual([
      [1, 'user_id'],
      [2, 'u-1'],
    ]);
    expect(csvHeader('text/csv')).toBe('guess');
    expect(csvHeader('text/csv; charset=utf-8; header=present')).toBe('present');
    expect(csvHeader('text/csv;Header="ABSENT"')).toBe('absent');
    for (const bad of ['text/csv; header=yes', 'text/csv; header='])
      expect(() => csvHeader(bad)).toThrow(expect.objectContaining({ code: 'VALIDATION_FAILED' }));
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

  it('two uploads read at once, each paused mid-chunk while the other goes on, keep their own lines', async () => {
    const ids = (p: string) => Array.from({ length: 50 }, (_, i) => `${p}${i}`);
    const [a, b] = [
      userIdLines(Readable.from([Buffer.from(ids('a').join('\n'))])),
      userIdLines(Readable.from([Buffer.from(ids('b').join('\r\n'))])),
    ];
    const got: Record<string, string[]> = { a: [], b: [] };
    // Alternate one line of each, as two requests awaiting their database writes do.
    for (let done = 0; done < 2;) {
      done = 0;
      for (const [name, it] of [
        ['a', a],
        ['b', b],
      ] as const) {
        const next = await it.next();
        if (next.done) done++;
        else got[name].push(next.value.text);
      }
    }
    expect(got).toEqual({ a: ids('a'), b: ids('b') });
  });

  it('a chunk that decodes to nothing changes nothing: a CRLF split around it counts once (UTF-16)', async () => {
    const utf16 = Buffer.from('a\r\nb\r\nc', 'utf16le');
    // The LF's two bytes arrive one by one: the first decodes to nothing.
    const at = utf16.indexOf(Buffer.from('\n', 'utf16le'));
    const chunks = [utf16.subarray(0, at), utf16.subarray(at, at + 1), utf16.subarray(at + 1)];
    expect(await linesOf(userIdLines(Readable.from(chunks), csvDecoder('text/csv; charset=utf-16le')))).toEqual([
      [1, 'a'],
      [2, 'b'],
      [3, 'c'],
    ]);
    expect(await lines(Buffer.from([0xef, 0xbb]), Buffer.from([0xbf]), `alice${' '.repeat(CSV_MAX_LINE_CHARS)}`)).toEqual([
      [1, `alice${' '.repeat(CSV_MAX_LINE_CHARS - 5)}`],
    ]);
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
