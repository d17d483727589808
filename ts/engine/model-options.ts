/**
 * Model.create's options: their defaults and bounds, which come from the training options' table,
 * and the refusal of a model too large for this machine's memory.
 */
import * as os from 'node:os';
import { UsageError } from '../base/errors.js';
import { OPTIONS, OPTION_KEYS, boundMessage, defaultFor, meetsBound, type Architecture, type CommDtype, type CompressorName, type ComputePrecision, type DeviceName, type MemoryFormat, type TrainConfig } from '../config/options.js';
import { ProcessGroup } from '../comm/group.js';
import { describe } from './inputs.js';
import { parameterCount } from './parameter-count.js';

/**
 * Options of Model.create. Those that are training options too (learningRate as lr, momentum,
 * weightDecay, nesterov, seed, compressor, minCompressionRate, compressionSeed, commDtype, width, precision, hidden, layers,
 * dropout, bucketMb, broadcastBuffers, clipNorm as clip, threads) take that option's default and bounds from
 * config/options.ts: a model built here and one a Trainer builds start alike.
 */
export interface ModelOptions {
  architecture: Architecture;
  /** Number of classes (10 for CIFAR-10, 100 for CIFAR-100); the vocabulary size for 'lstm'. */
  classes?: number;
  /** 'lstm': hidden (= embedding) size (default 650), layers (2). */
  hidden?: number;
  layers?: number;
  /**
   * 'resnet18', 'vgg19bn': every convolution's output channels (and so the classifier's input) ×
   * this factor, rounded, at least 1 (default 1: the paper's models).
   */
  width?: number;
  /**
   * Convolutions and matrix products in 'fp32' (default) or 'bf16': inputs and weights rounded to
   * bf16, products summed in fp32, as PyTorch's autocast; parameters, gradients and updates in fp32.
   * On a GPU on the tensor cores, where a convolution also writes its results in bf16 (as autocast).
   */
  precision?: ComputePrecision;
  /** Dropout probability in [0, 1): the LSTM's (default 0.4) or VGG's classifier's (default 0.5); 0 turns it off. */
  dropout?: number;
  /** Seed of the weight initialisation (and of dropout): the same weights on every device. */
  seed?: number;
  /** Where the model lives and trains: 'cpu' (default), 'cuda' (GPU 0) or 'cuda:N'. */
  device?: DeviceName;
  /**
   * On a GPU, the convolution algorithms cuDNN may choose: 'fastest' (default; the fastest it times,
   * as PyTorch's cudnn.benchmark) or 'accurate' (none with an FFT or non-fused Winograd transform,
   * whose rounding grows with the transform). The CPU has one kind.
   */
  convAlgorithms?: 'fastest' | 'accurate';
  /**
   * On a GPU: fp32 convolutions and the model's matrix products on TF32 tensor cores (false by
   * default, as PyTorch's matmul; its cuDNN default is true). The compressors' products stay fp32;
   * the CPU has no TF32 and refuses it.
   */
  tf32?: boolean;
  /**
   * On a GPU, how activations are stored: 'channels-last' (NHWC, the layout of cuDNN's tensor-core
   * kernels, as PyTorch's channels_last), 'channels-first' (NCHW), or 'auto' (default: channels-last
   * with precision bf16, channels-first in fp32). The CPU's are always channels-last and it refuses
   * 'channels-first'.
   */
  memoryFormat?: MemoryFormat;
  /**
   * On a GPU with a group: how the gradients travel, 'nccl' (default; one worker per GPU) or 'gloo'
   * (through host memory, each collective staged there: several workers may share a GPU). The CPU
   * always uses the group's Gloo.
   */
  distBackend?: 'nccl' | 'gloo';
  learningRate?: number;
  momentum?: number;
  weightDecay?: number;
  /** Nesterov momentum (default) or plain heavy ball. */
  nesterov?: boolean;
  /** Gradient compressor used in the exchange between workers (default none). */
  compressor?: CompressorName;
  /** Initial level of every compressible (>1-D) parameter: PowerSGD rank or TopK ratio (default: --rank's or --topk-ratio's). */
  level?: number;
  /** PowerSGD keeps a matrix dense unless (n + m)·r·rate < n·m (default 1; 0 compresses all). */
  minCompressionRate?: number;
  /** Seed of PowerSGD's initial Q, shared by all workers (default 42). */
  compressionSeed?: number;
  /**
   * Precision of what the exchange sends (default 'fp32'): dense gradients, PowerSGD's P and Q,
   * TopK's values. Sums stay in fp32; the compressors' error memories keep what rounding loses.
   * CPU only.
   */
  commDtype?: CommDtype;
  /** Accumulate Σ g per parameter for gradientNorms() (default false). */
  accumulateNorms?: boolean;
  /** Exchange gradients with the other workers of this group (default: train alone). */
  group?: ProcessGroup;
  /**
   * With a group, on the CPU: buckets of at most this many MiB of gradients (as
   * PyTorch DDP's bucket_cap_mb, default 25) are compressed and exchanged by a communication thread
   * while backward still runs; 0 exchanges everything after backward.
   */
  bucketMb?: number;
  /**
   * Before the exchange, the local gradients (after micro-batch averaging) are scaled to this global
   * norm when theirs is larger, as clip_grad_norm_ (default 0: no clipping; 0.25 for 'lstm'). A
   * clipped gradient is final only once every gradient is, so clipping exchanges after backward.
   */
  clipNorm?: number;
  /** OpenMP threads of this model's work (default: the last setThreads(), else OMP_NUM_THREADS or all cores), shared with the communication thread. */
  threads?: number;
  /** Batch norm normalises with its running statistics during training too (default false). */
  frozenBatchNorm?: boolean;
  /**
   * With a group: every training step starts from rank 0's batch-norm running statistics, broadcast
   * to every worker, which then updates its copy from its own batch; rank 0's are the model's
   * (PyTorch DDP's broadcast_buffers; default true). Off, each worker keeps its own.
   */
  broadcastBuffers?: boolean;
  /**
   * Keep a copy of each step's local gradients (before the exchange and compression replace them)
   * for gradients() (default false: no copies).
   */
  keepGradients?: boolean;
}

/** PyTorch DDP's default bucket size. */
export const DEFAULT_BUCKET_MB = OPTIONS.bucketMb.default as number;

/** Class ids are int32. */
export const MAX_CLASSES = 2 ** 31 - 1;

/** The training options that are Model.create's options too, by their name there. */
const MODEL_OPTIONS = OPTION_KEYS.filter((k) => OPTIONS[k].modelKey !== undefined);

/** An option's default in Model.create: the training option's, under the model's preset (the LSTM's dropout). */
export function modelDefault<K extends keyof TrainConfig>(key: K, o: ModelOptions): TrainConfig[K] {
  return defaultFor(key, o.architecture === 'lstm' ? 'lstm' : undefined)!;
}

/** The options of Model.create besides architecture and classes, checked by the training options' bounds. */
export function checkOptions(o: ModelOptions): void {
  for (const key of MODEL_OPTIONS) {
    const spec = OPTIONS[key];
    const value = (o as unknown as Record<string, unknown>)[spec.modelKey!];
    if (value !== undefined && !meetsBound(spec, value)) throw new UsageError(boundMessage(spec.modelKey!, spec, value));
  }
  if (o.level !== undefined && !(typeof o.level === 'number' && Number.isFinite(o.level) && o.level > 0))
    throw new UsageError(`level must be a positive number (a PowerSGD rank or a TopK ratio), got ${describe(o.level)}`);
  for (const key of ['accumulateNorms', 'frozenBatchNorm', 'keepGradients'] as const)
    if (o[key] !== undefined && typeof o[key] !== 'boolean') throw new UsageError(`${key} must be a boolean, got ${describe(o[key])}`);
  if (o.group !== undefined && !(o.group instanceof ProcessGroup)) throw new UsageError(`group must be a ProcessGroup, got ${describe(o.group)}`);
}

/**
 * Refuses a model whose weights, gradients, momentum and compressor state (four float32 copies of
 * the parameters) would not fit in this machine's memory, before anything is allocated.
 */
export function estimateMemory(architecture: Architecture, classes: number, hidden: number, layers: number, width: number): void {
  const parameters = parameterCount({ architecture, classes, hidden, layers, width });
  const sizes = architecture === 'lstm' ? `vocabulary (classes) ${classes}, hidden ${hidden}, layers ${layers}` : `${classes} classes, width ${width}`;
  const bytes = 16 * parameters;
  const total = os.totalmem();
  if (bytes > total)
    throw new UsageError(
      `model '${architecture}' with ${sizes} has ${parameters.toExponential(2)} parameters: its weights, gradients and optimiser state ` +
        `(${(bytes / 2 ** 30).toFixed(1)} GiB) exceed this machine's memory (${(total / 2 ** 30).toFixed(1)} GiB)`,
    );
}
