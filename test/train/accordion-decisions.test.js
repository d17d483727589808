// Accordion's decisions in training: the per-layer timeline that scripted norms must produce over two real
// processes (rank 0 decides), automatic levels planned from measured costs, and resume equivalence with
// Accordion's state.
import { randomBytes } from 'node:crypto';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { expect } from 'chai';
import { freePort } from '../helpers/ports.js';
import { loadCheckpoint, readMetrics } from '../../lib/index.js';
import { endOfEpoch, initialState } from '../../lib/train/rules/accordion.js';
import { learningRateForEpoch } from '../../lib/train/rules/schedule.js';
import { epochFacts, runTrainer, scriptedNorms } from '../helpers/accordion-worker.js';
import { exitWithin, startNode } from '../helpers/processes.js';
import { byName, firstDifference, trainingRuns, withoutTime, worstRelativeDifference } from '../helpers/training-runs.js';

const WORKER = fileURLToPath(new URL('../helpers/accordion-worker.js', import.meta.url));

// ---------------------------------------------------------------------------------------------
// Worker processes: whatever a test starts is killed in afterEach, so a failure halfway never leaves
// a rank running (and holding a core) into the next test.

const live = new Set();

const startRank = (spec, env) => startNode(live, [WORKER, JSON.stringify(spec)], env);

afterEach(async function () {
  const running = [...live];
  for (const entry of running) entry.child.kill('SIGKILL');
  await Promise.all(running.map((e) => exitWithin(e, 5000)));
});

/** Runs the worker as every rank of a 2-process job; both must exit 0. Their results in rank order. */
async function runJob(spec, ms = 120000) {
  const port = await freePort();
  const token = `accordion-test-${randomBytes(8).toString('hex')}`;
  const ranks = [0, 1].map((rank) =>
    startRank(spec, { RANK: String(rank), WORLD_SIZE: '2', MASTER_ADDR: '127.0.0.1', MASTER_PORT: String(port), ACCORDION_JOB_TOKEN: token }),
  );
  const exits = await Promise.all(ranks.map((r) => exitWithin(r, ms)));
  exits.forEach((e, rank) => {
    expect(e.timedOut, `rank ${rank} did not finish within ${ms} ms`).to.not.equal(true);
    expect(e.code, `rank ${rank} exited with ${e.code ?? e.signal}; stderr:\n${e.stderr}`).to.equal(0);
  });
  return exits.map((e) => JSON.parse(e.stdout.trim().split('\n').at(-1)));
}

// ---------------------------------------------------------------------------------------------
// Expectations

/**
 * What Accordion must do given `norms(epoch)` as rank 0's norms: the levels in force in each epoch
 * and the switches decided at each epoch's end, from the pure rule and the LR schedule alone.
 */
function expectedTimeline({ epochs, matrices, names, norms, rule, schedule, low, high }) {
  let state = initialState(matrices.length);
  let current = matrices.map((m) => (m ? low : 0));
  const levels = [];
  const ratios = [];
  const switches = [];
  for (let epoch = 0; epoch < epochs; epoch++) {
    levels.push(current);
    const lrCurrent = learningRateForEpoch(epoch, schedule);
    const lrNext = learningRateForEpoch(epoch + 1, schedule);
    const d = endOfEpoch(state, { epoch, norms: norms(epoch), lrCurrent, lrNext }, rule);
    ratios.push(d.ratios.map((r) => (r === undefined || !Number.isFinite(r) ? null : r)));
    const next = d.state.regimes.map((r, i) => (matrices[i] ? (r === 'critical' ? low : high) : 0));
    next.forEach((to, i) => {
      if (!matrices[i] || to === current[i]) return;
      // Only a move to low compression can be the LR decrease's doing.
      const reason = d.lrOverride && to === low ? 'lr-decay' : 'norm-change';
      switches.push({ epoch: epoch + 1, parameter: names[i], from: current[i], to, reason });
    });
    state = d.state;
    current = next;
  }
  return { levels, ratios, switches };
}

// ---------------------------------------------------------------------------------------------

describe('Accordion in training', function () {
  const { runDir, base } = trainingRuns();

  it('scripted norms over 2 processes: both ranks follow rank 0\'s decisions, as the rule and the schedule give them', async function () {
    const options = {
      ...base(),
      compressor: 'powersgd',
      accordionInterval: 2,
      epochs: 7,
      milestones: [4],
      lrDecay: 0.1,
      lr: 0.01,
      outDir: runDir('timeline'),
    };
    const started = Date.now();
    const results = await runJob({ options, script: 'timeline' });
    this.test.title += ` [${Date.now() - started} ms]`;
    const [rank0, rank1] = results;
    const { matrices, parameterNames: names } = rank0;
    expect(rank1.parameterNames).to.deep.equal(names);

    const schedule = { base: options.lr, workers: 2, warmupEpochs: 0, milestones: [4], decay: 0.1 };
    const rule = { eta: 0.5, interval: 2 };
    const timelineOf = (rank) =>
      expectedTimeline({ epochs: 7, matrices, names, rule, schedule, low: 2, high: 1, norms: (e) => scriptedNorms('timeline', rank, e, matrices) });
    const expected = timelineOf(0);

    // The script was designed for this hand-worked timeline (pattern = matrix index mod 6); it pins
    // that the rule and schedule behave as the script assumes: the rate drops from epoch 6 on.
    const byPattern = [
      [2, 2, 2, 1, 1, 1, 2],
      [2, 2, 2, 2, 2, 1, 2],
      [2, 2, 2, 1, 1, 2, 2],
      [2, 2, 2, 2, 2, 2, 2],
      [2, 2, 2, 2, 2, 1, 2],
      [2, 2, 2, 2, 2, 1, 2],
    ];
    const matrixIndices = matrices.flatMap((m, i) => (m ? [i] : []));
    expect(matrixIndices).to.have.length(21);
    matrixIndices.forEach((i, k) =>
      expect(expected.levels.map((l) => l[i]), `expected timeline of ${names[i]}`).to.deep.equal(byPattern[k % 6]),
    );
    expect([5, 6].map((e) => learningRateForEpoch(e, schedule))).to.deep.equal([0.02, 0.002]);
    expect(new Set(expected.switches.map((s) => s.epoch))).to.deep.equal(new Set([3, 5, 6, 7]));
    expect(expected.switches.filter((s) => s.reason === 'lr-decay').map((s) => s.epoch)).to.satisfy((es) => es.length > 0 && es.every((e) => e === 6));
    // Rank 1's own norms would give another timeline, so following it would not go unnoticed.
    expect(timelineOf(1).levels, 'rank 1\'s script decides like rank 0\'s').to.not.deep.equal(expected.levels);

    for (const r of results) {
      const label = `rank ${r.rank}`;
      expect(r.epochs.map((e) => e.epoch), label).to.deep.equal([1, 2, 3, 4, 5, 6, 7]);
      r.epochs.forEach((e, epoch) => {
        expect(e.levels, `${label} epoch ${epoch}: levels`).to.deep.equal(expected.levels[epoch]);
        expect(e.lr, `${label} epoch ${epoch}: lr`).to.equal(learningRateForEpoch(epoch, schedule));
        expect(e.norms, `${label} epoch ${epoch}: the recorded norms are the hook's`).to.deep.equal(scriptedNorms('timeline', r.rank, epoch, matrices));
      });
      expect(r.switches, `${label}: switches`).to.deep.equal(expected.switches);
      expect(r.events.switch, `${label}: 'switch' events`).to.deep.equal(expected.switches);
      // The hook sees every epoch once, on its own rank, with one measured norm per parameter.
      expect(r.hookCalls.map((c) => [c.epoch, c.rank]), label).to.deep.equal([1, 2, 3, 4, 5, 6, 7].map((e) => [e, r.rank]));
      for (const c of r.hookCalls) {
        expect(c.measured, `${label}: measured norms of epoch ${c.epoch}`).to.have.length(names.length);
        expect(c.measured.every((v) => Number.isFinite(v) && v >= 0), `${label}: measured norms of epoch ${c.epoch} are finite`).to.equal(true);
      }
    }
    rank0.epochs.forEach((e, epoch) => expect(e.ratios, `rank 0 epoch ${epoch}: ratios`).to.deep.equal(expected.ratios[epoch]));

    // Rank 0's metrics log: the same switches, in order, and the same levels per epoch.
    const events = readMetrics(path.join(options.outDir, 'metrics.jsonl'));
    expect(withoutTime(events.filter((e) => e.event === 'switch')).map(({ event, ...s }) => s)).to.deep.equal(expected.switches);
    expect(events.filter((e) => e.event === 'epoch').map((e) => e.levels)).to.deep.equal(expected.levels);
  });

  describe('automatic levels (--adapt auto)', function () {
    const logged = (dir, kind) => readMetrics(path.join(dir, 'metrics.jsonl')).filter((e) => e.event === kind);
    for (const compressor of ['powersgd', 'topk'])
      it(`${compressor}: each epoch plans from measured costs within the budget, the next epoch runs the plan; 3 epochs = 2 + resumed, bit for bit`, async function () {
        const options = { ...base(), compressor, adapt: 'auto', accordionInterval: 1, lr: 0.02 };
        const whole = runDir(`auto-${compressor}-whole`);
        const split = runDir(`auto-${compressor}-split`);
        const a = await runTrainer({ ...options, epochs: 3, outDir: whole });
        const stateA = await a.trainer.model.stateDict(true);
        await a.trainer.dispose();
        const reference = compressor === 'topk' ? 0.1 : 2;
        const candidates = compressor === 'topk' ? [0, 0.01, 0.02, 0.05, 0.1, 0.2] : [0, 1, 2, 4, 8];
        const epochs = logged(whole, 'epoch');
        expect(epochs[0].levels.filter((l, i) => a.matrices[i]).every((l) => l === reference), 'epoch 0 runs at the reference level').to.equal(true);
        epochs.forEach((e, k) => {
          const plan = e.auto;
          expect(plan, `epoch ${k}: a plan`).to.be.an('object');
          expect(plan.costUnit).to.equal('floats');
          expect(plan.candidates.map((c) => c.index)).to.deep.equal(a.matrices.flatMap((m, i) => (m ? [i] : [])));
          let referenceError = 0;
          for (const c of plan.candidates) {
            expect(c.levels).to.deep.equal(candidates);
            expect(c.errors[0], 'dense has no error').to.equal(0);
            // Squared errors (the default measure): (relative error × ‖G‖)², at most ‖G‖².
            const norm = e.norms[c.index];
            expect(c.errors.every((x) => x >= 0 && x <= norm * norm * (1 + 1e-6)), `errors of parameter ${c.index}`).to.equal(true);
            referenceError += c.errors[candidates.indexOf(reference)];
          }
          expect(plan.referenceError).to.be.closeTo(referenceError, 1e-9);
          expect(plan.feasible).to.equal(true);
          expect(plan.error, `epoch ${k}: within the budget`).to.be.at.most(plan.budget + 1e-12);
          // The first check has no earlier norms: the budget is the reference's error. Later a
          // layer's share halves (the critical factor) where its norm changed by η (0.5) or more; a
          // ratio the record leaves out is an infinite one, as critical.
          const share = (c) => (k > 0 && !(e.ratios[c.index] < 0.5) ? 0.5 : 1);
          const budget = plan.candidates.reduce((sum, c) => sum + c.errors[candidates.indexOf(reference)] * share(c), 0);
          expect(plan.budget, `epoch ${k}: the budget`).to.be.closeTo(budget, 1e-9 * budget);
          if (k === 0) expect(plan.budget).to.be.closeTo(referenceError, 1e-9 * referenceError);
          if (k + 1 < epochs.length) expect(epochs[k + 1].levels, `epoch ${k + 1} runs epoch ${k}'s plan`).to.deep.equal(plan.levels);
        });
        const switches = logged(whole, 'switch');
        expect(switches.length, 'the plans change levels').to.be.above(0);
        expect(switches.every((s) => s.reason === 'auto')).to.equal(true);

        const b1 = await runTrainer({ ...options, epochs: 2, outDir: split });
        await b1.trainer.dispose();
        const b2 = await runTrainer({ ...options, epochs: 3, resume: split });
        const stateB = await b2.trainer.model.stateDict(true);
        await b2.trainer.dispose();
        expect(b2.epochs, 'per-epoch records').to.deep.equal(a.epochs);
        expect(logged(split, 'epoch').map((e) => e.auto), 'plans').to.deep.equal(epochs.map((e) => e.auto));
        expect(firstDifference(stateB, stateA), 'stateDict(true) after 2 + 1 epochs vs 3').to.equal(undefined);
      });

    it('over 2 processes, priced in seconds: the link is measured at start, rank 0 plans, every rank runs the same levels', async function () {
      // --replan-factor 0: plans priced over the link measured at the start only (test/train/replan.test.js
      // and the cluster's test follow a link that moves).
      // At full width: the first epoch's dense bucket (batch norm and the classifier) is then over the
      // 64 KiB a rate needs.
      const options = { ...base(), width: 1, compressor: 'powersgd', adapt: 'auto', autoCost: 'seconds', replanFactor: 0, accordionInterval: 1, lr: 0.02, epochs: 2, errorBudget: 2 };
      const ranks = await runJob({ options: { ...options, outDir: runDir('auto-dp') } });
      expect(ranks[1].epochs.map((e) => e.levels)).to.deep.equal(ranks[0].epochs.map((e) => e.levels));
      const [link] = logged(runDir('auto-dp'), 'link');
      expect(link.bytesPerSecond).to.be.above(1e6); // loopback: far above a megabyte per second
      expect(link.latencySeconds).to.be.above(0).and.below(1);
      // The link as training measures it from its own collectives: an agreement and at least one
      // transfer each step, their seconds within the step's communication (the statistics' broadcast
      // is the rest). A rate needs transfers of 64 KiB or more: the first epoch's dense bucket is one;
      // a plan that sends every matrix compressed or in bf16 may leave none, and the rate unknown.
      const epochRecords = logged(runDir('auto-dp'), 'epoch');
      for (const e of epochRecords) {
        expect(e.link.collectives, `epoch ${e.epoch}: collectives`).to.be.at.least(2 * e.steps);
        if (e.link.bytesPerSecond !== undefined) expect(e.link.bytesPerSecond, `epoch ${e.epoch}: bandwidth`).to.be.above(1e6);
        expect(e.link.waitSeconds + e.link.transferSeconds).to.be.at.most(e.communicationSeconds + 1e-9);
      }
      expect(epochRecords[0].link.bytesPerSecond, 'epoch 1: bandwidth').to.be.above(1e6);
      const plans = logged(runDir('auto-dp'), 'epoch').map((e) => e.auto);
      expect(plans.map((p) => p.costUnit)).to.deep.equal(['seconds', 'seconds']);
      expect(ranks[0].epochs[1].levels).to.deep.equal(plans[0].levels);
      const priced = plans[0].bytesPerSecond;
      expect(priced, 'the link the plan is priced over').to.equal(link.bytesPerSecond);
      // Dense costs only its bytes, in fp32 or (on the CPU with an fp32 exchange, priced in seconds)
      // in bf16 for a small error; a compressed level its kernel time and fewer bytes.
      const sizes = logged(runDir('auto-dp'), 'start')[0].parameterSizes;
      for (const c of plans[0].candidates) {
        expect(c.levels).to.deep.equal([-1, 0, 1, 2, 4, 8]);
        const share = 2 * (1 / 2); // an all-reduce among 2 sends 2(W − 1)/W of its bytes
        expect(c.costs[1], `dense, parameter ${c.index}`).to.be.closeTo((4 * sizes[c.index] * share) / priced, 1e-12);
        expect(c.costs[0], `dense in bf16, parameter ${c.index}`).to.be.closeTo((2 * sizes[c.index] * share) / priced, 1e-12);
        expect(c.errors[1]).to.equal(0);
      }
      // Squared errors: (relative error × ‖G‖)², the relative error of bf16's rounding at most 2⁻⁸.
      const norms = logged(runDir('auto-dp'), 'epoch')[0].norms;
      for (const c of plans[0].candidates) expect(Math.sqrt(c.errors[0]) / norms[c.index], `parameter ${c.index}`).to.be.within(0, 2 ** -8);
      // Where a matrix costs far less dense in bf16 than through any compression kernel (small
      // matrices over loopback: the first convolution's 1,728 floats in 2 µs against 12 µs at rank 1),
      // the plan sends it so, for an error of at most 2⁻¹⁶ of its squared norm; the second epoch ran
      // the plan on both ranks (above). How many there are follows the link measured at the start.
      const cheapestInBf16 = plans[0].candidates.filter((c) => c.costs.slice(2).every((cost) => c.costs[0] < cost / 2));
      for (const c of cheapestInBf16) expect(plans[0].levels[c.index], `parameter ${c.index}: planned dense in bf16`).to.equal(-1);
    });
  });

  describe('resume with Accordion, one process, bit for bit', function () {
    const variants = [
      { compressor: 'powersgd', low: 2, high: 1, extra: {} },
      { compressor: 'topk', low: 0.5, high: 0.1, extra: { lowRatio: 0.5, highRatio: 0.1 } },
    ];
    for (const v of variants)
      it(`${v.compressor}: 4 epochs = 2 epochs + resumed to 4 (state, levels, losses, switches)`, async function () {
        const options = { ...base(), compressor: v.compressor, ...v.extra, accordionInterval: 1, lr: 0.02 };
        const whole = runDir(`resume-${v.compressor}-whole`);
        const split = runDir(`resume-${v.compressor}-split`);
        const started = Date.now();

        const a = await runTrainer({ ...options, epochs: 4, outDir: whole }, 'resume-hybrid');
        const stateA = await a.trainer.model.stateDict(true);
        await a.trainer.dispose();

        const b1 = await runTrainer({ ...options, epochs: 2, outDir: split }, 'resume-hybrid');
        await b1.trainer.dispose();
        const b2 = await runTrainer({ ...options, epochs: 4, resume: split }, 'resume-hybrid');
        const stateB = await b2.trainer.model.stateDict(true);
        await b2.trainer.dispose();
        this.test.title += ` [${Date.now() - started} ms]`;

        // The run must switch both before the checkpoint and after it, on the stored reference.
        const levelsA = a.epochs.map((e) => e.levels);
        expect(a.switches.some((s) => s.epoch <= 2) && a.switches.some((s) => s.epoch > 2), JSON.stringify(a.switches)).to.equal(true);
        expect(new Set(levelsA.flat())).to.deep.equal(new Set([0, v.low, v.high]));
        expect(levelsA[2], 'epoch 3 runs at the levels of epoch 2: no switch after the checkpoint').to.not.deep.equal(levelsA[3]);

        // The resumed run saw epochs 2 and 3 only, with the measured norms of the uninterrupted run.
        expect(b2.hookCalls.map((c) => c.epoch)).to.deep.equal([3, 4]);
        expect([...b1.hookCalls, ...b2.hookCalls].map((c) => c.measured), 'measured norms').to.deep.equal(a.hookCalls.map((c) => c.measured));

        expect(b2.epochs, 'per-epoch records (levels, norms, ratios, losses, floats)').to.deep.equal(a.epochs);
        expect(b2.events.epoch, 'records of the resumed epochs').to.deep.equal(a.epochs.slice(2));
        expect(b2.switches, 'switches').to.deep.equal(a.switches);
        expect(b2.events.switch, 'switches after resuming').to.deep.equal(a.switches.filter((s) => s.epoch > 2));

        const diff = firstDifference(stateB, stateA);
        expect(diff, 'stateDict(true) after 2 + 2 epochs vs 4').to.equal(undefined);
        const names = stateA.map((t) => t.name);
        expect(names).to.include('compressor.levels');
        expect(names.some((n) => n.startsWith('compressor.memory.'))).to.equal(true);
        expect(names.some((n) => n.startsWith('optimizer.momentum_buffer.'))).to.equal(true);
        if (v.compressor === 'powersgd') expect(names.some((n) => n.startsWith('compressor.q.'))).to.equal(true);

        const metrics = (dir) => readMetrics(path.join(dir, 'metrics.jsonl'));
        const pick = (events, kind) => withoutTime(events.filter((e) => e.event === kind));
        const [ma, mb] = [metrics(whole), metrics(split)];
        expect(pick(mb, 'switch'), 'logged switches').to.deep.equal(pick(ma, 'switch'));
        expect(pick(mb, 'epoch').map(epochFacts), 'logged epochs').to.deep.equal(pick(ma, 'epoch').map(epochFacts));
        expect(mb.filter((e) => e.event === 'resume').map((e) => e.epochsCompleted)).to.deep.equal([2]);
      });
  });

  it('resume over 2 processes: 3 epochs = 2 epochs + resumed to 3 (rank 0\'s weights within float tolerance, timelines exactly)', async function () {
    const options = { ...base(), compressor: 'powersgd', accordionInterval: 1, lr: 0.01 };
    const whole = runDir('resume-dp-whole');
    const split = runDir('resume-dp-split');
    const started = Date.now();
    const a = await runJob({ options: { ...options, epochs: 3, outDir: whole }, script: 'resume-scripted' });
    const b1 = await runJob({ options: { ...options, epochs: 2, outDir: split }, script: 'resume-scripted' });
    const b2 = await runJob({ options: { ...options, epochs: 3, resume: split }, script: 'resume-scripted' });
    this.test.title += ` [${Date.now() - started} ms]`;

    const { matrices, parameterNames: names } = a[0];
    const schedule = { base: options.lr, workers: 2, warmupEpochs: 0, milestones: [150, 250], decay: 0.1 };
    const expected = expectedTimeline({
      epochs: 3,
      matrices,
      names,
      rule: { eta: 0.5, interval: 1 },
      schedule,
      low: 2,
      high: 1,
      norms: (e) => scriptedNorms('resume-scripted', 0, e, matrices),
    });
    // Switches on both sides of the checkpoint, so the resumed ranks need the stored state.
    expect(expected.switches.some((s) => s.epoch === 2) && expected.switches.some((s) => s.epoch === 3)).to.equal(true);

    for (const rank of [0, 1]) {
      const label = `rank ${rank}`;
      expect(a[rank].epochs.map((e) => e.levels), `${label}: uninterrupted levels`).to.deep.equal(expected.levels);
      expect(b2[rank].epochs.map((e) => e.levels), `${label}: resumed levels`).to.deep.equal(expected.levels);
      expect(b1[rank].epochs.map((e) => e.levels), `${label}: first part`).to.deep.equal(expected.levels.slice(0, 2));
      expect(a[rank].switches, `${label}: uninterrupted switches`).to.deep.equal(expected.switches);
      expect(b2[rank].switches, `${label}: resumed switches`).to.deep.equal(expected.switches);
      expect(b2[rank].hookCalls.map((c) => c.epoch), label).to.deep.equal([3]);
    }

    const finalOf = (dir, rank) => loadCheckpoint(dir, rank);
    const ca = finalOf(whole, 0);
    const cb = finalOf(split, 0);
    expect(ca.position.epochsCompleted).to.equal(3);
    expect(cb.position.epochsCompleted).to.equal(3);
    const weights = worstRelativeDifference(byName(cb.model), byName(ca.model));
    expect(weights.rel, `rank 0's weights: worst at ${weights.name}`).to.be.at.most(1e-5);
    // Momentum and error-feedback memories of both ranks carry the resumed state on.
    for (const rank of [0, 1]) {
      const t = worstRelativeDifference(byName(finalOf(split, rank).trainer), byName(finalOf(whole, rank).trainer));
      expect(t.rel, `rank ${rank}'s trainer state: worst at ${t.name}`).to.be.at.most(1e-4);
    }
    const bitwise = firstDifference(cb.model, ca.model) === undefined;
    this.test.title += ` [weights ${bitwise ? 'bitwise equal' : `differ by ≤ ${weights.rel.toExponential(1)}·scale`}]`;

    const switchesOf = (dir) => withoutTime(readMetrics(path.join(dir, 'metrics.jsonl')).filter((e) => e.event === 'switch')).map(({ event, ...s }) => s);
    expect(switchesOf(split)).to.deep.equal(expected.switches);
    expect(switchesOf(whole)).to.deep.equal(expected.switches);
  });
});
