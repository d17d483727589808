// Time to a target from a run's evaluations, against hand-computed crossings.
import { expect } from 'chai';
import { engineClock, evaluationsOnClock, timeToTarget } from '../../lib/report/time-to-target.js';

describe('time to a target quality', function () {
  const run = [
    { seconds: 10, quality: 0.5 },
    { seconds: 20, quality: 0.8 },
    { seconds: 30, quality: 0.7 },
    { seconds: 40, quality: 0.9 },
  ];

  it('interpolates between the evaluation short of the target and the first at it', function () {
    // 0.6 lies a third of the way from 0.5 (10 s) to 0.8 (20 s).
    expect(timeToTarget(run, 0.6)).to.be.closeTo(10 + 10 / 3, 1e-12);
    // 0.85: first reached at 40 s, from 0.7 at 30 s: three quarters of the way.
    expect(timeToTarget(run, 0.85)).to.be.closeTo(37.5, 1e-12);
    expect(timeToTarget(run, 0.8)).to.equal(20);
  });

  it('counts the first evaluation when it already reaches the target, and null when none does', function () {
    expect(timeToTarget(run, 0.4)).to.equal(10);
    expect(timeToTarget(run, 0.95)).to.equal(null);
    expect(timeToTarget([], 0.5)).to.equal(null);
  });

  it('perplexity: lower is better', function () {
    const lm = [{ seconds: 5, quality: 300 }, { seconds: 15, quality: 200 }];
    expect(timeToTarget(lm, 250, 'lower')).to.be.closeTo(10, 1e-12);
    expect(timeToTarget(lm, 150, 'lower')).to.equal(null);
  });

  it("sums an engine run's training, bookkeeping and replica-check seconds, not its evaluation", function () {
    const epochs = [{ seconds: 10, bookkeepingSeconds: 0.5, syncSeconds: 0.25 }, { seconds: 12, bookkeepingSeconds: 0.5, syncSeconds: 0.25 }];
    expect(engineClock(epochs)).to.deep.equal([10.75, 23.5]);
    expect(engineClock([{ seconds: 3 }, { seconds: 4 }])).to.deep.equal([3, 7]);
  });

  it('puts evaluations within an epoch on the clock of the epochs before it', function () {
    const epochs = [
      { testAccuracy: 0.6, evaluations: [{ seconds: 4, testAccuracy: 0.3 }, { seconds: 8, testAccuracy: 0.5 }] },
      { testAccuracy: 0.9, evaluations: [{ seconds: 5, testAccuracy: 0.8 }] },
      { testAccuracy: 0.95 },
    ];
    const evaluations = evaluationsOnClock(epochs, [10.75, 23.5, 30]);
    expect(evaluations).to.deep.equal([
      { seconds: 4, quality: 0.3 }, { seconds: 8, quality: 0.5 }, { seconds: 10.75, quality: 0.6 },
      { seconds: 15.75, quality: 0.8 }, { seconds: 23.5, quality: 0.9 }, { seconds: 30, quality: 0.95 },
    ]);
    // 0.7 is crossed half-way from 0.6 (10.75 s) to 0.8 (15.75 s), not between the epochs' ends.
    expect(timeToTarget(evaluations, 0.7)).to.be.closeTo(13.25, 1e-12);
  });
});
