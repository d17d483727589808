/**
 * What a run prints while it trains (to stderr, when asked): a progress bar per epoch and a line
 * after each epoch.
 */
import { showLevel } from '../config/compression.js';
import { describeLink } from './link.js';
import type { EpochRecord, StepEvent } from './records.js';

/**
 * A one-line progress bar for an epoch, drawn from the trainer's 'step' events: done/total, loss,
 * accuracy, samples/s and ETA. On a terminal it redraws in place; otherwise (logs, CI) it prints a
 * plain line at every 25% so logs stay short.
 */
export class ProgressBar {
  private lastPrintedQuarter = -1;
  private readonly tty: boolean;

  constructor(
    private readonly label: string,
    private readonly total: number,
    private readonly stream: NodeJS.WriteStream = process.stderr,
  ) {
    this.tty = Boolean(stream.isTTY);
  }

  update(e: StepEvent): void {
    const done = e.step;
    const text = `loss ${e.epochLoss.toFixed(4)}  acc ${(100 * e.epochAccuracy).toFixed(1)}%`;
    const link = e.link ? `  link ${describeLink(e.link)}` : '';
    const status = `${done}/${this.total}  ${text}  ${e.samplesPerSecond.toFixed(1)} samples/s${link}  ETA ${formatDuration(e.etaSeconds)}`;
    if (this.tty) {
      const width = 24, filled = Math.round((done / this.total) * width);
      const bar = '█'.repeat(filled) + '░'.repeat(width - filled);
      this.stream.write(`\r${this.label} ${bar} ${status}\x1b[K`);
      return;
    }
    const quarter = Math.floor((done / this.total) * 4);
    if (quarter > this.lastPrintedQuarter) {
      this.lastPrintedQuarter = quarter;
      this.stream.write(`${this.label} ${status}\n`);
    }
  }

  finish(): void {
    if (this.tty) this.stream.write('\n');
  }
}

export function formatDuration(seconds: number): string {
  if (!Number.isFinite(seconds)) return '?';
  const s = Math.round(seconds);
  const m = Math.floor(s / 60);
  return m > 0 ? `${m}m${String(s % 60).padStart(2, '0')}s` : `${s}s`;
}

/** 1234567 → "1.23M": compact counts for progress lines. */
export function formatCount(n: number): string {
  const units: [number, string][] = [[1e12, 'T'], [1e9, 'G'], [1e6, 'M'], [1e3, 'k']];
  for (const [scale, unit] of units) if (Math.abs(n) >= scale) return `${(n / scale).toPrecision(3)}${unit}`;
  return String(n);
}

/** The line printed after an epoch: rate, losses, accuracies, floats sent (and their bytes), levels, the link and time. */
export function epochLine(record: EpochRecord, epochs: number, matrices: boolean[]): string {
  return (
    `epoch ${record.epoch}/${epochs}  lr ${record.lr.toPrecision(3)}  train loss ${record.trainLoss.toFixed(4)}` +
    `  acc ${(100 * record.trainAccuracy).toFixed(2)}%  test loss ${record.testLoss.toFixed(4)}` +
    `  acc ${(100 * record.testAccuracy).toFixed(2)}%` +
    (record.validPerplexity !== undefined ? `  valid ppl ${record.validPerplexity.toFixed(2)}  test ppl ${record.testPerplexity!.toFixed(2)}` : '') +
    `  floats sent ${formatCount(record.floatsSent)} (${formatCount(record.bytesSent)}B)` +
    (record.levels ? `  levels ${describeLevels(record.levels, matrices)}` : '') +
    (record.link ? `  link ${describeLink(record.link)}` : '') +
    `  (${formatDuration(record.seconds)})\n`
  );
}

/** "18×2 3×1": how many weight matrices were at each level. */
function describeLevels(levels: number[], matrices: boolean[]): string {
  const counts = new Map<number, number>();
  levels.forEach((l, i) => matrices[i] && counts.set(l, (counts.get(l) ?? 0) + 1));
  return [...counts].sort((a, b) => b[0] - a[0]).map(([level, n]) => `${n}×${showLevel(level)}`).join(' ');
}
