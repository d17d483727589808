// Where the tests find the repository's parts: its root, the command line, the PyTorch oracles.
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

export const ROOT = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
/** The `accordion` command, as built (lib/cli.js). */
export const CLI = path.join(ROOT, 'lib', 'cli.js');
/** The PyTorch programs the tests hold the engine to (test/oracles/README.md lists them). */
export const ORACLES = path.join(ROOT, 'test', 'oracles');
