// The option table is the one source of every option's default, bounds and help: the help text,
// the library's defaults (Trainer.create, Model.create) and a run's config.json read back as a config
// file must agree for every option. The behaviour changes that came with one default per option
// are checked here too, each against the value it now takes.
import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { Model } from '../../lib/index.js';
import { DEFAULT_CONFIG, OPTIONS, OPTION_KEYS, presetValues } from '../../lib/config/options.js';
import { parseTrainArgs, readConfigFile } from '../../lib/cli/args.js';
import { resolveConfig, savedConfig } from '../../lib/train/config.js';
import { CLI } from '../helpers/paths.js';

/**
 * A valid value other than the default for every option (written here, not derived from the table,
 * so that an option added without one fails the round trip below).
 */
const OTHER = {
  model: 'vgg19bn', width: 0.5, precision: 'bf16', device: 'cuda:1', convAlgorithms: 'accurate', tf32: true, memoryFormat: 'channels-first', distBackend: 'gloo', dataset: 'cifar100', dataDir: '/data/cifar', trainImages: 1000, testImages: 500, epochs: 7, batchSize: 32, evalBatchSize: 128, evalsPerEpoch: 4, lr: 0.3,
  momentum: 0.8, weightDecay: 5e-4, nesterov: false, warmupEpochs: 2, milestones: [3, 5], lrDecay: 0.5, seed: 7, workers: 4,
  compressor: 'topk', rank: 4, topkRatio: 0.25, compressAfter: 7, minCompressionRate: 2, compressionSeed: 9, commDtype: 'bf16', accordion: 'off', eta: 0.3, accordionInterval: 3,
  lowRank: 4, highRank: 2, lowRatio: 0.5, highRatio: 0.05, adapt: 'batch', batchLow: 128, batchHigh: 256, batchRamp: 3, batchRateScaling: 'none', autoRanks: [1, 3], autoRatios: [0.05, 0.5],
  errorBudget: 2, criticalBudget: 0.25, errorMeasure: 'relative', autoCost: 'seconds', replanFactor: 3, replanSteps: 20, linkShare: 0.25, outDir: '/runs/x', overwrite: true, checkpointEvery: 2,
  resume: '/runs/y', syntheticTrain: 100, syntheticTest: 50, hidden: 32, layers: 3, dropout: 0.1, bptt: 20, clip: 0.5, threads: 3, bucketMb: 0,
  broadcastBuffers: false, timeoutMs: 5000, progress: true,
};

/** The text a flag takes for a value. */
const asText = (v) => (Array.isArray(v) ? v.join(',') : String(v));

/** The command line that sets every option of `values`. */
function flags(values) {
  const argv = [];
  for (const [key, value] of Object.entries(values)) {
    const spec = OPTIONS[key];
    if (spec.type === 'flag') {
      if (value === !spec.negate) argv.push(spec.flag);
    } else argv.push(spec.flag, asText(value));
  }
  return argv;
}

describe('options: one table for the command line, the library and config files', function () {
  let tmp;
  before(() => (tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'acc-options-'))));
  after(() => fs.rmSync(tmp, { recursive: true, force: true }));

  it('has a non-default value in this test for every option', function () {
    expect(Object.keys(OTHER).sort()).to.deep.equal([...OPTION_KEYS].sort());
    for (const key of OPTION_KEYS) expect(OTHER[key], key).to.not.deep.equal(DEFAULT_CONFIG[key]);
  });

  it('train --help shows every option once, with the default and preset values the library takes', function () {
    const r = spawnSync(process.execPath, [CLI, 'train', '--help'], { encoding: 'utf8' });
    expect(r.status).to.equal(0);
    const lines = r.stdout.split('\n');
    const synthetic = presetValues('synthetic'), lstm = presetValues('lstm');
    const libraryDefaults = {
      none: resolveConfig({ model: 'resnet18', dataset: 'cifar10', dataDir: '/data' }),
      synthetic: resolveConfig({ model: 'resnet18' }),
      lstm: resolveConfig({ model: 'lstm', dataDir: '/data' }),
    };
    for (const key of OPTION_KEYS) {
      const spec = OPTIONS[key];
      const mine = lines.filter((l) => l.trimStart().startsWith(spec.flag + ' ') || l.trim() === spec.flag || l.trimStart().startsWith(spec.flag + '  '));
      expect(mine, `${spec.flag}: one help line`).to.have.length(1);
      const line = mine[0];
      expect(line, key).to.include(spec.help);
      expect((line.match(/\(default: /g) ?? []).length, `${spec.flag}: one default`).to.be.at.most(1);
      const shown = /\(default: ([^;)]*)(?:; ([^)]*))?\)$/.exec(line);
      if (spec.type === 'flag' || DEFAULT_CONFIG[key] === undefined) {
        expect(shown, `${spec.flag} shows no default`).to.equal(null);
        continue;
      }
      expect(shown, `${spec.flag} shows its default`).to.not.equal(null);
      // The shown default, read back as a flag's value, is what Trainer.create takes without a preset.
      const parsed = parseTrainArgs([spec.flag, shown[1]])[key];
      expect(parsed, key).to.deep.equal(DEFAULT_CONFIG[key]);
      // (Trainer.create resolves accordion 'auto' to on or off.)
      if (key !== 'dataset' && key !== 'accordion') expect(libraryDefaults.none[key], key).to.deep.equal(parsed);
      // And each preset's value shown is what the library takes under that preset.
      const presets = Object.fromEntries((shown[2] ?? '').split(', ').filter(Boolean).map((p) => {
        const m = /^(.*) (on synthetic data|for lstm)$/.exec(p);
        return [m[2] === 'for lstm' ? 'lstm' : 'synthetic', parseTrainArgs([spec.flag, m[1]])[key]];
      }));
      expect(presets.synthetic, `${key} under the synthetic preset`).to.deep.equal(synthetic[key]);
      expect(presets.lstm, `${key} under the lstm preset`).to.deep.equal(lstm[key]);
      if (synthetic[key] !== undefined) expect(libraryDefaults.synthetic[key], key).to.deep.equal(synthetic[key]);
      if (lstm[key] !== undefined) expect(libraryDefaults.lstm[key], key).to.deep.equal(lstm[key]);
    }
  });

  it('a run\'s config.json, read back as a config file, gives the same configuration (every option set)', function () {
    // progress is the library's switch; the command line turns it on itself, and --quiet off.
    const { progress: _progress, ...settable } = OTHER;
    expect(parseTrainArgs(flags(settable))).to.deep.equal(settable);
    expect(parseTrainArgs(['--quiet'])).to.deep.equal({ progress: false });
    const file = path.join(tmp, 'config.json');
    fs.writeFileSync(file, JSON.stringify(savedConfig(OTHER), null, 2));
    const back = readConfigFile(file);
    const { resume: _r, progress: _p, overwrite: _o, ...kept } = OTHER;
    expect(back).to.deep.equal(kept);
    // A config file may name options by their flags too (a negating flag takes the opposite value).
    fs.writeFileSync(file, JSON.stringify({ 'batch-size': 16, 'no-nesterov': true, quiet: true, out: '/runs/z' }));
    expect(readConfigFile(file)).to.deep.equal({ batchSize: 16, nesterov: false, progress: false, outDir: '/runs/z' });
    // The configuration resolved from defaults round-trips as well.
    const resolved = resolveConfig({ model: 'resnet18' });
    fs.writeFileSync(file, JSON.stringify(savedConfig(resolved)));
    expect(resolveConfig(readConfigFile(file))).to.deep.equal(resolved);
  });

  it('refuses a value out of an option\'s bounds by the same words in the library and on the command line', function () {
    for (const [key, bad, words] of [['epochs', 0, 'a positive integer'], ['topkRatio', 1.5, 'a number in (0, 1]'], ['dropout', 1, 'a number in [0, 1)'], ['autoRanks', [], 'a non-empty list of positive integers']]) {
      const flag = OPTIONS[key].flag;
      expect(() => resolveConfig({ model: 'resnet18', [key]: bad }), key).to.throw(`option ${flag}: expected ${words}, got`);
    }
    expect(() => resolveConfig({ model: 'resnet18', bogus: 1 })).to.throw(/unknown option 'bogus'/);
  });

  describe('behaviour that changed with one default per option', function () {
    const images = new Float32Array(4 * 3 * 8 * 8).map((_, i) => Math.sin(i * 0.37));
    const labels = [0, 3, 5, 9];
    async function afterStep(options) {
      const model = await Model.create({ architecture: 'resnet18', ...options });
      try {
        await model.trainStep({ images, labels, height: 8, width: 8 });
        return Buffer.concat((await model.stateDict()).map((t) => Buffer.from(t.data)));
      } finally {
        await model.dispose();
      }
    }

    it('Model.create takes the trainer\'s learning rate (0.05, was 0.1) and seed (42, was 0) by default', async function () {
      const implicit = await afterStep({});
      expect(implicit.equals(await afterStep({ learningRate: 0.05, seed: 42 }))).to.equal(true);
      expect(implicit.equals(await afterStep({ learningRate: 0.1, seed: 42 }))).to.equal(false);
      expect(implicit.equals(await afterStep({ learningRate: 0.05, seed: 0 }))).to.equal(false);
    });

    it('Model.create with PowerSGD starts at the trainer\'s rank (2, was 1), and with TopK at its ratio (0.1)', async function () {
      for (const [compressor, level] of [['powersgd', 2], ['topk', 0.1]]) {
        const model = await Model.create({ architecture: 'resnet18', compressor });
        try {
          const matrices = model.parameters().map((p) => p.shape.length > 1);
          const levels = Array.from(await model.levels());
          expect(levels.filter((_, i) => matrices[i])).to.satisfy((l) => l.every((x) => x === level), compressor);
        } finally {
          await model.dispose();
        }
      }
    });

    it('the trainer gives VGG\'s classifier the dropout Model.create gives it (0.5, was 0.4); the lstm keeps 0.4', function () {
      expect(resolveConfig({ model: 'vgg19bn' }).dropout).to.equal(0.5);
      expect(resolveConfig({ model: 'lstm', dataDir: '/data' }).dropout).to.equal(0.4);
    });

    it('a learning rate of 0 is accepted by the trainer as by Model.create (the trainer refused it)', function () {
      expect(resolveConfig({ model: 'resnet18', lr: 0 }).lr).to.equal(0);
      expect(() => resolveConfig({ model: 'resnet18', lr: -0.1 })).to.throw('option --lr: expected a number ≥ 0, got -0.1');
    });
  });
});
