/**
 * A run's configuration resolved from what the caller gave: the preset's and the table's defaults
 * filled in, every value checked against its option's bounds, the options checked against each
 * other, and `accordion: 'auto'` decided.
 */
import { UsageError } from '../base/errors.js';
import { ARCHITECTURES, DEFAULT_CONFIG, OPTIONS, OPTION_KEYS, boundMessage, meetsBound, presetFor, presetValues, type TrainConfig } from '../config/options.js';
import { compressionSpec } from '../config/compression.js';
import { parseDevice } from '../native/device.js';
import { checkMemory } from './memory.js';
import * as os from 'node:os';

/** Options the caller gives: any subset of the configuration, with the model. */
export type TrainOptions = Partial<TrainConfig> & { model: TrainConfig['model'] };

/** Settings that must match between a checkpoint and the run that resumes it. */
export const RESUME_MUST_MATCH: (keyof TrainConfig)[] = ['model', 'width', 'dataset', 'trainImages', 'batchSize', 'seed', 'compressor', 'accordion', 'adapt'];

/** Modes that grow the global batch by micro-batches, which must then be whole. */
export const BATCH_MODES: TrainConfig['adapt'][] = ['batch', 'smith', 'batch+compression'];

/** The configuration of a run: defaults, presets, bounds and the options' agreement. */
export function resolveConfig(options: TrainOptions): TrainConfig {
  if (typeof options !== 'object' || options === null) throw new UsageError('Trainer.create: options must be an object');
  if (!ARCHITECTURES.includes(options.model)) throw new UsageError(boundMessage('option --model', OPTIONS.model, options.model));
  for (const key of Object.keys(options))
    if (!(key in OPTIONS)) throw new UsageError(`unknown option '${key}' (the options are: ${OPTION_KEYS.join(', ')})`);
  const preset = presetFor(options.model, options.dataset);
  const given = Object.fromEntries(Object.entries(options).filter(([, v]) => v !== undefined)) as TrainOptions;
  const config: TrainConfig = { ...structuredClone(DEFAULT_CONFIG), ...(preset ? presetValues(preset) : {}), ...given };
  checkBounds(config);
  checkAgreement(config, options);
  if (config.accordion === 'auto') {
    const regimeModes = config.adapt === 'auto' || config.adapt === 'batch+compression';
    const staticLevel = options.rank !== undefined || options.topkRatio !== undefined;
    config.accordion = regimeModes || (config.adapt === 'compression' && config.compressor !== 'none' && !staticLevel) ? 'on' : 'off';
  }
  if (config.accordion === 'on' && !['compression', 'auto', 'batch+compression'].includes(config.adapt))
    throw new UsageError(`--adapt ${config.adapt} adapts the batch size; per-layer compression (--accordion on) goes with --adapt compression, auto or batch+compression`);
  if (config.accordion === 'on' && config.compressor === 'none') throw new UsageError('--accordion on needs a compressor (--compressor powersgd or topk)');
  // With --adapt auto, --rank and --topk-ratio name the reference level of the error budget.
  if (config.accordion === 'on' && config.adapt !== 'auto' && (options.rank !== undefined || options.topkRatio !== undefined))
    throw new UsageError('--rank and --topk-ratio set a static level; with --accordion on use --low-rank/--high-rank or --low-ratio/--high-ratio');
  compressionSpec(config);
  checkMemory(config, os.totalmem());
  return config;
}

/** Every value against its option's type and bounds. */
function checkBounds(c: TrainConfig): void {
  for (const key of OPTION_KEYS) {
    const value = c[key];
    if (value === undefined) continue;
    if (!meetsBound(OPTIONS[key], value)) throw new UsageError(boundMessage(`option ${OPTIONS[key].flag}`, OPTIONS[key], value));
  }
  parseDevice(c.device, 'option --device');
  if (c.batchHigh < c.batchLow) throw new UsageError(`option --batch-high: ${c.batchHigh} must be at least --batch-low ${c.batchLow}`);
  if (c.replanFactor > 0 && c.replanFactor <= 1) throw new UsageError(`option --replan-factor: 0 (plan at the checks only) or a factor above 1, got ${c.replanFactor}`);
  if (c.dataset !== 'synthetic' && !c.dataDir) throw new UsageError(`dataset ${c.dataset} needs --data DIR`);
}

/** The options that depend on each other. */
function checkAgreement(config: TrainConfig, options: TrainOptions): void {
  if ((config.model === 'lstm') !== (config.dataset === 'wikitext2'))
    throw new UsageError(config.model === 'lstm' ? `the lstm model trains on --dataset wikitext2, not ${config.dataset}` : `--dataset wikitext2 is for --model lstm`);
  if (config.model === 'lstm' && config.width !== 1) throw new UsageError(`option --width: ${config.width} scales the channels of resnet18 and vgg19bn; the lstm's size is --hidden`);
  if (config.model === 'lstm' && config.trainImages !== undefined) throw new UsageError('option --train-images is for the image datasets, not the lstm');
  if (config.model === 'lstm' && config.adapt !== 'compression' && config.adapt !== 'auto')
    throw new UsageError(`batch-size adaptation (--adapt ${config.adapt}) is for the vision models`);
  // Automatic levels and the joint mode run on Accordion's regimes.
  const regimeModes = config.adapt === 'auto' || config.adapt === 'batch+compression';
  if (regimeModes && config.compressor === 'none') throw new UsageError(`--adapt ${config.adapt} needs a compressor (--compressor powersgd or topk)`);
  if (config.compressAfter > 0 && config.compressor === 'none') throw new UsageError('--compress-after needs a compressor (--compressor powersgd or topk)');
  if (config.commDtype !== 'fp32' && config.device !== 'cpu')
    throw new UsageError(`--comm-dtype ${config.commDtype} runs on the CPU only: on ${config.device} the exchange sends fp32 (leave out --comm-dtype)`);
  if (regimeModes && options.accordion === 'off') throw new UsageError(`--adapt ${config.adapt} runs on Accordion's regimes: leave out --accordion off`);
}

/** With the job's size known: the worker count agrees, and a grown batch is whole micro-batches. */
export function checkJob(config: TrainConfig, options: TrainOptions, worldSize: number): void {
  if (options.workers !== undefined && options.workers !== worldSize)
    throw new UsageError(
      worldSize === 1
        ? `--workers ${options.workers} starts ${options.workers} processes only through the launcher: use npm run train -- --workers ${options.workers} … or accordion launch`
        : `--workers ${options.workers} does not match the job's WORLD_SIZE ${worldSize}`,
    );
  config.workers = worldSize;
  if (BATCH_MODES.includes(config.adapt))
    for (const key of ['batchLow', 'batchHigh'] as const)
      if (config[key] % (config.batchSize * worldSize) !== 0)
        throw new UsageError(
          `${key} ${config[key]} must be a multiple of batchSize × workers = ${config.batchSize * worldSize} (a step accumulates whole micro-batches)`,
        );
}

/** The configuration as a run directory's config.json and a checkpoint keep it: without the per-invocation options. */
export function savedConfig(config: TrainConfig): Record<string, unknown> {
  const { resume: _resume, progress: _progress, overwrite: _overwrite, ...kept } = config;
  return kept;
}
