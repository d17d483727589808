#!/usr/bin/env node
/**
 * The `accordion` program: `accordion train [options]`, `launch`, `cluster`, `report`, `info`
 * (the commands are in cli/).
 */
import { realpathSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { main } from './cli/main.js';

export { main };
export { parseTrainArgs } from './cli/args.js';

const invokedDirectly = process.argv[1] !== undefined && realpathSync(process.argv[1]) === fileURLToPath(import.meta.url);
if (invokedDirectly) {
  main(process.argv.slice(2)).then((code) => {
    process.exitCode = code;
  });
}
