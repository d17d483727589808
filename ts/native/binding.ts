/**
 * The one typed seam to the C++ addon. Everything else in ts/ goes through these types; nothing
 * outside this file touches the raw binding. Every function, constructor, method and accessor of
 * the binding is guarded here: whatever it throws, or a promise it returns rejects with, reaches the
 * caller as a NativeError (an AccordionError) carrying the addon's code (ERR_NATIVE when it has none).
 * The test and benchmark tools (LayerProbe, ReducerProbe, crossEntropy, orthogonalize, roundTo) are not in
 * `binding`: they are reached through ts/testing.ts (accordion-engine/testing) only.
 */
import { AccordionError, NativeError } from '../base/errors.js';
import { loadAddon, type AddonSource } from './addon-location.js';
import type { LevelCost, BuildInfo, LibraryStatus, DeviceQuery, MemoryStats, StepFigures, StepResult, ExchangePlan, CollectiveCounts, CompressorName, CommDtype, StateEntry, TrafficOptions, BucketTraffic } from './types.js';

export type { LevelCost, BuildInfo, LibraryStatus, DeviceQuery, MemoryStats, StepFigures, StepResult, ExchangePlan, CollectiveCounts, CompressorName, CommDtype, StateEntry, TrafficOptions, BucketTraffic };

export interface EngineOptions {
  model: string;
  classes: number;
  seed: number;
  /** 'cpu', 'cuda' or 'cuda:N'. */
  device: string;
  /** GPU convolutions: 'fastest' or 'accurate' (no transform algorithms). */
  convAlgorithms: 'fastest' | 'accurate';
  /** GPU: convolutions and matrix products on TF32 tensor cores. */
  tf32: boolean;
  /** GPU activations: 'auto', 'channels-last' or 'channels-first'. */
  memoryFormat: 'auto' | 'channels-last' | 'channels-first';
  /** GPU workers' exchange: 'nccl', or 'gloo' staged through host memory. */
  distBackend: 'nccl' | 'gloo';
  learningRate: number;
  momentum: number;
  weightDecay: number;
  nesterov: boolean;
  compressor: CompressorName;
  /** Initial level of every compressible parameter: PowerSGD rank or TopK ratio (required with a compressor). */
  level?: number;
  compressionSeed: number;
  minCompressionRate: number;
  /** Precision of what the exchange sends: 'fp32', 'bf16' or 'fp16'. */
  commDtype: CommDtype;
  accumulateNorms?: boolean;
  /** Exchange gradients with the other workers of this group. */
  group?: NativeProcessGroup;
  frozenBatchNorm?: boolean;
  /** With a group: every training step starts from rank 0's buffers (PyTorch DDP's broadcast_buffers). */
  broadcastBuffers: boolean;
  /** Vision models: the factor on every convolution's channels. */
  width: number;
  /** Convolutions and matrix products in 'fp32' or 'bf16'. */
  precision: 'fp32' | 'bf16';
  /** Language model: hidden (= embedding) size, layers. */
  hidden: number;
  layers: number;
  /** Dropout probability: the language model's or VGG's classifier's. */
  dropout: number;
  /** Keep a copy of each step's local gradients for gradients() (default false). */
  keepGradients?: boolean;
  /** Bytes of gradients per bucket of the overlapped exchange (0: after backward). */
  bucketBytes: number;
  /** The local gradients' global-norm clip before the exchange (0: none). */
  clipNorm: number;
  /** OpenMP threads of the engine's work (0: OpenMP's default). */
  threads?: number;
}

export interface BatcherOptions {
  batchSize: number;
  shuffle: boolean;
  augment: boolean;
  dropLast?: boolean;
  seed: number;
  rank?: number;
  worldSize?: number;
  /** Pad shards to equal size as DistributedSampler does (default true); false for evaluation. */
  padShards?: boolean;
  /** Per-channel mean and standard deviation on the [0, 1] scale. */
  mean: [number, number, number];
  std: [number, number, number];
  /** The device of the model that consumes the batches (their layout and memory). */
  device?: string;
}

export interface NativeBatcher {
  startEpoch(epoch: number): void;
  next(): Promise<{ images: Float32Array; labels: Int32Array } | null>;
  readonly batchesPerEpoch: number;
  readonly samplesPerEpoch: number;
}

/**
 * A batch in host memory as the engine takes it: N images (N, 3, height, width) NCHW with N labels
 * (or, for forward, `count` images and no labels), or a (steps, batch) time-major window of token ids
 * with its targets (none for forward).
 */
export type NativeBatch =
  | { images: Float32Array; labels?: Int32Array; count?: number; height: number; width: number }
  | { tokens: Int32Array; targets?: Int32Array; steps: number; batch: number };

export interface NativeEngine {
  /** The trainable parameters in state_dict order, once the model is built on the engine's thread. */
  ready(): Promise<{ name: string; shape: number[] }[]>;
  /** One optimiser step over the mean gradient of the next `microBatches` batches (default 1), or of the caller's micro-batches. */
  trainStep(batcher: NativeBatcher, microBatches?: number): Promise<StepResult | null>;
  trainStep(batches: NativeBatch[]): Promise<StepResult>;
  /** Loss and correct predictions over the batcher's current epoch, or one batch, in evaluation mode. */
  evaluate(source: NativeBatcher | NativeBatch): Promise<StepResult>;
  setLearningRate(lr: number): Promise<void>;
  getState(includeTrainer: boolean): Promise<StateEntry[]>;
  setState(entries: StateEntry[]): Promise<void>;
  levels(): Promise<Float64Array>;
  setLevels(levels: Float64Array): Promise<void>;
  gradientNorms(): Promise<Float64Array>;
  levelCosts(candidates: number[]): Promise<LevelCost[][]>;
  broadcastState(root: number): Promise<void>;
  /** Every buffer (running statistics) takes rank root's values, in one broadcast; resolves to the floats broadcast. */
  broadcastBuffers(root: number): Promise<number>;
  /** A 64-bit digest of every state_dict entry, in order. */
  stateDigests(): Promise<{ names: string[]; digests: BigUint64Array }>;
  resetState(): Promise<void>;
  memoryStats(resetPeak?: boolean): Promise<MemoryStats>;
  /** What the collectives of the group the gradients travel on (Gloo, or NCCL on GPUs) have carried. */
  collectiveCounts(): Promise<CollectiveCounts>;
  exchangePlan(): Promise<ExchangePlan>;
  /** Logits, (N, classes) or (steps·batch, vocabulary), in training or evaluation mode. */
  forward(batch: NativeBatch, training: boolean): Promise<Float32Array>;
  /** The last step's local gradients (with keepGradients), in state_dict order; [] before a step. */
  gradients(): Promise<{ name: string; shape: number[]; data: Float32Array }[]>;
  /** Language model: the carried states, per layer h then c, each (batch, hidden); [] when none. */
  hiddenState(): Promise<Float32Array[]>;
  setHiddenState(states: Float32Array[], batch: number): Promise<void>;
  dispose(): Promise<void>;
}

export interface NativeReducerProbe {
  /** collectiveBytes: worker 0's collectives in the order they ran, the bytes it sent in each. */
  step(grads: Float32Array[][]): { outputs: Float32Array[][]; floatsSent: number; bytesSent: number; collectiveBytes: Float64Array };
  memory(worker: number, param: number): Float32Array | null;
  q(worker: number, param: number): Float32Array | null;
  setQ(param: number, q: Float32Array): void;
  level(param: number): number;
  setLevel(param: number, level: number): void;
  isCompressed(param: number): boolean;
  floatsPerStep(): number;
  /** With `bucketBytes`: each bucket's parameter indices, in the order they travel; otherwise []. */
  buckets(): number[][];
  norms(worker: number): Float64Array;
  randomize(seed: number): void;
  /** Sets every worker's gradients ([worker][parameter]) and keeps them for restart(). */
  setInput(grads: Float32Array[][]): void;
  /** The gradients of the last setInput() again, zero error memories and Q drawn again from the seed. */
  restart(): void;
  run(): number;
}

export interface LayerStateEntry {
  name: string;
  kind: 'parameter' | 'buffer';
  shape: number[];
  value: Float32Array;
  grad?: Float32Array;
}

export interface NativeProcessGroup {
  ready(): Promise<void>;
  allReduce(data: Float32Array, average: boolean, commDtype?: CommDtype): Promise<void>;
  allGather(data: Float32Array, counts?: number[], output?: Float32Array): Promise<Float32Array>;
  broadcast(data: Float32Array, root: number): Promise<void>;
  barrier(): Promise<void>;
  collectiveCounts(): Promise<CollectiveCounts>;
  dispose(): Promise<void>;
}

export interface NativeLayerProbe {
  forward(input: Float32Array, shape: number[], training?: boolean): { data: Float32Array; shape: number[] };
  backward(gradOutput: Float32Array): Float32Array;
  state(): LayerStateEntry[];
  setValue(name: string, value: Float32Array): void;
}

export interface Binding {
  Engine: new (options: EngineOptions) => NativeEngine;
  ProcessGroup: new (options: {
    rank: number;
    worldSize: number;
    storeHost: string;
    storePort: number;
    token: string;
    hostname: string;
    timeoutMs: number;
    prefix?: string;
  }) => NativeProcessGroup;
  Batcher: new (images: Uint8Array, labels: Int32Array, classes: number, options: BatcherOptions) => NativeBatcher;
  buildInfo(): BuildInfo;
  deviceQuery(): DeviceQuery;
  /** Throws (with the cause's code) unless a model can run on the device. */
  checkDevice(device: string): void;
  setThreads(n: number): void;
  /** Per bucket, in the order they travel, the bytes one worker hands to each collective (cpp/compress/traffic.h). */
  exchangeTraffic(shapes: number[][], options: TrafficOptions): BucketTraffic[];
}


export interface NativeReducerProbeOptions {
  compressor?: CompressorName;
  /** PowerSGD rank or TopK ratio of every compressible parameter. */
  level?: number;
  /** Simulated workers (default 1); a probe with a group is one worker. */
  workers?: number;
  seed?: number;
  minCompressionRate?: number;
  commDtype?: CommDtype;
  accumulateNorms?: boolean;
  /** Exchange in buckets of at most this many bytes (BucketExchange, on its own thread per worker); 0: reduce() at once. */
  bucketBytes?: number;
  group?: NativeProcessGroup;
  device?: string;
}

/** The addon's tools for tests and benchmarks. */
export interface TestingBinding {
  LayerProbe: new (kind: string, options?: Record<string, number | boolean | string>) => NativeLayerProbe;
  ReducerProbe: new (shapes: number[][], options: NativeReducerProbeOptions) => NativeReducerProbe;
  crossEntropy(logits: Float32Array, n: number, k: number, labels: Int32Array): { loss: number; grad: Float32Array; correct: number };
  orthogonalize(matrix: Float32Array, rows: number, cols: number, eps?: number): void;
  /** Each value rounded to `commDtype` as the exchange rounds what it sends, and widened back to fp32. */
  roundTo(values: Float32Array, commDtype: CommDtype): Float32Array;
}

function load(): { addon: Binding & { testing: TestingBinding }; source: AddonSource } {
  try {
    return loadAddon<Binding & { testing: TestingBinding }>();
  } catch (err) {
    if (err instanceof AccordionError) throw err;
    throw new NativeError(
      'ERR_ADDON_MISSING',
      `the native addon does not load (${(err as Error).message.split('\n')[0]}). ` +
        'Install the system libraries and build it with: npm run setup',
    );
  }
}

/**
 * An error from the addon as the project's error class: a NativeError keeping the addon's code
 * (ERR_NATIVE when it has none) and its stack. AccordionErrors pass through unchanged.
 */
export function asNativeError(err: unknown): Error {
  if (err instanceof AccordionError) return err;
  const code = typeof (err as { code?: unknown } | null)?.code === 'string' ? (err as { code: string }).code : 'ERR_NATIVE';
  const message = err instanceof Error ? err.message : `native failure: ${String(err)}`;
  const wrapped = new NativeError(code, message);
  if (err instanceof Error) wrapped.stack = `${wrapped.name}: ${message}\n${(err.stack ?? '').split('\n').slice(1).join('\n')}`;
  return wrapped;
}

/** Runs a call into the addon: what it throws, or a promise it returns rejects with, becomes a NativeError. */
function guarded<T>(run: () => T): T {
  let result: T;
  try {
    result = run();
  } catch (err) {
    throw asNativeError(err);
  }
  if (result instanceof Promise)
    return result.catch((err: unknown) => {
      throw asNativeError(err);
    }) as T;
  return result;
}

/** Any function or class of the addon (TypeScript needs `any` to take their parameters apart). */
type AnyFunction = (...args: any[]) => any;
type AnyClass = new (...args: any[]) => object;

function guardFunction<F extends AnyFunction>(native: F): F {
  return ((...args: Parameters<F>) => guarded(() => native(...args))) as F;
}

/** A subclass of a native class whose constructor, methods and accessors are guarded. */
function guardClass<C extends AnyClass>(Native: C): C {
  const Guarded = class extends Native {
    constructor(...args: any[]) {
      try {
        super(...args);
      } catch (err) {
        throw asNativeError(err);
      }
    }
  };
  for (const name of Object.getOwnPropertyNames(Native.prototype)) {
    if (name === 'constructor') continue;
    const d = Object.getOwnPropertyDescriptor(Native.prototype, name)!;
    if (typeof d.value === 'function') {
      const method = d.value as AnyFunction;
      Object.defineProperty(Guarded.prototype, name, {
        ...d,
        value(this: object, ...args: unknown[]) {
          return guarded(() => method.apply(this, args));
        },
      });
    } else if (d.get) {
      const get = d.get;
      Object.defineProperty(Guarded.prototype, name, { ...d, get(this: object) { return guarded(() => get.call(this)); } });
    }
  }
  Object.defineProperty(Guarded, 'name', { value: Native.name });
  return Guarded;
}

const { addon: raw, source } = load();

/** Where the addon was loaded from: the package's own build or its platform package. */
export const addonSource: AddonSource = source;

export const binding: Binding = {
  Engine: guardClass(raw.Engine),
  ProcessGroup: guardClass(raw.ProcessGroup),
  Batcher: guardClass(raw.Batcher),
  buildInfo: guardFunction(raw.buildInfo),
  deviceQuery: guardFunction(raw.deviceQuery),
  checkDevice: guardFunction(raw.checkDevice),
  setThreads: guardFunction(raw.setThreads),
  exchangeTraffic: guardFunction(raw.exchangeTraffic),
};

/** @internal The test and benchmark tools; ts/testing.ts is their public door. */
export const testingBinding: TestingBinding = {
  LayerProbe: guardClass(raw.testing.LayerProbe),
  ReducerProbe: guardClass(raw.testing.ReducerProbe),
  crossEntropy: guardFunction(raw.testing.crossEntropy),
  orthogonalize: guardFunction(raw.testing.orthogonalize),
  roundTo: guardFunction(raw.testing.roundTo),
};

/** Awaits a native promise, converting its rejection and keeping the caller's stack. */
export async function call<T>(promise: Promise<T>): Promise<T> {
  const callerStack = new Error().stack ?? '';
  try {
    return await promise;
  } catch (err) {
    const wrapped = asNativeError(err);
    wrapped.stack = `${wrapped.stack ?? ''}\n    --- awaited at ---\n${callerStack.split('\n').slice(2).join('\n')}`;
    throw wrapped;
  }
}
