import { connect, createServer, Socket } from 'node:net';

export interface StallProxy {
  port: number;
  /**
   * From now on nothing is forwarded either way and new connections are accepted but never reach
   * the server: to the client, the database behaves like a SIGSTOPped process (the kernel keeps
   * the TCP connections open, nothing ever answers).
   */
  stall(): void;
  /** Forwards again, everything held included (like SIGCONT). */
  resume(): void;
  close(): Promise<void>;
}

/** A TCP proxy in front of the database on loopback that can stall without stopping the database everyone else's tests share. */
export function startStallProxy(target: { host: string; port: number }): Promise<StallProxy> {
  const sockets = new Set<Socket>();
  let stalled = false;
  const waiting: (() => void)[] = [];
  const waitingData = new Map<Socket, Buffer>();
  const flushes: (() => void)[] = [];
  const server = createServer((client) => {
    const track = (s: Socket) => {
      sockets.add(s);
      s.on('close', () => sockets.delete(s));
      s.on('error', () => undefined);
    };
    track(client);
    const open = () => {
      const upstream = connect(target.port, target.host);
      track(upstream);
      const cut = () => {
        client.destroy();
        upstream.destroy();
      };
      client.on('close', cut);
      upstream.on('close', cut);
      // Bytes that arrive while stalled are held, not forwarded, and go on when resumed.
      const held: [Socket, Buffer][] = [];
      const forward = (to: Socket) => (chunk: Buffer) => (stalled ? held.push([to, chunk]) : to.write(chunk));
      client.on('data', forward(upstream));
      upstream.on('data', forward(client));
      flushes.push(() => {
        for (const [to, chunk] of held.splice(0)) to.write(chunk);
      });
      if (waitingData.has(client)) forward(upstream)(waitingData.get(client) as Buffer);
    };
    if (stalled) {
      client.on('data', (c: Buffer) => waitingData.set(client, Buffer.concat([waitingData.get(client) ?? Buffer.alloc(0), c])));
      waiting.push(() => {
        client.removeAllListeners('data');
        open();
      });
    } else open();
  });
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      resolve({
        port: (server.address() as { port: number }).port,
        stall() {
          stalled = true;
        },
        resume() {
          stalled = false;
          for (const flush of flushes) flush();
          for (const open of waiting.splice(0)) open();
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
