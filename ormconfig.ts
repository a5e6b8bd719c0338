// The DataSource the TypeORM migration CLI uses: npm run migration:run / migration:revert / migration:show
import { DataSource } from 'typeorm';
import { loadConfig } from './src/config/app-config.js';
import { dataSourceOptions } from './src/database/data-source-options.js';

export default new DataSource(dataSourceOptions(loadConfig()));
