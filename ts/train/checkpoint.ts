/**
 * Checkpoints of a run: `checkpoints/epoch-NNNN/` holds `model.safetensors` (exactly the PyTorch
 * state_dict, loadable with strict=True) and `trainer.safetensors` (optimiser buffers, compressor
 * memories, random streams, and the trainer's position in its metadata); in a data-parallel run
 * every other rank adds its own `trainer-rank<k>.safetensors`: its trainer state (error-feedback
 * memories differ between workers) and its model buffers under their state_dict names (batch-norm
 * running statistics follow each rank's own shard), so that every rank resumes from exactly its
 * own state. The weights, the same on every rank, are stored once. A checkpoint directory is assembled under
 * a temporary name and renamed into place, then `checkpoints/latest` is replaced atomically, so an
 * interrupted run always leaves the previous checkpoint intact and `latest` never points at a
 * partial one.
 */
import * as fs from 'node:fs';
import * as fsp from 'node:fs/promises';
import * as path from 'node:path';
import { readSafetensors, writeSafetensorsAsync, type NamedTensor } from '../engine/safetensors.js';
import { CheckpointError } from '../base/errors.js';
import { writeFileAtomicAsync } from '../base/files.js';
import type { Model } from '../engine/model.js';
import type { ProcessGroup } from '../comm/group.js';

const TRAINER_PREFIXES = ['optimizer.', 'compressor.', 'rng.'];
const KEEP = 2;

export interface TrainerPosition {
  /** Epochs completed (the next epoch to run is this number). */
  epochsCompleted: number;
  /** The resolved training configuration, for checks on resume. */
  config: Record<string, unknown>;
  /** Anything else the trainer wants back (history, counters). */
  extra: Record<string, unknown>;
}

export interface LoadedCheckpoint {
  dir: string;
  model: NamedTensor[];
  trainer: NamedTensor[];
  position: TrainerPosition;
}

function epochDirName(epoch: number): string {
  return `epoch-${String(epoch).padStart(4, '0')}`;
}


function trainerFile(rank: number): string {
  return rank === 0 ? 'trainer.safetensors' : `trainer-rank${rank}.safetensors`;
}

/**
 * Writes the checkpoint after `position.epochsCompleted` epochs. With a group every rank calls it:
 * rank 0 prepares the directory and publishes it once every rank has written its file.
 */
export async function saveCheckpoint(runDir: string, model: Model, position: TrainerPosition, group?: ProcessGroup): Promise<string> {
  const rank = group?.rank ?? 0;
  const root = path.join(runDir, 'checkpoints');
  const name = epochDirName(position.epochsCompleted);
  const tmp = path.join(root, `.tmp-${name}`);
  const final = path.join(root, name);
  const state = await model.stateDict(true);
  const isTrainer = (t: NamedTensor) => TRAINER_PREFIXES.some((p) => t.name.startsWith(p));
  const parameters = new Set(model.parameters().map((p) => p.name));
  // Rank 0's buffers are in the model file; another rank's (equal to them after the sync before a
  // checkpoint) go with its trainer state, so each rank restores exactly what it held.
  const ownState = rank === 0 ? state.filter(isTrainer) : state.filter((t) => isTrainer(t) || !parameters.has(t.name));
  let failure: Error | undefined;
  const attempt = async (fn: () => Promise<void>) => {
    if (failure) return;
    try {
      await fn();
    } catch (err) {
      failure = err as Error;
    }
  };
  // Every file operation runs on the thread pool (fs.promises): a service hosting the trainer keeps
  // its event loop while the tens of MB are written and flushed.
  if (rank === 0)
    await attempt(async () => {
      await fsp.mkdir(root, { recursive: true });
      await fsp.rm(tmp, { recursive: true, force: true });
      await fsp.mkdir(tmp);
    });
  await group?.barrier();
  await attempt(async () => {
    if (rank === 0)
      await writeSafetensorsAsync(path.join(tmp, 'model.safetensors'), model.forPyTorch(state.filter((t) => !isTrainer(t))), {
        format: 'pt',
        architecture: model.architecture,
        classes: String(model.classes),
      });
    await writeSafetensorsAsync(path.join(tmp, trainerFile(rank)), ownState, { position: JSON.stringify(position) });
  });
  // Every rank learns whether any rank failed, so they all stop (or go on) together.
  const failed = new Float32Array([failure ? 1 : 0]);
  await group?.allReduce(failed);
  if (failed[0]! === 0 && rank === 0)
    await attempt(async () => {
      await fsp.rm(final, { recursive: true, force: true });
      await fsp.rename(tmp, final);
      await writeFileAtomicAsync(path.join(root, 'latest'), [name + '\n'], CheckpointError);
    });
  if (failure || failed[0]! > 0) {
    if (rank === 0) await fsp.rm(tmp, { recursive: true, force: true });
    throw new CheckpointError(
      `cannot write checkpoint ${name} in ${root}: ${failure ? failure.message : 'another rank failed to write its part'}`,
    );
  }
  if (rank === 0) await pruneCheckpoints(root, position.epochsCompleted);
  await group?.barrier();
  return final;
}

async function pruneCheckpoints(root: string, current: number): Promise<void> {
  const epochs = (await fsp.readdir(root))
    .map((n) => /^epoch-(\d+)$/.exec(n))
    .filter((m): m is RegExpExecArray => m !== null)
    .map((m) => Number(m[1]))
    .filter((e) => e <= current)
    .sort((a, b) => b - a);
  for (const e of epochs.slice(KEEP)) await fsp.rm(path.join(root, epochDirName(e)), { recursive: true, force: true });
}

/** Finds the checkpoint directory for a run directory, its checkpoints/ folder, or an epoch folder. */
export function resolveCheckpointDir(target: string): string {
  if (!fs.existsSync(target)) throw new CheckpointError(`checkpoint not found: ${target}`);
  if (fs.existsSync(path.join(target, 'trainer.safetensors'))) return target;
  for (const root of [path.join(target, 'checkpoints'), target]) {
    const latest = path.join(root, 'latest');
    if (fs.existsSync(latest)) {
      const dir = path.join(root, fs.readFileSync(latest, 'utf8').trim());
      if (!fs.existsSync(path.join(dir, 'trainer.safetensors')))
        throw new CheckpointError(`${latest} names ${dir}, which holds no trainer.safetensors`);
      return dir;
    }
  }
  throw new CheckpointError(`${target} holds no checkpoint (expected checkpoints/latest or trainer.safetensors)`);
}

/** The configuration a checkpoint (or a run directory's latest one) was trained with, and its directory. */
export function savedRunConfig(target: string): { dir: string; config: Record<string, unknown> } {
  const dir = resolveCheckpointDir(target);
  return { dir, config: readTrainerFile(dir, 0).position.config };
}

/** A rank's trainer file in the checkpoint directory `dir`, and the position in its metadata, checked. */
function readTrainerFile(dir: string, rank: number): { trainer: ReturnType<typeof readSafetensors>; position: TrainerPosition; file: string } {
  const file = path.join(dir, trainerFile(rank));
  if (!fs.existsSync(file)) throw new CheckpointError(`${dir} holds no trainer state for rank ${rank} (${trainerFile(rank)})`);
  const trainer = readSafetensors(file);
  let position: TrainerPosition;
  try {
    position = JSON.parse(trainer.metadata.position ?? '') as TrainerPosition;
  } catch {
    throw new CheckpointError(`${file}: metadata 'position' is missing or not JSON`);
  }
  if (!isObject(position)) throw new CheckpointError(`${file}: metadata 'position' is not a JSON object`);
  if (!Number.isInteger(position.epochsCompleted) || position.epochsCompleted < 0)
    throw new CheckpointError(`${dir}: invalid epochsCompleted in the trainer state`);
  // A resume checks the saved configuration against its own before it trusts the state.
  if (!isObject(position.config))
    throw new CheckpointError(
      `${file}: the trainer state has no training configuration ('config' in its metadata 'position'), so a resume cannot check it against this run`,
    );
  if (!isObject(position.extra)) throw new CheckpointError(`${file}: the trainer state has no 'extra' record in its metadata 'position'`);
  return { trainer, position, file };
}

/**
 * Loads a checkpoint: the model state and the trainer state of `rank` (rank 0's for a single
 * process). Another rank's model state is the shared weights with its own buffers (a checkpoint
 * written before ranks saved their buffers gives rank 0's). With `worldSize` other than the number
 * of workers that wrote it, the state of `rank` in a job of that size (`regrouped`).
 */
export function loadCheckpoint(target: string, rank = 0, worldSize?: number): LoadedCheckpoint {
  const dir = resolveCheckpointDir(target);
  const own = fs.existsSync(path.join(dir, trainerFile(rank)));
  // A rank the checkpoint does not have starts from rank 0's state, when the job's size changed.
  const loaded = loadRank(dir, own || worldSize === undefined ? rank : 0);
  const workers = loaded.position.config.workers;
  const saved = typeof workers === 'number' ? workers : 1;
  if (!own && (worldSize === undefined || saved === worldSize || rank < saved))
    throw new CheckpointError(`${dir} holds no trainer state for rank ${rank} (${trainerFile(rank)})`);
  return worldSize === undefined || saved === worldSize ? loaded : regrouped(dir, loaded, rank, saved);
}

/** Rank `rank`'s state as written, from the checkpoint directory `dir`. */
function loadRank(dir: string, rank: number): LoadedCheckpoint {
  const model = readSafetensors(path.join(dir, 'model.safetensors'));
  const { trainer, position, file } = readTrainerFile(dir, rank);
  const isTrainer = (name: string) => TRAINER_PREFIXES.some((p) => name.startsWith(p));
  const own = [...trainer.tensors.values()];
  const modelState = [...model.tensors.values()];
  for (const t of own) {
    if (isTrainer(t.name)) continue;
    const at = modelState.findIndex((m) => m.name === t.name);
    if (at < 0) throw new CheckpointError(`${file}: '${t.name}' is not in the model's state (${path.join(dir, 'model.safetensors')})`);
    modelState[at] = t;
  }
  return { dir, model: modelState, trainer: own.filter((t) => isTrainer(t.name)), position };
}

/**
 * The state of `rank` in a job of another size than the `saved` workers that wrote the checkpoint,
 * from `base` (the rank's own state, or rank 0's for a rank the checkpoint does not have):
 * - every rank's error memory becomes the mean of the saved ranks' memories, so the gradient mass
 *   owed to the averaged gradient, (1/W)·Σ_r e_r, is the same before and after;
 * - what every rank holds alike (weights, momentum, PowerSGD's Q, levels) is rank 0's;
 * - a saved rank keeps its own batch-norm statistics and random streams; a new rank takes rank 0's
 *   statistics (equal to every rank's at a checkpoint) and the random streams a fresh worker of its
 *   rank draws.
 */
function regrouped(dir: string, base: LoadedCheckpoint, rank: number, saved: number): LoadedCheckpoint {
  const memories = new Map<string, Float64Array>();
  for (let r = 0; r < saved; r++)
    for (const t of readSafetensors(path.join(dir, trainerFile(r))).tensors.values()) {
      if (!t.name.startsWith('compressor.memory.')) continue;
      const values = new Float32Array(t.data.buffer.slice(t.data.byteOffset, t.data.byteOffset + t.data.byteLength));
      const sum = memories.get(t.name) ?? new Float64Array(values.length);
      values.forEach((v, i) => (sum[i]! += v));
      memories.set(t.name, sum);
    }
  const trainer = base.trainer
    .filter((t) => rank < saved || !t.name.startsWith('rng.'))
    .map((t) => {
      const sum = memories.get(t.name);
      if (!sum) return t;
      const mean = Float32Array.from(sum, (v) => v / saved);
      return { ...t, data: new Uint8Array(mean.buffer) };
    });
  return { ...base, trainer };
}

function isObject(x: unknown): x is Record<string, unknown> {
  return typeof x === 'object' && x !== null && !Array.isArray(x);
}
