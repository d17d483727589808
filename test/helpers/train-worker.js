// One worker of a real data-parallel training job: connects through the environment (RANK,
// WORLD_SIZE, …), trains a model on seeded synthetic images for a few steps and prints one JSON
// line with the per-step losses and a digest of the final weights. argv[2] is the spec:
// { architecture, classes, imageSeed, count, batchSize, steps, seed, learningRate, momentum,
//   weightDecay, timeoutMs }.
//
// The same `train` runs in the test's own process without a group, as the single-worker reference.
import { createHash } from 'node:crypto';
import { Batcher, Model, setThreads } from '../../lib/index.js';
import { Mulberry32 } from '../../lib/base/random.js';
import { printFromGroup, runAsWorker } from './worker.js';

const MEAN = [0.49, 0.48, 0.45];
const STD = [0.25, 0.24, 0.26];

/** `count` CIFAR-layout images (planar RGB bytes) with labels, from a mulberry32 stream. */
export function syntheticImages(seed, count, classes) {
  const words = new Mulberry32(seed);
  const images = new Uint8Array(count * 3072);
  for (let i = 0; i < images.length; i++) images[i] = words.u32() & 0xff;
  const labels = Int32Array.from({ length: count }, () => words.u32() % classes);
  return { images, labels, count, classes, height: 32, width: 32, channels: 3 };
}

function floatsOf(entry) {
  return new Float32Array(entry.data.buffer.slice(entry.data.byteOffset, entry.data.byteOffset + entry.data.byteLength));
}

/**
 * Trains `spec.steps` steps and returns { losses, digest }. With a group the batcher shards the
 * epoch's permutation by rank, so the two workers' batches together are the single worker's batch
 * of twice the size.
 */
export async function train(spec, group) {
  // Every worker shares two cores with the others; more threads would only contend.
  if (process.env.OMP_NUM_THREADS) setThreads(Number(process.env.OMP_NUM_THREADS));
  const imageSet = syntheticImages(spec.imageSeed, spec.count, spec.classes);
  const model = await Model.create({
    architecture: spec.architecture,
    classes: spec.classes,
    seed: spec.seed,
    learningRate: spec.learningRate,
    momentum: spec.momentum,
    weightDecay: spec.weightDecay,
    nesterov: true,
    compressor: 'none',
    group,
    frozenBatchNorm: true,
  });
  try {
    if (group) await model.broadcastState(0);
    const batcher = new Batcher(imageSet, {
      batchSize: spec.batchSize,
      shuffle: true,
      augment: false,
      seed: spec.seed,
      rank: group?.rank ?? 0,
      worldSize: group?.worldSize ?? 1,
      mean: MEAN,
      std: STD,
    });
    batcher.startEpoch(0);
    const losses = [];
    for (let s = 0; s < spec.steps; s++) {
      const r = await model.trainStep(batcher);
      if (!r) throw new Error(`the epoch ended after ${s} steps`);
      losses.push({ loss: r.loss, samples: r.samples });
    }
    const state = await model.stateDict();
    const hash = createHash('sha256');
    const sums = {};
    const entries = {};
    for (const e of state) {
      hash.update(e.name).update(e.data);
      if (e.dtype !== 'F32') continue;
      const v = floatsOf(e);
      let sum = 0;
      let sumAbs = 0;
      for (const x of v) {
        sum += x;
        sumAbs += Math.abs(x);
      }
      sums[e.name] = { sum, sumAbs };
      if (e.name === 'conv1.weight' || e.name === 'linear.weight') entries[e.name] = Buffer.from(v.buffer).toString('base64');
    }
    return { losses, digest: { sha256: hash.digest('hex'), sums, entries } };
  } finally {
    await model.dispose();
  }
}

runAsWorker(import.meta.url, (spec) => printFromGroup(spec.timeoutMs ?? 60000, (group) => train(spec, group)));
