// Several workers against outside references: PyTorch DDP (Gloo, broadcast_buffers on) taking the
// same steps from the same weights on the same batches, and batch norm's running statistics of rank
// 0 replayed in float64 through rank 0's weights and batches (test/oracles). DDP's semantics: every
// step starts from rank 0's running statistics, each worker updates its copy from its own batch,
// and before evaluation and checkpoints every worker takes rank 0's (Model.syncReplicas), whose
// digest check names the first tensor on which replicas differ.
//
// The workers run in this process (one ProcessGroup each); the job of one process per worker runs
// the same native step and is covered by the trainer's multi-process suites.
import { spawn, spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { expect } from 'chai';
import { Batcher, Model, Trainer, loadCheckpoint, loadImageDataset, readSafetensors, writeSafetensors } from '../../lib/index.js';
import { ProcessGroup } from '../../lib/comm/group.js';
import { distance, makeRng, norm, randomUniform, relativeNorm as relative } from '../helpers/gradcheck.js';
import { tinyImageSet } from '../helpers/images.js';
import { PYTHON, bytesOf as bytes, float32Of as f32, float64Of as f64, requireTorch } from '../helpers/outside.js';
import { freePort } from '../helpers/ports.js';
import { ORACLES } from '../helpers/paths.js';

const W = 2;
const LR = 0.05;
const MARGIN = 1e-5;
const OFFSET = 3;
const SIDE = 8;

/** W process groups joined in this process. */
async function groups(count = W) {
  const port = await freePort();
  return Promise.all(Array.from({ length: count }, (_, rank) => ProcessGroup.connect({ rank, worldSize: count, masterPort: port, hostStore: rank === 0 })));
}

/** One model per group from the same seed, on rank 0's weights. */
async function workers(joined, options) {
  const models = await Promise.all(joined.map((group) => Model.create({ architecture: 'resnet18', classes: 10, seed: 4, learningRate: 0.05, group, threads: 1, ...options })));
  await Promise.all(models.map((m) => m.broadcastState(0)));
  return models;
}

async function dispose(models, joined) {
  await Promise.all(models.map((m) => m.dispose()));
  await Promise.all(joined.map((g) => g.dispose()));
}

/** Batch norm's running statistics (F32 buffers) of a state_dict, by name. */
const buffersOf = (state) => new Map(state.filter((e) => e.name.includes('running_')).map((e) => [e.name, f32(e)]));

/** `count` normalised images of 4×4 (ResNet-18 takes any size) with labels, from `rng`. */
const smallBatch = (rng, count, side = 4) => ({
  images: randomUniform(count * 3 * side * side, rng, -1, 1),
  labels: Int32Array.from({ length: count }, () => rng.int(10)),
  height: side,
  width: side,
});

function run(args, env = {}) {
  const r = spawnSync(PYTHON, args, { encoding: 'utf8', env: { ...process.env, OMP_NUM_THREADS: '1', ...env }, timeout: 300000 });
  expect(r.status, `${path.basename(args[0])} failed: ${r.stderr}`).to.equal(0);
}

describe('several workers: PyTorch DDP semantics, against PyTorch DDP and float64 replays', function () {
  this.timeout(600000);
  let tmp;
  before(function () {
    requireTorch();
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'accordion-ddp-'));
  });
  after(() => fs.rmSync(tmp, { recursive: true, force: true }));

  /**
   * Rank 0's running statistics replayed in float64 from `initial` through `steps` (each the weights
   * rank 0 had before the step and the batches it ran forward), by test/oracles/torch_running_stats.py.
   */
  function replay(name, initial, steps, shape) {
    const tensors = [...initial].map(([n, v]) => ({ name: `initial.${n}`, dtype: 'F32', shape: [v.length], data: bytes(v) }));
    steps.forEach(({ weights, batches }, s) => {
      for (const e of weights) if (!e.name.includes('running_') && e.dtype === 'F32') tensors.push({ ...e, name: `step${s}.${e.name}` });
      batches.forEach((images, b) => tensors.push({ name: `step${s}.batch${b}.images`, dtype: 'F32', shape: [images.length / (3 * shape[0] * shape[1]), 3, ...shape], data: bytes(images) }));
    });
    const input = path.join(tmp, `${name}-replay.safetensors`);
    const output = path.join(tmp, `${name}-replayed.safetensors`);
    writeSafetensors(input, tensors);
    run([path.join(ORACLES, 'torch_running_stats.py'), '--model', 'resnet18', '--steps', String(steps.length), input, output]);
    return new Map([...readSafetensors(output).tensors].map(([n, t]) => [n, f64(t)]));
  }

  /** After syncReplicas: every rank holds rank 0's buffers exactly, and rank 0's match the replay. */
  async function expectRankZeroStatistics(models, replayed, label) {
    await Promise.all(models.map((m) => m.syncReplicas()));
    const states = await Promise.all(models.map((m) => m.stateDict()));
    const zero = buffersOf(states[0]);
    for (let r = 1; r < models.length; r++)
      for (const [name, values] of buffersOf(states[r])) expect(Array.from(values), `${label}: rank ${r}'s ${name} after the broadcast`).to.deep.equal(Array.from(zero.get(name)));
    for (const [name, values] of zero) expect(relative(values, replayed.get(name)), `${label}: rank 0's ${name} against the float64 replay`).to.be.below(1e-5);
  }

  it('dense, 2 workers, 3 steps beside PyTorch DDP (float64) on the same weights and batches: every parameter and buffer of every rank within 1e-4', async function () {
    const joined = await groups();
    const models = await workers(joined, { learningRate: LR });
    // Batch norm's shifts at OFFSET put every ReLU input at about OFFSET ± 1, far from the ReLU's
    // kink (float32 rounding could tip an input within 1e-6 of it, whose gradient then jumps):
    // with shifts of 0, ResNet-18 at this size has thousands of inputs that close.
    const shifted = (await models[0].stateDict()).map((e) =>
      /(bn\d|shortcut\.1)\.bias$/.test(e.name) ? { ...e, data: bytes(new Float32Array(e.shape[0]).fill(OFFSET)) } : e,
    );
    await Promise.all(models.map((m) => m.loadStateDict(shifted)));
    const rng = makeRng(1);
    const steps = 3;
    const batches = Array.from({ length: steps }, () => Array.from({ length: W }, () => smallBatch(rng, 32, SIDE)));
    const init = path.join(tmp, 'ddp-init.safetensors');
    const batchFile = path.join(tmp, 'ddp-batches.safetensors');
    const states = [];
    const initial = new Map();
    try {
      const state = await models[0].stateDict();
      writeSafetensors(init, state);
      for (const e of state) if (e.dtype === 'F32') initial.set(e.name, f32(e));
      writeSafetensors(
        batchFile,
        batches.flatMap((ranks, s) =>
          ranks.flatMap((b, r) => [
            { name: `step${s}.rank${r}.images`, dtype: 'F32', shape: [32, 3, SIDE, SIDE], data: bytes(b.images) },
            { name: `step${s}.rank${r}.labels`, dtype: 'I32', shape: [32], data: bytes(b.labels) },
          ]),
        ),
      );
      for (let s = 0; s < steps; s++) {
        await Promise.all(models.map((m, r) => m.trainStep(batches[s][r])));
        states.push(await Promise.all(models.map((m) => m.stateDict())));
      }
    } finally {
      await dispose(models, joined);
    }
    const port = await freePort();
    const outputs = Array.from({ length: W }, (_, r) => path.join(tmp, `ddp-rank${r}.safetensors`));
    await Promise.all(
      outputs.map(
        (out, rank) =>
          new Promise((resolve, reject) => {
            const args = [path.join(ORACLES, 'torch_ddp_steps.py'), '--rank', rank, '--world', W, '--master', `127.0.0.1:${port}`, '--state', init, '--batches', batchFile, '--steps', steps, '--lr', LR, '--dtype', 'float64', '--out', out];
            const child = spawn(PYTHON, args.map(String), { env: { ...process.env, OMP_NUM_THREADS: '1' }, stdio: ['ignore', 'ignore', 'pipe'] });
            let stderr = '';
            child.stderr.on('data', (d) => (stderr += d));
            child.on('exit', (code) => (code === 0 ? resolve() : reject(new Error(`DDP rank ${rank} exited with ${code}: ${stderr}`))));
          }),
      ),
    );
    const references = outputs.map((file) => readSafetensors(file).tensors);
    // Well-conditioned steps: float32 rounding cannot tip any ReLU decision of any rank's forward.
    for (let s = 0; s < steps; s++)
      references.forEach((reference, r) =>
        expect(f64(reference.get(`step${s}.margin`))[0], `rank ${r}, step ${s + 1}: the closest ReLU tie (float64)`).to.be.at.least(MARGIN),
      );
    for (let r = 0; r < W; r++) {
      const reference = references[r];
      for (let s = 0; s < steps; s++) {
        for (const e of states[s][r]) {
          if (e.dtype !== 'F32') continue;
          // Within 1e-4 of the value, or 1e-3 of the change since the start: the sum of two ranks'
          // gradients may cancel, which magnifies rounding in a small update (a bias from zero).
          const want = f64(reference.get(`step${s}.${e.name}`));
          const start = initial.get(e.name);
          const error = distance(f32(e), want);
          const bound = 1e-4 * norm(want) + 1e-3 * distance(start, want);
          expect(error, `rank ${r} after step ${s + 1}: ${e.name} against PyTorch DDP (relative error ${(error / norm(want)).toExponential(2)})`).to.be.at.most(bound);
        }
      }
    }
  });

  for (const compressor of ['powersgd', 'topk']) {
    it(`${compressor}, 2 workers, 3 steps: after syncReplicas every rank holds rank 0's running statistics, which match a float64 replay of rank 0's batches`, async function () {
      const joined = await groups();
      const models = await workers(joined, { compressor, level: compressor === 'topk' ? 0.1 : 2 });
      const rng = makeRng(5);
      try {
        const initial = buffersOf(await models[0].stateDict());
        const steps = [];
        for (let s = 0; s < 3; s++) {
          const batches = models.map(() => smallBatch(rng, 16));
          steps.push({ weights: await models[0].stateDict(), batches: [batches[0].images] });
          await Promise.all(models.map((m, r) => m.trainStep(batches[r])));
        }
        await expectRankZeroStatistics(models, replay(compressor, initial, steps, [4, 4]), compressor);
      } finally {
        await dispose(models, joined);
      }
    });
  }

  it('micro-batches, 2 workers, 2 steps of 2 batches from the Batcher: every rank holds rank 0\'s running statistics, which match a float64 replay', async function () {
    const joined = await groups();
    const models = await workers(joined);
    const set = tinyImageSet(64, 10, 9);
    const options = (rank) => ({ batchSize: 8, shuffle: true, augment: false, seed: 3, rank, worldSize: W, mean: [0.5, 0.5, 0.5], std: [0.25, 0.25, 0.25] });
    try {
      const initial = buffersOf(await models[0].stateDict());
      const batchers = models.map((_, r) => new Batcher(set, options(r)));
      const twin = new Batcher(set, options(0)); // rank 0's batches, for the replay
      batchers.forEach((b) => b.startEpoch(0));
      twin.startEpoch(0);
      const steps = [];
      for (let s = 0; s < 2; s++) {
        const weights = await models[0].stateDict();
        steps.push({ weights, batches: [(await twin.next()).images, (await twin.next()).images] });
        await Promise.all(models.map((m, r) => m.trainStep(batchers[r], 2)));
      }
      await expectRankZeroStatistics(models, replay('micro', initial, steps, [32, 32]), 'micro-batches');
    } finally {
      await dispose(models, joined);
    }
  });

  it('resume, 2 workers: 2 steps, every rank\'s state saved and loaded into new workers, 2 more steps: rank 0\'s running statistics match a float64 replay of all 4', async function () {
    const rng = makeRng(8);
    const steps = [];
    let joined = await groups();
    let models = await workers(joined, { compressor: 'powersgd', level: 2 });
    const initial = buffersOf(await models[0].stateDict());
    let saved;
    try {
      for (let s = 0; s < 2; s++) {
        const batches = models.map(() => smallBatch(rng, 16));
        steps.push({ weights: await models[0].stateDict(), batches: [batches[0].images] });
        await Promise.all(models.map((m, r) => m.trainStep(batches[r])));
      }
      await Promise.all(models.map((m) => m.syncReplicas()));
      saved = await Promise.all(models.map((m) => m.stateDict(true)));
    } finally {
      await dispose(models, joined);
    }
    joined = await groups();
    models = await Promise.all(joined.map((group) => Model.create({ architecture: 'resnet18', classes: 10, seed: 99, learningRate: 0.05, group, threads: 1, compressor: 'powersgd', level: 2 })));
    try {
      await Promise.all(models.map((m, r) => m.loadStateDict(saved[r])));
      for (let s = 2; s < 4; s++) {
        const batches = models.map(() => smallBatch(rng, 16));
        steps.push({ weights: await models[0].stateDict(), batches: [batches[0].images] });
        await Promise.all(models.map((m, r) => m.trainStep(batches[r])));
      }
      await expectRankZeroStatistics(models, replay('resume', initial, steps, [4, 4]), 'resumed');
    } finally {
      await dispose(models, joined);
    }
  });

  it('the trainer in batch-size mode (2 workers, steps of 2 micro-batches, a learning rate of 1e-9 that keeps the weights put): after fit every rank holds rank 0\'s running statistics, which match a float64 replay of rank 0\'s batches', async function () {
    const joined = await groups();
    const dataDir = path.join(tmp, 'synthetic');
    const common = {
      model: 'resnet18', dataset: 'synthetic', dataDir, syntheticTrain: 64, syntheticTest: 32, epochs: 1, batchSize: 8, lr: 1e-9, seed: 6,
      evalBatchSize: 16, adapt: 'batch', batchLow: 32, batchHigh: 64, threads: 1, progress: false,
    };
    // The synthetic set is generated once, before the workers read it.
    await (await Trainer.create(common)).dispose();
    const trainers = await Promise.all(joined.map((group) => Trainer.create(common, { group })));
    try {
      // The weights move by about 1e-9 of themselves: the replay runs every step through the first.
      const weights = await trainers[0].model.stateDict();
      const initial = buffersOf(weights);
      // Rank 0's batches, from a twin of its Batcher (as the image task makes it).
      const set = loadImageDataset('synthetic', dataDir, { train: 64, test: 32, seed: common.seed });
      const twin = new Batcher(set.train, { mean: set.mean, std: set.std, seed: common.seed, rank: 0, worldSize: W, batchSize: 8, shuffle: true, augment: true });
      twin.startEpoch(0);
      const batches = [];
      for (let b = 0; b < 4; b++) batches.push((await twin.next()).images);
      await Promise.all(trainers.map((t) => t.fit()));
      expect(trainers[0].history.map((e) => [e.steps, e.batchSize])).to.deep.equal([[2, 32]]);
      const steps = [{ weights, batches: batches.slice(0, 2) }, { weights, batches: batches.slice(2) }];
      await expectRankZeroStatistics(trainers.map((t) => t.model), replay('batch-mode', initial, steps, [32, 32]), 'batch-size mode');
    } finally {
      await Promise.all(trainers.map((t) => t.dispose()));
      await Promise.all(joined.map((g) => g.dispose()));
    }
  });

  it('one epoch of the synthetic recipe: 2 workers\' test loss with their saved statistics is within the 1-worker run\'s gap to statistics recomputed by PyTorch, plus 2%', async function () {
    const data = path.join(tmp, 'gap-data');
    const common = { model: 'resnet18', width: 0.5, dataset: 'synthetic', dataDir: data, syntheticTrain: 640, syntheticTest: 200, batchSize: 32, epochs: 1, threads: 1, progress: false };
    // Alone, the worker takes both cores (the two workers below one each).
    const solo = await Trainer.create({ ...common, threads: 2, outDir: path.join(tmp, 'gap-1') });
    await solo.fit();
    await solo.dispose();
    const joined = await groups();
    const trainers = await Promise.all(joined.map((group) => Trainer.create({ ...common, outDir: path.join(tmp, 'gap-2') }, { group })));
    try {
      await Promise.all(trainers.map((t) => t.fit()));
    } finally {
      await Promise.all(trainers.map((t) => t.dispose()));
      await Promise.all(joined.map((g) => g.dispose()));
    }
    // The relative excess of the test loss with the saved statistics over the loss with statistics
    // recomputed from 320 training images through the final weights (test/oracles). In float32: the
    // bound is 2% and PyTorch's float32 losses agree with its float64 ones to 1e-6 here, in a
    // quarter of the time.
    const r = spawnSync(PYTHON, [
      path.join(ORACLES, 'torch_recomputed_loss.py'), '--model', 'resnet18', '--width', '0.5', '--data', data, '--train-images', '320', '--dtype', 'float32',
      ...['gap-1', 'gap-2'].flatMap((run) => ['--checkpoint', path.join(loadCheckpoint(path.join(tmp, run)).dir, 'model.safetensors')]),
    ], { encoding: 'utf8', env: { ...process.env, OMP_NUM_THREADS: '2' }, timeout: 300000 });
    expect(r.status, `torch_recomputed_loss.py failed: ${r.stderr}`).to.equal(0);
    const [one, two] = r.stdout.trim().split('\n').map((line) => {
      const { saved, recomputed } = JSON.parse(line);
      return { saved, recomputed, excess: saved / recomputed - 1 };
    });
    this.test.title += ` [1 worker ${one.saved.toFixed(3)} saved / ${one.recomputed.toFixed(3)} recomputed, 2 workers ${two.saved.toFixed(3)} / ${two.recomputed.toFixed(3)}]`;
    expect(two.excess).to.be.at.most(one.excess + 0.02);
  });

  it('replicas that differ: syncReplicas rejects on every worker with ERR_REPLICA_MISMATCH, naming the first tensor and the ranks', async function () {
    const joined = await groups(3);
    // No broadcast of rank 0's weights: rank 2 starts from other weights than ranks 0 and 1.
    const models = await Promise.all(joined.map((group, r) => Model.create({ architecture: 'resnet18', classes: 10, seed: r === 2 ? 5 : 4, group, threads: 1 })));
    try {
      const results = await Promise.allSettled(models.map((m) => m.syncReplicas()));
      for (const r of results) {
        expect(r.status).to.equal('rejected');
        expect(r.reason.code).to.equal('ERR_REPLICA_MISMATCH');
        expect(r.reason.message).to.match(/'conv1\.weight' on rank 2 is not rank 0's/);
      }
    } finally {
      await dispose(models, joined);
    }
  });
});
