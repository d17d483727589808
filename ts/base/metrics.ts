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

/** How a metrics log was read: its events, and the number of a torn last line that was skipped. */
export interface MetricsRead {
  events: MetricsEvent[];
  /** The line number (from 1) of each event. */
  lines: number[];
  /** Line number (from 1) of an incomplete last line, cut short by a crash, that was left out. */
  tornLine?: number;
}

/**
 * Reads a metrics log back. An incomplete last line without its newline (what a killed run leaves)
 * is skipped and its number returned; any other line that is not a JSON object with an "event"
 * name, and a path that is not a readable file, are DataErrors naming the file (and the line).
 */
export function readMetricsLog(file: string): MetricsRead {
  let text: string;
  try {
    if (fs.statSync(file).isDirectory()) throw new DataError(`${file} is a directory, not a metrics log`);
    text = fs.readFileSync(file, 'utf8');
  } catch (err) {
    if (err instanceof DataError) throw err;
    throw new DataError(`cannot read the metrics log ${file}: ${(err as Error).message}`);
  }
  const lines = text.split('\n');
  const complete = text.endsWith('\n');
  if (complete) lines.pop();
  const events: MetricsEvent[] = [];
  const numbers: number[] = [];
  let tornLine: number | undefined;
  lines.forEach((line, i) => {
    if (line.trim() === '') return;
    let value: unknown;
    try {
      value = JSON.parse(line);
    } catch (err) {
      // Only the last line can be torn, and only when the file does not end in a newline.
      if (i === lines.length - 1 && !complete) {
        tornLine = i + 1;
        return;
      }
      throw new DataError(`${file}: line ${i + 1} is not valid JSON: ${(err as Error).message}`);
    }
    if (typeof value !== 'object' || value === null || Array.isArray(value))
      throw new DataError(`${file}: line ${i + 1} is not a JSON object (got ${JSON.stringify(value).slice(0, 40)})`);
    if (typeof (value as MetricsEvent).event !== 'string') throw new DataError(`${file}: line ${i + 1} has no "event" name`);
    events.push(value as MetricsEvent);
    numbers.push(i + 1);
  });
  return tornLine === undefined ? { events, lines: numbers } : { events, lines: numbers, tornLine };
}

/** Reads a metrics log back (for reports and tests); a torn last line from a crash is skipped. */
export function readMetrics(file: string): MetricsEvent[] {
  return readMetricsLog(file).events;
}
