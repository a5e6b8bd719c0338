/** Jest in native ESM mode (Nest 12 packages are ESM only); ts-jest transpiles each file on its own. */
export default {
  testEnvironment: 'node',
  extensionsToTreatAsEsm: ['.ts'],
  moduleNameMapper: { '^(\\.{1,2}/.*)\\.js$': '$1' },
  transform: {
    // @fastify/static (CommonJS) requires content-disposition, which is ESM only; Node 20's jest
    // cannot require() ESM, so that one package is compiled to CommonJS for the tests.
    '/node_modules/content-disposition/.+\\.js$': [
      'ts-jest',
      { useESM: false, tsconfig: { allowJs: true, module: 'commonjs', esModuleInterop: true } },
    ],
    '^.+\\.ts$': ['ts-jest', { useESM: true, tsconfig: 'tsconfig.json' }],
  },
  transformIgnorePatterns: ['/node_modules/(?!content-disposition/)'],
  testMatch: ['<rootDir>/test/**/*.spec.ts', '<rootDir>/src/**/*.spec.ts'],
  testPathIgnorePatterns: ['/node_modules/', '/test/faults/', '/test/galera/'],
  testTimeout: 60000,
  maxWorkers: 2,
  // Lists the documented answers (route, status, error code) no e2e test produced.
  globalSetup: '<rootDir>/test/support/contract-coverage-setup.mjs',
  globalTeardown: '<rootDir>/test/support/contract-coverage-teardown.mjs',
};
