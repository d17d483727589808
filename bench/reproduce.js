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
//   node bench/reproduce.js run resnet18-powersgd --device cuda --width 1  # on one GPU, its 4 workers sharing it
//   node bench/reproduce.js data resnet18-powersgd --to DIR         # the setting's images, to carry elsewhere
//   node bench/reproduce.js list
import * as fs from 'node:fs';
import * as path from 'node:path';
import { parseArgs } from 'node:util';
import * as zlib from 'node:zlib';
import { ROOT, runLogged } from './common.js';
import { writeSettingReport } from './reproduce-report.js';
import { FASHION_MNIST, QUICK, SETTINGS, WORKERS, configsOf, describeLevels, resolveSetting, trainArgs } from './reproduce-settings.js';
import { runPeerComparison } from './reproduce-peer.js';

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
  const args = [
    path.join(ROOT, 'lib', 'cli.js'), 'train', ...trainArgs(s, config, seed, o.data), ...(o.inProcess ? ['--in-process'] : []),
    '--out', run, ...(resumable ? ['--resume', run] : ['--overwrite']),
  ];
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

/**
 * `data`: the Fashion-MNIST files of an image setting as it reads them: the first s.trainImages
 * training images and labels and the first s.testImages test ones (IDX headers with the count
 * replaced), or the test files as they are where the setting tests on all of them.
 */
function writeSettingData(s, from, to) {
  if (!to) throw new Error('data: --to DIR is required');
  if (s.kind === 'language') throw new Error(`data: ${s.name} reads ${s.text}, a file of the repository`);
  fs.mkdirSync(to, { recursive: true });
  const splits = [['train', s.trainImages], ['t10k', s.testImages]];
  for (const [split, count] of splits)
    for (const [file, header] of [[`${split}-images-idx3-ubyte.gz`, 16], [`${split}-labels-idx1-ubyte.gz`, 8]]) {
      if (count === undefined) {
        fs.copyFileSync(path.join(from, file), path.join(to, file));
        continue;
      }
      const idx = zlib.gunzipSync(fs.readFileSync(path.join(from, file)));
      const each = header === 16 ? idx.readUInt32BE(8) * idx.readUInt32BE(12) : 1;
      if (idx.readUInt32BE(4) < count) throw new Error(`data: ${path.join(from, file)} holds ${idx.readUInt32BE(4)} items, fewer than ${count}`);
      const kept = Buffer.from(idx.subarray(0, header + count * each));
      kept.writeUInt32BE(count, 4);
      fs.writeFileSync(path.join(to, file), zlib.gzipSync(kept));
    }
  const test = s.testImages === undefined ? 'its test set' : `its first ${s.testImages.toLocaleString('en-US')} test images`;
  console.log(`${s.name}: the first ${s.trainImages.toLocaleString('en-US')} training images of ${from} and ${test} in ${to}`);
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
  data     the setting's Fashion-MNIST files as it reads them into --to DIR: its first --train-images
           training images and its test images (to carry them to a machine without the dataset)
  peer     the dense setting on one worker beside PyTorch: the first 10 losses from the same weights
           and batches, then full runs over --seeds

Options:
  --configs LIST   run: of the setting's runs (low, high, accordion, equal, …; default low,high,accordion, or
                   every run of a setting without them, as resnet18-precision)
  --seeds LIST     default 1,2,3
  --quick          a smoke run on ${QUICK.trainImages} images for ${QUICK.epochs} epochs, tested on ${QUICK.testImages}; its figures are not quoted
  --width W, --train-images N, --epochs E, --batch-size B   replace the setting's values (to choose them)
  --device D       where every worker trains (default cpu); on a GPU the 4 workers share it over Gloo
  --in-process     run: a run's 4 workers in one process (accordion train --in-process), not 4; the
                   same checkpoints bit for bit, and on a GPU one CUDA context instead of four
  --dir DIR        run directories (default runs/reproduce)
  --data DIR       Fashion-MNIST (default ${FASHION_MNIST})
  --results DIR    where report and peer write their files (default bench/results)
  --to DIR         data: where the files go`;

async function main() {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
      configs: { type: 'string' },
      seeds: { type: 'string', default: '1,2,3' },
      quick: { type: 'boolean', default: false },
      width: { type: 'string' },
      'train-images': { type: 'string' },
      epochs: { type: 'string' },
      'batch-size': { type: 'string' },
      device: { type: 'string' },
      'in-process': { type: 'boolean', default: false },
      dir: { type: 'string', default: path.join(ROOT, 'runs', 'reproduce') },
      data: { type: 'string', default: FASHION_MNIST },
      results: { type: 'string', default: path.join(ROOT, 'bench', 'results') },
      to: { type: 'string' },
      help: { type: 'boolean', short: 'h', default: false },
    },
  });
  const [command, name] = positionals;
  if (values.help || !command) return console.log(USAGE);
  if (command === 'list') {
    for (const name of Object.keys(SETTINGS)) {
      const s = resolveSetting(name);
      console.log(`${name}: ${s.model} (${s.tag}), ${describeLevels(s)}; runs ${Object.keys(configsOf(s)).join(', ')}; paper: ${s.paper.source}`);
    }
    return;
  }
  const number = (key) => (values[key] === undefined ? undefined : Number(values[key]));
  const s = resolveSetting(name, { quick: values.quick, width: number('width'), trainImages: number('train-images'), epochs: number('epochs'), batchSize: number('batch-size'), device: values.device });
  const known = Object.keys(configsOf(s));
  // By default the comparison the setting is for: static low, static high and Accordion, or every run of a setting without them.
  const main = ['low', 'high', 'accordion'];
  const configs = values.configs?.split(',') ?? (main.every((c) => known.includes(c)) ? main : known);
  for (const c of configs) if (!known.includes(c)) throw new Error(`--configs: unknown config '${c}' for ${s.name} (known: ${known.join(', ')})`);
  const o = {
    configs, seeds: values.seeds.split(',').map(Number), dir: path.resolve(values.dir), data: values.data, results: path.resolve(values.results),
    inProcess: values['in-process'],
  };
  if (command === 'run') await runSetting(s, o);
  else if (command === 'report') await writeSettingReport(s, o);
  else if (command === 'check') await checkEqualLevels(s, o);
  else if (command === 'peer') await runPeerComparison(s, o);
  else if (command === 'data') writeSettingData(s, o.data, values.to);
  else throw new Error(`unknown command '${command}'\n${USAGE}`);
}

if (process.argv[1] && path.resolve(process.argv[1]) === path.resolve(new URL(import.meta.url).pathname))
  main().catch((err) => {
    console.error(`reproduce.js: ${err.message}`);
    process.exit(1);
  });
