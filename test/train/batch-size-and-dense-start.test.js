// Batch sizes in training: batch-size mode with Smith's baseline, micro-batch accumulation, and the dense
// start of --compress-after (PyTorch PowerSGD's start_powerSGD_iter).
import * as path from 'node:path';
import { expect } from 'chai';
import { Batcher, Model, loadCheckpoint, readMetrics } from '../../lib/index.js';
import { endOfEpoch, initialState, normChangeRatio, wholeModelNorm } from '../../lib/train/rules/accordion.js';
import { BatchPolicy } from '../../lib/train/policies/batch.js';
import { resolveConfig } from '../../lib/train/config.js';
import { runTrainer, scriptedNorms } from '../helpers/accordion-worker.js';
import { syntheticImages } from '../helpers/train-worker.js';
import { byName, firstDifference, sameBytes, trainingRuns, withoutTime, worstRelativeDifference } from '../helpers/training-runs.js';

/**
 * A batch policy's plans over `epochs` epochs of steady norms (stable from the first check on), its
 * check after each; `after(epoch, policy)` runs after an epoch's check.
 */
async function steadyPlans(settings, epochs, after = () => {}) {
  const policy = new BatchPolicy(settings);
  const plans = [];
  for (let epoch = 0; epoch < epochs; epoch++) {
    plans.push(policy.plan(epoch));
    const { lr } = plans[epoch];
    await policy.check({ epoch, lr, lrCurrent: lr, lrNext: lr, norms: [1, 2], levels: [0, 0], runStep: 0, broadcast: async () => {} });
    after(epoch, policy);
  }
  return plans;
}

describe('Accordion in training', function () {
  const { runDir, base } = trainingRuns();

  describe('batch-size mode', function () {
    it('adapt batch: 32 until the norm settles, then 64 with the rate doubled, never shrinking again', async function () {
      const outDir = runDir('batch');
      const options = { ...base(), adapt: 'batch', batchLow: 32, batchHigh: 64, batchSize: 16, accordionInterval: 1, lr: 0.02, epochs: 4, outDir };
      const started = Date.now();
      const r = await runTrainer(options, 'batch');
      await r.trainer.dispose();
      this.test.title += ` [${Date.now() - started} ms]`;

      const whole = (e) => wholeModelNorm(scriptedNorms('batch', 0, e, r.matrices));
      let state = initialState(1);
      const regimes = [0, 1, 2, 3].map((epoch) => {
        state = endOfEpoch(state, { epoch, norms: [whole(epoch)], lrCurrent: 1, lrNext: 1 }, { eta: 0.5, interval: 1 }).state;
        return state.regimes[0];
      });
      // The script is stable at the epoch-1 check only; later checks are critical.
      expect(regimes).to.deep.equal(['critical', 'stable', 'critical', 'critical']);

      expect(r.epochs.map((e) => e.batchSize)).to.deep.equal([32, 32, 64, 64]);
      r.epochs.forEach((e, i) => expect(e.lr, `epoch ${i}: lr`).to.be.closeTo(i < 2 ? 0.02 : 0.04, 1e-12));
      expect(r.epochs.map((e) => e.samples)).to.deep.equal([64, 64, 64, 64]);
      expect(r.epochs.every((e) => e.levels === undefined)).to.equal(true);
      // Each step accumulates the whole global batch.
      const steps = [1, 2, 3, 4].map((epoch) => r.events.step.filter((s) => s.epoch === epoch).map((s) => s.samples));
      expect(steps).to.deep.equal([[32, 32], [32, 32], [64], [64]]);
      expect(r.hookCalls.map((c) => c.epoch)).to.deep.equal([1, 2, 3, 4]);

      const event = { epoch: 2, from: 32, to: 64, ratio: normChangeRatio(whole(0), whole(1)) };
      expect(r.events['batch-switch']).to.have.length(1);
      expect(r.events['batch-switch'][0]).to.deep.include({ epoch: 2, from: 32, to: 64 });
      expect(r.events['batch-switch'][0].ratio).to.be.closeTo(event.ratio, 1e-12);
      const logged = readMetrics(path.join(outDir, 'metrics.jsonl')).filter((e) => e.event === 'batch-switch');
      expect(withoutTime(logged)).to.deep.equal([{ event: 'batch-switch', ...r.events['batch-switch'][0] }]);
    });

    it('the batch never grows into the warm-up: steady norms from epoch 1, growth lands on epoch 6, the first at the full rate (0.4 × 8)', async function () {
      const schedule = { base: 0.1, workers: 4, warmupEpochs: 5, milestones: [], decay: 0.1 };
      const config = { batchLow: 128, batchHigh: 1024, eta: 0.5, accordionInterval: 1 };
      const plans = await steadyPlans({ config, schedule, spec: {}, matrices: [true] }, 8);
      expect(plans.map((p) => p.batch)).to.deep.equal([128, 128, 128, 128, 128, 128, 1024, 1024]);
      const rates = [0.1, 0.1, 0.16, 0.22, 0.28, 0.34, 3.2, 3.2];
      plans.forEach((p, e) => expect(p.lr, `epoch ${e}`).to.be.closeTo(rates[e], 1e-12));
    });

    it('--batch-ramp 5: the rate keeps its factor in the growth epoch and reaches 8× five epochs later, linearly; a restored policy plans the same', async function () {
      const schedule = { base: 0.1, workers: 4, warmupEpochs: 5, milestones: [], decay: 0.1 };
      const config = { batchLow: 128, batchHigh: 1024, batchRamp: 5, eta: 0.5, accordionInterval: 1 };
      const settings = { config, schedule, spec: {}, matrices: [true] };
      let saved;
      const plans = await steadyPlans(settings, 13, (epoch, policy) => {
        if (epoch === 7) saved = JSON.parse(JSON.stringify(policy.save()));
      });
      expect(plans.map((p) => p.batch)).to.deep.equal([...Array(6).fill(128), ...Array(7).fill(1024)]);
      // By hand: growth from epoch 6 (as above) at the full rate 0.4; factors 1, 2.4, 3.8, 5.2, 6.6, 8, 8.
      const rates = [0.1, 0.1, 0.16, 0.22, 0.28, 0.34, 0.4, 0.96, 1.52, 2.08, 2.64, 3.2, 3.2];
      plans.forEach((p, e) => expect(p.lr, `epoch ${e}`).to.be.closeTo(rates[e], 1e-12));
      const restored = new BatchPolicy(settings);
      restored.restore(saved);
      for (let epoch = 8; epoch < 13; epoch++) expect(restored.plan(epoch), `restored, epoch ${epoch}`).to.deep.equal(plans[epoch]);
    });

    it('--batch-rate-scaling none: the batch grows as before and the rate stays the schedule\'s', async function () {
      const schedule = { base: 0.1, workers: 4, warmupEpochs: 5, milestones: [7], decay: 0.1 };
      const config = { batchLow: 128, batchHigh: 1024, batchRamp: 0, batchRateScaling: 'none', eta: 0.5, accordionInterval: 1 };
      const plans = await steadyPlans({ config, schedule, spec: {}, matrices: [true] }, 10);
      expect(plans.map((p) => p.batch)).to.deep.equal([...Array(6).fill(128), ...Array(4).fill(1024)]);
      // By hand: the schedule alone, milestone 7 counting from epoch 9 (0-based).
      const rates = [0.1, 0.1, 0.16, 0.22, 0.28, 0.34, 0.4, 0.4, 0.4, 0.04];
      plans.forEach((p, e) => expect(p.lr, `epoch ${e}`).to.be.closeTo(rates[e], 1e-12));
      expect(() => resolveConfig({ model: 'resnet18', adapt: 'batch', batchRamp: 2, batchRateScaling: 'none' })).to.throw(/--batch-ramp .* --batch-rate-scaling none/);
    });

    it('refuses --batch-ramp and --batch-rate-scaling outside batch-size mode, naming the option and the mode', function () {
      expect(() => resolveConfig({ model: 'resnet18', adapt: 'smith', batchRamp: 2 })).to.throw(/option --batch-ramp .* --adapt batch or batch\+compression, not smith/);
      expect(() => resolveConfig({ model: 'resnet18', batchRateScaling: 'none' })).to.throw(/option --batch-rate-scaling .* --adapt batch or batch\+compression, not compression/);
      expect(() => resolveConfig({ model: 'resnet18', adapt: 'batch', batchRamp: -1 })).to.throw(/--batch-ramp/);
      expect(resolveConfig({ model: 'resnet18', adapt: 'batch+compression', compressor: 'powersgd', batchRamp: 2 }).batchRamp).to.equal(2);
    });

    it('adapt batch+compression: the batch grows as in batch mode and every layer follows Accordion, from the one reading of the norms', async function () {
      const options = { ...base(), adapt: 'batch+compression', compressor: 'powersgd', batchLow: 32, batchHigh: 64, batchSize: 16, accordionInterval: 1, lr: 0.02, epochs: 4 };
      const r = await runTrainer({ ...options, outDir: runDir('joint') }, 'steady');
      await r.trainer.dispose();
      // Steady norms: stable from the epoch-1 check on. The batch grows once, doubling the rate (no
      // decay: the levels stay at high compression, rank 1, from epoch 2).
      expect(r.epochs.map((e) => e.batchSize)).to.deep.equal([32, 32, 64, 64]);
      r.epochs.forEach((e, i) => expect(e.lr, `epoch ${i}: lr`).to.be.closeTo(i < 2 ? 0.02 : 0.04, 1e-12));
      const levels = [2, 2, 1, 1];
      r.epochs.forEach((e, k) => expect(e.levels, `epoch ${k}`).to.deep.equal(r.matrices.map((m) => (m ? levels[k] : 0))));
      expect(r.hookCalls.map((c) => c.epoch), 'one reading per epoch').to.deep.equal([1, 2, 3, 4]);
      expect(r.events['batch-switch'].map((e) => e.epoch)).to.deep.equal([2]);
    });

    it('Smith baseline: the batch doubles at the first milestone, the cap leaves the second to the rate', async function () {
      const options = { ...base(), adapt: 'smith', milestones: [0, 1], lrDecay: 0.5, batchLow: 32, batchHigh: 64, batchSize: 16, lr: 0.02, epochs: 4 };
      const started = Date.now();
      const r = await runTrainer(options, 'batch');
      await r.trainer.dispose();
      this.test.title += ` [${Date.now() - started} ms]`;
      // By hand: the rate computed at the end of epoch e is used in epoch e + 1, and milestone m
      // counts once e > m; so epoch 2 has passed milestone 0 (batch ×2 = 64, the cap) and epoch 3
      // milestone 1 too, which the cap turns into a halved rate.
      const plan = [
        [32, 0.02],
        [32, 0.02],
        [64, 0.02],
        [64, 0.01],
      ];
      expect(r.epochs.map((e) => e.batchSize)).to.deep.equal(plan.map((p) => p[0]));
      r.epochs.forEach((e, i) => expect(e.lr, `epoch ${i}: lr`).to.be.closeTo(plan[i][1], 1e-12));
      const steps = [1, 2, 3, 4].map((epoch) => r.events.step.filter((s) => s.epoch === epoch).map((s) => s.samples));
      expect(steps).to.deep.equal([[32, 32], [32, 32], [64], [64]]);
      expect(r.events['batch-switch']).to.deep.equal([]);
      expect(r.hookCalls, 'Smith\'s baseline reads no norms').to.deep.equal([]);
    });
  });

  describe('--compress-after: a dense start, as PyTorch PowerSGD\'s start_powerSGD_iter', function () {
    it('PowerSGD rank 2 after 6 steps: floats per epoch as the shapes give them; a checkpoint inside the phase holds the waiting levels and empty memories; 1 + resumed inside the phase = 3 epochs, bit for bit', async function () {
      // 64 images in batches of 16: 4 steps an epoch, so the phase ends after step 2 of epoch 2.
      const options = { ...base(), compressor: 'powersgd', rank: 2, accordion: 'off', compressAfter: 6, lr: 0.02 };
      const whole = runDir('dense-start-whole');
      const split = runDir('dense-start-split');
      const a = await runTrainer({ ...options, epochs: 3, outDir: whole });
      const shapes = a.trainer.model.parameters().map((p) => p.shape);
      const stateA = await a.trainer.model.stateDict(true);
      await a.trainer.dispose();

      // The hand count (docs/accounting.md §1): dense, every element; PowerSGD rank r = min(n, m, 2)
      // on a matrix (n, m), (n + m)·r where that is below n·m (minimum compression rate 1), else n·m.
      const numel = (shape) => shape.reduce((x, y) => x * y, 1);
      const dense = shapes.reduce((sum, shape) => sum + numel(shape), 0);
      const compressed = shapes.reduce((sum, shape) => {
        if (shape.length < 2) return sum + numel(shape);
        const n = shape[0], m = numel(shape) / n, r = Math.min(n, m, 2);
        return sum + ((n + m) * r < n * m ? (n + m) * r : n * m);
      }, 0);
      expect(compressed).to.be.below(dense / 10);
      expect(a.epochs.map((e) => e.floatsSent)).to.deep.equal([4 * dense, 2 * dense + 2 * compressed, 4 * compressed]);

      const b1 = await runTrainer({ ...options, epochs: 1, outDir: split });
      await b1.trainer.dispose();
      // The checkpoint inside the phase holds the waiting levels and no error (nothing was compressed).
      const inside = loadCheckpoint(split);
      expect(inside.position.extra.denseStartLevels.filter((_, i) => a.matrices[i]).every((l) => l === 2)).to.equal(true);
      for (const t of inside.trainer.filter((t) => t.name.startsWith('compressor.memory.')))
        expect(new Float32Array(t.data.buffer.slice(t.data.byteOffset, t.data.byteOffset + t.data.byteLength)).every((v) => v === 0), t.name).to.equal(true);

      const b2 = await runTrainer({ ...options, epochs: 3, resume: split });
      const stateB = await b2.trainer.model.stateDict(true);
      await b2.trainer.dispose();
      expect(b2.epochs, 'per-epoch records').to.deep.equal(a.epochs);
      expect(firstDifference(stateB, stateA), 'stateDict(true) after 1 + 2 epochs vs 3').to.equal(undefined);
    });

    it("Accordion's levels wait through the phase: records show dense (0) for its epochs, the policy's levels after it", async function () {
      // 4 steps an epoch: the phase is epochs 1 and 2; Accordion checks after every epoch meanwhile.
      const options = { ...base(), compressor: 'powersgd', accordion: 'on', accordionInterval: 1, compressAfter: 8, lr: 0.02, epochs: 3 };
      const a = await runTrainer({ ...options, outDir: runDir('dense-start-accordion') });
      const shapes = a.trainer.model.parameters().map((p) => p.shape);
      await a.trainer.dispose();
      const numel = (shape) => shape.reduce((x, y) => x * y, 1);
      const dense = shapes.reduce((sum, shape) => sum + numel(shape), 0);
      const matrixLevels = (e) => e.levels.filter((_, i) => a.matrices[i]);
      expect(matrixLevels(a.epochs[0]).every((l) => l === 0), 'epoch 1 levels').to.equal(true);
      expect(matrixLevels(a.epochs[1]).every((l) => l === 0), 'epoch 2 levels').to.equal(true);
      expect(a.epochs.slice(0, 2).map((e) => e.floatsSent)).to.deep.equal([4 * dense, 4 * dense]);
      // After the phase every matrix has one of Accordion's two ranks (low 2, high 1).
      expect(matrixLevels(a.epochs[2]).every((l) => l === 1 || l === 2), `epoch 3 levels ${matrixLevels(a.epochs[2])}`).to.equal(true);
      expect(a.epochs[2].floatsSent).to.be.below(dense);
    });

    it('refuses --compress-after without a compressor', async function () {
      let error;
      try {
        await runTrainer({ ...base(), epochs: 1, compressAfter: 10 });
      } catch (err) {
        error = err;
      }
      expect(error?.message).to.match(/--compress-after needs a compressor/);
    });
  });

  it('micro-batches: 2 × 8 accumulated equals one batch of 16 (frozen batch norm, 3 steps)', async function () {
    const images = syntheticImages(13, 48, 10);
    const options = { architecture: 'resnet18', classes: 10, seed: 9, learningRate: 0.05, momentum: 0.9, weightDecay: 5e-4, frozenBatchNorm: true };
    const common = { shuffle: false, augment: false, seed: 1, mean: [0.49, 0.48, 0.45], std: [0.25, 0.24, 0.26] };
    const micro = await Model.create(options);
    const whole = await Model.create(options);
    try {
      const initial = byName(await whole.stateDict());
      const microBatcher = new Batcher(images, { ...common, batchSize: 8 });
      const wholeBatcher = new Batcher(images, { ...common, batchSize: 16 });
      microBatcher.startEpoch(0);
      wholeBatcher.startEpoch(0);
      let worstOverall = 0;
      for (let s = 0; s < 3; s++) {
        const a = await micro.trainStep(microBatcher, 2);
        const b = await whole.trainStep(wholeBatcher, 1);
        expect(a.samples, `step ${s}`).to.equal(16);
        expect(b.samples, `step ${s}`).to.equal(16);
        expect(a.correct, `step ${s}: correct`).to.equal(b.correct);
        expect(Math.abs(a.loss - b.loss), `step ${s}: loss ${a.loss} vs ${b.loss}`).to.be.at.most(1e-5 * Math.max(1, b.loss));
        const got = await micro.stateDict(true);
        const worst = worstRelativeDifference(byName(got), byName(await whole.stateDict(true)));
        expect(worst.rel, `step ${s}: weights and momentum, worst at ${worst.name}`).to.be.at.most(1e-5);
        worstOverall = Math.max(worstOverall, worst.rel);
        // Rounding differences of ~1e-9 flip the odd ReLU of a later step and grow by orders of
        // magnitude at this rate, so every step starts both models from the same state.
        await whole.loadStateDict(got);
      }
      this.test.title += ` [worst ${worstOverall.toExponential(1)}·scale]`;
      expect(await micro.trainStep(microBatcher, 2), 'the epoch holds 3 steps').to.equal(null);
      // The weights moved, so the comparison is not one of untouched initialisations.
      const trained = byName(await micro.stateDict());
      expect(sameBytes(trained.get('conv1.weight'), initial.get('conv1.weight'))).to.equal(false);
    } finally {
      await micro.dispose();
      await whole.dispose();
    }
  });
});
