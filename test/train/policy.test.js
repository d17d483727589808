// A door for users' own policies (as PyTorch's register_comm_hook is for compression logic): a
// policy written here, given to the trainer, sees what the built-in ones see (the epoch's norms and
// levels, the schedule) and its decisions are applied, logged and checkpointed as theirs are.
import { expect } from 'chai';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { BasePolicy, Trainer, readMetrics, scheduledRate } from '../../lib/index.js';

/** Rank 2 for the first epoch, then every matrix whose gradient norm fell below `threshold` drops to rank 1. */
class CoolingPolicy extends BasePolicy {
  usesNorms = true;
  setsLevels = true;
  constructor(settings, threshold) {
    super();
    this.settings = settings;
    this.threshold = threshold;
    this.seen = [];
  }
  plan(epoch) {
    return { lr: scheduledRate(this.settings, epoch), batch: this.settings.config.batchSize * this.settings.config.workers };
  }
  async check(input) {
    this.seen.push({ epoch: input.epoch, norms: input.norms, levels: input.levels, lr: input.lr });
    const levels = input.levels.map((level, i) => (this.settings.matrices[i] && input.norms[i] < this.threshold ? 1 : level));
    return { levels, reasons: levels.map(() => 'policy') };
  }
  save() {
    return { cooled: this.seen.length };
  }
  restore(saved) {
    this.restored = saved.cooled;
  }
}

describe("a user's own policy", function () {
  this.timeout(120000);
  let tmp;
  before(() => (tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'acc-policy-'))));
  after(() => fs.rmSync(tmp, { recursive: true, force: true }));

  const options = (extra) => ({
    model: 'resnet18', width: 0.25, dataset: 'synthetic', dataDir: path.join(tmp, 'data'), syntheticTrain: 64, syntheticTest: 16,
    batchSize: 16, evalBatchSize: 16, epochs: 2, compressor: 'powersgd', rank: 2, progress: false, ...extra,
  });

  it('decides the levels of the next epoch from the norms it is given; the trainer applies, records and checkpoints them', async function () {
    let policy;
    const out = path.join(tmp, 'run');
    const trainer = await Trainer.create(options({ outDir: out }), { policy: (settings) => (policy = new CoolingPolicy(settings, Infinity)) });
    const summary = await trainer.fit();
    await trainer.dispose();
    // It saw the first epoch's norms (one per parameter, positive) at the schedule's rate.
    expect(policy.seen[0].epoch).to.equal(0);
    expect(policy.seen[0].norms).to.have.length(policy.settings.matrices.length);
    expect(policy.seen[0].norms.every((n) => n > 0)).to.equal(true);
    expect(policy.seen[0].lr).to.equal(scheduledRate(policy.settings, 0));
    // Its decision, every matrix at rank 1, ran in epoch 2: fewer floats, the levels in the record.
    const [first, second] = summary.epochs;
    const matrices = policy.settings.matrices;
    expect(first.levels.filter((l, i) => matrices[i])).to.satisfy((ls) => ls.every((l) => l === 2));
    expect(second.levels.filter((l, i) => matrices[i])).to.satisfy((ls) => ls.every((l) => l === 1));
    expect(second.floatsSent).to.be.below(first.floatsSent);
    const switches = readMetrics(path.join(out, 'metrics.jsonl')).filter((e) => e.event === 'switch');
    expect(switches.length).to.equal(matrices.filter(Boolean).length);
    expect(switches.every((s) => s.reason === 'policy' && s.from === 2 && s.to === 1)).to.equal(true);
    // Its state went into the checkpoint and comes back on resume.
    const resumed = await Trainer.create({ resume: out, epochs: 3, progress: false }, { policy: (settings) => (policy = new CoolingPolicy(settings, Infinity)) });
    expect(policy.restored).to.equal(2);
    await resumed.dispose();
  });

  it('a policy that keeps every level changes nothing: the run equals the built-in static run, bit for bit', async function () {
    const runs = {};
    for (const [name, context] of [['builtin', {}], ['user', { policy: (settings) => new CoolingPolicy(settings, 0) }]]) {
      const trainer = await Trainer.create(options({ seed: 5 }), context);
      const summary = await trainer.fit();
      runs[name] = { losses: summary.epochs.map((e) => e.testLoss), state: await trainer.model.stateDict() };
      await trainer.dispose();
    }
    expect(runs.user.losses).to.deep.equal(runs.builtin.losses);
    runs.builtin.state.forEach((t, i) => expect(Buffer.compare(Buffer.from(t.data), Buffer.from(runs.user.state[i].data)), t.name).to.equal(0));
  });
});
