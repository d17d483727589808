#!/usr/bin/env node
// Settings compared over several seeds, paired by seed: reads the runs bench/cluster.js left under
// DIR/seed<S>/<bandwidth>/<config>/ (one `--out DIR/seed<S>` per seed) and prints each run's final
// test accuracy and floats per worker (and the end-of-epoch replica check's share of the epochs'
// training time), then every listed comparison A − B per seed with the mean and its 95% interval
// (Student's t over the seeds). With --target, also each run's wall-clock seconds from its start to
// the first epoch at that test accuracy or above, and their mean over the seeds.
//
//   node bench/seeds.js --dir /tmp/s27 --bandwidth 1gbit \
//     --compare powersgd-accordion:powersgd-r2,powersgd-auto:powersgd-accordion [--target 0.7] [--markdown]
import * as fs from 'node:fs';
import * as path from 'node:path';
import { parseArgs } from 'node:util';
import { readMetrics } from '../lib/base/metrics.js';
import { fmt, formatTable, meanInterval } from './common.js';

const { values: o } = parseArgs({
  options: {
    dir: { type: 'string' },
    bandwidth: { type: 'string', default: '1gbit' },
    compare: { type: 'string' },
    target: { type: 'string' },
    markdown: { type: 'boolean', default: false },
  },
});
if (!o.dir || !o.compare) throw new Error('usage: node bench/seeds.js --dir DIR --compare A:B[,C:D] [--bandwidth 1gbit] [--target ACCURACY] [--markdown]');
const target = o.target === undefined ? undefined : Number(o.target);
if (target !== undefined && !(target > 0 && target <= 1)) throw new Error(`--target: an accuracy in (0, 1], got ${o.target}`);
const pairs = o.compare.split(',').map((p) => p.split(':'));
const configs = [...new Set(pairs.flat())];

const seeds = fs
  .readdirSync(o.dir)
  .filter((d) => /^seed\d+$/.test(d))
  .map((d) => Number(d.slice(4)))
  .sort((a, b) => a - b);
const runs = new Map(); // `${seed} ${config}` → { accuracy, floats }
for (const seed of seeds)
  for (const config of configs) {
    const run = path.join(o.dir, `seed${seed}`, o.bandwidth, config);
    const file = path.join(run, 'metrics.jsonl');
    if (!fs.existsSync(path.join(run, 'summary.json'))) continue; // not run, or not finished
    const events = readMetrics(file);
    const epochs = events.filter((e) => e.event === 'epoch');
    const begun = Date.parse(events.find((e) => e.event === 'start').time);
    const reached = target === undefined ? undefined : epochs.find((e) => e.testAccuracy >= target);
    if (epochs.length)
      runs.set(`${seed} ${config}`, {
        toTarget: reached ? (Date.parse(reached.time) - begun) / 1000 : null,
        accuracy: epochs.at(-1).testAccuracy,
        floats: epochs.at(-1).floatsSentTotal,
        // The replica check at each epoch's end against the epoch's training time.
        sync: epochs.reduce((a, e) => a + (e.syncSeconds ?? 0), 0) / epochs.reduce((a, e) => a + e.seconds, 0),
      });
  }

const columns = [{ key: 'config', title: 'run', align: 'left' }, ...seeds.map((s) => ({ key: `s${s}`, title: `seed ${s}` })), { key: 'mean', title: 'mean acc.' }, { key: 'floats', title: 'mean floats' }, { key: 'sync', title: 'replica check' }];
const rows = configs.map((config) => {
  const got = seeds.map((s) => runs.get(`${s} ${config}`));
  const have = got.filter(Boolean);
  const row = {
    config,
    mean: `${fmt((100 * have.reduce((a, r) => a + r.accuracy, 0)) / have.length, 1)}% (${have.length})`,
    floats: `${fmt(have.reduce((a, r) => a + r.floats, 0) / have.length / 1e6, 2)}M`,
    sync: `${fmt((100 * have.reduce((a, r) => a + r.sync, 0)) / have.length, 2)}%`,
  };
  seeds.forEach((s, i) => (row[`s${s}`] = got[i] ? `${fmt(100 * got[i].accuracy, 1)}% / ${fmt(got[i].floats / 1e6, 2)}M` : ''));
  return row;
});
console.log(`Final test accuracy / floats per worker (${o.bandwidth}, ${o.dir})\n`);
console.log(formatTable(columns, rows, { markdown: o.markdown }));

const diffColumns = [{ key: 'pair', title: 'A − B', align: 'left' }, ...seeds.map((s) => ({ key: `s${s}`, title: `seed ${s}` })), { key: 'mean', title: 'mean' }, { key: 'ci', title: '95% interval' }, { key: 'floats', title: 'floats A / B' }];
const diffRows = pairs.map(([a, b]) => {
  const d = seeds.map((s) => {
    const ra = runs.get(`${s} ${a}`);
    const rb = runs.get(`${s} ${b}`);
    return ra && rb ? { acc: 100 * (ra.accuracy - rb.accuracy), floats: ra.floats / rb.floats } : undefined;
  });
  const { mean, low, high } = meanInterval(d.filter(Boolean).map((x) => x.acc));
  const ratios = d.filter(Boolean).map((x) => x.floats);
  const row = {
    pair: `${a} − ${b}`,
    mean: `${mean >= 0 ? '+' : ''}${fmt(mean, 1)}`,
    ci: `${fmt(low, 1)} … ${fmt(high, 1)}`,
    floats: fmt(ratios.reduce((x, y) => x + y, 0) / ratios.length, 3),
  };
  seeds.forEach((s, i) => (row[`s${s}`] = d[i] ? `${d[i].acc >= 0 ? '+' : ''}${fmt(d[i].acc, 1)}` : ''));
  return row;
});
console.log(`\nPaired differences of final test accuracy (points), A − B per seed\n`);
console.log(formatTable(diffColumns, diffRows, { markdown: o.markdown }));

if (target !== undefined) {
  const timeColumns = [{ key: 'config', title: 'run', align: 'left' }, ...seeds.map((s) => ({ key: `s${s}`, title: `seed ${s}` })), { key: 'mean', title: 'mean' }];
  const timeRows = configs.map((config) => {
    const got = seeds.map((s) => runs.get(`${s} ${config}`));
    const times = got.filter(Boolean).map((r) => r.toTarget);
    const all = times.length === seeds.length && times.every((t) => t !== null);
    const row = { config, mean: all ? fmt(times.reduce((a, t) => a + t, 0) / times.length, 0) : `not reached in ${times.filter((t) => t === null).length + seeds.length - times.length}` };
    seeds.forEach((s, i) => (row[`s${s}`] = got[i] ? (got[i].toTarget === null ? 'not reached' : fmt(got[i].toTarget, 0)) : ''));
    return row;
  });
  console.log(`\nWall-clock seconds to ${fmt(100 * target, 0)}% test accuracy\n`);
  console.log(formatTable(timeColumns, timeRows, { markdown: o.markdown }));
}
