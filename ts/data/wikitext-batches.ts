/**
 * Batching a token stream for language-model training: columns (batchify), per-rank shards
 * (shardForRank) and truncated-BPTT windows (bpttWindows).
 */
import { UsageError } from '../base/errors.js';

/** A UsageError naming `what` unless `value` is a safe integer >= `min`. */
export function requireInteger(value: number, what: string, min: number): void {
  if (!Number.isSafeInteger(value) || value < min) {
    throw new UsageError(`${what} must be an integer >= ${min}, got ${value}`);
  }
}

/**
 * Splits a token stream into `columns` contiguous, equally long columns (the remainder is dropped),
 * stored row-major: data[r * columns + j] = tokens[j * rows + r].
 */
export function batchify(
  tokens: Int32Array,
  columns: number,
): { data: Int32Array; rows: number; columns: number } {
  requireInteger(columns, 'batchify column count', 1);
  if (tokens.length < columns) {
    throw new UsageError(`cannot batchify ${tokens.length} tokens into ${columns} columns: fewer tokens than columns`);
  }
  const rows = Math.floor(tokens.length / columns);
  const data = new Int32Array(rows * columns);
  // Column-at-a-time reads each source slice sequentially.
  for (let j = 0; j < columns; j++) {
    const base = j * rows;
    for (let r = 0; r < rows; r++) data[r * columns + j] = tokens[base + r];
  }
  return { data, rows, columns };
}

/**
 * Contiguous per-worker slice for data-parallel training: every rank gets floor(n / worldSize)
 * tokens so all ranks run the same number of steps. Returns a view, not a copy.
 */
export function shardForRank(tokens: Int32Array, rank: number, worldSize: number): Int32Array {
  requireInteger(worldSize, 'world size', 1);
  if (!Number.isSafeInteger(rank) || rank < 0 || rank >= worldSize) {
    throw new UsageError(`rank must be an integer in 0..${worldSize - 1}, got ${rank}`);
  }
  if (tokens.length < worldSize) {
    throw new UsageError(`cannot shard ${tokens.length} tokens over ${worldSize} workers: every shard would be empty`);
  }
  const len = Math.floor(tokens.length / worldSize);
  return tokens.subarray(rank * len, (rank + 1) * len);
}

/**
 * Truncated-BPTT windows over a batchified matrix of `rows` rows. The target of row r is row r + 1,
 * so the last row is never an input.
 */
export function bpttWindows(rows: number, bptt: number): { start: number; length: number }[] {
  requireInteger(rows, 'row count', 0);
  requireInteger(bptt, 'bptt', 1);
  const windows: { start: number; length: number }[] = [];
  for (let start = 0; start < rows - 1; start += bptt) {
    windows.push({ start, length: Math.min(bptt, rows - 1 - start) });
  }
  return windows;
}
