#!/usr/bin/env node
// The exchange overlapped with backward, measured where it matters: ResNet-18 over 2 simulated hosts
// (`accordion cluster`, one core each, egress shaped with tc) at each bandwidth. Per exchange (dense,
// PowerSGD rank 2, TopK 10%): seconds per step with the exchange overlapped in buckets (--bucket-mb,
// default 25) and after backward (--bucket-mb 0), next to that run's compute alone (forward,
// backward, update) and exchange alone (compression and collectives). The peer is PyTorch DDP over
// Gloo with the same buckets, dense and with its PowerSGD hook (rank 2), in the same shaped network.
// Each run trains 3 epochs of 5 steps; its figures are the median over the epochs after the first
// (which warms up). Each cell is run `--rounds` times (3), the two sides alternating which goes first;
// the tables give medians over the rounds and the median of the paired speed-ups. The peer's step is
// the median of 8 after 3 warm-up steps, median over the rounds. Needs root (CAP_NET_ADMIN);
// finished runs are kept in <out>/results.jsonl and not run again.
//
//   sudo node bench/overlap.js [--bandwidths 1gbit,100mbit] [--bucket-mb 25] [--rounds 3] [--out DIR] [--fresh]
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { parseArgs } from 'node:util';
import { PYTHON, ROOT, fmt, formatTable, median } from './common.js';
import { readMetrics } from '../lib/metrics.js';
import { parseBandwidth, parseSubnet } from '../lib/cluster/cluster.js';
import { HOST_DEVICE, createNetwork, missingCapabilities, removeNetwork } from '../lib/cluster/netns.js';

const EXCHANGES = {
  dense: ['--compressor', 'none'],
  'powersgd-r2': ['--compressor', 'powersgd', '--accordion', 'off', '--rank', '2'],
  'topk-10': ['--compressor', 'topk', '--accordion', 'off', '--topk-ratio', '0.1'],
};

const { values: opts } = parseArgs({
  options: {
    bandwidths: { type: 'string', default: '1gbit,100mbit' },
    'bucket-mb': { type: 'string', default: '25' },
    rounds: { type: 'string', default: '3' },
    out: { type: 'string', default: path.join(os.tmpdir(), 'accordion-overlap-bench') },
    fresh: { type: 'boolean', default: false },
  },
});
const bandwidths = opts.bandwidths.split(',').filter(Boolean);
bandwidths.forEach(parseBandwidth);
const bucketMb = opts['bucket-mb'];
const rounds = Number(opts.rounds);
if (!(Number.isInteger(rounds) && rounds >= 1)) {
  console.error(`bench/overlap.js: --rounds: a positive integer, got '${opts.rounds}'`);
  process.exit(2);
}
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
const training = ['--model', 'resnet18', '--dataset', 'synthetic', '--threads', '1', '--checkpoint-every', '100', '--synthetic-train', '640', '--synthetic-test', '64', '--epochs', '3'];

/** Runs a command, its output to `logFile` (stdout kept instead with `stdout: 'pipe'`); { code, out, child }. */
function run(command, args, logFile, options = {}) {
  const log = fs.openSync(logFile, 'w');
  const child = spawn(command, args, { stdio: ['ignore', options.stdout ?? log, log], ...options.spawn });
  let out = '';
  child.stdout?.setEncoding('utf8').on('data', (s) => (out += s));
  const exited = new Promise((resolve) => {
    child.on('exit', (code) => {
      fs.closeSync(log);
      resolve({ code, out });
    });
  });
  return Object.assign(exited, { child });
}

/**
 * The engine over 2 hosts, one run: per step, the step, compute, exchange and wait seconds, each the
 * median over the epochs after the first (which warms up).
 */
async function engineCell(bandwidth, exchange, bucket, round) {
  const dir = path.join(opts.out, bandwidth, `${exchange}-bucket${bucket}-round${round}`);
  fs.rmSync(dir, { recursive: true, force: true });
  fs.mkdirSync(path.dirname(dir), { recursive: true });
  const args = [path.join(ROOT, 'lib', 'cli.js'), 'cluster', '--hosts', '2', '--bandwidth', bandwidth, '--latency', '0ms', '--',
    ...training, ...EXCHANGES[exchange], '--bucket-mb', String(bucket), '--out', dir];
  const { code } = await run(process.execPath, args, `${dir}.log`);
  if (code !== 0) throw new Error(`${bandwidth} ${exchange} --bucket-mb ${bucket} failed (exit ${code}); see ${dir}.log`);
  const epochs = readMetrics(path.join(dir, 'metrics.jsonl')).filter((r) => r.event === 'epoch').slice(1);
  const per = (f) => median(epochs.map((e) => f(e) / e.steps));
  return {
    step: per((e) => e.seconds),
    compute: per((e) => e.computeSeconds),
    exchange: per((e) => e.compressionSeconds + e.communicationSeconds),
    wait: per((e) => e.exchangeWaitSeconds),
  };
}

/** PyTorch DDP over the same 2 shaped hosts: its median step. */
async function ddpCell(bandwidth, hook) {
  const network = await createNetwork({ hosts: 2, subnet: parseSubnet('10.88.0.0/24', 2), shape: { bitsPerSecond: parseBandwidth(bandwidth), delaySeconds: 0, loss: 0 } });
  try {
    const master = `${network.hosts[0].address}:29511`;
    const script = path.join(ROOT, 'bench', 'peers', 'torch_ddp.py');
    // Gloo listens on the address of the interface named here (else on the hostname's, loopback).
    const env = { ...process.env, OMP_NUM_THREADS: '1', GLOO_SOCKET_IFNAME: HOST_DEVICE };
    const runs = network.hosts.map((host) =>
      run('ip', ['netns', 'exec', host.namespace, PYTHON, script, '--rank', String(host.index), '--world', '2', '--master', master, '--bucket-mb', bucketMb, '--hook', hook],
        path.join(opts.out, bandwidth, `ddp-${hook}.rank${host.index}.log`), { stdout: 'pipe', spawn: { env } }),
    );
    // One rank failing stops the other, which would wait for it until Gloo's 30-minute timeout.
    for (const r of runs) r.then(({ code }) => code !== 0 && runs.forEach((o) => o.child.kill('SIGKILL')));
    const [rank0, rank1] = await Promise.all(runs);
    if (rank0.code !== 0 || rank1.code !== 0) throw new Error(`DDP ${hook} at ${bandwidth} failed (exits ${rank0.code}, ${rank1.code}); see ${path.join(opts.out, bandwidth)}/ddp-${hook}.rank*.log`);
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

const medianOf = (runs, key) => median(runs.map((r) => r[key]));

for (const bandwidth of bandwidths) {
  fs.mkdirSync(path.join(opts.out, bandwidth), { recursive: true });
  const rows = [];
  for (const exchange of Object.keys(EXCHANGES)) {
    // Rounds alternate which side runs first, so that a drift of the machine's speed favours neither.
    const overlapped = [], after = [];
    for (let round = 0; round < rounds; round++) {
      const sides = [[overlapped, bucketMb], [after, '0']];
      for (const [runs, bucket] of round % 2 ? sides.reverse() : sides)
        runs.push(await cell([bandwidth, exchange, bucket, round], () => engineCell(bandwidth, exchange, bucket, round)));
    }
    const bound = Math.max(medianOf(after, 'compute'), medianOf(after, 'exchange'));
    rows.push({
      exchange,
      overlapped: fmt(medianOf(overlapped, 'step'), 2),
      after: fmt(medianOf(after, 'step'), 2),
      compute: fmt(medianOf(after, 'compute'), 2),
      alone: fmt(medianOf(after, 'exchange'), 2),
      wait: fmt(medianOf(overlapped, 'wait'), 2),
      goal: fmt(medianOf(overlapped, 'step') / bound, 2),
      speedup: fmt(median(after.map((a, i) => a.step / overlapped[i].step)), 2),
    });
  }
  for (const hook of ['none', 'powersgd']) {
    const ddp = [];
    for (let round = 0; round < rounds; round++) ddp.push(await cell([bandwidth, 'ddp', hook, bucketMb, round], () => ddpCell(bandwidth, hook)));
    rows.push({ exchange: `PyTorch DDP${hook === 'none' ? '' : ' + PowerSGD r2'}`, overlapped: fmt(medianOf(ddp, 'step'), 2) });
  }
  console.log(`\nResNet-18, 2 hosts × 1 core, ${bandwidth}, buckets of ${bucketMb} MiB (the first of 1 MiB): seconds per step, medians of ${rounds} runs`);
  console.log(formatTable([
    { key: 'exchange', title: 'exchange', align: 'left' },
    { key: 'overlapped', title: 'overlapped' },
    { key: 'after', title: 'after backward' },
    { key: 'compute', title: 'compute alone' },
    { key: 'alone', title: 'exchange alone' },
    { key: 'wait', title: 'waited (overlapped)' },
    { key: 'goal', title: 'overlapped / max' },
    { key: 'speedup', title: 'speed-up (paired)' },
  ], rows, { markdown: true }));
}
