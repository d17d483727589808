/**
 * The chart of `accordion plan`: predicted seconds per step against workers, one line per level,
 * overlapped with backward (solid) and after it (dashed), as one self-contained HTML page.
 */
import { createRequire } from 'node:module';
import type { PlanRow } from '../cluster/predict.js';
import { inlineScript } from './report.js';

export function renderPlanChart(title: string, rows: PlanRow[], name: (level: number) => string): string {
  const require = createRequire(import.meta.url);
  const levels = rows[0]?.levels.map((l) => l.level) ?? [];
  const palette = ['#1f77b4', '#d62728', '#2ca02c', '#9467bd', '#ff7f0e', '#8c564b', '#e377c2', '#17becf'];
  const datasets = levels.flatMap((level, k) =>
    (['overlappedSeconds', 'afterBackwardSeconds'] as const).map((key) => ({
      label: `${name(level)}${key === 'overlappedSeconds' ? ', overlapped' : ', after backward'}`,
      borderColor: palette[k % palette.length],
      borderDash: key === 'overlappedSeconds' ? [] : [6, 4],
      data: rows.map((r) => ({ x: String(r.workers), y: r.levels[k]!.prediction[key] })),
    })),
  );
  const data = JSON.stringify({ title, workers: rows.map((r) => r.workers), datasets }).replace(/</g, '\\u003c');
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>accordion-engine plan</title>
<style>body { font-family: system-ui, sans-serif; margin: 2rem; color: #222; } h1 { font-size: 1.2rem; } .chart { position: relative; height: 480px; max-width: 960px; }</style>
<script>${inlineScript(require, 'chart.js', 'chart.umd.js')}</script>
</head>
<body>
<h1 id="title"></h1>
<div class="chart"><canvas id="plan"></canvas></div>
<script>
const plan = ${data};
Chart.defaults.animation = false;
document.getElementById('title').textContent = plan.title;
window.planChart = new Chart(document.getElementById('plan'), {
  type: 'line',
  data: { datasets: plan.datasets },
  options: { maintainAspectRatio: false, scales: {
    x: { type: 'category', labels: plan.workers.map(String), title: { display: true, text: 'workers' } },
    y: { type: 'logarithmic', title: { display: true, text: 'seconds per step (predicted)' } } } },
});
</script>
</body>
</html>
`;
}
