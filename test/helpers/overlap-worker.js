// One worker of a data-parallel job that trains ResNet-18 at half width (or, with `model: 'lstm'`, a small LSTM on
// token windows of its own) for a few steps with the exchange overlapped with backward in buckets, or
// after backward (bucketMb 0), and writes its whole training state (weights, momentum, error
// memories, Q) to `${spec.out}.rank${RANK}.safetensors`. It prints one JSON line: per step the loss
// and the floats accounting, the exchange plan, the levels and the threads that run as SCHED_BATCH.
// argv[2] is the spec: { model, compressor, level, mixedLevels, bucketMb, threads, steps, seed, count,
// batchSize, clipNorm, out }.
// With `announce`, it prints "step N" before each step (for tests that stop a worker mid-exchange).
import * as fs from 'node:fs';
import { Batcher, Model } from '../../lib/index.js';
import { writeSafetensors } from '../../lib/engine/safetensors.js';
import { syntheticImages } from './train-worker.js';
import { printFromGroup, runAsWorker } from './worker.js';

/** Mixed levels: every third matrix dense, the others at 1, 2 or 4 (PowerSGD) or 5%, 20% (TopK). */
function mixedLevels(compressor, parameters) {
  const options = compressor === 'topk' ? [0, 0.05, 0.2] : [0, 1, 2, 4];
  let matrix = 0;
  return parameters.map((p) => (p.shape.length > 1 ? options[matrix++ % options.length] : 0));
}

/** Trains `spec.steps` steps on the job's group, writes the state and returns what the worker prints. */
async function trainAndSave(spec, group, env) {
  const language = spec.model === 'lstm';
  const model = await Model.create({
    ...(language ? { architecture: 'lstm', classes: VOCABULARY, hidden: 24, layers: 2, dropout: 0, clipNorm: spec.clipNorm ?? 0 } : { architecture: 'resnet18', width: 0.5, classes: 10 }),
    seed: spec.seed,
    learningRate: 0.01,
    compressor: spec.compressor,
    level: spec.level,
    minCompressionRate: 0,
    group,
    bucketMb: spec.bucketMb,
    threads: spec.threads,
  });
  try {
    await model.broadcastState(0);
    if (spec.mixedLevels) await model.setLevels(mixedLevels(spec.compressor, model.parameters()));
    const next = language ? tokenWindows(spec.seed * 31 + env.rank) : imageBatches(spec, env);
    const steps = [];
    for (let s = 0; s < spec.steps; s++) {
      if (spec.announce) process.stdout.write(`step ${s}\n`);
      const r = await model.trainStep(next());
      steps.push({ loss: r.loss, floatsSent: r.floatsSent, overheadFloats: r.overheadFloats });
    }
    writeSafetensors(`${spec.out}.rank${env.rank}.safetensors`, await model.stateDict(true));
    const plan = await model.exchangePlan();
    return { steps, plan, levels: Array.from(await model.levels()), batchThreads: batchThreads() };
  } finally {
    await model.dispose();
  }
}

const VOCABULARY = 50;

/** This worker's token windows (6 steps × 4 columns), the next one on each call. */
function tokenWindows(seed) {
  let x = seed + 1;
  const draw = () => (x = (x * 48271) % 2147483647) % VOCABULARY;  // Park and Miller's generator
  return () => {
    const tokens = Int32Array.from({ length: 24 }, draw);
    return { tokens, targets: Int32Array.from(tokens, (t, i) => (t + i) % VOCABULARY), steps: 6, batch: 4 };
  };
}

/** The batcher over this worker's shard of the synthetic images: `next()` is the batcher itself. */
function imageBatches(spec, env) {
  const batcher = new Batcher(syntheticImages(spec.seed, spec.count, 10), {
    batchSize: spec.batchSize,
    shuffle: true,
    augment: false,
    seed: spec.seed,
    rank: env.rank,
    worldSize: env.worldSize,
    mean: [0.49, 0.48, 0.45],
    std: [0.25, 0.24, 0.26],
  });
  batcher.startEpoch(0);
  return () => batcher;
}

/** This process's threads that run as SCHED_BATCH (policy 3, the 41st field of /proc/<pid>/task/<tid>/stat). */
function batchThreads() {
  const dir = `/proc/${process.pid}/task`;
  return fs.readdirSync(dir).filter((tid) => fs.readFileSync(`${dir}/${tid}/stat`, 'utf8').split(') ')[1].split(' ')[38] === '3').map(Number);
}

runAsWorker(import.meta.url, (spec) => printFromGroup(60000, (group, env) => trainAndSave(spec, group, env)));
