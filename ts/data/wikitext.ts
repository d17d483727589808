/**
 * Reading the WikiText-2 (word level) language-modelling corpus: `wiki.train.tokens`,
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
 *
 * The layout's names (wikitext-format.ts), the writer (wikitext-split.ts), batching
 * (wikitext-batches.ts) and the unigram baseline (unigram.ts) are re-exported from here.
 */

import * as fs from 'node:fs';
import * as path from 'node:path';
import { DataError } from '../base/errors.js';
import { statOrNull } from '../base/files.js';
import { CR, EOS, LF, UNK, WIKITEXT_FILES, isPythonSpace } from './wikitext-format.js';

export { EOS, UNK, WIKITEXT_FILES } from './wikitext-format.js';
export { splitTextFile, splitTextIntoWikiText } from './wikitext-split.js';
export { batchify, bpttWindows, shardForRank } from './wikitext-batches.js';
export { unigramPerplexity } from './unigram.js';

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
