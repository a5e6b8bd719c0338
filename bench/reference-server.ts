// The reference designs' server: the shipped app exactly as main.ts builds it, plus ReferenceModule.
import { createApp } from '../src/app.factory.js';
import { loadConfig } from '../src/config/app-config.js';
import { prepareDatabase } from '../src/database/bootstrap-database.js';
import { closeOnSignals } from '../src/shutdown.js';
import { noopAheadOfFastify, ReferenceModule } from './reference/reference.module.js';

const config = loadConfig();
await prepareDatabase(config);
// The same createApp() as main.ts, so adapter, hooks, guard, pipes and filter are identical.
const app = await createApp(config, [ReferenceModule], [noopAheadOfFastify(config)]);
closeOnSignals(app, config);
await app.listen({ port: config.PORT, host: '127.0.0.1' });
