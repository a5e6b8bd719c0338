import base from './jest.config.js';

export default {
  ...base,
  testMatch: ['<rootDir>/test/faults/**/*.spec.ts'],
  testPathIgnorePatterns: ['/node_modules/'],
  testTimeout: 300000,
  maxWorkers: 1,
};
