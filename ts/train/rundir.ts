/**
 * Run directories: what marks a directory as holding a run, the refusal to train into one (which
 * would overwrite its checkpoints, metrics and configuration), and the clearing that `overwrite`
 * asks for (only the engine's own files are ever removed), and the files a run writes at its start
 * and end.
 */
import * as fs from 'node:fs';
import * as fsp from 'node:fs/promises';
import * as path from 'node:path';
import { CheckpointError, UsageError } from '../base/errors.js';
import { writeFileAtomicAsync } from '../base/files.js';
import { MetricsLog } from '../base/metrics.js';
import { resolveCheckpointDir } from './checkpoint.js';

/** Files a run writes at the top of its directory (`report.html` is the report's default place). */
const RUN_FILES = ['config.json', 'metrics.jsonl', 'summary.json', 'report.html'];
/** What marks a directory as holding a run. */
const RUN_MARKERS = ['config.json', 'metrics.jsonl', 'summary.json', 'checkpoints'];
/** Entries of checkpoints/ that the engine writes: epoch folders, their temporary names, `latest`. */
const CHECKPOINT_ENTRY = /^(\.tmp-)?epoch-\d+$|^latest(\.tmp-.*)?$/;

/** The run's files and folders present in `dir` (none when it does not exist); refuses a non-directory. */
export function runMarkers(dir: string): string[] {
  let stat: fs.Stats;
  try {
    stat = fs.statSync(dir);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return [];
    throw new UsageError(`option --out: cannot access ${dir}: ${(err as Error).message}`);
  }
  if (!stat.isDirectory()) throw new UsageError(`option --out: ${dir} is not a directory`);
  return RUN_MARKERS.filter((name) => fs.existsSync(path.join(dir, name))).map((name) => (name === 'checkpoints' ? 'checkpoints/' : name));
}

/**
 * Checks, before any work, that a run may write to its directory: `outDir`, or when resuming
 * without one, the directory of the checkpoint being resumed. A directory that already holds a run
 * is refused unless the run continues it (it is the resumed checkpoint's run directory) or
 * `overwrite` replaces it. `overwrite` does not go with continuing a run in its own directory: it
 * would delete the checkpoint being resumed.
 */
export function checkRunDir(options: { outDir?: string; resume?: string; overwrite?: boolean }): void {
  const resumedRunDir = options.resume ? path.resolve(resolveCheckpointDir(options.resume), '..', '..') : undefined;
  const outDir = options.outDir ?? resumedRunDir;
  if (outDir === undefined) return;
  const continuing = resumedRunDir !== undefined && samePath(outDir, resumedRunDir);
  if (continuing && options.overwrite)
    throw new UsageError(`--overwrite would delete ${outDir}, the run being resumed: resume without --overwrite, or --resume into another --out`);
  const found = runMarkers(outDir);
  if (found.length === 0 || continuing || options.overwrite) return;
  throw new UsageError(
    `option --out: ${outDir} already holds a run (${found.join(', ')}); continue it with --resume ${outDir}, ` +
      `or replace it with --overwrite (which removes that run's ${RUN_FILES.join(', ')} and checkpoints)`,
  );
}

/**
 * Removes a previous run's files from `dir`: config.json, metrics.jsonl, summary.json, report.html
 * (and temporary files of their atomic writes), and in checkpoints/ the epoch folders, their
 * temporary folders and `latest`; checkpoints/ itself when that leaves it empty. Anything else in
 * the directory is kept.
 */
export async function clearRun(dir: string): Promise<void> {
  let entries: string[];
  try {
    entries = await fsp.readdir(dir);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return;
    throw err;
  }
  for (const name of entries)
    if (RUN_FILES.some((f) => name === f || name.startsWith(`${f}.tmp-`))) await fsp.rm(path.join(dir, name), { force: true });
  const checkpoints = path.join(dir, 'checkpoints');
  if (!entries.includes('checkpoints')) return;
  for (const name of await fsp.readdir(checkpoints))
    if (CHECKPOINT_ENTRY.test(name)) await fsp.rm(path.join(checkpoints, name), { recursive: true, force: true });
  if ((await fsp.readdir(checkpoints)).length === 0) await fsp.rmdir(checkpoints);
}

function samePath(a: string, b: string): boolean {
  const real = (p: string) => {
    try {
      return fs.realpathSync(p);
    } catch {
      return path.resolve(p);
    }
  };
  return real(a) === real(b);
}

/**
 * Rank 0 at the start of a run: clears a replaced run (`overwrite`), writes config.json (the resolved
 * configuration) and opens the metrics log.
 */
export async function openRunDir(dir: string, config: { overwrite: boolean }, saved: Record<string, unknown>): Promise<MetricsLog> {
  if (config.overwrite) await clearRun(dir);
  try {
    await fsp.mkdir(dir, { recursive: true });
  } catch (err) {
    throw new CheckpointError(`cannot create the run directory ${dir}: ${(err as Error).message}`);
  }
  await writeFileAtomicAsync(path.join(dir, 'config.json'), [JSON.stringify(saved, null, 2) + '\n'], CheckpointError);
  return new MetricsLog(path.join(dir, 'metrics.jsonl'));
}

/** Rank 0 at the end of a run: summary.json. */
export async function writeSummary(dir: string, summary: unknown): Promise<void> {
  await writeFileAtomicAsync(path.join(dir, 'summary.json'), [JSON.stringify(summary, null, 2) + '\n'], CheckpointError);
}
