#!/usr/bin/env node
// Compression kernels, engine vs PyTorch, one worker, no communication:
//   - PowerSGD round (error feedback, P = M·Q, Gram-Schmidt, Q = Mᵀ·P̂, P̂·Qᵀ, new error) for every
//     weight shape of ResNet-18 and VGG-19bn at ranks 1, 2, 4, and for the whole models;
//   - TopK round (error feedback, selection, sparse output, new error) at K = 1%, 10%, 25%, 99% on
//     1M and 10M floats and on the whole ResNet-18;
//   - Gram-Schmidt alone;
//   - the cost of accumulating Σ g per parameter (Accordion's norms) in a dense round.
// Ours is timed with tinybench; the peer (bench/peers/torch_compression.py) runs the same cases in
// one process right after, with the same thread count. "GB/s" counts the gradient's bytes once
// (numel·4 / time): an effective rate, not the memory traffic.
//
// With --device cuda both sides run on the GPU, each round ending when the device is done: the
// whole-model rounds (PowerSGD ranks 1, 2, 4 on ResNet-18 and VGG-19bn; TopK 1%, 10% on ResNet-18
// and on 10M floats) and the norm bookkeeping; Gram-Schmidt alone is a CPU case.
//
//   node bench/compression.js [--device cpu|cuda] [--threads N] [--quick] [--only powersgd,topk,gs,norms] [--json FILE]
import { spawnSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { Bench } from 'tinybench';
import { Model, parseDevice, requireDevice, setThreads } from '../lib/index.js';
import { ReducerProbe, orthogonalize } from '../lib/testing.js';
import { BENCH_DIR, PYTHON, ROOT, defaultThreads, exitUnlessDevice, fmt, formatTable, peerEnv, positiveInt, probeTorch } from './common.js';

const { values: opts } = parseArgs({
  options: {
    threads: { type: 'string' },
    quick: { type: 'boolean', default: false },
    only: { type: 'string' },
    json: { type: 'string' },
    device: { type: 'string', default: 'cpu' },
  },
});
const threads = opts.threads ? positiveInt('--threads', opts.threads) : defaultThreads();
const device = parseDevice(opts.device, '--device');
const gpu = device !== 'cpu';
const groups = new Set((opts.only ?? (gpu ? 'powersgd,topk,norms' : 'powersgd,topk,gs,norms')).split(','));
if (gpu && groups.has('gs')) throw new Error('--only gs: Gram-Schmidt alone is a CPU case (on a GPU it runs inside the PowerSGD rounds)');
exitUnlessDevice('bench/compression.js', device, requireDevice);
const minTime = opts.quick ? 0.05 : 0.3; // seconds per case, both sides
setThreads(threads);

async function shapesOf(architecture) {
  const model = await Model.create({ architecture, classes: 10 });
  const shapes = model.parameters().map((p) => p.shape);
  await model.dispose();
  return shapes;
}

const numel = (shape) => shape.reduce((a, b) => a * b, 1);
const resnet = await shapesOf('resnet18');
const vgg = await shapesOf('vgg19bn');

/** Each case: { name, group, floats, peer (the JSON case for torch), ours: () => void }. */
const cases = [];

function reducerCase(name, group, shapes, options, peer) {
  const probe = new ReducerProbe(shapes, { workers: 1, device, ...options });
  probe.randomize(1);
  cases.push({ name, group, floats: shapes.reduce((s, sh) => s + numel(sh), 0), peer: peer && { name, ...peer }, ours: () => probe.run() });
}

if (groups.has('powersgd')) {
  const seen = new Set();
  for (const [model, shapes] of [['resnet18', resnet], ['vgg19bn', vgg]]) {
    for (const shape of gpu ? [] : shapes.filter((s) => s.length > 1)) {
      const key = shape.join('x');
      if (seen.has(key)) continue;
      seen.add(key);
      for (const rank of [1, 2, 4])
        reducerCase(`powersgd ${key} r${rank}`, 'powersgd', [shape], { compressor: 'powersgd', level: rank, minCompressionRate: 0 },
          { kind: 'powersgd', shapes: [shape], rank });
    }
    for (const rank of [1, 2, 4])
      reducerCase(`powersgd ${model} whole r${rank}`, 'powersgd', shapes, { compressor: 'powersgd', level: rank, minCompressionRate: 0 },
        { kind: 'powersgd', shapes, rank });
  }
}

if (groups.has('topk')) {
  for (const ratio of gpu ? [0.01, 0.1] : [0.01, 0.1, 0.25, 0.99]) {
    // As a (1000, n/1000) matrix: the engine sends 1-D tensors dense.
    for (const n of gpu ? [10_000_000] : opts.quick ? [1_000_000] : [1_000_000, 10_000_000]) {
      const shape = [1000, n / 1000];
      reducerCase(`topk ${n / 1e6}M K=${ratio}`, 'topk', [shape], { compressor: 'topk', level: ratio }, { kind: 'topk', shapes: [shape], ratio });
    }
    // Whole model: TopK on every >1-D tensor (1-D tensors go dense in the engine; the peer compresses
    // only the same matrices).
    const matrices = resnet.filter((s) => s.length > 1);
    reducerCase(`topk resnet18 whole K=${ratio}`, 'topk', matrices, { compressor: 'topk', level: ratio }, { kind: 'topk', shapes: matrices, ratio });
  }
}

if (groups.has('gs')) {
  for (const [rows, cols] of [[512, 1], [512, 2], [512, 4], [4608, 4], [4096, 16]]) {
    const base = Float32Array.from({ length: rows * cols }, (_, i) => Math.sin(i * 0.7) + Math.cos(i * 0.13));
    const work = new Float32Array(base.length);
    cases.push({
      name: `gram-schmidt ${rows}x${cols}`,
      group: 'gs',
      floats: rows * cols,
      peer: { name: `gram-schmidt ${rows}x${cols}`, kind: 'gram_schmidt', rows, cols },
      ours: () => {
        work.set(base);
        orthogonalize(work, rows, cols, 1e-8);
      },
    });
  }
}

if (groups.has('norms')) {
  // A dense round checks every gradient for NaN/Inf; with accumulateNorms it also adds g into the
  // epoch sums. The difference is the norm bookkeeping's cost per step.
  for (const accumulateNorms of [false, true])
    reducerCase(`dense resnet18 whole${accumulateNorms ? ' + norm sums' : ''}`, 'norms', resnet, { compressor: 'none', accumulateNorms });
}

// Ours.
const bench = new Bench({ time: minTime * 1000, warmupTime: 50, iterations: 5 });
for (const c of cases) bench.add(c.name, c.ours);
await bench.run();
const ours = new Map(bench.tasks.map((t) => [t.name, t.result.latency.p50]));

// The peer, same cases, one process.
const torch = probeTorch();
const peer = new Map();
if (torch.ok) {
  const peerCases = cases.map((c) => c.peer).filter(Boolean);
  const args = ['--threads', String(threads), '--min-time', String(minTime), '--device', device];
  const r = spawnSync(PYTHON, [join(BENCH_DIR, 'peers', 'torch_compression.py'), ...args], {
    cwd: ROOT,
    input: JSON.stringify(peerCases),
    encoding: 'utf8',
    env: peerEnv(threads),
    maxBuffer: 64 << 20,
  });
  if (r.status !== 0) throw new Error(`torch_compression.py failed: ${(r.stderr || '').trim().split('\n').slice(-3).join('\n')}`);
  for (const line of r.stdout.trim().split('\n')) {
    const rec = JSON.parse(line);
    peer.set(rec.name, rec.ms_median);
  }
} else {
  console.log(`(no PyTorch column: ${torch.reason})`);
}

const rows = cases.map((c) => {
  const ms = ours.get(c.name);
  const theirs = peer.get(c.name);
  return {
    name: c.name,
    ms: fmt(ms, 3),
    gbs: fmt((c.floats * 4) / (ms * 1e6), 2),
    torch: theirs === undefined ? '' : fmt(theirs, 3),
    ratio: theirs === undefined ? '' : fmt(ms / theirs, 3),
  };
});
const columns = [
  { key: 'name', title: 'case', align: 'left' },
  { key: 'ms', title: 'ours ms (p50)' },
  { key: 'gbs', title: 'ours GB/s' },
  { key: 'torch', title: 'PyTorch ms' },
  { key: 'ratio', title: 'ours/PyTorch' },
];
console.log(`${device}, threads ${threads}${torch.ok ? `, torch ${torch.version}` : ''}`);
console.log(formatTable(columns, rows));
const dense = ours.get('dense resnet18 whole'), withNorms = ours.get('dense resnet18 whole + norm sums');
if (dense !== undefined && withNorms !== undefined)
  console.log(`norm bookkeeping: ${fmt(withNorms - dense, 3)} ms per step (compare with a training step in bench/step.js)`);
if (opts.json) writeFileSync(opts.json, JSON.stringify({ device, threads, torch: torch.ok ? torch.version : null, rows }, null, 2) + '\n');
