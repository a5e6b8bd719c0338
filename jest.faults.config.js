import base from './jest.config.js';

export default {
  ...base,
  testMatch: ['<rootDir>/test/faults/**/*.spec.ts'],
  testPathIgnorePatterns: ['/node_modules/'],
  testTimeout: 300000,
  maxWorkers: 1,
  // Adds to the answers test:jest recorded (npm test runs it first) instead of clearing them, so the
  // coverage report the teardown writes covers both suites.
  globalSetup: undefined,
};
