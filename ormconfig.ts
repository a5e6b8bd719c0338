// The DataSource the TypeORM CLI uses: npm run migration:run | migration:revert | migration:show |
// migration:generate -- src/database/migrations/<name> | migration:create -- src/database/migrations/<name>
// Settings come from the environment or .env, like the service's.
import { fileURLToPath } from 'node:url';
import { DataSource } from 'typeorm';
import { AppConfig, ConfigError, loadConfig, readEnvFile } from './src/config/app-config.js';
import { DatabaseUnreachableError, ensureDatabase } from './src/database/bootstrap-database.js';
import { dataSourceOptions } from './src/database/data-source-options.js';

readEnvFile();
let config: AppConfig;
try {
  config = loadConfig();
  // As the service does at start: a database that does not exist yet is created (empty), so
  // run/show/revert answer about it instead of failing with the driver's stack trace.
  await ensureDatabase(config);
} catch (err) {
  if (!(err instanceof ConfigError || err instanceof DatabaseUnreachableError)) throw err;
  console.error(`coupon-engine: ${err.message}`);
  process.exit(1);
}

export default new DataSource({
  ...dataSourceOptions(config),
  // The app registers its entities through Nest (autoLoadEntities); migration:generate compares them with the database.
  entities: [fileURLToPath(new URL('./src/**/*.entity.js', import.meta.url))],
});
