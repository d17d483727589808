#!/usr/bin/env node
// One training step of the word-level LSTM language model (2 layers, 650 units, tied decoder,
// dropout 0.4, WikiText-2's 33,278 words, BPTT 35, batch 20), engine against PyTorch on the same
// machine and thread count. A step is forward over the (35, 20) window, cross-entropy over the
// vocabulary, backward, global-norm clip 0.25 and SGD (lr 2.5, momentum 0.9 Nesterov); the hidden
// state is carried into the next window. Forward-only windows (evaluation mode, loss included) are
// timed as well on both sides, so the gap can be split into forward and backward + update.
// With --device cuda both train on GPU 0, fp32 with TF32 off on both sides: the engine's own ops
// with cuBLAS, PyTorch's nn.LSTM on cuDNN.
//
//   node bench/lstm.js [--threads N] [--steps 5] [--warmup 2] [--rounds 2] [--vocab 33278] [--device cpu|cuda]
//                      [--omp-wait-policy passive|active|inherit] [--quick] [--json FILE] [--markdown]
import { join } from 'node:path';
import { Mulberry32 } from '../lib/base/random.js';
import { defaultThreads, exitUnlessDevice, fastest, fmt, formatTable, loadEngine, machineInfo, median, pct, positiveInt, probeTorch, round3, noteBusyRounds, reportHead, runMain, runTorchPeer, spread, suiteOptions, timeSteps, writeReport, ORACLES } from './common.js';

const TORCH_LSTM = join(ORACLES, 'torch_lstm.py');

const USAGE = `usage: node bench/lstm.js [options]
  --threads N    native threads for both peers (default OMP_NUM_THREADS or 2)
  --steps N      timed training steps per run, and as many timed forward-only windows (default 5)
  --warmup N     untimed training steps before them (default 2)
  --rounds N     runs of each peer, interleaved (default 2)
  --vocab N      vocabulary size (default 33278, WikiText-2)
  --hidden N     embedding = hidden size (default 650)
  --layers N     LSTM layers (default 2)
  --bptt N       window length (default 35)
  --batch N      streams per window (default 20)
  --device D     where both peers train: cpu (default) or cuda (GPU 0; PyTorch's LSTM runs on cuDNN)
  --precision P  fp32 (default) or bf16: the engine's --precision, and PyTorch under autocast to bfloat16
  --omp-wait-policy P
                 OMP_WAIT_POLICY for both peers: passive (default), active, or inherit (leave the
                 environment's); libgomp's spinning threads starve PyTorch's OpenBLAS threads here
  --quick        1 warmup + 2 timed steps, 1 round: a smoke run, not figures to quote
  --json FILE    also write every timing and the machine facts to FILE
  --markdown     print the result table as Markdown (for BENCHMARKS.md)`;

const OPTIONS = {
  threads: { type: 'string' },
  steps: { type: 'string' },
  warmup: { type: 'string' },
  rounds: { type: 'string' },
  vocab: { type: 'string', default: '33278' },
  hidden: { type: 'string', default: '650' },
  layers: { type: 'string', default: '2' },
  bptt: { type: 'string', default: '35' },
  batch: { type: 'string', default: '20' },
  device: { type: 'string', default: 'cpu' },
  precision: { type: 'string', default: 'fp32' },
  'omp-wait-policy': { type: 'string', default: 'passive' },
  quick: { type: 'boolean', default: false },
};

function options(values) {
  if (!['cpu', 'cuda'].includes(values.device)) throw new Error(`--device must be cpu or cuda, got '${values.device}'`);
  if (!['fp32', 'bf16'].includes(values.precision)) throw new Error(`--precision must be fp32 or bf16, got '${values.precision}'`);
  const waitPolicy = values['omp-wait-policy'];
  if (!['passive', 'active', 'inherit'].includes(waitPolicy))
    throw new Error(`--omp-wait-policy must be passive, active or inherit, got '${waitPolicy}'`);
  // Explicit counts win over --quick, so a quick run can still be stretched one way.
  const pick = (name, quick, normal) => values[name] ?? (values.quick ? quick : normal);
  return {
    threads: values.threads === undefined ? defaultThreads() : positiveInt('--threads', values.threads),
    steps: positiveInt('--steps', pick('steps', '2', '5')),
    warmup: positiveInt('--warmup', pick('warmup', '1', '2'), { min: 0 }),
    rounds: positiveInt('--rounds', pick('rounds', '1', '2')),
    vocab: positiveInt('--vocab', values.vocab, { min: 2 }),
    hidden: positiveInt('--hidden', values.hidden),
    layers: positiveInt('--layers', values.layers),
    bptt: positiveInt('--bptt', values.bptt),
    batch: positiveInt('--batch', values.batch),
    device: values.device,
    precision: values.precision,
    waitPolicy,
    clip: 0.25,
    dropout: 0.4,
    learningRate: 2.5,
    quick: values.quick,
    json: values.json,
    markdown: values.markdown,
  };
}

/**
 * V·(H + 1) for the tied embedding/decoder and the decoder bias, plus per layer two 4H×H matrices and
 * two 4H biases (every layer's input is H wide because embedding = hidden).
 */
function expectedParameters({ vocab, hidden, layers }) {
  return vocab * (hidden + 1) + layers * (8 * hidden * hidden + 8 * hidden);
}

// A random token stream batchified like the trainer does (time-major rows of `batch` columns), so
// every step reads a fresh window and the embedding rows it touches change as in real training.
// Fixed seed: the same windows in every round and run.
function randomStream(rows, columns, vocab, seed) {
  const words = new Mulberry32(seed);
  const tokens = new Int32Array(rows * columns);
  for (let i = 0; i < tokens.length; i++) tokens[i] = words.u32() % vocab;
  return tokens;
}

async function timeOurs(lib, opts, stream, windows) {
  const { Model } = lib;
  const model = await Model.create({
    architecture: 'lstm', classes: opts.vocab, hidden: opts.hidden, layers: opts.layers, dropout: opts.dropout,
    seed: 0, learningRate: opts.learningRate, momentum: 0.9, nesterov: true, weightDecay: 0, clipNorm: opts.clip, device: opts.device,
    precision: opts.precision,
  });
  const perWindow = opts.bptt * opts.batch;
  // Views, not copies, as the trainer passes them: targets are the inputs one row later. Made before
  // the timing starts.
  const views = Array.from({ length: windows }, (_, i) => {
    const start = i * perWindow;
    return {
      tokens: stream.subarray(start, start + perWindow),
      targets: stream.subarray(start + opts.batch, start + opts.batch + perWindow),
      steps: opts.bptt,
      batch: opts.batch,
    };
  });
  const window = (i) => views[i % windows];
  try {
    const parameters = model.parameterCount();
    const { ms: times, results } = await timeSteps(opts.warmup, opts.steps, (i) => model.trainStep(window(i)), { afterWarmup: () => model.memoryStats({ resetPeak: true }) });
    // computeSeconds covers forward, backward, clip and the SGD update; compressionSeconds the
    // (identity) gradient exchange's NaN/Inf check. What is left is the addon's call overhead.
    const computeMs = results.map((r) => r.computeSeconds * 1e3);
    const reduceMs = results.map((r) => r.compressionSeconds * 1e3);
    const last = results.at(-1);
    if (!Number.isFinite(last.loss)) console.warn(`  warning: LSTM loss is ${last.loss}`);
    // On a GPU a step returns once its loss and gradient norm are read; its update runs on while
    // the next step is prepared, so each timed step also pays for the update before it.
    const { ms: forward } = await timeSteps(0, opts.steps, (i) => model.evaluate(window(opts.warmup + i)));
    const { peak } = await model.memoryStats();
    return {
      parameters,
      loss: last.loss,
      peak_memory_bytes: peak,
      step_ms_median: median(times),
      step_ms_min: Math.min(...times),
      step_ms_all: times,
      compute_ms_median: median(computeMs),
      reduce_ms_median: median(reduceMs),
      forward_ms_median: median(forward),
      forward_ms_all: forward,
    };
  } finally {
    await model.dispose();
  }
}

function runTorchLstm(opts) {
  const args = ['--vocab', opts.vocab, '--hidden', opts.hidden, '--layers', opts.layers, '--dropout', opts.dropout,
    '--bptt', opts.bptt, '--batch', opts.batch, '--clip', opts.clip, '--lr', opts.learningRate, '--threads', opts.threads,
    '--warmup', opts.warmup, '--steps', opts.steps, '--device', opts.device, ...(opts.precision === 'bf16' ? ['--autocast'] : [])];
  return runTorchPeer(TORCH_LSTM, args, opts.threads);
}

async function main() {
  const started = new Date();
  const opts = suiteOptions('bench/lstm.js', USAGE, OPTIONS, options);
  // OpenMP sizes its pool from the environment when the addon loads, hence the late import.
  process.env.OMP_NUM_THREADS = String(opts.threads);
  // Debian's torch runs its element-wise ops on libgomp threads and its matrix products on
  // OpenBLAS's own pthreads. libgomp's threads spin for a while after every parallel region, and
  // the LSTM's hundreds of small per-time-step ops leave them spinning on the cores OpenBLAS needs:
  // with the default policy a PyTorch step took about twice as long on 2 cores (2.0 s, against
  // 1.0 s passive). Passive is therefore PyTorch's best setting here; the engine's time does not
  // depend on it, and both processes get the same value so neither is favoured.
  if (opts.waitPolicy !== 'inherit') process.env.OMP_WAIT_POLICY = opts.waitPolicy;
  const lib = await loadEngine('bench/lstm.js');
  lib.setThreads(opts.threads);
  exitUnlessDevice('bench/lstm.js', opts.device, lib.requireDevice);

  const machine = machineInfo(lib.buildInfo());
  const torch = probeTorch();
  const tokens = opts.bptt * opts.batch;
  console.log(`lstm bench: ${machine.cpu}, ${machine.cores} cores, Node ${machine.node}, ` +
    `OpenBLAS ${machine.openblas?.split(' ')[1] ?? '?'}, torch ${torch.ok ? torch.version : 'unavailable'}`);
  console.log(`device ${opts.device}${opts.device !== 'cpu' ? ` (${lib.deviceQuery().devices[0].name})` : ''}, ${opts.precision}${opts.precision === 'bf16' ? ' (PyTorch under autocast)' : ''}`);
  console.log(`LSTM ${opts.layers}×${opts.hidden}, vocabulary ${opts.vocab}, window ${opts.bptt}×${opts.batch} ` +
    `(${tokens} tokens), ${opts.threads} threads, ${opts.warmup} warmup + ${opts.steps} timed steps, ` +
    `${opts.rounds} round(s), OMP_WAIT_POLICY ${process.env.OMP_WAIT_POLICY ?? 'unset'}` +
    `${opts.quick ? ' (quick: smoke figures only)' : ''}`);
  if (!torch.ok) console.log(`note: PyTorch column skipped: ${torch.reason}`);

  const windows = opts.warmup + opts.steps;
  const stream = randomStream(windows * opts.bptt + 1, opts.batch, opts.vocab, 12345);
  const ours = [];
  const peer = [];
  const torchErrors = [];

  async function runPeer(round) {
    try {
      const rec = await runTorchLstm(opts);
      peer.push(rec);
      return `PyTorch ${fmt(rec.step_ms_median)} ms (forward ${fmt(rec.forward_ms_median)})`;
    } catch (err) {
      torchErrors.push(err.message);
      return `PyTorch failed in round ${round}: ${err.message}`;
    }
  }
  async function runOurs() {
    const rec = await timeOurs(lib, opts, stream, windows);
    ours.push(rec);
    return `ours ${fmt(rec.step_ms_median)} ms (forward ${fmt(rec.forward_ms_median)})`;
  }

  // The peers alternate, and which goes first alternates too, so a busy spell on the shared
  // machine and any warm-cache advantage of going second fall on both.
  for (let round = 1; round <= opts.rounds; round++) {
    const parts = [];
    const oursFirst = round % 2 === 1;
    if (oursFirst || !torch.ok) parts.push(await runOurs());
    if (torch.ok) parts.push(await runPeer(round));
    if (!oursFirst && torch.ok) parts.push(await runOurs());
    console.log(`round ${round}: ${parts.join(', ')}`);
  }

  const phase = (name, pick) => {
    const o = ours.map(pick);
    const p = peer.map(pick).filter(Number.isFinite);
    const oMs = median(o);
    const pMs = median(p);
    return {
      phase: name,
      ours_ms: oMs,
      torch_ms: pMs,
      ratio: oMs / pMs,
      tokens_per_s: tokens * 1000 / oMs,
      torch_tokens_per_s: tokens * 1000 / pMs,
      // Noise on a shared machine only ever adds time, so the fastest rounds are a second,
      // less disturbed estimate to set beside the median.
      best_ratio: fastest(o) / fastest(p),
      ours_spread_pct: spread(o),
      torch_spread_pct: spread(p),
      ours_rounds: o,
      torch_rounds: p,
    };
  };
  const rows = [
    phase('train step', (r) => r.step_ms_median),
    phase('forward only (eval)', (r) => r.forward_ms_median),
    // Derived per round, not measured: the training step's forward also draws dropout masks, so
    // this slightly overstates backward + clip + update on both sides alike.
    { ...phase('rest: train − forward', (r) => r.step_ms_median - r.forward_ms_median), derived: true },
  ];

  const columns = [
    { key: 'phase', title: 'phase', align: 'left' },
    { key: 'ours', title: 'ours ms' },
    { key: 'torch', title: 'PyTorch ms' },
    { key: 'ratio', title: 'ours/PyTorch' },
    { key: 'tps', title: 'ours tokens/s' },
    { key: 'ttps', title: 'PyTorch tokens/s' },
    { key: 'best', title: 'best-round ratio' },
    { key: 'spread', title: 'round spread ours/PyTorch' },
  ];
  const cells = rows.map((r) => ({
    phase: r.phase,
    ours: fmt(r.ours_ms), torch: fmt(r.torch_ms), ratio: fmt(r.ratio, 2),
    // A rate only means something for work that processes the window on its own.
    tps: r.derived ? '' : fmt(r.tokens_per_s, 0), ttps: r.derived ? '' : fmt(r.torch_tokens_per_s, 0),
    best: fmt(r.best_ratio, 2),
    spread: `${pct(r.ours_spread_pct)} / ${pct(r.torch_spread_pct)}`,
  }));
  console.log('');
  console.log(formatTable(columns, cells, { markdown: opts.markdown }));
  console.log(`(ms: median over rounds of each run's median; ${tokens} tokens per window; ratio < 1 means the engine is faster)`);
  if (opts.device !== 'cpu') {
    const peak = (list) => Math.max(0, ...list.map((r) => r.peak_memory_bytes ?? 0)) / 2 ** 20;
    console.log(`(peak GPU memory: ours ${fmt(peak(ours), 0)} MiB, PyTorch ${fmt(peak(peer), 0)} MiB)`);
  }
  console.log('(best-round ratio: fastest round of ours / fastest round of PyTorch; ' +
    'round spread: (max − min) / median of the rounds\' medians)');
  console.log(`(ours, inside the step: compute ${fmt(median(ours.map((r) => r.compute_ms_median)))} ms ` +
    `(forward, backward, clip, update), gradient check ${fmt(median(ours.map((r) => r.reduce_ms_median)), 2)} ms)`);

  // The ratio only means something if both peers train the same model.
  const expected = expectedParameters(opts);
  const oursCount = ours[0].parameters;
  const torchCounts = [...new Set(peer.map((r) => r.parameters))];
  const countsAgree = oursCount === expected && torchCounts.every((c) => c === expected);
  console.log(`parameters: ours ${oursCount.toLocaleString('en-US')}, PyTorch ` +
    `${torchCounts.length ? torchCounts.map((c) => c.toLocaleString('en-US')).join('/') : 'n/a'}, ` +
    `expected V·(H+1) + L·(8H² + 8H) = ${expected.toLocaleString('en-US')}: ${countsAgree ? 'identical' : 'MISMATCH'}`);

  if (!torch.ok) console.log(`note: no PyTorch figures: ${torch.reason}`);
  noteBusyRounds('', [rows[0].ours_spread_pct, rows[0].torch_spread_pct]);
  if (torchErrors.length) console.log(`note: PyTorch failed in ${torchErrors.length} round(s)`);

  if (opts.json) {
    const report = {
      ...reportHead('lstm', started, opts, machine, torch),
      parameters: { ours: oursCount, torch: torchCounts, expected, identical: countsAgree },
      results: rows,
      ours_rounds: ours.map((r) => ({
        ...r, step_ms_all: r.step_ms_all.map(round3), forward_ms_all: r.forward_ms_all.map(round3),
      })),
      torch_rounds: peer,
      torch_errors: torchErrors,
    };
    writeReport(opts.json, report);
  }
  if (!countsAgree) {
    console.error('bench/lstm.js: the two models differ in size, so their times are not comparable');
    return 1;
  }
  return 0;
}

runMain('bench/lstm.js', main);
