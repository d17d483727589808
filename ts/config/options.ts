/**
 * Every training option, written once: its name in the library and in config files, its command-line
 * flag, type, default, the presets' values, bounds and help text. The command line's parser and help,
 * the config-file reader, Trainer.create's and Model.create's defaults and checks, and a run's
 * config.json all come from this table.
 */
export type Architecture = 'resnet18' | 'vgg19bn' | 'lstm';
export const ARCHITECTURES: readonly Architecture[] = ['resnet18', 'vgg19bn', 'lstm'];
export type CompressorName = 'none' | 'powersgd' | 'topk';
/** The precision of convolutions and matrix products (parameters, gradients and updates stay fp32). */
export type ComputePrecision = 'fp32' | 'bf16';
/** The precision gradients, PowerSGD's P and Q, and TopK's values travel in (sums stay in fp32). */
export type CommDtype = 'fp32' | 'bf16' | 'fp16';
export type DatasetName = 'synthetic' | 'cifar10' | 'cifar100' | 'fashion-mnist' | 'mnist' | 'wikitext2';
export type AdaptMode = 'compression' | 'batch' | 'smith' | 'auto' | 'batch+compression';
/** A layer's error in automatic levels' budget: squared ‖G − C(G)‖², or relative ‖G − C(G)‖ / ‖G‖. */
export type ErrorMeasure = 'squared' | 'relative';
/** How a GPU stores activations: channels-last (NHWC), channels-first (NCHW), or auto (NHWC in bf16, NCHW in fp32). */
export type MemoryFormat = 'auto' | 'channels-last' | 'channels-first';
/** 'cpu', 'cuda' (GPU 0) or 'cuda:N'. */
export type DeviceName = 'cpu' | 'cuda' | `cuda:${number}`;

/** A run's configuration: every option of the table below (see each one's help for its meaning). */
export interface TrainConfig {
  model: Architecture;
  width: number;
  precision: ComputePrecision;
  device: DeviceName;
  convAlgorithms: 'fastest' | 'accurate';
  tf32: boolean;
  memoryFormat: MemoryFormat;
  distBackend: 'nccl' | 'gloo';
  dataset: DatasetName;
  dataDir?: string;
  trainImages?: number;
  testImages?: number;
  epochs: number;
  batchSize: number;
  evalBatchSize: number;
  evalsPerEpoch: number;
  lr: number;
  momentum: number;
  weightDecay: number;
  nesterov: boolean;
  warmupEpochs: number;
  milestones: number[];
  lrDecay: number;
  seed: number;
  workers: number;
  compressor: CompressorName;
  rank: number;
  topkRatio: number;
  compressAfter: number;
  minCompressionRate: number;
  compressionSeed: number;
  commDtype: CommDtype;
  accordion: 'auto' | 'on' | 'off';
  eta: number;
  accordionInterval: number;
  lowRank: number;
  highRank: number;
  lowRatio: number;
  highRatio: number;
  adapt: AdaptMode;
  batchLow: number;
  batchHigh: number;
  batchRamp: number;
  batchRateScaling: 'linear' | 'none';
  autoRanks: number[];
  autoRatios: number[];
  errorBudget: number;
  criticalBudget: number;
  errorMeasure: ErrorMeasure;
  autoCost: 'floats' | 'seconds';
  replanFactor: number;
  replanSteps: number;
  linkShare: number;
  outDir?: string;
  overwrite: boolean;
  checkpointEvery: number;
  resume?: string;
  syntheticTrain: number;
  syntheticTest: number;
  hidden: number;
  layers: number;
  dropout: number;
  bptt: number;
  clip: number;
  threads?: number;
  bucketMb: number;
  broadcastBuffers: boolean;
  timeoutMs: number;
  progress: boolean;
}

/** Sets of values that replace defaults: the LSTM's recipe, and a short demonstration on synthetic data. */
export type PresetName = 'lstm' | 'synthetic';

/**
 * How a value is read: 'int' and 'number' one number; 'ints' and 'numbers' a comma-separated list
 * (a JSON array in a config file); 'string' text, one of `choices` when given; 'flag' a boolean that
 * its flag turns on (or off, with `negate`).
 */
export type OptionType = 'int' | 'number' | 'ints' | 'numbers' | 'string' | 'flag';

export interface OptionSpec {
  flag: string;
  type: OptionType;
  help: string;
  /** Undefined: the option has no default (required, or absent unless given). */
  default?: unknown;
  presets?: Partial<Record<PresetName, unknown>>;
  choices?: readonly string[];
  /** Bounds of a number or of every list element: `min`/`max` inclusive, `above` exclusive, `below` exclusive. */
  min?: number;
  max?: number;
  above?: number;
  below?: number;
  /** A list must hold at least one value. */
  nonEmpty?: boolean;
  /** The flag sets the option to false (--no-nesterov, --quiet). */
  negate?: boolean;
  /** The option's name in Model.create, where it is one of the model's options there too. */
  modelKey?: string;
  /** How the help names the value (N, A,B or VALUE by the type when absent): RATE, TIME, CIDR. */
  value?: string;
}

/** Node's timers (and so every deadline of the rendezvous and collectives) hold at most 2^31 − 1 ms. */
export const MAX_TIMEOUT_MS = 2 ** 31 - 1;
export const MAX_THREADS = 4096;
export const MAX_HIDDEN = 2 ** 20;
export const MAX_LAYERS = 1024;

const positive = { min: 1 } as const;
const ratio = { above: 0, max: 1 } as const;

/** The table, in the order of the help text. */
export const OPTIONS: { readonly [K in keyof TrainConfig]-?: OptionSpec } = {
  model: { flag: '--model', type: 'string', choices: ARCHITECTURES, help: 'model architecture (required)' },
  width: {
    flag: '--width', type: 'number', default: 1, above: 0, max: 16, modelKey: 'width',
    help: "resnet18, vgg19bn: every convolution's channels (and the classifier's input) × this factor, rounded, at least 1; 1 is the paper's model",
  },
  precision: {
    flag: '--precision', type: 'string', default: 'fp32', choices: ['fp32', 'bf16'], modelKey: 'precision',
    help: "convolutions and matrix products in bf16, summed in fp32, as PyTorch's autocast; parameters, momentum, batch-norm statistics, the loss and the gradients exchanged stay fp32 (on the CPU natively with AVX512-BF16 or AMX, else rounded at about fp32's speed: accordion info says which; on a GPU on its tensor cores)",
  },
  device: { flag: '--device', type: 'string', default: 'cpu', help: 'where the model trains: cpu, cuda (GPU 0) or cuda:N' },
  convAlgorithms: {
    flag: '--conv-algorithms', type: 'string', default: 'fastest', choices: ['fastest', 'accurate'], modelKey: 'convAlgorithms',
    help: "GPU convolutions: cuDNN's fastest (as PyTorch's cudnn.benchmark), or none with a transform (FFT, non-fused Winograd): gradients within 1e-4 of float64, about 1.8× slower steps on an H200",
  },
  tf32: {
    flag: '--tf32', type: 'flag', default: false, modelKey: 'tf32',
    help: "GPU: fp32 convolutions and the model's matrix products on TF32 tensor cores (inputs rounded to 10 mantissa bits, sums in fp32), as PyTorch with allow_tf32 for cuDNN and matmul; the compressors' products stay fp32",
  },
  memoryFormat: {
    flag: '--memory-format', type: 'string', default: 'auto', choices: ['auto', 'channels-last', 'channels-first'], modelKey: 'memoryFormat',
    help: "GPU activations: channels-last (NHWC, the layout of cuDNN's tensor-core kernels, as PyTorch's channels_last), channels-first (NCHW), or auto: channels-last with --precision bf16, channels-first in fp32; the CPU's are always channels-last",
  },
  distBackend: {
    flag: '--dist-backend', type: 'string', default: 'nccl', choices: ['nccl', 'gloo'], modelKey: 'distBackend',
    help: "GPU workers' exchange: NCCL between GPUs (one worker per GPU), or Gloo through host memory, which lets several workers share a GPU (as PyTorch's backend='gloo'); CPU workers always use Gloo",
  },
  dataset: {
    flag: '--dataset', type: 'string', default: 'synthetic', presets: { lstm: 'wikitext2' },
    choices: ['synthetic', 'cifar10', 'cifar100', 'fashion-mnist', 'mnist', 'wikitext2'], help: 'dataset; cifar10 when --data is given (wikitext2 for lstm)',
  },
  dataDir: {
    flag: '--data', type: 'string',
    help: 'directory of the CIFAR binary files, of the MNIST-format *-ubyte.gz files (Debian: /usr/share/datasets/fashion-mnist), or of wiki.{train,valid,test}.tokens for lstm',
  },
  trainImages: { flag: '--train-images', type: 'int', ...positive, help: 'image datasets: train on the first N training images only (all by default)' },
  testImages: { flag: '--test-images', type: 'int', ...positive, help: 'image datasets: evaluate on the first N test images only (all by default)' },
  epochs: { flag: '--epochs', type: 'int', default: 300, presets: { synthetic: 6, lstm: 90 }, ...positive, help: 'epochs to train' },
  batchSize: { flag: '--batch-size', type: 'int', default: 64, presets: { lstm: 20 }, ...positive, help: 'batch size per worker' },
  evalBatchSize: { flag: '--eval-batch-size', type: 'int', default: 256, presets: { lstm: 10 }, ...positive, help: 'batch size for evaluation' },
  evalsPerEpoch: {
    flag: '--evals-per-epoch', type: 'int', default: 1, ...positive,
    help: 'image models: test-set evaluations an epoch, evenly spaced in steps, the last at its end (those within it stop its clock while they run)',
  },
  lr: {
    flag: '--lr', type: 'number', default: 0.05, presets: { synthetic: 0.02, lstm: 2.5 }, min: 0, modelKey: 'learningRate',
    help: 'base learning rate for one worker (× workers after the warm-up)',
  },
  momentum: { flag: '--momentum', type: 'number', default: 0.9, min: 0, modelKey: 'momentum', help: 'SGD momentum' },
  weightDecay: { flag: '--weight-decay', type: 'number', default: 1e-4, presets: { lstm: 0 }, min: 0, modelKey: 'weightDecay', help: 'weight decay' },
  nesterov: { flag: '--no-nesterov', type: 'flag', default: true, negate: true, modelKey: 'nesterov', help: 'plain heavy-ball momentum instead of Nesterov' },
  warmupEpochs: { flag: '--warmup-epochs', type: 'number', default: 5, min: 0, help: 'linear warm-up to lr × workers over this many epochs; the first epoch runs at lr even with 0 (the reference schedule)' },
  milestones: {
    flag: '--milestones', type: 'ints', default: [150, 250], presets: { lstm: [60, 80] }, min: 0,
    help: 'comma-separated milestones m: the lr is multiplied by --lr-decay from epoch m + 3 on (counting from 1; m + 2 counting from 0), the reference schedule',
  },
  lrDecay: { flag: '--lr-decay', type: 'number', default: 0.1, min: 0, help: 'factor applied to the lr at each milestone' },
  seed: { flag: '--seed', type: 'int', default: 42, min: 0, max: Number.MAX_SAFE_INTEGER, modelKey: 'seed', help: 'seed of initialisation, shuffling and augmentation' },
  workers: { flag: '--workers', type: 'int', default: 1, ...positive, help: 'number of workers: processes, or with --in-process trainers in this one' },
  compressor: { flag: '--compressor', type: 'string', default: 'none', choices: ['none', 'powersgd', 'topk'], modelKey: 'compressor', help: 'gradient compressor' },
  rank: { flag: '--rank', type: 'int', default: 2, ...positive, help: 'PowerSGD rank' },
  topkRatio: { flag: '--topk-ratio', type: 'number', default: 0.1, ...ratio, help: 'fraction of entries TopK sends' },
  compressAfter: {
    flag: '--compress-after', type: 'int', default: 0, min: 0, max: Number.MAX_SAFE_INTEGER,
    help: "steps sent dense before compression starts, with empty error memories (PyTorch PowerSGD's start_powerSGD_iter)",
  },
  minCompressionRate: {
    flag: '--min-compression-rate', type: 'number', default: 1, min: 0, modelKey: 'minCompressionRate',
    help: 'PowerSGD sends a matrix dense unless (n+m)·r·rate < n·m; 0 compresses all',
  },
  compressionSeed: {
    flag: '--compression-seed', type: 'int', default: 42, min: 0, max: Number.MAX_SAFE_INTEGER, modelKey: 'compressionSeed',
    help: "seed of PowerSGD's initial Q, the same on every worker",
  },
  commDtype: {
    flag: '--comm-dtype', type: 'string', default: 'fp32', choices: ['fp32', 'bf16', 'fp16'], modelKey: 'commDtype',
    help: "precision of what is sent: dense gradients, PowerSGD's P and Q, TopK's values (indices stay 32-bit); summed in fp32, the rounding kept in the error memory (dense gradients have none); CPU only",
  },
  accordion: {
    flag: '--accordion', type: 'string', default: 'auto', choices: ['auto', 'on', 'off'],
    help: 'adaptive compression; auto: on with a compressor unless --rank/--topk-ratio fix the level',
  },
  eta: { flag: '--eta', type: 'number', default: 0.5, above: 0, help: "Accordion's threshold on the relative change of a layer's gradient norm" },
  accordionInterval: { flag: '--accordion-interval', type: 'int', default: 10, presets: { synthetic: 2, lstm: 5 }, ...positive, help: 'epochs between Accordion checks' },
  lowRank: { flag: '--low-rank', type: 'int', default: 2, ...positive, help: 'PowerSGD rank in critical regimes (low compression)' },
  highRank: { flag: '--high-rank', type: 'int', default: 1, ...positive, help: 'PowerSGD rank otherwise (high compression)' },
  lowRatio: { flag: '--low-ratio', type: 'number', default: 0.99, ...ratio, help: 'TopK ratio in critical regimes (low compression)' },
  highRatio: { flag: '--high-ratio', type: 'number', default: 0.1, presets: { lstm: 0.02 }, ...ratio, help: 'TopK ratio otherwise (high compression)' },
  adapt: {
    flag: '--adapt', type: 'string', default: 'compression', choices: ['compression', 'batch', 'smith', 'auto', 'batch+compression'],
    help:
      "what Accordion adapts: per-layer compression (compression: low/high levels; auto: each layer's level from candidates under an error budget), " +
      "the global batch (batch: B_low → B_high; smith: Smith et al.'s baseline), or batch and levels together",
  },
  batchLow: { flag: '--batch-low', type: 'int', default: 512, ...positive, help: 'global batch in critical regimes (batch-size mode)' },
  batchHigh: { flag: '--batch-high', type: 'int', default: 4096, ...positive, help: 'global batch afterwards (batch-size mode)' },
  batchRamp: {
    flag: '--batch-ramp', type: 'int', default: 0, min: 0,
    help: "batch-size mode: epochs over which the rate rises linearly to the grown batch's, from the rate before the growth (0: at once, as the paper)",
  },
  batchRateScaling: {
    flag: '--batch-rate-scaling', type: 'string', default: 'linear', choices: ['linear', 'none'],
    help: 'batch-size mode: the rate times B / B_low once the batch grows (linear, as the paper), or the schedule\'s rate unchanged (none)',
  },
  autoRanks: { flag: '--auto-ranks', type: 'ints', default: [1, 2, 4, 8], min: 1, nonEmpty: true, help: 'adapt auto: candidate PowerSGD ranks (with dense and --rank, the reference)' },
  autoRatios: {
    flag: '--auto-ratios', type: 'numbers', default: [0.01, 0.02, 0.05, 0.1, 0.2], ...ratio, nonEmpty: true,
    help: 'adapt auto: candidate TopK ratios (with dense and --topk-ratio, the reference)',
  },
  errorBudget: {
    flag: '--error-budget', type: 'number', default: 1, above: 0,
    help: "adapt auto: the layers' summed compression error may reach this multiple of the reference level's",
  },
  criticalBudget: {
    flag: '--critical-budget', type: 'number', default: 0.5, above: 0,
    help: "adapt auto: factor on a layer's share of the budget where Accordion detects a critical regime (a norm change of η or more, or a learning-rate decay; < 1: tighter)",
  },
  errorMeasure: {
    flag: '--error-measure', type: 'string', default: 'squared', choices: ['squared', 'relative'],
    help: "adapt auto: a layer's error in the budget: squared ‖G − C(G)‖² (large layers weigh more) or relative ‖G − C(G)‖ / ‖G‖ (every layer alike)",
  },
  autoCost: {
    flag: '--auto-cost', type: 'string', default: 'floats', choices: ['floats', 'seconds'],
    help: 'adapt auto: what a level costs: floats per step, or seconds (kernel time + bytes over the link training measures; on the CPU with --comm-dtype fp32, dense in bf16 joins the candidates)',
  },
  replanFactor: {
    flag: '--replan-factor', type: 'number', default: 2, min: 0,
    help: 'adapt auto, priced in seconds: plan again (at an epoch\'s end, or mid-epoch after a drop) when the measured link has moved by more than this factor since the last plan; 0: plan at the checks only',
  },
  replanSteps: {
    flag: '--replan-steps', type: 'int', default: 50, ...positive, max: Number.MAX_SAFE_INTEGER,
    help: 'adapt auto, priced in seconds: between epochs, plan again when the link has stayed below the plan\'s ÷ --replan-factor for this many steps in a row (looked at every this many steps)',
  },
  linkShare: {
    flag: '--link-share', type: 'number', default: 0, min: 0,
    help: "adapt auto, priced in seconds: the error budget follows the link, scaled by the reference level's exchange seconds over this share of a step's compute (a faster link tightens it, down to dense; a slower one loosens it); 0: a fixed budget",
  },
  outDir: { flag: '--out', type: 'string', help: 'run directory (default runs/<model>-<time>); one that holds a run needs --resume or --overwrite' },
  overwrite: {
    flag: '--overwrite', type: 'flag', default: false,
    help: 'replace the run in --out: removes its config.json, metrics.jsonl, summary.json, report.html and checkpoints',
  },
  checkpointEvery: { flag: '--checkpoint-every', type: 'int', default: 1, ...positive, help: 'epochs between checkpoints' },
  resume: { flag: '--resume', type: 'string', help: 'continue from a run or checkpoint directory' },
  syntheticTrain: { flag: '--synthetic-train', type: 'int', default: 2560, ...positive, help: 'training images of the synthetic dataset' },
  syntheticTest: { flag: '--synthetic-test', type: 'int', default: 1000, ...positive, help: 'test images of the synthetic dataset' },
  hidden: { flag: '--hidden', type: 'int', default: 650, min: 1, max: MAX_HIDDEN, modelKey: 'hidden', help: 'lstm: hidden and embedding size' },
  layers: { flag: '--layers', type: 'int', default: 2, min: 1, max: MAX_LAYERS, modelKey: 'layers', help: 'lstm: layers' },
  dropout: {
    flag: '--dropout', type: 'number', default: 0.5, presets: { lstm: 0.4 }, min: 0, below: 1, modelKey: 'dropout',
    help: "dropout of VGG's classifier, and of the lstm's embedding, layers and output; 0: none",
  },
  bptt: { flag: '--bptt', type: 'int', default: 35, ...positive, help: 'lstm: steps of truncated backpropagation through time' },
  clip: {
    flag: '--clip', type: 'number', default: 0, presets: { lstm: 0.25 }, min: 0, modelKey: 'clipNorm',
    help: 'clip the local gradients to this global norm before the exchange (0: none); clipped gradients are exchanged after backward',
  },
  threads: {
    flag: '--threads', type: 'int', min: 1, max: MAX_THREADS, modelKey: 'threads',
    help: 'native threads (default: OMP_NUM_THREADS or all cores); an overlapped exchange takes one for its communication thread',
  },
  bucketMb: {
    flag: '--bucket-mb', type: 'number', default: 25, min: 0, modelKey: 'bucketMb',
    help: 'overlap the exchange with backward in buckets of this many MiB of gradients (as PyTorch DDP; 0: exchange after backward)',
  },
  broadcastBuffers: {
    flag: '--no-broadcast-buffers', type: 'flag', default: true, negate: true, modelKey: 'broadcastBuffers',
    help: "each worker keeps its own batch-norm statistics instead of starting every step from rank 0's (PyTorch DDP's broadcast_buffers=False)",
  },
  timeoutMs: { flag: '--timeout', type: 'int', default: 60_000, min: 1, max: MAX_TIMEOUT_MS, help: 'milliseconds before a rendezvous or collective gives up (at most 2^31 − 1, about 24.8 days: the longest a Node.js timer waits)' },
  progress: { flag: '--quiet', type: 'flag', default: false, negate: true, help: 'no progress bar or per-epoch lines (the library prints nothing unless progress is true)' },
};

export const OPTION_KEYS = Object.keys(OPTIONS) as (keyof TrainConfig)[];

/** The defaults of every option that has one (the options without a preset). */
export const DEFAULT_CONFIG = Object.fromEntries(
  OPTION_KEYS.filter((k) => OPTIONS[k].default !== undefined).map((k) => [k, structuredClone(OPTIONS[k].default)]),
) as Omit<TrainConfig, 'model' | 'dataDir' | 'outDir' | 'resume' | 'threads'>;

/** A preset's values, as a partial configuration. */
export function presetValues(name: PresetName): Partial<TrainConfig> {
  return Object.fromEntries(
    OPTION_KEYS.filter((k) => OPTIONS[k].presets?.[name] !== undefined).map((k) => [k, structuredClone(OPTIONS[k].presets![name])]),
  ) as Partial<TrainConfig>;
}

/** The preset a run takes: the LSTM's recipe, the synthetic demonstration, or none (CIFAR: the paper's schedule). */
export function presetFor(model: Architecture, dataset: DatasetName | undefined): PresetName | undefined {
  if (model === 'lstm') return 'lstm';
  return (dataset ?? OPTIONS.dataset.default) === 'synthetic' ? 'synthetic' : undefined;
}

/** An option's default under a preset (or without one). */
export function defaultFor<K extends keyof TrainConfig>(key: K, preset?: PresetName): TrainConfig[K] | undefined {
  const spec = OPTIONS[key];
  const value = preset !== undefined && spec.presets?.[preset] !== undefined ? spec.presets[preset] : spec.default;
  return structuredClone(value) as TrainConfig[K] | undefined;
}

/** The bound an option's value must meet, in words ("a positive integer", "a number in (0, 1]"). */
export function describeBound(spec: OptionSpec): string {
  if (spec.type === 'flag') return 'true or false';
  if (spec.type === 'string') return spec.choices ? `one of ${spec.choices.join(', ')}` : 'a string';
  const integer = spec.type === 'int' || spec.type === 'ints';
  const list = spec.type === 'ints' || spec.type === 'numbers';
  let one: string;
  if (integer)
    one =
      spec.max !== undefined && spec.max < Number.MAX_SAFE_INTEGER
        ? `an integer from ${spec.min ?? 0} to ${spec.max}`
        : spec.min === 1
          ? 'a positive integer'
          : spec.min === 0
            ? 'a non-negative integer'
            : spec.min !== undefined
              ? `an integer ≥ ${spec.min}`
              : 'an integer';
  else if (spec.above !== undefined && spec.max !== undefined) one = `a number in (${spec.above}, ${spec.max}]`;
  else if (spec.min !== undefined && spec.below !== undefined) one = `a number in [${spec.min}, ${spec.below})`;
  else if (spec.above !== undefined) one = `a number > ${spec.above}`;
  else if (spec.min !== undefined) one = `a number ≥ ${spec.min}`;
  else one = 'a number';
  if (!list) return one;
  return `${spec.nonEmpty ? 'a non-empty ' : 'a '}list of ${one.replace(/^an? /, '').replace(/\b(integer|number)\b/, '$1s')}`;
}

/** Whether `value` meets the option's type and bounds. */
export function meetsBound(spec: OptionSpec, value: unknown): boolean {
  switch (spec.type) {
    case 'flag':
      return typeof value === 'boolean';
    case 'string':
      return typeof value === 'string' && (!spec.choices || spec.choices.includes(value));
    case 'ints':
    case 'numbers':
      return Array.isArray(value) && (!spec.nonEmpty || value.length > 0) && value.every((v) => inBounds(spec, v));
    default:
      return inBounds(spec, value);
  }
}

function inBounds(spec: OptionSpec, v: unknown): boolean {
  if (typeof v !== 'number' || !Number.isFinite(v)) return false;
  if ((spec.type === 'int' || spec.type === 'ints') && !Number.isSafeInteger(v)) return false;
  return (
    (spec.min === undefined || v >= spec.min) &&
    (spec.max === undefined || v <= spec.max) &&
    (spec.above === undefined || v > spec.above) &&
    (spec.below === undefined || v < spec.below)
  );
}

/** A value as messages show it. */
export function showValue(v: unknown): string {
  if (typeof v === 'string') return `'${v}'`;
  if (Array.isArray(v)) return v.map(showValue).join(',');
  if (v === null || typeof v !== 'object') return String(v);
  return JSON.stringify(v);
}

/** The message for a value out of bounds; `label` names the option ("option --lr", "learningRate"). */
export function boundMessage(label: string, spec: OptionSpec, value: unknown): string {
  return `${label}: expected ${describeBound(spec)}, got ${showValue(value)}`;
}
