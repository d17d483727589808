/**
 * Everything before the first epoch: the configuration resolved, the job joined (the launcher's
 * environment, or the caller's group) and the workers' configurations compared, the device checked,
 * the data read, the model built, and with `resume` the checkpoint restored.
 */
import * as path from 'node:path';
import { CheckpointError } from '../base/errors.js';
import type { TrainConfig } from '../config/options.js';
import { compressionSpec, type CompressionSpec } from '../config/compression.js';
import { binding } from '../native/binding.js';
import { requireDevice, workerDevice } from '../native/device.js';
import { ProcessGroup, distributedEnv } from '../comm/group.js';
import { firstImages, loadImageDataset, type ImageDataset } from '../data/datasets.js';
import type { SharedData } from '../data/shared.js';
import { readWikiText } from '../data/wikitext.js';
import { Model } from '../engine/model.js';
import { loadCheckpoint } from './checkpoint.js';
import { BATCH_MODES, checkJob, resolveConfig, resumedOptions, type TrainOptions } from './config.js';
import { checkRunDir } from './rundir.js';
import { ImageTask, LanguageTask, type TrainingTask } from './tasks.js';
import { initialLevel } from './policies/choose.js';
import type { Policy } from './policies/policy.js';
import type { PolicySettings } from './policies/settings.js';
import type { EpochRecord, LevelSwitch } from './records.js';

export interface TrainerContext {
  /** Join this data-parallel group instead of one described by the environment. */
  group?: ProcessGroup;
  /** This worker's index among its host's workers, which picks its GPU (default: LOCAL_RANK, else 0). */
  localRank?: number;
  /** Datasets shared with the other trainers given the same one (the workers of one process), read once. */
  sharedData?: SharedData;
  /**
   * Replaces the measured per-parameter norms of each epoch's (from 1) summed gradients (for simulations and
   * tests of the switching rule); the measured sums are still read and restarted every epoch.
   */
  gradientNorms?: (epoch: number, rank: number, measured: number[]) => number[];
  /**
   * The policy that decides levels and the global batch, in place of the one the configuration
   * names (as PyTorch's register_comm_hook lets users bring their own compression logic): called
   * once with what the built-in policies are built from. The engine then keeps the epoch's gradient
   * sums for the norms whatever the configuration, since the policy may read them.
   */
  policy?: (settings: PolicySettings) => Policy;
}

/** A run ready to train: what the Trainer is built from. */
export interface SetUp {
  config: TrainConfig;
  spec: CompressionSpec;
  task: TrainingTask;
  model: Model;
  group?: ProcessGroup;
  ownsGroup: boolean;
  /** From a checkpoint: the epochs completed, the records and switches so far, and the policy's state. */
  resumed?: { epochsCompleted: number; history: EpochRecord[]; switches: LevelSwitch[]; extra: Record<string, unknown> };
}

export async function setUp(given: TrainOptions, context: TrainerContext): Promise<SetUp> {
  const options = given.resume === undefined ? given : resumedOptions(given);
  const config = resolveConfig(options);
  const spec = compressionSpec(config);
  const env = context.group ? undefined : distributedEnv();
  const worldSize = context.group?.worldSize ?? env?.worldSize ?? 1;
  const job = { rank: context.group?.rank ?? env?.rank ?? 0, localRank: context.localRank ?? (env ?? distributedEnv())?.localRank ?? 0, worldSize };
  config.device = workerDevice(config.device, job, config.distBackend);
  // Before any data is read: a device that cannot train fails the run at once.
  requireDevice(config.device);
  checkJob(config, options, worldSize);
  // Before any data is read or any worker joins: rank 0, which writes the run directory, refuses
  // to train over another run.
  if (job.rank === 0) checkRunDir(config);
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
    const checkpoint = config.resume ? loadCheckpoint(config.resume, rank, config.workers) : undefined;
    if (checkpoint) {
      const savedWorkers = checkpoint.position.config.workers;
      if (typeof savedWorkers === 'number' && savedWorkers !== config.workers && BATCH_MODES.includes(config.adapt))
        throw new CheckpointError(
          `cannot resume from ${checkpoint.dir} with ${config.workers} workers: it was trained with ${savedWorkers}, and --adapt ${config.adapt} sets the global batch in samples (--batch-low, --batch-high), which another worker count would not split alike`,
        );
      if (rank === 0 && typeof savedWorkers === 'number' && savedWorkers !== config.workers)
        process.stderr.write(
          `accordion: resuming a run of ${savedWorkers} workers with ${config.workers}: every worker's error memory starts as the mean of the ${savedWorkers} saved ones ` +
            `(the mass owed to the averaged gradient is kept); weights, momentum and compressor state are rank 0's; new ranks take rank 0's batch-norm statistics\n`,
        );
      config.outDir ??= path.resolve(checkpoint.dir, '..', '..');
    }
    const shard = { rank, worldSize: config.workers };
    const read = <T>(key: unknown[], fn: () => T): T => (context.sharedData ? context.sharedData.get(JSON.stringify(key), fn) : fn());
    const task: TrainingTask =
      config.dataset === 'wikitext2'
        ? new LanguageTask(read([config.dataset, config.dataDir], () => readWikiText(config.dataDir!)), { ...config, ...shard })
        : new ImageTask(read([config.dataset, config.dataDir, config.syntheticTrain, config.syntheticTest, config.seed, config.trainImages, config.testImages], () => imageDataset(config)), { ...config, ...shard });
    const model = await Model.create({
      architecture: config.model,
      device: config.device,
      convAlgorithms: config.convAlgorithms,
      tf32: config.tf32,
      memoryFormat: config.memoryFormat,
      distBackend: config.distBackend,
      classes: task.classes,
      width: config.width,
      precision: config.precision,
      hidden: config.hidden,
      layers: config.layers,
      dropout: config.dropout,
      seed: config.seed,
      learningRate: config.lr,
      momentum: config.momentum,
      weightDecay: config.weightDecay,
      nesterov: config.nesterov,
      compressor: config.compressor,
      level: initialLevel({ config, spec }),
      minCompressionRate: config.minCompressionRate,
      compressionSeed: config.compressionSeed,
      commDtype: config.commDtype,
      accumulateNorms: context.policy !== undefined || config.accordion === 'on' || config.adapt === 'batch' || config.adapt === 'batch+compression',
      group,
      bucketMb: config.bucketMb,
      broadcastBuffers: config.broadcastBuffers,
      clipNorm: config.clip,
      threads,
    });
    const resumed = checkpoint ? await restore(model, checkpoint) : undefined;
    // A fresh job starts from rank 0's weights; a resumed one has restored every rank's own state
    // (the same weights and, synced before every checkpoint, rank 0's running statistics).
    if (group && !checkpoint) await model.broadcastState(0);
    return { config, spec, task, model, group, ownsGroup: !context.group, resumed };
  } catch (err) {
    if (!context.group) await group?.dispose();
    throw err;
  }
}

/** The run's image dataset: its first --train-images training images and --test-images test images when given. */
function imageDataset(config: TrainConfig): ImageDataset {
  const dataset = loadImageDataset(config.dataset as ImageDataset['name'], config.dataDir, { train: config.syntheticTrain, test: config.syntheticTest, seed: config.seed });
  return firstImages(dataset, { train: config.trainImages, test: config.testImages });
}

/** The checkpoint's state into the model, and the trainer's position from its metadata. */
async function restore(model: Model, checkpoint: ReturnType<typeof loadCheckpoint>): Promise<SetUp['resumed']> {
  try {
    // Checked before any training: a diverged checkpoint (NaN weights) is named as such here
    // rather than surfacing later as a NaN loss.
    await model.loadStateDict([...checkpoint.model, ...checkpoint.trainer]);
  } catch (err) {
    // Non-finite values, and entries that do not match the model (ERR_STATE_MISMATCH).
    if (!(err instanceof CheckpointError) && (err as { code?: string }).code !== 'ERR_STATE_MISMATCH') throw err;
    throw new CheckpointError(`cannot resume from ${checkpoint.dir}: ${(err as Error).message}`);
  }
  const extra = checkpoint.position.extra;
  const epochsCompleted = checkpoint.position.epochsCompleted;
  const history = (extra.history as EpochRecord[] | undefined) ?? [];
  const switches = (extra.switches as LevelSwitch[] | undefined) ?? [];
  // A checkpoint written while records counted epochs from 0: its last record is then one short of
  // the epochs completed. Renumbered, so that summary.json counts one way.
  if (history.at(-1)?.epoch === epochsCompleted - 1) {
    for (const e of history) e.epoch += 1;
    for (const s of switches) s.epoch += 1;
  }
  return { epochsCompleted, history, switches, extra };
}
