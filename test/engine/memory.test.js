// The memory a model's tensors hold, as memoryStats() counts it (host memory on the CPU). Backward
// hands each layer's input gradient to the layer before it and lets it go, and lets go of each
// layer's activations once it has used them: between steps a model holds its parameters, their
// gradients and the optimiser's state, and a step's peak lies a little above what its forward pass
// keeps, not a gradient per layer or the activations of the step before. The yardstick is the model
// itself: a training forward pass keeps the activations.
import { expect } from 'chai';
import { Model } from '../../lib/index.js';

const N = 64;
const images = Float32Array.from({ length: N * 3 * 32 * 32 }, (_, i) => Math.sin(i * 0.37));
const labels = Int32Array.from({ length: N }, (_, i) => i % 10);

describe('memory held by a model (CPU)', function () {
  this.timeout(120_000);

  for (const architecture of ['resnet18', 'vgg19bn']) {
    it(`${architecture}: two training steps leave held what the model held before them (within a few times the parameters); a step's peak is what its forward pass keeps, and a little more; the peak restarts on request`, async function () {
      const model = await Model.create({ architecture, width: 0.125, seed: 1, learningRate: 0.01, momentum: 0.9 });
      try {
        const start = await model.memoryStats();
        await model.forward(images, { train: true });
        const kept = (await model.memoryStats()).allocated - start.allocated;
        await model.trainStep({ images, labels });
        await model.memoryStats({ resetPeak: true }); // the second step's peak alone
        await model.trainStep({ images, labels });
        const stats = await model.memoryStats({ resetPeak: true });
        const parameterBytes = 4 * model.parameterCount();
        // The activations the forward pass keeps outweigh the parameters many times over.
        expect(kept, 'activations kept by forward').to.be.above(4 * parameterBytes);
        // After the steps at most the optimiser's and the exchange's state beyond what was held:
        // every activation let go.
        expect(stats.allocated - start.allocated, 'held after two steps beyond the start').to.be.below(2 * parameterBytes);
        // The peak: the held state and a forward's activations, and backward's gradients beside the
        // activations it has yet to use (1-2% of them here; a gradient per layer would add tens).
        expect(stats.peak - stats.allocated, 'a step above the held state').to.be.above(kept);
        expect(stats.peak - stats.allocated, 'a step above the held state').to.be.below(1.1 * kept);
        expect((await model.memoryStats()).peak, 'peak restarted at the bytes held').to.equal(stats.allocated);
      } finally {
        await model.dispose();
      }
    });
  }
});
