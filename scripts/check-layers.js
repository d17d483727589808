#!/usr/bin/env node
// The TypeScript's layers, checked over its imports: a file may import its own folder and the folders
// below its own (LAYERS, lowest first), never one above; no two files import each other, even through
// others; every file opens with a comment naming its concern and stays near 400 lines. Prints each
// break, naming the file and the import, and exits 1 if there is one. docs/architecture.md explains
// the layers.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'ts');

/** The folders of ts/, lowest first. The files at the top of ts/ (the package's entry points) may import any. */
export const LAYERS = ['base', 'config', 'native', 'comm', 'data', 'engine', 'train', 'cluster', 'report', 'cli'];
export const MAX_LINES = 450;

function files(dir) {
  return fs.readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = path.join(dir, e.name);
    return e.isDirectory() ? files(p) : e.name.endsWith('.ts') ? [p] : [];
  });
}

/** The relative imports of a file (import … from, export … from, import()), as paths under ts/. */
function imports(file) {
  const text = fs.readFileSync(file, 'utf8');
  const out = [];
  for (const m of text.matchAll(/(?:^|\n)\s*(?:import|export)\s[^'";]*?from\s+'(\.{1,2}\/[^']+)'|import\(\s*'(\.{1,2}\/[^']+)'\s*\)/g)) {
    const spec = m[1] ?? m[2];
    out.push({ spec, target: path.relative(ROOT, path.resolve(path.dirname(file), spec)).replace(/\.js$/, '.ts') });
  }
  return out;
}

/** A file's layer: its folder's index in LAYERS; the entry points above them all. */
function layerOf(rel) {
  const parts = rel.split(path.sep);
  return parts.length === 1 ? LAYERS.length : LAYERS.indexOf(parts[0]);
}

export function check() {
  const problems = [];
  const graph = new Map();
  for (const file of files(ROOT)) {
    const rel = path.relative(ROOT, file);
    const text = fs.readFileSync(file, 'utf8');
    const lines = text.split('\n').length;
    if (lines > MAX_LINES) problems.push(`${rel}: ${lines} lines, more than ${MAX_LINES}: split it by concern`);
    if (!/^(#![^\n]*\n)?\/\*\*?\s*\n?\s*\*?\s*\S/.test(text) && !/^(#![^\n]*\n)?\/\//.test(text)) problems.push(`${rel}: does not open with a comment naming its concern`);
    const from = layerOf(rel);
    if (from < 0) problems.push(`${rel}: its folder is not a layer (add it to LAYERS in scripts/check-layers.js and to docs/architecture.md)`);
    graph.set(rel, []);
    for (const { spec, target } of imports(file)) {
      graph.get(rel).push(target);
      if (layerOf(target) > from)
        problems.push(`${rel}: imports '${spec}' (${target}), a layer above its own`);
    }
  }
  // Cycles: a depth-first search over the files, reporting each cycle once by the file it closes on.
  const state = new Map();
  const visit = (node, trail) => {
    state.set(node, 'open');
    for (const next of graph.get(node) ?? []) {
      if (state.get(next) === 'open') problems.push(`import cycle: ${[...trail.slice(trail.indexOf(next)), node, next].join(' → ')}`);
      else if (!state.has(next) && graph.has(next)) visit(next, [...trail, node]);
    }
    state.set(node, 'done');
  };
  for (const node of graph.keys()) if (!state.has(node)) visit(node, []);
  return problems;
}

if (process.argv[1] && fs.realpathSync(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const problems = check();
  for (const p of problems) console.error(p);
  if (problems.length) process.exit(1);
  console.log(`ts/: ${LAYERS.join(' → ')}: every import points down, no cycles, every file opens with its concern`);
}
