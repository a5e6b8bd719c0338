// The reference designs' server: the shipped app exactly as main.ts builds it, plus ReferenceModule.
import { createApp } from '../src/app.factory.js';
import { AppModule } from '../src/app.module.js';
import { loadConfig } from '../src/config/app-config.js';
import { prepareDatabase } from '../src/database/bootstrap-database.js';
import { ReferenceModule } from './reference/reference.module.js';

// createApp() takes no extra modules, and copying it here would let the two stacks drift apart;
// widening AppModule.forRoot for this process only keeps adapter, hooks, guard, pipes and filter identical.
const forRoot = AppModule.forRoot.bind(AppModule);
AppModule.forRoot = (config) => {
  const root = forRoot(config);
  return { ...root, imports: [...(root.imports ?? []), ReferenceModule] };
};

const config = loadConfig();
await prepareDatabase(config);
const app = await createApp(config);
await app.listen({ port: config.PORT, host: '127.0.0.1' });
