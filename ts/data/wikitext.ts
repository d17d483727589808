/**
 * WikiText-2 (word level) language-modelling corpus: `wiki.train.tokens`,
 * `wiki.valid.tokens` and `wiki.test.tokens` in one directory.
 *
 * Tokenisation reproduces the PyTorch word_language_model example
 * (`for line in open(path, encoding='utf8'): line.split() + ['<eos>']`), so
 * token counts, and the ids of training words (that example reads the training
 * split first), line up with that reference.
 * Two details follow from Python rather than from JavaScript defaults:
 *  - lines end at "\n", "\r" or "\r\n" (text-mode universal newlines);
 *  - words split on Python's str.isspace() set, which differs from the
 *    regex `\s` (it includes U+001C..U+001F and U+0085, excludes U+FEFF).
 * Unlike that example, the vocabulary is built from the training split only,
 * so evaluation words never get ids the model was not trained on.
 */

import * as fs from 'node:fs';
import * as path from 'node:path';
import { DataError, UsageError } from '../errors.js';
import { statOrNull, writeFileAtomic } from '../files.js';

export const WIKITEXT_FILES = {
  train: 'wiki.train.tokens',
  valid: 'wiki.valid.tokens',
  test: 'wiki.test.tokens',
} as const;

export const EOS = '<eos>';
export const UNK = '<unk>';

export interface Corpus {
  dir: string;
  /** id → word */
  vocabulary: string[];
  /** word → id */
  index: Map<string, number>;
  train: Int32Array;
  valid: Int32Array;
  test: Int32Array;
  /** id of '<unk>' if the training split has it */
  unknownId: number | undefined;
}

// ---------------------------------------------------------------------------------------------
// Character classes

const CR = 0x0d;
const LF = 0x0a;

function isPythonSpace(c: number): boolean {
  if (c <= 0x20) return c === 0x20 || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f);
  if (c < 0x85) return false;
  return (
    c === 0x85 ||
    c === 0xa0 ||
    c === 0x1680 ||
    (c >= 0x2000 && c <= 0x200a) ||
    c === 0x2028 ||
    c === 0x2029 ||
    c === 0x202f ||
    c === 0x205f ||
    c === 0x3000
  );
}

// ---------------------------------------------------------------------------------------------
// Reading

/** Amortised-doubling id buffer: token counts are unknown until the scan ends. */
class IdBuffer {
  private data: Int32Array;
  length = 0;

  constructor(capacity: number) {
    this.data = new Int32Array(Math.max(16, capacity));
  }

  push(id: number): void {
    if (this.length === this.data.length) {
      const grown = new Int32Array(this.data.length * 2);
      grown.set(this.data);
      this.data = grown;
    }
    this.data[this.length++] = id;
  }

  finish(): Int32Array {
    // A copy rather than a view so the slack capacity can be collected.
    return this.data.slice(0, this.length);
  }
}


/** Byte offset of the first malformed UTF-8 sequence; only called once a strict decode has failed. */
function firstInvalidUtf8(bytes: Uint8Array): number {
  let i = 0;
  const n = bytes.length;
  while (i < n) {
    const b = bytes[i];
    if (b < 0x80) {
      i++;
      continue;
    }
    let need: number;
    let min: number;
    let cp: number;
    if (b >= 0xc2 && b <= 0xdf) [need, min, cp] = [1, 0x80, b & 0x1f];
    else if (b >= 0xe0 && b <= 0xef) [need, min, cp] = [2, 0x800, b & 0x0f];
    else if (b >= 0xf0 && b <= 0xf4) [need, min, cp] = [3, 0x10000, b & 0x07];
    else return i;
    if (i + need >= n) return i;
    for (let k = 1; k <= need; k++) {
      const cb = bytes[i + k];
      if ((cb & 0xc0) !== 0x80) return i;
      cp = (cp << 6) | (cb & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
    i += need + 1;
  }
  return n;
}

/** 1-based line number (universal newlines) of a byte offset. */
function lineOfByte(bytes: Uint8Array, offset: number): number {
  let line = 1;
  for (let i = 0; i < offset; i++) {
    const b = bytes[i];
    if (b === LF) line++;
    else if (b === CR) {
      if (bytes[i + 1] === LF) i++;
      line++;
    }
  }
  return line;
}

function readSplitText(dir: string, name: string): { file: string; text: string } {
  const file = path.join(dir, name);
  const st = statOrNull(file, DataError);
  if (st === null) throw new DataError(`WikiText file not found: ${file} (expected ${name} in ${dir})`);
  if (!st.isFile()) throw new DataError(`WikiText file is not a regular file: ${file}`);
  let bytes: Buffer;
  try {
    bytes = fs.readFileSync(file);
  } catch (err) {
    throw new DataError(`cannot read ${file}: ${(err as Error).message}`);
  }
  let text: string;
  try {
    // ignoreBOM keeps a leading U+FEFF as Python's 'utf8' codec does, so ids match the reference.
    text = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true }).decode(bytes);
  } catch {
    const at = firstInvalidUtf8(bytes);
    throw new DataError(
      `${file}:${lineOfByte(bytes, at)}: invalid UTF-8 at byte offset ${at} (0x${bytes[at]?.toString(16).padStart(2, '0') ?? '??'})`,
    );
  }
  return { file, text };
}

interface Unknowns {
  firstWord: string;
  firstLine: number;
  occurrences: number;
  distinct: Set<string>;
}

/**
 * Scans `text` once: words are sliced straight out of the decoded string (no per-character
 * concatenation) and looked up in `index`. With `grow`, unseen words get the next id; without, they
 * become `unknownId` or are recorded in the returned report.
 */
function scan(
  text: string,
  index: Map<string, number>,
  vocabulary: string[],
  grow: boolean,
  unknownId: number | undefined,
): { ids: Int32Array; lines: number; unknowns: Unknowns | null } {
  // ~5.5 characters per token in English prose; the buffer doubles if this is short.
  const out = new IdBuffer(Math.ceil(text.length / 5));
  let unknowns: Unknowns | null = null;
  let line = 0;
  const n = text.length;
  let eosId = index.get(EOS);

  const emit = (start: number, end: number): void => {
    const word = text.slice(start, end);
    let id = index.get(word);
    if (id === undefined) {
      if (grow) {
        id = vocabulary.length;
        vocabulary.push(word);
        index.set(word, id);
      } else if (unknownId !== undefined) {
        id = unknownId;
      } else {
        if (unknowns === null) {
          unknowns = { firstWord: word, firstLine: line + 1, occurrences: 0, distinct: new Set() };
        }
        unknowns.occurrences++;
        unknowns.distinct.add(word);
        return;
      }
    }
    out.push(id);
  };

  const endLine = (): void => {
    if (eosId === undefined) {
      eosId = vocabulary.length;
      vocabulary.push(EOS);
      index.set(EOS, eosId);
    }
    out.push(eosId);
    line++;
  };

  let i = 0;
  while (i < n) {
    // One iteration per line; a file with no trailing newline still ends its last line.
    let wordStart = -1;
    let c = 0;
    for (; i < n; i++) {
      c = text.charCodeAt(i);
      if (c === LF || c === CR) break;
      if (isPythonSpace(c)) {
        if (wordStart >= 0) {
          emit(wordStart, i);
          wordStart = -1;
        }
      } else if (wordStart < 0) {
        wordStart = i;
      }
    }
    if (wordStart >= 0) emit(wordStart, i);
    endLine();
    if (i < n) {
      i++;
      if (c === CR && i < n && text.charCodeAt(i) === LF) i++;
    }
  }
  return { ids: out.finish(), lines: line, unknowns };
}

function quote(word: string): string {
  return JSON.stringify(word);
}

/**
 * Reads the three WikiText splits from `dir`. The vocabulary is the training split's words in order
 * of first appearance (so ids are deterministic) and always contains '<eos>'.
 */
export function readWikiText(dir: string): Corpus {
  const st = statOrNull(dir, DataError);
  if (st === null) throw new DataError(`WikiText directory not found: ${dir}`);
  if (!st.isDirectory()) throw new DataError(`WikiText directory is not a directory: ${dir}`);

  // Every file is checked for presence before the (comparatively slow) tokenising starts.
  const names = [WIKITEXT_FILES.train, WIKITEXT_FILES.valid, WIKITEXT_FILES.test];
  for (const name of names) {
    const p = path.join(dir, name);
    if (statOrNull(p, DataError) === null) throw new DataError(`WikiText file not found: ${p} (expected ${name} in ${dir})`);
  }

  const vocabulary: string[] = [];
  const index = new Map<string, number>();
  const trainText = readSplitText(dir, WIKITEXT_FILES.train);
  const train = scan(trainText.text, index, vocabulary, true, undefined).ids;
  if (train.length === 0 || vocabulary.length === 1) {
    const why = train.length === 0 ? 'the file is empty (0 bytes)' : 'it contains only blank lines';
    throw new DataError(`empty WikiText training split: ${trainText.file} has no words (${why})`);
  }
  const unknownId = index.get(UNK);

  const readEval = (name: string): Int32Array => {
    const { file, text } = readSplitText(dir, name);
    const { ids, unknowns } = scan(text, index, vocabulary, false, unknownId);
    if (unknowns !== null) {
      const u: Unknowns = unknowns;
      throw new DataError(
        `${file}:${u.firstLine}: word ${quote(u.firstWord)} is not in the vocabulary of ` +
          `${WIKITEXT_FILES.train}, which has no ${UNK} to map it to ` +
          `(${u.occurrences} out-of-vocabulary token${u.occurrences === 1 ? '' : 's'}, ` +
          `${u.distinct.size} distinct word${u.distinct.size === 1 ? '' : 's'}, in this file)`,
      );
    }
    return ids;
  };
  const valid = readEval(WIKITEXT_FILES.valid);
  const test = readEval(WIKITEXT_FILES.test);

  return { dir, vocabulary, index, train, valid, test, unknownId };
}

// ---------------------------------------------------------------------------------------------
// Batching

function requireInteger(value: number, what: string, min: number): void {
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

// ---------------------------------------------------------------------------------------------
// Writing


/** Whether `text` has a character that is not white space. */
function hasWord(text: string): boolean {
  for (let i = 0; i < text.length; i++) if (!isPythonSpace(text.charCodeAt(i))) return true;
  return false;
}

/** str.split() with no arguments, on one line. */
function splitWords(line: string): string[] {
  const words: string[] = [];
  let start = -1;
  for (let i = 0; i < line.length; i++) {
    if (isPythonSpace(line.charCodeAt(i))) {
      if (start >= 0) {
        words.push(line.slice(start, i));
        start = -1;
      }
    } else if (start < 0) {
      start = i;
    }
  }
  if (start >= 0) words.push(line.slice(start));
  return words;
}

/** The line itself when no word changes, so untouched lines keep their original spacing. */
function mapWords(line: string, map: (word: string) => string): string {
  const words = splitWords(line);
  let changed = false;
  const mapped = words.map((w) => {
    const m = map(w);
    if (m !== w) changed = true;
    return m;
  });
  return changed ? mapped.join(' ') : line;
}

/**
 * Writes `text` into `dir` in the WikiText layout, its lines split in order into train / valid /
 * test by `fractions` (default 90/5/5). Lines are cut with the same universal-newline rule the
 * reader uses, so readWikiText sees exactly these line counts; files are written with "\n".
 *
 * Raw text almost always has words in its last lines that never occur in its first ones, and
 * readWikiText rejects those unless the training split has '<unk>'. So when that happens (and the
 * text has no '<unk>' of its own), words occurring once in the training part become '<unk>' —
 * WikiText itself was made by replacing rare words — and valid/test words outside the resulting
 * vocabulary become '<unk>' too. That gives '<unk>' a training frequency close to the rate of unseen
 * words. Text whose evaluation lines are fully covered is written unchanged.
 */
export function splitTextIntoWikiText(
  text: string,
  dir: string,
  fractions: [number, number, number] = [0.9, 0.05, 0.05],
): void {
  if (typeof text !== 'string') throw new UsageError('splitTextIntoWikiText: text must be a string');
  if (
    !Array.isArray(fractions) ||
    fractions.length !== 3 ||
    fractions.some((f) => typeof f !== 'number' || !Number.isFinite(f) || f < 0) ||
    Math.abs(fractions[0] + fractions[1] + fractions[2] - 1) > 1e-9
  ) {
    throw new UsageError(`split fractions must be three non-negative numbers summing to 1, got ${JSON.stringify(fractions)}`);
  }

  let { train, valid, test } = partitionLines(text, fractions);

  const counts = new Map<string, number>();
  for (const line of train) for (const w of splitWords(line)) counts.set(w, (counts.get(w) ?? 0) + 1);
  const uncovered = (line: string): boolean => splitWords(line).some((w) => !counts.has(w));
  if (valid.some(uncovered) || test.some(uncovered)) {
    const replaceRare = !counts.has(UNK);
    let rareCount = 0;
    if (replaceRare) for (const c of counts.values()) if (c === 1) rareCount++;
    if (replaceRare && rareCount === 0) {
      throw new DataError(
        `cannot split text into ${dir}: the validation/test lines contain words the training lines lack, ` +
          `and no training word occurs only once to stand for ${UNK}; use more text or a larger training fraction`,
      );
    }
    const rare = (w: string): boolean => replaceRare && counts.get(w) === 1;
    train = train.map((line) => mapWords(line, (w) => (rare(w) ? UNK : w)));
    const forEval = (line: string): string => mapWords(line, (w) => (counts.has(w) && !rare(w) ? w : UNK));
    valid = valid.map(forEval);
    test = test.map(forEval);
  }

  try {
    fs.mkdirSync(dir, { recursive: true });
  } catch (err) {
    throw new DataError(`cannot create directory ${dir}: ${(err as Error).message}`);
  }
  const parts: [string, string[]][] = [
    [WIKITEXT_FILES.train, train],
    [WIKITEXT_FILES.valid, valid],
    [WIKITEXT_FILES.test, test],
  ];
  for (const [name, part] of parts) {
    const body = part.length === 0 ? '' : part.join('\n') + '\n';
    writeFileAtomic(path.join(dir, name), [body], DataError);
  }
}

/** The lines of `text`, in order, cut into train / valid / test by `fractions`. */
function partitionLines(text: string, fractions: [number, number, number]): { train: string[]; valid: string[]; test: string[] } {
  const lines = text.split(/\r\n|\r|\n/);
  // A terminator at the very end closes the last line rather than starting an empty one.
  if (lines.length > 0 && lines[lines.length - 1] === '') lines.pop();
  const total = lines.length;
  // Cumulative rounding keeps the three counts summing to the total without favouring one split.
  const trainEnd = Math.round(total * fractions[0]);
  const validEnd = Math.min(total, Math.max(trainEnd, Math.round(total * (fractions[0] + fractions[1]))));
  return { train: lines.slice(0, trainEnd), valid: lines.slice(trainEnd, validEnd), test: lines.slice(validEnd) };
}

/**
 * Splits the plain text file `file` into `dir` in the WikiText layout, as splitTextIntoWikiText
 * (90/5/5 by lines by default), for training the language model on any text. The file must exist,
 * be a file, hold words, and have enough lines that every part gets at least one; each failure is a
 * DataError naming the file.
 */
export function splitTextFile(file: string, dir: string, fractions: [number, number, number] = [0.9, 0.05, 0.05]): void {
  const st = statOrNull(file, DataError);
  if (st === null) throw new DataError(`text file not found: ${file}`);
  if (st.isDirectory()) throw new DataError(`${file} is a directory, not a text file (a WikiText directory is read with --data DIR)`);
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (err) {
    throw new DataError(`cannot read ${file}: ${(err as Error).message}`);
  }
  if (text.length === 0) throw new DataError(`text file ${file} is empty (0 bytes)`);
  if (!hasWord(text)) throw new DataError(`text file ${file} has no words (only white space)`);
  const parts = partitionLines(text, fractions);
  const empty = (['train', 'valid', 'test'] as const).filter((part) => parts[part].length === 0);
  if (empty.length > 0)
    throw new DataError(
      `text file ${file} has ${parts.train.length + parts.valid.length + parts.test.length} lines, too few to split ${fractions.map((f) => Math.round(f * 100)).join('/')} ` +
        `into train, valid and test: the ${empty.join(' and ')} part${empty.length > 1 ? 's get' : ' gets'} no line; use a longer text`,
    );
  splitTextIntoWikiText(text, dir, fractions);
}

// ---------------------------------------------------------------------------------------------
// Baseline

/**
 * Perplexity of the add-one-smoothed unigram distribution of `train` on `evalTokens`:
 * p(w) = (count(w) + 1) / (N + V), perplexity = exp(−mean log p(w)).
 */
export function unigramPerplexity(train: Int32Array, evalTokens: Int32Array, vocabularySize: number): number {
  requireInteger(vocabularySize, 'vocabulary size', 1);
  if (evalTokens.length === 0) throw new UsageError('unigram perplexity needs at least one evaluation token');
  const counts = new Float64Array(vocabularySize);
  for (let i = 0; i < train.length; i++) {
    const id = train[i];
    if (id < 0 || id >= vocabularySize) {
      throw new UsageError(`training token ${i} has id ${id}, outside the vocabulary 0..${vocabularySize - 1}`);
    }
    counts[id]++;
  }
  const logDenominator = Math.log(train.length + vocabularySize);
  let sum = 0;
  for (let i = 0; i < evalTokens.length; i++) {
    const id = evalTokens[i];
    if (id < 0 || id >= vocabularySize) {
      throw new UsageError(`evaluation token ${i} has id ${id}, outside the vocabulary 0..${vocabularySize - 1}`);
    }
    sum += Math.log(counts[id] + 1) - logDenominator;
  }
  return Math.exp(-sum / evalTokens.length);
}
