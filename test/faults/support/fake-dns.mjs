// Preloaded into a spawned server (NODE_OPTIONS=--import): resolves the names in FAKE_DNS
// (`name=address,...`) to those addresses, as a DNS server answering them would, so that what the
// service does with a name's addresses is tested without a DNS server. Other names resolve as usual.
// `name=a|b` answers a to the first lookup and b to every later one: a name that changes its address
// between two connections, as in DNS rebinding.
import dns from 'node:dns';
import { syncBuiltinESMExports } from 'node:module';

const names = new Map(
  (process.env.FAKE_DNS ?? '')
    .split(',')
    .filter(Boolean)
    .map((entry) => {
      const [name, addresses] = entry.split('=');
      return [name, addresses.split('|')];
    }),
);
const lookup = dns.lookup;
dns.lookup = (hostname, ...rest) => {
  const answers = names.get(hostname);
  return lookup((answers?.length > 1 ? answers.shift() : answers?.[0]) ?? hostname, ...rest);
};
// `import { lookup } from 'node:dns'` in the service then gets this one too.
syncBuiltinESMExports();
