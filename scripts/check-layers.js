#!/usr/bin/env node
// The layers, checked over the sources' imports and includes. TypeScript (ts/): a file may import its
// own folder and the folders below its own (LAYERS, lowest first), never one above; no two files
// import each other, even through others; every file opens with a comment naming its concern and
// stays near 400 lines. Native code (cpp/, cuda/): a file may include its own folder and the folders
// of lower levels (NATIVE_LEVELS), never one of its own level or above. Tests (test/) sit in folders
// named for what they exercise (TEST_FOLDERS) and import nothing from bench/; scripts (scripts/)
// import nothing from bench/ and only helpers from test/; files of both stay within MAX_LINES. Prints
// each break, naming the file and the import or include, and exits 1 if there is one.
// docs/architecture.md explains the layers.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

const REPO = path.join(path.dirname(fileURLToPath(import.meta.url)), '..');
const ROOT = path.join(REPO, 'ts');

/** The folders of ts/, lowest first. The files at the top of ts/ (the package's entry points) may import any. */
export const LAYERS = ['base', 'config', 'native', 'comm', 'data', 'engine', 'train', 'cluster', 'report', 'cli'];
export const MAX_LINES = 450;

/**
 * The folders of cpp/ and cuda/ (one include root each, the same folder names), by level, lowest
 * first: the loaded NVIDIA libraries above core; process groups, ops and the batcher side by side;
 * the gradient reducer; the models; the session; the binding and the kernel lab on top.
 */
export const NATIVE_LEVELS = [['core'], ['lib'], ['comm', 'ops', 'data'], ['compress'], ['models'], ['train'], ['napi', 'lab']];

function files(dir, pattern = /\.ts$/) {
  return fs.readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = path.join(dir, e.name);
    return e.isDirectory() ? files(p, pattern) : pattern.test(e.name) ? [p] : [];
  });
}

/** Includes that break NATIVE_LEVELS, in the sources under `roots` (paths from the repository). */
export function checkNative(roots = ['cpp', 'cuda'].map((r) => path.join(REPO, r))) {
  const level = (folder) => NATIVE_LEVELS.findIndex((names) => names.includes(folder));
  const problems = [];
  for (const root of roots)
    for (const file of files(root, /\.(h|cuh|cpp|cu|def)$/)) {
      const rel = path.relative(REPO, file);
      const folder = path.relative(root, file).split(path.sep)[0];
      if (level(folder) < 0) {
        problems.push(`${rel}: its folder is not a level (add it to NATIVE_LEVELS in scripts/check-layers.js and to docs/architecture.md)`);
        continue;
      }
      const text = fs.readFileSync(file, 'utf8');
      const lines = text.split('\n').length;
      if (lines > MAX_LINES) problems.push(`${rel}: ${lines} lines, more than ${MAX_LINES}: split it by concern`);
      for (const m of text.matchAll(/^\s*#\s*include\s+"([a-z_]+)\/[^"]+"/gm)) {
        const target = m[1];
        if (target === folder || level(target) < 0) continue;  // its own folder; not one of ours (a library's header)
        if (level(target) >= level(folder))
          problems.push(`${rel}: includes "${m[0].match(/"(.+)"/)[1]}", ${level(target) === level(folder) ? 'a folder of its own level' : 'a level above its own'}`);
      }
    }
  return problems;
}

/**
 * The folders of test/ that hold suites: a layer of ts/, a native level the TypeScript has no layer
 * for (compress), the GPU's suites, and checks of the repository as a whole (project). The others
 * hold what suites use: helpers, fixtures and the PyTorch oracles.
 */
export const TEST_FOLDERS = [...LAYERS, 'compress', 'gpu', 'project'];
const TEST_SUPPORT = ['helpers', 'fixtures', 'oracles'];

/** The relative imports of a JavaScript file (static and dynamic), as paths from the repository. */
function jsImports(file, repo) {
  const text = fs.readFileSync(file, 'utf8');
  return [...text.matchAll(/(?:^|\n)\s*(?:import|export)\s[^'";]*?from\s+'(\.{1,2}\/[^']+)'|import\(\s*'(\.{1,2}\/[^']+)'\s*\)|(?:^|\n)\s*import\s+'(\.{1,2}\/[^']+)'/g)].map((m) => {
    const spec = m[1] ?? m[2] ?? m[3];
    return { spec, target: path.relative(repo, path.resolve(path.dirname(file), spec)) };
  });
}

/** Breaks of the rules for test/ and scripts/ under `repo`. */
export function checkTestsAndScripts(repo = REPO) {
  const problems = [];
  const within = (target, folder) => target === folder || target.startsWith(folder + path.sep);
  for (const top of ['test', 'scripts']) {
    const root = path.join(repo, top);
    if (!fs.existsSync(root)) continue;
    for (const file of files(root, /\.(js|mjs|sh|py)$/)) {
      const rel = path.relative(repo, file);
      const parts = path.relative(root, file).split(path.sep);
      if (top === 'test' && parts[0] === 'fixtures') continue;
      const lines = fs.readFileSync(file, 'utf8').split('\n').length;
      if (lines > MAX_LINES) problems.push(`${rel}: ${lines} lines, more than ${MAX_LINES}: split it by concern`);
      if (top === 'test' && rel.endsWith('.test.js') && (parts.length !== 2 || !TEST_FOLDERS.includes(parts[0])))
        problems.push(`${rel}: a suite belongs in test/<folder>/ for what it tests (${TEST_FOLDERS.join(', ')})`);
      if (top === 'test' && parts.length > 1 && !TEST_FOLDERS.includes(parts[0]) && !TEST_SUPPORT.includes(parts[0]))
        problems.push(`${rel}: test/${parts[0]}/ is neither a suite's folder nor ${TEST_SUPPORT.join(', ')}`);
      if (!/\.m?js$/.test(file)) continue;
      for (const { spec, target } of jsImports(file, repo)) {
        if (within(target, 'bench')) problems.push(`${rel}: imports '${spec}' (${target}): ${top}/ may not depend on the benchmarks`);
        if (top === 'scripts' && within(target, 'test') && !within(target, path.join('test', 'helpers')))
          problems.push(`${rel}: imports '${spec}' (${target}): scripts may use test/helpers/ only`);
      }
    }
  }
  return problems;
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
  const problems = [...check(), ...checkNative(), ...checkTestsAndScripts()];
  for (const p of problems) console.error(p);
  if (problems.length) process.exit(1);
  console.log(`ts/: ${LAYERS.join(' → ')}: every import points down, no cycles, every file opens with its concern`);
  console.log(`cpp/, cuda/: ${NATIVE_LEVELS.map((l) => l.join(' | ')).join(' → ')}: every include points down`);
  console.log(`test/, scripts/: suites in ${TEST_FOLDERS.join(', ')}; nothing imports bench/; every file within ${MAX_LINES} lines`);
}
