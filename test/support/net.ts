import { connect, createServer } from 'node:net';

/** A TCP port free on 127.0.0.1 right now, for a server a test or benchmark starts. */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as { port: number };
      server.close(() => resolve(port));
    });
  });
}

/** Writes `text` on a fresh socket and reads until the server closes it. */
export function rawExchange(base: string, text: string): Promise<string> {
  return new Promise<string>((resolve, reject) => {
    const socket = connect(Number(new URL(base).port), '127.0.0.1', () => socket.write(text));
    let answer = '';
    socket.on('data', (c) => (answer += c.toString()));
    socket.on('close', () => resolve(answer));
    socket.on('error', reject);
  });
}
