#!/usr/bin/env node
// The paper's PowerSGD results (Table 1) reproduced on real images: each setting trains static low,
// static high and Accordion over paired seeds with 4 workers on Fashion-MNIST, with the paper's
// schedule shape at a width and data size these machines can run. Every run is an ordinary run
// directory under DIR/SETTING/TAG/CONFIG-seedS; the command is resumable (a finished run is kept,
// a stopped one resumes from its checkpoint), so a setting can be run in pieces.
//
//   node bench/reproduce.js run resnet18-powersgd [--configs low,high,accordion] [--seeds 1,2,3] [--quick]
//   node bench/reproduce.js report resnet18-powersgd [--quick]      # tables, intervals, goals, charts
//   node bench/reproduce.js check resnet18-powersgd [--quick]       # Accordion with both levels low = static low, bit for bit
//   node bench/reproduce.js peer resnet18-powersgd [--seeds 1,2,3]  # dense, one worker, beside PyTorch
//   node bench/reproduce.js list
import * as fs from 'node:fs';
import * as path from 'node:path';
import { parseArgs } from 'node:util';
import { ROOT, runLogged } from './common.js';
import { writeSettingReport } from './reproduce-report.js';
import { runPeerComparison } from './reproduce-peer.js';

export const FASHION_MNIST = '/usr/share/datasets/fashion-mnist';
export const WORKERS = 4;

/**
 * The settings, each with the paper's figures beside it (Table 1: CIFAR-10, 300 epochs, 3 seeds).
 * Width, data size and epochs were fixed from the static runs alone (BENCHMARKS.md, *The paper's
 * claim on real images*), before any Accordion run.
 */
export const SETTINGS = {
  'resnet18-powersgd': {
    model: 'resnet18',
    compressor: 'powersgd',
    low: 2,
    high: 1,
    width: 0.125,
    trainImages: 12_800,
    epochs: 30,
    batchSize: 32,
    paper: { low: 94.5, high: 94.1, accordion: 94.5, floatsFactor: 0.65, source: 'Table 1, ResNet-18 on CIFAR-10' },
  },
  'vgg19bn-powersgd': {
    model: 'vgg19bn',
    compressor: 'powersgd',
    low: 4,
    high: 1,
    width: 0.125,
    trainImages: 12_800,
    epochs: 30,
    batchSize: 32,
    paper: { low: 93.4, high: 68.6, accordion: 92.9, floatsFactor: 0.44, source: 'Table 1, VGG-19bn on CIFAR-10' },
  },
};

/** The smoke mode: the same commands on a sliver of the data, whose figures are not quoted. */
const QUICK = { trainImages: 512, epochs: 3, batchSize: 16 };

/** The runs of a setting: static low, static high, Accordion between them, and Accordion with both levels low. */
export const CONFIGS = {
  low: (s) => ['--rank', String(s.low)],
  high: (s) => ['--rank', String(s.high)],
  accordion: (s) => ['--low-rank', String(s.low), '--high-rank', String(s.high)],
  equal: (s) => ['--low-rank', String(s.low), '--high-rank', String(s.low)],
};

/** A setting as it runs: the table's values, replaced by the quick mode's or by the command line's. */
export function resolveSetting(name, overrides = {}) {
  const base = SETTINGS[name];
  if (!base) throw new Error(`unknown setting '${name}' (known: ${Object.keys(SETTINGS).join(', ')})`);
  const s = { name, ...base, ...(overrides.quick ? QUICK : {}), ...Object.fromEntries(Object.entries(overrides).filter(([k, v]) => k !== 'quick' && v !== undefined)) };
  s.quick = Boolean(overrides.quick);
  s.tag = `w${s.width}-n${s.trainImages}-e${s.epochs}-b${s.batchSize}${s.quick ? '-quick' : ''}`;
  return s;
}

/**
 * The paper's schedule shape for a run of E epochs: lr 0.1 × global batch / 128 after a 5-epoch
 * warm-up from a worker's share, ÷10 from 50% and from 83% of the run, Accordion's check every 1/30
 * of the run (at least every epoch). The engine's milestone m takes effect from epoch m + 3
 * (counting from 1), so the milestones are the decay epochs less 3.
 */
export function scheduleArgs(s) {
  const globalBatch = s.batchSize * WORKERS;
  const peak = (0.1 * globalBatch) / 128;
  const decays = [Math.round(0.5 * s.epochs), Math.round((5 / 6) * s.epochs)].map((done) => Math.max(0, done + 1 - 3));
  return [
    '--lr', String(peak / WORKERS), '--warmup-epochs', String(Math.min(5, s.epochs)), '--milestones', decays.join(','),
    '--accordion-interval', String(Math.max(1, Math.floor(s.epochs / 30))),
  ];
}

/** The `accordion train` arguments of one run (without --out). */
export function trainArgs(s, config, seed, dataDir) {
  return [
    '--model', s.model, '--width', String(s.width), '--dataset', 'fashion-mnist', '--data', dataDir, '--train-images', String(s.trainImages),
    '--epochs', String(s.epochs), '--workers', String(WORKERS), '--batch-size', String(s.batchSize), '--threads', '1',
    '--compressor', s.compressor, ...CONFIGS[config](s), ...scheduleArgs(s), '--seed', String(seed), '--quiet',
  ];
}

export const runDir = (dir, s, config, seed) => path.join(dir, s.name, s.tag, `${config}-seed${seed}`);

/** Whether a run directory holds a finished run. */
export const finished = (run) => fs.existsSync(path.join(run, 'summary.json'));

/**
 * Trains one run unless it finished: resumed from its last checkpoint when it has one, else started
 * afresh over whatever a stopped start left. Its output goes to RUN.log beside it.
 */
async function trainOne(s, config, seed, o) {
  const run = runDir(o.dir, s, config, seed);
  if (finished(run)) return 'kept';
  const resumable = fs.existsSync(path.join(run, 'checkpoints', 'latest'));
  fs.mkdirSync(path.dirname(run), { recursive: true });
  const args = [path.join(ROOT, 'lib', 'cli.js'), 'train', ...trainArgs(s, config, seed, o.data), '--out', run, ...(resumable ? ['--resume', run] : ['--overwrite'])];
  const began = Date.now();
  const { code } = await runLogged(process.execPath, args, `${run}.log`, { spawn: { env: { ...process.env, OMP_NUM_THREADS: '1' } } });
  if (code !== 0) throw new Error(`${config} seed ${seed} failed (exit ${code}): see ${run}.log`);
  return `${resumable ? 'resumed' : 'trained'} in ${((Date.now() - began) / 60_000).toFixed(1)} min`;
}

/** `run`: every listed config × seed of the setting, seed by seed. */
async function runSetting(s, o) {
  console.log(`${s.name} (${s.tag}): ${o.configs.join(', ')} × seeds ${o.seeds.join(', ')}, ${WORKERS} workers; runs under ${path.join(o.dir, s.name, s.tag)}`);
  for (const seed of o.seeds)
    for (const config of o.configs) {
      const began = new Date().toISOString().slice(11, 19);
      console.log(`  ${began} ${config} seed ${seed}: ${await trainOne(s, config, seed, o)}`);
    }
}

/** `check`: Accordion with both levels at static low's must train exactly as static low does. */
async function checkEqualLevels(s, o) {
  const { readSafetensors } = await import('../lib/index.js');
  const seed = o.seeds[0];
  await runSetting(s, { ...o, configs: ['low', 'equal'], seeds: [seed] });
  // Every tensor of the last checkpoint: weights, running statistics, momentum, and every rank's error memories and Q.
  const final = (config) => {
    const run = runDir(o.dir, s, config, seed);
    const dir = path.join(run, 'checkpoints', fs.readFileSync(path.join(run, 'checkpoints', 'latest'), 'utf8').trim());
    const tensors = new Map();
    for (const file of fs.readdirSync(dir).filter((f) => f.endsWith('.safetensors')).sort())
      for (const [name, t] of readSafetensors(path.join(dir, file)).tensors) tensors.set(`${file}:${name}`, t);
    return tensors;
  };
  const [a, b] = [final('low'), final('equal')];
  const differ = [...a.keys()].filter((k) => !b.has(k) || Buffer.compare(Buffer.from(a.get(k).data), Buffer.from(b.get(k).data)) !== 0);
  if (a.size !== b.size) differ.push(`(${a.size} tensors against ${b.size})`);
  const epochs = (config) => fs.readFileSync(path.join(runDir(o.dir, s, config, seed), 'metrics.jsonl'), 'utf8').split('\n').filter((l) => l.includes('"event":"epoch"')).map((l) => JSON.parse(l).testAccuracy);
  const same = JSON.stringify(epochs('low')) === JSON.stringify(epochs('equal'));
  console.log(`Accordion with rank ${s.low} ↔ ${s.low} against static rank ${s.low}, seed ${seed}, ${s.epochs} epochs: ` +
    `${a.size - differ.length} of ${a.size} tensors of the last checkpoints (weights, statistics, momentum, each rank's error memory and Q) equal bit for bit; every epoch's test accuracy ${same ? 'equal' : 'DIFFERENT'}`);
  if (differ.length || !same) {
    console.log(`differing tensors: ${differ.slice(0, 10).join(', ')}${differ.length > 10 ? ', …' : ''}`);
    process.exitCode = 1;
  }
}

const USAGE = `Usage: node bench/reproduce.js run|report|check|peer SETTING [options]
       node bench/reproduce.js list

  run      train the setting's runs (resumable: finished runs are kept, stopped ones resume)
  report   the setting's figures beside the paper's: RESULTS/reproduce-SETTING.md and .png
  check    Accordion with both levels low against static low, bit for bit (seed: the first of --seeds)
  peer     the dense setting on one worker beside PyTorch: the first 10 losses from the same weights
           and batches, then full runs over --seeds

Options:
  --configs LIST   run: of ${Object.keys(CONFIGS).join(', ')} (default low,high,accordion)
  --seeds LIST     default 1,2,3
  --quick          a smoke run on ${QUICK.trainImages} images for ${QUICK.epochs} epochs; its figures are not quoted
  --width W, --train-images N, --epochs E, --batch-size B   replace the setting's values (to choose them)
  --dir DIR        run directories (default runs/reproduce)
  --data DIR       Fashion-MNIST (default ${FASHION_MNIST})
  --results DIR    where report and peer write their files (default bench/results)`;

async function main() {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
      configs: { type: 'string', default: 'low,high,accordion' },
      seeds: { type: 'string', default: '1,2,3' },
      quick: { type: 'boolean', default: false },
      width: { type: 'string' },
      'train-images': { type: 'string' },
      epochs: { type: 'string' },
      'batch-size': { type: 'string' },
      dir: { type: 'string', default: path.join(ROOT, 'runs', 'reproduce') },
      data: { type: 'string', default: FASHION_MNIST },
      results: { type: 'string', default: path.join(ROOT, 'bench', 'results') },
      help: { type: 'boolean', short: 'h', default: false },
    },
  });
  const [command, name] = positionals;
  if (values.help || !command) return console.log(USAGE);
  if (command === 'list') {
    for (const [key, s] of Object.entries(SETTINGS)) console.log(`${key}: ${s.model} width ${s.width}, ${s.compressor} rank ${s.low} ↔ ${s.high}, ${s.trainImages} images, ${s.epochs} epochs (paper: ${s.paper.source})`);
    return;
  }
  const number = (key) => (values[key] === undefined ? undefined : Number(values[key]));
  const s = resolveSetting(name, { quick: values.quick, width: number('width'), trainImages: number('train-images'), epochs: number('epochs'), batchSize: number('batch-size') });
  const configs = values.configs.split(',');
  for (const c of configs) if (!CONFIGS[c]) throw new Error(`--configs: unknown config '${c}' (known: ${Object.keys(CONFIGS).join(', ')})`);
  const o = { configs, seeds: values.seeds.split(',').map(Number), dir: path.resolve(values.dir), data: values.data, results: path.resolve(values.results) };
  if (command === 'run') await runSetting(s, o);
  else if (command === 'report') await writeSettingReport(s, o);
  else if (command === 'check') await checkEqualLevels(s, o);
  else if (command === 'peer') await runPeerComparison(s, o);
  else throw new Error(`unknown command '${command}'\n${USAGE}`);
}

if (process.argv[1] && path.resolve(process.argv[1]) === path.resolve(new URL(import.meta.url).pathname))
  main().catch((err) => {
    console.error(`reproduce.js: ${err.message}`);
    process.exit(1);
  });
