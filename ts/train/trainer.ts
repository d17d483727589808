/**
 * The epoch loop: learning-rate schedule, one native call per training step, evaluation after each
 * epoch, metrics, checkpoints and resume. Everything per element happens in native code.
 */
import { EventEmitter } from 'node:events';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { binding, type CompressorName, type LevelCost, type StepResult } from './native.js';
import { DEFAULT_BUCKET_MB, Model, type Architecture } from './model.js';
import { loadImageDataset, type ImageDatasetName } from './data/datasets.js';
import { readWikiText } from './data/wikitext.js';
import { ImageTask, LanguageTask, type TrainingTask } from './tasks.js';
import { learningRateForEpoch, type LrSchedule } from './schedule.js';
import { MetricsLog } from './metrics.js';
import { ProgressBar, formatCount, formatDuration } from './progress.js';
import { loadCheckpoint, saveCheckpoint } from './checkpoint.js';
import { writeFileAtomicAsync } from './files.js';
import { checkRunDir, clearRun } from './rundir.js';
import { CheckpointError, UsageError } from './errors.js';
import { ProcessGroup, distributedEnv } from './cluster/group.js';
import { endOfEpoch, initialState, wholeModelNorm, type AccordionState, type Regime } from './accordion.js';
import { candidateLevels, measureLink, planLevels, type AutoPlan, type CostModel, type ErrorMeasure } from './auto-levels.js';
import { parseDevice, requireDevice, workerDevice, type DeviceName } from './device.js';

export type DatasetName = ImageDatasetName | 'wikitext2';

export interface TrainConfig {
  model: Architecture;
  /** Where the model trains: 'cpu', 'cuda' (GPU 0) or 'cuda:N'. */
  device: DeviceName;
  dataset: DatasetName;
  /** Directory of the CIFAR binary files; for `synthetic`, where the generated files are cached. */
  dataDir?: string;
  epochs: number;
  /** Batch size per worker. */
  batchSize: number;
  evalBatchSize: number;
  /** Base learning rate for one worker (scaled by the number of workers after warm-up). */
  lr: number;
  momentum: number;
  weightDecay: number;
  nesterov: boolean;
  warmupEpochs: number;
  milestones: number[];
  lrDecay: number;
  seed: number;
  workers: number;
  /** Gradient compressor for the exchange between workers. */
  compressor: CompressorName;
  /** PowerSGD rank (static level). */
  rank: number;
  /** TopK ratio K in (0, 1] (static level). */
  topkRatio: number;
  /** PowerSGD leaves a matrix dense unless (n + m)·r·rate < n·m; 0 compresses every matrix. */
  minCompressionRate: number;
  /**
   * Accordion: switch each weight between a low- and a high-compression level by the rule of
   * ts/accordion.ts. 'auto' turns it on with a compressor unless a static --rank or --topk-ratio
   * was given.
   */
  accordion: 'auto' | 'on' | 'off';
  eta: number;
  /** Epochs between Accordion's checks. */
  accordionInterval: number;
  lowRank: number;
  highRank: number;
  lowRatio: number;
  highRatio: number;
  /**
   * What Accordion adapts: the compression level per layer ('compression'), or the global batch size
   * from `batchLow` to `batchHigh` on the whole-model norm ('batch'). 'smith' is the baseline of Smith
   * et al.: the batch grows at the LR milestones instead of the LR decaying. 'auto' chooses every
   * layer's level from candidates under an error budget (auto-levels.ts) at Accordion's checks;
   * 'batch+compression' grows the batch as 'batch' does and sets the levels as 'compression' does,
   * both from the same norms at the same checks.
   */
  adapt: 'compression' | 'batch' | 'smith' | 'auto' | 'batch+compression';
  /** Global batch sizes of batch-size mode; a step accumulates micro-batches of `batchSize` per worker. */
  batchLow: number;
  batchHigh: number;
  /** --adapt auto: candidate PowerSGD ranks and TopK ratios (besides dense and the reference level). */
  autoRanks: number[];
  autoRatios: number[];
  /** --adapt auto: the budget as a multiple of the reference level's error, and the factor on a critical layer's share. */
  errorBudget: number;
  criticalBudget: number;
  /** --adapt auto: a layer's error in the budget, squared ‖G − C(G)‖² or relative ‖G − C(G)‖ / ‖G‖. */
  errorMeasure: ErrorMeasure;
  /** --adapt auto: a level's cost in floats per step, or in seconds over the link measured at start. */
  autoCost: 'floats' | 'seconds';
  /**
   * Run directory for metrics, configuration and checkpoints; none when undefined. A directory that
   * already holds a run is refused unless `resume` continues it or `overwrite` replaces it.
   */
  outDir?: string;
  /** Replace the run already in `outDir`: its files are removed when training starts (see README). */
  overwrite: boolean;
  /** Checkpoint every this many epochs (and after the last). */
  checkpointEvery: number;
  /** Continue from a run directory or checkpoint directory. */
  resume?: string;
  /** Size of the synthetic dataset. */
  syntheticTrain: number;
  syntheticTest: number;
  /** Language model: hidden (= embedding) size, layers, dropout, BPTT window, gradient-norm clip. */
  hidden: number;
  layers: number;
  dropout: number;
  bptt: number;
  clip: number;
  /** Native threads (default: OMP_NUM_THREADS or all cores); the communication thread of an overlapped exchange takes one. */
  threads?: number;
  /** Buckets of the exchange overlapped with backward, in MiB of gradients (default 25, as DDP); 0: exchange after backward. */
  bucketMb: number;
  /** Timeout of the rendezvous and of every collective, in milliseconds. */
  timeoutMs: number;
  /**
   * Print a progress bar and per-epoch lines to stderr (off by default: a library prints nothing
   * unless asked; the CLI turns it on). The 'step' and 'epoch' events carry the same figures.
   */
  progress: boolean;
}

export const DEFAULT_CONFIG: Omit<TrainConfig, 'model'> = {
  device: 'cpu',
  dataset: 'synthetic',
  epochs: 300,
  batchSize: 64,
  evalBatchSize: 256,
  lr: 0.05,
  momentum: 0.9,
  weightDecay: 1e-4,
  nesterov: true,
  warmupEpochs: 5,
  milestones: [150, 250],
  lrDecay: 0.1,
  seed: 42,
  workers: 1,
  compressor: 'none',
  rank: 2,
  topkRatio: 0.1,
  minCompressionRate: 1,
  accordion: 'auto',
  eta: 0.5,
  accordionInterval: 10,
  lowRank: 2,
  highRank: 1,
  lowRatio: 0.99,
  highRatio: 0.1,
  adapt: 'compression',
  batchLow: 512,
  batchHigh: 4096,
  autoRanks: [1, 2, 4, 8],
  autoRatios: [0.01, 0.02, 0.05, 0.1, 0.2],
  bucketMb: DEFAULT_BUCKET_MB,
  errorBudget: 1,
  criticalBudget: 0.5,
  errorMeasure: 'squared',
  autoCost: 'floats',
  checkpointEvery: 1,
  syntheticTrain: 2560,
  syntheticTest: 1000,
  timeoutMs: 60_000,
  hidden: 650,
  layers: 2,
  dropout: 0.4,
  bptt: 35,
  clip: 0.25,
  overwrite: false,
  progress: false,
};

/**
 * The synthetic dataset is a demonstration: a short schedule on it (a few minutes on 2 cores) with
 * Accordion checking every 2 epochs. The CIFAR datasets use the paper's schedule (DEFAULT_CONFIG).
 * Its rate, 0.02 per worker, trains stably from the first step: at 0.05 ResNet-18's loss jumps to
 * 5–9 within the first steps from PyTorch's initialisation (the engine's and PyTorch's alike), and
 * the epoch's evaluation then reads running statistics that lag far behind the weights
 * (BENCHMARKS.md, "The synthetic recipe beside PyTorch DDP").
 */
export const SYNTHETIC_PRESET: Partial<TrainConfig> = { epochs: 6, batchSize: 64, lr: 0.02, accordionInterval: 2 };

/**
 * The LSTM on WikiText-2 (paper Table 7): LR 2.5 × workers after a 5-epoch warm-up, ÷10 at epochs 60
 * and 80, 90 epochs, batch 20, no weight decay, Accordion every 5 epochs, TopK levels 99% / 2%.
 */
export const LSTM_PRESET: Partial<TrainConfig> = {
  dataset: 'wikitext2',
  epochs: 90,
  batchSize: 20,
  evalBatchSize: 10,
  lr: 2.5,
  weightDecay: 0,
  milestones: [60, 80],
  accordionInterval: 5,
  lowRatio: 0.99,
  highRatio: 0.02,
};

/**
 * Epochs are counted from 1 everywhere a user reads them (the console, metrics.jsonl, summary.json,
 * the events, checkpoint directories): epoch 1 is the first; "after epoch 3" is after 3 epochs.
 */
export interface EpochRecord {
  /** The epoch, from 1. */
  epoch: number;
  lr: number;
  trainLoss: number;
  trainAccuracy: number;
  testLoss: number;
  testAccuracy: number;
  /** Training samples this worker saw (tokens for a language model) in its `steps` optimiser steps. */
  samples: number;
  steps: number;
  seconds: number;
  samplesPerSecond: number;
  /** Language model: validation loss and perplexity, and test perplexity (exp of the mean loss). */
  validLoss?: number;
  validPerplexity?: number;
  testPerplexity?: number;
  /** Floats this worker sent in gradient exchanges during the epoch, and since the run began. */
  floatsSent: number;
  floatsSentTotal: number;
  /** Floats of the epoch's steps' control traffic, not in floatsSent: each step's agreement that
   * every gradient is finite (W floats) and rank 0's running statistics broadcast before it, with
   * W ≥ 2 workers (0 alone). */
  overheadFloats: number;
  /** Floats rank 0 broadcast during the epoch: its running statistics before each step and once
   * more before evaluation (0 alone, or without batch norm). */
  broadcastFloats: number;
  /** Seconds of the epoch's steps spent in compute, compression and communication. */
  computeSeconds: number;
  compressionSeconds: number;
  communicationSeconds: number;
  /** Seconds the epoch's steps waited for the exchange after backward (all of it without overlap). */
  exchangeWaitSeconds: number;
  /** With Accordion: per parameter, its level in this epoch (0: dense), the norm of its summed
   * gradient, and the norm-change ratio when this epoch was a check. */
  levels?: number[];
  norms?: number[];
  ratios?: (number | null)[];
  /** The global batch size of the epoch (workers × per-worker batch × micro-batches). */
  batchSize: number;
  /** Seconds of Accordion's end-of-epoch bookkeeping: reading norms, deciding, broadcasting, setting levels. */
  bookkeepingSeconds: number;
  /** Seconds of the end-of-epoch replica check: rank 0's running statistics broadcast, every state_dict entry's digest compared (0 alone). */
  syncSeconds: number;
  /** --adapt auto, on rank 0 at the epochs where levels were chosen: the budget, the plan and every matrix's candidates. */
  auto?: AutoRecord;
}

/** The plan of automatic levels in an epoch record; costs are floats or seconds per step (`costUnit`). */
export type AutoRecord = AutoPlan & { costUnit: 'floats' | 'seconds' };

interface EpochDecision {
  norms: number[];
  ratios: (number | null)[];
  auto?: AutoRecord;
}

/**
 * The 'step' event, after every training step: the step's own figures and the epoch's running
 * ones, which are what the progress bar shows (step of steps, loss, accuracy, samples/s, ETA).
 */
export interface StepEvent {
  /** The epoch, from 1. */
  epoch: number;
  /** The step within the epoch, from 1 to `steps`. */
  step: number;
  steps: number;
  lr: number;
  /** This step: mean loss, correct predictions, samples (tokens for a language model), floats sent. */
  loss: number;
  correct: number;
  samples: number;
  floatsSent: number;
  /** The epoch so far: mean loss and accuracy over its samples, samples, floats sent. */
  epochLoss: number;
  epochAccuracy: number;
  epochSamples: number;
  epochFloatsSent: number;
  /** Seconds since the epoch's first step began, samples per second, and the estimated seconds left. */
  seconds: number;
  samplesPerSecond: number;
  etaSeconds: number;
}

/** The 'checkpoint' event: the epoch it follows (from 1), its directory, and the seconds it took to write. */
export interface CheckpointEvent {
  epoch: number;
  path: string;
  seconds: number;
}

export interface LevelSwitch {
  /** The epoch (from 1) at whose end the decision was taken; the new level applies from the next one. */
  epoch: number;
  parameter: string;
  from: number;
  to: number;
  reason: 'norm-change' | 'lr-decay' | 'auto';
}

/** Modes whose compression levels Accordion's per-layer rule governs, and those that grow the batch on it. */
const LEVEL_MODES: TrainConfig['adapt'][] = ['compression', 'auto', 'batch+compression'];
const BATCH_MODES: TrainConfig['adapt'][] = ['batch', 'batch+compression'];

/**
 * --adapt auto's state across epochs (and checkpoints): the link measured at the start, and the
 * kernels' seconds per matrix and candidate from the first check, so that resumed runs choose
 * exactly as uninterrupted ones do.
 */
interface AutoState {
  bytesPerSecond?: number;
  latencySeconds?: number;
  kernelSeconds?: number[][];
}

export interface TrainSummary {
  model: Architecture;
  dataset: DatasetName;
  parameters: number;
  epochs: EpochRecord[];
  finalTestAccuracy: number;
  bestTestAccuracy: number;
  compressor: CompressorName;
  accordion: boolean;
  switches: LevelSwitch[];
  floatsSentTotal: number;
  seconds: number;
  runDir?: string;
  /** Set when stop() ended the run before its last epoch was completed. */
  interrupted?: boolean;
}

export interface TrainerContext {
  /** Join this data-parallel group instead of one described by the environment. */
  group?: ProcessGroup;
  /**
   * Replaces the measured per-parameter norms of each epoch's (from 1) summed gradients (for simulations and
   * tests of the switching rule); the measured sums are still read and restarted every epoch.
   */
  gradientNorms?: (epoch: number, rank: number, measured: number[]) => number[];
}

/** Settings that must match between a checkpoint and the run that resumes it. */
const RESUME_MUST_MATCH: (keyof TrainConfig)[] = ['model', 'dataset', 'batchSize', 'workers', 'seed', 'compressor', 'accordion', 'adapt'];

export class Trainer extends EventEmitter {
  readonly config: TrainConfig;
  readonly model: Model;
  /** The data the run iterates over (images or token windows). */
  readonly task: TrainingTask;
  private readonly schedule: LrSchedule;
  private startEpoch = 0;
  private history: EpochRecord[] = [];
  private metrics?: MetricsLog;
  private stopRequested = false;
  /** The workers of a data-parallel run (undefined when training alone). */
  readonly group?: ProcessGroup;
  private readonly ownsGroup: boolean;
  /** Accordion's rule state (decisions are rank 0's), and the switches so far. */
  private accordionState?: AccordionState;
  private switches: LevelSwitch[] = [];
  /** Batch-size mode: the current global batch and the rule's state on the whole-model norm. */
  private globalBatch: number;
  private batchState?: AccordionState;
  private autoState: AutoState = {};
  private readonly matrices: boolean[];
  private normSource?: TrainerContext['gradientNorms'];

  private constructor(config: TrainConfig, task: TrainingTask, model: Model, group: ProcessGroup | undefined, ownsGroup: boolean) {
    super();
    this.config = config;
    this.task = task;
    this.model = model;
    this.group = group;
    this.ownsGroup = ownsGroup;
    this.matrices = model.parameters().map((p) => p.shape.length > 1);
    if (config.accordion === 'on') this.accordionState = initialState(this.matrices.length);
    this.globalBatch = config.adapt === 'compression' || config.adapt === 'auto' ? config.batchSize * config.workers : config.batchLow;
    if (BATCH_MODES.includes(config.adapt)) this.batchState = initialState(1);
    this.schedule = {
      base: config.lr,
      workers: config.workers,
      warmupEpochs: config.warmupEpochs,
      milestones: config.milestones,
      decay: config.lrDecay,
    };
  }

  /** This worker's rank (0 when training alone); rank 0 reports, logs and writes the model. */
  get rank(): number {
    return this.group?.rank ?? 0;
  }

  /**
   * Reads the data, builds the model and, with `resume`, restores the checkpoint. In a process
   * started by the launcher (RANK, WORLD_SIZE … in the environment) or given `group`, it joins the
   * data-parallel job: the workers check that their configurations agree, and start from rank 0's
   * weights (resuming, each rank from its own checkpointed state).
   */
  static async create(options: Partial<TrainConfig> & { model: Architecture }, context: TrainerContext = {}): Promise<Trainer> {
    const preset = options.model === 'lstm' ? LSTM_PRESET : (options.dataset ?? DEFAULT_CONFIG.dataset) === 'synthetic' ? SYNTHETIC_PRESET : {};
    const config: TrainConfig = { ...DEFAULT_CONFIG, ...preset, ...options };
    if ((config.model === 'lstm') !== (config.dataset === 'wikitext2'))
      throw new UsageError(
        config.model === 'lstm' ? `the lstm model trains on --dataset wikitext2, not ${config.dataset}` : `--dataset wikitext2 is for --model lstm`,
      );
    if (config.model === 'lstm' && config.adapt !== 'compression' && config.adapt !== 'auto')
      throw new UsageError(`batch-size adaptation (--adapt ${config.adapt}) is for the vision models`);
    // Automatic levels and the joint mode run on Accordion's regimes.
    const regimeModes = config.adapt === 'auto' || config.adapt === 'batch+compression';
    if (regimeModes && config.compressor === 'none') throw new UsageError(`--adapt ${config.adapt} needs a compressor (--compressor powersgd or topk)`);
    if (regimeModes && config.accordion === 'off') throw new UsageError(`--adapt ${config.adapt} runs on Accordion's regimes: leave out --accordion off`);
    if (config.accordion === 'auto')
      config.accordion =
        regimeModes ||
        (config.adapt === 'compression' && config.compressor !== 'none' && options.rank === undefined && options.topkRatio === undefined)
          ? 'on'
          : 'off';
    if (config.accordion === 'on' && !LEVEL_MODES.includes(config.adapt))
      throw new UsageError(`--adapt ${config.adapt} adapts the batch size; per-layer compression (--accordion on) goes with --adapt compression, auto or batch+compression`);
    if (config.accordion === 'on' && config.compressor === 'none')
      throw new UsageError('--accordion on needs a compressor (--compressor powersgd or topk)');
    // With --adapt auto, --rank and --topk-ratio name the reference level of the error budget.
    if (config.accordion === 'on' && config.adapt !== 'auto' && (options.rank !== undefined || options.topkRatio !== undefined))
      throw new UsageError('--rank and --topk-ratio set a static level; with --accordion on use --low-rank/--high-rank or --low-ratio/--high-ratio');
    validateConfig(config);
    const env = context.group ? undefined : distributedEnv();
    const worldSize = context.group?.worldSize ?? env?.worldSize ?? 1;
    const job = { rank: context.group?.rank ?? env?.rank ?? 0, localRank: (env ?? distributedEnv())?.localRank ?? 0, worldSize };
    config.device = workerDevice(config.device, job);
    // Before any data is read: a device that cannot train fails the run at once.
    requireDevice(config.device);
    if (options.workers !== undefined && options.workers !== worldSize)
      throw new UsageError(
        worldSize === 1
          ? `--workers ${options.workers} starts ${options.workers} processes only through the launcher: use npm run train -- --workers ${options.workers} … or accordion launch`
          : `--workers ${options.workers} does not match the job's WORLD_SIZE ${worldSize}`,
      );
    config.workers = worldSize;
    // Before any data is read or any worker joins: rank 0, which writes the run directory, refuses
    // to train over another run.
    if (job.rank === 0) checkRunDir(config);
    if (config.adapt !== 'compression' && config.adapt !== 'auto')
      for (const key of ['batchLow', 'batchHigh'] as const)
        if (config[key] % (config.batchSize * worldSize) !== 0)
          throw new UsageError(
            `${key} ${config[key]} must be a multiple of batchSize × workers = ${config.batchSize * worldSize} (a step accumulates whole micro-batches)`,
          );
    const threads = config.threads ?? (Number(process.env.OMP_NUM_THREADS) || undefined);
    if (threads) binding.setThreads(threads);
    const group = context.group ?? (env ? await ProcessGroup.fromEnv(env, config.timeoutMs) : undefined);
    try {
      const rank = group?.rank ?? 0;
      if (group) {
        // Each worker has its own GPU (cuda:LOCAL_RANK): the workers agree on the kind of device.
        const { threads: _threads, progress: _progress, overwrite: _overwrite, device, ...shared } = config;
        await group.checkConfig({ ...shared, device: device === 'cpu' ? 'cpu' : 'cuda' });
      }
      const checkpoint = config.resume ? loadCheckpoint(config.resume, rank) : undefined;
      if (checkpoint) {
        const saved = checkpoint.position.config as Partial<TrainConfig>;
        for (const key of RESUME_MUST_MATCH) {
          if (JSON.stringify(saved[key]) !== JSON.stringify(config[key]))
            throw new CheckpointError(
              `cannot resume from ${checkpoint.dir}: it was trained with ${key} = ${JSON.stringify(saved[key])}, this run has ${JSON.stringify(config[key])}`,
            );
        }
        config.outDir ??= path.resolve(checkpoint.dir, '..', '..');
      }
      const shard = { rank, worldSize: config.workers };
      const task: TrainingTask =
        config.dataset === 'wikitext2'
          ? new LanguageTask(readWikiText(config.dataDir!), { ...config, ...shard })
          : new ImageTask(
              loadImageDataset(config.dataset, config.dataDir, { train: config.syntheticTrain, test: config.syntheticTest, seed: config.seed }),
              { ...config, ...shard },
            );
      const accordion = config.accordion === 'on';
      const adaptBatch = BATCH_MODES.includes(config.adapt);
      // Accordion starts at its low level; automatic levels start at the reference level.
      const lowLevel = accordion && config.adapt !== 'auto';
      const level =
        config.compressor === 'topk' ? (lowLevel ? config.lowRatio : config.topkRatio) : lowLevel ? config.lowRank : config.rank;
      const model = await Model.create({
        architecture: config.model,
        device: config.device,
        classes: task.classes,
        hidden: config.hidden,
        layers: config.layers,
        dropout: config.dropout,
        seed: config.seed,
        learningRate: config.lr,
        momentum: config.momentum,
        weightDecay: config.weightDecay,
        nesterov: config.nesterov,
        compressor: config.compressor,
        level,
        minCompressionRate: config.minCompressionRate,
        accumulateNorms: accordion || adaptBatch,
        group,
        bucketMb: config.bucketMb,
        threads,
      });
      const trainer = new Trainer(config, task, model, group, !context.group);
      trainer.normSource = context.gradientNorms;
      if (checkpoint) {
        try {
          // Checked before any training: a diverged checkpoint (NaN weights) is named as such here
          // rather than surfacing later as a NaN loss.
          await trainer.model.loadStateDict([...checkpoint.model, ...checkpoint.trainer]);
        } catch (err) {
          // Non-finite values, and entries that do not match the model (ERR_STATE_MISMATCH).
          if (!(err instanceof CheckpointError) && (err as { code?: string }).code !== 'ERR_STATE_MISMATCH') throw err;
          throw new CheckpointError(`cannot resume from ${checkpoint.dir}: ${(err as Error).message}`);
        }
        const extra = checkpoint.position.extra;
        trainer.startEpoch = checkpoint.position.epochsCompleted;
        trainer.history = (extra.history as EpochRecord[] | undefined) ?? [];
        trainer.switches = (extra.switches as LevelSwitch[] | undefined) ?? [];
        // A checkpoint written while records counted epochs from 0: its last record is then one
        // short of the epochs completed. Renumbered, so that summary.json counts one way.
        if (trainer.history.at(-1)?.epoch === trainer.startEpoch - 1) {
          for (const e of trainer.history) e.epoch += 1;
          for (const s of trainer.switches) s.epoch += 1;
        }
        if (accordion) trainer.accordionState = extra.accordion as AccordionState;
        if (adaptBatch) trainer.batchState = extra.batch as AccordionState;
        if (extra.auto) trainer.autoState = extra.auto as AutoState;
        if (typeof extra.globalBatch === 'number') trainer.globalBatch = extra.globalBatch;
      }
      // A fresh job starts from rank 0's weights; a resumed one has restored every rank's own state
      // (the same weights and, synced before every checkpoint, rank 0's running statistics).
      if (group && !checkpoint) await model.broadcastState(0);
      return trainer;
    } catch (err) {
      if (!context.group) await group?.dispose();
      throw err;
    }
  }

  /** Asks the loop to stop after the current step; the last checkpoint stays valid. */
  stop(): void {
    this.stopRequested = true;
  }

  /** True when stop() ended the run before its last epoch was completed. */
  get interrupted(): boolean {
    return this.stopRequested && this.history.length < this.config.epochs;
  }

  /** Trains from the current position to `config.epochs`, evaluating after every epoch. */
  async fit(): Promise<TrainSummary> {
    const { config } = this;
    const started = performance.now();
    const reporting = this.rank === 0;
    if (config.outDir && reporting) await this.openRunDir(config.outDir);
    this.metrics?.write({
      event: this.startEpoch > 0 ? 'resume' : 'start',
      epochsCompleted: this.startEpoch,
      model: config.model,
      dataset: config.dataset,
      workers: config.workers,
      compressor: config.compressor,
      accordion: config.accordion === 'on',
      adapt: config.adapt,
      eta: config.eta,
      accordionInterval: config.accordionInterval,
      rank: config.rank,
      topkRatio: config.topkRatio,
      parameterNames: this.model.parameters().map((p) => p.name),
      parameterSizes: this.model.parameters().map((p) => p.shape.reduce((a, b) => a * b, 1)),
      matrices: this.matrices,
      parameters: this.model.parameterCount(),
      trainSamples: this.task.trainSamples,
      testSamples: this.task.testSamples,
    });
    // Automatic levels priced in seconds need the link: measured once, kept in the checkpoints.
    if (config.adapt === 'auto' && config.autoCost === 'seconds' && this.group && this.autoState.bytesPerSecond === undefined) {
      Object.assign(this.autoState, await measureLink(this.group));
      this.metrics?.write({ event: 'link', ...this.autoState });
    }
    try {
      for (let epoch = this.startEpoch; epoch < config.epochs && !this.stopRequested; epoch++) {
        const record = await this.runEpoch(epoch);
        if (this.stopRequested) break;
        this.history.push(record);
        this.metrics?.write({ event: 'epoch', ...record });
        this.emit('epoch', record);
        if (config.progress && reporting) {
          process.stderr.write(
            `epoch ${epoch + 1}/${config.epochs}  lr ${record.lr.toPrecision(3)}  train loss ${record.trainLoss.toFixed(4)}` +
              `  acc ${(100 * record.trainAccuracy).toFixed(2)}%  test loss ${record.testLoss.toFixed(4)}` +
              `  acc ${(100 * record.testAccuracy).toFixed(2)}%` +
              (record.validPerplexity !== undefined ? `  valid ppl ${record.validPerplexity.toFixed(2)}  test ppl ${record.testPerplexity!.toFixed(2)}` : '') +
              `  floats sent ${formatCount(record.floatsSent)}` +
              (record.levels ? `  levels ${describeLevels(record.levels, this.matrices)}` : '') +
              `  (${formatDuration(record.seconds)})\n`,
          );
        }
        const last = epoch + 1 === config.epochs;
        if (config.outDir && ((epoch + 1) % config.checkpointEvery === 0 || last)) await this.checkpoint(epoch + 1);
      }
      if (this.interrupted) this.metrics?.write({ event: 'interrupted', epochsCompleted: this.history.length });
    } catch (err) {
      this.metrics?.write({ event: 'error', code: (err as { code?: string }).code, message: (err as Error).message });
      throw err;
    } finally {
      this.metrics?.close();
      this.metrics = undefined;
    }
    const summary = this.summary((performance.now() - started) / 1000);
    if (config.outDir && reporting)
      await writeFileAtomicAsync(path.join(config.outDir, 'summary.json'), [JSON.stringify(summary, null, 2) + '\n'], CheckpointError);
    return summary;
  }

  /**
   * Loss, accuracy (next-word accuracy for a language model) and perplexity on a split; each worker
   * evaluates its shard and the totals are summed.
   */
  async evaluate(split: 'valid' | 'test' = 'test'): Promise<{ loss: number; accuracy: number; perplexity: number; samples: number }> {
    const r = await this.task.evaluate(this.model, split);
    const totals = new Float64Array([r.lossSum, r.correct, r.samples]);
    if (this.group) {
      const wire = new Float32Array(totals);
      await this.group.allReduce(wire);
      totals.set(wire);
    }
    const [lossSum, correct, samples] = totals as unknown as [number, number, number];
    const loss = lossSum / Math.max(samples, 1);
    return { loss, accuracy: correct / Math.max(samples, 1), perplexity: Math.exp(loss), samples };
  }

  async dispose(): Promise<void> {
    await this.model.dispose();
    if (this.ownsGroup) await this.group?.dispose();
  }

  /**
   * The learning rate and global batch of an epoch. Batch-size mode scales the rate with the batch
   * (B / B_low); Smith's baseline multiplies the batch by 1/decay at each milestone, up to B_high,
   * and decays the rate only by what the cap leaves over.
   */
  private epochPlan(epoch: number): { lr: number; batch: number } {
    const { config } = this;
    if (config.adapt === 'compression' || config.adapt === 'auto') return { lr: learningRateForEpoch(epoch, this.schedule), batch: this.globalBatch };
    if (BATCH_MODES.includes(config.adapt))
      return { lr: learningRateForEpoch(epoch, this.schedule) * (this.globalBatch / config.batchLow), batch: this.globalBatch };
    const undecayed = learningRateForEpoch(epoch, { ...this.schedule, milestones: [] });
    const decayed = learningRateForEpoch(epoch, this.schedule);
    const growth = undecayed / decayed; // 1/decay per milestone passed
    const batch = Math.min(config.batchLow * Math.round(growth), config.batchHigh);
    return { lr: undecayed * (batch / config.batchLow / growth), batch };
  }

  private async runEpoch(epoch: number): Promise<EpochRecord> {
    const { config } = this;
    const { lr, batch } = this.epochPlan(epoch);
    const microBatches = batch / (config.batchSize * config.workers);
    await this.model.setLearningRate(lr);
    const steps = await this.task.startEpoch(this.model, epoch, microBatches);
    const bar = config.progress && this.rank === 0 ? new ProgressBar(`epoch ${epoch + 1}/${config.epochs}`, steps) : undefined;
    const begin = performance.now();
    let lossSum = 0, correct = 0, samples = 0, stepsDone = 0, floatsSent = 0, overheadFloats = 0, broadcastFloats = 0;
    let computeSeconds = 0, compressionSeconds = 0, communicationSeconds = 0, exchangeWaitSeconds = 0;
    const levels = this.accordionState ? Array.from(await this.model.levels()) : undefined;
    for (let step = 0; step < steps; step++) {
      const r: StepResult | null = await this.task.step(this.model, microBatches);
      if (!r) break;
      stepsDone++;
      lossSum += r.loss * r.samples;
      correct += r.correct;
      samples += r.samples;
      floatsSent += r.floatsSent;
      overheadFloats += r.overheadFloats;
      broadcastFloats += r.broadcastFloats;
      computeSeconds += r.computeSeconds;
      compressionSeconds += r.compressionSeconds;
      communicationSeconds += r.communicationSeconds;
      exchangeWaitSeconds += r.exchangeWaitSeconds;
      const elapsed = Math.max((performance.now() - begin) / 1000, 1e-9);
      const event: StepEvent = {
        epoch: epoch + 1,
        step: step + 1,
        steps,
        lr,
        loss: r.loss,
        correct: r.correct,
        samples: r.samples,
        floatsSent: r.floatsSent,
        epochLoss: lossSum / Math.max(samples, 1),
        epochAccuracy: correct / Math.max(samples, 1),
        epochSamples: samples,
        epochFloatsSent: floatsSent,
        seconds: elapsed,
        samplesPerSecond: samples / elapsed,
        etaSeconds: (elapsed / (step + 1)) * (steps - step - 1),
      };
      this.emit('step', event);
      bar?.update(event);
      if (this.stopRequested) break;
    }
    bar?.finish();
    const seconds = (performance.now() - begin) / 1000;
    if (this.stopRequested) return partialRecord(epoch, lr, batch, seconds); // discarded by fit()
    const bookkeepingStart = performance.now();
    const decision = this.stopRequested ? undefined : await this.adaptAtEpochEnd(epoch, lr);
    const bookkeepingSeconds = (performance.now() - bookkeepingStart) / 1000;
    // Evaluation and the checkpoint see rank 0's model on every worker, checked by digest.
    const syncStart = performance.now();
    broadcastFloats += await this.model.syncReplicas();
    const syncSeconds = (performance.now() - syncStart) / 1000;
    const language = this.task.kind === 'language';
    const valid = language ? await this.evaluate('valid') : undefined;
    const test = await this.evaluate('test');
    return {
      epoch: epoch + 1,
      lr,
      trainLoss: lossSum / Math.max(samples, 1),
      trainAccuracy: correct / Math.max(samples, 1),
      testLoss: test.loss,
      testAccuracy: test.accuracy,
      ...(valid ? { validLoss: valid.loss, validPerplexity: valid.perplexity, testPerplexity: test.perplexity } : {}),
      samples,
      steps: stepsDone,
      seconds,
      samplesPerSecond: samples / seconds,
      floatsSent,
      floatsSentTotal: (this.history[this.history.length - 1]?.floatsSentTotal ?? 0) + floatsSent,
      overheadFloats,
      broadcastFloats,
      computeSeconds,
      compressionSeconds,
      communicationSeconds,
      exchangeWaitSeconds,
      batchSize: batch,
      bookkeepingSeconds,
      syncSeconds,
      ...(levels && decision ? { levels, norms: decision.norms, ratios: decision.ratios } : {}),
      ...(decision?.auto ? { auto: decision.auto } : {}),
    };
  }

  /** This epoch's per-parameter norms of the summed local gradients (restarting the sums). */
  private async epochNorms(epoch: number): Promise<number[]> {
    const measured = Array.from(await this.model.gradientNorms());
    return this.normSource ? this.normSource(epoch + 1, this.rank, measured) : measured;
  }

  /**
   * The end of an epoch: the norms are read once (restarting the sums) and drive the compression
   * levels, the batch size, or both. With automatic levels, rank 0 first measures every candidate
   * level on the epoch's gradient sums, at the epochs where levels are chosen.
   */
  private async adaptAtEpochEnd(epoch: number, lr: number): Promise<EpochDecision | undefined> {
    if (!this.accordionState && !this.batchState) return undefined;
    // The schedule's own rates: a batch that grew scales the epoch's rate, which is no decay.
    const lrCurrent = learningRateForEpoch(epoch, this.schedule);
    const lrNext = learningRateForEpoch(epoch + 1, this.schedule);
    const choose = this.config.adapt === 'auto' && (epoch % this.config.accordionInterval === 0 || lrNext < lrCurrent);
    const costs = choose && this.rank === 0 ? await this.model.levelCosts(this.autoCandidates()) : undefined;
    const norms = await this.epochNorms(epoch);
    const decision = await this.applyAccordion(epoch, lrCurrent, lrNext, norms, choose, costs);
    await this.adaptBatch(epoch, lr, norms);
    return decision;
  }

  /**
   * Batch-size mode at the end of an epoch: the rule on the whole model's norm; once training leaves
   * the critical regime the batch grows to B_high (and never shrinks), from the next epoch.
   */
  private async adaptBatch(epoch: number, lr: number, norms: number[]): Promise<void> {
    if (!this.batchState) return;
    const { config } = this;
    // Only growth: the learning-rate override of the compression rule does not apply here.
    const decision = endOfEpoch(this.batchState, { epoch, norms: [wholeModelNorm(norms)], lrCurrent: lr, lrNext: lr }, { eta: config.eta, interval: config.accordionInterval });
    const stable = new Float32Array([decision.state.regimes[0] === 'stable' ? 1 : 0]);
    await this.group?.broadcast(stable, 0);
    this.batchState = { ...decision.state, regimes: [stable[0] ? 'stable' : 'critical'] };
    if (stable[0] && this.globalBatch === config.batchLow && config.batchHigh !== config.batchLow) {
      this.globalBatch = config.batchHigh;
      const event = { epoch: epoch + 1, from: config.batchLow, to: config.batchHigh, ratio: decision.ratios[0] ?? null };
      this.metrics?.write({ event: 'batch-switch', ...event });
      this.emit('batch-switch', event);
    }
  }

  /** --adapt auto's candidate levels: the compressor's ranks or ratios, the reference level and dense (0). */
  private autoCandidates(): number[] {
    const { config } = this;
    return config.compressor === 'topk' ? candidateLevels(config.autoRatios, config.topkRatio) : candidateLevels(config.autoRanks, config.rank);
  }

  /**
   * Accordion at the end of an epoch: rank 0 applies the rule to its norms and broadcasts the
   * regimes, and every worker sets the levels that govern the next epoch: the low or high level by
   * regime, or with automatic levels (`choose`, on the check and LR-decay epochs) the levels rank 0
   * plans from the measured `costs` with the regimes steering the budget, broadcast as indices into
   * the candidates so that every worker sets exactly the same values.
   */
  private async applyAccordion(
    epoch: number,
    lr: number,
    lrNext: number,
    norms: number[],
    choose: boolean,
    costs: LevelCost[][] | undefined,
  ): Promise<EpochDecision | undefined> {
    if (!this.accordionState) return undefined;
    const { config } = this;
    const decision = endOfEpoch(this.accordionState, { epoch, norms, lrCurrent: lr, lrNext }, { eta: config.eta, interval: config.accordionInterval });
    // Rank 0 decides; the others take its regimes.
    const critical = new Float32Array(decision.state.regimes.map((r) => (r === 'critical' ? 1 : 0)));
    await this.group?.broadcast(critical, 0);
    const regimes: Regime[] = Array.from(critical, (c) => (c ? 'critical' : 'stable'));
    const before = Array.from(await this.model.levels());
    let after: number[];
    let auto: AutoRecord | undefined;
    if (config.adapt !== 'auto') {
      const levelOf = (regime: Regime) =>
        config.compressor === 'topk' ? (regime === 'critical' ? config.lowRatio : config.highRatio) : regime === 'critical' ? config.lowRank : config.highRank;
      after = regimes.map((r, i) => (this.matrices[i] ? levelOf(r) : 0));
    } else if (!choose) {
      after = before;
    } else {
      const candidates = this.autoCandidates();
      const picked = new Float32Array(before.length);
      if (costs) {
        // The first check has no earlier norms: every layer is critical there by rule, not by
        // measurement, and the budget is the reference's error, as Accordion takes its low level.
        // Later a layer's share tightens where a critical regime is detected (a norm change of η or
        // more, or a learning-rate decay).
        const detected = regimes.map((r, i): Regime => (r === 'critical' && (decision.ratios[i] !== undefined || decision.lrOverride) ? 'critical' : 'stable'));
        auto = this.planAuto(costs, detected, norms);
        auto.levels.forEach((level, i) => (picked[i] = candidates.indexOf(level)));
      }
      await this.group?.broadcast(picked, 0);
      after = Array.from(picked, (k, i) => (this.matrices[i] ? candidates[k]! : 0));
    }
    await this.model.setLevels(after);
    this.accordionState = { ...decision.state, regimes };
    const names = this.model.parameters().map((p) => p.name);
    for (let i = 0; i < after.length; i++) {
      if (!this.matrices[i] || after[i] === before[i]) continue;
      const change: LevelSwitch = {
        epoch: epoch + 1,
        parameter: names[i]!,
        from: before[i]!,
        to: after[i]!,
        reason: config.adapt === 'auto' ? 'auto' : decision.lrOverride && regimes[i] === 'critical' ? 'lr-decay' : 'norm-change',
      };
      this.switches.push(change);
      this.metrics?.write({ event: 'switch', ...change });
      this.emit('switch', change);
    }
    const ratios = decision.ratios.map((r) => (r === undefined || !Number.isFinite(r) ? null : r));
    return { norms, ratios, ...(auto ? { auto } : {}) };
  }

  /**
   * Rank 0's plan of automatic levels. Costs in seconds use the link measured at the start and the
   * kernel times of the first plan, kept in the state so that a resumed run plans alike.
   */
  private planAuto(costs: LevelCost[][], regimes: Regime[], norms: number[]): AutoRecord {
    const { config } = this;
    let cost: CostModel = { kind: 'floats' };
    if (config.autoCost === 'seconds' && this.autoState.bytesPerSecond) {
      this.autoState.kernelSeconds ??= costs.map((list) => list.map((c) => c.seconds));
      const kept = this.autoState.kernelSeconds;
      costs = costs.map((list, i) => list.map((c, k) => ({ ...c, seconds: kept[i]?.[k] ?? c.seconds })));
      cost = { kind: 'seconds', bytesPerSecond: this.autoState.bytesPerSecond, workers: config.workers, compressor: config.compressor as 'powersgd' | 'topk' };
    }
    const reference = config.compressor === 'topk' ? config.topkRatio : config.rank;
    const plan = planLevels(costs, regimes, norms, {
      reference,
      errorBudget: config.errorBudget,
      criticalBudget: config.criticalBudget,
      errorMeasure: config.errorMeasure,
      cost,
    });
    return { ...plan, costUnit: cost.kind };
  }

  /** Rank 0 at the start of fit(): clears a replaced run (overwrite), writes config.json, opens the metrics log. */
  private async openRunDir(dir: string): Promise<void> {
    if (this.config.overwrite) await clearRun(dir);
    try {
      await fs.promises.mkdir(dir, { recursive: true });
    } catch (err) {
      throw new CheckpointError(`cannot create the run directory ${dir}: ${(err as Error).message}`);
    }
    const { resume, progress, overwrite, ...resolved } = this.config;
    await writeFileAtomicAsync(path.join(dir, 'config.json'), [JSON.stringify(resolved, null, 2) + '\n'], CheckpointError);
    this.metrics = new MetricsLog(path.join(dir, 'metrics.jsonl'));
  }

  private async checkpoint(epochsCompleted: number): Promise<void> {
    const started = performance.now();
    const { resume, progress, overwrite, outDir, ...config } = this.config;
    const dir = await saveCheckpoint(
      outDir!,
      this.model,
      {
        epochsCompleted,
        config: config as Record<string, unknown>,
        extra: {
          history: this.history,
          switches: this.switches,
          accordion: this.accordionState,
          batch: this.batchState,
          auto: this.autoState,
          globalBatch: this.globalBatch,
        },
      },
      this.group,
    );
    this.metrics?.write({ event: 'checkpoint', epoch: epochsCompleted, path: dir });
    const event: CheckpointEvent = { epoch: epochsCompleted, path: dir, seconds: (performance.now() - started) / 1000 };
    this.emit('checkpoint', event);
  }

  private summary(seconds: number): TrainSummary {
    const acc = this.history.map((h) => h.testAccuracy);
    return {
      model: this.config.model,
      dataset: this.config.dataset,
      parameters: this.model.parameterCount(),
      epochs: this.history,
      finalTestAccuracy: acc.length ? acc[acc.length - 1]! : NaN,
      bestTestAccuracy: acc.length ? Math.max(...acc) : NaN,
      compressor: this.config.compressor,
      accordion: this.config.accordion === 'on',
      switches: this.switches,
      floatsSentTotal: this.history[this.history.length - 1]?.floatsSentTotal ?? 0,
      seconds,
      runDir: this.config.outDir,
      ...(this.interrupted ? { interrupted: true } : {}),
    };
  }
}

/** The record of an epoch cut short by stop(): not evaluated, and never logged. */
function partialRecord(epoch: number, lr: number, batchSize: number, seconds: number): EpochRecord {
  return {
    epoch: epoch + 1, lr, batchSize, seconds,
    trainLoss: NaN, trainAccuracy: NaN, testLoss: NaN, testAccuracy: NaN, samples: 0, steps: 0, samplesPerSecond: 0,
    floatsSent: 0, floatsSentTotal: 0, overheadFloats: 0, broadcastFloats: 0, computeSeconds: 0, compressionSeconds: 0, communicationSeconds: 0, exchangeWaitSeconds: 0, bookkeepingSeconds: 0, syncSeconds: 0,
  };
}

function validateConfig(c: TrainConfig): void {
  const positiveInt = (key: keyof TrainConfig) => {
    const v = c[key] as number;
    if (!Number.isInteger(v) || v <= 0) throw new UsageError(`${key} must be a positive integer, got ${v}`);
  };
  (['epochs', 'batchSize', 'evalBatchSize', 'workers', 'checkpointEvery', 'syntheticTrain', 'syntheticTest', 'timeoutMs', 'hidden', 'layers', 'bptt'] as const).forEach(positiveInt);
  if (!(c.clip >= 0)) throw new UsageError(`clip must be ≥ 0, got ${c.clip}`);
  if (!(c.dropout >= 0 && c.dropout < 1)) throw new UsageError(`dropout must lie in [0, 1), got ${c.dropout}`);
  const finite = (key: keyof TrainConfig, min: number) => {
    const v = c[key] as number;
    if (!Number.isFinite(v) || v < min) throw new UsageError(`${key} must be a number ≥ ${min}, got ${v}`);
  };
  finite('lr', 0);
  finite('momentum', 0);
  finite('weightDecay', 0);
  finite('warmupEpochs', 0);
  finite('lrDecay', 0);
  if (!(c.lr > 0)) throw new UsageError(`lr must be positive, got ${c.lr}`);
  if (!['none', 'powersgd', 'topk'].includes(c.compressor)) throw new UsageError(`unknown compressor '${c.compressor}'`);
  if (!Number.isInteger(c.rank) || c.rank < 1) throw new UsageError(`rank must be a positive integer, got ${c.rank}`);
  if (!(c.topkRatio > 0 && c.topkRatio <= 1)) throw new UsageError(`topkRatio must lie in (0, 1], got ${c.topkRatio}`);
  finite('minCompressionRate', 0);
  if (!['compression', 'batch', 'smith', 'auto', 'batch+compression'].includes(c.adapt))
    throw new UsageError(`adapt must be compression, batch, smith, auto or batch+compression, got '${c.adapt}'`);
  if (!Array.isArray(c.autoRanks) || c.autoRanks.length === 0 || !c.autoRanks.every((r) => Number.isInteger(r) && r >= 1))
    throw new UsageError(`autoRanks must be a non-empty list of positive integers, got ${JSON.stringify(c.autoRanks)}`);
  if (!Array.isArray(c.autoRatios) || c.autoRatios.length === 0 || !c.autoRatios.every((r) => r > 0 && r <= 1))
    throw new UsageError(`autoRatios must be a non-empty list of ratios in (0, 1], got ${JSON.stringify(c.autoRatios)}`);
  if (!(c.errorBudget > 0) || !Number.isFinite(c.errorBudget)) throw new UsageError(`errorBudget must be a positive number, got ${c.errorBudget}`);
  if (!(c.criticalBudget > 0) || !Number.isFinite(c.criticalBudget)) throw new UsageError(`criticalBudget must be a positive number, got ${c.criticalBudget}`);
  if (!['squared', 'relative'].includes(c.errorMeasure)) throw new UsageError(`errorMeasure must be squared or relative, got '${c.errorMeasure}'`);
  if (!['floats', 'seconds'].includes(c.autoCost)) throw new UsageError(`autoCost must be floats or seconds, got '${c.autoCost}'`);
  for (const key of ['batchLow', 'batchHigh'] as const)
    if (!Number.isInteger(c[key]) || c[key] < 1) throw new UsageError(`${key} must be a positive integer, got ${c[key]}`);
  if (c.batchHigh < c.batchLow) throw new UsageError(`batchHigh (${c.batchHigh}) must be at least batchLow (${c.batchLow})`);
  if (!['auto', 'on', 'off'].includes(c.accordion)) throw new UsageError(`accordion must be auto, on or off, got '${c.accordion}'`);
  if (!(c.eta > 0)) throw new UsageError(`eta must be positive, got ${c.eta}`);
  if (!Number.isInteger(c.accordionInterval) || c.accordionInterval < 1)
    throw new UsageError(`accordionInterval must be a positive integer, got ${c.accordionInterval}`);
  for (const key of ['lowRank', 'highRank'] as const)
    if (!Number.isInteger(c[key]) || c[key] < 1) throw new UsageError(`${key} must be a positive integer, got ${c[key]}`);
  for (const key of ['lowRatio', 'highRatio'] as const)
    if (!(c[key] > 0 && c[key] <= 1)) throw new UsageError(`${key} must lie in (0, 1], got ${c[key]}`);
  if (!Number.isInteger(c.seed) || c.seed < 0) throw new UsageError(`seed must be a non-negative integer, got ${c.seed}`);
  if (c.dataset !== 'synthetic' && !c.dataDir) throw new UsageError(`dataset ${c.dataset} needs --data DIR`);
  if (c.timeoutMs > MAX_TIMEOUT_MS)
    throw new UsageError(`option --timeout: at most ${MAX_TIMEOUT_MS} ms (about 24.8 days, the longest a Node.js timer waits), got ${c.timeoutMs}`);
  if (!(c.bucketMb >= 0) || !Number.isFinite(c.bucketMb)) throw new UsageError(`option --bucket-mb: expected a number ≥ 0 (MiB; 0: exchange after backward), got ${c.bucketMb}`);
  if (c.threads !== undefined && (!Number.isInteger(c.threads) || c.threads < 1 || c.threads > MAX_THREADS))
    throw new UsageError(`option --threads: expected an integer from 1 to ${MAX_THREADS}, got ${c.threads}`);
  checkMemory(c, os.totalmem());
  parseDevice(c.device);
}

/** Node's timers (and so every deadline of the rendezvous and collectives) hold at most 2^31 − 1 ms. */
export const MAX_TIMEOUT_MS = 2 ** 31 - 1;
const MAX_THREADS = 4096;

/**
 * Floats a model keeps per sample between the forward and the backward pass, counted low: for the
 * vision models the outputs of every convolution and of its batch norm on 32×32 inputs; for the
 * LSTM (per column of a batch) the four gates, cell and hidden state of every layer and step.
 */
function activationFloatsPerSample(c: TrainConfig): number {
  if (c.model === 'lstm') return c.bptt * c.layers * c.hidden * 6;
  return c.model === 'vgg19bn' ? 2 * 303_104 : 2 * 614_400;
}

/** Parameters, counted low: the vision models' CIFAR-10 sizes; the LSTM's recurrent layers only (the vocabulary is not known yet). */
function parameterFloats(c: TrainConfig): number {
  if (c.model === 'lstm') return c.layers * (8 * c.hidden * c.hidden + 8 * c.hidden);
  return c.model === 'vgg19bn' ? 20_565_834 : 11_173_962;
}

const GiB = 2 ** 30;
const gib = (bytes: number) => `${(bytes / GiB).toFixed(bytes < 10 * GiB ? 2 : 0)} GiB`;

/**
 * Refuses, before any work, a request that cannot fit in this machine's memory (os.totalmem()) by
 * a simple lower bound. Training needs 4 bytes × (3 × parameters [weights, gradients, momentum] +
 * batch size × activation floats per sample); evaluation 4 bytes × (parameters + evaluation batch
 * size × activation floats per sample). A synthetic dataset is held twice while it is generated
 * and read back: 2 × (train + test images) × 3,073 bytes.
 */
export function checkMemory(c: TrainConfig, memory: number): void {
  const params = parameterFloats(c);
  const perSample = activationFloatsPerSample(c);
  const have = `this machine has ${gib(memory)} of memory`;
  if (4 * 3 * params > memory)
    throw new UsageError(
      `option --hidden: ${c.hidden} with ${c.layers} layers has at least ${params.toExponential(2)} parameters; their weights, gradients and momentum ` +
        `alone take ${gib(4 * 3 * params)} (4 bytes × 3 × parameters), and ${have}`,
    );
  const train = 4 * (3 * params + c.batchSize * perSample);
  if (train > memory)
    throw new UsageError(
      `option --batch-size: a batch of ${c.batchSize} needs at least ${gib(train)} to train ${c.model} ` +
        `(4 bytes × (3 × ${params.toLocaleString('en-US')} parameters + ${c.batchSize} × ${perSample.toLocaleString('en-US')} activations per sample)), and ${have}`,
    );
  const evaluation = 4 * (params + c.evalBatchSize * perSample);
  if (evaluation > memory)
    throw new UsageError(
      `option --eval-batch-size: a batch of ${c.evalBatchSize} needs at least ${gib(evaluation)} to evaluate ${c.model} ` +
        `(4 bytes × (${params.toLocaleString('en-US')} parameters + ${c.evalBatchSize} × ${perSample.toLocaleString('en-US')} activations per sample)), and ${have}`,
    );
  if (c.dataset === 'synthetic') {
    const bytes = 2 * (c.syntheticTrain + c.syntheticTest) * 3073;
    if (bytes > memory) {
      const option = c.syntheticTrain >= c.syntheticTest ? '--synthetic-train' : '--synthetic-test';
      throw new UsageError(
        `option ${option}: ${c.syntheticTrain.toLocaleString('en-US')} train + ${c.syntheticTest.toLocaleString('en-US')} test synthetic images need ` +
          `${gib(bytes)} while they are generated and read (2 × images × 3,073 bytes), and ${have}`,
      );
    }
  }
}

/** "18×2 3×1": how many weight matrices were at each level. */
function describeLevels(levels: number[], matrices: boolean[]): string {
  const counts = new Map<number, number>();
  levels.forEach((l, i) => matrices[i] && counts.set(l, (counts.get(l) ?? 0) + 1));
  return [...counts].sort((a, b) => b[0] - a[0]).map(([level, n]) => `${n}×${level === 0 ? 'dense' : level}`).join(' ');
}
