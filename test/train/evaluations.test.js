import { expect } from 'chai';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { Trainer, UsageError } from '../../lib/index.js';
import { evaluationSteps } from '../../lib/train/trainer.js';

describe('evaluations within an epoch (--evals-per-epoch)', function () {
  let tmp;
  before(() => (tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'acc-evals-'))));
  after(() => fs.rmSync(tmp, { recursive: true, force: true }));

  /** ResNet-18 on 64 synthetic images, 4 steps an epoch. */
  const options = (extra) => ({
    model: 'resnet18', width: 0.25, dataset: 'synthetic', dataDir: path.join(tmp, 'data'), syntheticTrain: 64, syntheticTest: 32,
    batchSize: 16, evalBatchSize: 32, epochs: 2, seed: 3, ...extra,
  });

  it('spaces them evenly in whole steps, the last at the epoch end (hand-computed)', function () {
    expect([...evaluationSteps(100, 4)]).to.deep.equal([25, 50, 75]);
    expect([...evaluationSteps(10, 3)]).to.deep.equal([3, 7]); // 3.33 and 6.67 rounded
    expect([...evaluationSteps(3, 4)]).to.deep.equal([1, 2]); // 0.75, 1.5 and 2.25: step 2 once
    expect([...evaluationSteps(1, 5)]).to.deep.equal([]); // 0.2 … 0.8 round to 0 or to the end
    expect([...evaluationSteps(50, 1)]).to.deep.equal([]);
  });

  it('finds what evaluating the model stopped at that step finds, and leaves the training as it was', async function () {
    const run = async (extra, listen) => {
      const trainer = await Trainer.create(options(extra));
      const events = [];
      trainer.on('evaluation', (e) => events.push(e));
      listen?.(trainer);
      const summary = await trainer.fit();
      return { trainer, summary, events };
    };
    const plain = await run({ evalsPerEpoch: 1 });
    const often = await run({ evalsPerEpoch: 4 });
    // The same training: every epoch's losses and end-of-epoch evaluation, and the final weights.
    for (const key of ['trainLoss', 'trainAccuracy', 'testLoss', 'testAccuracy'])
      expect(often.summary.epochs.map((e) => e[key])).to.deep.equal(plain.summary.epochs.map((e) => e[key]));
    // Weights, running statistics, momentum and random streams, byte for byte.
    const [a, b] = await Promise.all([plain.trainer.model.stateDict(true), often.trainer.model.stateDict(true)]);
    expect(b.map((t) => t.name)).to.deep.equal(a.map((t) => t.name));
    a.forEach((t, i) => expect(Buffer.compare(Buffer.from(t.data), Buffer.from(b[i].data)), t.name).to.equal(0));
    expect(plain.events).to.deep.equal([]);
    expect(plain.summary.epochs.every((e) => e.evaluations === undefined)).to.equal(true);
    // Three within each epoch, after steps 1, 2 and 3, on the epoch's clock with the evaluations off it.
    expect(often.events.map((e) => [e.epoch, e.step, e.steps])).to.deep.equal([[1, 1, 4], [1, 2, 4], [1, 3, 4], [2, 1, 4], [2, 2, 4], [2, 3, 4]]);
    for (const epoch of often.summary.epochs) {
      const own = often.events.filter((e) => e.epoch === epoch.epoch);
      expect(epoch.evaluations).to.deep.equal(own);
      const clock = own.map((e) => e.seconds);
      expect(clock).to.deep.equal([...clock].sort((x, y) => x - y));
      expect(clock.at(-1)).to.be.below(epoch.seconds);
    }
    // The reference: a third run stopped after epoch 2's first step, then evaluated by hand.
    const stopped = await run({ evalsPerEpoch: 1 }, (trainer) => trainer.on('step', (e) => e.epoch === 2 && e.step === 1 && trainer.stop()));
    const byHand = await stopped.trainer.evaluate('test');
    const within = often.events.find((e) => e.epoch === 2 && e.step === 1);
    expect(within.testLoss).to.equal(byHand.loss);
    expect(within.testAccuracy).to.equal(byHand.accuracy);
    // Not a value any end-of-epoch evaluation found.
    expect(often.summary.epochs.map((e) => e.testLoss)).to.not.include(within.testLoss);
    await Promise.all([plain, often, stopped].map((r) => r.trainer.dispose()));
  });

  it('is refused for the LSTM, whose evaluation resets the hidden state training carries', async function () {
    let error;
    try {
      await Trainer.create({ model: 'lstm', dataset: 'wikitext2', dataDir: tmp, evalsPerEpoch: 2 });
    } catch (e) {
      error = e;
    }
    expect(error).to.be.instanceOf(UsageError);
    expect(error.message).to.match(/--evals-per-epoch: the lstm evaluates once an epoch/);
  });
});
