#!/usr/bin/env node
// What compression buys on a slow network: a model trained over 2 simulated hosts (`accordion
// cluster`: a network namespace each, egress shaped with tc) with each exchange, at each bandwidth.
// By default ResNet-18 on the synthetic data with dense, PowerSGD rank 2 and rank 1, PowerSGD with
// Accordion, TopK 10% and TopK with Accordion; `--model lstm --text FILE` trains the LSTM language
// model on a plain text file instead (perplexity in place of accuracy). Per run: seconds per step
// (compute and communication apart), wall-clock seconds to a test accuracy (or perplexity), the
// floats accounting, and the bytes on the wire against what the accounting and the collectives' algorithms predict.
// Needs root (CAP_NET_ADMIN). Runs take minutes each; finished ones are kept in <out>/results.jsonl
// and not run again, so an interrupted grid goes on where it stopped (--fresh starts over).
//
//   sudo node bench/cluster.js [--bandwidths 10gbit,1gbit,100mbit | --schedule T:RATE,…] [--configs dense,powersgd-r2,…]
//        [--latency 1ms] [--target 0.5] [--model resnet18|lstm] [--text FILE] [--out DIR] [--fresh]
//        [--quick] [-- extra training options]
//
// Configs: dense, powersgd-rN (static rank N), topk-P (static ratio P%), and powersgd- or topk-
// followed by accordion (Accordion's two levels), auto (levels chosen under an error budget, costed
// in floats), auto-seconds (costed in seconds over the link training measures, planned again when it
// moves) or auto-once (costed in seconds over the link measured at the start, planned at the checks
// only); any of them followed by -bf16 or -fp16 sends its values in 16 bits (--comm-dtype).
// `--schedule 0s:1gbit,90s:100mbit,270s:1gbit` runs every config once over a link that changes so
// (accordion cluster's schedule) instead of at each of --bandwidths. The peers: ddp,
// ddp-fp16 and ddp-powersgd-rN train ResNet-18 with PyTorch DDP (test/oracles/torch_train.py: dense,
// its fp16 hook, its PowerSGD hook) over the same 2 shaped hosts, from the engine's initial weights on
// the same files with the same schedule (its milestones excepted: keep them beyond --epochs).
// Then `node lib/cli.js report <out>/100mbit/*` draws the engine's runs of one bandwidth against
// wall-clock time.
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { parseArgs } from 'node:util';
import { ROOT, ddpOnShapedHosts, fmt, formatTable, readPeerEpochs } from './common.js';
import { readMetrics } from '../lib/base/metrics.js';
import { compareWire, formatRate, parseBandwidth, parseBandwidthSchedule, readNetworkLog, topkExchange } from '../lib/cluster/cluster.js';
import { missingCapabilities } from '../lib/cluster/netns.js';
import { parseTrainArgs } from '../lib/cli/args.js';
import { resolveConfig } from '../lib/train/config.js';
import { loadImageDataset } from '../lib/data/datasets.js';
import { Model, writeSafetensors } from '../lib/index.js';

const DEFAULT_CONFIGS = ['dense', 'powersgd-r2', 'powersgd-r1', 'powersgd-accordion', 'topk-10', 'topk-accordion'];

/** The training options of a config name, or undefined for a name that is none. */
function configArgs(name) {
  const sent = /^(.+)-(bf16|fp16)$/.exec(name);
  if (sent && !peerArgs(name)) {
    const args = configArgs(sent[1]);
    return args && [...args, '--comm-dtype', sent[2]];
  }
  if (name === 'dense') return ['--compressor', 'none'];
  let m = /^powersgd-r(\d+)$/.exec(name);
  if (m) return ['--compressor', 'powersgd', '--accordion', 'off', '--rank', m[1]];
  m = /^topk-(\d+(?:\.\d+)?)$/.exec(name);
  if (m && Number(m[1]) > 0 && Number(m[1]) <= 100) return ['--compressor', 'topk', '--accordion', 'off', '--topk-ratio', String(Number(m[1]) / 100)];
  m = /^(powersgd|topk)-(accordion|auto|auto-seconds|auto-once)$/.exec(name);
  if (!m) return undefined;
  const adapt = {
    accordion: ['--accordion', 'on'],
    auto: ['--adapt', 'auto'],
    'auto-seconds': ['--adapt', 'auto', '--auto-cost', 'seconds'],
    'auto-once': ['--adapt', 'auto', '--auto-cost', 'seconds', '--replan-factor', '0'],
  };
  return ['--compressor', m[1], ...adapt[m[2]]];
}

/** A PyTorch DDP peer's options of test/oracles/torch_train.py, or undefined for a name that is none. */
function peerArgs(name) {
  if (name === 'ddp') return [];
  if (name === 'ddp-fp16') return ['--fp16'];
  const m = /^ddp-powersgd-r(\d+)$/.exec(name);
  return m ? ['--powersgd-rank', m[1]] : undefined;
}

const USAGE = `usage: sudo node bench/cluster.js [options] [-- extra training options]
  --bandwidths LIST  each host's outgoing rate, tc units (default 10gbit,1gbit,100mbit)
  --schedule S       instead, one link whose rate changes: T:RATE pairs, e.g. 0s:1gbit,90s:100mbit,270s:1gbit
  --configs LIST     dense, powersgd-rN, topk-P (percent), powersgd-accordion, topk-accordion,
                     powersgd-auto, topk-auto, each optionally -bf16 or -fp16; PyTorch DDP:
                     ddp, ddp-fp16, ddp-powersgd-rN (default ${DEFAULT_CONFIGS.join(',')})
  --latency TIME     delay on each host's egress (netem, which this project's machines lack; default 0ms)
  --target X         the test accuracy (a fraction; for the LSTM a perplexity) whose wall-clock
                     time is reported (default 0.5)
  --model NAME       resnet18 on the synthetic data (default) or lstm on --text FILE
  --out DIR          run directories and results.jsonl (default ${path.join(os.tmpdir(), 'accordion-cluster-bench')})
  --fresh            run every cell again, even those already in results.jsonl
  --quick            one epoch on 256 images: a smoke run of the harness, not figures to quote`;

const { values: opts, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    bandwidths: { type: 'string', default: '10gbit,1gbit,100mbit' },
    schedule: { type: 'string' },
    configs: { type: 'string', default: DEFAULT_CONFIGS.join(',') },
    model: { type: 'string', default: 'resnet18' },
    text: { type: 'string' },
    latency: { type: 'string', default: '0ms' },
    target: { type: 'string', default: '0.5' },
    out: { type: 'string', default: path.join(os.tmpdir(), 'accordion-cluster-bench') },
    fresh: { type: 'boolean', default: false },
    quick: { type: 'boolean', default: false },
    help: { type: 'boolean', default: false },
  },
});
if (opts.help) {
  console.log(USAGE);
  process.exit(0);
}
const fail = (message) => {
  console.error(`bench/cluster.js: ${message}`);
  process.exit(2);
};
// Each a value of accordion cluster's --bandwidth: a rate, or the one schedule.
const bandwidths = opts.schedule ? [opts.schedule] : opts.bandwidths.split(',').filter(Boolean);
bandwidths.forEach(parseBandwidthSchedule); // a bad rate is an error before anything runs
/** A bandwidth as a directory name and as a table's heading. */
const dirName = (bandwidth) => (opts.schedule ? 'schedule' : bandwidth);
const showBandwidth = (bandwidth) => parseBandwidthSchedule(bandwidth).map((c) => `${formatRate(c.bitsPerSecond)}${c.atSeconds ? ` from ${c.atSeconds} s` : ''}`).join(', ');
const configs = opts.configs.split(',').filter(Boolean);
for (const c of configs) if (!configArgs(c) && !peerArgs(c)) fail(`unknown config '${c}' (see --help)`);
const language = opts.model === 'lstm';
if (language && configs.some(peerArgs)) fail('the PyTorch DDP peers train ResNet-18 only');
if (opts.schedule && configs.some(peerArgs)) fail('the PyTorch DDP peers run on links of one rate (--bandwidths), not a --schedule');
if (!language && opts.model !== 'resnet18') fail(`--model: resnet18 or lstm, got '${opts.model}'`);
if (language && !opts.text) fail('--model lstm trains on a plain text file: give --text FILE');
const target = Number(opts.target);
if (language ? !(target > 1) : !(target > 0 && target < 1))
  fail(`--target: ${language ? 'a test perplexity above 1' : 'a test accuracy between 0 and 1'}, got '${opts.target}'`);
// The quality measure: test accuracy (higher is better) or test perplexity (lower is better).
const quality = language ? (e) => e.testPerplexity : (e) => e.testAccuracy;
const reaches = language ? (e) => e.testPerplexity <= target : (e) => e.testAccuracy >= target;
const missing = missingCapabilities();
if (missing.length) fail(`the simulated cluster needs root (this process lacks ${missing.join(' and ')}); run it with sudo`);

const quick = opts.quick ? ['--epochs', '1', ...(language ? [] : ['--synthetic-train', '256', '--synthetic-test', '128'])] : [];
const base = language ? ['--model', 'lstm', '--text', path.resolve(opts.text)] : ['--model', 'resnet18', '--dataset', 'synthetic'];
const training = [...base, '--threads', '1', '--checkpoint-every', '100', ...quick, ...positionals];
const cli = path.join(ROOT, 'lib', 'cli.js');
fs.mkdirSync(opts.out, { recursive: true });
const resultsFile = path.join(opts.out, 'results.jsonl');
const done = new Map(
  (!opts.fresh && fs.existsSync(resultsFile) ? fs.readFileSync(resultsFile, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l)) : []).map((r) => [r.key, r]),
);

const keyOf = (bandwidth, config) => JSON.stringify([bandwidth, opts.latency, config, training]);

/** One cell: the cluster command with its output to a log file; resolves to its exit code. */
function runCell(bandwidth, config, dir) {
  fs.rmSync(dir, { recursive: true, force: true });
  fs.mkdirSync(path.dirname(dir), { recursive: true });
  const log = fs.openSync(`${dir}.log`, 'w');
  const args = [cli, 'cluster', '--hosts', '2', '--bandwidth', bandwidth, '--latency', opts.latency, '--', ...training, ...configArgs(config), '--out', dir];
  return new Promise((resolve) => {
    const child = spawn(process.execPath, args, { stdio: ['ignore', log, log] });
    child.on('exit', (code, signal) => resolve(code ?? (signal ? 128 : 1)));
  });
}

/**
 * The PyTorch DDP peer on 2 hosts shaped as the engine's: the engine's configuration for the
 * recipe, its synthetic files and its initial weights; rank 0's epoch records go to <dir>/ddp.jsonl.
 */
async function runPeer(bandwidth, config, dir) {
  fs.rmSync(dir, { recursive: true, force: true });
  fs.mkdirSync(dir, { recursive: true });
  const c = resolveConfig({ ...parseTrainArgs(training), workers: 2 });
  if (c.milestones.some((m) => m + 2 < c.epochs)) fail(`the DDP peer has no milestones: keep --milestones beyond --epochs (got ${c.milestones.join(',')})`);
  const data = loadImageDataset('synthetic', c.dataDir, { train: c.syntheticTrain, test: c.syntheticTest, seed: c.seed }).dir;
  const init = path.join(dir, 'init.safetensors');
  const model = await Model.create({ architecture: 'resnet18', classes: 10, seed: c.seed });
  writeSafetensors(init, await model.stateDict());
  await model.dispose();
  const recipe = ['--data', data, '--state', init, '--epochs', String(c.epochs), '--batch', String(c.batchSize), '--lr', String(c.lr),
    '--warmup-epochs', String(c.warmupEpochs), '--seed', String(c.seed), ...peerArgs(config)];
  return ddpOnShapedHosts(2, '10.89.0.0/24', parseBandwidth(bandwidth), recipe, dir);
}

/** The figures of a PyTorch DDP peer's run: its epoch records, timed as the engine's. */
function summarisePeer(dir) {
  const epochs = readPeerEpochs(dir);
  const steps = epochs.reduce((a, e) => a + e.steps, 0);
  const reached = epochs.find(reaches);
  return {
    steps,
    stepSeconds: epochs.reduce((a, e) => a + e.seconds, 0) / steps,
    final: quality(epochs.at(-1)),
    best: Math.max(...epochs.map(quality)),
    secondsToTarget: reached ? reached.wallSeconds : null,
    epochsToTarget: reached ? reached.epoch : null,
    wallSeconds: epochs.at(-1).wallSeconds,
  };
}

/** The figures of a finished run directory. */
function summarise(dir) {
  if (fs.existsSync(path.join(dir, 'ddp.jsonl'))) return summarisePeer(dir);
  const events = readMetrics(path.join(dir, 'metrics.jsonl'));
  const start = events.find((e) => e.event === 'start');
  const epochs = events.filter((e) => e.event === 'epoch');
  const begun = Date.parse(start.time);
  let steps = 0, seconds = 0, compute = 0, communication = 0, compression = 0;
  for (const e of epochs) {
    steps += e.steps ?? (e.samples * start.workers) / e.batchSize; // logs from before records counted steps
    seconds += e.seconds;
    compute += e.computeSeconds;
    communication += e.communicationSeconds;
    compression += e.compressionSeconds;
  }
  const reached = epochs.find(reaches);
  // The wire: every epoch and host, payload bytes over the bytes the floats accounting predicts.
  const levelsOf = new Map(epochs.map((e) => [e.epoch, e.levels]));
  const exchange =
    start.compressor === 'topk'
      ? (r) => topkExchange(start.parameterShapes, levelsOf.get(r.epoch) ?? start.parameterShapes.map(() => start.topkRatio), start.workers, r.bytesSent ?? 4 * r.floatsSent, start.commDtype)
      : undefined;
  const wire = compareWire(readNetworkLog(dir), { exchange });
  const ratios = wire.flatMap((w) => [w.sentRatio, w.receivedRatio]);
  return {
    steps,
    stepSeconds: seconds / steps,
    computePerStep: compute / steps,
    communicationPerStep: communication / steps,
    compressionPerStep: compression / steps,
    final: quality(epochs.at(-1)),
    best: (language ? Math.min : Math.max)(...epochs.map(quality)),
    secondsToTarget: reached ? (Date.parse(reached.time) - begun) / 1000 : null,
    epochsToTarget: reached ? reached.epoch : null,
    wallSeconds: (Date.parse(epochs.at(-1).time) - begun) / 1000,
    floatsSent: epochs.at(-1).floatsSentTotal,
    wireBytesSent: wire.filter((w) => w.host === 0).reduce((a, w) => a + w.sentPayloadBytes, 0),
    wireRatioMin: Math.min(...ratios),
    wireRatioMax: Math.max(...ratios),
    wireOk: wire.every((w) => w.ok),
  };
}

console.log(`# ${language ? 'LSTM' : 'ResNet-18'}, 2 hosts × 1 worker (1 thread each), latency ${opts.latency}; training options: ${training.join(' ')}`);
for (const bandwidth of bandwidths) {
  for (const config of configs) {
    const key = keyOf(bandwidth, config);
    if (done.has(key)) continue;
    const dir = path.join(opts.out, dirName(bandwidth), config);
    const started = Date.now();
    process.stdout.write(`${dirName(bandwidth)} ${config} … `);
    const code = peerArgs(config) ? await runPeer(bandwidth, config, dir) : await runCell(bandwidth, config, dir);
    if (code !== 0) {
      // A failed cell (a kernel without netem for --latency, a crash) is looked at before the grid goes on.
      const log = peerArgs(config) ? path.join(dir, 'rank0.log') : `${dir}.log`;
      const tail = fs.readFileSync(log, 'utf8').trimEnd().split('\n').slice(-5).join('\n');
      console.log(`failed (exit ${code}); its output is in ${log}, ending:\n${tail}`);
      process.exit(1);
    }
    const result = { key, bandwidth, latency: opts.latency, config, target, ...summarise(dir), date: new Date().toISOString() };
    fs.appendFileSync(resultsFile, JSON.stringify(result) + '\n');
    done.set(key, result);
    console.log(`${fmt((Date.now() - started) / 1000, 0)} s`);
  }
}

// One table per bandwidth, in the order asked for.
for (const bandwidth of bandwidths) {
  // From the run directories where they are kept, so that another --target needs no new runs.
  const rows = configs
    .map((c) => done.get(keyOf(bandwidth, c)))
    .filter(Boolean)
    .map((r) => {
      const dir = path.join(opts.out, dirName(r.bandwidth), r.config);
      return fs.existsSync(path.join(dir, 'network.jsonl')) || fs.existsSync(path.join(dir, 'ddp.jsonl')) ? { ...r, ...summarise(dir) } : r;
    });
  if (!rows.length) continue;
  const dense = rows.find((r) => r.config === 'dense');
  const goal = language ? `test perplexity ${fmt(target, 1)}` : `${fmt(100 * target, 0)}% test accuracy`;
  console.log(`\n## ${showBandwidth(bandwidth)}, latency ${opts.latency}: time to ${goal}\n`);
  const columns = [
    { key: 'run', title: 'run', align: 'left' },
    { key: 'step', title: 's/step' },
    { key: 'compute', title: 'compute' },
    { key: 'comm', title: 'comm.' },
    { key: 'speedup', title: 'dense ÷ run (step)' },
    { key: 'toTarget', title: `s to ${language ? `ppl ${fmt(target, 1)}` : `${fmt(100 * target, 0)}%`}` },
    { key: 'epochs', title: 'epochs' },
    { key: 'final', title: language ? 'final ppl' : 'final acc.' },
    { key: 'floats', title: 'floats/worker' },
    { key: 'wire', title: 'wire/predicted' },
  ];
  const table = rows.map((r) => ({
    run: r.config,
    step: fmt(r.stepSeconds, 2),
    compute: r.computePerStep === undefined ? '' : fmt(r.computePerStep, 2),
    comm: r.communicationPerStep === undefined ? '' : fmt(r.communicationPerStep, 2),
    speedup: dense ? fmt(dense.stepSeconds / r.stepSeconds, 2) : 'n/a',
    toTarget: r.secondsToTarget === null ? 'not reached' : fmt(r.secondsToTarget, 0),
    epochs: r.epochsToTarget ?? '-',
    final: language ? fmt(r.final, 1) : `${fmt(100 * r.final, 1)}%`,
    floats: r.floatsSent === undefined ? '' : `${fmt(r.floatsSent / 1e6, 1)}M`,
    wire: r.wireRatioMin === undefined ? '' : `${r.wireRatioMin.toFixed(3)}–${r.wireRatioMax.toFixed(3)}${r.wireOk ? '' : ' (off by > 10%)'}`,
  }));
  console.log(formatTable(columns, table, { markdown: true }));
}
console.log(`\nresults: ${resultsFile}; curves: node lib/cli.js report ${path.join(opts.out, dirName(bandwidths.at(-1)))}/*`);
