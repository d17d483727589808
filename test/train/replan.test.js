// Automatic levels that follow the link (--replan-factor, --replan-steps): the re-pricing of a plan
// and the policy's decisions against hand-computed cases, for two workers that see different links.
import { expect } from 'chai';
import { replanLevels, planLevels } from '../../lib/train/rules/auto-levels.js';
import { AutoPolicy } from '../../lib/train/policies/auto.js';
import { compressionSpec } from '../../lib/config/compression.js';
import { DEFAULT_CONFIG } from '../../lib/config/options.js';

// One weight matrix and a bias. Its candidates (squared errors with ‖G‖ = 1): dense in bf16 (−1)
// and dense (0) send 2 and 4 MB, rank 2 (the reference) 16 kB after 60 ms of kernels; rank 1's error
// exceeds the budget (the reference's 0.09).
const costs = [
  [
    { level: -1, error: 0.004, floats: 1e6, bytes: 2e6, seconds: 0 },
    { level: 0, error: 0, floats: 1e6, bytes: 4e6, seconds: 0 },
    { level: 1, error: 0.35, floats: 2000, bytes: 8000, seconds: 0.05 },
    { level: 2, error: 0.3, floats: 4000, bytes: 16000, seconds: 0.06 },
  ],
  [],
];
const GBIT = 125e6, MBIT100 = 12.5e6; // bytes a second
const link = (bytesPerSecond) => ({ bytesPerSecond, latencySeconds: 1e-4, waitSeconds: 0, transferSeconds: 1, collectives: 10 });

function settings(extra = {}) {
  const config = {
    ...DEFAULT_CONFIG, model: 'resnet18', compressor: 'powersgd', adapt: 'auto', accordion: 'on', autoCost: 'seconds', autoRanks: [1],
    workers: 2, accordionInterval: 10, warmupEpochs: 0, milestones: [1000], replanFactor: 2, replanSteps: 3, ...extra,
  };
  const schedule = { base: config.lr, workers: 2, warmupEpochs: 0, milestones: config.milestones, decay: 0.1 };
  return { config, spec: compressionSpec(config), schedule, matrices: [true, false] };
}

/** Two workers' policies whose broadcasts pair up in call order: rank 1 receives rank 0's values. */
function pair(extra) {
  const policies = [new AutoPolicy(settings(extra)), new AutoPolicy(settings(extra))];
  for (const p of policies) p.useLink({ bytesPerSecond: GBIT, latencySeconds: 1e-4 });
  const sent = [];
  const calls = [0, 0];
  const broadcast = (rank) => async (values) => {
    calls[rank]++;
    if (rank === 0) sent.push(Float32Array.from(values));
    else values.set(sent.shift());
  };
  /** Both workers after a step: rank 0 sees `fast0`'s link, rank 1 always a fast one. */
  const step = async (epoch, runStep, bytesPerSecond) => {
    const out = [];
    for (const rank of [0, 1])
      out.push(await policies[rank].afterStep({ epoch, runStep, link: link(rank === 0 ? bytesPerSecond : GBIT), broadcast: broadcast(rank) }));
    return out;
  };
  const check = async (epoch, runStep, bytesPerSecond) => {
    const out = [];
    for (const rank of [0, 1])
      out.push(await policies[rank].check({
        epoch, lr: 0.1, lrCurrent: 0.1, lrNext: 0.1, norms: [1, 1], levels: [2, 0], runStep, link: link(rank === 0 ? bytesPerSecond : GBIT),
        ...(rank === 0 && epoch % 10 === 0 ? { costs } : {}), broadcast: broadcast(rank),
      }));
    return out;
  };
  return { policies, step, check, calls };
}

describe('automatic levels that follow the link', function () {
  it('prices a plan anew: dense in bf16 at 1 Gbit/s, rank 2 at 100 Mbit/s, with the same errors and budget', function () {
    const plan = planLevels(costs, ['stable', 'stable'], [1, 0], {
      reference: 2, errorBudget: 1, criticalBudget: 0.5, cost: { kind: 'seconds', bytesPerSecond: GBIT, workers: 2, compressor: 'powersgd' },
    });
    // 2e6 bytes at 125e6 B/s: 16 ms, against dense's 32 and rank 2's 60.128.
    expect(plan.levels).to.deep.equal([-1, 0]);
    expect(plan.cost).to.be.closeTo(0.016, 1e-12);
    const slow = replanLevels(plan, { kind: 'seconds', bytesPerSecond: MBIT100, workers: 2, compressor: 'powersgd' });
    // At 12.5e6 B/s: dense in bf16 160 ms, dense 320, rank 2 60 + 1.28 ms.
    expect(slow.levels).to.deep.equal([2, 0]);
    expect(slow.cost).to.be.closeTo(0.06128, 1e-12);
    expect(slow.budget).to.equal(plan.budget);
    expect(slow.candidates[0].errors).to.deep.equal(plan.candidates[0].errors);
    expect(slow.candidates[0].costs).to.deep.equal([0.16, 0.32, 0.05 + 8000 / MBIT100, 0.06 + 16000 / MBIT100]);
  });

  it('re-plans after the link has stayed below the plan\'s ÷ factor for --replan-steps steps in a row, at the same step on every worker, then again at an epoch\'s end when it is back', async function () {
    const { step, check, calls } = pair();
    const [first] = await check(0, 0, GBIT);
    expect(first.levels).to.deep.equal([-1, 0]);
    // Steps 1–3 fast; the link drops after step 4 (steps 5, 6 low: two in a row at the look at step 6).
    for (const s of [1, 2, 3, 4]) expect(await step(2, s, GBIT)).to.deep.equal([undefined, undefined]);
    for (const s of [5, 6]) expect(await step(2, s, MBIT100)).to.deep.equal([undefined, undefined]);
    // Steps 7, 8 and 9 low too: five in a row at the look at step 9.
    expect(await step(2, 7, MBIT100)).to.deep.equal([undefined, undefined]);
    expect(await step(2, 8, MBIT100)).to.deep.equal([undefined, undefined]);
    const [zero, one] = await step(2, 9, MBIT100);
    expect(zero.levels).to.deep.equal([2, 0]);
    expect(one.levels, 'rank 1 applies rank 0\'s plan at the same step, though its own link is fast').to.deep.equal([2, 0]);
    expect(zero.reasons[0]).to.equal('link');
    expect(zero.replan).to.include({ epoch: 2, runStep: 9, fromBytesPerSecond: GBIT, toBytesPerSecond: MBIT100 });
    expect(zero.replan.plan.levels).to.deep.equal([2, 0]);
    expect(one.replan, 'only rank 0 records it').to.equal(undefined);
    // Still low: priced at 100 Mbit/s now, nothing more to do.
    for (const s of [10, 11, 12]) expect(await step(2, s, MBIT100)).to.deep.equal([undefined, undefined]);
    // Back to 1 Gbit/s: between epochs only a drop re-plans; the epoch's end (not a check) does.
    for (const s of [13, 14, 15]) expect(await step(2, s, GBIT)).to.deep.equal([undefined, undefined]);
    const [end0, end1] = await check(1, 15, GBIT);
    expect(end0.levels).to.deep.equal([-1, 0]);
    expect(end1.levels).to.deep.equal([-1, 0]);
    expect(end0.replan).to.include({ epoch: 2, runStep: 15, fromBytesPerSecond: MBIT100, toBytesPerSecond: GBIT });
    // Every worker broadcast at the same points: the check, every third step, the epoch's end.
    expect(calls).to.deep.equal([2 + 5 + 1 + 1, 2 + 5 + 1 + 1]);
  });

  it('keeps its count across a checkpoint: a restored policy re-plans at the step the uninterrupted one does', async function () {
    const run = async (restoreAfter) => {
      let { policies, step, check } = pair();
      await check(0, 0, GBIT);
      const seen = [];
      for (let s = 1; s <= 12; s++) {
        if (s === restoreAfter) {
          const saved = policies.map((p) => JSON.parse(JSON.stringify(p.save())));
          const fresh = pair();
          fresh.policies.forEach((p, r) => p.restore(saved[r]));
          ({ policies, step } = fresh);
        }
        const [out] = await step(2, s, s >= 4 ? MBIT100 : GBIT);
        if (out) seen.push(s);
      }
      return seen;
    };
    expect(await run(0)).to.deep.equal([6]);
    expect(await run(5)).to.deep.equal([6]);
  });

  it('--replan-factor 0 plans at the checks only, over the link measured at the start', async function () {
    const { step, check, calls } = pair({ replanFactor: 0 });
    await check(0, 0, GBIT);
    for (let s = 1; s <= 9; s++) expect(await step(2, s, MBIT100)).to.deep.equal([undefined, undefined]);
    const [end] = await check(1, 9, MBIT100);
    expect(end.levels, 'no re-plan at an epoch\'s end').to.equal(undefined);
    expect(calls, 'only the checks broadcast').to.deep.equal([2 + 1, 2 + 1]);
  });

  it('--link-share: the budget follows the link, loosened on a slow one, tightened down to dense on a fast one', function () {
    // Rank 2's 16 kB take 1.28 ms a step at 100 Mbit/s (two workers: 2(W − 1)/W = 1); against a
    // share of 0.1 of 12.8 ms of compute, a factor of 1: the budget and the plan of a fixed budget.
    const seconds = (bytesPerSecond) => ({ kind: 'seconds', bytesPerSecond, workers: 2, compressor: 'powersgd' });
    const plan = (bytesPerSecond, computeSeconds) =>
      planLevels(costs, ['stable', 'stable'], [1, 0], { reference: 2, errorBudget: 1, criticalBudget: 0.5, cost: seconds(bytesPerSecond), linkBudget: { share: 0.1, computeSeconds } });
    const even = plan(MBIT100, 0.0128);
    expect(even.linkFactor).to.be.closeTo(1, 1e-12);
    expect(even.baseBudget).to.be.closeTo(0.09, 1e-12);
    expect(even.budget).to.be.closeTo(0.09, 1e-12);
    expect(even.levels).to.deep.equal([2, 0]);
    // At 10 Mbit/s the factor is 10: rank 1's error (0.35² = 0.1225) fits, and its 56.4 ms beat rank 2's 72.8.
    const slow = plan(MBIT100 / 10, 0.0128);
    expect(slow.linkFactor).to.be.closeTo(10, 1e-9);
    expect(slow.levels).to.deep.equal([1, 0]);
    // Against 1,000 s of compute the link is all but free: 0.09 × 1.28e-5 admits dense alone (bf16's 1.6e-5 does not fit).
    const idle = plan(MBIT100, 1000);
    expect(idle.budget).to.be.closeTo(0.09 * 1.28e-5, 1e-15);
    expect(idle.levels).to.deep.equal([0, 0]);
    // A re-plan prices the factor anew for its link: from the even plan to 10 Mbit/s, rank 1.
    const replanned = replanLevels(even, seconds(MBIT100 / 10), { share: 0.1, computeSeconds: 0.0128 });
    expect(replanned.linkFactor).to.be.closeTo(10, 1e-9);
    expect(replanned.levels).to.deep.equal([1, 0]);
    // Without a link budget, or priced in floats, the budget stays.
    expect(replanLevels(even, seconds(MBIT100 / 10)).budget).to.be.closeTo(0.09, 1e-12);
    expect(planLevels(costs, ['stable', 'stable'], [1, 0], { reference: 2, errorBudget: 1, criticalBudget: 0.5, cost: { kind: 'floats' }, linkBudget: { share: 0.1, computeSeconds: 1000 } }).linkFactor).to.equal(undefined);
  });
});
