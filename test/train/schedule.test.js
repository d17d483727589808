import { expect } from 'chai';
import { learningRateForEpoch } from '../../lib/index.js';
import { inWarmup } from '../../lib/train/rules/schedule.js';

describe('learning-rate schedule', function () {
  // docs/algorithms.md §2.2: CIFAR, W = 4, base 0.1, warm-up 5, milestones 150 and 250.
  const cifar = { base: 0.1, workers: 4, warmupEpochs: 5, milestones: [150, 250], decay: 0.1 };
  const expected = [
    [0, 0.1], [1, 0.1], [2, 0.16], [3, 0.22], [4, 0.28], [5, 0.34], [6, 0.4], [100, 0.4], [151, 0.4],
    [152, 0.04], [200, 0.04], [251, 0.04], [252, 0.004], [299, 0.004],
  ];
  for (const [epoch, lr] of expected) {
    it(`uses ${lr} in epoch ${epoch}`, function () {
      expect(learningRateForEpoch(epoch, cifar)).to.be.closeTo(lr, 1e-12);
    });
  }

  it("--warmup-epochs 0 still runs the first epoch at the base rate (the reference schedule)", function () {
    const noWarmup = { ...cifar, warmupEpochs: 0 };
    expect(learningRateForEpoch(0, noWarmup)).to.be.closeTo(0.1, 1e-12);
    expect(learningRateForEpoch(1, noWarmup)).to.be.closeTo(0.4, 1e-12);
  });

  it("docs/training.md's account of the default schedule (lr 0.05, 4 workers), epochs counted from 1", function () {
    const defaults = { base: 0.05, workers: 4, warmupEpochs: 5, milestones: [150, 250], decay: 0.1 };
    const readme = [[1, 0.05], [2, 0.05], [3, 0.08], [4, 0.11], [5, 0.14], [6, 0.17], [7, 0.2], [152, 0.2], [153, 0.02], [252, 0.02], [253, 0.002], [300, 0.002]];
    for (const [epoch, lr] of readme) expect(learningRateForEpoch(epoch - 1, defaults), `epoch ${epoch}`).to.be.closeTo(lr, 1e-12);
  });

  it('is flat for one worker and decays at the LSTM milestones', function () {
    const lstm = { base: 2.5, workers: 1, warmupEpochs: 5, milestones: [60, 80], decay: 0.1 };
    expect(learningRateForEpoch(3, lstm)).to.be.closeTo(2.5, 1e-12);
    expect(learningRateForEpoch(61, lstm)).to.be.closeTo(2.5, 1e-12);
    expect(learningRateForEpoch(62, lstm)).to.be.closeTo(0.25, 1e-12);
    expect(learningRateForEpoch(82, lstm)).to.be.closeTo(0.025, 1e-12);
  });
});

describe('the warm-up', function () {
  it('covers the epochs below the full rate: 0 to 5 of the table above, none for one worker', function () {
    const cifar = { base: 0.1, workers: 4, warmupEpochs: 5, milestones: [150, 250], decay: 0.1 };
    const below = [0, 1, 2, 3, 4, 5, 6, 7].filter((e) => learningRateForEpoch(e, cifar) < 0.4 - 1e-12);
    expect([0, 1, 2, 3, 4, 5, 6, 7].filter((e) => inWarmup(e, cifar))).to.deep.equal(below).and.deep.equal([0, 1, 2, 3, 4, 5]);
    expect([0, 1, 2].filter((e) => inWarmup(e, { ...cifar, workers: 1 }))).to.deep.equal([]);
  });
});
