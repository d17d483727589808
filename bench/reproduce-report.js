// The report of one setting of bench/reproduce.js in the paper's form: the final test accuracy (the
// LSTM's test perplexity) per run and seed, the mean of the last 3 evaluations, floats against static
// low, wall-clock; paired differences with 95% intervals and the goals decided from them; which
// layers ran at which level when (the global batch, for batch-size adaptation); and a chart of the
// first seed's runs drawn by `accordion report` and photographed by Chromium.
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { BENCH_DIR, fmt, formatTable, meanInterval, t95 } from './common.js';
import { finished, runDir } from './reproduce.js';
import { TITLES, WORKERS, byPerplexity, configsOf, describeLevels, scheduleArgs } from './reproduce-settings.js';

/**
 * How a setting's runs are compared. Accuracy: in %, differences in points. Perplexity: differences
 * in % of the second run's perplexity, signed so that positive is better (lower perplexity), as for
 * accuracy. `goal`: the least difference from static low the adaptive runs must keep; `separation`:
 * the most static high may differ by for the setting to be evidence.
 */
function metricOf(s) {
  return byPerplexity(s)
    ? { name: 'test perplexity', of: (e) => e.testPerplexity, show: (v) => fmt(v, 2), diff: (a, b) => (-100 * (a - b)) / b, unit: '% of perplexity', goal: -2, separation: -5 }
    : { name: 'test accuracy', of: (e) => 100 * e.testAccuracy, show: (v) => `${fmt(v, 2)}%`, diff: (a, b) => a - b, unit: 'points', goal: -0.3, separation: -1 };
}

/** One finished run's figures, from its metrics log. */
function readRun(run, metric) {
  const events = fs.readFileSync(path.join(run, 'metrics.jsonl'), 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));
  const byEpoch = new Map();
  for (const e of events) if (e.event === 'epoch') byEpoch.set(e.epoch, e); // a resumed run logs some epochs again: the last wins
  const epochs = [...byEpoch.values()].sort((a, b) => a.epoch - b.epoch);
  const lastThree = epochs.slice(-3);
  return {
    quality: metric.of(epochs.at(-1)),
    lastThree: lastThree.reduce((a, e) => a + metric.of(e), 0) / lastThree.length,
    floats: epochs.at(-1).floatsSentTotal,
    minutes: epochs.reduce((a, e) => a + e.seconds, 0) / 60,
    names: events.find((e) => e.event === 'start')?.parameterNames ?? [],
    epochs,
  };
}

const signed = (x, digits = 2) => `${x >= 0 ? '+' : '−'}${fmt(Math.abs(x), digits)}`;
const interval = (m) => (m.n > 1 ? `${signed(m.low)} … ${signed(m.high)}` : 'one seed');

/**
 * Whether `diffs` (paired differences) show the mean at or above `bound`: met when the 95% interval
 * lies above it, not met when below, otherwise undecided with the seeds that would decide at this
 * spread.
 */
export function decideAtLeast(diffs, bound) {
  const m = meanInterval(diffs);
  if (m.n < 2) return { ...m, verdict: 'undecided (one seed)' };
  if (m.low > bound) return { ...m, verdict: 'met' };
  if (m.high < bound) return { ...m, verdict: 'not met' };
  // The fewest seeds whose Student interval, at this mean and spread, would leave the bound outside.
  const gap = Math.abs(m.mean - bound);
  let needed = m.n + 1;
  while (gap > 0 && needed <= 1000 && (t95(needed - 1) * m.sd) / Math.sqrt(needed) >= gap) needed++;
  const seeds = gap > 0 && needed <= 1000 ? `about ${needed} seeds` : 'unboundedly many seeds';
  return { ...m, verdict: `undecided: at this spread ${seeds} would decide` };
}

/** Epoch numbers as ranges: 1–5, 16, 26–30. */
function ranges(epochs) {
  const out = [];
  for (const e of epochs) {
    const last = out.at(-1);
    if (last && last[1] === e - 1) last[1] = e;
    else out.push([e, e]);
  }
  return out.map(([a, b]) => (a === b ? `${a}` : `${a}–${b}`)).join(', ') || 'none';
}

/**
 * What an adaptive run did, per seed: the share of layer-epochs at the low level, the epochs in which
 * every compressed matrix ran at it, and for the first seed each matrix's epochs at the low level;
 * for batch-size adaptation, the global batch of each epoch.
 */
function adaptiveStory(s, runs) {
  const lines = [];
  for (const [seed, run] of Object.entries(runs)) {
    if (s.kind === 'batch') {
      const grew = run.epochs.find((e) => e.batchSize > run.epochs[0].batchSize);
      // The rate from the epoch before the growth on: a jump, or a ramp (--batch-ramp).
      const rates = grew ? run.epochs.filter((e) => e.epoch >= grew.epoch - 1 && e.epoch <= grew.epoch + 5).map((e) => fmt(e.lr, 3)) : [];
      lines.push(`- seed ${seed}: global batch ${run.epochs[0].batchSize}${grew ? `, ${grew.batchSize} from epoch ${grew.epoch}; the rate in epochs ${grew.epoch - 1}–${grew.epoch + 5}: ${rates.join(', ')}` : ' throughout'}.`);
      continue;
    }
    const withLevels = run.epochs.filter((e) => Array.isArray(e.levels));
    if (!withLevels.length) continue;
    const matrices = withLevels[0].levels.map((_, i) => i).filter((i) => withLevels.some((e) => e.levels[i] > 0));
    const atLow = (e) => matrices.filter((i) => e.levels[i] === s.low);
    const share = withLevels.reduce((a, e) => a + atLow(e).length, 0) / (withLevels.length * matrices.length);
    const allLow = withLevels.filter((e) => atLow(e).length === matrices.length).map((e) => e.epoch);
    lines.push(`- seed ${seed}: ${fmt(100 * share, 1)}% of layer-epochs at the low level (${s.low}); all ${matrices.length} compressed matrices at it in epochs ${ranges(allLow)}; ` +
      `matrices at it, epoch by epoch: ${withLevels.map((e) => atLow(e).length).join(' ')}.`);
    if (seed !== Object.keys(runs)[0]) continue;
    // The rule's evidence: at each check, the largest norm change over the matrices (η = 0.5 marks a critical regime).
    const largest = run.epochs.map((e) => Math.max(...matrices.map((i) => e.ratios?.[i] ?? -Infinity)));
    lines.push(`  - the largest norm-change ratio at each epoch's check: ${largest.map((r) => (Number.isFinite(r) ? fmt(r, 2) : '–')).join(' ')}`);
    for (const i of matrices) lines.push(`  - ${run.names[i] ?? `parameter ${i}`}: low in epochs ${ranges(withLevels.filter((e) => e.levels[i] === s.low).map((e) => e.epoch))}`);
  }
  return lines;
}

/** The report's file name without its extension: reproduce-SETTING, then the device unless the CPU, then -quick. */
const reportName = (s) => `reproduce-${s.name}${s.device && s.device !== 'cpu' ? `-${s.device.replace(':', '')}` : ''}${s.quick ? '-quick' : ''}`;

/** Writes RESULTS/reportName(s).md and .png from the setting's finished runs. */
export async function writeSettingReport(s, o) {
  fs.mkdirSync(o.results, { recursive: true });
  const metric = metricOf(s);
  const CONFIGS = configsOf(s);
  const configs = Object.keys(CONFIGS).filter((c) => o.seeds.some((seed) => finished(runDir(o.dir, s, c, seed))));
  const runs = {};
  for (const c of configs) runs[c] = Object.fromEntries(o.seeds.filter((seed) => finished(runDir(o.dir, s, c, seed))).map((seed) => [seed, readRun(runDir(o.dir, s, c, seed), metric)]));
  if (!runs.low || !Object.keys(runs.low).length) throw new Error(`no finished static-low run of ${s.name} (${s.tag}) under ${o.dir}: run it first`);
  const lowFloats = meanInterval(Object.values(runs.low).map((r) => r.floats)).mean;
  const paired = (a, b) => o.seeds.filter((seed) => runs[a]?.[seed] && runs[b]?.[seed]).map((seed) => metric.diff(runs[a][seed].quality, runs[b][seed].quality));
  const adaptive = ['accordion', 'auto', 'smith', ...Object.keys(s.extra ?? {})].filter((c) => runs[c]);

  const lines = [];
  const say = (...l) => lines.push(...l);
  say(`# ${s.name}: ${s.model}, ${describeLevels(s)}${s.quick ? ' (quick mode: not to be quoted)' : ''}`, '');
  say(`Written by \`node bench/reproduce.js report ${s.name}${s.quick ? ' --quick' : ''}${s.device && s.device !== 'cpu' ? ` --device ${s.device}` : ''}\` on ${new Date().toISOString().slice(0, 10)} from the runs under ` +
    `\`${path.relative(process.cwd(), path.join(o.dir, s.name, s.tag))}\` (${os.cpus()[0]?.model ?? 'unknown CPU'}, ${os.cpus().length} cores, shared: minutes are indicative).`, '');
  const data = s.kind === 'language'
    ? `the LSTM (hidden ${s.hidden}) on ${path.basename(s.text)} split 90/5/5, ${WORKERS} workers × ${s.batchSize} columns`
    : `width ${s.width}, the first ${s.trainImages.toLocaleString('en-US')} Fashion-MNIST training images, ${s.testImages ? `the first ${s.testImages.toLocaleString('en-US')} test images` : 'the whole 10,000-image test set'}, ${WORKERS} workers × batch ${s.batchSize}`;
  say(`Setting: ${data}, ${s.epochs} epochs; schedule arguments \`${scheduleArgs(s).join(' ')}\`. Paper: ${s.paper.source}.`, '');

  say(`## Final ${metric.name}`, '');
  const columns = [{ key: 'run', title: 'run', align: 'left' }, ...o.seeds.map((seed) => ({ key: `s${seed}`, title: `seed ${seed}` })),
    { key: 'mean', title: 'mean' }, { key: 'lastThree', title: 'mean of last 3 evals' }, { key: 'floats', title: 'floats / worker' },
    { key: 'factor', title: '× static low' }, { key: 'minutes', title: 'minutes / run' }, { key: 'paper', title: 'paper' }];
  const rows = configs.map((c) => {
    const got = Object.values(runs[c]);
    const mean = (f) => got.reduce((a, r) => a + f(r), 0) / got.length;
    const paper = s.paper[c];
    const row = {
      run: `${TITLES[c]} (${CONFIGS[c](s).join(' ') || 'dense'})`,
      mean: metric.show(mean((r) => r.quality)),
      lastThree: metric.show(mean((r) => r.lastThree)),
      floats: `${fmt(mean((r) => r.floats) / 1e6, 2)}M`,
      factor: fmt(mean((r) => r.floats) / lowFloats, 3),
      minutes: fmt(mean((r) => r.minutes), 1),
      paper: paper === undefined ? '' : `${metric.show(paper)}${c === 'accordion' && s.paper.floatsFactor ? ` at ${fmt(s.paper.floatsFactor, 2)}×` : ''}`,
    };
    for (const seed of o.seeds) row[`s${seed}`] = runs[c][seed] ? metric.show(runs[c][seed].quality) : '';
    return row;
  });
  say(formatTable(columns, rows, { markdown: true }), '');

  say(`## Paired differences (${metric.unit}${byPerplexity(s) ? ', positive: lower perplexity' : ''}, per seed)`, '');
  const verdicts = {};
  const diffRows = [];
  const addDiff = (a, b, bound, key) => {
    const d = paired(a, b);
    if (!d.length) return;
    const v = decideAtLeast(d, bound);
    verdicts[key] = v;
    diffRows.push({ pair: `${TITLES[a]} − ${TITLES[b]}`, seeds: d.map((x) => signed(x)).join(', '), mean: signed(v.mean), ci: interval(v), goal: Number.isFinite(bound) ? `≥ ${signed(bound, 1)}: ${v.verdict}` : '' });
  };
  addDiff('high', 'low', -Infinity, 'separation');
  for (const c of adaptive) addDiff(c, 'low', metric.goal, c);
  if (runs.auto && runs.accordion) addDiff('auto', 'accordion', 0, 'autoOverAccordion');
  addDiff('equal', 'low', -Infinity, 'equal');
  for (const [a, b] of s.pairs ?? []) addDiff(a, b, metric.goal, `${a}:${b}`);
  say(formatTable([{ key: 'pair', title: 'A − B', align: 'left' }, { key: 'seeds', title: 'per seed', align: 'left' }, { key: 'mean', title: 'mean' },
    { key: 'ci', title: '95% interval' }, { key: 'goal', title: 'goal', align: 'left' }], diffRows, { markdown: true }), '');

  say('## Goals', '');
  const factorOf = (c) => meanInterval(Object.values(runs[c]).map((r) => r.floats)).mean / lowFloats;
  const sep = verdicts.separation;
  const separated = sep !== undefined && sep.mean <= metric.separation;
  if (sep) {
    const collapse = s.model === 'vgg19bn';
    say(`- **Separation** (static high at least ${byPerplexity(s) ? '5% worse in perplexity than' : '1 point below'} static low on the mean${collapse ? '; a collapse needs 5 points' : ''}): ` +
      `${signed(sep.mean)}: ${separated ? 'separated' : 'NOT separated: a result of the adaptive runs here is no evidence'}` +
      `${collapse && sep.mean > -5 ? '; collapse not reproduced (rank 1 within 5 points of rank 4)' : ''}.`);
  }
  for (const c of adaptive) {
    const v = verdicts[c];
    say(`- **${TITLES[c]} − static low ≥ ${signed(metric.goal, 1)} ${metric.unit}** (decided by the 95% interval): ${v.verdict} (mean ${signed(v.mean)}, ${interval(v)})` +
      `${separated ? '' : ' — no evidence: the static levels are not separated'}.`);
    if (c !== 'smith') say(`- **${TITLES[c]}'s floats ≤ 0.7 × static low's**: ${fmt(factorOf(c), 3)}× — ${factorOf(c) <= 0.7 ? 'met' : 'not met'}.`);
  }
  if (verdicts.autoOverAccordion)
    say(`- **Automatic levels at least as good as Accordion with fewer floats**: ${verdicts.autoOverAccordion.verdict} (mean ${signed(verdicts.autoOverAccordion.mean)}, ` +
      `${interval(verdicts.autoOverAccordion)}); floats ${fmt(factorOf('auto') / factorOf('accordion'), 3)}× Accordion's — ${factorOf('auto') < factorOf('accordion') ? 'fewer' : 'NOT fewer'}.`);
  if (s.model === 'vgg19bn' && sep && runs.accordion) {
    const perSeed = o.seeds.filter((seed) => runs.accordion[seed] && runs.high?.[seed] && runs.low?.[seed])
      .map((seed) => (100 * (runs.accordion[seed].quality - runs.high[seed].quality)) / (runs.low[seed].quality - runs.high[seed].quality));
    const r = meanInterval(perSeed);
    say(`- **Accordion recovers ≥ 80% of the gap from static high to static low**: ${fmt(r.mean, 1)}% (per seed ${perSeed.map((x) => `${fmt(x, 1)}%`).join(', ')}; ` +
      `${r.n > 1 ? `95% interval ${fmt(r.low, 1)} … ${fmt(r.high, 1)}` : 'one seed'}) — ${r.n > 1 && r.low >= 80 ? 'met' : r.n > 1 && r.high < 80 ? 'not met' : 'undecided'}.`);
  }
  for (const [a, b] of s.pairs ?? [])
    if (verdicts[`${a}:${b}`]) say(`- **${TITLES[a]} − ${TITLES[b]} ≥ ${signed(metric.goal, 1)} ${metric.unit}**: ${verdicts[`${a}:${b}`].verdict} (mean ${signed(verdicts[`${a}:${b}`].mean)}, ${interval(verdicts[`${a}:${b}`])}).`);
  if (verdicts.equal) say(`- **Accordion with both levels low equals static low**: differences ${paired('equal', 'low').map((x) => signed(x)).join(', ')} (bit for bit: \`node bench/reproduce.js check ${s.name}\`).`);
  say('');

  for (const c of adaptive.filter((c) => c !== 'auto')) say(`## What ${TITLES[c]} did`, '', ...adaptiveStory(s, runs[c]), '');

  const chart = drawChart(s, o, configs.filter((c) => c !== 'equal'));
  if (chart) say(`![${s.name}, seed ${o.seeds[0]}](${path.basename(chart)})`, '', `The chart: seed ${o.seeds[0]}'s runs as \`accordion report\` draws them (${metric.name} against epochs, floats and time; each layer's level over the epochs).`, '');

  const file = path.join(o.results, `${reportName(s)}.md`);
  fs.writeFileSync(file, lines.join('\n'));
  console.log(lines.join('\n'));
  console.log(`\nwritten to ${path.relative(process.cwd(), file)}`);
}

/** The first seed's runs as `accordion report` draws them, photographed into RESULTS/reportName(s).png. */
function drawChart(s, o, configs) {
  const seed = o.seeds[0];
  const dirs = configs.map((c) => runDir(o.dir, s, c, seed)).filter(finished);
  if (!dirs.length) return null;
  const html = path.join(o.dir, s.name, s.tag, `report-seed${seed}.html`);
  const cli = path.join(BENCH_DIR, '..', 'lib', 'cli.js');
  const made = spawnSync(process.execPath, [cli, 'report', ...dirs, '--out', html], { encoding: 'utf8' });
  if (made.status !== 0) {
    console.error(`accordion report could not draw the runs (${made.stderr.trim().split('\n').pop()}): the report has no chart`);
    return null;
  }
  const png = path.join(o.results, `${reportName(s)}.png`);
  const shot = spawnSync('/usr/bin/chromium', ['--headless', '--no-sandbox', '--disable-gpu', '--hide-scrollbars', '--disable-background-networking',
    '--disable-component-update', '--no-first-run', '--window-size=1100,3600', `--screenshot=${png}`, `file://${html}`], { encoding: 'utf8', timeout: 120_000 });
  if (shot.status !== 0 || !fs.existsSync(png)) {
    console.error(`chromium could not draw the chart (${shot.stderr?.trim().split('\n').pop()}): the report is ${html}`);
    return null;
  }
  return png;
}
