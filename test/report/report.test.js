import { expect } from 'chai';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { spawnSync } from 'node:child_process';
import { Trainer } from '../../lib/index.js';
import { writeReport, loadRun } from '../../lib/report/report.js';
import { CHROMIUM, requireChromium } from '../helpers/outside.js';
import { CLI } from '../helpers/paths.js';

describe('HTML report', function () {
  let tmp, accordionRun, staticRun;
  before(async function () {
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'acc-report-'));
    const common = {
      model: 'resnet18',
      dataset: 'synthetic',
      dataDir: path.join(tmp, 'data'),
      syntheticTrain: 64,
      syntheticTest: 32,
      batchSize: 32,
      evalBatchSize: 32,
      epochs: 4,
      progress: false,
      compressor: 'powersgd',
    };
    accordionRun = path.join(tmp, 'accordion');
    staticRun = path.join(tmp, 'static');
    for (const [outDir, extra] of [[accordionRun, { accordionInterval: 1 }], [staticRun, { rank: 1 }]]) {
      const trainer = await Trainer.create({ ...common, ...extra, outDir });
      await trainer.fit();
      await trainer.dispose();
    }
  });
  after(() => fs.rmSync(tmp, { recursive: true, force: true }));

  it('reads levels, ratios and floats of every epoch from the metrics log', function () {
    const run = loadRun(accordionRun);
    expect(run.accordion).to.equal(true);
    expect(run.epochs.map((e) => e.epoch)).to.deep.equal([1, 2, 3, 4]);
    expect(run.epochs[0].levels.filter((l, i) => run.matrices[i])).to.satisfy((levels) => levels.every((l) => l === 2));
    expect(run.epochs[1].ratios.filter((r, i) => run.matrices[i] && r !== null).length).to.equal(21);
    expect(run.epochs[3].floatsSentTotal).to.be.above(run.epochs[0].floatsSentTotal);
    expect(loadRun(staticRun).accordion).to.equal(false);
  });

  it('opens in headless Chromium without console errors and shows the plots that have data: one worker, no link', async function () {
    requireChromium();
    const file = await writeReport([accordionRun, staticRun], path.join(tmp, 'report.html'));
    const { problems, charts } = await openReport(file);
    expect(problems).to.deep.equal([]);
    expect(Object.keys(charts)).to.have.members(['accuracyEpochs', 'accuracyFloats', 'accuracyWall', 'levels', 'ratios']);
    expect(fs.readFileSync(file, 'utf8')).to.not.include('The link as training measured it');
    for (const [name, chart] of Object.entries(charts)) expect(chart.unfinished, `${name}: points still animating`).to.equal(0);
    expect(charts.accuracyEpochs.points).to.deep.equal([4, 4]); // both runs, every epoch
    expect(charts.accuracyFloats.points).to.deep.equal([4, 4]);
    expect(charts.accuracyWall.points).to.deep.equal([4, 4]);
    expect(charts.levels.type).to.equal('matrix');
    expect(charts.levels.points).to.deep.equal([21 * 4]); // every weight matrix, every epoch
    expect(charts.ratios.points.slice(0, -1).every((n) => n === 3)).to.equal(true); // checks after epochs 2-4
    expect(charts.ratios.points.at(-1)).to.equal(2); // the η line
    for (const c of Object.values(charts)) expect(c.width * c.height).to.be.above(0);
  });

  it('a heatmap of automatic levels: more than two levels, dense drawn darkest, dense in bf16 next; the link over time', async function () {
    requireChromium();
    const run = path.join(tmp, 'auto');
    fs.mkdirSync(run);
    const names = ['a.weight', 'a.bias', 'b.weight', 'c.weight'];
    const levels = [[2, 0, 2, 2], [1, 0, 4, 0], [0, 0, 8, -1]];
    const time = (s) => new Date(Date.UTC(2026, 0, 1, 0, 0, s)).toISOString();
    const lines = [{ event: 'start', time: time(0), epochsCompleted: 0, compressor: 'powersgd', accordion: true, adapt: 'auto', eta: 0.5, parameterNames: names, matrices: [true, false, true, true] }];
    // The link drops from 1 Gbit/s to 100 Mbit/s after the first epoch.
    const links = [125e6, 12.5e6, 12.5e6].map((bytesPerSecond) => ({ bytesPerSecond, latencySeconds: 0.0005, waitSeconds: 0, transferSeconds: 1, collectives: 10 }));
    levels.forEach((l, i) => lines.push({ event: 'epoch', time: time(10 * (i + 1)), epoch: i + 1, testAccuracy: 0.1 * (i + 1), floatsSentTotal: 1000 * (i + 1), levels: l, link: links[i] }));
    fs.writeFileSync(path.join(run, 'metrics.jsonl'), lines.map((l) => JSON.stringify(l) + '\n').join(''));
    const file = await writeReport([run, staticRun], path.join(tmp, 'auto.html'));
    const { problems, charts, heatmap } = await openReport(file);
    expect(problems).to.deep.equal([]);
    expect(charts.levels.points).to.deep.equal([3 * 3]);
    const alpha = (cell) => Number(/rgba\([^)]*, ([\d.]+)\)/.exec(cell.color)[1]);
    const at = (y, x) => heatmap.cells.find((c) => c.y === y && c.x === x);
    expect(alpha(at('a.weight', '3')), 'dense').to.equal(1);
    expect(alpha(at('b.weight', '3')), 'rank 8, the highest').to.equal(0.8);
    expect(alpha(at('a.weight', '2')), 'rank 1, the lowest').to.equal(0.2);
    expect(alpha(at('b.weight', '1'))).to.be.above(0.2).and.below(0.8);
    expect(alpha(at('c.weight', '3')), 'dense in bf16').to.equal(0.9);
    expect(heatmap.note).to.include('PowerSGD rank 1, 2, 4, 8, dense in bf16, dense');
    // The link: bandwidth and latency of the measured run, at its epochs' times.
    expect(charts.link.points).to.deep.equal([3, 3]);
    expect(charts.link.values[0]).to.deep.equal([{ x: 10, y: 1000 }, { x: 20, y: 100 }, { x: 30, y: 100 }]);
    expect(heatmap.note).to.include('auto (powersgd, automatic levels)');
  });
});

/** Opens a report in headless Chromium: console errors, each chart's type, points per dataset and size, and the heatmap's cells. */
async function openReport(file) {
  const html = fs.readFileSync(file, 'utf8');
  expect(html).to.not.match(/<script[^>]+src=/); // self-contained
  const { chromium } = await import('playwright-core');
  const browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--no-first-run'],
  });
  try {
    const page = await browser.newPage();
    const problems = [];
    page.on('console', (m) => m.type() === 'error' && problems.push(m.text()));
    page.on('pageerror', (e) => problems.push(e.message));
    await page.goto('file://' + file);
    await page.waitForFunction(() => window.reportCharts !== undefined);
    const charts = await page.evaluate(() =>
      Object.fromEntries(
        Object.entries(window.reportCharts).map(([name, chart]) => [
          name,
          {
            type: chart.config.type,
            points: chart.data.datasets.map((d) => d.data.length),
            values: chart.config.type === 'matrix' ? [] : chart.data.datasets.map((d) => d.data),
            width: chart.width,
            height: chart.height,
            // Points of the line and scatter charts not yet at their value's pixel: a chart still
            // animating shows unfinished curves to a screenshot or a print.
            unfinished: chart.config.type === 'matrix' ? 0 : chart.data.datasets.flatMap((d, k) =>
              chart.getDatasetMeta(k).data.filter((el, i) => Math.abs(el.y - chart.scales[chart.getDatasetMeta(k).yAxisID].getPixelForValue(d.data[i].y)) > 0.5)).length,
          },
        ]),
      ),
    );
    const heatmap = await page.evaluate(() => {
      const chart = window.reportCharts.levels;
      if (!chart) return null;
      const set = chart.data.datasets[0];
      return {
        note: document.getElementById('heatmap-note').textContent,
        cells: set.data.map((cell, index) => ({ ...cell, color: set.backgroundColor({ raw: cell, dataIndex: index }) })),
      };
    });
    return { problems, charts, heatmap };
  } finally {
    await browser.close();
  }
}

describe('report of a damaged metrics log', function () {
  let tmp;
  before(() => (tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'acc-report-log-'))));
  after(() => fs.rmSync(tmp, { recursive: true, force: true }));

  const start = JSON.stringify({ event: 'start', epochsCompleted: 0, compressor: 'none', accordion: false, parameterNames: [], matrices: [] });
  const epoch = (e) => JSON.stringify({ event: 'epoch', epoch: e, testAccuracy: 0.1 * e, floatsSentTotal: 0 });

  /** `accordion report` on a run directory whose metrics.jsonl holds `text` (a directory when null). */
  function report(name, text) {
    const run = path.join(tmp, name);
    fs.mkdirSync(run);
    const log = path.join(run, 'metrics.jsonl');
    if (text === null) fs.mkdirSync(log);
    else fs.writeFileSync(log, text);
    const r = spawnSync(process.execPath, [CLI, 'report', run], { encoding: 'utf8', timeout: 60000 });
    return { code: r.status, stdout: r.stdout, stderr: r.stderr, run, log };
  }

  it('a last line torn by a killed run: the report uses the complete lines and warns on stderr', function () {
    const r = report('torn', `${start}\n${epoch(1)}\n${epoch(2)}\n{"event":"epoch","epo`);
    expect(r.code, r.stderr).to.equal(0);
    expect(r.stderr).to.include(`accordion: warning: ${r.log}: line 4 is incomplete`);
    expect(r.stderr).to.include('uses the 3 complete lines');
    const html = fs.readFileSync(path.join(r.run, 'report.html'), 'utf8');
    const runs = JSON.parse(/const runs = (.*);\n/.exec(html)[1]);
    expect(runs[0].epochs.map((e) => e.epoch)).to.deep.equal([1, 2]);
  });

  for (const [name, text, message] of [
    ['null-line', `${start}\nnull\n${epoch(0)}\n`, /metrics\.jsonl: line 2 is not a JSON object \(got null\)/],
    ['array-line', `${start}\n${epoch(0)}\n[1,2]\n`, /metrics\.jsonl: line 3 is not a JSON object/],
    ['nameless-line', `${start}\n{"epoch":3}\n`, /metrics\.jsonl: line 2 has no "event" name/],
    ['bad-json-inside', `${start}\n{"event":\n${epoch(0)}\n`, /metrics\.jsonl: line 2 is not valid JSON/],
    ['bad-json-last-complete', `${start}\n{"event":\n`, /metrics\.jsonl: line 2 is not valid JSON/],
    ['directory', null, /metrics\.jsonl is a directory, not a metrics log/],
    ['string-numbers', `${start}\n${epoch(1)}\n{"event":"epoch","epoch":"2","testAccuracy":0.2,"floatsSentTotal":0}\n`, /metrics\.jsonl: line 3: the epoch record's "epoch" is "2", not an epoch number/],
    ['string-accuracy', `${start}\n{"event":"epoch","epoch":1,"testAccuracy":"0.1","floatsSentTotal":0}\n`, /metrics\.jsonl: line 2: the epoch record's "testAccuracy" is "0.1", not a number/],
  ]) {
    it(`${name}: exit 1 with a message naming the file${text === null ? '' : ' and line'}, no stack trace`, function () {
      const r = report(name, text);
      expect(r.code, r.stderr).to.equal(1);
      expect(r.stderr).to.match(message);
      expect(r.stderr).to.include(path.join(tmp, name, 'metrics.jsonl'));
      expect(r.stderr).to.not.match(/^\s+at /m);
      expect(fs.existsSync(path.join(r.run, 'report.html'))).to.equal(false);
    });
  }
});

describe('report: accuracy against wall-clock time', function () {
  let tmp;
  before(() => (tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'acc-report-wall-'))));
  after(() => fs.rmSync(tmp, { recursive: true, force: true }));
  const at = (seconds) => new Date(Date.UTC(2026, 0, 1) + seconds * 1000).toISOString();
  const line = (event) => JSON.stringify(event) + '\n';

  it("each epoch's seconds since the run began; a resumed run's clock goes on from the epoch it resumed after, without the idle time", function () {
    const run = path.join(tmp, 'resumed');
    fs.mkdirSync(run);
    const common = { compressor: 'powersgd', accordion: false, rank: 2, parameterNames: [], matrices: [] };
    fs.writeFileSync(
      path.join(run, 'metrics.jsonl'),
      line({ time: at(0), event: 'start', epochsCompleted: 0, ...common }) +
        line({ time: at(10), event: 'epoch', epoch: 1, testAccuracy: 0.2, floatsSentTotal: 1 }) +
        line({ time: at(25), event: 'epoch', epoch: 2, testAccuracy: 0.3, floatsSentTotal: 2 }) +
        // Stopped during epoch 3 (never logged), resumed after 2 epochs an hour later.
        line({ time: at(3600), event: 'resume', epochsCompleted: 2, ...common }) +
        line({ time: at(3612), event: 'epoch', epoch: 3, testAccuracy: 0.4, floatsSentTotal: 3 }) +
        line({ time: at(3620.5), event: 'epoch', epoch: 4, testAccuracy: 0.5, floatsSentTotal: 4 }),
    );
    // A cluster run's network log names the link.
    fs.writeFileSync(path.join(run, 'network.jsonl'), line({ event: 'start', epochsCompleted: 0, host: 0, bitsPerSecond: 1e8 }));
    const series = loadRun(run);
    expect(series.epochs.map((e) => e.wallSeconds)).to.deep.equal([10, 25, 37, 45.5]);
    expect(series.name).to.equal('resumed (powersgd, rank 2, 100 Mbit/s)');
    // Over a bandwidth schedule, the link's changes as host 0's rate records give them (host 1's
    // and a damaged line add nothing).
    fs.appendFileSync(
      path.join(run, 'network.jsonl'),
      line({ event: 'rate', host: 0, bitsPerSecond: 1e9, atSeconds: 60 }) + line({ event: 'rate', host: 1, bitsPerSecond: 1e9, atSeconds: 60 }) + '{"event":"ra\n' +
        line({ event: 'rate', host: 0, bitsPerSecond: 1e7, atSeconds: 90 }),
    );
    expect(loadRun(run).name).to.equal('resumed (powersgd, rank 2, 100 Mbit/s, then 1 Gbit/s from 60 s, 10 Mbit/s from 90 s)');
  });

  it('a log without times has no wall-clock points, and its other plots are unchanged', function () {
    const run = path.join(tmp, 'timeless');
    fs.mkdirSync(run);
    fs.writeFileSync(
      path.join(run, 'metrics.jsonl'),
      line({ event: 'start', epochsCompleted: 0, compressor: 'topk', accordion: false, topkRatio: 0.1, parameterNames: [], matrices: [] }) +
        line({ event: 'epoch', epoch: 1, testAccuracy: 0.2, floatsSentTotal: 1 }),
    );
    const series = loadRun(run);
    expect(series.epochs).to.deep.equal([{ epoch: 1, testAccuracy: 0.2, floatsSentTotal: 1, wallSeconds: null, levels: undefined, ratios: undefined }]);
    expect(series.name).to.equal('timeless (topk, ratio 0.1)');
  });
});

describe('the report written by the run', function () {
  this.timeout(180000);
  let tmp;
  before(() => (tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'acc-report-run-'))));
  after(() => fs.rmSync(tmp, { recursive: true, force: true }));

  it('accordion train writes report.html into its run directory after every epoch and names it at the end; a dense run draws no levels, ratios or link', function () {
    const run = path.join(tmp, 'run');
    const r = spawnSync(process.execPath, [CLI, 'train', '--model', 'resnet18', '--width', '0.25', '--dataset', 'synthetic', '--data', path.join(tmp, 'data'),
      '--synthetic-train', '32', '--synthetic-test', '16', '--batch-size', '16', '--epochs', '2', '--quiet', '--out', run], { encoding: 'utf8', timeout: 120000 });
    expect(r.status, r.stderr).to.equal(0);
    const file = path.join(run, 'report.html');
    expect(r.stdout).to.include(`\nreport ${file}\n`);
    const html = fs.readFileSync(file, 'utf8');
    expect(JSON.parse(/const runs = (.*);\n/.exec(html)[1])[0].epochs.map((e) => e.epoch)).to.deep.equal([1, 2]);
    for (const title of ['Compression level of each layer', 'Norm-change ratio per layer', 'The link as training measured it']) expect(html).to.not.include(title);
  });
});
