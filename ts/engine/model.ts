/**
 * A model with its optimiser, living in native memory. Weights use PyTorch's state_dict names, so a
 * `save()`d file loads in PyTorch (`load_state_dict(..., strict=True)`) and a PyTorch state_dict in
 * safetensors layout loads here.
 */
import * as os from 'node:os';
import { binding, call, type CompressorName, type ExchangePlan, type LevelCost, type MemoryStats, type NativeEngine, type StateEntry, type StepResult } from './native.js';
import { parseDevice, type DeviceName } from './device.js';
import { Batcher } from './batcher.js';
import { ProcessGroup } from './cluster/group.js';
import { readSafetensors, writeSafetensors, type NamedTensor } from './safetensors.js';
import { AccordionError, CheckpointError, UsageError } from './errors.js';

export type Architecture = 'resnet18' | 'vgg19bn' | 'lstm';
export const ARCHITECTURES: readonly Architecture[] = ['resnet18', 'vgg19bn', 'lstm'];

export interface ModelOptions {
  architecture: Architecture;
  /** Number of classes (10 for CIFAR-10, 100 for CIFAR-100); the vocabulary size for 'lstm'. */
  classes?: number;
  /** 'lstm': hidden (= embedding) size (default 650), layers (2). */
  hidden?: number;
  layers?: number;
  /** Dropout probability in [0, 1): the LSTM's (default 0.4) or VGG's classifier's (default 0.5); 0 turns it off. */
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
  /**
   * With a group, an image model on the CPU: buckets of at most this many MiB of gradients (as
   * PyTorch DDP's bucket_cap_mb, default 25) are compressed and exchanged by a communication thread
   * while backward still runs; 0 exchanges everything after backward.
   */
  bucketMb?: number;
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

/** A batch of the caller's images for Model.trainStep. */
export interface ImageBatch {
  /** N images as float32 NCHW (N, 3, height, width), already normalised. */
  images: Float32Array;
  /** N class indices in [0, classes). */
  labels: Int32Array | readonly number[];
  /** Image size (default 32 × 32; VGG takes 32 × 32 only). */
  height?: number;
  width?: number;
}

/** A window of token ids for the language model's Model.trainStep: (steps, batch) time-major. */
export interface TokenWindow {
  /** steps × batch input token ids, time-major: tokens[t·batch + b]. */
  tokens: Int32Array | readonly number[];
  /** The token to predict at each position (usually the next one), same layout. */
  targets: Int32Array | readonly number[];
  steps: number;
  batch: number;
  /** Clip the local gradients to this global norm before the exchange (default 0: no clipping). */
  clipNorm?: number;
}

/** Options of Model.forward. */
export interface ForwardOptions {
  /** Training mode (batch statistics, which batch norm folds into its running ones; dropout) or evaluation (default). */
  train?: boolean;
  /** Images: size of each image (default 32 × 32). */
  height?: number;
  width?: number;
  /** Language model: the window's layout (tokens.length = steps × batch). */
  steps?: number;
  batch?: number;
}

/** The language model's carried state: per layer, h and c, each (batch, hidden) row-major. */
export interface HiddenState {
  batch: number;
  h: Float32Array[];
  c: Float32Array[];
}

export class Model {
  readonly architecture: Architecture;
  readonly classes: number;
  readonly device: DeviceName;
  private engine: NativeEngine | null;
  private readonly params: { name: string; shape: number[] }[];
  private readonly keepsGradients: boolean;
  private readonly layerCount: number;
  private readonly hiddenSize: number;
  private readonly group?: ProcessGroup;

  private constructor(options: ModelOptions, engine: NativeEngine, params: { name: string; shape: number[] }[]) {
    this.architecture = options.architecture;
    this.classes = options.classes ?? 10;
    this.device = options.device ?? 'cpu';
    this.engine = engine;
    this.params = params;
    this.keepsGradients = options.keepGradients ?? false;
    this.layerCount = options.layers ?? 2;
    this.hiddenSize = options.hidden ?? 650;
    this.group = options.group;
  }

  /**
   * Builds and initialises the model on its own native thread, on `options.device`. A device that
   * cannot run it rejects with the cause's code (ERR_NO_CUDA, ERR_NO_CUDA_DEVICE, ERR_CUDA_LIBRARY,
   * ERR_UNSUPPORTED).
   */
  static async create(options: ModelOptions): Promise<Model> {
    if (typeof options !== 'object' || options === null) throw new UsageError(`Model.create: options must be an object, got ${describe(options)}`);
    if (!ARCHITECTURES.includes(options.architecture))
      throw new UsageError(`unknown model '${options.architecture}' (choose one of: ${ARCHITECTURES.join(', ')})`);
    const classes = options.classes ?? 10;
    if (!Number.isInteger(classes) || classes < 2 || classes > MAX_CLASSES)
      throw new UsageError(`classes must be an integer ≥ 2 (at most ${MAX_CLASSES}), got ${describe(classes)}`);
    if (options.dropout !== undefined && !(typeof options.dropout === 'number' && options.dropout >= 0 && options.dropout < 1))
      throw new UsageError(`dropout must be a number in [0, 1), got ${options.dropout}`);
    checkOptions(options);
    estimateMemory(options.architecture, classes, options.hidden ?? 650, options.layers ?? 2);
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
      broadcastBuffers: options.broadcastBuffers ?? true,
      hidden: options.hidden,
      layers: options.layers,
      dropout: options.dropout,
      keepGradients: options.keepGradients ?? false,
      bucketBytes: Math.round((options.bucketMb ?? DEFAULT_BUCKET_MB) * 2 ** 20),
      threads: options.threads ?? 0,
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
   * One training step: forward, loss and backward, the gradient exchange (with compression) and the
   * SGD update.
   * - `trainStep(batcher, microBatches = 1)`: on the batcher's next batch (or the mean gradient of
   *   the next `microBatches` batches, for a batch larger than fits at once); null at the epoch's end.
   * - `trainStep({ images, labels, height?, width? })`: on the caller's tensors (an image model):
   *   N normalised images as float32 NCHW and N labels, exactly as a batcher's batch of them.
   * - `trainStep({ tokens, targets, steps, batch, clipNorm? })`: the language model on a window of
   *   token ids (time-major), as trainTokens; the hidden state is carried to the next window.
   * Arguments are validated before any native work; the arrays must not change until it resolves.
   */
  async trainStep(batcher: Batcher, microBatches?: number): Promise<StepResult | null>;
  async trainStep(data: ImageBatch | TokenWindow): Promise<StepResult>;
  async trainStep(source: Batcher | ImageBatch | TokenWindow, microBatches = 1): Promise<StepResult | null> {
    if (source instanceof Batcher) {
      if (!Number.isInteger(microBatches) || microBatches < 1) throw new UsageError(`microBatches must be a positive integer, got ${microBatches}`);
      return call(this.native.trainStep(source.native, microBatches));
    }
    if (typeof source !== 'object' || source === null)
      throw new UsageError(`trainStep takes a Batcher, { images, labels } or { tokens, targets, steps, batch }, got ${describe(source)}`);
    if (this.architecture === 'lstm') {
      if (!('tokens' in source)) throw new UsageError("trainStep: model 'lstm' trains on token windows ({ tokens, targets, steps, batch })");
      if ('images' in source) throw new UsageError("trainStep: model 'lstm' trains on token windows ({ tokens, targets, steps, batch }), not images");
      const w = source as TokenWindow;
      const { tokens, targets, steps, batch } = this.tokenWindow(w.tokens, w.targets, w.steps, w.batch, 'trainStep');
      const clipNorm = w.clipNorm ?? 0;
      if (typeof clipNorm !== 'number' || !(clipNorm >= 0) || clipNorm === Infinity)
        throw new UsageError(`trainStep: clipNorm must be a finite number ≥ 0, got ${String(clipNorm)}`);
      return call(this.native.trainTokens(tokens, targets!, steps, batch, clipNorm));
    }
    if ('tokens' in source) throw new UsageError(`trainStep: model '${this.architecture}' trains on images ({ images, labels }), not token windows`);
    const b = source as ImageBatch;
    const labels = this.ids(b.labels, 'labels', 'trainStep', this.classes, 'classes');
    const { height, width } = this.imageSize(b.height, b.width, 'trainStep');
    const images = this.images(b.images, labels.length, height, width, 'trainStep');
    return call(this.native.trainOn(images, labels, height, width));
  }

  /**
   * Language model: one step on a window of `steps` × `batch` token ids (time-major), predicting
   * `targets`; local gradients are clipped to a global norm of `clipNorm` (0: none) before the
   * exchange. The hidden state is carried to the next window.
   */
  async trainTokens(inputs: Int32Array, targets: Int32Array, steps: number, batch: number, clipNorm = 0): Promise<StepResult> {
    return this.trainStep({ tokens: inputs, targets, steps, batch, clipNorm });
  }

  /** Language model: the loss over a window, without updating (evaluation mode, state carried). */
  async evaluateTokens(inputs: Int32Array, targets: Int32Array, steps: number, batch: number): Promise<StepResult> {
    if (this.architecture !== 'lstm') throw new UsageError(`evaluateTokens: model '${this.architecture}' takes images, not token windows`);
    const w = this.tokenWindow(inputs, targets, steps, batch, 'evaluateTokens');
    return call(this.native.evaluateTokens(w.tokens, w.targets!, w.steps, w.batch));
  }

  /** Language model: zeroes the carried hidden and cell states. */
  async resetState(): Promise<void> {
    await call(this.native.resetState());
  }

  /** Loss and correct predictions over the batcher's current epoch, in evaluation mode. */
  async evaluate(batcher: Batcher): Promise<StepResult> {
    if (!(batcher instanceof Batcher)) throw new UsageError(`evaluate takes a Batcher, got ${describe(batcher)}`);
    return call(this.native.evaluate(batcher.native));
  }

  /** Logits (N × classes, row-major) for N images given as float32 NCHW (N, 3, height, width). */
  async predict(images: Float32Array, count: number, height = 32, width = 32): Promise<Float32Array> {
    if (this.architecture === 'lstm') throw new UsageError("predict: model 'lstm' takes token windows; use forward(tokens, { steps, batch })");
    if (!Number.isInteger(count) || count < 1) throw new UsageError(`predict: count must be a positive integer, got ${count}`);
    ({ height, width } = this.imageSize(height, width, 'predict'));
    if (!(images instanceof Float32Array)) throw new UsageError(`predict: images must be a Float32Array, got ${describe(images)}`);
    if (images.length !== count * 3 * height * width)
      throw new UsageError(`predict: ${images.length} floats do not make ${count} images of 3×${height}×${width}`);
    return call(this.native.predict(images, count, height, width));
  }

  /**
   * Logits in training mode (`train: true`: batch statistics, which batch norm also folds into its
   * running statistics, and dropout drawn) or evaluation mode (default; as predict). Images: float32
   * NCHW (N, 3, height, width), N from the length; returns N × classes, row-major. Language model:
   * `forward(tokens, { steps, batch })` returns the logits of every position (steps·batch × vocabulary,
   * time-major rows), carrying the hidden state as a step does.
   */
  async forward(input: Float32Array | Int32Array | readonly number[], options: ForwardOptions = {}): Promise<Float32Array> {
    if (typeof options !== 'object' || options === null) throw new UsageError(`forward: options must be an object, got ${describe(options)}`);
    const train = options.train ?? false;
    if (typeof train !== 'boolean') throw new UsageError(`forward: train must be a boolean, got ${describe(train)}`);
    if (this.architecture === 'lstm') {
      const { tokens, steps, batch } = this.tokenWindow(input as Int32Array, undefined, options.steps, options.batch, 'forward');
      return call(this.native.forwardTokens(tokens, steps, batch, train));
    }
    const { height, width } = this.imageSize(options.height, options.width, 'forward');
    if (!(input instanceof Float32Array)) throw new UsageError(`forward: images must be a Float32Array, got ${describe(input)}`);
    const per = 3 * height * width;
    if (input.length === 0 || input.length % per !== 0)
      throw new UsageError(`forward: images hold ${input.length} floats, not a whole positive number of 3×${height}×${width} images`);
    return call(this.native.forward(input, input.length / per, height, width, train));
  }

  /**
   * The last step's local gradients by parameter name (after averaging micro-batches and clipping,
   * before the exchange and compression): needs the keepGradients option at create().
   */
  async gradients(): Promise<Map<string, { shape: number[]; data: Float32Array }>> {
    if (!this.keepsGradients) throw new UsageError('gradients: create the model with keepGradients: true to keep each step\'s local gradients');
    const entries = await call(this.native.gradients());
    if (entries.length === 0) throw new UsageError('gradients: no training step has run yet');
    return new Map(entries.map((e) => [e.name, { shape: e.shape, data: e.data }]));
  }

  /** Language model: the carried hidden and cell states (null when none is carried, e.g. after resetState). */
  async hiddenState(): Promise<HiddenState | null> {
    if (this.architecture !== 'lstm') throw new UsageError(`hiddenState: model '${this.architecture}' carries no hidden state`);
    const states = await call(this.native.hiddenState());
    if (states.length === 0) return null;
    const h = states.filter((_, i) => i % 2 === 0);
    const c = states.filter((_, i) => i % 2 === 1);
    return { batch: h[0]!.length / this.hiddenSize, h, c };
  }

  /** Language model: replaces the carried states (per layer, h and c of batch × hidden floats). */
  async setHiddenState(state: HiddenState): Promise<void> {
    if (this.architecture !== 'lstm') throw new UsageError(`setHiddenState: model '${this.architecture}' carries no hidden state`);
    if (typeof state !== 'object' || state === null) throw new UsageError(`setHiddenState: state must be { batch, h, c }, got ${describe(state)}`);
    const { batch, h, c } = state;
    if (!Number.isInteger(batch) || batch < 1) throw new UsageError(`setHiddenState: batch must be a positive integer, got ${String(batch)}`);
    const states: Float32Array[] = [];
    for (const [name, list] of [['h', h], ['c', c]] as const)
      if (!Array.isArray(list) || list.length !== this.layerCount)
        throw new UsageError(`setHiddenState: ${name} must be an array of ${this.layerCount} Float32Arrays (one per layer)`);
    for (let l = 0; l < this.layerCount; l++)
      for (const [name, t] of [['h', h[l]], ['c', c[l]]] as const) {
        if (!(t instanceof Float32Array)) throw new UsageError(`setHiddenState: ${name}[${l}] must be a Float32Array, got ${describe(t)}`);
        if (t.length !== batch * this.hiddenSize)
          throw new UsageError(`setHiddenState: ${name}[${l}] holds ${t.length} floats, not batch × hidden = ${batch}×${this.hiddenSize}`);
        states.push(t);
      }
    await call(this.native.setHiddenState(states, batch));
  }

  /** Height and width of caller images: positive integers (default 32), 32 × 32 for VGG. */
  private imageSize(height: unknown = 32, width: unknown = 32, where: string): { height: number; width: number } {
    for (const [name, v] of [['height', height], ['width', width]] as const)
      if (!Number.isInteger(v) || (v as number) < 1) throw new UsageError(`${where}: ${name} must be a positive integer, got ${describe(v)}`);
    if (this.architecture === 'vgg19bn' && (height !== 32 || width !== 32))
      throw new UsageError(`${where}: model 'vgg19bn' takes 32×32 images, got height ${String(height)} and width ${String(width)}`);
    return { height: height as number, width: width as number };
  }

  /** Checks that `images` is a Float32Array of n × 3 × height × width floats. */
  private images(images: unknown, n: number, height: number, width: number, where: string): Float32Array {
    if (!(images instanceof Float32Array)) throw new UsageError(`${where}: images must be a Float32Array (N, 3, H, W), got ${describe(images)}`);
    if (images.length !== n * 3 * height * width)
      throw new UsageError(`${where}: images hold ${images.length} floats, not ${n} images (one per label) of 3×${height}×${width} = ${n * 3 * height * width}`);
    return images;
  }

  /** Integer ids (labels or tokens) in [0, limit) as an Int32Array, from an Int32Array or a number array. */
  private ids(values: unknown, name: string, where: string, limit: number, what: string): Int32Array {
    let out: Int32Array;
    if (values instanceof Int32Array) out = values;
    else if (Array.isArray(values)) {
      for (let i = 0; i < values.length; i++)
        if (!Number.isInteger(values[i])) throw new UsageError(`${where}: ${name}[${i}] is ${describe(values[i])}, not an integer`);
      out = Int32Array.from(values as number[]);
    } else throw new UsageError(`${where}: ${name} must be an Int32Array or an array of integers, got ${describe(values)}`);
    if (out.length === 0) throw new UsageError(`${where}: ${name} is empty`);
    for (let i = 0; i < out.length; i++)
      if (out[i]! < 0 || out[i]! >= limit)
        throw new UsageError(`${where}: ${name}[${i}] is ${out[i]}, outside the ${what} [0, ${limit})`);
    return out;
  }

  /** A language-model window: token ids (and targets) of steps × batch entries in the vocabulary. */
  private tokenWindow(tokens: unknown, targets: unknown, steps: unknown, batch: unknown, where: string) {
    for (const [name, v] of [['steps', steps], ['batch', batch]] as const)
      if (!Number.isInteger(v) || (v as number) < 1) throw new UsageError(`${where}: ${name} must be a positive integer, got ${describe(v)}`);
    const n = (steps as number) * (batch as number);
    const ids = this.ids(tokens, 'tokens', where, this.classes, 'vocabulary');
    if (ids.length !== n) throw new UsageError(`${where}: tokens hold ${ids.length} ids, not steps × batch = ${n}`);
    let out: Int32Array | undefined;
    if (targets !== undefined) {
      out = this.ids(targets, 'targets', where, this.classes, 'vocabulary');
      if (out.length !== n) throw new UsageError(`${where}: targets hold ${out.length} ids, not steps × batch = ${n}`);
    }
    return { tokens: ids, targets: out, steps: steps as number, batch: batch as number };
  }

  /** The state_dict (optionally with optimiser and random-stream state) as named tensors. */
  async stateDict(includeTrainer = false): Promise<NamedTensor[]> {
    const entries = await call(this.native.getState(includeTrainer));
    return entries.map((e) => ({ name: e.name, dtype: e.dtype, shape: e.shape, data: new Uint8Array(e.data as ArrayBuffer) }));
  }

  /**
   * Loads named tensors, strictly (as PyTorch's load_state_dict(strict=True)): every state_dict entry
   * must be present with its shape, and an unknown name is an error naming it. The language model's
   * `decoder.weight` (PyTorch lists the tied weight twice) must equal `encoder.weight`. Float64
   * tensors of float32 entries are cast to float32, with a note (returned, and emitted as a process
   * warning). Trainer entries ("optimizer.", "compressor.", "rng.") are read where they apply.
   */
  async loadStateDict(tensors: Iterable<NamedTensor>): Promise<string[]> {
    const entries: StateEntry[] = [];
    const cast: string[] = [];
    if (typeof (tensors as Iterable<NamedTensor> | null)?.[Symbol.iterator] !== 'function')
      throw new UsageError(`loadStateDict takes an iterable of named tensors, got ${describe(tensors)}`);
    for (const t of tensors) {
      checkTensor(t);
      if (t.dtype !== 'F32' && t.dtype !== 'I64' && t.dtype !== 'F64')
        throw new CheckpointError(`tensor '${t.name}' has dtype ${t.dtype}; the engine's state uses F32, F64 and I64`);
      const bad = firstNonFinite(t);
      if (bad)
        throw new CheckpointError(
          `tensor '${t.name}' holds non-finite values (${bad.value} at element ${bad.index}${bad.count > 1 ? `, ${bad.count} such elements in all` : ''}); ` +
            'such a state cannot be loaded (training had diverged before it was saved, or the file was altered)',
        );
      if (t.dtype === 'F64' && !F64_ENTRIES.has(t.name)) {
        entries.push({ name: t.name, dtype: 'F32', shape: t.shape, data: toFloat32(t.data) });
        cast.push(t.name);
        continue;
      }
      entries.push({ name: t.name, dtype: t.dtype, shape: t.shape, data: t.data });
    }
    await call(this.native.setState(entries));
    const notes: string[] = [];
    if (cast.length) {
      const note = `cast ${cast.length} float64 tensor${cast.length > 1 ? 's' : ''} to float32: ${cast.map((n) => `'${n}'`).join(', ')}`;
      notes.push(note);
      process.emitWarning(note, { code: 'ACCORDION_CAST_FLOAT64' });
    }
    return notes;
  }

  /**
   * The model entries of a state (weights and buffers, as stateDict() gives them) as PyTorch's
   * state_dict lists them, for files PyTorch loads with load_state_dict(strict=True): the language
   * model's decoder.weight, which is encoder.weight (tied), is written as well, before decoder.bias.
   * Other models' states are returned as they are.
   */
  forPyTorch(tensors: NamedTensor[]): NamedTensor[] {
    const encoder = tensors.find((t) => t.name === 'encoder.weight');
    if (this.architecture !== 'lstm' || !encoder || tensors.some((t) => t.name === 'decoder.weight')) return tensors;
    const decoder: NamedTensor = { ...encoder, name: 'decoder.weight' };
    const at = tensors.findIndex((t) => t.name === 'decoder.bias');
    return at < 0 ? [...tensors, decoder] : [...tensors.slice(0, at), decoder, ...tensors.slice(at)];
  }

  /**
   * Writes the weights (PyTorch state_dict, the language model's tied decoder.weight included) to a
   * safetensors file, atomically.
   */
  async save(path: string, metadata: Record<string, string> = {}): Promise<void> {
    if (typeof path !== 'string' || path === '') throw new UsageError(`save: path must be a file name, got ${describe(path)}`);
    writeSafetensors(path, this.forPyTorch(await this.stateDict(false)), { format: 'pt', architecture: this.architecture, classes: String(this.classes), ...metadata });
  }

  /** Loads weights from a safetensors file (ours, or a PyTorch state_dict in that layout). */
  async load(path: string): Promise<string[]> {
    if (typeof path !== 'string' || path === '') throw new UsageError(`load: path must be a file name, got ${describe(path)}`);
    const { tensors } = readSafetensors(path);
    try {
      return await this.loadStateDict(tensors.values());
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
    if (!(levels instanceof Float64Array) && !(Array.isArray(levels) && levels.every((v) => typeof v === 'number')))
      throw new UsageError(`setLevels takes a Float64Array or an array of numbers, got ${describe(levels)}`);
    await call(this.native.setLevels(Float64Array.from(levels)));
  }

  /**
   * Per parameter, what each candidate level (a PowerSGD rank or TopK ratio; 0: dense) would cost on
   * the sum of its raw local gradients since the last gradientNorms(): relative error, floats per
   * step, kernel seconds. An empty list for 1-D parameters. Needs accumulateNorms; call it before
   * gradientNorms(), which restarts the sums.
   */
  async levelCosts(candidates: number[]): Promise<LevelCost[][]> {
    if (!Array.isArray(candidates) || candidates.length === 0 || !candidates.every((c) => typeof c === 'number' && Number.isFinite(c)))
      throw new UsageError(`levelCosts takes a non-empty array of levels, got ${describe(candidates)}`);
    return call(this.native.levelCosts(candidates));
  }

  /** ‖Σ g‖₂ per parameter over the steps since the last call (raw local gradients), then restarts. */
  async gradientNorms(): Promise<Float64Array> {
    return call(this.native.gradientNorms());
  }

  /** Every parameter and running statistic takes rank `root`'s values (data-parallel start). */
  async broadcastState(root = 0): Promise<void> {
    if (!Number.isInteger(root) || root < 0) throw new UsageError(`broadcastState: root must be a rank (an integer ≥ 0), got ${describe(root)}`);
    await call(this.native.broadcastState(root));
  }

  /**
   * Every running statistic (batch norm's buffers) takes rank `root`'s values, in one broadcast.
   * Resolves to the floats broadcast (0 without buffers or a group).
   */
  async broadcastBuffers(root = 0): Promise<number> {
    if (!Number.isInteger(root) || root < 0) throw new UsageError(`broadcastBuffers: root must be a rank (an integer ≥ 0), got ${describe(root)}`);
    return call(this.native.broadcastBuffers(root));
  }

  /**
   * Brings the workers' replicas together and checks that they agree (a no-op without a group):
   * every worker takes rank 0's running statistics, then the workers compare a 64-bit digest of
   * every state_dict entry in one all-gather. Replicas that differ reject on every worker with
   * ERR_REPLICA_MISMATCH, naming the first entry that differs and the ranks whose value is not
   * rank 0's. PyTorch DDP's state before evaluation and checkpoints: rank 0's model on every worker.
   * Resolves to the floats of the statistics' broadcast.
   */
  async syncReplicas(): Promise<number> {
    const group = this.group;
    if (!group || group.worldSize < 2) return 0;
    const broadcastFloats = await this.broadcastBuffers(0);
    const { names, digests } = await call(this.native.stateDigests());
    // Each digest travels as four 16-bit words, exact in float32.
    const words = new Float32Array(4 * digests.length);
    digests.forEach((d, i) => {
      for (let k = 0; k < 4; k++) words[4 * i + k] = Number((d >> BigInt(16 * k)) & 0xffffn);
    });
    const all = await group.allGather(words);
    for (let i = 0; i < names.length; i++) {
      const ranks: number[] = [];
      for (let r = 1; r < group.worldSize; r++) if ([0, 1, 2, 3].some((k) => all[r * words.length + 4 * i + k] !== all[4 * i + k])) ranks.push(r);
      if (ranks.length)
        throw new AccordionError(
          'ERR_REPLICA_MISMATCH',
          `the workers' models differ: '${names[i]}' on rank${ranks.length > 1 ? 's' : ''} ${ranks.join(', ')} is not rank 0's ` +
            `(every worker should hold the same weights and, after the broadcast, the same running statistics)`,
        );
    }
    return broadcastFloats;
  }

  async setLearningRate(lr: number): Promise<void> {
    if (typeof lr !== 'number' || !Number.isFinite(lr) || lr < 0) throw new UsageError(`setLearningRate: lr must be a finite number ≥ 0, got ${describe(lr)}`);
    await call(this.native.setLearningRate(lr));
  }

  /** The split of the thread budget and the overlapped exchange's buckets (see ExchangePlan). */
  async exchangePlan(): Promise<ExchangePlan> {
    return call(this.native.exchangePlan());
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

/** PyTorch DDP's default bucket size. */
export const DEFAULT_BUCKET_MB = 25;

/** Class ids are int32; the language model's sizes are bounded as the addon bounds them. */
const MAX_CLASSES = 2 ** 31 - 1;
const MAX_HIDDEN = 2 ** 20;
const MAX_LAYERS = 1024;
const COMPRESSORS: readonly CompressorName[] = ['none', 'powersgd', 'topk'];

/** The options of Model.create besides architecture, classes and dropout, checked by type and range. */
function checkOptions(o: ModelOptions): void {
  const integer = (key: keyof ModelOptions, min: number, max: number) => {
    const v = o[key];
    if (v !== undefined && !(Number.isSafeInteger(v) && (v as number) >= min && (v as number) <= max))
      throw new UsageError(`${key} must be an integer from ${min} to ${max}, got ${describe(v)}`);
  };
  integer('hidden', 1, MAX_HIDDEN);
  integer('layers', 1, MAX_LAYERS);
  integer('seed', 0, Number.MAX_SAFE_INTEGER);
  integer('compressionSeed', 0, Number.MAX_SAFE_INTEGER);
  integer('threads', 1, 4096);
  for (const key of ['learningRate', 'momentum', 'weightDecay', 'minCompressionRate', 'bucketMb'] as const) {
    const v = o[key];
    if (v !== undefined && !(typeof v === 'number' && Number.isFinite(v) && v >= 0)) throw new UsageError(`${key} must be a finite number ≥ 0, got ${describe(v)}`);
  }
  if (o.level !== undefined && !(typeof o.level === 'number' && Number.isFinite(o.level) && o.level > 0))
    throw new UsageError(`level must be a positive number (a PowerSGD rank or a TopK ratio), got ${describe(o.level)}`);
  for (const key of ['nesterov', 'accumulateNorms', 'frozenBatchNorm', 'broadcastBuffers', 'keepGradients'] as const)
    if (o[key] !== undefined && typeof o[key] !== 'boolean') throw new UsageError(`${key} must be a boolean, got ${describe(o[key])}`);
  if (o.compressor !== undefined && !COMPRESSORS.includes(o.compressor))
    throw new UsageError(`unknown compressor ${describe(o.compressor)} (choose one of: ${COMPRESSORS.join(', ')})`);
  if (o.group !== undefined && !(o.group instanceof ProcessGroup)) throw new UsageError(`group must be a ProcessGroup, got ${describe(o.group)}`);
}

/**
 * Refuses a model whose weights, gradients, momentum and compressor state (four float32 copies of
 * the parameters) would not fit in this machine's memory, before anything is allocated.
 */
function estimateMemory(architecture: Architecture, classes: number, hidden: number, layers: number): void {
  let parameters: number;
  let sizes: string;
  if (architecture === 'lstm') {
    parameters = classes * hidden + classes + layers * (8 * hidden * hidden + 8 * hidden);
    sizes = `vocabulary (classes) ${classes}, hidden ${hidden}, layers ${layers}`;
  } else if (architecture === 'resnet18') {
    parameters = 11_168_832 + 513 * classes;
    sizes = `${classes} classes`;
  } else {
    const width = classes > 10 ? 4096 : 512;
    parameters = 20_040_000 + 513 * width + (width + 1) * width + (width + 1) * classes;
    sizes = `${classes} classes`;
  }
  const bytes = 16 * parameters;
  const total = os.totalmem();
  if (bytes > total)
    throw new UsageError(
      `model '${architecture}' with ${sizes} has ${parameters.toExponential(2)} parameters: its weights, gradients and optimiser state ` +
        `(${(bytes / 2 ** 30).toFixed(1)} GiB) exceed this machine's memory (${(total / 2 ** 30).toFixed(1)} GiB)`,
    );
}

/** A named tensor as loadStateDict reads it: name, dtype, shape and bytes. */
function checkTensor(t: unknown): asserts t is NamedTensor {
  const e = t as Partial<NamedTensor> | null;
  if (typeof e !== 'object' || e === null) throw new UsageError(`loadStateDict: each tensor must be { name, dtype, shape, data }, got ${describe(t)}`);
  if (typeof e.name !== 'string') throw new UsageError(`loadStateDict: a tensor's name must be a string, got ${describe(e.name)}`);
  if (typeof e.dtype !== 'string') throw new UsageError(`loadStateDict: tensor '${e.name}' has no dtype`);
  if (!Array.isArray(e.shape) || e.shape.some((d) => !Number.isSafeInteger(d) || d < 0))
    throw new UsageError(`loadStateDict: tensor '${e.name}' must have a shape of non-negative integers, got ${describe(e.shape)}`);
  if (!(e.data instanceof Uint8Array)) throw new UsageError(`loadStateDict: tensor '${e.name}' must hold its bytes in a Uint8Array, got ${describe(e.data)}`);
}

/** Entries of the engine's state that are float64 themselves (not cast). */
const F64_ENTRIES = new Set(['compressor.levels']);

/** Float64 little-endian bytes as float32 bytes (rounded to nearest). */
function toFloat32(data: Uint8Array): Uint8Array {
  const bytes = data.byteOffset % 8 === 0 ? data : data.slice();
  const values = new Float64Array(bytes.buffer, bytes.byteOffset, Math.floor(bytes.byteLength / 8));
  return new Uint8Array(Float32Array.from(values).buffer);
}

/** A short description of a value for error messages. */
function describe(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return `an array of ${v.length}`;
  if (ArrayBuffer.isView(v)) return `a ${v.constructor.name} of ${(v as unknown as { length?: number }).length ?? v.byteLength}`;
  if (typeof v === 'object') return `a ${(v as object).constructor?.name ?? 'object'}`;
  if (typeof v === 'string') return `'${v}'`;
  return String(v);
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
