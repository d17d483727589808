#!/usr/bin/env node
// Compression kernels, engine vs PyTorch, one worker, no communication:
//   - PowerSGD round (error feedback, P = M·Q, Gram-Schmidt, Q = Mᵀ·P̂, P̂·Qᵀ, new error) for every
//     weight shape of ResNet-18 and VGG-19bn at ranks 1, 2, 4, and for the whole models;
//   - TopK round (error feedback, selection, sparse output, new error) at K = 1%, 10%, 25%, 99% on
//     1M and 10M floats and on the whole ResNet-18;
//   - Gram-Schmidt alone;
//   - the cost of accumulating Σ g per parameter (Accordion's norms) in a dense round.
//
// Same input on both sides, every iteration. One pool of standard normal floats is drawn once from a
// seeded generator here and written to a file; every case's gradients are consecutive slices of it
// from its start, on both sides. Before each timed round (untimed) both sides restore the state of
// the first round: the gradients as drawn, zero error memories and PowerSGD's initial Q, which the
// engine draws from its seed and the peer reads from a second file. So neither side compresses its
// own output or an error memory that has drifted, and TopK, whose time depends on the data, selects
// from the same values on both sides.
//
// Rounds: in each, every case is timed by both sides back to back, ours (tinybench, median
// iteration) and the peer's (test/oracles/torch_compression.py, one process for the whole run that
// times the case it is sent, median iteration, same thread count), which of them goes first
// alternating between rounds; so a busy spell on a shared machine meets both sides of a ratio alike.
// Reported per case: the median over the rounds of each side's median, and the median over the
// rounds of the ratio ours/PyTorch (with its range). "GB/s" counts the gradient's bytes once
// (numel·4 / time): an effective rate, not the memory traffic.
//
// With --device cuda both sides run on the GPU, each round ending when the device is done: the
// whole-model rounds (PowerSGD ranks 1, 2, 4 on ResNet-18 and VGG-19bn; TopK 1%, 10% on ResNet-18
// and on 10M floats) and the norm bookkeeping; Gram-Schmidt alone is a CPU case.
//
//   node bench/compression.js [--device cpu|cuda] [--threads N] [--rounds R] [--quick]
//                             [--only powersgd,topk,gs,norms] [--markdown] [--json FILE]
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { parseArgs } from 'node:util';
import { Bench } from 'tinybench';
import { Model, parseDevice, requireDevice, setThreads } from '../lib/index.js';
import { ReducerProbe, orthogonalize } from '../lib/testing.js';
import { mulberry32, normals } from '../lib/base/random.js';
import { PYTHON, ROOT, defaultThreads, exitUnlessDevice, fmt, formatTable, median, peerEnv, positiveInt, probeTorch, ORACLES } from './common.js';

const { values: opts } = parseArgs({
  options: {
    threads: { type: 'string' },
    rounds: { type: 'string' },
    quick: { type: 'boolean', default: false },
    only: { type: 'string' },
    json: { type: 'string' },
    markdown: { type: 'boolean', default: false },
    device: { type: 'string', default: 'cpu' },
  },
});
const threads = opts.threads ? positiveInt('--threads', opts.threads) : defaultThreads();
const rounds = opts.rounds ? positiveInt('--rounds', opts.rounds) : opts.quick ? 1 : 3;
const device = parseDevice(opts.device, '--device');
const gpu = device !== 'cpu';
const groups = new Set((opts.only ?? (gpu ? 'powersgd,topk,norms' : 'powersgd,topk,gs,norms')).split(','));
if (gpu && groups.has('gs')) throw new Error('--only gs: Gram-Schmidt alone is a CPU case (on a GPU it runs inside the PowerSGD rounds)');
exitUnlessDevice('bench/compression.js', device, requireDevice);
const minTime = opts.quick ? 0.05 : 0.3; // seconds per case, each side, each round
setThreads(threads);

async function shapesOf(architecture) {
  const model = await Model.create({ architecture, classes: 10 });
  const shapes = model.parameters().map((p) => p.shape);
  await model.dispose();
  return shapes;
}

const numel = (shape) => shape.reduce((a, b) => a * b, 1);
const total = (shapes) => shapes.reduce((s, sh) => s + numel(sh), 0);
const resnet = await shapesOf('resnet18');
const vgg = await shapesOf('vgg19bn');

// ---- The cases ------------------------------------------------------------------------------------
// Each: { name, group, shapes, options (the probe's) and level, or gs: [rows, cols]; peer (the
// PyTorch case, or none) }. Cases with the same shapes and compressor share one probe.
const cases = [];

function reducerCase(name, group, shapes, options, peer) {
  cases.push({ name, group, shapes, options, peer: peer && { name, shapes, ...peer } });
}

if (groups.has('powersgd')) {
  const seen = new Set();
  for (const [model, shapes] of [['resnet18', resnet], ['vgg19bn', vgg]]) {
    for (const shape of gpu ? [] : shapes.filter((s) => s.length > 1)) {
      const key = shape.join('x');
      if (seen.has(key)) continue;
      seen.add(key);
      for (const rank of [1, 2, 4])
        reducerCase(`powersgd ${key} r${rank}`, 'powersgd', [shape], { compressor: 'powersgd', level: rank, minCompressionRate: 0 }, { kind: 'powersgd', rank });
    }
    for (const rank of [1, 2, 4])
      reducerCase(`powersgd ${model} whole r${rank}`, 'powersgd', shapes, { compressor: 'powersgd', level: rank, minCompressionRate: 0 }, { kind: 'powersgd', rank });
  }
}

if (groups.has('topk')) {
  for (const ratio of gpu ? [0.01, 0.1] : [0.01, 0.1, 0.25, 0.99]) {
    // As a (1000, n/1000) matrix: the engine sends 1-D tensors dense.
    for (const n of gpu ? [10_000_000] : opts.quick ? [1_000_000] : [1_000_000, 10_000_000])
      reducerCase(`topk ${n / 1e6}M K=${ratio}`, 'topk', [[1000, n / 1000]], { compressor: 'topk', level: ratio }, { kind: 'topk', ratio });
    // Whole model: TopK on every >1-D tensor (1-D tensors go dense in the engine; the peer compresses
    // only the same matrices).
    reducerCase(`topk resnet18 whole K=${ratio}`, 'topk', resnet.filter((s) => s.length > 1), { compressor: 'topk', level: ratio }, { kind: 'topk', ratio });
  }
}

if (groups.has('gs'))
  for (const [rows, cols] of [[512, 1], [512, 2], [512, 4], [4608, 4], [4096, 16]])
    cases.push({ name: `gram-schmidt ${rows}x${cols}`, group: 'gs', gs: [rows, cols], peer: { name: `gram-schmidt ${rows}x${cols}`, kind: 'gram_schmidt', rows, cols } });

if (groups.has('norms'))
  // A dense round checks every gradient for NaN/Inf; with accumulateNorms it also adds g into the
  // epoch sums. The difference is the norm bookkeeping's cost per step.
  for (const accumulateNorms of [false, true])
    reducerCase(`dense resnet18 whole${accumulateNorms ? ' + norm sums' : ''}`, 'norms', resnet, { compressor: 'none', accumulateNorms });

for (const c of cases) c.floats = c.gs ? c.gs[0] * c.gs[1] : total(c.shapes);

// ---- The input: one pool of normal floats, the same bytes on both sides ------------------------------

/** `n` standard normal floats from a seeded stream (mulberry32 and Box-Muller, ../lib/base/random.js). */
function normalPool(n, seed) {
  const normal = normals(mulberry32(seed));
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = normal();
  return out;
}

const pool = normalPool(Math.max(...cases.map((c) => c.floats)), 20261121);
/** A case's gradients: consecutive slices of the pool from its start, one per shape. */
function slices(shapes) {
  let offset = 0;
  return shapes.map((shape) => pool.subarray(offset, (offset += numel(shape))));
}

// ---- Our side ---------------------------------------------------------------------------------------

const probes = new Map(); // one per (shapes, compressor, norms): levels change between its cases
function probeFor(c) {
  const key = `${c.options.compressor}|${c.options.accumulateNorms ?? false}|${c.shapes.map((s) => s.join('x')).join(',')}`;
  let probe = probes.get(key);
  if (!probe) {
    probe = new ReducerProbe(c.shapes, { workers: 1, device, ...c.options });
    probe.setInput([slices(c.shapes)]);
    probes.set(key, probe);
  }
  // The case's level on every matrix (a change draws Q again), then the first round's state.
  if (c.options.compressor !== 'none') c.shapes.forEach((shape, i) => shape.length > 1 && probe.setLevel(i, c.options.level));
  probe.restart();
  return probe;
}

/** Our median iteration of one case, in ms. */
async function timeOurs(c) {
  const bench = new Bench({ time: minTime * 1000, warmupTime: 50, iterations: 5 });
  if (c.gs) {
    const [rows, cols] = c.gs;
    const base = pool.subarray(0, rows * cols), work = new Float32Array(rows * cols);
    bench.add(c.name, () => orthogonalize(work, rows, cols, 1e-8), { beforeEach: () => work.set(base) });
  } else {
    const probe = probeFor(c);
    bench.add(c.name, () => probe.run(), { beforeEach: () => probe.restart() });
  }
  await bench.run();
  const task = bench.tasks[0];
  if (task.result.error) throw task.result.error;
  return task.result.latency.p50;
}

// ---- The peer -----------------------------------------------------------------------------------------

const torch = probeTorch();
let work;
let peerCases = [];
if (torch.ok) {
  // The pool, and every PowerSGD matrix's initial Q as the engine draws it ((m, r) row-major).
  work = mkdtempSync(join(tmpdir(), 'accordion-bench-compression-'));
  writeFileSync(join(work, 'gradients.f32'), pool);
  const qs = [];
  let qOffset = 0;
  for (const c of cases) {
    if (!c.peer) continue;
    const peer = { ...c.peer };
    if (c.peer.kind === 'powersgd') {
      const probe = probeFor(c);
      peer.q = c.shapes.map((shape, i) => {
        const q = shape.length > 1 ? probe.q(0, i) : null;
        if (!q) return -1;
        qs.push(q);
        const at = qOffset;
        qOffset += q.length;
        return at;
      });
    }
    peer.inputSum = inputSum(c, peer.q);
    peerCases.push(peer);
  }
  const all = new Float32Array(qOffset);
  let at = 0;
  for (const q of qs) {
    all.set(q, at);
    at += q.length;
  }
  writeFileSync(join(work, 'q.f32'), all);
}

/** Σ of a case's gradients (and PowerSGD's initial Q's) in float64, as the peer reports it. */
function inputSum(c, qOffsets) {
  const sum = (a) => a.reduce((s, v) => s + v, 0);
  if (c.gs) return sum(pool.subarray(0, c.gs[0] * c.gs[1]));
  let s = slices(c.shapes).reduce((acc, g) => acc + sum(g), 0);
  if (qOffsets) {
    const probe = probeFor(c);
    c.shapes.forEach((shape, i) => {
      if (qOffsets[i] >= 0) s += sum(probe.q(0, i));
    });
  }
  return s;
}

/**
 * The peer process, for the whole run: each case sent on its stdin is timed at once and answered
 * with one JSON line, so that both sides of a ratio are measured moments apart.
 */
function startPeer() {
  const args = ['--threads', String(threads), '--min-time', String(minTime), '--device', device, '--gradients', join(work, 'gradients.f32'), '--q', join(work, 'q.f32')];
  const child = spawn(PYTHON, [join(ORACLES, 'torch_compression.py'), ...args], { cwd: ROOT, env: peerEnv(threads), stdio: ['pipe', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr.setEncoding('utf8').on('data', (d) => (stderr += d));
  const lines = createInterface({ input: child.stdout })[Symbol.asyncIterator]();
  const failed = (why) => new Error(`torch_compression.py ${why}: ${stderr.trim().split('\n').slice(-3).join('\n')}`);
  return {
    /** The peer's median iteration of one case, in ms, after checking it read the same input. */
    async time(peerCase) {
      child.stdin.write(JSON.stringify(peerCase) + '\n');
      const { value, done } = await lines.next();
      if (done) throw failed('stopped');
      const rec = JSON.parse(value);
      if (rec.name !== peerCase.name) throw failed(`answered '${rec.name}' for '${peerCase.name}'`);
      if (!(Math.abs(rec.input_sum - peerCase.inputSum) <= 1e-9 * Math.max(1, Math.abs(peerCase.inputSum))))
        throw new Error(`torch_compression.py read other input for '${rec.name}': Σ ${rec.input_sum}, here Σ ${peerCase.inputSum}`);
      return rec.ms_median;
    },
    close() {
      child.stdin.end();
      return new Promise((resolve) => (child.exitCode !== null ? resolve() : child.once('exit', resolve)));
    },
  };
}

// ---- Rounds: every case on both sides back to back ----------------------------------------------------

const peerByName = new Map(peerCases.map((p) => [p.name, p]));
const perRound = []; // per round: { ours: Map, theirs: Map } of ms by case name
const peer = torch.ok ? startPeer() : undefined;
try {
  for (let k = 0; k < rounds; k++) {
    const round = { ours: new Map(), theirs: new Map() };
    for (const c of cases) {
      const theirs = peer && peerByName.get(c.name);
      const sides = [async () => round.ours.set(c.name, await timeOurs(c)), async () => theirs && round.theirs.set(c.name, await peer.time(theirs))];
      if (k % 2) sides.reverse(); // which side goes first alternates between rounds
      for (const side of sides) await side();
    }
    perRound.push(round);
    console.error(`round ${k + 1}/${rounds} done`);
  }
} finally {
  await peer?.close();
  if (work) rmSync(work, { recursive: true, force: true });
}
if (!torch.ok) console.log(`(no PyTorch column: ${torch.reason})`);

const rows = cases.map((c) => {
  const ours = perRound.map((r) => r.ours.get(c.name));
  const theirs = perRound.map((r) => r.theirs.get(c.name)).filter((v) => v !== undefined);
  const ratios = theirs.length === ours.length ? ours.map((v, k) => v / theirs[k]) : [];
  const ms = median(ours);
  return {
    name: c.name,
    oursMs: ours,
    torchMs: theirs,
    ratios,
    ms: fmt(ms, 3),
    gbs: fmt((c.floats * 4) / (ms * 1e6), 2),
    torch: theirs.length ? fmt(median(theirs), 3) : '',
    ratio: ratios.length ? fmt(median(ratios), 3) : '',
    range: ratios.length ? `${fmt(Math.min(...ratios), 2)}–${fmt(Math.max(...ratios), 2)}` : '',
  };
});
const columns = [
  { key: 'name', title: 'case', align: 'left' },
  { key: 'ms', title: 'ours ms' },
  { key: 'gbs', title: 'ours GB/s' },
  { key: 'torch', title: 'PyTorch ms' },
  { key: 'ratio', title: 'ours/PyTorch (median)' },
  { key: 'range', title: 'ratio range' },
];
console.log(`${device}, threads ${threads}, ${rounds} round(s)${torch.ok ? `, torch ${torch.version}` : ''}; medians over the rounds`);
console.log(formatTable(columns, rows, { markdown: opts.markdown }));
const msOf = (name) => median(perRound.map((r) => r.ours.get(name)).filter((v) => v !== undefined));
const dense = msOf('dense resnet18 whole'), withNorms = msOf('dense resnet18 whole + norm sums');
if (Number.isFinite(dense) && Number.isFinite(withNorms))
  console.log(`norm bookkeeping: ${fmt(withNorms - dense, 3)} ms per step (compare with a training step in bench/step.js)`);
if (opts.json) {
  const json = rows.map(({ name, oursMs, torchMs, ratios }) => ({ name, oursMs, torchMs, ratios, oursMedian: median(oursMs), torchMedian: torchMs.length ? median(torchMs) : null, ratioMedian: ratios.length ? median(ratios) : null }));
  writeFileSync(opts.json, JSON.stringify({ device, threads, rounds, torch: torch.ok ? torch.version : null, rows: json }, null, 2) + '\n');
}
