/** JSON Lines metrics log: one event per line, appended and flushed as it happens. */
import * as fs from 'node:fs';
import { DataError } from './errors.js';

export type MetricsEvent = { event: string; time?: string } & Record<string, unknown>;

export class MetricsLog {
  private readonly fd: number;

  /**
   * Opens `path` for appending. A log that does not end in a newline was torn by a crash: its last,
   * incomplete line is cut off first (or, when it is a complete JSON value that only lacks the
   * newline, the newline is added), so the events appended now start on a line of their own.
   */
  constructor(readonly path: string) {
    this.fd = fs.openSync(path, 'a+');
    try {
      repairTail(this.fd);
    } catch (err) {
      fs.closeSync(this.fd);
      throw err;
    }
  }

  write(event: MetricsEvent): void {
    const line = JSON.stringify({ time: new Date().toISOString(), ...event });
    fs.writeSync(this.fd, line + '\n');
  }

  close(): void {
    fs.closeSync(this.fd);
  }
}

/** Bytes read at a time while looking backwards for the last newline. */
const TAIL_CHUNK = 64 * 1024;

/** Cuts a torn last line (no trailing newline) back to the end of the last complete line. */
function repairTail(fd: number): void {
  const size = fs.fstatSync(fd).size;
  if (size === 0) return;
  const last = Buffer.alloc(1);
  fs.readSync(fd, last, 0, 1, size - 1);
  if (last[0] === 0x0a) return;
  // Find the last newline, reading backwards in chunks (the log may be large).
  let keep = 0;
  const chunk = Buffer.alloc(TAIL_CHUNK);
  for (let end = size; end > 0; ) {
    const start = Math.max(0, end - TAIL_CHUNK);
    const n = fs.readSync(fd, chunk, 0, end - start, start);
    const at = chunk.subarray(0, n).lastIndexOf(0x0a);
    if (at >= 0) {
      keep = start + at + 1;
      break;
    }
    end = start;
  }
  const fragment = Buffer.alloc(size - keep);
  fs.readSync(fd, fragment, 0, fragment.length, keep);
  try {
    JSON.parse(fragment.toString('utf8'));
    fs.writeSync(fd, '\n');
  } catch {
    fs.ftruncateSync(fd, keep);
  }
}

/** Reads a metrics log back (for reports and tests); a torn last line from a crash is skipped. */
export function readMetrics(path: string): MetricsEvent[] {
  const lines = readText(path).split('\n').filter((l) => l.trim() !== '');
  const events: MetricsEvent[] = [];
  lines.forEach((line, i) => {
    try {
      events.push(JSON.parse(line) as MetricsEvent);
    } catch (err) {
      if (i !== lines.length - 1) throw new DataError(`${path}: line ${i + 1} is not valid JSON: ${(err as Error).message}`);
    }
  });
  return events;
}

function readText(path: string): string {
  try {
    return fs.readFileSync(path, 'utf8');
  } catch (err) {
    throw new DataError(`cannot read the metrics log ${path}: ${(err as Error).message}`);
  }
}
