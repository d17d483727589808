/**
 * A run's configuration resolved from what the caller gave: the preset's and the table's defaults
 * filled in, every value checked against its option's bounds, the options checked against each
 * other, and `accordion: 'auto'` decided.
 */
import { UsageError } from '../base/errors.js';
import { ARCHITECTURES, DEFAULT_CONFIG, OPTIONS, OPTION_KEYS, boundMessage, defaultFor, meetsBound, presetFor, presetValues, type TrainConfig } from '../config/options.js';
import { compressionSpec } from '../config/compression.js';
import { parseDevice } from '../native/device.js';
import { savedRunConfig } from './checkpoint.js';
import { checkMemory } from './memory.js';
import * as os from 'node:os';

/** Options the caller gives: any subset of the configuration, with the model, or with the run to resume (which knows its model). */
export type TrainOptions = Partial<TrainConfig> & ({ model: TrainConfig['model'] } | { resume: string });

/**
 * What a resumed run may set anew: how long it trains (the schedule's end), how many workers and
 * threads it has, its timeouts, its output, checkpoints and evaluations, where the data and the
 * device are (and whether that GPU uses TF32 and which layout: a run resumed on the CPU leaves TF32
 * off and its activations channels-last).
 * Every other option is the run's own; given again, it must have the run's value.
 */
export const RESUME_MAY_CHANGE: readonly (keyof TrainConfig)[] = [
  'epochs', 'workers', 'threads', 'timeoutMs', 'progress', 'outDir', 'resume', 'overwrite', 'checkpointEvery', 'evalsPerEpoch', 'testImages', 'dataDir', 'device', 'tf32', 'memoryFormat',
];

/** Options that belong to one invocation, never taken from the run being resumed (the job sets the workers). */
const NOT_INHERITED: readonly string[] = ['workers', 'outDir', 'resume', 'overwrite', 'progress'];

/**
 * The options of a resumed run (`options.resume` set): the run's own configuration, from its last
 * checkpoint, with the given values of what a resume may change. A given value of any other option
 * that differs from the run's is refused, naming both (an option the checkpoint predates has its
 * default there).
 */
export function resumedOptions<T extends Partial<TrainConfig>>(options: T): T & Partial<TrainConfig> {
  const { dir, config: saved } = savedRunConfig(options.resume!);
  for (const [key, value] of Object.entries(options)) {
    if (value === undefined || !(key in OPTIONS) || RESUME_MAY_CHANGE.includes(key as keyof TrainConfig)) continue;
    const spec = OPTIONS[key as keyof TrainConfig];
    const was = key in saved ? saved[key] : spec.default;
    if (JSON.stringify(was) !== JSON.stringify(value))
      throw new UsageError(
        `cannot resume from ${dir}: it was trained with ${key} = ${JSON.stringify(was)}, this run gives ${JSON.stringify(value)} (${spec.flag}); ` +
          `a resume takes the run's own settings, and may change only ${RESUME_MAY_CHANGE.map((k) => OPTIONS[k].flag).join(', ')}`,
      );
  }
  // Values the run took by default stay defaults, so that the checks of what was given (a static
  // --rank against --accordion on) read the resumed run as they read the run itself.
  const preset = presetFor(saved.model as TrainConfig['model'], saved.dataset as TrainConfig['dataset']);
  const inherited = Object.fromEntries(
    Object.entries(saved).filter(
      ([key, value]) => key in OPTIONS && !NOT_INHERITED.includes(key) && JSON.stringify(value) !== JSON.stringify(defaultFor(key as keyof TrainConfig, preset)),
    ),
  );
  const resumed = { ...inherited, ...options } as T & Partial<TrainConfig>;
  // TF32 and channels-first activations are a GPU's: a run resumed on the CPU leaves TF32 off and
  // the layout to the CPU's (given there, either is refused).
  if (options.tf32 === undefined && (resumed.device ?? 'cpu') === 'cpu') delete resumed.tf32;
  if (options.memoryFormat === undefined && (resumed.device ?? 'cpu') === 'cpu') delete resumed.memoryFormat;
  return resumed;
}

/** Modes that grow the global batch by micro-batches, which must then be whole. */
export const BATCH_MODES: TrainConfig['adapt'][] = ['batch', 'smith', 'batch+compression'];

/** The configuration of a run: defaults, presets, bounds and the options' agreement. */
export function resolveConfig(options: Partial<TrainConfig>): TrainConfig {
  if (typeof options !== 'object' || options === null) throw new UsageError('Trainer.create: options must be an object');
  const model = options.model;
  if (model === undefined || !ARCHITECTURES.includes(model)) throw new UsageError(boundMessage('option --model', OPTIONS.model, model));
  for (const key of Object.keys(options))
    if (!(key in OPTIONS)) throw new UsageError(`unknown option '${key}' (the options are: ${OPTION_KEYS.join(', ')})`);
  const preset = presetFor(model, options.dataset);
  const given = Object.fromEntries(Object.entries(options).filter(([, v]) => v !== undefined)) as Partial<TrainConfig> & { model: TrainConfig['model'] };
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
function checkAgreement(config: TrainConfig, options: Partial<TrainConfig>): void {
  if ((config.model === 'lstm') !== (config.dataset === 'wikitext2'))
    throw new UsageError(config.model === 'lstm' ? `the lstm model trains on --dataset wikitext2, not ${config.dataset}` : `--dataset wikitext2 is for --model lstm`);
  if (config.model === 'lstm' && config.width !== 1) throw new UsageError(`option --width: ${config.width} scales the channels of resnet18 and vgg19bn; the lstm's size is --hidden`);
  for (const [key, flag] of [['trainImages', '--train-images'], ['testImages', '--test-images']] as const)
    if (config.model === 'lstm' && config[key] !== undefined) throw new UsageError(`option ${flag} is for the image datasets, not the lstm`);
  if (config.model === 'lstm' && config.evalsPerEpoch > 1)
    throw new UsageError(`option --evals-per-epoch: the lstm evaluates once an epoch (an evaluation resets the hidden state its training carries), got ${config.evalsPerEpoch}`);
  if (config.model === 'lstm' && config.adapt !== 'compression' && config.adapt !== 'auto')
    throw new UsageError(`batch-size adaptation (--adapt ${config.adapt}) is for the vision models`);
  // Automatic levels and the joint mode run on Accordion's regimes.
  const regimeModes = config.adapt === 'auto' || config.adapt === 'batch+compression';
  if (regimeModes && config.compressor === 'none') throw new UsageError(`--adapt ${config.adapt} needs a compressor (--compressor powersgd or topk)`);
  if (config.compressAfter > 0 && config.compressor === 'none') throw new UsageError('--compress-after needs a compressor (--compressor powersgd or topk)');
  if (options.tf32 === true && config.device === 'cpu')
    throw new UsageError('--tf32 is a GPU\'s tensor-core format; the CPU computes fp32 in full (leave out --tf32, or train with --device cuda)');
  if (config.memoryFormat === 'channels-first' && config.device === 'cpu')
    throw new UsageError('--memory-format channels-first is for a GPU; the CPU keeps activations channels-last (leave out --memory-format, or train with --device cuda)');
  if (config.commDtype !== 'fp32' && config.device !== 'cpu')
    throw new UsageError(`--comm-dtype ${config.commDtype} runs on the CPU only: on ${config.device} the exchange sends fp32 (leave out --comm-dtype)`);
  // The rate's answer to a grown batch is batch-size mode's alone.
  const growthRate = config.batchRamp > 0 ? '--batch-ramp' : config.batchRateScaling === 'none' ? '--batch-rate-scaling' : undefined;
  if (growthRate && config.adapt !== 'batch' && config.adapt !== 'batch+compression')
    throw new UsageError(`option ${growthRate} sets the rate after batch-size mode grows the batch: it needs --adapt batch or batch+compression, not ${config.adapt}`);
  if (config.batchRamp > 0 && config.batchRateScaling === 'none')
    throw new UsageError('option --batch-ramp ramps a rate scaled with the batch: leave it out with --batch-rate-scaling none');
  if (regimeModes && options.accordion === 'off') throw new UsageError(`--adapt ${config.adapt} runs on Accordion's regimes: leave out --accordion off`);
}

/** With the job's size known: the worker count agrees, and a grown batch is whole micro-batches. */
export function checkJob(config: TrainConfig, options: Partial<TrainConfig>, worldSize: number): void {
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
