// Training on a CUDA GPU against the CPU: the same weights and batches give the same losses and state (TF32 off),
// compressed, over NCCL and over Gloo with two workers on one GPU. Without a usable GPU it is pending; with ACCORDION_REQUIRE_GPU=1
// (the GPU check, scripts/gpu-check/) a missing GPU fails it instead.
import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { Batcher, Model, ProcessGroup, Trainer, loadCheckpoint, loadImageDataset, writeSyntheticCifar10 } from '../../lib/index.js';
import { binding } from '../../lib/native/binding.js';
import { ReducerProbe } from '../../lib/testing.js';
import { freePort } from '../helpers/ports.js';
import { makeRng, randomUniform } from '../helpers/gradcheck.js';
import { requireDevice } from '../helpers/devices.js';
import { conserved, expectStatesClose, relativeError } from '../helpers/state-compare.js';
import { CLI } from '../helpers/paths.js';

describe('GPU training (cuda:0)', function () {
  this.timeout(600_000);
  let dataset, root;

  before(function () {
    requireDevice(this, 'cuda');
    root = fs.mkdtempSync(path.join(os.tmpdir(), 'acc-gpu-'));
    fs.mkdirSync(path.join(root, 'data'));
    writeSyntheticCifar10(path.join(root, 'data'), { train: 512, test: 200, seed: 11 });
    dataset = loadImageDataset('cifar10', path.join(root, 'data'));
  });
  after(() => root && fs.rmSync(root, { recursive: true, force: true }));

  // GPU and CPU trajectories part after a few steps at CIFAR size: a batch holds dozens of ReLU inputs
  // within rounding of their tie, where any two float32 computations may take different sides, and
  // training amplifies the difference (on an H200: step 1's gradients 5e-3 apart, step 3's losses 4e-4
  // to 7e-2). So the GPU takes one step from each state of the CPU's trajectory, in states where
  // float32 resolves the gradient (ResNet-18 on 32 images of 4×4; test/native/gradients.test.js checks each
  // device's gradients there against PyTorch's float64 ones), with accurate convolutions.
  function wellConditionedBatch(step) {
    const rng = makeRng(100 + step);
    return { images: randomUniform(32 * 3 * 4 * 4, rng, -1, 1), labels: Int32Array.from({ length: 32 }, () => rng.int(10)), height: 4, width: 4 };
  }
  /**
   * The CPU trains `steps` steps; before each, the GPU model loads the CPU's whole state and takes the
   * same step. `memoryFormat` is the GPU model's (the CPU's activations are channels-last).
   */
  async function stepFromCpuStates(steps, { memoryFormat = 'auto', ...options } = {}, batchOf = wellConditionedBatch) {
    const models = {}, results = { cpu: [], cuda: [] }, states = [];
    for (const device of ['cpu', 'cuda'])
      models[device] = await Model.create({
        architecture: 'resnet18', seed: 5, device, learningRate: 0.05, convAlgorithms: 'accurate', ...options, ...(device === 'cuda' && { memoryFormat }),
      });
    for (let s = 0; s < steps; s++) {
      await models.cuda.loadStateDict(await models.cpu.stateDict(true));
      const batch = batchOf(s);
      for (const device of ['cpu', 'cuda']) results[device].push(await models[device].trainStep(batch));
      states.push({ cpu: await models.cpu.stateDict(true), cuda: await models.cuda.stateDict(true) });
    }
    return { models, results, states };
  }

  // On the GPU's channels-first (NCHW) and channels-last (NHWC) activations alike.
  for (const memoryFormat of ['channels-first', 'channels-last']) {
    it(`resnet18, ${memoryFormat}: one step on the GPU from each of 3 states of the CPU (32 images of 4×4) gives the CPU's loss (1e-5) and state (every tensor within 2e-4)`, async function () {
      const { models, results, states } = await stepFromCpuStates(3, { memoryFormat });
      try {
        for (let s = 0; s < 3; s++) {
          expect(Math.abs(results.cuda[s].loss - results.cpu[s].loss) / results.cpu[s].loss, `loss of step ${s + 1}`).to.be.below(1e-5);
          // Each device's gradient lies within 1e-4 of float64, so the two within 2e-4 (the momentum buffers).
          expectStatesClose(states[s].cuda, states[s].cpu, 2e-4);
        }
        expect((await models.cuda.memoryStats()).peak).to.be.above(0);
      } finally {
        await models.cpu.dispose();
        await models.cuda.dispose();
      }
    });

    it(`vgg19bn (dropout off), ${memoryFormat}: one step on the GPU from each of 3 states of the CPU (the same 4 images of 32×32 at learning rate 0) gives the CPU's loss (1e-5) and state (2e-4)`, async function () {
      // VGG's 32×32 activations hold so many ReLU inputs that a step at any learning rate > 0 leaves a
      // near-tie in the next state; at learning rate 0 the state of test/native/gradients.test.js stays
      // well-conditioned, and the steps still move the momentum buffers and running statistics.
      const rng = makeRng(21);
      const batch = { images: randomUniform(4 * 3 * 32 * 32, rng, -1, 1), labels: Int32Array.from({ length: 4 }, () => rng.int(10)) };
      const options = { architecture: 'vgg19bn', classes: 10, seed: 2, dropout: 0, learningRate: 0, memoryFormat };
      const { models, results, states } = await stepFromCpuStates(3, options, () => batch);
      try {
        for (let s = 0; s < 3; s++) {
          expect(Math.abs(results.cuda[s].loss - results.cpu[s].loss) / results.cpu[s].loss, `loss of step ${s + 1}`).to.be.below(1e-5);
          expectStatesClose(states[s].cuda, states[s].cpu, 2e-4);
        }
      } finally {
        await models.cpu.dispose();
        await models.cuda.dispose();
      }
    });

    it(`resnet18 at CIFAR size, ${memoryFormat}: the batcher's batches reach the GPU as the CPU's (3 steps at learning rate 0: losses and batch-norm statistics)`, async function () {
      // At learning rate 0 the weights stay put, and the loss and the running statistics are continuous
      // functions of the batch: they agree to float32 rounding exactly when the same pixels arrived.
      const models = {}, losses = { cpu: [], cuda: [] };
      try {
        for (const device of ['cpu', 'cuda']) {
          models[device] = await Model.create({ architecture: 'resnet18', seed: 5, device, learningRate: 0, ...(device === 'cuda' && { memoryFormat }) });
          const batcher = new Batcher(dataset.train, { batchSize: 64, seed: 9, mean: dataset.mean, std: dataset.std, device });
          batcher.startEpoch(0);
          for (let s = 0; s < 3; s++) losses[device].push((await models[device].trainStep(batcher)).loss);
        }
        for (let s = 0; s < 3; s++) expect(Math.abs(losses.cuda[s] - losses.cpu[s]) / losses.cpu[s], `loss of step ${s + 1}`).to.be.below(1e-5);
        expect(new Set(losses.cpu).size, 'three different batches').to.equal(3);
        expectStatesClose(await models.cuda.stateDict(false), await models.cpu.stateDict(false), 1e-4);
      } finally {
        await models.cpu?.dispose();
        await models.cuda?.dispose();
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
          const model = (models[device] = await Model.create({ architecture: 'lstm', seed: 4, learningRate: 1, weightDecay: 0, clipNorm: c.clip, ...c.options, device }));
          const r = results[device];
          for (let s = 0; s < 3; s++) {
            const [tokens, targets] = tokenWindow(c.options.classes, c.T, c.B, s);
            r.push((await model.trainStep({ tokens, targets, steps: c.T, batch: c.B })).loss);
          }
          // Evaluation from the carried state, twice (the state moves on), then from zero and with another batch size.
          const [inputs, targets] = tokenWindow(c.options.classes, c.T, c.B, 7);
          r.push((await model.evaluate({ tokens: inputs, targets, steps: c.T, batch: c.B })).loss);
          r.push((await model.evaluate({ tokens: inputs, targets, steps: c.T, batch: c.B })).loss);
          await model.resetState();
          r.push((await model.evaluate({ tokens: inputs, targets, steps: c.T, batch: c.B })).loss);
          r.push((await model.evaluate({ tokens: inputs.subarray(0, 2 * c.T), targets: targets.subarray(0, 2 * c.T), steps: c.T, batch: 2 })).loss);
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
    const { models } = await stepFromCpuStates(1);
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
        expect(summary.epochs.map((e) => e.epoch)).to.deep.equal([...Array(epochs).keys()].map((e) => e + 1));
        expect(summary.finalTestAccuracy).to.be.above(0);
      } finally {
        await trainer.dispose();
      }
    }
  });

  /** A real ResNet-18 gradient: with lr 1 and no momentum or weight decay, one step moves every weight by it. */
  async function realGradients(steps) {
    const model = await Model.create({ architecture: 'resnet18', seed: 3, learningRate: 1, momentum: 0, weightDecay: 0 });
    const batcher = new Batcher(dataset.train, { batchSize: 32, seed: 4, mean: dataset.mean, std: dataset.std });
    batcher.startEpoch(0);
    const gradients = [];
    try {
      let before = await model.stateDict(false);
      for (let s = 0; s < steps; s++) {
        await model.trainStep(batcher);
        const after = await model.stateDict(false);
        const params = new Set(model.parameters().map((p) => p.name));
        gradients.push(
          after
            .filter((t) => params.has(t.name))
            .map((t, i) => {
              const [b, a] = [new Float32Array(before.find((x) => x.name === t.name).data.slice().buffer), new Float32Array(t.data.slice().buffer)];
              return b.map((v, k) => v - a[k]);
            }),
        );
        before = after;
      }
      return { shapes: model.parameters().map((p) => p.shape), gradients };
    } finally {
      await model.dispose();
    }
  }

  it('compresses a real ResNet-18 gradient on the GPU as on the CPU (2 workers, 3 steps: outputs, error memories, Q)', async function () {
    const { shapes, gradients } = await realGradients(4);
    const f32bytes = (a) => new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
    for (const [compressor, level, tolerance] of [
      ['powersgd', 2, 1e-4],
      ['powersgd', 1, 1e-4],
      ['topk', 0.1, 1e-6],
      ['topk', 0.01, 1e-6],
      ['none', 1, 1e-6],
    ]) {
      const probes = Object.fromEntries(['cpu', 'cuda'].map((device) => [device, new ReducerProbe(shapes, { compressor, level, workers: 2, device, accumulateNorms: true })]));
      for (let s = 0; s < 3; s++) {
        // Worker w sees the gradient of step s + w: two real, different gradients per step.
        const grads = [gradients[s], gradients[s + 1]];
        const out = { cpu: probes.cpu.step(grads), cuda: probes.cuda.step(grads) };
        const what = `${compressor} ${level}, step ${s + 1}`;
        expect(out.cuda.floatsSent, what).to.equal(out.cpu.floatsSent);
        for (let w = 0; w < 2; w++)
          for (let i = 0; i < shapes.length; i++) {
            expect(relativeError(f32bytes(out.cuda.outputs[w][i]), f32bytes(out.cpu.outputs[w][i])), `${what}: output ${i} of worker ${w}`).to.be.below(tolerance);
            const [mg, mc] = [probes.cuda.memory(w, i), probes.cpu.memory(w, i)];
            if (mc) expect(relativeError(f32bytes(mg), f32bytes(mc)), `${what}: memory ${i} of worker ${w}`).to.be.below(tolerance * 10);
            const [qg, qc] = [probes.cuda.q(w, i), probes.cpu.q(w, i)];
            if (qc) expect(relativeError(f32bytes(qg), f32bytes(qc)), `${what}: Q ${i} of worker ${w}`).to.be.below(tolerance);
          }
      }
      const [ng, nc] = [probes.cuda.norms(0), probes.cpu.norms(0)];
      for (let i = 0; i < nc.length; i++) expect(Math.abs(ng[i] - nc[i]) / nc[i], `norm ${i}`).to.be.below(1e-5);
    }
  });

  for (const [compressor, level] of [
    ['powersgd', 2],
    ['topk', 0.1],
  ]) {
    it(`trains ResNet-18 with ${compressor} on the GPU as on the CPU (one step from each of 3 CPU states, 32 images of 4×4), and its compressor state moves between them`, async function () {
      const run = async (device, from) => {
        const model = await Model.create({ architecture: 'resnet18', seed: 5, device, learningRate: 0.05, compressor, level });
        await model.loadStateDict(from);
        return { model };
      };
      const { models: trained, results, states } = await stepFromCpuStates(3, { compressor, level, momentum: 0.9 });
      const models = { cpu: { model: trained.cpu }, cuda: { model: trained.cuda } };
      try {
        for (let s = 0; s < 3; s++) {
          const [g, c] = [results.cuda[s], results.cpu[s]];
          expect(Math.abs(g.loss - c.loss) / c.loss, `loss of step ${s + 1}`).to.be.below(1e-5);
          expect(g.floatsSent, `floats of step ${s + 1}`).to.equal(c.floatsSent);
          expect(states[s].cuda.filter((t) => t.name.startsWith('compressor.')).length).to.be.above(0);
          // The gradients differ by up to 2e-4 (above); PowerSGD's orthogonalisation may amplify that a
          // few times. TopK's selection flips where two magnitudes lie closer than that (a ResNet-18
          // layer's million entries leave some), moving entries between what is sent and the memory,
          // and so into the weight and the momentum buffer: for TopK what error feedback conserves is
          // compared (conserved, in test/helpers/state-compare.js). On the CPU, inputs 3e-6 apart flipped entries of
          // layer4.1.conv2: its memories 1.5e-2 apart, its weights 2e-5, what is conserved 1e-6.
          if (compressor === 'topk') expectStatesClose(...conserved([states[s].cuda, states[s].cpu], { learningRate: 0.05, momentum: 0.9 }), 2e-4);
          else expectStatesClose(states[s].cuda, states[s].cpu, 1e-3);
        }
        // The GPU's whole state (error memories, Q, levels) continues on the CPU, and the CPU's on the GPU.
        for (const [from, to] of [['cuda', 'cpu'], ['cpu', 'cuda']]) {
          const moved = await run(to, await models[from].model.stateDict(true));
          try {
            const loaded = await moved.model.stateDict(true);
            const saved = await models[from].model.stateDict(true);
            for (let i = 0; i < saved.length; i++) expect(Buffer.from(loaded[i].data).equals(Buffer.from(saved[i].data)), `${from} → ${to}: ${saved[i].name}`).to.equal(true);
          } finally {
            await moved.model.dispose();
          }
        }
      } finally {
        for (const m of Object.values(models)) await m.model.dispose();
      }
    });
  }

  describe('Gloo on one GPU', function () {
    /** Two workers in this process, each a Model on `device` joined by its own group, from `state`. */
    async function pair(device, state, options) {
      const port = await freePort();
      const groups = await Promise.all([0, 1].map((rank) => ProcessGroup.connect({ rank, worldSize: 2, masterPort: port, hostStore: rank === 0 })));
      const models = await Promise.all(groups.map((group) => Model.create({ architecture: 'resnet18', seed: 5, device, learningRate: 0.05, convAlgorithms: 'accurate', group, distBackend: 'gloo', ...options })));
      for (const m of models) await m.loadStateDict(state);
      return { models, dispose: async () => { for (const m of models) await m.dispose(); for (const g of groups) await g.dispose(); } };
    }

    it('two workers share cuda:0 over Gloo (each collective staged through the host) and train as two CPU workers do (PowerSGD rank 2, one step: losses, floats, every tensor)', async function () {
      const options = { compressor: 'powersgd', level: 2 };
      const seed = await Model.create({ architecture: 'resnet18', seed: 5, learningRate: 0.05, ...options });
      const state = await seed.stateDict(true);
      await seed.dispose();
      const pairs = { cpu: await pair('cpu', state, options), cuda: await pair('cuda:0', state, options) };
      try {
        const results = {};
        for (const device of ['cpu', 'cuda']) results[device] = await Promise.all(pairs[device].models.map((m, w) => m.trainStep(wellConditionedBatch(w))));
        for (let w = 0; w < 2; w++) {
          const [g, c] = [results.cuda[w], results.cpu[w]];
          expect(Math.abs(g.loss - c.loss) / c.loss, `loss of worker ${w}`).to.be.below(1e-5);
          expect(g.floatsSent, `floats of worker ${w}`).to.equal(c.floatsSent);
          expectStatesClose(await pairs.cuda.models[w].stateDict(true), await pairs.cpu.models[w].stateDict(true), 1e-3);
        }
      } finally {
        for (const p of Object.values(pairs)) await p.dispose();
      }
    });
  });

  describe('workers launched on GPUs (NCCL, Gloo)', function () {
    const inheritedJob = ['RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT', 'ACCORDION_JOB_TOKEN', 'ACCORDION_STORE_HOSTED'];
    function launch(nproc, trainArgs) {
      const env = { ...process.env, OMP_NUM_THREADS: '2' };
      for (const name of inheritedJob) delete env[name];
      return spawnSync(process.execPath, [CLI, 'launch', '--nproc-per-node', String(nproc), '--master-port', String(port), '--', ...trainArgs], {
        encoding: 'utf8',
        env,
        timeout: 300_000,
      });
    }
    let port;
    beforeEach(async () => {
      port = await freePort();
    });

    it('trains one worker per GPU through NCCL with PowerSGD, and the run resumes', function () {
      const gpus = binding.deviceQuery().count;
      const out = path.join(root, 'nccl-run');
      const args = ['--model', 'resnet18', '--dataset', 'cifar10', '--data', path.join(root, 'data'), '--device', 'cuda', '--compressor', 'powersgd', '--rank', '2', '--batch-size', '64', '--epochs', '1', '--out', out];
      const r = launch(gpus, args);
      expect(r.status, r.stderr).to.equal(0);
      const resumed = launch(gpus, [...args.slice(0, -4), '--epochs', '2', '--resume', out]);
      expect(resumed.status, resumed.stderr).to.equal(0);
      expect(loadCheckpoint(out, 0).position.epochsCompleted).to.equal(2);
    });

    // The worker exits 2 (usage); the launcher then stops the job with 1, as for any failed worker.
    it('refuses more workers on a host than it has GPUs, naming both counts', function () {
      const gpus = binding.deviceQuery().count;
      const r = launch(gpus + 1, ['--model', 'resnet18', '--dataset', 'synthetic', '--device', 'cuda', '--epochs', '1']);
      expect(r.status, r.stderr).to.equal(1);
      expect(r.stderr).to.match(new RegExp(`rank ${gpus} exited with (code )?2`));
      expect(r.stderr).to.match(new RegExp(`worker ${gpus} of its host \\(LOCAL_RANK\\), which has ${gpus} GPU\\(s\\)`));
    });

    it('runs two workers on one GPU over Gloo (--dist-backend gloo) where NCCL refuses them', function () {
      const r = launch(2, ['--model', 'resnet18', '--dataset', 'cifar10', '--data', path.join(root, 'data'), '--device', 'cuda:0', '--dist-backend', 'gloo', '--compressor', 'powersgd', '--rank', '2', '--batch-size', '64', '--epochs', '1', '--out', path.join(root, 'gloo-run')]);
      expect(r.status, r.stderr).to.equal(0);
      expect(loadCheckpoint(path.join(root, 'gloo-run'), 0).position.epochsCompleted).to.equal(1);
    });

    it('refuses two workers pinned to one GPU', function () {
      const r = launch(2, ['--model', 'resnet18', '--dataset', 'synthetic', '--device', 'cuda:0', '--epochs', '1']);
      expect(r.status, r.stderr).to.equal(1);
      expect(r.stderr).to.match(/pins every worker of a host to one GPU/);
    });
  });
});
