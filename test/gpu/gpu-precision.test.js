// TF32 (--tf32) and bf16 (--precision bf16) on a CUDA GPU, against the CPU from the same weights and
// batch: a TF32 step within TF32's rounding of the CPU's fp32 step, and apart from the GPU's own fp32
// step (so the tensor cores did the work); a bf16 step within bf16's rounding of the CPU's bf16 step.
// Without a usable GPU it is pending; with ACCORDION_REQUIRE_GPU=1 (the GPU check,
// scripts/gpu-check/) a missing GPU fails it instead.
import { expect } from 'chai';
import { Model } from '../../lib/index.js';
import { makeRng, randomUniform } from '../helpers/gradcheck.js';
import { requireDevice } from '../helpers/devices.js';

/** The loss of one training step of each model on one batch of 32 images of 8×8. */
async function firstLosses(models) {
  const rng = makeRng(7);
  const batch = { images: randomUniform(32 * 3 * 8 * 8, rng, -1, 1), labels: Int32Array.from({ length: 32 }, () => rng.int(10)), height: 8, width: 8 };
  const losses = [];
  for (const m of models) losses.push((await m.trainStep(batch)).loss);
  return losses;
}

describe('TF32 and bf16 on the GPU (cuda:0)', function () {
  this.timeout(300000);
  before(function () {
    requireDevice(this, 'cuda');
  });
  const options = { architecture: 'resnet18', seed: 5, learningRate: 0.05 };

  it("resnet18 --tf32: a step gives the CPU's fp32 loss within 1e-3, and not the GPU's fp32 loss to the bit", async function () {
    const models = [
      await Model.create({ ...options, device: 'cpu' }),
      await Model.create({ ...options, device: 'cuda' }),
      await Model.create({ ...options, device: 'cuda', tf32: true }),
    ];
    try {
      const [cpuLoss, gpuLoss, tf32Loss] = await firstLosses(models);
      this.test.title += ` [cpu ${cpuLoss}, gpu fp32 ${gpuLoss}, gpu tf32 ${tf32Loss}]`;
      expect(Math.abs(tf32Loss - cpuLoss) / cpuLoss).to.be.below(1e-3);
      expect(tf32Loss).to.not.equal(gpuLoss);
    } finally {
      for (const m of models) await m.dispose();
    }
  });

  it("resnet18 --precision bf16: a step gives the CPU's bf16 loss within 1e-2, and its weights stay fp32", async function () {
    const models = [
      await Model.create({ ...options, device: 'cpu', precision: 'bf16' }),
      await Model.create({ ...options, device: 'cuda', precision: 'bf16' }),
    ];
    try {
      const [cpuLoss, gpuLoss] = await firstLosses(models);
      this.test.title += ` [cpu bf16 ${cpuLoss}, gpu bf16 ${gpuLoss}]`;
      expect(Math.abs(gpuLoss - cpuLoss) / cpuLoss).to.be.below(1e-2);
      const weights = (await models[1].stateDict()).filter((t) => t.name.endsWith('.weight'));
      expect(weights.every((t) => t.dtype === 'F32')).to.equal(true);
    } finally {
      for (const m of models) await m.dispose();
    }
  });
});
