#!/usr/bin/env node
// Training-step time of the engine against PyTorch on the same machine, batch and thread count,
// on the CPU or on a GPU (--device cuda: fp32 with TF32 off on both sides, with each side's peak
// GPU memory).
//
//   node bench/step.js [--models resnet18,vgg19bn] [--batch 32] [--threads N] [--steps 10]
//                      [--warmup 3] [--rounds 2] [--device cpu|cuda] [--precision fp32|bf16]
//                      [--memory-format auto|channels-last|channels-first] [--torch-channels-last] [--json out.json]
// With --precision bf16 the engine computes in bf16 and PyTorch under torch.autocast(bfloat16).
import { Mulberry32 } from '../lib/base/random.js';
import {
  defaultThreads, exitUnlessDevice, fastest, fmt, formatTable, loadEngine, machineInfo, median, pct, positiveInt, probeTorch, round3, runMain,
  noteBusyRounds, reportHead, runTorchStep, spread, suiteOptions, timeSteps, writeReport,
} from './common.js';

const USAGE = `usage: node bench/step.js [options]
  --models LIST          comma-separated architectures (default resnet18,vgg19bn)
  --batch N              batch size (default 32)
  --threads N            native threads for both peers (default OMP_NUM_THREADS or 2)
  --steps N              timed steps per run (default 10)
  --warmup N             untimed steps before them (default 3)
  --rounds N             runs of each peer, interleaved (default 2)
  --classes N            output classes (default 10)
  --device cpu|cuda      where both peers train (default cpu; cuda means GPU 0)
  --precision fp32|bf16  the engine's --precision; bf16 runs PyTorch under autocast to bfloat16 (default fp32)
  --memory-format F      the engine's GPU activations: auto (channels-last in bf16), channels-last or channels-first (default auto)
  --torch-channels-last  run the PyTorch peer in channels-last memory format
  --json FILE            also write every timing and the machine facts to FILE
  --markdown             print the result table as Markdown (for BENCHMARKS.md)`;

const OPTIONS = {
  models: { type: 'string', default: 'resnet18,vgg19bn' },
  batch: { type: 'string', default: '32' },
  threads: { type: 'string' },
  steps: { type: 'string', default: '10' },
  warmup: { type: 'string', default: '3' },
  rounds: { type: 'string', default: '2' },
  classes: { type: 'string', default: '10' },
  device: { type: 'string', default: 'cpu' },
  'memory-format': { type: 'string', default: 'auto' },
  'torch-channels-last': { type: 'boolean', default: false },
  precision: { type: 'string', default: 'fp32' },
};

function options(values) {
  return {
    models: values.models.split(',').map((s) => s.trim()).filter(Boolean),
    batch: positiveInt('--batch', values.batch),
    threads: values.threads === undefined ? defaultThreads() : positiveInt('--threads', values.threads),
    steps: positiveInt('--steps', values.steps),
    warmup: positiveInt('--warmup', values.warmup, { min: 0 }),
    rounds: positiveInt('--rounds', values.rounds),
    classes: positiveInt('--classes', values.classes, { min: 2 }),
    device: ['cpu', 'cuda'].includes(values.device) ? values.device : (() => { throw new Error(`--device must be cpu or cuda, got '${values.device}'`); })(),
    memoryFormat: ['auto', 'channels-last', 'channels-first'].includes(values['memory-format']) ? values['memory-format'] : (() => { throw new Error(`--memory-format must be auto, channels-last or channels-first, got '${values['memory-format']}'`); })(),
    channelsLast: values['torch-channels-last'],
    precision: ['fp32', 'bf16'].includes(values.precision) ? values.precision : (() => { throw new Error(`--precision must be fp32 or bf16, got '${values.precision}'`); })(),
    json: values.json,
    markdown: values.markdown,
  };
}

// A fixed seed keeps the input identical between rounds and runs, so differences are the machine's.
function randomDataset(count, classes, seed) {
  const words = new Mulberry32(seed);
  const images = new Uint8Array(count * 3 * 32 * 32);
  for (let i = 0; i < images.length; i++) images[i] = words.u32() & 0xff;
  const labels = new Int32Array(count);
  for (let i = 0; i < count; i++) labels[i] = words.u32() % classes;
  return { images, labels };
}

async function timeOurs(lib, opts, architecture, data) {
  const { Model, binding } = lib;
  // The same hyper-parameters as torch_step.py, so the update does the same arithmetic.
  const model = await Model.create({
    architecture, classes: opts.classes, seed: 0, device: opts.device, precision: opts.precision, memoryFormat: opts.memoryFormat,
    learningRate: 0.05, momentum: 0.9, weightDecay: 1e-4, nesterov: true,
  });
  try {
    const batcher = new binding.Batcher(data.images, data.labels, opts.classes, {
      batchSize: opts.batch, shuffle: false, augment: false, seed: 0,
      mean: [0.4914, 0.4822, 0.4465], std: [0.2470, 0.2435, 0.2616], device: opts.device,
    });
    batcher.startEpoch(0);
    const { ms: times, results } = await timeSteps(opts.warmup, opts.steps, async (i) => {
      const result = await model.native.trainStep(batcher);
      if (result === null) throw new Error(`the batcher ran out after ${i} batches`);
      return result;
    }, { afterWarmup: () => model.memoryStats({ resetPeak: true }) }); // the peak of the timed steps, as PyTorch's
    const last = results.at(-1);
    if (!Number.isFinite(last.loss)) console.warn(`  warning: ${architecture} loss is ${last.loss}`);
    // A step returns once its loss is read; its update runs on while the next step is prepared, so
    // each timed step also pays for the update before it.
    const { peak } = await model.memoryStats();
    return { step_ms_median: median(times), step_ms_min: Math.min(...times), step_ms_all: times, loss: last.loss, peak_memory_bytes: peak };
  } finally {
    await model.dispose();
  }
}


async function main() {
  const started = new Date();
  const opts = suiteOptions('bench/step.js', USAGE, OPTIONS, options);
  // OpenMP sizes its pool from the environment when the addon loads, hence the late import;
  // the child PyTorch process inherits the same value.
  process.env.OMP_NUM_THREADS = String(opts.threads);
  const lib = { ...(await loadEngine('bench/step.js')), binding: (await import('../lib/native/binding.js')).binding };
  const unknown = opts.models.filter((m) => !lib.ARCHITECTURES.includes(m));
  if (unknown.length) {
    console.error(`bench/step.js: unknown model(s) ${unknown.join(', ')} (choose from ${lib.ARCHITECTURES.join(', ')})`);
    process.exit(2);
  }
  lib.setThreads(opts.threads);

  const machine = machineInfo(lib.buildInfo());
  const torch = probeTorch();
  console.log(`step bench: ${machine.cpu}, ${machine.cores} cores, Node ${machine.node}, ` +
    `oneDNN ${machine.onednn}, torch ${torch.ok ? torch.version : 'unavailable'}`);
  exitUnlessDevice('bench/step.js', opts.device, lib.requireDevice);
  console.log(`device ${opts.device}${opts.device !== 'cpu' ? ` (${lib.deviceQuery().devices[0].name})` : ''}, ` +
    `batch ${opts.batch}, ${opts.threads} threads, ${opts.warmup} warmup + ${opts.steps} timed steps, ` +
    `${opts.rounds} round(s), ${opts.precision}${opts.precision === 'bf16' ? ` (ours ${lib.buildInfo().cpu.bf16} on ${lib.buildInfo().cpu.isa}, PyTorch autocast)` : ''}` +
    `${opts.channelsLast ? ', torch channels-last' : ''}`);
  if (!torch.ok) console.log(`note: PyTorch column skipped: ${torch.reason}`);

  const data = randomDataset((opts.warmup + opts.steps) * opts.batch, opts.classes, 12345);
  const runs = Object.fromEntries(opts.models.map((m) => [m, { ours: [], torch: [], torchErrors: [] }]));

  // Alternating the peers inside each round spreads the shared machine's slow spells over both.
  for (let round = 1; round <= opts.rounds; round++) {
    for (const model of opts.models) {
      const ours = await timeOurs(lib, opts, model, data);
      runs[model].ours.push(ours);
      let line = `round ${round} ${model}: ours ${fmt(ours.step_ms_median)} ms`;
      if (torch.ok) {
        try {
          const peer = await runTorchStep({
            model, batch: opts.batch, threads: opts.threads, warmup: opts.warmup,
            steps: opts.steps, classes: opts.classes, channelsLast: opts.channelsLast, device: opts.device, autocast: opts.precision === 'bf16',
          });
          runs[model].torch.push(peer);
          line += `, PyTorch ${fmt(peer.step_ms_median)} ms`;
        } catch (err) {
          runs[model].torchErrors.push(err.message);
          line += `, PyTorch failed: ${err.message}`;
        }
      }
      console.log(line);
    }
  }

  const rows = opts.models.map((model) => {
    const r = runs[model];
    const ours = median(r.ours.map((x) => x.step_ms_median));
    const peer = median(r.torch.map((x) => x.step_ms_median));
    // Spread between rounds; a large one means the machine was busy and the ratio is soft.
    return {
      model, batch: opts.batch, threads: opts.threads,
      ours_ms: ours, torch_ms: peer, ratio: ours / peer, samples_per_s: opts.batch * 1000 / ours,
      // Noise on a shared machine only ever adds time, so the fastest rounds are a second,
      // less disturbed estimate to set beside the median.
      best_ratio: fastest(r.ours.map((x) => x.step_ms_median)) / fastest(r.torch.map((x) => x.step_ms_median)),
      ours_spread_pct: spread(r.ours.map((x) => x.step_ms_median)),
      torch_spread_pct: spread(r.torch.map((x) => x.step_ms_median)),
      // Peak GPU memory held by each side's tensors (ours: the model's pool; PyTorch: max_memory_allocated).
      ours_peak_mib: Math.max(...r.ours.map((x) => x.peak_memory_bytes ?? 0)) / 2 ** 20,
      torch_peak_mib: Math.max(...r.torch.map((x) => x.peak_memory_bytes ?? 0), 0) / 2 ** 20,
    };
  });

  const columns = [
    { key: 'model', title: 'model', align: 'left' },
    { key: 'batch', title: 'batch' },
    { key: 'threads', title: 'threads' },
    { key: 'ours', title: 'ours ms' },
    { key: 'torch', title: 'PyTorch ms' },
    { key: 'ratio', title: 'ours/PyTorch' },
    { key: 'sps', title: 'samples/s' },
    { key: 'best', title: 'best-round ratio' },
    { key: 'spread', title: 'round spread ours/PyTorch' },
    ...(opts.device === 'cpu' ? [] : [{ key: 'memory', title: 'peak GPU MiB ours/PyTorch' }]),
  ];
  const cells = rows.map((r) => ({
    model: r.model, batch: r.batch, threads: r.threads,
    ours: fmt(r.ours_ms), torch: fmt(r.torch_ms), ratio: fmt(r.ratio, 2), sps: fmt(r.samples_per_s),
    best: fmt(r.best_ratio, 2),
    spread: `${pct(r.ours_spread_pct)} / ${pct(r.torch_spread_pct)}`,
    memory: `${fmt(r.ours_peak_mib, 0)} / ${fmt(r.torch_peak_mib, 0)}`,
  }));
  console.log('');
  console.log(formatTable(columns, cells, { markdown: opts.markdown }));
  console.log('(ms: median over rounds of each run\'s median step; ratio < 1 means the engine is faster)');
  console.log('(best-round ratio: fastest round of ours / fastest round of PyTorch; ' +
    'round spread: (max - min) / median of the rounds\' medians)');
  if (!torch.ok) console.log(`note: no PyTorch figures: ${torch.reason}`);
  for (const r of rows) noteBusyRounds(`${r.model} `, [r.ours_spread_pct, r.torch_spread_pct]);
  for (const model of opts.models) {
    if (runs[model].torchErrors.length) console.log(`note: PyTorch ${model} failed in ${runs[model].torchErrors.length} round(s)`);
  }

  if (opts.json) {
    const report = {
      ...reportHead('step', started, opts, machine, torch),
      results: rows.map((r) => ({
        ...r,
        ours_rounds: runs[r.model].ours.map((x) => ({ ...x, step_ms_all: x.step_ms_all.map(round3) })),
        torch_rounds: runs[r.model].torch,
        torch_errors: runs[r.model].torchErrors,
      })),
    };
    writeReport(opts.json, report);
  }
}

runMain('bench/step.js', main);
