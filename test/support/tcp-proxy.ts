import { connect, createServer, Socket } from 'node:net';

/** What to do with a client's COMMIT (a COM_QUERY packet whose text is exactly COMMIT). */
export type CommitFate = 'pass' | 'lose-answer' | 'drop' | 'slow-answer';

export interface TcpProxyOptions {
  /**
   * Decides each COMMIT. `lose-answer`: forward it, then cut the connection before the server's
   * answer reaches the client (the server has it and commits). `drop`: cut the connection without
   * forwarding it (the server rolls back). Either way the client sees a lost connection at COMMIT.
   * `slow-answer`: forward it, and hold the server's answer back for `slowAnswerMs` (the server has
   * committed; a client whose statement timeout is shorter gives up waiting).
   */
  onCommit?: () => CommitFate;
  slowAnswerMs?: number;
  /** Listen on this port (to bring a "host" back where it was); a free one by default. */
  port?: number;
  /** Connections after this many are cut as soon as they are accepted (a host lost at a chosen point of a start). */
  acceptAtMost?: number;
}

export interface TcpProxy {
  port: number;
  /** Client connections accepted so far. */
  readonly accepted: number;
  readonly commits: Record<CommitFate, number>;
  /** While true, new connections are cut as soon as they are accepted (the host is out of reach); those open go on. */
  refusing: boolean;
  /** Cuts every connection and stops listening (new connections are refused), like a dead host. */
  close(): Promise<void>;
}

const COM_QUERY = 0x03;
const COMMIT = Buffer.from('COMMIT');

/**
 * A TCP proxy in front of MySQL on loopback, for failover and lost-answer faults. Client-to-server
 * bytes are split into protocol packets (3-byte length, sequence byte) so a COMMIT can be seen and
 * acted on as a whole.
 */
export function startTcpProxy(target: { host: string; port: number }, opts: TcpProxyOptions = {}): Promise<TcpProxy> {
  const sockets = new Set<Socket>();
  const commits: Record<CommitFate, number> = { pass: 0, 'lose-answer': 0, drop: 0, 'slow-answer': 0 };
  let accepted = 0;
  const state = { refusing: false };
  const server = createServer((client) => {
    if (state.refusing || accepted >= (opts.acceptAtMost ?? Infinity)) return void client.destroy();
    accepted++;
    const upstream = connect(target.port, target.host);
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on('close', () => sockets.delete(s));
      s.on('error', () => undefined);
    }
    const cut = () => {
      client.destroy();
      upstream.destroy();
    };
    client.on('close', cut);
    upstream.on('close', cut);
    let answerLost = false;
    let heldUntil = 0;
    upstream.on('data', (chunk: Buffer) => {
      if (answerLost) cut();
      else if (Date.now() < heldUntil) setTimeout(() => client.write(chunk), heldUntil - Date.now());
      else client.write(chunk);
    });
    let pending: Buffer = Buffer.alloc(0);
    client.on('data', (chunk: Buffer) => {
      pending = pending.length === 0 ? chunk : Buffer.concat([pending, chunk]);
      while (pending.length >= 4) {
        const size = pending.readUIntLE(0, 3);
        if (pending.length < 4 + size) break;
        const packet = pending.subarray(0, 4 + size);
        pending = pending.subarray(4 + size);
        const isCommit = size === 1 + COMMIT.length && packet[4] === COM_QUERY && packet.subarray(5).equals(COMMIT);
        const fate = isCommit && opts.onCommit ? opts.onCommit() : 'pass';
        if (isCommit) commits[fate]++;
        if (fate === 'drop') return cut();
        upstream.write(packet);
        if (fate === 'lose-answer') answerLost = true;
        if (fate === 'slow-answer') heldUntil = Date.now() + (opts.slowAnswerMs ?? 1000);
      }
    });
  });
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(opts.port ?? 0, '127.0.0.1', () => {
      resolve({
        port: (server.address() as { port: number }).port,
        get accepted() {
          return accepted;
        },
        commits,
        get refusing() {
          return state.refusing;
        },
        set refusing(on: boolean) {
          state.refusing = on;
        },
        close: () =>
          new Promise<void>((done) => {
            server.close(() => done());
            for (const s of sockets) s.destroy();
          }),
      });
    });
  });
}
