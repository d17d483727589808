// TF32 on a CUDA GPU (--tf32): a training step on TF32 tensor cores from the same weights and batch
// as the CPU's fp32 step, within TF32's rounding of it, and apart from the GPU's own fp32 step (so
// the tensor cores did the work). Without a usable GPU it is pending; with ACCORDION_REQUIRE_GPU=1
// (the GPU check, scripts/gpu-check/) a missing GPU fails it instead.
import { expect } from 'chai';
import { Model } from '../../lib/index.js';
import { makeRng, randomUniform } from '../helpers/gradcheck.js';
import { requireDevice } from '../helpers/devices.js';

describe('TF32 on the GPU (cuda:0)', function () {
  this.timeout(300000);
  before(function () {
    requireDevice(this, 'cuda');
  });

  it('resnet18 --tf32: a step from the CPU\'s weights and batch gives the CPU\'s fp32 loss within 1e-3, and not the GPU\'s fp32 loss to the bit', async function () {
    const rng = makeRng(7);
    const batch = { images: randomUniform(32 * 3 * 8 * 8, rng, -1, 1), labels: Int32Array.from({ length: 32 }, () => rng.int(10)), height: 8, width: 8 };
    const options = { architecture: 'resnet18', seed: 5, learningRate: 0.05 };
    const models = [
      await Model.create({ ...options, device: 'cpu' }),
      await Model.create({ ...options, device: 'cuda' }),
      await Model.create({ ...options, device: 'cuda', tf32: true }),
    ];
    try {
      const losses = [];
      for (const m of models) losses.push((await m.trainStep(batch)).loss);
      const [cpuLoss, gpuLoss, tf32Loss] = losses;
      this.test.title += ` [cpu ${cpuLoss}, gpu fp32 ${gpuLoss}, gpu tf32 ${tf32Loss}]`;
      expect(Math.abs(tf32Loss - cpuLoss) / cpuLoss).to.be.below(1e-3);
      expect(tf32Loss).to.not.equal(gpuLoss);
    } finally {
      for (const m of models) await m.dispose();
    }
  });
});
