/**
 * `accordion report RUN_DIR [RUN_DIR …]`: one self-contained HTML file with the plots of the paper's
 * figures, built from the runs' metrics logs alone:
 *   1. test accuracy against epochs (every run),
 *   2. test accuracy against floats communicated (every run),
 *   3. test accuracy against wall-clock seconds (every run: compare runs over one network),
 *   4. each layer's compression level over the epochs (first run with Accordion), as a heatmap,
 *   5. each layer's norm-change ratio at the check epochs, with η marked,
 *   6. the link as training measured it (runs of several workers).
 * A section without data (a run without compression, one worker) is left out. Charts are drawn by Chart.js (and its matrix plugin for the heatmap), inlined into the file.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { createRequire } from 'node:module';
import { readMetricsLog, type MetricsEvent } from '../base/metrics.js';
import { DataError, UsageError } from '../base/errors.js';
import { writeFileAtomicAsync } from '../base/files.js';
import { formatRate } from '../base/units.js';
import { DENSE_BF16, compressionSpec, describeLevel, levelTitle } from '../config/compression.js';
import { DEFAULT_CONFIG, OPTIONS, type CompressorName, type TrainConfig } from '../config/options.js';

export interface RunSeries {
  name: string;
  compressor: string;
  /** How its levels read: "PowerSGD rank", "TopK ratio". */
  levelTitle: string;
  accordion: boolean;
  eta: number;
  parameterNames: string[];
  matrices: boolean[];
  epochs: {
    epoch: number;
    testAccuracy: number;
    floatsSentTotal: number;
    /** Seconds from the run's start to the end of this epoch (its evaluation included), not counting
     * the time a stopped run lay idle before it was resumed; null in logs without times. */
    wallSeconds: number | null;
    levels?: number[];
    ratios?: (number | null)[];
    /** The link training measured over the epoch (several workers): bits a second (null: unknown) and latency. */
    link?: { bitsPerSecond: number | null; latencySeconds: number };
  }[];
}

/** Where the report's warnings go: a process warning unless the caller takes them. */
export type WarningSink = (message: string) => void;

const processWarning: WarningSink = (message) => process.emitWarning(message, { code: 'ACCORDION_TORN_METRICS' });

/**
 * The data of one run directory's metrics log. A last line torn by a killed run is left out with a
 * warning; a malformed log is a DataError naming the file and line.
 */
export function loadRun(runDir: string, warn: WarningSink = processWarning): RunSeries {
  const file = path.join(runDir, 'metrics.jsonl');
  if (!fs.existsSync(file)) throw new UsageError(`${runDir} is not a run directory (no metrics.jsonl)`);
  const { events, lines, tornLine } = readMetricsLog(file);
  if (tornLine !== undefined)
    warn(`${file}: line ${tornLine} is incomplete (the run was stopped while writing it); the report uses the ${events.length} complete lines`);
  const start = [...events].reverse().find((e) => e.event === 'start' || e.event === 'resume') as MetricsEvent | undefined;
  if (!start) throw new UsageError(`${file} has no start event`);
  // A resumed run logs some epochs again; the last record of an epoch wins. Its clock goes on
  // from where the epoch it resumed after had brought it.
  const byEpoch = new Map<number, RunSeries['epochs'][number]>();
  let segmentStart = NaN;
  let offset = 0;
  for (const [index, e] of events.entries()) {
    if (e.event === 'epoch') checkEpochRecord(e, `${file}: line ${lines[index]}`);
    const time = typeof e.time === 'string' ? Date.parse(e.time) : NaN;
    if (e.event === 'start' || e.event === 'resume') {
      segmentStart = time;
      offset = e.event === 'resume' ? (byEpoch.get(Number(e.epochsCompleted))?.wallSeconds ?? 0) : 0;
      continue;
    }
    if (e.event !== 'epoch') continue;
    const wall = offset + (time - segmentStart) / 1000;
    const link = e.link as { bytesPerSecond?: number; latencySeconds: number } | undefined;
    byEpoch.set(e.epoch as number, {
      epoch: e.epoch as number,
      testAccuracy: e.testAccuracy as number,
      floatsSentTotal: e.floatsSentTotal as number,
      wallSeconds: Number.isFinite(wall) ? wall : null,
      levels: e.levels as number[] | undefined,
      ratios: e.ratios as (number | null)[] | undefined,
      ...(link ? { link: { bitsPerSecond: link.bytesPerSecond === undefined ? null : 8 * link.bytesPerSecond, latencySeconds: link.latencySeconds } } : {}),
    });
  }
  const accordion = Boolean(start.accordion);
  const compressor = String(start.compressor ?? 'none');
  const kind = OPTIONS.compressor.choices!.includes(compressor) ? (compressor as CompressorName) : 'none';
  const details = [compressor];
  if (start.adapt === 'auto') details.push('automatic levels');
  else if (accordion) details.push('Accordion');
  else if (kind !== 'none') details.push(describeLevel(kind, compressionSpec({ ...DEFAULT_CONFIG, ...(start as Partial<TrainConfig>), compressor: kind }).reference));
  const shaped = clusterLink(runDir);
  if (shaped) details.push(shaped);
  return {
    name: `${path.basename(path.resolve(runDir))} (${details.join(', ')})`,
    compressor,
    levelTitle: levelTitle(kind),
    accordion,
    eta: Number(start.eta ?? 0.5),
    parameterNames: (start.parameterNames as string[] | undefined) ?? [],
    matrices: (start.matrices as boolean[] | undefined) ?? [],
    epochs: [...byEpoch.values()].sort((a, b) => a.epoch - b.epoch),
  };
}

/** An epoch record's figures that the charts draw: numbers of the right kind, or a DataError naming `where`. */
function checkEpochRecord(e: MetricsEvent, where: string): void {
  const wrong = (field: string, what: string) => new DataError(`${where}: the epoch record's "${field}" is ${JSON.stringify(e[field])}, not ${what}`);
  if (!Number.isInteger(e.epoch) || (e.epoch as number) < 0) throw wrong('epoch', 'an epoch number');
  if (typeof e.testAccuracy !== 'number' || !Number.isFinite(e.testAccuracy)) throw wrong('testAccuracy', 'a number');
  if (typeof e.floatsSentTotal !== 'number' || !Number.isFinite(e.floatsSentTotal) || e.floatsSentTotal < 0) throw wrong('floatsSentTotal', 'a count of floats');
  if (e.time !== undefined && (typeof e.time !== 'string' || Number.isNaN(Date.parse(e.time)))) throw wrong('time', 'a time');
  for (const key of ['levels', 'ratios'] as const)
    if (e[key] !== undefined && !(Array.isArray(e[key]) && (e[key] as unknown[]).every((v) => v === null || typeof v === 'number'))) throw wrong(key, 'a list of numbers');
}

/**
 * "100 Mbit/s" for a run made by `accordion cluster` (its network.jsonl names the hosts' link), or
 * with a schedule "1 Gbit/s, then 100 Mbit/s from 60 s" (host 0's changes of rate).
 */
function clusterLink(runDir: string): string | undefined {
  const file = path.join(runDir, 'network.jsonl');
  if (!fs.existsSync(file)) return undefined;
  // The network log is a side record: a damaged line only loses its part of the label.
  const records = fs.readFileSync(file, 'utf8').split('\n').flatMap((line) => {
    try {
      return [JSON.parse(line) as { event?: unknown; host?: unknown; bitsPerSecond?: unknown; atSeconds?: unknown }];
    } catch {
      return [];
    }
  });
  const first = records[0]?.bitsPerSecond;
  if (typeof first !== 'number') return undefined;
  const later = records
    .filter((r) => r.event === 'rate' && r.host === 0 && typeof r.bitsPerSecond === 'number' && typeof r.atSeconds === 'number')
    .map((r) => `${formatRate(r.bitsPerSecond as number)} from ${r.atSeconds} s`);
  return later.length ? `${formatRate(first)}, then ${later.join(', ')}` : formatRate(first);
}

/** A browser build shipped next to a package's main file, as inline script text. */
export function inlineScript(require: NodeRequire, pkg: string, file: string): string {
  const text = fs.readFileSync(path.join(path.dirname(require.resolve(pkg)), file), 'utf8');
  // A closing script tag inside the library would end the inline script early.
  return text.replace(/<\/script/gi, '<\\/script');
}

export function renderReport(runs: RunSeries[]): string {
  if (runs.length === 0) throw new UsageError('a report needs at least one run directory');
  const require = createRequire(import.meta.url);
  const chartJs = inlineScript(require, 'chart.js', 'chart.umd.js');
  const matrixPlugin = inlineScript(require, 'chartjs-chart-matrix', 'chartjs-chart-matrix.min.js');
  const data = JSON.stringify(runs).replace(/</g, '\\u003c');
  // Sections without data are left out: levels need a compressed run, ratios an Accordion check,
  // the link several workers.
  const adaptive = runs.find((r) => r.accordion && r.epochs.some((e) => e.levels)) ?? runs.find((r) => r.epochs.some((e) => e.levels));
  const withLevels = adaptive !== undefined;
  const withRatios = adaptive?.epochs.some((e) => e.ratios?.some((x) => x !== null)) ?? false;
  const withLink = runs.some((r) => r.epochs.some((e) => e.link));
  const section = (shown: boolean, html: string) => (shown ? html : '');
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>accordion-engine report</title>
<style>
  body { font-family: system-ui, sans-serif; margin: 2rem; color: #222; }
  h1 { font-size: 1.4rem; } h2 { font-size: 1.1rem; margin-top: 2rem; }
  .chart { position: relative; height: 360px; max-width: 960px; }
  .tall { height: 560px; }
  p.note { color: #555; max-width: 960px; }
</style>
<script>${chartJs}</script>
<script>${matrixPlugin}</script>
</head>
<body>
<h1>accordion-engine report</h1>
<p class="note" id="runs"></p>
<h2>Test accuracy against epochs</h2>
<div class="chart"><canvas id="accuracy-epochs"></canvas></div>
<h2>Test accuracy against floats communicated (per worker)</h2>
<div class="chart"><canvas id="accuracy-floats"></canvas></div>
<h2>Test accuracy against wall-clock time</h2>
<div class="chart"><canvas id="accuracy-wall"></canvas></div>
${section(withLevels, `<h2>Compression level of each layer over the epochs</h2>
<p class="note" id="heatmap-note"></p>
<div class="chart tall"><canvas id="levels-heatmap"></canvas></div>`)}
${section(withRatios, `<h2>Norm-change ratio per layer at the check epochs</h2>
<p class="note" id="ratio-note"></p>
<div class="chart"><canvas id="norm-ratios"></canvas></div>`)}
${section(withLink, `<h2>The link as training measured it</h2>
<p class="note" id="link-note"></p>
<div class="chart"><canvas id="link"></canvas></div>`)}
<script>
const runs = ${data};
// Charts are drawn in their final state at once: a screenshot or a print taken as the page opens
// shows whole curves.
Chart.defaults.animation = false;
// Epochs are whole numbers: no ticks between them.
const epochTicks = { stepSize: 1, callback: (v) => (Number.isInteger(v) ? v : '') };
const palette = ['#1f77b4', '#d62728', '#2ca02c', '#9467bd', '#ff7f0e', '#8c564b', '#e377c2', '#17becf'];
document.getElementById('runs').textContent = 'Runs: ' + runs.map((r) => r.name).join('; ');
const charts = {};
charts.accuracyEpochs = new Chart(document.getElementById('accuracy-epochs'), {
  type: 'line',
  data: { datasets: runs.map((r, i) => ({ label: r.name, borderColor: palette[i % palette.length], data: r.epochs.map((e) => ({ x: e.epoch, y: 100 * e.testAccuracy })) })) },
  options: { maintainAspectRatio: false, parsing: true, scales: { x: { type: 'linear', ticks: epochTicks, title: { display: true, text: 'epoch' } }, y: { title: { display: true, text: 'test accuracy (%)' } } } },
});
charts.accuracyFloats = new Chart(document.getElementById('accuracy-floats'), {
  type: 'line',
  data: { datasets: runs.map((r, i) => ({ label: r.name, borderColor: palette[i % palette.length], data: r.epochs.map((e) => ({ x: e.floatsSentTotal, y: 100 * e.testAccuracy })) })) },
  options: { maintainAspectRatio: false, scales: { x: { type: 'logarithmic', title: { display: true, text: 'floats communicated (cumulative)' } }, y: { title: { display: true, text: 'test accuracy (%)' } } } },
});
charts.accuracyWall = new Chart(document.getElementById('accuracy-wall'), {
  type: 'line',
  data: { datasets: runs.map((r, i) => ({ label: r.name, borderColor: palette[i % palette.length], data: r.epochs.filter((e) => e.wallSeconds !== null).map((e) => ({ x: e.wallSeconds, y: 100 * e.testAccuracy })) })) },
  options: { maintainAspectRatio: false, scales: { x: { type: 'linear', title: { display: true, text: 'wall-clock seconds since the run began' } }, y: { title: { display: true, text: 'test accuracy (%)' } } } },
});
const adaptive = runs.find((r) => r.accordion && r.epochs.some((e) => e.levels)) || runs.find((r) => r.epochs.some((e) => e.levels));
if (adaptive) {
  const layers = adaptive.parameterNames.map((name, i) => ({ name, i })).filter((l) => adaptive.matrices[l.i]);
  const cells = [];
  const epochLabels = adaptive.epochs.map((e) => String(e.epoch));
  for (const e of adaptive.epochs) if (e.levels) for (const l of layers) cells.push({ x: String(e.epoch), y: l.name, v: e.levels[l.i] });
  // Level 0 is a matrix sent dense (automatic levels): no compression at all, drawn darkest; level
  // ${DENSE_BF16}, dense in bf16, next to it.
  const values = cells.map((c) => c.v).filter((v) => v > 0);
  const lo = values.length ? Math.min(...values) : 0, hi = values.length ? Math.max(...values) : 0;
  const dense = cells.some((c) => c.v === 0), denseBf16 = cells.some((c) => c.v === ${DENSE_BF16});
  // Darker is less compression (a higher PowerSGD rank or TopK ratio); compressed levels span 0.2 to 0.8.
  const shade = (v) => 'rgba(31, 119, 180, ' + (v === 0 ? 1 : v === ${DENSE_BF16} ? 0.9 : hi === lo ? 0.8 : 0.2 + 0.6 * (v - lo) / (hi - lo)).toFixed(3) + ')';
  const show = (v) => (v === 0 ? 'dense' : v === ${DENSE_BF16} ? 'dense in bf16' : v);
  const unit = adaptive.levelTitle + ' ';
  const levelsUsed = [...new Set(values)].sort((a, b) => a - b);
  document.getElementById('heatmap-note').textContent = adaptive.name + ': darker cells are lower compression' +
    (dense ? ' (darkest: sent dense' + (denseBf16 ? '; next: dense in bf16)' : ')') : denseBf16 ? ' (darkest: dense in bf16)' : '') +
    '; levels used: ' + unit + levelsUsed.join(', ') + (denseBf16 ? ', dense in bf16' : '') + (dense ? ', dense' : '') + '.';
  charts.levels = new Chart(document.getElementById('levels-heatmap'), {
    type: 'matrix',
    data: { datasets: [{ label: 'level', data: cells, backgroundColor: (ctx) => shade(ctx.raw.v), borderWidth: 1, borderColor: '#fff',
      width: ({ chart }) => (chart.chartArea || {}).width / epochLabels.length - 1,
      height: ({ chart }) => (chart.chartArea || {}).height / layers.length - 1 }] },
    options: { maintainAspectRatio: false, plugins: { legend: { display: false }, tooltip: { callbacks: { label: (ctx) => ctx.raw.y + ' epoch ' + ctx.raw.x + ': ' + show(ctx.raw.v) } } },
      scales: { x: { type: 'category', labels: epochLabels, offset: true, grid: { display: false }, title: { display: true, text: 'epoch' } },
                y: { type: 'category', labels: layers.map((l) => l.name), offset: true, grid: { display: false }, ticks: { autoSkip: false, font: { size: 9 } } } } },
  });
  if (document.getElementById('norm-ratios')) {
    const ratioSets = layers.map((l, k) => ({ label: l.name, showLine: true, borderColor: palette[k % palette.length], backgroundColor: palette[k % palette.length],
      data: adaptive.epochs.filter((e) => e.ratios && e.ratios[l.i] !== null && e.ratios[l.i] !== undefined).map((e) => ({ x: e.epoch, y: e.ratios[l.i] })) }));
    const checks = adaptive.epochs.filter((e) => e.ratios && e.ratios.some((r) => r !== null)).map((e) => e.epoch);
    ratioSets.push({ label: 'η = ' + adaptive.eta, borderColor: '#000', borderDash: [6, 4], pointRadius: 0, showLine: true,
      data: checks.length ? [{ x: Math.min(...checks), y: adaptive.eta }, { x: Math.max(...checks), y: adaptive.eta }] : [] });
    document.getElementById('ratio-note').textContent = adaptive.name + ': |old − curr| / old of each layer\\'s accumulated-gradient norm; at or above η (dashed) the layer is in a critical regime and gets low compression.';
    charts.ratios = new Chart(document.getElementById('norm-ratios'), {
      type: 'scatter', data: { datasets: ratioSets },
      options: { maintainAspectRatio: false, plugins: { legend: { display: false } }, scales: { x: { ticks: epochTicks, title: { display: true, text: 'epoch' } }, y: { title: { display: true, text: 'norm-change ratio' } } } },
    });
  }
}
// Per epoch, from the exchange's own collectives: bandwidth (solid, left) and latency (dashed, right).
const measured = runs.filter((r) => r.epochs.some((e) => e.link));
const linkPoints = (r, value) => r.epochs.filter((e) => e.link && e.wallSeconds !== null && value(e.link) !== null).map((e) => ({ x: e.wallSeconds, y: value(e.link) }));
if (measured.length) {
  charts.link = new Chart(document.getElementById('link'), {
    type: 'line',
    data: { datasets: measured.flatMap((r) => {
      const color = palette[runs.indexOf(r) % palette.length];
      return [
        { label: r.name + ': Mbit/s', borderColor: color, yAxisID: 'rate', data: linkPoints(r, (l) => (l.bitsPerSecond === null ? null : l.bitsPerSecond / 1e6)) },
        { label: r.name + ': latency (ms)', borderColor: color, borderDash: [6, 4], yAxisID: 'latency', data: linkPoints(r, (l) => 1000 * l.latencySeconds) },
      ];
    }) },
    options: { maintainAspectRatio: false, scales: {
      x: { type: 'linear', title: { display: true, text: 'wall-clock seconds since the run began' } },
      rate: { position: 'left', beginAtZero: true, title: { display: true, text: 'bandwidth (Mbit/s)' } },
      latency: { position: 'right', beginAtZero: true, grid: { drawOnChartArea: false }, title: { display: true, text: 'latency (ms)' } } } },
  });
  document.getElementById('link-note').textContent =
    'Per epoch, from the gradient exchange of rank 0: the rate at which a collective moves bytes once under way, and the time of one that carries almost nothing; waiting for a late peer is left out of both.';
}
window.reportCharts = charts;
</script>
</body>
</html>
`;
}

/**
 * Writes the report of `runDirs` to `out` (default: report.html in the first run directory),
 * atomically and off the event loop; resolves to the file written. Warnings (a torn last line in a
 * metrics log) go to `onWarning`, by default a process warning.
 */
export async function writeReport(runDirs: string[], out?: string, options: { onWarning?: WarningSink } = {}): Promise<string> {
  const runs = runDirs.map((dir) => loadRun(dir, options.onWarning));
  const file = out ?? path.join(runDirs[0]!, 'report.html');
  await writeFileAtomicAsync(file, [renderReport(runs)], UsageError);
  return file;
}
