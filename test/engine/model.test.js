import { expect } from 'chai';
import { Model, Batcher } from '../../lib/index.js';
import { parameterCount } from '../../lib/engine/parameter-count.js';
import { tinyImageSet } from '../helpers/images.js';

// Parameter counts from docs/algorithms.md §1.4 (the Accordion paper's Tables 8-10).
const COUNTS = [
  ['resnet18', 10, 11_173_962],
  ['resnet18', 100, 11_220_132],
  ['vgg19bn', 10, 20_565_834],
  ['vgg19bn', 100, 39_327_652],
];

describe('models', function () {
  for (const [architecture, classes, expected] of COUNTS) {
    it(`${architecture} with ${classes} classes has exactly ${expected.toLocaleString('en-US')} parameters`, async function () {
      const model = await Model.create({ architecture, classes, seed: 1 });
      try {
        expect(model.parameterCount()).to.equal(expected);
      } finally {
        await model.dispose();
      }
    });
  }

  // The count the memory checks read before building a model, against the models the engine builds.
  const SIZES = [
    { architecture: 'resnet18', classes: 10 },
    { architecture: 'resnet18', classes: 10, width: 0.125 },
    { architecture: 'resnet18', classes: 100, width: 0.3 },
    { architecture: 'vgg19bn', classes: 10, width: 0.125 },
    { architecture: 'vgg19bn', classes: 100, width: 0.3 },
    { architecture: 'lstm', classes: 50, hidden: 12, layers: 2 },
    { architecture: 'lstm', classes: 7, hidden: 5, layers: 3 },
  ];
  for (const size of SIZES) {
    it(`counts the parameters of ${JSON.stringify(size)} before building it`, async function () {
      const model = await Model.create({ ...size, seed: 1 });
      try {
        expect(parameterCount(size)).to.equal(model.parameterCount());
      } finally {
        await model.dispose();
      }
    });
  }

  it('uses PyTorch state_dict names and shapes', async function () {
    const model = await Model.create({ architecture: 'resnet18', classes: 10 });
    const names = model.parameters().map((p) => p.name);
    expect(names.slice(0, 3)).to.deep.equal(['conv1.weight', 'bn1.weight', 'bn1.bias']);
    expect(names).to.include.members(['layer2.0.shortcut.0.weight', 'layer4.1.bn2.bias', 'linear.weight', 'linear.bias']);
    expect(model.parameters().find((p) => p.name === 'layer2.0.conv1.weight').shape).to.deep.equal([128, 64, 3, 3]);
    const state = await model.stateDict();
    const tracked = state.find((t) => t.name === 'bn1.num_batches_tracked');
    expect(tracked.dtype).to.equal('I64');
    expect(tracked.shape).to.deep.equal([]);
    await model.dispose();
    const vgg = await Model.create({ architecture: 'vgg19bn', classes: 100 });
    expect(vgg.parameters().map((p) => p.name)).to.include.members(['features.0.weight', 'features.1.weight', 'classifier.7.bias']);
    await vgg.dispose();
  });

  it('initialises identically for the same seed and differently for another', async function () {
    const first = async (seed) => {
      const m = await Model.create({ architecture: 'resnet18', seed });
      const w = new Float32Array((await m.stateDict()).find((t) => t.name === 'conv1.weight').data.slice().buffer);
      await m.dispose();
      return w;
    };
    const [a, b, c] = [await first(3), await first(3), await first(4)];
    expect(Buffer.from(a.buffer).equals(Buffer.from(b.buffer))).to.equal(true);
    expect(Buffer.from(a.buffer).equals(Buffer.from(c.buffer))).to.equal(false);
    // PyTorch's default conv init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = 3*3*3.
    const bound = 1 / Math.sqrt(27);
    expect(Math.max(...a.map(Math.abs))).to.be.at.most(bound).and.above(0.9 * bound);
  });

  for (const architecture of ['resnet18', 'vgg19bn']) {
    it(`${architecture} overfits a tiny fixed batch (loss below 0.05)`, async function () {
      const data = tinyImageSet(8, 4, 7);
      const batcher = new Batcher(data, { batchSize: 8, shuffle: false, augment: false, mean: [0.5, 0.5, 0.5], std: [0.25, 0.25, 0.25] });
      const model = await Model.create({ architecture, classes: 4, seed: 1, learningRate: 0.02, momentum: 0.9, weightDecay: 0 });
      let loss = Infinity, steps = 0;
      const first = [];
      try {
        while (loss >= 0.05 && steps < 300) {
          batcher.startEpoch(steps);
          loss = (await model.trainStep(batcher)).loss;
          if (steps < 1) first.push(loss);
          steps++;
        }
      } finally {
        await model.dispose();
      }
      expect(first[0]).to.be.above(1.0);
      expect(loss, `loss after ${steps} steps`).to.be.below(0.05);
    });
  }

  it('predicts in evaluation mode and rejects inputs of the wrong size', async function () {
    const model = await Model.create({ architecture: 'resnet18', classes: 10, seed: 2 });
    const images = new Float32Array(2 * 3 * 32 * 32).map((_, i) => Math.sin(i));
    const a = await model.predict(images, 2);
    const b = await model.predict(images, 2);
    expect(a.length).to.equal(20);
    expect(Array.from(a)).to.deep.equal(Array.from(b)); // eval mode: no batch statistics, deterministic
    try {
      await model.predict(images, 3);
      expect.fail('predict accepted a wrong size');
    } catch (err) {
      expect(err.code).to.equal('ERR_USAGE');
    }
    await model.dispose();
    try {
      await model.predict(images, 2);
      expect.fail('predict worked after dispose');
    } catch (err) {
      expect(err.message).to.match(/disposed/);
    }
  });
});

describe('model lifecycle', function () {
  it('rejects an unknown architecture and bad class counts before building anything', async function () {
    for (const [options, message] of [
      [{ architecture: 'alexnet' }, /unknown model 'alexnet'/],
      [{ architecture: 'resnet18', classes: 1 }, /classes must be an integer ≥ 2/],
    ]) {
      try {
        await Model.create(options);
        expect.fail('accepted ' + JSON.stringify(options));
      } catch (err) {
        expect(err.code).to.equal('ERR_USAGE');
        expect(err.message).to.match(message);
      }
    }
  });

  it('builds on its own thread: the event loop keeps running while a large model initialises', async function () {
    let ticks = 0;
    const timer = setInterval(() => ticks++, 1);
    const model = await Model.create({ architecture: 'vgg19bn', classes: 100 });
    clearInterval(timer);
    expect(model.parameterCount()).to.equal(39_327_652);
    expect(ticks).to.be.above(0);
    await model.dispose();
    await model.dispose(); // a second dispose is harmless
  });
});
