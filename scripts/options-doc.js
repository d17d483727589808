#!/usr/bin/env node
// Writes docs/options.md from the commands' option tables (ts/cli/options-reference.ts);
// --check exits 1, naming the file, where the page and the tables part.
//
//   node scripts/options-doc.js [--check]
import * as fs from 'node:fs';
import { fileURLToPath } from 'node:url';
import { optionsReference } from '../lib/cli/options-reference.js';

const file = fileURLToPath(new URL('../docs/options.md', import.meta.url));
const text = optionsReference();
if (process.argv.includes('--check')) {
  const current = fs.existsSync(file) ? fs.readFileSync(file, 'utf8') : '';
  if (current !== text) {
    console.error(`${file} is not the option tables as they stand: run node scripts/options-doc.js`);
    process.exit(1);
  }
} else {
  fs.writeFileSync(file, text);
  console.log(`wrote ${file}`);
}
