#!/usr/bin/env node
// The exchange overlapped with backward, measured where it matters: ResNet-18 over 2 simulated hosts
// (`accordion cluster`, one core each, egress shaped with tc) at each bandwidth. Per exchange (dense,
// PowerSGD rank 2, TopK 10%): seconds per step with the exchange overlapped in buckets (--bucket-mb,
// default 25) and after backward (--bucket-mb 0), next to that run's compute alone (forward,
// backward, update) and exchange alone (compression and collectives). A host's one core runs
// compute and compression in turn, and the exchange cannot start before forward has ended, so a step
// takes at least max(compute + compression, forward + exchange): the floor, with forward timed alone
// (one thread, the same batch). The peer is PyTorch DDP over Gloo with the
// same buckets, dense, with its PowerSGD hook (rank 2) and with its fp16 hook, in the same shaped network. Each run
// trains 3 epochs of 5 steps; its figures are the median over the epochs after the first (which
// warms up). Each round runs every side once (overlapped, after backward, DDP), rounds alternating
// their order; the tables give medians over the `--rounds` rounds (3) and the median of the paired
// speed-ups. The peer's step is the median of 8 after 3 warm-up steps. Needs root (CAP_NET_ADMIN);
// finished runs are kept in <out>/results.jsonl and not run again.
// `--model lstm --text FILE` measures the LSTM language model instead (2 layers of 650, windows of
// 35 × 20 tokens of the file, learning rate 0.2, gradient clipping off: a clipped gradient is final only once every
// gradient is, so clipping leaves nothing to overlap); no DDP peer and no floor there.
//
//   sudo node bench/overlap.js [--bandwidths 1gbit,100mbit] [--exchanges dense,powersgd-r2,topk-10,dense-bf16,dense-fp16,powersgd-r2-bf16]
//        [--bucket-mb 25] [--rounds 3] [--model resnet18|lstm] [--text FILE] [--out DIR] [--fresh]
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { parseArgs } from 'node:util';
import { PYTHON, ROOT, fmt, formatTable, median, onShapedHosts, runLogged as run, ORACLES } from './common.js';
import { readMetrics } from '../lib/base/metrics.js';
import { Model } from '../lib/index.js';
import { parseBandwidth } from '../lib/cluster/cluster.js';
import { HOST_DEVICE, missingCapabilities } from '../lib/cluster/netns.js';

const EXCHANGES = {
  dense: ['--compressor', 'none'],
  'powersgd-r2': ['--compressor', 'powersgd', '--accordion', 'off', '--rank', '2'],
  'topk-10': ['--compressor', 'topk', '--accordion', 'off', '--topk-ratio', '0.1'],
  // Values sent in 16 bits (--comm-dtype), summed in fp32.
  'dense-bf16': ['--compressor', 'none', '--comm-dtype', 'bf16'],
  'dense-fp16': ['--compressor', 'none', '--comm-dtype', 'fp16'],
  'powersgd-r2-bf16': ['--compressor', 'powersgd', '--accordion', 'off', '--rank', '2', '--comm-dtype', 'bf16'],
};
// The engine's exchange and the DDP hook it is compared with (PyTorch 1.13's Gloo refuses a bf16
// all-reduce, so the bf16 exchanges have no peer).
const PEER_HOOK = { dense: 'none', 'powersgd-r2': 'powersgd', 'dense-fp16': 'fp16' };

const { values: opts } = parseArgs({
  options: {
    bandwidths: { type: 'string', default: '1gbit,100mbit' },
    exchanges: { type: 'string', default: Object.keys(EXCHANGES).join(',') },
    'bucket-mb': { type: 'string', default: '25' },
    rounds: { type: 'string', default: '3' },
    model: { type: 'string', default: 'resnet18' },
    text: { type: 'string' },
    out: { type: 'string', default: path.join(os.tmpdir(), 'accordion-overlap-bench') },
    fresh: { type: 'boolean', default: false },
  },
});
const bandwidths = opts.bandwidths.split(',').filter(Boolean);
bandwidths.forEach(parseBandwidth);
const exchanges = opts.exchanges.split(',').filter(Boolean);
for (const e of exchanges)
  if (!EXCHANGES[e]) {
    console.error(`bench/overlap.js: --exchanges: unknown exchange '${e}' (known: ${Object.keys(EXCHANGES).join(', ')})`);
    process.exit(2);
  }
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
const language = opts.model === 'lstm';
if (!language && opts.model !== 'resnet18') {
  console.error(`bench/overlap.js: --model: resnet18 or lstm, got '${opts.model}'`);
  process.exit(2);
}
if (language && !opts.text) {
  console.error('bench/overlap.js: --model lstm trains on a plain text file: give --text FILE');
  process.exit(2);
}
const BATCH = 64; // the training default: images per worker and step
const common = ['--threads', '1', '--checkpoint-every', '100', '--epochs', '3'];
const training = language
  ? ['--model', 'lstm', '--text', path.resolve(opts.text), '--batch-size', '20', '--bptt', '35', '--clip', '0', '--lr', '0.2', ...common]
  : ['--model', 'resnet18', '--dataset', 'synthetic', '--synthetic-train', '640', '--synthetic-test', '64', ...common];

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
    compression: per((e) => e.compressionSeconds),
    exchange: per((e) => e.compressionSeconds + e.communicationSeconds),
    wait: per((e) => e.exchangeWaitSeconds),
  };
}

/** ResNet-18's forward in training mode alone, one thread, one worker's batch: the median of 7 after 2. */
async function forwardSeconds() {
  const model = await Model.create({ architecture: 'resnet18', classes: 10, threads: 1 });
  const images = Float32Array.from({ length: BATCH * 3 * 32 * 32 }, (_, i) => Math.sin(i));
  const times = [];
  for (let i = 0; i < 9; i++) {
    const start = process.hrtime.bigint();
    await model.forward(images, { train: true });
    if (i >= 2) times.push(Number(process.hrtime.bigint() - start) / 1e9);
  }
  await model.dispose();
  return median(times);
}

/** PyTorch DDP over the same 2 shaped hosts: its median step. */
function ddpCell(bandwidth, hook) {
  return onShapedHosts(2, '10.88.0.0/24', parseBandwidth(bandwidth), async (network) => {
    const master = `${network.hosts[0].address}:29511`;
    const script = path.join(ORACLES, 'torch_ddp.py');
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
  });
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

const forward = language ? NaN : (await cell(['forward', BATCH], async () => ({ seconds: await forwardSeconds() }))).seconds;
for (const bandwidth of bandwidths) {
  fs.mkdirSync(path.join(opts.out, bandwidth), { recursive: true });
  const rows = [];
  for (const exchange of exchanges) {
    const hook = language ? undefined : PEER_HOOK[exchange];
    const sides = [
      ['overlapped', (round) => engineCell(bandwidth, exchange, bucketMb, round), [bandwidth, exchange, bucketMb]],
      ['after', (round) => engineCell(bandwidth, exchange, '0', round), [bandwidth, exchange, '0']],
      ...(hook ? [['ddp', () => ddpCell(bandwidth, hook), [bandwidth, 'ddp', hook, bucketMb]]] : []),
    ];
    const runs = Object.fromEntries(sides.map(([name]) => [name, []]));
    // Rounds rotate the sides' order, so that a drift of the machine's speed favours none of them.
    for (let round = 0; round < rounds; round++)
      for (let k = 0; k < sides.length; k++) {
        const [name, measure, key] = sides[(k + round) % sides.length];
        runs[name].push(await cell([...key, round], () => measure(round)));
      }
    const { overlapped, after, ddp } = runs;
    const compute = medianOf(after, 'compute'), alone = medianOf(after, 'exchange');
    const step = medianOf(overlapped, 'step');
    rows.push({
      exchange,
      overlapped: fmt(step, 2),
      after: fmt(medianOf(after, 'step'), 2),
      compute: fmt(compute, 2),
      alone: fmt(alone, 2),
      wait: fmt(medianOf(overlapped, 'wait'), 2),
      goal: fmt(step / Math.max(compute, alone), 2),
      floor: language ? '' : fmt(step / Math.max(compute + medianOf(after, 'compression'), forward + alone), 2),
      speedup: fmt(median(after.map((a, i) => a.step / overlapped[i].step)), 2),
      ddp: ddp ? fmt(medianOf(ddp, 'step'), 2) : '',
    });
  }
  const what = language ? `the LSTM on ${path.basename(opts.text)}` : 'ResNet-18';
  console.log(`\n${what}, 2 hosts × 1 core, ${bandwidth}, buckets closed at ${bucketMb} MiB (the first at 1 MiB): seconds per step, medians of ${rounds} runs${language ? '' : `; forward alone ${fmt(forward, 2)} s`}`);
  console.log(formatTable([
    { key: 'exchange', title: 'exchange', align: 'left' },
    { key: 'overlapped', title: 'overlapped' },
    { key: 'after', title: 'after backward' },
    { key: 'compute', title: 'compute alone' },
    { key: 'alone', title: 'exchange alone' },
    { key: 'wait', title: 'waited (overlapped)' },
    { key: 'goal', title: 'overlapped / max' },
    { key: 'floor', title: 'overlapped / floor' },
    { key: 'speedup', title: 'speed-up (paired)' },
    { key: 'ddp', title: 'PyTorch DDP (same hook)' },
  ], rows, { markdown: true }));
}
