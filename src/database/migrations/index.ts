import { InitialSchema1764460800000 } from './1764460800000-initial-schema.js';

/** Every migration, in order. The app, the CLI (ormconfig.ts) and the tests all use this list. */
export const migrations = [InitialSchema1764460800000];
