import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import { announcesBody } from './validation.js';

const awaiting = new WeakSet<IncomingMessage>();

/**
 * `100 Continue` only once the body is read. Node writes it as soon as the headers arrive, so a
 * request refused on its headers alone (413 on its length, 415, 401 for a bulk upload without a
 * token) had the client send its whole body for nothing. Answered without it, the connection
 * closes (Node's rule: the client may have sent the body or not, RFC 9110 10.1.1), once what a
 * client that did not wait sends meanwhile has been read and dropped (UnreadBodies, up to 2 s).
 */
export function continueWhenBodyRead(server: Server): void {
  server.on('checkContinue', (req: IncomingMessage, res: ServerResponse) => {
    // No body to hold back (a GET, a length of 0): at once, as Node would, so the connection is kept.
    if (announcesBody(req)) continueOnFirstRead(req, res);
    else res.writeContinue();
    server.emit('request', req, res);
  });
}

function continueOnFirstRead(req: IncomingMessage, res: ServerResponse): void {
  awaiting.add(req);
  const read = req._read;
  req._read = function (size: number) {
    req._read = read;
    // Read to drop the rest after an answer (UnreadBodies): a 100 then would follow the final status.
    if (awaiting.delete(req) && !res.headersSent) res.writeContinue();
    read.call(this, size);
  };
}

/** The client holds the body back until told to continue, and has not been told. */
export function awaitsContinue(req: IncomingMessage): boolean {
  return awaiting.has(req);
}

/** The answer goes without 100 Continue: reading what the client sends anyway no longer asks for the rest. */
export function forgoContinue(req: IncomingMessage): void {
  awaiting.delete(req);
}
