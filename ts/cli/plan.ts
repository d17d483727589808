/**
 * `accordion plan`: seconds per step predicted for a training run on a cluster of 2 to 1,024 workers,
 * dense and at each compression level, with the exchange after backward and overlapped with it
 * (cluster/predict.ts), from the run's parameter shapes and its compute and compression times
 * (measured here, or given).
 */
import { DataError, UsageError } from '../base/errors.js';
import { formatRate } from '../base/units.js';
import { compressionSpec, describeLevel } from '../config/compression.js';
import { parseBandwidth, parseLatency } from '../cluster/cluster.js';
import { predictStep, type PlanRow, type StepWork } from '../cluster/predict.js';
import type { Link } from '../train/link.js';
import { measureStepWork, modelLayout } from '../cluster/step-work.js';
import { writeFileAtomicAsync } from '../base/files.js';
import { renderPlanChart } from '../report/plan-chart.js';
import { resolveConfig } from '../train/config.js';
import { parseTrainArgs } from './args.js';
import { parseWrapperArgs, wrapperHelp, type CommandOptions } from './wrapper-args.js';

/** TCP's payload in a full Ethernet frame with timestamps: 1,448 of 1,514 bytes. */
export const PAYLOAD_FRACTION = 1448 / 1514;

export const PLAN_OPTIONS = {
  workers: { flag: '--workers', type: 'ints', min: 2, nonEmpty: true, default: [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024], help: 'worker counts to predict' },
  bandwidth: { flag: '--bandwidth', type: 'string', value: 'RATE', default: '1gbit', help: "each worker's link: bit, kbit, mbit, gbit (payload: 1448/1514 of it)" },
  latency: { flag: '--latency', type: 'string', value: 'TIME', default: '50us', help: 'seconds of a message that carries nothing: us, ms, s' },
  algorithm: { flag: '--algorithm', type: 'string', choices: ['ring', 'tree'], default: 'ring', help: "the all-reduce's algorithm: a ring (Gloo, NCCL's ring) or a pipelined binary tree (NCCL's trees)" },
  levels: { flag: '--levels', type: 'numbers', above: 0, help: 'levels to predict besides dense: PowerSGD ranks or TopK ratios (default: --auto-ranks or --auto-ratios and the reference)' },
  computeSeconds: { flag: '--compute-seconds', type: 'number', value: 'S', above: 0, help: "a step's forward, backward and update, instead of measuring it here" },
  forwardSeconds: { flag: '--forward-seconds', type: 'number', value: 'S', above: 0, help: 'its forward alone (with --compute-seconds)' },
  compressionSeconds: { flag: '--compression-seconds', type: 'numbers', min: 0, help: "each level's compression kernels per step, in --levels' order (with --compute-seconds)" },
  vocabulary: { flag: '--vocabulary', type: 'int', min: 1, default: 33278, help: "lstm: the vocabulary's size" },
  json: { flag: '--json', type: 'string', value: 'FILE', help: 'write the prediction as JSON' },
  html: { flag: '--html', type: 'string', value: 'FILE', help: 'write a chart of seconds per step against workers' },
} as const satisfies CommandOptions;

const ABOUT = [
  'Predicts seconds per step on a cluster: α-β models of the collectives the exchange runs (all-reduce',
  "by ring or tree, TopK's all-gather by ring, the statistics' broadcast by binomial tree) over the",
  "run's parameter shapes, dense and at each level, with the exchange after backward and overlapped",
  "with it. The compute and compression terms are measured here on the training options' model and",
  'batch (or given). Assumed: every link alike and full duplex, no straggler, collectives back to back.',
];

export async function planCommand(argv: string[]): Promise<number> {
  const own = parseWrapperArgs('plan', argv, PLAN_OPTIONS);
  if (!own) {
    process.stdout.write(wrapperHelp('plan', ABOUT, PLAN_OPTIONS, '--bandwidth 10gbit --latency 20us -- --model resnet18 --compressor powersgd') + '\n');
    return 0;
  }
  const { values: o, trainArgs } = own;
  const config = resolveConfig(parseTrainArgs(trainArgs) as Parameters<typeof resolveConfig>[0]);
  const spec = compressionSpec(config);
  const { workers, algorithm, vocabulary } = o;
  const link: Link = { bytesPerSecond: (parseBandwidth(o.bandwidth) / 8) * PAYLOAD_FRACTION, latencySeconds: parseLatency(o.latency) };
  const compressed = spec.kind === 'none' ? [] : (o.levels ?? spec.candidates.filter((l) => l > 0));
  const levels = [0, ...compressed];

  let shapes: number[][];
  let work: Map<number, StepWork>;
  const computeGiven = o.computeSeconds !== undefined;
  if (o.computeSeconds !== undefined) {
    const layout = await modelLayout(config, vocabulary);
    shapes = layout.shapes;
    if (o.forwardSeconds === undefined) throw new UsageError('option --forward-seconds: give it with --compute-seconds');
    const kernels = o.compressionSeconds ?? [];
    if (kernels.length !== compressed.length)
      throw new UsageError(`option --compression-seconds: one per level of ${compressed.join(', ') || '(none)'}, got ${kernels.length}`);
    const base = { computeSeconds: o.computeSeconds, forwardSeconds: o.forwardSeconds, broadcastFloats: layout.broadcastFloats };
    work = new Map(levels.map((level, k) => [level, { ...base, compressionSeconds: k === 0 ? 0 : kernels[k - 1]! }]));
  } else {
    process.stderr.write(`accordion plan: measuring ${config.model}'s step at batch ${config.batchSize} on this machine…\n`);
    ({ shapes, work } = await measureStepWork(config, levels, { vocabulary }));
  }

  const bucketBytes = config.bucketMb * 2 ** 20;
  const rows: PlanRow[] = workers.map((w) => ({
    workers: w,
    levels: levels.map((level) => ({ level, prediction: predictStep({ shapes, spec, level, commDtype: config.commDtype, bucketBytes }, work.get(level)!, w, link, algorithm) })),
  }));

  const name = (level: number) => describeLevel(spec.kind, level);
  const w0 = work.get(0)!;
  const out: string[] = [
    `${config.model}, batch ${config.batchSize} per worker, values sent in ${config.commDtype}; each worker's link ${formatRate(8 * link.bytesPerSecond / PAYLOAD_FRACTION)} ` +
      `(${formatRate(8 * link.bytesPerSecond)} of payload), latency ${+(link.latencySeconds * 1e6).toPrecision(4)} µs; all-reduce by ${algorithm}`,
    `compute ${w0.computeSeconds.toFixed(3)} s per step (forward ${w0.forwardSeconds.toFixed(3)} s), ${computeGiven ? 'given' : 'measured here'}; ` +
      `compression ${levels.slice(1).map((l) => `${name(l)} ${(work.get(l)!.compressionSeconds * 1000).toFixed(1)} ms`).join(', ') || 'none'}`,
    '',
    table(
      ['workers', ...levels.map((l) => `${name(l)} (s/step)`), ...levels.slice(1).map((l) => `dense ÷ ${name(l)}`)],
      rows.map((r) => {
        const dense = r.levels[0]!.prediction.overlappedSeconds;
        return [String(r.workers), ...r.levels.map((x) => `${x.prediction.overlappedSeconds.toFixed(3)} (${x.prediction.afterBackwardSeconds.toFixed(3)})`), ...r.levels.slice(1).map((x) => `${(dense / x.prediction.overlappedSeconds).toFixed(2)}×`)];
      }),
    ),
    '',
    'Each cell: seconds per step with the exchange overlapped with backward (after backward in brackets).',
  ];
  process.stdout.write(out.join('\n') + '\n');
  const result = { model: config.model, batchSize: config.batchSize, commDtype: config.commDtype, compressor: spec.kind, algorithm, link, work: Object.fromEntries(work), rows };
  if (o.json) await writeFileAtomicAsync(o.json, [JSON.stringify(result, null, 2) + '\n'], DataError);
  if (o.html) await writeFileAtomicAsync(o.html, [renderPlanChart(`${config.model}: seconds per step against workers (${formatRate(8 * link.bytesPerSecond / PAYLOAD_FRACTION)}, ${algorithm})`, rows, name)], DataError);
  return 0;
}

/** Columns padded to their widest cell, the first left-aligned. */
function table(header: string[], rows: string[][]): string {
  const widths = header.map((h, c) => Math.max(h.length, ...rows.map((r) => r[c]!.length)));
  const line = (cells: string[]) => cells.map((cell, c) => (c === 0 ? cell.padEnd(widths[c]!) : cell.padStart(widths[c]!))).join('  ');
  return [line(header), line(widths.map((w) => '-'.repeat(w))), ...rows.map(line)].join('\n');
}
