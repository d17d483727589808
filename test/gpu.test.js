// Training on a CUDA GPU. The suite compares the GPU with the CPU op for op's composition: the same
// weights and batches must give the same losses and parameters after several steps (TF32 is off on
// the GPU: cuDNN's FMA math, cuBLAS's default math). Without a usable GPU it is pending, and the
// checks of how --device cuda fails run instead; with ACCORDION_REQUIRE_GPU=1 (scripts/gpu-check.sh)
// a missing GPU fails the suite instead of leaving it pending.
import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Batcher, Model, Trainer, loadCheckpoint, loadImageDataset, parseDevice, writeSyntheticCifar10 } from '../lib/index.js';
import { binding } from '../lib/native.js';

const CLI = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'lib', 'cli.js');
const DEVICE_CODES = ['ERR_NO_CUDA', 'ERR_NO_CUDA_DEVICE', 'ERR_CUDA_LIBRARY'];

/** Why cuda:0 cannot train here, or null when it can. */
function gpuUnavailable() {
  try {
    binding.checkDevice('cuda');
    return null;
  } catch (err) {
    return err;
  }
}

function runCli(args) {
  const r = spawnSync(process.execPath, [CLI, ...args], { encoding: 'utf8', env: { ...process.env, OMP_NUM_THREADS: '2' } });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** ‖a − b‖ / ‖b‖ over two float32 byte arrays. */
function relativeError(aBytes, bBytes) {
  const a = new Float32Array(aBytes.buffer, aBytes.byteOffset, aBytes.byteLength / 4);
  const b = new Float32Array(bBytes.buffer, bBytes.byteOffset, bBytes.byteLength / 4);
  let diff = 0, norm = 0;
  for (let i = 0; i < a.length; i++) {
    if (!Number.isFinite(a[i]) || !Number.isFinite(b[i])) return Infinity;
    diff += (a[i] - b[i]) ** 2;
    norm += b[i] ** 2;
  }
  return Math.sqrt(diff) / Math.max(Math.sqrt(norm), 1e-30);
}

/** Every entry of two state dicts agrees: floats within `tolerance`, integers exactly. */
function expectStatesClose(gpu, cpu, tolerance) {
  expect(gpu.map((t) => t.name)).to.deep.equal(cpu.map((t) => t.name));
  for (let i = 0; i < cpu.length; i++) {
    const [g, c] = [gpu[i], cpu[i]];
    expect(g.shape, c.name).to.deep.equal(c.shape);
    if (c.dtype === 'F32') expect(relativeError(g.data, c.data), c.name).to.be.below(tolerance);
    else expect(Buffer.from(g.data).equals(Buffer.from(c.data)), c.name).to.equal(true);
  }
}

describe('devices', function () {
  it('names devices as cpu, cuda or cuda:N', function () {
    for (const good of ['cpu', 'cuda', 'cuda:0', 'cuda:12']) expect(parseDevice(good)).to.equal(good);
    for (const bad of ['gpu', 'CUDA', 'cuda:', 'cuda:-1', 'cuda:x', '', 3]) expect(() => parseDevice(bad), String(bad)).to.throw(/expected cpu, cuda or cuda:N/);
  });

  it('refuses a malformed --device and GPU runs it cannot do yet, with exit code 2', function () {
    const cases = [
      [['--model', 'resnet18', '--device', 'gpu'], /device: expected cpu, cuda or cuda:N, got 'gpu'/],
      [['--model', 'resnet18', '--compressor', 'powersgd', '--device', 'cuda'], /compression .*runs on the CPU only so far/],
    ];
    for (const [args, message] of cases) {
      const r = runCli(['train', ...args]);
      expect(r.code, r.stderr).to.equal(2);
      expect(r.stderr).to.match(message);
    }
  });

  it('reports no device memory for a model on the CPU', async function () {
    const model = await Model.create({ architecture: 'resnet18' });
    try {
      expect(await model.memoryStats()).to.deep.equal({ device: 'cpu', allocated: 0, peak: 0 });
    } finally {
      await model.dispose();
    }
  });

  describe('without a usable GPU', function () {
    let cause;
    before(function () {
      cause = gpuUnavailable();
      if (!cause) this.skip();
    });

    it('says why cuda cannot be used, with a code, before building anything', async function () {
      expect(DEVICE_CODES).to.include(cause.code);
      const err = await Model.create({ architecture: 'resnet18', device: 'cuda' }).then(
        () => null,
        (e) => e,
      );
      expect(err, 'Model.create on cuda').to.not.equal(null);
      expect(err.code).to.equal(cause.code);
      expect(err.message).to.equal(cause.message);
    });

    for (const model of ['vgg19bn', 'lstm']) {
      it(`fails \`train --model ${model} --device cuda\` at once with exit code 1 and the cause, before reading data`, function () {
        const out = fs.mkdtempSync(path.join(os.tmpdir(), 'acc-gpu-'));
        try {
          const started = Date.now();
          const r = runCli(['train', '--model', model, '--device', 'cuda', '--data', path.join(out, 'missing'), '--out', path.join(out, 'run')]);
          expect(r.code, r.stderr).to.equal(1);
          expect(r.stderr).to.include(cause.message);
          expect(r.stderr).to.not.match(/missing/); // the data directory was never opened
          expect(fs.existsSync(path.join(out, 'run'))).to.equal(false);
          expect(Date.now() - started).to.be.below(20_000);
        } finally {
          fs.rmSync(out, { recursive: true, force: true });
        }
      });
    }

    it('refuses an lstm on cuda for the missing device, not for the model', async function () {
      const err = await Model.create({ architecture: 'lstm', classes: 50, hidden: 8, device: 'cuda' }).then(
        () => null,
        (e) => e,
      );
      expect(err?.code).to.equal(cause.code);
      expect(err.message).to.equal(cause.message);
    });

    it('refuses to assemble batches for a GPU, naming the cause', function () {
      const images = { images: new Uint8Array(4 * 3072), labels: new Int32Array(4), count: 4, classes: 10 };
      expect(() => new Batcher(images, { batchSize: 2, device: 'cuda' })).to.throw().with.property('code').that.is.oneOf(DEVICE_CODES);
    });
  });
});

describe('GPU training (cuda:0)', function () {
  this.timeout(600_000);
  let dataset, root;

  before(function () {
    const cause = gpuUnavailable();
    if (cause && process.env.ACCORDION_REQUIRE_GPU === '1') throw new Error(`ACCORDION_REQUIRE_GPU=1 but cuda:0 cannot train: ${cause.message}`);
    if (cause) this.skip();
    root = fs.mkdtempSync(path.join(os.tmpdir(), 'acc-gpu-'));
    writeSyntheticCifar10(path.join(root, 'data'), { train: 512, test: 200, seed: 11 });
    dataset = loadImageDataset('cifar10', path.join(root, 'data'));
  });
  after(() => root && fs.rmSync(root, { recursive: true, force: true }));

  async function trainBoth(architecture, steps, batchSize) {
    const models = {}, batchers = {}, losses = { cpu: [], cuda: [] };
    for (const device of ['cpu', 'cuda']) {
      models[device] = await Model.create({ architecture, seed: 5, device, learningRate: 0.05 });
      batchers[device] = new Batcher(dataset.train, { batchSize, seed: 9, mean: dataset.mean, std: dataset.std, device });
      batchers[device].startEpoch(0);
      for (let s = 0; s < steps; s++) losses[device].push((await models[device].trainStep(batchers[device])).loss);
    }
    return { models, losses };
  }

  for (const architecture of ['resnet18', 'vgg19bn']) {
    it(`${architecture}: 3 steps on the GPU and on the CPU from the same weights and batches agree (losses and every tensor, relative error < 1e-3)`, async function () {
      const { models, losses } = await trainBoth(architecture, 3, 64);
      try {
        for (let s = 0; s < 3; s++) expect(Math.abs(losses.cuda[s] - losses.cpu[s]) / losses.cpu[s], `loss of step ${s + 1}`).to.be.below(1e-3);
        expectStatesClose(await models.cuda.stateDict(true), await models.cpu.stateDict(true), 1e-3);
        expect((await models.cuda.memoryStats()).peak).to.be.above(0);
      } finally {
        await models.cpu.dispose();
        await models.cuda.dispose();
      }
    });
  }

  // Token windows (T, B) of a vocabulary V, different for every call so that the carried state matters.
  function tokenWindow(V, T, B, k) {
    const inputs = new Int32Array(T * B).map((_, i) => (i * 7 + k * 13 + ((i * i) % 5)) % V);
    const targets = new Int32Array(T * B).map((_, i) => (i * 11 + k * 3 + 1) % V);
    return [inputs, targets];
  }

  const lstmCases = [
    { label: 'V 120, 2×32, dropout 0.3, clip 0.25', options: { classes: 120, hidden: 32, layers: 2, dropout: 0.3 }, T: 7, B: 4, clip: 0.25 },
    { label: 'V 2000, 3×48, no dropout, no clip', options: { classes: 2000, hidden: 48, layers: 3, dropout: 0 }, T: 5, B: 6, clip: 0 },
  ];
  for (const c of lstmCases) {
    it(`lstm (${c.label}): 3 windows on the GPU and on the CPU from the same seed agree (losses, every tensor, carried state and evaluation; relative error < 1e-3)`, async function () {
      const models = {}, results = { cpu: [], cuda: [] };
      try {
        for (const device of ['cpu', 'cuda']) {
          const model = (models[device] = await Model.create({ architecture: 'lstm', seed: 4, learningRate: 1, weightDecay: 0, ...c.options, device }));
          const r = results[device];
          for (let s = 0; s < 3; s++) r.push((await model.trainTokens(...tokenWindow(c.options.classes, c.T, c.B, s), c.T, c.B, c.clip)).loss);
          // Evaluation from the carried state, twice (the state moves on), then from zero and with another batch size.
          const [inputs, targets] = tokenWindow(c.options.classes, c.T, c.B, 7);
          r.push((await model.evaluateTokens(inputs, targets, c.T, c.B)).loss);
          r.push((await model.evaluateTokens(inputs, targets, c.T, c.B)).loss);
          await model.resetState();
          r.push((await model.evaluateTokens(inputs, targets, c.T, c.B)).loss);
          r.push((await model.evaluateTokens(inputs.subarray(0, 2 * c.T), targets.subarray(0, 2 * c.T), c.T, 2)).loss);
        }
        expect(results.cuda[3]).to.not.equal(results.cuda[4]); // the carried state changed the second evaluation
        results.cpu.forEach((want, i) => expect(Math.abs(results.cuda[i] - want) / want, `loss ${i}`).to.be.below(1e-3));
        expectStatesClose(await models.cuda.stateDict(true), await models.cpu.stateDict(true), 1e-3);
        expect((await models.cuda.memoryStats()).peak).to.be.above(0);
      } finally {
        await models.cpu?.dispose();
        await models.cuda?.dispose();
      }
    });
  }

  it('evaluates and predicts on the GPU as on the CPU', async function () {
    const { models } = await trainBoth('resnet18', 1, 32);
    try {
      const results = {};
      for (const device of ['cpu', 'cuda']) {
        const test = new Batcher(dataset.test, { batchSize: 64, shuffle: false, augment: false, padShards: false, mean: dataset.mean, std: dataset.std, device });
        test.startEpoch(0);
        const r = await models[device].evaluate(test);
        const images = new Float32Array(5 * 3 * 32 * 32).map((_, i) => Math.sin(i * 0.013));
        results[device] = { loss: r.loss, samples: r.samples, logits: await models[device].predict(images, 5) };
      }
      expect(results.cuda.samples).to.equal(200);
      expect(Math.abs(results.cuda.loss - results.cpu.loss) / results.cpu.loss).to.be.below(1e-3);
      const bytes = (a) => new Uint8Array(a.buffer);
      expect(relativeError(bytes(results.cuda.logits), bytes(results.cpu.logits))).to.be.below(1e-3);
    } finally {
      await models.cpu.dispose();
      await models.cuda.dispose();
    }
  });

  it('refuses batches assembled for another device, naming the batcher option', async function () {
    const model = await Model.create({ architecture: 'resnet18', device: 'cuda' });
    try {
      const batcher = new Batcher(dataset.train, { batchSize: 8 });
      batcher.startEpoch(0);
      const err = await model.trainStep(batcher).then(() => null, (e) => e);
      expect(err?.message).to.match(/create the Batcher with device 'cuda:0'/);
    } finally {
      await model.dispose();
    }
  });

  it('resumes a checkpoint written on the GPU on the CPU, and the CPU one on the GPU, with every tensor as saved', async function () {
    const options = { model: 'resnet18', dataset: 'cifar10', dataDir: path.join(root, 'data'), batchSize: 64, progress: false, outDir: path.join(root, 'run') };
    const legs = [
      ['cuda', 1],
      ['cpu', 2],
      ['cuda', 3],
    ];
    for (const [device, epochs] of legs) {
      const trainer = await Trainer.create({ ...options, device, epochs, ...(epochs > 1 ? { resume: options.outDir } : {}) });
      try {
        if (epochs > 1) {
          const saved = loadCheckpoint(options.outDir, 0);
          const loaded = await trainer.model.stateDict(true);
          const byName = new Map([...saved.model, ...saved.trainer].map((t) => [t.name, t]));
          for (const t of loaded) expect(Buffer.from(t.data).equals(Buffer.from(byName.get(t.name).data)), `${device}: ${t.name}`).to.equal(true);
        }
        const summary = await trainer.fit();
        expect(summary.epochs.map((e) => e.epoch)).to.deep.equal([...Array(epochs).keys()]);
        expect(summary.finalTestAccuracy).to.be.above(0);
      } finally {
        await trainer.dispose();
      }
    }
  });
});
