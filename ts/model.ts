/**
 * A model with its optimiser, living in native memory. Weights use PyTorch's state_dict names, so a
 * `save()`d file loads in PyTorch (`load_state_dict(..., strict=True)`) and a PyTorch state_dict in
 * safetensors layout loads here.
 */
import { binding, call, type CompressorName, type MemoryStats, type NativeEngine, type StateEntry, type StepResult } from './native.js';
import { parseDevice, type DeviceName } from './device.js';
import type { Batcher } from './batcher.js';
import type { ProcessGroup } from './cluster/group.js';
import { readSafetensors, writeSafetensors, type NamedTensor } from './safetensors.js';
import { CheckpointError, UsageError } from './errors.js';

export type Architecture = 'resnet18' | 'vgg19bn' | 'lstm';
export const ARCHITECTURES: readonly Architecture[] = ['resnet18', 'vgg19bn', 'lstm'];

export interface ModelOptions {
  architecture: Architecture;
  /** Number of classes (10 for CIFAR-10, 100 for CIFAR-100); the vocabulary size for 'lstm'. */
  classes?: number;
  /** 'lstm': hidden (= embedding) size (default 650), layers (2), dropout (0.4). */
  hidden?: number;
  layers?: number;
  dropout?: number;
  /** Seed of the weight initialisation (and of dropout): the same weights on every device. */
  seed?: number;
  /** Where the model lives and trains: 'cpu' (default), 'cuda' (GPU 0) or 'cuda:N'. */
  device?: DeviceName;
  learningRate?: number;
  momentum?: number;
  weightDecay?: number;
  /** Nesterov momentum (default) or plain heavy ball. */
  nesterov?: boolean;
  /** Gradient compressor used in the exchange between workers (default none). */
  compressor?: CompressorName;
  /** Initial level of every compressible (>1-D) parameter: PowerSGD rank or TopK ratio. */
  level?: number;
  /** PowerSGD keeps a matrix dense unless (n + m)·r·rate < n·m (default 1; 0 compresses all). */
  minCompressionRate?: number;
  /** Seed of PowerSGD's initial Q, shared by all workers (default 42). */
  compressionSeed?: number;
  /** Accumulate Σ g per parameter for gradientNorms() (default false). */
  accumulateNorms?: boolean;
  /** Exchange gradients with the other workers of this group (default: train alone). */
  group?: ProcessGroup;
  /** Batch norm normalises with its running statistics during training too (default false). */
  frozenBatchNorm?: boolean;
}

export class Model {
  readonly architecture: Architecture;
  readonly classes: number;
  readonly device: DeviceName;
  private engine: NativeEngine | null;
  private readonly params: { name: string; shape: number[] }[];

  private constructor(options: ModelOptions, engine: NativeEngine, params: { name: string; shape: number[] }[]) {
    this.architecture = options.architecture;
    this.classes = options.classes ?? 10;
    this.device = options.device ?? 'cpu';
    this.engine = engine;
    this.params = params;
  }

  /**
   * Builds and initialises the model on its own native thread, on `options.device`. A device that
   * cannot run it rejects with the cause's code (ERR_NO_CUDA, ERR_NO_CUDA_DEVICE, ERR_CUDA_LIBRARY,
   * ERR_UNSUPPORTED).
   */
  static async create(options: ModelOptions): Promise<Model> {
    if (!ARCHITECTURES.includes(options.architecture))
      throw new UsageError(`unknown model '${options.architecture}' (choose one of: ${ARCHITECTURES.join(', ')})`);
    const classes = options.classes ?? 10;
    if (!Number.isInteger(classes) || classes < 2) throw new UsageError(`classes must be an integer ≥ 2, got ${classes}`);
    const device = parseDevice(options.device ?? 'cpu');
    const engine = new binding.Engine({
      model: options.architecture,
      classes,
      seed: options.seed ?? 0,
      device,
      learningRate: options.learningRate ?? 0.1,
      momentum: options.momentum ?? 0.9,
      weightDecay: options.weightDecay ?? 1e-4,
      nesterov: options.nesterov ?? true,
      compressor: options.compressor ?? 'none',
      level: options.level,
      minCompressionRate: options.minCompressionRate,
      compressionSeed: options.compressionSeed,
      accumulateNorms: options.accumulateNorms ?? false,
      group: options.group?.native,
      frozenBatchNorm: options.frozenBatchNorm ?? false,
      hidden: options.hidden,
      layers: options.layers,
      dropout: options.dropout,
    });
    try {
      return new Model(options, engine, await call(engine.ready()));
    } catch (err) {
      await engine.dispose();
      throw err;
    }
  }

  /** @internal The native engine, for the trainer. */
  get native(): NativeEngine {
    if (!this.engine) throw new UsageError('the model has been disposed');
    return this.engine;
  }

  /** Trainable parameters in state_dict order. */
  parameters(): { name: string; shape: number[] }[] {
    return this.params.map((p) => ({ name: p.name, shape: [...p.shape] }));
  }

  parameterCount(): number {
    return this.params.reduce((sum, p) => sum + p.shape.reduce((a, b) => a * b, 1), 0);
  }

  /**
   * One training step: forward, loss and backward on the batcher's next batch (or the mean gradient
   * of the next `microBatches` batches, for a batch larger than fits at once), the gradient
   * exchange and the SGD update. Null at the epoch's end.
   */
  async trainStep(batcher: Batcher, microBatches = 1): Promise<StepResult | null> {
    if (!Number.isInteger(microBatches) || microBatches < 1) throw new UsageError(`microBatches must be a positive integer, got ${microBatches}`);
    return call(this.native.trainStep(batcher.native, microBatches));
  }

  /**
   * Language model: one step on a window of `steps` × `batch` token ids (time-major), predicting
   * `targets`; local gradients are clipped to a global norm of `clipNorm` (0: none) before the
   * exchange. The hidden state is carried to the next window.
   */
  async trainTokens(inputs: Int32Array, targets: Int32Array, steps: number, batch: number, clipNorm = 0): Promise<StepResult> {
    return call(this.native.trainTokens(inputs, targets, steps, batch, clipNorm));
  }

  /** Language model: the loss over a window, without updating (evaluation mode, state carried). */
  async evaluateTokens(inputs: Int32Array, targets: Int32Array, steps: number, batch: number): Promise<StepResult> {
    return call(this.native.evaluateTokens(inputs, targets, steps, batch));
  }

  /** Language model: zeroes the carried hidden and cell states. */
  async resetState(): Promise<void> {
    await call(this.native.resetState());
  }

  /** Loss and correct predictions over the batcher's current epoch, in evaluation mode. */
  async evaluate(batcher: Batcher): Promise<StepResult> {
    return call(this.native.evaluate(batcher.native));
  }

  /** Logits (N × classes, row-major) for N images given as float32 NCHW (N, 3, height, width). */
  async predict(images: Float32Array, count: number, height = 32, width = 32): Promise<Float32Array> {
    if (images.length !== count * 3 * height * width)
      throw new UsageError(`predict: ${images.length} floats do not make ${count} images of 3×${height}×${width}`);
    return call(this.native.predict(images, count, height, width));
  }

  /** The state_dict (optionally with optimiser and random-stream state) as named tensors. */
  async stateDict(includeTrainer = false): Promise<NamedTensor[]> {
    const entries = await call(this.native.getState(includeTrainer));
    return entries.map((e) => ({ name: e.name, dtype: e.dtype, shape: e.shape, data: new Uint8Array(e.data as ArrayBuffer) }));
  }

  /** Loads named tensors; every state_dict entry must be present with its shape and dtype. */
  async loadStateDict(tensors: Iterable<NamedTensor>): Promise<void> {
    const entries: StateEntry[] = [];
    for (const t of tensors) {
      if (t.dtype !== 'F32' && t.dtype !== 'I64' && t.dtype !== 'F64')
        throw new CheckpointError(`tensor '${t.name}' has dtype ${t.dtype}; the engine's state uses F32, F64 and I64`);
      const bad = firstNonFinite(t);
      if (bad)
        throw new CheckpointError(
          `tensor '${t.name}' holds non-finite values (${bad.value} at element ${bad.index}${bad.count > 1 ? `, ${bad.count} such elements in all` : ''}); ` +
            'such a state cannot be loaded (training had diverged before it was saved, or the file was altered)',
        );
      entries.push({ name: t.name, dtype: t.dtype, shape: t.shape, data: t.data });
    }
    await call(this.native.setState(entries));
  }

  /** Writes the weights (PyTorch state_dict) to a safetensors file, atomically. */
  async save(path: string, metadata: Record<string, string> = {}): Promise<void> {
    writeSafetensors(path, await this.stateDict(false), { format: 'pt', architecture: this.architecture, classes: String(this.classes), ...metadata });
  }

  /** Loads weights from a safetensors file (ours, or a PyTorch state_dict in that layout). */
  async load(path: string): Promise<void> {
    const { tensors } = readSafetensors(path);
    try {
      await this.loadStateDict(tensors.values());
    } catch (err) {
      throw new CheckpointError(`${path}: ${(err as Error).message}`);
    }
  }

  /** Per parameter (state_dict order): PowerSGD rank or TopK ratio; 0 for parameters sent dense. */
  async levels(): Promise<Float64Array> {
    return call(this.native.levels());
  }

  /**
   * Sets every compressible parameter's level (entries of 1-D parameters are ignored). Validated as a
   * whole before any is applied; a change keeps the error memory and re-draws PowerSGD's Q.
   */
  async setLevels(levels: Float64Array | number[]): Promise<void> {
    await call(this.native.setLevels(Float64Array.from(levels)));
  }

  /** ‖Σ g‖₂ per parameter over the steps since the last call (raw local gradients), then restarts. */
  async gradientNorms(): Promise<Float64Array> {
    return call(this.native.gradientNorms());
  }

  /** Every parameter and running statistic takes rank `root`'s values (data-parallel start). */
  async broadcastState(root = 0): Promise<void> {
    await call(this.native.broadcastState(root));
  }

  async setLearningRate(lr: number): Promise<void> {
    await call(this.native.setLearningRate(lr));
  }

  /** Bytes of device memory the model's tensors hold now and held at most (0 on the CPU). */
  async memoryStats(): Promise<MemoryStats> {
    return call(this.native.memoryStats());
  }

  /** Frees the native memory once queued work is done. Further calls throw. */
  async dispose(): Promise<void> {
    const engine = this.engine;
    this.engine = null;
    if (engine) await engine.dispose();
  }
}

/** The first NaN or infinity of a floating-point tensor (and how many there are), or undefined. */
function firstNonFinite(t: NamedTensor): { index: number; value: number; count: number } | undefined {
  if (t.dtype !== 'F32' && t.dtype !== 'F64') return undefined;
  const size = t.dtype === 'F32' ? 4 : 8;
  const n = Math.floor(t.data.byteLength / size);
  // Safetensors data need not be aligned for a typed-array view: copy when it is not.
  const bytes = t.data.byteOffset % size === 0 ? t.data : t.data.slice();
  const values = t.dtype === 'F32' ? new Float32Array(bytes.buffer, bytes.byteOffset, n) : new Float64Array(bytes.buffer, bytes.byteOffset, n);
  let first = -1;
  let count = 0;
  for (let i = 0; i < n; i++) {
    const v = values[i]!;
    if (v - v !== 0) {
      if (first < 0) first = i;
      count++;
    }
  }
  return first < 0 ? undefined : { index: first, value: values[first]!, count };
}
