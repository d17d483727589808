#!/usr/bin/env node
// The exchange overlapped with backward, measured where it matters: ResNet-18 over 2 simulated hosts
// (`accordion cluster`, one core each, egress shaped with tc) at each bandwidth. Per exchange (dense,
// PowerSGD rank 2, TopK 10%): seconds per step with the exchange overlapped in buckets (--bucket-mb,
// default 25) and after backward (--bucket-mb 0), next to that run's compute alone (forward,
// backward, update) and exchange alone (compression and collectives). The peer is PyTorch DDP over
// Gloo with the same buckets, dense and with its PowerSGD hook (rank 2), in the same shaped network.
// Steps are those of the second of two epochs (the first warms up); the peer's are the median of 8
// after 3 warm-up steps. Needs root (CAP_NET_ADMIN); finished cells are kept in <out>/results.jsonl.
//
//   sudo node bench/overlap.js [--bandwidths 1gbit,100mbit] [--bucket-mb 25] [--out DIR] [--fresh]
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { parseArgs } from 'node:util';
import { PYTHON, ROOT, fmt, formatTable } from './common.js';
import { readMetrics } from '../lib/metrics.js';
import { parseBandwidth, parseSubnet } from '../lib/cluster/cluster.js';
import { createNetwork, missingCapabilities, removeNetwork } from '../lib/cluster/netns.js';

const EXCHANGES = {
  dense: ['--compressor', 'none'],
  'powersgd-r2': ['--compressor', 'powersgd', '--accordion', 'off', '--rank', '2'],
  'topk-10': ['--compressor', 'topk', '--accordion', 'off', '--topk-ratio', '0.1'],
};

const { values: opts } = parseArgs({
  options: {
    bandwidths: { type: 'string', default: '1gbit,100mbit' },
    'bucket-mb': { type: 'string', default: '25' },
    out: { type: 'string', default: path.join(os.tmpdir(), 'accordion-overlap-bench') },
    fresh: { type: 'boolean', default: false },
  },
});
const bandwidths = opts.bandwidths.split(',').filter(Boolean);
bandwidths.forEach(parseBandwidth);
const bucketMb = opts['bucket-mb'];
const missing = missingCapabilities();
if (missing.length) {
  console.error(`bench/overlap.js: the simulated cluster needs root (this process lacks ${missing.join(' and ')}); run it with sudo`);
  process.exit(2);
}
fs.mkdirSync(opts.out, { recursive: true });
const resultsFile = path.join(opts.out, 'results.jsonl');
const done = new Map(
  (!opts.fresh && fs.existsSync(resultsFile) ? fs.readFileSync(resultsFile, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l)) : []).map((r) => [r.key, r]),
);
const training = ['--model', 'resnet18', '--dataset', 'synthetic', '--threads', '1', '--checkpoint-every', '100', '--synthetic-train', '640', '--synthetic-test', '64', '--epochs', '2'];

function run(command, args, logFile, options = {}) {
  const log = fs.openSync(logFile, 'w');
  return new Promise((resolve) => {
    const child = spawn(command, args, { stdio: ['ignore', options.stdout ?? log, log], ...options.spawn });
    let out = '';
    child.stdout?.setEncoding('utf8').on('data', (s) => (out += s));
    child.on('exit', (code) => {
      fs.closeSync(log);
      resolve({ code, out });
    });
  });
}

/** The engine over 2 hosts: per step of the second epoch, the step, compute, exchange and wait seconds. */
async function engineCell(bandwidth, exchange, bucket) {
  const dir = path.join(opts.out, bandwidth, `${exchange}-bucket${bucket}`);
  fs.rmSync(dir, { recursive: true, force: true });
  fs.mkdirSync(path.dirname(dir), { recursive: true });
  const args = [path.join(ROOT, 'lib', 'cli.js'), 'cluster', '--hosts', '2', '--bandwidth', bandwidth, '--latency', '0ms', '--',
    ...training, ...EXCHANGES[exchange], '--bucket-mb', String(bucket), '--out', dir];
  const { code } = await run(process.execPath, args, `${dir}.log`);
  if (code !== 0) throw new Error(`${bandwidth} ${exchange} --bucket-mb ${bucket} failed (exit ${code}); see ${dir}.log`);
  const e = readMetrics(path.join(dir, 'metrics.jsonl')).filter((r) => r.event === 'epoch').at(-1);
  const per = (x) => x / e.steps;
  return { step: per(e.seconds), compute: per(e.computeSeconds), exchange: per(e.compressionSeconds + e.communicationSeconds), wait: per(e.exchangeWaitSeconds), steps: e.steps };
}

/** PyTorch DDP over the same 2 shaped hosts: its median step. */
async function ddpCell(bandwidth, hook) {
  const network = await createNetwork({ hosts: 2, subnet: parseSubnet('10.88.0.0/24', 2), shape: { bitsPerSecond: parseBandwidth(bandwidth), delaySeconds: 0, loss: 0 } });
  try {
    const master = `${network.hosts[0].address}:29511`;
    const script = path.join(ROOT, 'bench', 'peers', 'torch_ddp.py');
    const runs = network.hosts.map((host) =>
      run('ip', ['netns', 'exec', host.namespace, PYTHON, script, '--rank', String(host.index), '--world', '2', '--master', master, '--bucket-mb', bucketMb, '--hook', hook],
        path.join(opts.out, bandwidth, `ddp-${hook}.rank${host.index}.log`), { stdout: 'pipe', spawn: { env: { ...process.env, OMP_NUM_THREADS: '1' } } }),
    );
    const [rank0] = await Promise.all(runs);
    if (rank0.code !== 0) throw new Error(`DDP ${hook} at ${bandwidth} failed (exit ${rank0.code})`);
    return { step: JSON.parse(rank0.out.trim().split('\n').at(-1)).stepSeconds };
  } finally {
    await removeNetwork(network.id);
  }
}

async function cell(key, measure) {
  const id = JSON.stringify([...key, training]);
  if (!done.has(id)) {
    process.stderr.write(`${key.join(' ')} … `);
    const started = Date.now();
    const result = { key: id, ...(await measure()) };
    fs.appendFileSync(resultsFile, JSON.stringify(result) + '\n');
    done.set(id, result);
    process.stderr.write(`${Math.round((Date.now() - started) / 1000)} s\n`);
  }
  return done.get(id);
}

for (const bandwidth of bandwidths) {
  fs.mkdirSync(path.join(opts.out, bandwidth), { recursive: true });
  const rows = [];
  for (const exchange of Object.keys(EXCHANGES)) {
    const overlapped = await cell([bandwidth, exchange, bucketMb], () => engineCell(bandwidth, exchange, bucketMb));
    const after = await cell([bandwidth, exchange, '0'], () => engineCell(bandwidth, exchange, 0));
    const bound = Math.max(after.compute, after.exchange);
    rows.push({ exchange, overlapped: fmt(overlapped.step, 2), after: fmt(after.step, 2), compute: fmt(after.compute, 2), alone: fmt(after.exchange, 2),
      wait: fmt(overlapped.wait, 2), goal: fmt(overlapped.step / bound, 2), speedup: fmt(after.step / overlapped.step, 2) });
  }
  for (const hook of ['none', 'powersgd']) {
    const ddp = await cell([bandwidth, 'ddp', hook, bucketMb], () => ddpCell(bandwidth, hook));
    rows.push({ exchange: `PyTorch DDP${hook === 'none' ? '' : ' + PowerSGD r2'}`, overlapped: fmt(ddp.step, 2), after: '', compute: '', alone: '', wait: '', goal: '', speedup: '' });
  }
  console.log(`\nResNet-18, 2 hosts × 1 core, ${bandwidth}, buckets of ${bucketMb} MiB: seconds per step`);
  console.log(formatTable([
    { key: 'exchange', title: 'exchange', align: 'left' },
    { key: 'overlapped', title: 'overlapped' },
    { key: 'after', title: 'after backward' },
    { key: 'compute', title: 'compute alone' },
    { key: 'alone', title: 'exchange alone' },
    { key: 'wait', title: 'waited (overlapped)' },
    { key: 'goal', title: 'overlapped / max' },
    { key: 'speedup', title: 'speed-up' },
  ], rows, { markdown: true }));
}
