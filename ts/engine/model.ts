/**
 * A model with its optimiser, living in native memory. Weights use PyTorch's state_dict names, so a
 * `save()`d file loads in PyTorch (`load_state_dict(..., strict=True)`) and a PyTorch state_dict in
 * safetensors layout loads here.
 */
import { binding, call, type CompressorName, type ExchangePlan, type LevelCost, type MemoryStats, type NativeBatch, type NativeEngine, type StepResult } from '../native/binding.js';
import { parseDevice, type DeviceName } from '../native/device.js';
import { Batcher } from './batcher.js';
import { ProcessGroup } from '../comm/group.js';
import { readSafetensors, writeSafetensors, type NamedTensor } from './safetensors.js';
import { AccordionError, CheckpointError, UsageError } from '../base/errors.js';
import { ARCHITECTURES, DEFAULT_CONFIG, type Architecture } from '../config/options.js';
import { compressionSpec } from '../config/compression.js';
import { checkImages, describe, ids, imageSize, stateEntries, tokenWindow, type ForwardOptions, type HiddenState, type ImageBatch, type TokenWindow } from './inputs.js';
import { MAX_CLASSES, checkOptions, estimateMemory, modelDefault, type ModelOptions } from './model-options.js';

export { ARCHITECTURES, type Architecture } from '../config/options.js';
export type { ForwardOptions, HiddenState, ImageBatch, TokenWindow } from './inputs.js';
export { DEFAULT_BUCKET_MB, type ModelOptions } from './model-options.js';

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
    checkOptions(options);
    estimateMemory(
      options.architecture,
      classes,
      options.hidden ?? modelDefault('hidden', options),
      options.layers ?? modelDefault('layers', options),
      options.width ?? modelDefault('width', options),
    );
    const device = parseDevice(options.device ?? 'cpu');
    const compressor = options.compressor ?? modelDefault('compressor', options);
    const engine = new binding.Engine({
      model: options.architecture,
      classes,
      seed: options.seed ?? modelDefault('seed', options),
      device,
      convAlgorithms: options.convAlgorithms ?? modelDefault('convAlgorithms', options),
      tf32: options.tf32 ?? modelDefault('tf32', options),
      memoryFormat: options.memoryFormat ?? modelDefault('memoryFormat', options),
      distBackend: options.distBackend ?? modelDefault('distBackend', options),
      learningRate: options.learningRate ?? modelDefault('lr', options),
      momentum: options.momentum ?? modelDefault('momentum', options),
      weightDecay: options.weightDecay ?? modelDefault('weightDecay', options),
      nesterov: options.nesterov ?? modelDefault('nesterov', options),
      compressor,
      level: options.level ?? (compressor === 'none' ? undefined : compressionSpec({ ...DEFAULT_CONFIG, compressor }).reference),
      minCompressionRate: options.minCompressionRate ?? modelDefault('minCompressionRate', options),
      compressionSeed: options.compressionSeed ?? modelDefault('compressionSeed', options),
      commDtype: options.commDtype ?? modelDefault('commDtype', options),
      accumulateNorms: options.accumulateNorms ?? false,
      group: options.group?.native,
      frozenBatchNorm: options.frozenBatchNorm ?? false,
      broadcastBuffers: options.broadcastBuffers ?? true,
      width: options.width ?? modelDefault('width', options),
      precision: options.precision ?? modelDefault('precision', options),
      hidden: options.hidden ?? modelDefault('hidden', options),
      layers: options.layers ?? modelDefault('layers', options),
      dropout: options.dropout ?? modelDefault('dropout', options),
      keepGradients: options.keepGradients ?? false,
      bucketBytes: Math.round((options.bucketMb ?? modelDefault('bucketMb', options)) * 2 ** 20),
      clipNorm: options.clipNorm ?? modelDefault('clip', options),
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
   * One training step: forward, loss and backward, clipping (the clipNorm option), the gradient
   * exchange (with compression) and the SGD update.
   * - `trainStep(batcher, microBatches = 1)`: on the batcher's next batch (or the mean gradient of
   *   the next `microBatches` batches, for a batch larger than fits at once); null at the epoch's end.
   * - `trainStep({ images, labels, height?, width? })`: on the caller's tensors (an image model):
   *   N normalised images as float32 NCHW and N labels, exactly as a batcher's batch of them.
   * - `trainStep({ tokens, targets, steps, batch })`: the language model on a window of token ids
   *   (time-major); the hidden state is carried to the next window.
   * - `trainStep([batch, …])`: the mean gradient of several of the caller's batches (micro-batches;
   *   consecutive windows for the language model, the state carried from one to the next).
   * Arguments are validated before any native work; the arrays must not change until it resolves.
   */
  async trainStep(batcher: Batcher, microBatches?: number): Promise<StepResult | null>;
  async trainStep(data: ImageBatch | TokenWindow | (ImageBatch | TokenWindow)[]): Promise<StepResult>;
  async trainStep(source: Batcher | ImageBatch | TokenWindow | (ImageBatch | TokenWindow)[], microBatches = 1): Promise<StepResult | null> {
    if (source instanceof Batcher) {
      if (!Number.isInteger(microBatches) || microBatches < 1) throw new UsageError(`microBatches must be a positive integer, got ${microBatches}`);
      return call(this.native.trainStep(source.native, microBatches));
    }
    const list = Array.isArray(source) ? source : [source];
    if (list.length === 0) throw new UsageError('trainStep: an empty list of batches');
    return call(this.native.trainStep(list.map((b) => this.nativeBatch(b, 'trainStep'))));
  }

  /** Loss and correct predictions, in evaluation mode, over the batcher's current epoch or one of the caller's batches (as trainStep's). */
  async evaluate(source: Batcher | ImageBatch | TokenWindow): Promise<StepResult> {
    if (source instanceof Batcher) return call(this.native.evaluate(source.native));
    return call(this.native.evaluate(this.nativeBatch(source, 'evaluate')));
  }

  /** A caller's batch with its labels (or targets), checked, as the engine takes it. */
  private nativeBatch(source: ImageBatch | TokenWindow, where: string): NativeBatch {
    if (typeof source !== 'object' || source === null)
      throw new UsageError(`${where} takes a Batcher, { images, labels } or { tokens, targets, steps, batch }, got ${describe(source)}`);
    if (this.architecture === 'lstm') {
      if (!('tokens' in source) || 'images' in source)
        throw new UsageError(`${where}: model 'lstm' takes token windows ({ tokens, targets, steps, batch }), not images`);
      const w = source as TokenWindow;
      if (w.targets === undefined) throw new UsageError(`${where}: the window has no targets`);
      const { tokens, targets, steps, batch } = tokenWindow(this.classes, w.tokens, w.targets, w.steps, w.batch, where);
      return { tokens, targets, steps, batch };
    }
    if ('tokens' in source) throw new UsageError(`${where}: model '${this.architecture}' takes images ({ images, labels }), not token windows`);
    const b = source as ImageBatch;
    const labels = ids(b.labels, 'labels', where, this.classes, 'classes');
    const { height, width } = imageSize(this.architecture, b.height, b.width, where);
    return { images: checkImages(b.images, labels.length, height, width, where), labels, height, width };
  }

  /** Language model: zeroes the carried hidden and cell states. */
  async resetState(): Promise<void> {
    await call(this.native.resetState());
  }

  /** Logits (N × classes, row-major) for N images given as float32 NCHW (N, 3, height, width). */
  async predict(images: Float32Array, count: number, height = 32, width = 32): Promise<Float32Array> {
    if (this.architecture === 'lstm') throw new UsageError("predict: model 'lstm' takes token windows; use forward(tokens, { steps, batch })");
    if (!Number.isInteger(count) || count < 1) throw new UsageError(`predict: count must be a positive integer, got ${count}`);
    ({ height, width } = imageSize(this.architecture, height, width, 'predict'));
    if (!(images instanceof Float32Array)) throw new UsageError(`predict: images must be a Float32Array, got ${describe(images)}`);
    if (images.length !== count * 3 * height * width)
      throw new UsageError(`predict: ${images.length} floats do not make ${count} images of 3×${height}×${width}`);
    return call(this.native.forward({ images, count, height, width }, false));
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
      const { tokens, steps, batch } = tokenWindow(this.classes, input as Int32Array, undefined, options.steps, options.batch, 'forward');
      return call(this.native.forward({ tokens, steps, batch }, train));
    }
    const { height, width } = imageSize(this.architecture, options.height, options.width, 'forward');
    if (!(input instanceof Float32Array)) throw new UsageError(`forward: images must be a Float32Array, got ${describe(input)}`);
    const per = 3 * height * width;
    if (input.length === 0 || input.length % per !== 0)
      throw new UsageError(`forward: images hold ${input.length} floats, not a whole positive number of 3×${height}×${width} images`);
    return call(this.native.forward({ images: input, count: input.length / per, height, width }, train));
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
    const { entries, cast } = stateEntries(tensors);
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

  /**
   * Per parameter (state_dict order): PowerSGD rank or TopK ratio; 0 for parameters sent dense,
   * DENSE_BF16 (-1) for a matrix sent dense in bf16 through its error memory.
   */
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
   * Per parameter, what each candidate level (a PowerSGD rank or TopK ratio; 0: dense; DENSE_BF16:
   * dense in bf16) would cost on the sum of its raw local gradients since the last gradientNorms():
   * relative error, floats and bytes per step, kernel seconds. An empty list for 1-D parameters. Needs accumulateNorms; call it before
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

  /**
   * Bytes the model's tensors hold now (device memory; on the CPU, host memory) and held at most;
   * with `resetPeak` the peak restarts at the bytes held now once read (as
   * torch.cuda.reset_peak_memory_stats), so that a benchmark can measure its steps after a warm-up.
   */
  async memoryStats(options: { resetPeak?: boolean } = {}): Promise<MemoryStats> {
    return call(this.native.memoryStats(options.resetPeak === true));
  }

  /** Frees the native memory once queued work is done. Further calls throw. */
  async dispose(): Promise<void> {
    const engine = this.engine;
    this.engine = null;
    if (engine) await engine.dispose();
  }
}
