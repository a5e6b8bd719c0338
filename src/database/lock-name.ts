import { createHash } from 'node:crypto';

/**
 * The name of a MySQL named lock (GET_LOCK) for one job on one database. Several deployments may
 * share a server, so the database is part of the name; MySQL refuses names over 64 characters, so
 * a long database name is hashed.
 */
export function lockName(job: string, dbName: string): string {
  const name = `coupon-engine:${job}:${dbName}`;
  return name.length <= 64
    ? name
    : `coupon-engine:${job}:${createHash('sha256')
        .update(dbName)
        .digest('hex')
        .slice(0, 64 - job.length - 16)}`;
}
