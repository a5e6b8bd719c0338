import { createApp } from './app.factory.js';
import { ConfigError, loadConfig } from './config/app-config.js';
import { DatabaseUnreachableError, prepareDatabase } from './database/bootstrap-database.js';

async function main(): Promise<void> {
  const config = loadConfig();
  await prepareDatabase(config);
  const app = await createApp(config);
  await app.listen({ port: config.PORT, host: config.HOST });
}

main().catch((err: unknown) => {
  // Configuration and connectivity problems are the operator's to fix: one clear line, no stack.
  if (err instanceof ConfigError || err instanceof DatabaseUnreachableError) console.error(`coupon-engine: ${err.message}`);
  else console.error(err);
  process.exit(1);
});
