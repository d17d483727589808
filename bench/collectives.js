#!/usr/bin/env node
// All-reduce and all-gather across 2 and 4 processes on this machine, engine (Gloo through the
// addon) vs torch.distributed's Gloo backend, by message size. Reported as nccl-tests does:
//   algbw = bytes / time;  busbw = algbw · 2(n−1)/n (all-reduce) or algbw · (n−1)/n (all-gather),
// where an all-gather's bytes are its gathered output. Time is the median over iterations of the
// slowest rank's time, each iteration after a barrier.
//
//   node bench/collectives.js [--workers 2,4] [--quick] [--json FILE]
import { spawn } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { BENCH_DIR, PYTHON, ROOT, fmt, formatTable, freePort, probeTorch } from './common.js';

const { values: opts } = parseArgs({
  options: { workers: { type: 'string', default: '2,4' }, quick: { type: 'boolean', default: false }, json: { type: 'string' } },
});
const worldSizes = opts.workers.split(',').map(Number);
const sizes = (opts.quick ? [4, 1024, 16384] : [4, 64, 1024, 4096, 16384, 65536]).map((kb) => kb * 1024);
const spec = { sizes, warmup: 3, budgetBytes: opts.quick ? 64 << 20 : 512 << 20, minIterations: opts.quick ? 3 : 5, maxIterations: opts.quick ? 20 : 50 };

/** Starts one job of `world` processes running `command`; resolves with rank 0's JSON. */
async function runJob(world, command) {
  const port = await freePort();
  const outputs = [];
  const exits = [];
  for (let rank = 0; rank < world; rank++) {
    const child = spawn(command[0], [...command.slice(1), JSON.stringify(spec)], {
      cwd: ROOT,
      env: { ...process.env, RANK: String(rank), WORLD_SIZE: String(world), MASTER_ADDR: '127.0.0.1', MASTER_PORT: String(port), OMP_NUM_THREADS: '1' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '', err = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (err += d));
    exits.push(new Promise((resolve, reject) => child.on('exit', (code) => (code === 0 ? resolve() : reject(new Error(`${command.join(' ')} rank ${rank} exited ${code}: ${err.trim().split('\n').slice(-3).join(' | ')}`))))));
    outputs.push(() => out);
  }
  await Promise.all(exits);
  return JSON.parse(outputs[0]().trim().split('\n').pop());
}

const busFactor = (op, n) => (op === 'allreduce' ? (2 * (n - 1)) / n : (n - 1) / n);
const torch = probeTorch();
const rows = [];
for (const world of worldSizes) {
  const ours = await runJob(world, [process.execPath, join(BENCH_DIR, 'collectives-worker.js')]);
  const theirs = torch.ok ? await runJob(world, [PYTHON, join(BENCH_DIR, 'peers', 'torch_collectives.py')]) : undefined;
  for (const r of ours.sizes) {
    const peer = theirs?.sizes.find((p) => p.op === r.op && p.bytes === r.bytes);
    const algbw = r.bytes / (r.ms * 1e6);
    const peerAlgbw = peer ? peer.bytes / (peer.ms * 1e6) : NaN;
    rows.push({
      world,
      op: r.op,
      size: r.bytes >= 1 << 20 ? `${r.bytes >> 20} MB` : `${r.bytes >> 10} KB`,
      ms: fmt(r.ms, 3),
      algbw: fmt(algbw, 3),
      busbw: fmt(algbw * busFactor(r.op, world), 3),
      torchMs: peer ? fmt(peer.ms, 3) : 'n/a',
      torchBusbw: peer ? fmt(peerAlgbw * busFactor(r.op, world), 3) : 'n/a',
      ratio: peer ? fmt(algbw / peerAlgbw, 2) : 'n/a',
    });
  }
}
const columns = [
  { key: 'world', title: 'procs' },
  { key: 'op', title: 'op', align: 'left' },
  { key: 'size', title: 'size' },
  { key: 'ms', title: 'ours ms' },
  { key: 'algbw', title: 'algbw GB/s' },
  { key: 'busbw', title: 'busbw GB/s' },
  { key: 'torchMs', title: 'torch ms' },
  { key: 'torchBusbw', title: 'torch busbw' },
  { key: 'ratio', title: 'ours/torch bw' },
];
if (!torch.ok) console.log(`(no PyTorch column: ${torch.reason})`);
console.log(formatTable(columns, rows));
if (opts.json) writeFileSync(opts.json, JSON.stringify({ spec, rows }, null, 2) + '\n');
