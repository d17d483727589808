#!/usr/bin/env node
// `accordion plan`'s prediction against the simulated cluster: ResNet-18 trained over 2 and 4 hosts
// (`accordion cluster`, one worker and one thread each) at each bandwidth, dense, PowerSGD rank 2
// and TopK 10%, with the exchange overlapped with backward and after it. Per run, the seconds per
// step measured (the epochs after the first) beside the prediction of cluster/predict.ts from the
// same run's compute and compression seconds per step (measured under the same number of processes
// on this machine's cores), its forward's share of compute (timed alone on one thread), the shaped
// rate's TCP payload and one latency per number of hosts: the median of the latencies the link
// estimates measured in the overlapped runs (after backward, the per-step agreement that times the
// latency also waits for the slowest worker's backward, which the model leaves out by assuming no
// straggler). Needs root (CAP_NET_ADMIN).
// Finished runs are kept in <out>/results.jsonl and not run again (--fresh starts over).
//
//   sudo node bench/plan.js [--hosts 2,4] [--bandwidths 100mbit,1gbit] [--configs dense,powersgd-r2,topk-10]
//        [--modes overlapped,after-backward] [--out DIR] [--fresh] [-- extra training options]
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { parseArgs } from 'node:util';
import { ROOT, fmt, formatTable, median, runLogged } from './common.js';
import { readMetrics } from '../lib/base/metrics.js';
import { parseBandwidth } from '../lib/cluster/cluster.js';
import { missingCapabilities } from '../lib/cluster/netns.js';
import { predictStep } from '../lib/cluster/predict.js';
import { measureStepWork, modelLayout } from '../lib/cluster/step-work.js';
import { compressionSpec } from '../lib/config/compression.js';
import { resolveConfig } from '../lib/train/config.js';
import { parseTrainArgs } from '../lib/cli/args.js';
import { PAYLOAD_FRACTION } from '../lib/cli/plan.js';

const CONFIGS = {
  dense: ['--compressor', 'none'],
  'powersgd-r2': ['--compressor', 'powersgd', '--accordion', 'off', '--rank', '2'],
  'topk-10': ['--compressor', 'topk', '--accordion', 'off', '--topk-ratio', '0.1'],
};
const MODES = { overlapped: [], 'after-backward': ['--bucket-mb', '0'] };

const { values: opts, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    hosts: { type: 'string', default: '2,4' },
    bandwidths: { type: 'string', default: '100mbit,1gbit' },
    configs: { type: 'string', default: Object.keys(CONFIGS).join(',') },
    modes: { type: 'string', default: Object.keys(MODES).join(',') },
    out: { type: 'string', default: path.join(os.tmpdir(), 'accordion-plan-bench') },
    fresh: { type: 'boolean', default: false },
  },
});
const fail = (message) => {
  console.error(`bench/plan.js: ${message}`);
  process.exit(2);
};
const hostCounts = opts.hosts.split(',').map(Number);
const bandwidths = opts.bandwidths.split(',');
bandwidths.forEach((b) => parseBandwidth(b));
const configs = opts.configs.split(',');
for (const c of configs) if (!CONFIGS[c]) fail(`unknown config '${c}' (known: ${Object.keys(CONFIGS).join(', ')})`);
const modes = opts.modes.split(',');
for (const m of modes) if (!MODES[m]) fail(`unknown mode '${m}' (known: ${Object.keys(MODES).join(', ')})`);
if (missingCapabilities().length) fail('the simulated cluster needs root; run it with sudo');

const training = ['--model', 'resnet18', '--dataset', 'synthetic', '--synthetic-train', '640', '--synthetic-test', '64', '--batch-size', '32',
  '--epochs', '3', '--threads', '1', '--checkpoint-every', '100', '--quiet', ...positionals];
fs.mkdirSync(opts.out, { recursive: true });
const resultsFile = path.join(opts.out, 'results.jsonl');
const done = new Map(
  (!opts.fresh && fs.existsSync(resultsFile) ? fs.readFileSync(resultsFile, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l)) : []).map((r) => [r.key, r]),
);

/** One run over `hosts` hosts: per step, the epochs after the first, and the link's latency. */
async function measure(hosts, bandwidth, config, mode) {
  const dir = path.join(opts.out, `${hosts}h-${bandwidth}-${config}-${mode}`);
  fs.rmSync(dir, { recursive: true, force: true });
  const args = [path.join(ROOT, 'lib', 'cli.js'), 'cluster', '--hosts', String(hosts), '--bandwidth', bandwidth, '--',
    ...training, '--workers', String(hosts), ...CONFIGS[config], ...MODES[mode], '--out', dir];
  const { code } = await runLogged(process.execPath, args, `${dir}.log`);
  if (code !== 0) throw new Error(`${hosts} hosts ${bandwidth} ${config} ${mode} failed (exit ${code}); see ${dir}.log`);
  const epochs = readMetrics(path.join(dir, 'metrics.jsonl')).filter((e) => e.event === 'epoch').slice(1);
  const perStep = (key) => epochs.reduce((a, e) => a + e[key], 0) / epochs.reduce((a, e) => a + e.steps, 0);
  return {
    stepSeconds: perStep('seconds'),
    computeSeconds: perStep('computeSeconds'),
    compressionSeconds: perStep('compressionSeconds'),
    communicationSeconds: perStep('communicationSeconds'),
    latencySeconds: median(epochs.map((e) => e.link.latencySeconds)),
  };
}

const config = resolveConfig(parseTrainArgs(training));
const layout = await modelLayout(config, 0);
// Forward's share of a step, timed alone on one thread (as every worker runs here).
const alone = (await measureStepWork({ ...config, threads: 1 }, [0], { vocabulary: 0 })).work.get(0);
const forwardShare = alone.forwardSeconds / alone.computeSeconds;

const cells = hostCounts.flatMap((hosts) => bandwidths.flatMap((bandwidth) => configs.flatMap((name) => modes.map((mode) => ({ hosts, bandwidth, name, mode })))));
const keyOf = (c) => JSON.stringify([c.hosts, c.bandwidth, c.name, c.mode, training]);
for (const c of cells) {
  if (done.has(keyOf(c))) continue;
  process.stderr.write(`${c.hosts} hosts ${c.bandwidth} ${c.name} ${c.mode} … `);
  const started = Date.now();
  const result = { key: keyOf(c), ...(await measure(c.hosts, c.bandwidth, c.name, c.mode)) };
  fs.appendFileSync(resultsFile, JSON.stringify(result) + '\n');
  done.set(result.key, result);
  process.stderr.write(`${Math.round((Date.now() - started) / 1000)} s\n`);
}

const latencyOf = (hosts) => median(cells.filter((c) => c.hosts === hosts && c.mode === 'overlapped').map((c) => done.get(keyOf(c)).latencySeconds));
const rows = cells.map((c) => {
  const m = done.get(keyOf(c));
  const run = resolveConfig(parseTrainArgs([...training, ...CONFIGS[c.name], ...MODES[c.mode]]));
  const spec = compressionSpec(run);
  const level = spec.kind === 'none' ? 0 : spec.reference;
  const link = { bytesPerSecond: (parseBandwidth(c.bandwidth) / 8) * PAYLOAD_FRACTION, latencySeconds: latencyOf(c.hosts) };
  const work = { computeSeconds: m.computeSeconds, forwardSeconds: forwardShare * m.computeSeconds, compressionSeconds: m.compressionSeconds, broadcastFloats: layout.broadcastFloats };
  const p = predictStep({ shapes: layout.shapes, spec, level, commDtype: 'fp32', bucketBytes: run.bucketMb * 2 ** 20 }, work, c.hosts, link, 'ring');
  const predicted = c.mode === 'overlapped' ? p.overlappedSeconds : p.afterBackwardSeconds;
  return { hosts: c.hosts, bandwidth: c.bandwidth, config: c.name, mode: c.mode, measured: m.stepSeconds, predicted, ratio: predicted / m.stepSeconds, compute: m.computeSeconds, compression: m.compressionSeconds, latency: link.latencySeconds };
});

console.log(`# ResNet-18, batch 32, one worker and thread per host; forward ${fmt(100 * forwardShare, 0)}% of a step's compute (timed alone)\n`);
console.log(
  formatTable(
    [
      { key: 'hosts', title: 'hosts' },
      { key: 'bandwidth', title: 'link', align: 'left' },
      { key: 'config', title: 'exchange', align: 'left' },
      { key: 'mode', title: 'mode', align: 'left' },
      { key: 'compute', title: 'compute s' },
      { key: 'compression', title: 'compression s' },
      { key: 'latency', title: 'latency ms' },
      { key: 'measured', title: 'measured s/step' },
      { key: 'predicted', title: 'predicted s/step' },
      { key: 'ratio', title: 'predicted/measured' },
    ],
    rows.map((r) => ({ ...r, compute: fmt(r.compute, 2), compression: fmt(r.compression, 3), latency: fmt(1000 * r.latency, 2), measured: fmt(r.measured, 2), predicted: fmt(r.predicted, 2), ratio: fmt(r.ratio, 3) })),
    { markdown: true },
  ),
);
const within = rows.filter((r) => Math.abs(r.ratio - 1) <= 0.15).length;
console.log(`\n${within} of ${rows.length} predictions within 15% of the measured step; results: ${resultsFile}`);
