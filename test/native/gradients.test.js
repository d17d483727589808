// The engine's gradients against PyTorch's in float64 (test/oracles/torch_gradients.py), at three
// consecutive steps of training from a standard initialisation: before each step the engine's own
// state is saved, PyTorch backpropagates the same batch through it, and every gradient tensor of the
// engine's step must lie within 1e-4 (relative norm) of PyTorch's float64 gradient. A later step that
// disagrees where the first agrees would show something carried over from the earlier step.
//
// Well-conditioned states only. A ReLU network's gradient jumps where an input of a ReLU or a
// max-pool decision crosses a tie: any float32 computation (PyTorch's own too) lands on the other
// side of such a tie when it lies within its rounding (~1e-7 to 1e-6 of the activations). At CIFAR
// size and a batch of 32, about 2·10⁷ ReLU inputs leave dozens of them that close, and PyTorch's
// float32 gradients differ from its float64 ones by 6e-4 to 7e-3 at every such state tried (ResNet-18
// and VGG-19bn). The states here are small enough to have none: ResNet-18 on a batch of 32 images
// of 4×4 pixels, VGG-19bn (which needs 32×32) on a batch of 4. Each state is checked before it is
// compared: every ReLU input and max-pool gap lies at least MARGIN from its tie in float64, and
// PyTorch's own float32 gradient agrees with float64 to 1e-5, so float32 arithmetic can resolve it.
// The later steps' states follow the engine's float32 steps, whose order of summation is the CPU's
// oneDNN kernels': the closest tie of ResNet-18's third step lay 2.4e-6 from zero on a Xeon with AMX,
// below the 2.5e-6 that held on the CPUs before it; MARGIN is twice float32's rounding of these
// activations (up to 1e-6).
// The LSTM (tanh and sigmoid, no ties) runs a batch of 32 columns.
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { expect } from 'chai';
import { Model, readSafetensors, writeSafetensors } from '../../lib/index.js';
import { makeRng, norm, randomUniform, relativeNorm as relative } from '../helpers/gradcheck.js';
import { PYTHON, bytesOf as bytes, float64Of as floats, requireTorch } from '../helpers/outside.js';
import { DEVICES, requireDevice } from '../helpers/devices.js';
import { ORACLES } from '../helpers/paths.js';

const ORACLE = path.join(ORACLES, 'torch_gradients.py');
const TOLERANCE = 1e-4;
const CONTROL = 1e-5;
const MARGIN = 2e-6;
const ZERO = 1e-6;
const STEPS = 3;

const CASES = [
  {
    name: 'ResNet-18, a batch of 32 images of 4×4',
    options: { architecture: 'resnet18', classes: 10, seed: 2 },
    batch: (rng) => ({ images: randomUniform(32 * 3 * 4 * 4, rng, -1, 1), labels: Int32Array.from({ length: 32 }, () => rng.int(10)), height: 4, width: 4 }),
    batchSeed: 8,
    oracle: ['--model', 'resnet18', '--classes', '10'],
  },
  {
    name: 'VGG-19bn (dropout off), a batch of 4 images of 32×32, three steps at learning rate 0 on the same batch',
    options: { architecture: 'vgg19bn', classes: 10, seed: 2, dropout: 0 },
    batch: (rng) => ({ images: randomUniform(4 * 3 * 32 * 32, rng, -1, 1), labels: Int32Array.from({ length: 4 }, () => rng.int(10)) }),
    learningRate: 0,
    sameBatch: true,
    batchSeed: 21,
    oracle: ['--model', 'vgg19bn', '--classes', '10'],
  },
  {
    name: 'the LSTM (2 layers of 16, dropout off), windows of 6 × 32 tokens with the state carried',
    options: { architecture: 'lstm', classes: 50, hidden: 16, layers: 2, dropout: 0, clipNorm: 0, seed: 2 },
    batch: (rng) => ({
      tokens: Int32Array.from({ length: 6 * 32 }, () => rng.int(50)),
      targets: Int32Array.from({ length: 6 * 32 }, () => rng.int(50)),
      steps: 6,
      batch: 32,
    }),
    batchSeed: 11,
    oracle: ['--model', 'lstm', '--vocabulary', '50', '--hidden', '16', '--layers', '2'],
  },
];

for (const device of DEVICES)
describe(`gradients on ${device} against PyTorch in float64, three steps from a standard initialisation`, function () {
  this.timeout(300000);
  let tmp;
  before(function () {
    requireDevice(this, device);
    requireTorch();
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'accordion-gradients-'));
  });
  after(() => tmp && fs.rmSync(tmp, { recursive: true, force: true }));

  for (const c of CASES) {
    it(`${c.name}: every gradient tensor within ${TOLERANCE} of float64 at every step`, async function () {
      // Two threads: the engine's rounding, and so the trajectory's states, are the same on every machine.
      // The trajectory is the CPU's (its states are the well-conditioned ones); on a GPU, each step's
      // gradient is the GPU model's, from the CPU's state at that step.
      const options = { ...c.options, learningRate: c.learningRate ?? 0.05, momentum: 0.9, weightDecay: 1e-4, keepGradients: true, threads: 2 };
      const model = await Model.create(options);
      // On a GPU, accurate convolutions: the transform algorithms' rounding is not within TOLERANCE.
      const onDevice = device === 'cpu' ? null : await Model.create({ ...options, device, convAlgorithms: 'accurate' });
      const rng = makeRng(c.batchSeed);
      const engine = [];
      const pairs = [];
      let first;
      try {
        for (let step = 0; step < STEPS; step++) {
          const batch = c.sameBatch && step > 0 ? first : c.batch(rng);
          first ??= batch;
          const inputs = (await model.stateDict()).filter((e) => !(c.options.architecture === 'lstm' && e.name === 'decoder.weight'));
          if (batch.images) {
            inputs.push({ name: 'input.images', dtype: 'F32', shape: [batch.labels.length, 3, batch.height ?? 32, batch.width ?? 32], data: bytes(batch.images) });
            inputs.push({ name: 'input.labels', dtype: 'I32', shape: [batch.labels.length], data: bytes(batch.labels) });
          } else {
            const hidden = c.options.hidden;
            const carried = await model.hiddenState();
            const state = (list) => {
              const out = new Float32Array(c.options.layers * batch.batch * hidden);
              list?.forEach((t, l) => out.set(t, l * batch.batch * hidden));
              return out;
            };
            inputs.push({ name: 'input.tokens', dtype: 'I32', shape: [batch.steps, batch.batch], data: bytes(batch.tokens) });
            inputs.push({ name: 'input.targets', dtype: 'I32', shape: [batch.steps, batch.batch], data: bytes(batch.targets) });
            inputs.push({ name: 'input.h', dtype: 'F32', shape: [c.options.layers, batch.batch, hidden], data: bytes(state(carried?.h)) });
            inputs.push({ name: 'input.c', dtype: 'F32', shape: [c.options.layers, batch.batch, hidden], data: bytes(state(carried?.c)) });
          }
          const source = path.join(tmp, `${c.options.architecture}-in${step}.safetensors`);
          const target = path.join(tmp, `${c.options.architecture}-out${step}.safetensors`);
          writeSafetensors(source, inputs);
          pairs.push(`${source}:${target}`);
          if (onDevice) {
            await onDevice.loadStateDict(await model.stateDict(true));
            const carried = c.options.architecture === 'lstm' ? await model.hiddenState() : null;
            if (carried) await onDevice.setHiddenState(carried);
          }
          const result = await model.trainStep(batch);
          const stepped = onDevice ? await onDevice.trainStep(batch) : result;
          engine.push({ loss: stepped.loss, gradients: await (onDevice ?? model).gradients() });
        }
      } finally {
        await model.dispose();
        await onDevice?.dispose();
      }
      const r = spawnSync(PYTHON, [ORACLE, ...c.oracle, ...pairs], { encoding: 'utf8', env: { ...process.env, OMP_NUM_THREADS: '2' }, timeout: 240000 });
      expect(r.status, `the oracle failed: ${r.stderr}`).to.equal(0);
      let worstMoved = 0;
      for (let step = 0; step < STEPS; step++) {
        const reference = readSafetensors(pairs[step].split(':')[1]).tensors;
        // The state is well-conditioned: weights and inputs moved by a relative 1e-6 move the float64
        // gradient by less than 1e-4, no ReLU or max-pool decision lies within MARGIN of a tie, and
        // PyTorch's float32 gradient agrees with its float64 one.
        const moved = floats(reference.get('moved'))[0];
        expect(moved, `step ${step}: the float64 gradient's largest relative change for a 1e-6 perturbation`).to.be.below(1e-4);
        worstMoved = Math.max(worstMoved, moved);
        if (reference.has('margin')) expect(floats(reference.get('margin'))[0], `step ${step}: the closest tie (float64)`).to.be.at.least(MARGIN);
        const f64 = new Map([...engine[step].gradients.keys()].map((name) => [name, floats(reference.get(`f64.${name}`))]));
        const total = Math.hypot(...[...f64.values()].map(norm));
        // A conv bias followed by batch norm has a gradient of exactly zero (the normalisation removes
        // any shift): float32 leaves only its rounding there, at most ZERO of the whole gradient's norm.
        const within = (got, name, tolerance) =>
          norm(f64.get(name)) < 1e-12 * total ? norm(got) / total < ZERO : relative(got, f64.get(name)) < tolerance;
        for (const [name] of engine[step].gradients)
          expect(within(floats(reference.get(`f32.${name}`)), name, CONTROL), `step ${step}: PyTorch's own float32 gradient of ${name} against float64 (the state must be well-conditioned)`).to.equal(true);
        expect(Math.abs(engine[step].loss - floats(reference.get('loss'))[0]), `step ${step}: loss`).to.be.below(1e-5);
        for (const [name, g] of engine[step].gradients) {
          const message = `step ${step}: ${name} against PyTorch's float64 gradient (relative error ${relative(g.data, f64.get(name)).toExponential(2)})`;
          expect(within(g.data, name, TOLERANCE), message).to.equal(true);
        }
      }
      this.test.title += ` [a 1e-6 perturbation moves the float64 gradient by at most ${worstMoved.toExponential(1)}]`;
    });
  }
});

