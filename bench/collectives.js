#!/usr/bin/env node
// All-reduce and all-gather across 2 and 4 processes on this machine, engine (Gloo through the
// addon) vs torch.distributed's Gloo backend, by message size. Reported as nccl-tests does:
//   algbw = bytes / time;  busbw = algbw · 2(n−1)/n (all-reduce) or algbw · (n−1)/n (all-gather),
// where an all-gather's bytes are its gathered output. Time is the median over iterations of the
// slowest rank's time, each iteration after a barrier. With --bandwidth the processes run one per
// simulated host (`accordion cluster`'s network namespaces, each host's egress shaped to the rate;
// needs root), over the link instead of loopback.
//
//   node bench/collectives.js [--workers 2,4] [--sizes KB,…] [--bandwidth 100mbit] [--quick] [--json FILE]
import { spawn } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { BENCH_DIR, PYTHON, ROOT, fmt, formatTable, freePort, onShapedHosts, probeTorch, ORACLES } from './common.js';
import { parseBandwidth } from '../lib/cluster/cluster.js';
import { HOST_DEVICE, missingCapabilities } from '../lib/cluster/netns.js';

const { values: opts } = parseArgs({
  options: {
    workers: { type: 'string', default: '2,4' },
    sizes: { type: 'string' },
    bandwidth: { type: 'string' },
    quick: { type: 'boolean', default: false },
    json: { type: 'string' },
  },
});
const worldSizes = opts.workers.split(',').map(Number);
const sizes = (opts.sizes ? opts.sizes.split(',').map(Number) : opts.quick ? [4, 1024, 16384] : [4, 64, 1024, 4096, 16384, 65536]).map((kb) => kb * 1024);
const spec = { sizes, warmup: 3, budgetBytes: opts.quick ? 64 << 20 : 512 << 20, minIterations: opts.quick ? 3 : 5, maxIterations: opts.quick ? 20 : 50 };
const bitsPerSecond = opts.bandwidth ? parseBandwidth(opts.bandwidth) : undefined;
if (bitsPerSecond && missingCapabilities().length) {
  console.error(`bench/collectives.js: --bandwidth needs root (this process lacks ${missingCapabilities().join(' and ')})`);
  process.exit(2);
}

/** Starts one job of `world` processes running `command`, on loopback or one per shaped host; resolves with rank 0's JSON. */
function runJob(world, command) {
  return bitsPerSecond ? onShapedHosts(world, '10.89.0.0/24', bitsPerSecond, (network) => runProcesses(world, command, network)) : runProcesses(world, command);
}

async function runProcesses(world, command, network) {
  const port = await freePort();
  const outputs = [];
  const exits = [];
  for (let rank = 0; rank < world; rank++) {
    const [file, ...args] = network ? ['ip', 'netns', 'exec', network.hosts[rank].namespace, ...command] : command;
    const master = network ? network.hosts[0].address : '127.0.0.1';
    // Gloo listens on the address of the interface named here (torch.distributed; ours finds it).
    const child = spawn(file, [...args, JSON.stringify(spec)], {
      cwd: ROOT,
      env: { ...process.env, RANK: String(rank), WORLD_SIZE: String(world), MASTER_ADDR: master, MASTER_PORT: String(port), OMP_NUM_THREADS: '1', ...(network ? { GLOO_SOCKET_IFNAME: HOST_DEVICE } : {}) },
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
  const theirs = torch.ok ? await runJob(world, [PYTHON, join(ORACLES, 'torch_collectives.py')]) : undefined;
  for (const r of ours.sizes) {
    const peer = theirs?.sizes.find((p) => p.op === r.op && p.bytes === r.bytes);
    const algbw = r.bytes / (r.ms * 1e6);
    const peerAlgbw = peer ? peer.bytes / (peer.ms * 1e6) : NaN;
    rows.push({
      world,
      op: r.op,
      size: r.bytes >= 1 << 20 ? `${+(r.bytes / 2 ** 20).toFixed(1)} MB` : `${r.bytes >> 10} KB`,
      ms: fmt(r.ms, 3),
      algbw: fmt(algbw, 3),
      busbw: fmt(algbw * busFactor(r.op, world), 3),
      torchMs: peer ? fmt(peer.ms, 3) : 'n/a',
      torchBusbw: peer ? fmt(peerAlgbw * busFactor(r.op, world), 3) : 'n/a',
      ratio: peer ? fmt(algbw / peerAlgbw, 2) : 'n/a',
      // What a host sends per second, as a share of its shaped link.
      ...(bitsPerSecond ? { link: fmt((algbw * busFactor(r.op, world) * 8e9) / bitsPerSecond, 2), torchLink: peer ? fmt((peerAlgbw * busFactor(r.op, world) * 8e9) / bitsPerSecond, 2) : 'n/a' } : {}),
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
  ...(bitsPerSecond ? [{ key: 'link', title: 'ours of link' }, { key: 'torchLink', title: 'torch of link' }] : []),
];
if (!torch.ok) console.log(`(no PyTorch column: ${torch.reason})`);
console.log(formatTable(columns, rows));
if (opts.json) writeFileSync(opts.json, JSON.stringify({ spec, rows }, null, 2) + '\n');
