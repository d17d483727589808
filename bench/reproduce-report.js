// The report of one setting of bench/reproduce.js in the paper's form: final test accuracy on the
// whole test set per run and seed, the mean of the last 3 evaluations, floats against static low,
// wall-clock; paired differences with 95% intervals and the goals decided from them; which layers
// ran at which level when; and a chart of the first seed's runs (accuracy against epochs and floats,
// each layer's level over the epochs) drawn by `accordion report` and photographed by Chromium.
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { BENCH_DIR, fmt, formatTable, meanInterval } from './common.js';
import { finished, runDir } from './reproduce.js';
import { TITLES, WORKERS, configsOf, scheduleArgs } from './reproduce-settings.js';

/** One finished run's figures, from its metrics log. */
function readRun(run) {
  const events = fs.readFileSync(path.join(run, 'metrics.jsonl'), 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));
  const byEpoch = new Map();
  for (const e of events) if (e.event === 'epoch') byEpoch.set(e.epoch, e); // a resumed run logs some epochs again: the last wins
  const epochs = [...byEpoch.values()].sort((a, b) => a.epoch - b.epoch);
  const last = epochs.at(-1);
  return {
    accuracy: 100 * last.testAccuracy,
    lastThree: (100 * epochs.slice(-3).reduce((a, e) => a + e.testAccuracy, 0)) / Math.min(3, epochs.length),
    floats: last.floatsSentTotal,
    minutes: epochs.reduce((a, e) => a + e.seconds, 0) / 60,
    epochs,
  };
}

const signed = (x, digits = 2) => `${x >= 0 ? '+' : '−'}${fmt(Math.abs(x), digits)}`;
const interval = (m) => (m.n > 1 ? `${signed(m.low)} … ${signed(m.high)}` : 'one seed');

/**
 * Whether `diffs` (paired differences, points) show the mean at or above `bound`: met when the 95%
 * interval lies above it, not met when below, otherwise undecided with the seeds that would decide
 * at this spread.
 */
export function decideAtLeast(diffs, bound) {
  const m = meanInterval(diffs);
  if (m.n < 2) return { ...m, verdict: 'undecided (one seed)' };
  if (m.low > bound) return { ...m, verdict: 'met' };
  if (m.high < bound) return { ...m, verdict: 'not met' };
  const gap = Math.abs(m.mean - bound);
  const needed = gap > 0 ? Math.ceil(((1.96 * m.sd) / gap) ** 2) + 1 : Infinity;
  return { ...m, verdict: `undecided: at this spread about ${Number.isFinite(needed) ? needed : 'unboundedly many'} seeds would decide` };
}

/** Per layer of a run with levels: the epochs at each level, and the epochs in which every matrix ran at `low`. */
function levelStory(run, s) {
  const withLevels = run.epochs.filter((e) => Array.isArray(e.levels));
  if (!withLevels.length) return null;
  const matrices = withLevels[0].levels.map((_, i) => i).filter((i) => withLevels.some((e) => e.levels[i] === s.low || e.levels[i] === s.high));
  const atLow = (e) => matrices.filter((i) => e.levels[i] === s.low).length;
  const allLow = withLevels.filter((e) => atLow(e) === matrices.length).map((e) => e.epoch);
  const share = withLevels.reduce((a, e) => a + atLow(e), 0) / (withLevels.length * matrices.length);
  return { share, allLow, perEpoch: withLevels.map((e) => `${atLow(e)}`).join(' '), matrices: matrices.length };
}

/** Epoch numbers as ranges: 1-5, 16, 26-30. */
function ranges(epochs) {
  const out = [];
  for (const e of epochs) {
    const last = out.at(-1);
    if (last && last[1] === e - 1) last[1] = e;
    else out.push([e, e]);
  }
  return out.map(([a, b]) => (a === b ? `${a}` : `${a}–${b}`)).join(', ') || 'none';
}

/** Writes bench/results/reproduce-SETTING(-quick).md and .png from the setting's finished runs. */
export async function writeSettingReport(s, o) {
  const CONFIGS = configsOf(s);
  const configs = Object.keys(CONFIGS).filter((c) => o.seeds.some((seed) => finished(runDir(o.dir, s, c, seed))));
  const runs = {};
  for (const c of configs) runs[c] = Object.fromEntries(o.seeds.filter((seed) => finished(runDir(o.dir, s, c, seed))).map((seed) => [seed, readRun(runDir(o.dir, s, c, seed))]));
  if (!runs.low || !Object.keys(runs.low).length) throw new Error(`no finished static-low run of ${s.name} (${s.tag}) under ${o.dir}: run it first`);
  const lowFloats = meanInterval(Object.values(runs.low).map((r) => r.floats)).mean;
  const paired = (a, b, f = (x, y) => x.accuracy - y.accuracy) => o.seeds.filter((seed) => runs[a]?.[seed] && runs[b]?.[seed]).map((seed) => f(runs[a][seed], runs[b][seed]));
  const paperOf = { low: s.paper.low, high: s.paper.high, accordion: s.paper.accordion };

  const lines = [];
  const say = (...l) => lines.push(...l);
  say(`# ${s.name}: ${s.model} with PowerSGD, rank ${s.low} ↔ ${s.high}, on Fashion-MNIST${s.quick ? ' (quick mode: not to be quoted)' : ''}`, '');
  say(`Written by \`node bench/reproduce.js report ${s.name}${s.quick ? ' --quick' : ''}\` on ${new Date().toISOString().slice(0, 10)} from the runs under ` +
    `\`${path.relative(process.cwd(), path.join(o.dir, s.name, s.tag))}\` (${os.cpus()[0]?.model ?? 'unknown CPU'}, ${os.cpus().length} cores).`, '');
  say(`Setting: width ${s.width}, the first ${s.trainImages.toLocaleString('en-US')} training images, the whole 10,000-image test set, ${s.epochs} epochs, ` +
    `${WORKERS} workers × batch ${s.batchSize}; \`accordion train\` schedule arguments \`${scheduleArgs(s).join(' ')}\`. ` +
    `Paper: ${s.paper.source} (300 epochs, 3 seeds).`, '');

  say('## Final test accuracy', '');
  const columns = [{ key: 'run', title: 'run', align: 'left' }, ...o.seeds.map((seed) => ({ key: `s${seed}`, title: `seed ${seed}` })),
    { key: 'mean', title: 'mean' }, { key: 'lastThree', title: 'mean of last 3 evals' }, { key: 'floats', title: 'floats / worker' },
    { key: 'factor', title: '× static low' }, { key: 'minutes', title: 'minutes / run' }, { key: 'paper', title: 'paper' }];
  const rows = configs.map((c) => {
    const got = Object.values(runs[c]);
    const mean = (f) => got.reduce((a, r) => a + f(r), 0) / got.length;
    const row = {
      run: `${TITLES[c]} (${CONFIGS[c](s).join(' ')})`,
      mean: `${fmt(mean((r) => r.accuracy), 2)}%`,
      lastThree: `${fmt(mean((r) => r.lastThree), 2)}%`,
      floats: `${fmt(mean((r) => r.floats) / 1e6, 2)}M`,
      factor: fmt(mean((r) => r.floats) / lowFloats, 3),
      minutes: fmt(mean((r) => r.minutes), 1),
      paper: paperOf[c] === undefined ? '' : `${fmt(paperOf[c], 1)}%${c === 'accordion' ? ` at ${s.paper.floatsFactor}×` : ''}`,
    };
    for (const seed of o.seeds) row[`s${seed}`] = runs[c][seed] ? `${fmt(runs[c][seed].accuracy, 2)}%` : '';
    return row;
  });
  say(formatTable(columns, rows, { markdown: true }), '');

  say('## Paired differences (points of final test accuracy, per seed)', '');
  const diffRows = [];
  const verdicts = {};
  const addDiff = (a, b, bound, label) => {
    const d = paired(a, b);
    if (!d.length) return;
    const v = decideAtLeast(d, bound);
    verdicts[label] = v;
    const goal = Number.isFinite(bound) ? `≥ ${signed(bound, 1)}: ${v.verdict}` : '';
    diffRows.push({ pair: `${TITLES[a]} − ${TITLES[b]}`, seeds: d.map((x) => signed(x)).join(', '), mean: signed(v.mean), ci: interval(v), goal });
  };
  addDiff('high', 'low', -Infinity, 'separation');
  addDiff('accordion', 'low', -0.3, 'accordion');
  addDiff('equal', 'low', -Infinity, 'equal');
  say(formatTable([{ key: 'pair', title: 'A − B', align: 'left' }, { key: 'seeds', title: 'per seed', align: 'left' }, { key: 'mean', title: 'mean' },
    { key: 'ci', title: '95% interval' }, { key: 'goal', title: 'goal', align: 'left' }], diffRows, { markdown: true }), '');

  say('## Goals', '');
  const sep = verdicts.separation;
  if (sep) {
    const gap = sep.mean;
    const collapse = s.model === 'vgg19bn';
    say(`- **Separation** (static high at least 1 point below static low on the mean${collapse ? '; a collapse needs 5' : ''}): ${signed(gap)} points: ` +
      (gap <= -1 ? 'separated' : 'NOT separated: an Accordion result here is no evidence') + (collapse && gap > -5 ? '; collapse not reproduced (rank 1 within 5 points of rank 4)' : '') + '.');
  }
  if (verdicts.accordion) {
    const factor = meanInterval(Object.values(runs.accordion).map((r) => r.floats)).mean / lowFloats;
    say(`- **Accordion − static low ≥ −0.3 points** (decided by the 95% interval's lower end): ${verdicts.accordion.verdict} (mean ${signed(verdicts.accordion.mean)}, ${interval(verdicts.accordion)}).`);
    say(`- **Floats ≤ 0.7 × static low's**: ${fmt(factor, 3)}× — ${factor <= 0.7 ? 'met' : 'not met'}.`);
    if (s.model === 'vgg19bn' && sep) {
      const perSeed = o.seeds.filter((seed) => runs.accordion?.[seed] && runs.high?.[seed] && runs.low?.[seed])
        .map((seed) => (runs.accordion[seed].accuracy - runs.high[seed].accuracy) / (runs.low[seed].accuracy - runs.high[seed].accuracy));
      const r = meanInterval(perSeed.map((x) => 100 * x));
      say(`- **Accordion recovers ≥ 80% of the gap from static high to static low**: ${fmt(r.mean, 1)}% (per seed ${perSeed.map((x) => fmt(100 * x, 1) + '%').join(', ')}; ${r.n > 1 ? `95% interval ${fmt(r.low, 1)} … ${fmt(r.high, 1)}` : 'one seed'}) — ${r.n > 1 && r.low >= 80 ? 'met' : r.n > 1 && r.high < 80 ? 'not met' : 'undecided'}.`);
    }
  }
  if (verdicts.equal) say(`- **Accordion with both levels low equals static low**: differences ${paired('equal', 'low').map((x) => signed(x)).join(', ')} points (bit for bit: \`node bench/reproduce.js check ${s.name}\`).`);
  say('');

  if (runs.accordion) {
    say('## Which layers ran at which level when (Accordion)', '');
    for (const [seed, run] of Object.entries(runs.accordion)) {
      const story = levelStory(run, s);
      if (!story) continue;
      say(`- seed ${seed}: ${fmt(100 * story.share, 1)}% of layer-epochs at rank ${s.low}; every one of the ${story.matrices} compressed matrices at rank ${s.low} in epochs ${ranges(story.allLow)}; ` +
        `matrices at rank ${s.low} per epoch: ${story.perEpoch}.`);
    }
    say('');
  }

  const chart = drawChart(s, o, configs.filter((c) => c !== 'equal'));
  if (chart) say(`![${s.name}, seed ${o.seeds[0]}](${path.basename(chart)})`, '', `The chart: seed ${o.seeds[0]}'s runs as \`accordion report\` draws them (accuracy against epochs, floats and time; each layer's level over the epochs).`, '');

  const file = path.join(o.results, `reproduce-${s.name}${s.quick ? '-quick' : ''}.md`);
  fs.writeFileSync(file, lines.join('\n'));
  console.log(lines.join('\n'));
  console.log(`\nwritten to ${path.relative(process.cwd(), file)}`);
}

/** The first seed's runs as `accordion report` draws them, photographed into bench/results/reproduce-SETTING.png. */
function drawChart(s, o, configs) {
  const seed = o.seeds[0];
  const dirs = configs.map((c) => runDir(o.dir, s, c, seed)).filter(finished);
  if (!dirs.length) return null;
  const html = path.join(o.dir, s.name, s.tag, `report-seed${seed}.html`);
  const cli = path.join(BENCH_DIR, '..', 'lib', 'cli.js');
  const made = spawnSync(process.execPath, [cli, 'report', ...dirs, '--out', html], { encoding: 'utf8' });
  if (made.status !== 0) throw new Error(`accordion report failed: ${made.stderr}`);
  const png = path.join(o.results, `reproduce-${s.name}${s.quick ? '-quick' : ''}.png`);
  const shot = spawnSync('/usr/bin/chromium', ['--headless', '--no-sandbox', '--disable-gpu', '--hide-scrollbars', '--disable-background-networking',
    '--disable-component-update', '--no-first-run', '--window-size=1100,3600', `--screenshot=${png}`, `file://${html}`], { encoding: 'utf8', timeout: 120_000 });
  if (shot.status !== 0 || !fs.existsSync(png)) {
    console.error(`chromium could not draw the chart (${shot.stderr?.trim().split('\n').pop()}): the report is ${html}`);
    return null;
  }
  return png;
}
