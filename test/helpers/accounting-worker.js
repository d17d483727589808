// One worker of the floats-accounting test: connects through the environment (RANK, WORLD_SIZE, …)
// and, for each case of argv[2], builds a model whose gradients travel over the job's group, trains
// a few steps, and reads around every step what the group's collectives carried
// (collectiveCounts(), counted where the collectives run). Prints one JSON line:
// { rank, cases: [{ name, shapes, levels, buckets, bufferFloats, steps: [{ floatsSent, bytesSent, overheadFloats, broadcastFloats, carried }] }] },
// where `carried` is the step's difference of the counts, per kind, and `buckets` the overlapped
// exchange's buckets ([] when it follows backward).
//
// Spec: { timeoutMs, cases: [{ name, model: { architecture, classes, hidden?, layers?, compressor,
//   level?, minCompressionRate?, bucketMb?, commDtype? }, levels?: number[] (per parameter, set before the first step),
//   steps }] }.
import { Model, setThreads } from '../../lib/index.js';
import { mulberry32 } from '../../lib/base/random.js';
import { printFromGroup, runAsWorker } from './worker.js';

/** The step's input on this rank, from a seeded stream in [0, 1): a token window for the language model, else a few images. */
function input(model, rank, step) {
  const next = mulberry32(1000 * rank + step + 1);
  if (model.architecture === 'lstm') {
    const steps = 6, batch = 3;
    const tokens = Int32Array.from({ length: steps * batch }, () => Math.floor(next() * model.classes));
    const targets = Int32Array.from({ length: steps * batch }, () => Math.floor(next() * model.classes));
    return { tokens, targets, steps, batch };
  }
  const n = 2;
  return {
    images: Float32Array.from({ length: n * 3 * 32 * 32 }, () => next() * 2 - 1),
    labels: Int32Array.from({ length: n }, () => Math.floor(next() * model.classes)),
  };
}

function difference(after, before) {
  const kinds = ['allReduce', 'allGather', 'broadcast'];
  const out = Object.fromEntries(
    kinds.map((k) => [k, { calls: after[k].calls - before[k].calls, elements: after[k].elements - before[k].elements }]),
  );
  out.barrier = { calls: after.barrier.calls - before.barrier.calls };
  out.elements = after.elements - before.elements;
  out.bytes = after.bytes - before.bytes;
  return out;
}

async function runCase(c, group) {
  const model = await Model.create({ seed: 3, learningRate: 0.01, ...c.model, group });
  try {
    if (c.levels) await model.setLevels(c.levels);
    const { buckets } = await model.exchangePlan();
    // Rank 0's running statistics travel before every step: the batch norms' floats.
    const bufferFloats = (await model.stateDict()).filter((e) => e.name.includes('running_')).reduce((n, e) => n + e.shape.reduce((a, b) => a * b, 1), 0);
    const record = { name: c.name, shapes: model.parameters().map((p) => p.shape), levels: Array.from(await model.levels()), buckets, bufferFloats, steps: [] };
    for (let s = 0; s < c.steps; s++) {
      const before = await model.native.collectiveCounts();
      const r = await model.trainStep(input(model, group.rank, s));
      const after = await model.native.collectiveCounts();
      record.steps.push({ floatsSent: r.floatsSent, bytesSent: r.bytesSent, overheadFloats: r.overheadFloats, broadcastFloats: r.broadcastFloats, carried: difference(after, before) });
    }
    return record;
  } finally {
    await model.dispose();
  }
}

async function main(spec) {
  if (process.env.OMP_NUM_THREADS) setThreads(Number(process.env.OMP_NUM_THREADS));
  await printFromGroup(spec.timeoutMs ?? 60000, async (group, env) => {
    const cases = [];
    for (const c of spec.cases) cases.push(await runCase(c, group));
    // The JS-level collectives count by the same convention: an all-gather counts its whole result.
    const before = await group.native.collectiveCounts();
    await group.allReduce(new Float32Array(5));
    await group.allGather(new Float32Array(3));
    await group.allGather(new Float32Array(env.rank + 1), Array.from({ length: env.worldSize }, (_, r) => r + 1));
    await group.broadcast(new Float32Array(7), 0);
    await group.barrier();
    const direct = difference(await group.native.collectiveCounts(), before);
    return { cases, direct };
  });
}

runAsWorker(import.meta.url, main);
