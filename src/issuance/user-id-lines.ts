import type { Socket } from 'node:net';
import type { Readable } from 'node:stream';
import { TextDecoder } from 'node:util';
import { AppError, shuttingDown } from '../common/errors.js';
import { validationFailed } from '../common/validation.js';

export const CSV_MAX_BYTES = 64 * 1024 * 1024;
export const CSV_MAX_LINES = 1_000_000;

export const csvTooLarge = () => new AppError('PAYLOAD_TOO_LARGE', 'The upload is over 64 MiB', { maxBytes: CSV_MAX_BYTES });

/**
 * An upload that stopped arriving, when Node's socket timeout (connectionTimeout: twice
 * REQUEST_TIMEOUT_MS of silence) fires on its request: Node closed the connection then without a
 * word, since the route's own deadline (BULK_UPLOAD_TIMEOUT_MS) is far longer.
 */
export const uploadStalled = () => new AppError('REQUEST_TIMEOUT', 'The upload stopped arriving', undefined, { Connection: 'close' });

/**
 * A first line naming the column rather than a user, when the upload does not say: the name the
 * skipped-lines CSV writes, or the API's for a user id. Shorter names (`id`, `uid`, `user`) are user ids too.
 */
const HEADER = /^user_?id$/i;

/**
 * RFC 4180's `header` parameter of text/csv: `present` passes over the first line whatever it is,
 * `absent` takes it as a user id; left out, a first line `user_id` or `userId` is taken as a header.
 */
export type CsvHeader = 'present' | 'absent' | 'guess';

export function csvHeader(contentType: string | undefined): CsvHeader {
  const value = /;\s*header\s*=\s*"?([^";\s]*)"?/i.exec(contentType ?? '')?.[1]?.toLowerCase();
  if (value === undefined) return 'guess';
  if (value === 'present' || value === 'absent') return value;
  throw validationFailed({ 'Content-Type': ['its header parameter must be present or absent (RFC 4180)'] });
}

/** Longer lines are kept to this many characters: an invalid user id whatever they hold. */
export const CSV_MAX_LINE_CHARS = 4096;

/**
 * The user ids of a `text/csv` upload, one per line with its line number in the file, as they arrive: never the whole body in memory.
 * Blank lines are passed over and a first line that is a header (`header`) is dropped; a line in double quotes is
 * taken without them; CRLF, CR alone (old Mac
 * files) and a BOM are fine. The text is UTF-8 unless the Content-Type names another charset
 * (csvDecoder). Bytes that are not text in it are 400, more than 64 MiB or 1,000,000 ids 413. Each
 * chunk is scanned once: a line without an end costs no more than a short one.
 */
export async function* userIdLines(
  body: Readable,
  decoder = csvDecoder(undefined),
  header: CsvHeader = 'guess',
  stopping?: AbortSignal,
): AsyncGenerator<{ lineNo: number; text: string }> {
  let bytes = 0;
  let lines = 0;
  let lineNo = 0;
  let first = true;
  /** The unfinished line so far, at most CSV_MAX_LINE_CHARS + 1 characters. */
  let rest = '';
  /** The last text ended in CR: an LF opening the next one belongs to it. */
  let afterCr = false;
  let started = false;
  // Its own: a global regex keeps its position between calls, and uploads running at once interleave here.
  const eol = /\r\n|\r|\n/g;
  const keep = (piece: string) => {
    if (rest.length <= CSV_MAX_LINE_CHARS) rest += piece.slice(0, CSV_MAX_LINE_CHARS + 1 - rest.length);
  };
  const take = function* (decoded: string) {
    // A chunk may decode to nothing (a character split over chunks): it changes nothing, a CR before it included.
    if (decoded === '') return;
    const text = !started && decoded.charCodeAt(0) === 0xfeff ? decoded.slice(1) : decoded;
    started = true;
    let start = afterCr && text.startsWith('\n') ? 1 : 0;
    afterCr = false;
    eol.lastIndex = start;
    for (let m = eol.exec(text); m !== null; m = eol.exec(text)) {
      keep(text.slice(start, m.index));
      yield rest;
      rest = '';
      start = eol.lastIndex;
      afterCr = start === text.length && m[0] === '\r';
    }
    keep(text.slice(start));
  };
  const accept = (raw: string): { lineNo: number; text: string } | null => {
    lineNo++;
    // An overlong line stays invalid: trimmed, what was kept of it might look like a user id.
    const trimmed = raw.length > CSV_MAX_LINE_CHARS ? raw.slice(0, CSV_MAX_LINE_CHARS) : raw.trim();
    // A spreadsheet may quote every field ("u-1"); a user id holds no quote, so one pair around the line is only quoting.
    const line = /^"[^"]*"$/.test(trimmed) ? trimmed.slice(1, -1).trim() : trimmed;
    if (line === '') return null;
    const wasFirst = first;
    first = false;
    if (wasFirst && (header === 'present' || (header === 'guess' && HEADER.test(line)))) return null;
    if (++lines > CSV_MAX_LINES)
      throw new AppError('PAYLOAD_TOO_LARGE', `At most ${CSV_MAX_LINES} user ids per upload`, { maxLines: CSV_MAX_LINES });
    return { lineNo, text: line };
  };
  for await (const chunk of chunksOf(body, stopping)) {
    bytes += chunk.length;
    if (bytes > CSV_MAX_BYTES) throw csvTooLarge();
    for (const raw of take(decoder.write(chunk))) {
      const line = accept(raw);
      if (line !== null) yield line;
    }
  }
  for (const raw of take(decoder.end())) {
    const line = accept(raw);
    if (line !== null) yield line;
  }
  // The last line, unless the upload ended with a newline.
  if (rest !== '') {
    const line = accept(rest);
    if (line !== null) yield line;
  }
}

/**
 * The body's chunks; the stream failing (the client reset the connection mid-upload) is the client's
 * doing, not an outage. A refusal before the end (bytes that are not text, too many lines) leaves
 * the rest unread, not destroyed: every route reads and drops it (common/unread-body.ts), so a
 * client still sending gets the answer rather than a broken pipe.
 */
async function* chunksOf(body: Readable, stopping?: AbortSignal): AsyncGenerator<Buffer> {
  const chunks = body.iterator({ destroyOnReturn: false }) as AsyncIterator<Buffer>;
  // The request's 'timeout' (an IncomingMessage's): Node found the connection silent for its
  // connectionTimeout. The client's slowness only while a chunk is awaited: while the caller is
  // still storing the last one (a slow database), nothing reads the socket, so the silence is ours
  // and the upload goes on (bound by the route's deadline). Node arms the timer again only on the
  // socket's next activity, which may never come (the rest was already read): so it is re-armed
  // when the next chunk is awaited.
  let awaiting = false;
  let missed = false;
  let stalled = false;
  let onStall = (): void => undefined;
  const stall = new Promise<never>((_, reject) => {
    onStall = () => {
      if (!awaiting) {
        missed = true;
        return;
      }
      stalled = true;
      reject(uploadStalled());
    };
  });
  stall.catch(() => undefined);
  body.on('timeout', onStall);
  // The instance stopping: the rest is not read (as after a stall), and the connection closes with the answer.
  let onStop = (): void => undefined;
  const stop = new Promise<never>((_, reject) => {
    onStop = () => {
      stalled = true;
      reject(shuttingDown({ Connection: 'close' }));
    };
  });
  stop.catch(() => undefined);
  if (stopping?.aborted) onStop();
  stopping?.addEventListener('abort', onStop);
  try {
    for (;;) {
      awaiting = true;
      if (missed) {
        missed = false;
        const socket = (body as Readable & { socket?: Socket }).socket;
        if (socket?.timeout) socket.setTimeout(socket.timeout);
      }
      const next = await Promise.race([chunks.next(), stall, stop]);
      awaiting = false;
      if (next.done) return;
      yield next.value;
    }
  } catch (err) {
    if (err instanceof AppError) throw err;
    throw validationFailed({ body: ['was cut off before its end'] }, `The upload was cut off: ${(err as Error).message}`);
  } finally {
    body.off('timeout', onStall);
    stopping?.removeEventListener('abort', onStop);
    // Stops listening, so the rest can be read and dropped; not after a stall, where the chunk
    // still awaited would hold the return up until the connection closes.
    if (!stalled) await chunks.return?.();
  }
}

/**
 * The decoder of a `text/csv` body: UTF-8, or the `charset` its Content-Type names (a spreadsheet
 * saved in China is often GBK or GB18030), any that the WHATWG Encoding standard knows; another
 * is 415. Called before the body is read.
 */
export function csvDecoder(contentType: string | undefined): StrictDecoder {
  const label = /;\s*charset\s*=\s*"?([^";\s]+)"?/i.exec(contentType ?? '')?.[1] ?? 'utf-8';
  try {
    return new StrictDecoder(new TextDecoder(label, { fatal: true, ignoreBOM: true }));
  } catch {
    throw new AppError(
      'UNSUPPORTED_MEDIA_TYPE',
      `The charset ${label.slice(0, 64)} is not supported; send UTF-8, or a charset of the WHATWG Encoding standard`,
    );
  }
}

/** TextDecoder with `fatal` refuses bad bytes (StringDecoder would replace them with U+FFFD silently); `stream` keeps a sequence split over two chunks. */
class StrictDecoder {
  constructor(private readonly decoder: TextDecoder) {}

  write(chunk: Buffer): string {
    return this.decode(() => this.decoder.decode(chunk, { stream: true }));
  }

  end(): string {
    return this.decode(() => this.decoder.decode());
  }

  private decode(fn: () => string): string {
    try {
      return fn();
    } catch {
      const name = this.decoder.encoding.toUpperCase();
      throw validationFailed({ body: [`must be ${name} text`] }, `The upload is not ${name} text`);
    }
  }
}
