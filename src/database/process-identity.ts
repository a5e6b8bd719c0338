import { randomUUID } from 'node:crypto';
import { hostname } from 'node:os';

/** This process among all instances (lease holders, transaction marker slots): host, pid and a random part for pid reuse. */
export const PROCESS_ID = `${hostname().slice(0, 64)}:${process.pid}:${randomUUID().slice(0, 8)}`;
