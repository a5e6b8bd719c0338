import { report } from './contract-coverage.mjs';

export default report;
