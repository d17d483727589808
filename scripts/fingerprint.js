#!/usr/bin/env node
// A fingerprint of what training computes: a few steps of every model, compressor and adaptation
// policy, alone and on two workers (in-process groups), with every option written out, hashed
// (SHA-256 over every state_dict entry of every rank, trainer state included, and the epoch
// records' figures that do not depend on time). A change that should not alter the arithmetic
// must leave every line equal to scripts/fingerprint.json. The baseline holds on the kind of machine
// that wrote it: oneDNN and OpenBLAS pick their kernels by the CPU, so on another, record the
// baseline with the code before the change (--write), then compare the code after it.
//
//   node scripts/fingerprint.js            compare with scripts/fingerprint.json (exit 1 naming the cases that differ)
//   node scripts/fingerprint.js --write    record a new baseline (after a change whose effect is intended)
//   node scripts/fingerprint.js --only lstm-topk-2 --show   one case, with its epochs (steps, batch, lr, loss, levels)
import { createHash } from 'node:crypto';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { Trainer } from '../lib/index.js';
import { ProcessGroup } from '../lib/comm/group.js';
import { splitTextIntoWikiText } from '../lib/data/wikitext.js';
import { freePort } from '../test/helpers/ports.js';

const BASELINE = path.join(path.dirname(fileURLToPath(import.meta.url)), 'fingerprint.json');
const { values: o } = parseArgs({ options: { write: { type: 'boolean', default: false }, only: { type: 'string' }, show: { type: 'boolean', default: false } } });

// Every option, written out: a default that changes must not change the fingerprint. (--rank and
// --topk-ratio set a static level, which Accordion's levels replace: every compressed case runs Accordion.)
const COMMON = {
  device: 'cpu', epochs: 2, evalBatchSize: 16, momentum: 0.9, weightDecay: 1e-4, nesterov: true, warmupEpochs: 1,
  milestones: [1], lrDecay: 0.1, seed: 3, minCompressionRate: 1, eta: 0.5, accordionInterval: 1, lowRank: 2, highRank: 1,
  lowRatio: 0.5, highRatio: 0.1, adapt: 'compression', batchLow: 16, batchHigh: 32, autoRanks: [1, 2, 4], autoRatios: [0.05, 0.1, 0.2],
  errorBudget: 1, criticalBudget: 0.5, errorMeasure: 'squared', autoCost: 'floats', overwrite: false, checkpointEvery: 1,
  threads: 1, bucketMb: 1, timeoutMs: 60_000, progress: false,
};
const IMAGES = { dataset: 'synthetic', syntheticTrain: 64, syntheticTest: 32, batchSize: 8, lr: 0.02, hidden: 16, layers: 2, dropout: 0, bptt: 8, clip: 0 };
const TEXT = { dataset: 'wikitext2', batchSize: 4, lr: 1, hidden: 16, layers: 2, dropout: 0.2, bptt: 8, clip: 0.25, syntheticTrain: 64, syntheticTest: 32 };

/** The cases: model × compressor × workers, and each adaptation policy on ResNet-18 with two workers. */
function cases() {
  const list = [];
  for (const model of ['resnet18', 'vgg19bn', 'lstm'])
    for (const compressor of ['none', 'powersgd', 'topk'])
      for (const workers of [1, 2]) list.push({ name: `${model}-${compressor}-${workers}`, workers, config: { model, compressor, accordion: compressor === 'none' ? 'off' : 'on' } });
  // Three epochs, every check after the first calm (η = 10) and a milestone taking effect in epoch
  // 3: the batch grows (without the milestone, where Smith's growth at it would compute the same), Smith's
  // batch grows at the milestone, and the levels move.
  const policies = { batch: 'none', smith: 'none', auto: 'powersgd', 'batch+compression': 'powersgd' };
  const moving = { epochs: 3, eta: 10, milestones: [0], batchHigh: 64 };
  for (const [adapt, compressor] of Object.entries(policies))
    list.push({
      name: `resnet18-${adapt}-2`, workers: 2,
      config: { model: 'resnet18', compressor, adapt, accordion: compressor === 'none' ? 'off' : 'on', ...moving, ...(adapt === 'batch' ? { milestones: [] } : {}) },
    });
  list.push({ name: 'resnet18-topk-auto-2', workers: 2, config: { model: 'resnet18', compressor: 'topk', adapt: 'auto', accordion: 'on', ...moving } });
  return list;
}

/** A small corpus in the WikiText layout: 600 lines of words drawn from 40 by a fixed recurrence. */
function textCorpus(dir) {
  let x = 12345;
  const next = () => (x = (x * 1103515245 + 12345) % 2147483648);
  const lines = Array.from({ length: 600 }, () => Array.from({ length: 6 + (next() % 10) }, () => `w${next() % 40}`).join(' '));
  splitTextIntoWikiText(lines.join('\n') + '\n', dir, [0.8, 0.1, 0.1]);
}

/** The epoch records' figures that time cannot move. */
const FIGURES = ['epoch', 'lr', 'trainLoss', 'trainAccuracy', 'testLoss', 'testAccuracy', 'validLoss', 'samples', 'steps', 'floatsSent', 'floatsSentTotal', 'overheadFloats', 'broadcastFloats', 'batchSize', 'levels', 'norms', 'ratios'];

async function fingerprint(c, dirs) {
  const config = { ...COMMON, ...(c.config.model === 'lstm' ? { ...TEXT, dataDir: dirs.text } : { ...IMAGES, dataDir: dirs.images }), ...c.config, workers: c.workers };
  const hash = createHash('sha256');
  let trainers;
  let groups = [];
  if (c.workers === 1) trainers = [await Trainer.create(config)];
  else {
    const port = await freePort();
    groups = await Promise.all(Array.from({ length: c.workers }, (_, rank) => ProcessGroup.connect({ rank, worldSize: c.workers, masterPort: port, hostStore: rank === 0 })));
    trainers = await Promise.all(groups.map((group) => Trainer.create(config, { group })));
  }
  try {
    await Promise.all(trainers.map((t) => t.fit()));
    if (o.show) console.log(trainers[0].history.map((r) => `${r.epoch}: ${r.steps} steps, batch ${r.batchSize}, lr ${r.lr}, loss ${r.trainLoss}, levels ${r.levels ?? '-'}`).join('\n'));
    for (const t of trainers) {
      for (const e of await t.model.stateDict(true)) hash.update(`${e.name} ${e.dtype} ${e.shape.join('x')}\n`).update(e.data);
      hash.update(JSON.stringify(t.history.map((r) => FIGURES.map((f) => r[f] ?? null))));
    }
  } finally {
    await Promise.all(trainers.map((t) => t.dispose()));
    await Promise.all(groups.map((g) => g.dispose()));
  }
  return hash.digest('hex');
}

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'accordion-fingerprint-'));
try {
  const dirs = { images: path.join(tmp, 'images'), text: path.join(tmp, 'text') };
  textCorpus(dirs.text);
  // The synthetic set is generated once, before any group reads it.
  await (await Trainer.create({ ...COMMON, ...IMAGES, model: 'resnet18', compressor: 'none', accordion: 'off', workers: 1, dataDir: dirs.images })).dispose();
  const baseline = fs.existsSync(BASELINE) ? JSON.parse(fs.readFileSync(BASELINE, 'utf8')) : {};
  const got = {};
  const differ = [];
  for (const c of cases().filter((c) => !o.only || o.only.split(',').includes(c.name))) {
    const started = Date.now();
    got[c.name] = await fingerprint(c, dirs);
    const verdict = o.write ? '' : baseline[c.name] === undefined ? '  (no baseline)' : baseline[c.name] === got[c.name] ? '  same' : '  DIFFERS';
    if (verdict.includes('DIFFERS') || verdict.includes('no baseline')) differ.push(c.name);
    console.log(`${c.name.padEnd(28)} ${got[c.name].slice(0, 16)}${verdict}  (${((Date.now() - started) / 1000).toFixed(1)} s)`);
  }
  if (o.write) {
    fs.writeFileSync(BASELINE, JSON.stringify({ ...baseline, ...got }, null, 2) + '\n');
    console.log(`baseline written: ${BASELINE}`);
  } else if (differ.length) {
    console.error(`fingerprint: ${differ.length} case(s) differ from ${path.basename(BASELINE)}: ${differ.join(', ')}`);
    process.exitCode = 1;
  }
} finally {
  fs.rmSync(tmp, { recursive: true, force: true });
}
