import { gzipSync } from 'node:zlib';
import negotiate from '@fastify/accept-negotiator';
import type { FastifyReply } from 'fastify';

/** Smaller answers go as they are: gzip's own header and trailer would take much of what it saves. */
export const MIN_GZIP_BYTES = 1024;

/**
 * An explicit `gzip;q=0`, which refuses gzip even beside a `*` (RFC 9110, 12.5.3): the negotiator
 * reads `*` as its first choice whatever else the header says.
 */
const REFUSES_GZIP = /(?:^|,)\s*gzip\s*;\s*q\s*=\s*0(?:\.0{0,3})?\s*(?:,|$)/i;

function takesGzip(acceptEncoding: string): boolean {
  // Coding names are case-insensitive (RFC 9110, 8.4.1); the negotiator compares them as written.
  return negotiate(acceptEncoding.toLowerCase(), ['gzip']) === 'gzip' && !REFUSES_GZIP.test(acceptEncoding);
}

/**
 * A JSON answer serialised once and sent to many clients (the public coupon page and list during a
 * sale): its UTF-8 bytes, and the same gzip'd, made on the first request that accepts gzip. A page
 * of 20 coupons is about 8 KB of JSON and under 1 KB gzip'd; writing its 8 KB was the largest share of
 * the list's CPU per answer in the profile, and every browser accepts gzip.
 */
export class SharedJson {
  readonly bytes: Buffer;
  private gzipped: Buffer | undefined;

  constructor(json: string) {
    this.bytes = Buffer.from(json, 'utf8');
  }

  /** The body for this request, gzip'd when the client accepts gzip and the answer is large enough. */
  body(reply: FastifyReply): Buffer {
    // Both forms of the answer say so, so a shared cache keeps them apart.
    varyOn(reply, 'Accept-Encoding');
    const { bytes, gzip } = this.encodedFor(reply.request.headers['accept-encoding']);
    if (gzip) void reply.header('Content-Encoding', 'gzip');
    return bytes;
  }

  /** The body for a client sending this Accept-Encoding, and whether it is the gzip'd form. */
  encodedFor(acceptEncoding: string | undefined): { bytes: Buffer; gzip: boolean } {
    if (this.bytes.length < MIN_GZIP_BYTES || !takesGzip(acceptEncoding ?? '')) return { bytes: this.bytes, gzip: false };
    return { bytes: (this.gzipped ??= gzipSync(this.bytes)), gzip: true };
  }
}

/** Adds a name to Vary, keeping what CORS put there (Origin). */
function varyOn(reply: FastifyReply, name: string): void {
  const current = reply.getHeader('vary');
  const names = typeof current === 'string' ? current.split(',').map((n) => n.trim().toLowerCase()) : [];
  if (names.includes('*') || names.includes(name.toLowerCase())) return;
  void reply.header('Vary', typeof current === 'string' && current !== '' ? `${current}, ${name}` : name);
}
