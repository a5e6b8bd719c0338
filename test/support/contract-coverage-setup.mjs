import { clearSeen } from './contract-coverage.mjs';

export default clearSeen;
