/**
 * Writing plain text in the WikiText layout: its lines split into train / valid / test, with rare
 * and unseen words replaced by '<unk>' where the evaluation lines need it, so that readWikiText
 * accepts the result.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { DataError, UsageError } from '../base/errors.js';
import { statOrNull, writeFileAtomic } from '../base/files.js';
import { UNK, WIKITEXT_FILES, hasWord, splitWords } from './wikitext-format.js';

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
