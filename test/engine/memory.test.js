// The memory a model's tensors hold, as memoryStats() counts it (host memory on the CPU). Backward
// hands each layer's input gradient to the layer before it and lets it go: between steps a model
// holds what its forward pass keeps for backward and the optimiser's state, not a gradient per
// layer. The yardstick is the model itself: a training forward pass keeps the same activations.
import { expect } from 'chai';
import { Model } from '../../lib/index.js';

const N = 64;
const images = Float32Array.from({ length: N * 3 * 32 * 32 }, (_, i) => Math.sin(i * 0.37));
const labels = Int32Array.from({ length: N }, (_, i) => i % 10);

describe('memory held by a model (CPU)', function () {
  this.timeout(120_000);

  for (const architecture of ['resnet18', 'vgg19bn']) {
    it(`${architecture}: two training steps leave held what a training forward pass holds (within a few times the parameters), their gradients' memory freed; the peak restarts on request`, async function () {
      const model = await Model.create({ architecture, width: 0.125, seed: 1, learningRate: 0.01, momentum: 0.9 });
      try {
        const start = await model.memoryStats();
        await model.forward(images, { train: true });
        const forward = (await model.memoryStats()).allocated;
        await model.trainStep({ images, labels });
        await model.trainStep({ images, labels });
        const stats = await model.memoryStats({ resetPeak: true });
        const parameterBytes = 4 * model.parameterCount();
        // The activations the forward pass keeps outweigh the parameters many times over, and are
        // what a gradient per layer would double.
        expect(forward - start.allocated, 'activations kept by forward').to.be.above(8 * parameterBytes);
        // Beyond them at most the optimiser's and the exchange's state, a few times the parameters.
        expect(stats.allocated - forward, 'held after two steps beyond a forward pass').to.be.below(4 * parameterBytes);
        // Backward's own gradients come and go within a step: its peak lies above what stays.
        expect(stats.peak).to.be.above(stats.allocated);
        expect((await model.memoryStats()).peak, 'peak restarted at the bytes held').to.equal(stats.allocated);
      } finally {
        await model.dispose();
      }
    });
  }
});
