// Automatic levels (--adapt auto): the knapsack against enumeration, its monotonicity, the budget
// and its tightening by Accordion's regimes, and the costs in seconds.
import { expect } from 'chai';
import { ERROR_STEPS, chooseLevels, levelCost, planLevels } from '../../lib/train/rules/auto-levels.js';
import { candidateLevels, compressionSpec } from '../../lib/config/compression.js';
import { DEFAULT_CONFIG } from '../../lib/config/options.js';
import { makeRng as seeded } from '../helpers/gradcheck.js';

// Seeded uniform numbers in [0, 1), so that a failing table reproduces.
const makeRng = (seed) => seeded(seed).next;

/** Every combination of one option per layer: the least cost whose rounded-up errors fit `capacity` units. */
function bruteForce(layers, capacity, unit) {
  const units = (e) => (e <= 0 ? 0 : Math.ceil(e / unit - 1e-9));
  let best = Infinity;
  const visit = (l, used, cost) => {
    if (used > capacity) return;
    if (l === layers.length) {
      best = Math.min(best, cost);
      return;
    }
    for (const o of layers[l]) visit(l + 1, used + units(o.error), cost + o.cost);
  };
  visit(0, 0, 0);
  return best;
}

/** A table like a compressor's: per layer, levels whose error falls as their cost rises, and dense (0 error). */
function randomTable(rng, layers, options) {
  return Array.from({ length: layers }, () => {
    const list = Array.from({ length: options - 1 }, () => ({ error: rng(), cost: 1 + Math.floor(rng() * 100) }));
    list.push({ error: 0, cost: 200 });
    return list.map((o, level) => ({ level, ...o }));
  });
}

describe('automatic levels: the knapsack', function () {
  it('a hand-made table: the cheapest levels within the budget, dense where nothing else fits', function () {
    // Two layers; errors in units of 0.1. Budget 0.5 admits (rank 1, rank 2): 10 + 30, error 0.3 + 0.2, and
    // (rank 2, rank 1): 20 + 15, error 0.1 + 0.4, the cheaper.
    const layers = [
      [{ level: 1, error: 0.3, cost: 10 }, { level: 2, error: 0.1, cost: 20 }, { level: 0, error: 0, cost: 100 }],
      [{ level: 1, error: 0.4, cost: 15 }, { level: 2, error: 0.2, cost: 30 }, { level: 0, error: 0, cost: 100 }],
    ];
    const r = chooseLevels(layers, 0.5, 0.1);
    expect(r).to.deep.include({ choice: [1, 0], cost: 35, feasible: true });
    expect(r.error).to.be.closeTo(0.5, 1e-12);
    // Budget 0.7 lets both take rank 1; budget 0 leaves only dense.
    expect(chooseLevels(layers, 0.7, 0.1).choice).to.deep.equal([0, 0]);
    expect(chooseLevels(layers, 0, 0.1)).to.deep.include({ choice: [2, 2], cost: 200, error: 0 });
    // Without dense and with too small a budget: each layer's least error, reported as infeasible.
    const noDense = layers.map((l) => l.slice(0, 2));
    expect(chooseLevels(noDense, 0.1, 0.1)).to.deep.include({ choice: [1, 1], feasible: false });
  });

  it('equals enumeration on 300 random tables (up to 5 layers × 4 levels), for errors on and off the grid', function () {
    const rng = makeRng(7);
    for (let t = 0; t < 300; t++) {
      const layers = randomTable(rng, 1 + Math.floor(rng() * 5), 2 + Math.floor(rng() * 3));
      const unit = t % 2 ? 0.01 : 0.0137;
      if (t % 3 === 0) for (const l of layers) for (const o of l) o.error = Math.round(o.error / unit) * unit; // exact multiples
      const budget = rng() * layers.length * 0.6;
      const capacity = Math.floor(budget / unit + 1e-9);
      const r = chooseLevels(layers, budget, unit);
      expect(r.cost, `table ${t}`).to.equal(bruteForce(layers, capacity, unit));
      expect(r.error, `table ${t}: within the budget`).to.be.at.most(budget + 1e-9);
      const picked = r.choice.map((k, l) => layers[l][k]);
      expect(r.cost).to.equal(picked.reduce((a, o) => a + o.cost, 0));
    }
  });

  it('a larger budget never costs more (fixed resolution), over 100 tables and 20 budgets each', function () {
    const rng = makeRng(11);
    for (let t = 0; t < 100; t++) {
      const layers = randomTable(rng, 8, 5);
      let previous = Infinity;
      for (let k = 0; k <= 20; k++) {
        const { cost } = chooseLevels(layers, (k / 20) * 4, 0.004);
        expect(cost, `table ${t}, budget ${(k / 20) * 4}`).to.be.at.most(previous);
        previous = cost;
      }
    }
  });

  it('refuses a non-positive resolution', function () {
    expect(() => chooseLevels([[{ level: 0, error: 0, cost: 1 }]], 1, 0)).to.throw(RangeError);
  });
});

describe('automatic levels: the plan', function () {
  // Three matrices and a 1-D parameter; candidates rank 1, 2, 4 and dense; reference rank 2.
  const costs = [
    [
      { level: 0, error: 0, floats: 1000, seconds: 0 },
      { level: 1, error: 0.5, floats: 50, seconds: 0.001 },
      { level: 2, error: 0.3, floats: 100, seconds: 0.002 },
      { level: 4, error: 0.1, floats: 200, seconds: 0.004 },
    ],
    [],
    [
      { level: 0, error: 0, floats: 4000, seconds: 0 },
      { level: 1, error: 0.2, floats: 80, seconds: 0.001 },
      { level: 2, error: 0.15, floats: 160, seconds: 0.002 },
      { level: 4, error: 0.05, floats: 320, seconds: 0.004 },
    ],
    [
      { level: 0, error: 0, floats: 10, seconds: 0 },
      { level: 1, error: 0.9, floats: 8, seconds: 0.001 },
      { level: 2, error: 0.6, floats: 16, seconds: 0.002 },
      { level: 4, error: 0, floats: 10, seconds: 0 },
    ],
  ];
  const settings = { reference: 2, errorBudget: 1, criticalBudget: 0.5, errorMeasure: 'relative', cost: { kind: 'floats' } };
  const norms = [1, 3, 2, 0.1];

  it("budget = Σ the reference level's errors × error budget; critical layers' shares × the critical factor", function () {
    const stable = planLevels(costs, ['stable', 'stable', 'stable', 'stable'], norms, settings);
    expect(stable.referenceError).to.be.closeTo(0.3 + 0.15 + 0.6, 1e-12);
    expect(stable.budget).to.be.closeTo(1.05, 1e-12);
    // Enumerated by hand: rank 1 on the first two (0.5 + 0.2) and dense on the last (0): 50 + 80 + 10 = 140.
    expect(stable.levels).to.deep.equal([1, 0, 1, 0]);
    expect(stable.cost).to.equal(140);
    const critical = planLevels(costs, ['critical', 'stable', 'critical', 'stable'], norms, settings);
    expect(critical.budget).to.be.closeTo(0.15 + 0.075 + 0.6, 1e-12);
    // 0.825 still admits rank 1 on both (0.7); a tighter budget changes the choice.
    expect(critical.levels).to.deep.equal([1, 0, 1, 0]);
    const tight = planLevels(costs, ['critical', 'stable', 'critical', 'critical'], norms, { ...settings, errorBudget: 0.8 });
    expect(tight.budget).to.be.closeTo(0.8 * 0.5 * 1.05, 1e-12);
    // 0.42 allows rank 2 + rank 4 (0.3 + 0.05 = 0.35, 100 + 320) or rank 4 + rank 1 (0.1 + 0.2 = 0.3, 200 + 80 = 280).
    expect(tight.levels).to.deep.equal([4, 0, 1, 0]);
    expect(tight.cost).to.equal(290);
    expect(tight.candidates.map((c) => c.index)).to.deep.equal([0, 2, 3]);
    expect(tight.candidates[0].errors).to.deep.equal([0, 0.5, 0.3, 0.1]);
  });

  it('squared errors weigh each layer by its gradient: (relative error × ‖G‖)², summed', function () {
    const plan = planLevels(costs, ['stable', 'stable', 'stable', 'stable'], norms, { ...settings, errorMeasure: 'squared' });
    // Errors (e·‖G‖)²: layer 0 [0, .25, .09, .01], layer 2 [0, .16, .09, .01], layer 3 [0, .0081, .0036, 0];
    // budget .09 + .09 + .0036 = .1836. Rank 1 anywhere on the two large layers exceeds it but for
    // rank 4 + rank 1 (.17, cost 280); rank 2 on both (.18, 260) with layer 3 dense (10) is cheapest.
    expect(plan.referenceError).to.be.closeTo(0.1836, 1e-12);
    expect(plan.levels).to.deep.equal([2, 0, 2, 0]);
    expect(plan.cost).to.equal(270);
    expect(plan.candidates[2].errors.map((e) => Number(e.toFixed(6)))).to.deep.equal([0, 0.0081, 0.0036, 0]);
    // The same table by relative errors sends rank 1 on both large layers (see above).
    expect(planLevels(costs, ['stable', 'stable', 'stable', 'stable'], norms, settings).levels).to.deep.equal([1, 0, 1, 0]);
    expect(() => planLevels(costs, ['stable', 'stable', 'stable', 'stable'], [1, 1], { ...settings, errorMeasure: 'squared' })).to.throw(/no gradient norm/);
  });

  it('the resolution is a thousandth of the reference error, so the budget factor alone moves the choice', function () {
    expect(ERROR_STEPS).to.equal(1000);
    let previous = Infinity;
    for (const errorBudget of [0.1, 0.3, 0.5, 1, 2, 4]) {
      const { cost } = planLevels(costs, ['stable', 'stable', 'stable', 'stable'], norms, { ...settings, errorBudget });
      expect(cost).to.be.at.most(previous);
      previous = cost;
    }
  });

  it('refuses a reference level that is not among the candidates', function () {
    expect(() => planLevels(costs, ['stable', 'stable', 'stable', 'stable'], norms, { ...settings, reference: 8 })).to.throw(/reference level 8/);
  });

  it('costs in seconds: kernel time plus the bytes a host sends (ring all-reduce 2(W−1)/W, all-gather (W−1)/W)', function () {
    const link = { kind: 'seconds', bytesPerSecond: 1e6, workers: 4 };
    const c = { level: 2, error: 0.1, floats: 1000, bytes: 4000, seconds: 0.01 };
    expect(levelCost(c, { ...link, compressor: 'powersgd' })).to.be.closeTo(0.01 + (4000 * 1.5) / 1e6, 1e-12);
    expect(levelCost(c, { ...link, compressor: 'topk' })).to.be.closeTo(0.01 + (4000 * 0.75) / 1e6, 1e-12);
    expect(levelCost({ ...c, level: 0, seconds: 0 }, { ...link, compressor: 'topk' })).to.be.closeTo((4000 * 1.5) / 1e6, 1e-12); // dense is all-reduced
    // Sent in 16 bits the same floats are half the bytes, and half the seconds on the link.
    expect(levelCost({ ...c, bytes: 2000, seconds: 0 }, { ...link, compressor: 'powersgd' })).to.be.closeTo((2000 * 1.5) / 1e6, 1e-12);
    expect(levelCost(c, { kind: 'floats' })).to.equal(1000);
    // Dense in bf16 is all-reduced too, TopK's as PowerSGD's.
    expect(levelCost({ ...c, level: -1, bytes: 2000, seconds: 0 }, { ...link, compressor: 'topk' })).to.be.closeTo((2000 * 1.5) / 1e6, 1e-12);
  });

  it('candidates: the given levels, the reference and dense, once each, in order; dense in bf16 where priced in seconds on the CPU with an fp32 exchange', function () {
    expect(candidateLevels([1, 2, 4, 8], 2)).to.deep.equal([0, 1, 2, 4, 8]);
    expect(candidateLevels([0.01, 0.1], 0.05)).to.deep.equal([0, 0.01, 0.05, 0.1]);
    expect(candidateLevels([1, 2], 2, true)).to.deep.equal([-1, 0, 1, 2]);
    const spec = (o) => compressionSpec({ ...DEFAULT_CONFIG, compressor: 'powersgd', autoCost: 'seconds', ...o }).candidates;
    expect(spec({})).to.deep.equal([-1, 0, 1, 2, 4, 8]);
    expect(spec({ autoCost: 'floats' }), 'in floats it costs as dense').to.deep.equal([0, 1, 2, 4, 8]);
    expect(spec({ commDtype: 'bf16' }), 'dense already travels in 16 bits').to.deep.equal([0, 1, 2, 4, 8]);
    expect(spec({ device: 'cuda' }), 'the 16-bit exchange is the CPU\'s').to.deep.equal([0, 1, 2, 4, 8]);
  });
});
