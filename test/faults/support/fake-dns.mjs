// Preloaded into a spawned server (NODE_OPTIONS=--import): resolves the names in FAKE_DNS
// (`name=address,...`) to those addresses, as a DNS server answering them would, so that what the
// service does with a name's addresses is tested without a DNS server. Other names resolve as usual.
import dns from 'node:dns';
import { syncBuiltinESMExports } from 'node:module';

const names = new Map(
  (process.env.FAKE_DNS ?? '')
    .split(',')
    .filter(Boolean)
    .map((entry) => entry.split('=')),
);
const lookup = dns.lookup;
dns.lookup = (hostname, ...rest) => lookup(names.get(hostname) ?? hostname, ...rest);
// `import { lookup } from 'node:dns'` in the service then gets this one too.
syncBuiltinESMExports();
