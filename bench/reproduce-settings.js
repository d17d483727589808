// The settings of bench/reproduce.js: for each, the model and data, the two levels (or batch sizes)
// the paper compares and its figures, the runs that compare them, and the `accordion train`
// arguments of each run, with the paper's schedule shape scaled to the run's length.
import * as path from 'node:path';
import { ROOT } from './common.js';

export const WORKERS = 4;
export const FASHION_MNIST = '/usr/share/datasets/fashion-mnist';
export const SHAKESPEARE = path.join(ROOT, 'test', 'fixtures', 'tinyshakespeare.txt');

/**
 * The image workload, chosen from static runs alone before any Accordion run (bench/results/reproduce.md,
 * 2026-11-28): width 0.125, the first 12,800 Fashion-MNIST training images, 30 epochs, 32 images per
 * worker (global 128, 100 steps an epoch).
 */
const IMAGES = { width: 0.125, trainImages: 12_800, epochs: 30, batchSize: 32 };

/**
 * kind 'compression' and 'language': low and high are compression levels (a PowerSGD rank, a TopK
 * ratio); kind 'batch': global batch sizes. `paper`: the paper's figures (accuracy in %, perplexity
 * for the LSTM; `floatsFactor`: the adaptive run's floats over static low's).
 */
export const SETTINGS = {
  'resnet18-powersgd': {
    kind: 'compression', model: 'resnet18', compressor: 'powersgd', low: 2, high: 1, ...IMAGES,
    paper: { low: 94.5, high: 94.1, accordion: 94.5, floatsFactor: 0.65, source: 'Table 1, ResNet-18 on CIFAR-10' },
  },
  'vgg19bn-powersgd': {
    kind: 'compression', model: 'vgg19bn', compressor: 'powersgd', low: 4, high: 1, ...IMAGES,
    paper: { low: 93.4, high: 68.6, accordion: 92.9, floatsFactor: 0.44, source: 'Table 1, VGG-19bn on CIFAR-10' },
  },
};

/** The smoke mode: the same commands on a sliver of the data, whose figures are not quoted. */
export const QUICK = { trainImages: 512, epochs: 3, batchSize: 16 };

const LEVEL_FLAGS = { powersgd: ['--rank', '--low-rank', '--high-rank'], topk: ['--topk-ratio', '--low-ratio', '--high-ratio'] };

/** Per kind, the runs of a setting and the arguments that make each one. */
const CONFIGS_BY_KIND = {
  compression: {
    low: (s) => [LEVEL_FLAGS[s.compressor][0], String(s.low)],
    high: (s) => [LEVEL_FLAGS[s.compressor][0], String(s.high)],
    accordion: (s) => [LEVEL_FLAGS[s.compressor][1], String(s.low), LEVEL_FLAGS[s.compressor][2], String(s.high)],
    equal: (s) => [LEVEL_FLAGS[s.compressor][1], String(s.low), LEVEL_FLAGS[s.compressor][2], String(s.low)],
  },
};

/** The runs a setting offers, by name: each a function of the setting giving its own arguments. */
export const configsOf = (s) => CONFIGS_BY_KIND[s.kind];

/** What each run is called in reports. */
export const TITLES = { low: 'static low', high: 'static high', accordion: 'Accordion', equal: 'Accordion, both levels low' };

/** A setting as it runs: the table's values, replaced by the quick mode's or by the command line's. */
export function resolveSetting(name, overrides = {}) {
  const base = SETTINGS[name];
  if (!base) throw new Error(`unknown setting '${name}' (known: ${Object.keys(SETTINGS).join(', ')})`);
  const given = Object.fromEntries(Object.entries(overrides).filter(([k, v]) => k !== 'quick' && v !== undefined));
  const s = { name, ...base, ...(overrides.quick ? QUICK : {}), ...given };
  s.quick = Boolean(overrides.quick);
  s.tag = `w${s.width}-n${s.trainImages}-e${s.epochs}-b${s.batchSize}${s.quick ? '-quick' : ''}`;
  return s;
}

/**
 * The paper's schedule shape for a run of E epochs: lr 0.1 × global batch / 128 after a 5-epoch
 * warm-up from a worker's share, ÷10 from 50% and from 83% of the run, Accordion's check every 1/30
 * of the run (at least every epoch). The engine's milestone m takes effect from epoch m + 3
 * (counting from 1), so the milestones are the decay epochs less 3.
 */
export function scheduleArgs(s) {
  const globalBatch = s.batchSize * WORKERS;
  const peak = (0.1 * globalBatch) / 128;
  const decays = [Math.round(0.5 * s.epochs), Math.round((5 / 6) * s.epochs)].map((done) => Math.max(0, done + 1 - 3));
  return [
    '--lr', String(peak / WORKERS), '--warmup-epochs', String(Math.min(5, s.epochs)), '--milestones', decays.join(','),
    '--accordion-interval', String(Math.max(1, Math.floor(s.epochs / 30))),
  ];
}

/** The `accordion train` arguments of one run (without --out). */
export function trainArgs(s, config, seed, dataDir) {
  return [
    '--model', s.model, '--width', String(s.width), '--dataset', 'fashion-mnist', '--data', dataDir, '--train-images', String(s.trainImages),
    '--epochs', String(s.epochs), '--workers', String(WORKERS), '--batch-size', String(s.batchSize), '--threads', '1',
    '--compressor', s.compressor, ...configsOf(s)[config](s), ...scheduleArgs(s), '--seed', String(seed), '--quiet',
  ];
}
