/** JSON Lines metrics log: one event per line, appended and flushed as it happens. */
import * as fs from 'node:fs';

export type MetricsEvent = { event: string; time?: string } & Record<string, unknown>;

export class MetricsLog {
  private readonly fd: number;

  constructor(readonly path: string) {
    this.fd = fs.openSync(path, 'a');
  }

  write(event: MetricsEvent): void {
    const line = JSON.stringify({ time: new Date().toISOString(), ...event });
    fs.writeSync(this.fd, line + '\n');
  }

  close(): void {
    fs.closeSync(this.fd);
  }
}

/** Reads a metrics log back (for reports and tests); a torn last line from a crash is skipped. */
export function readMetrics(path: string): MetricsEvent[] {
  const lines = fs.readFileSync(path, 'utf8').split('\n').filter((l) => l.trim() !== '');
  const events: MetricsEvent[] = [];
  lines.forEach((line, i) => {
    try {
      events.push(JSON.parse(line) as MetricsEvent);
    } catch (err) {
      if (i !== lines.length - 1) throw new Error(`${path}: line ${i + 1} is not valid JSON: ${(err as Error).message}`);
    }
  });
  return events;
}
