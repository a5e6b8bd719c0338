import base from './jest.config.js';

/** npm run test:galera: the service on a 3-node MariaDB Galera cluster the tests start themselves (test/galera/). */
export default {
  ...base,
  testMatch: ['<rootDir>/test/galera/**/*.spec.ts'],
  testPathIgnorePatterns: ['/node_modules/'],
  testTimeout: 180000,
  maxWorkers: 1,
};
