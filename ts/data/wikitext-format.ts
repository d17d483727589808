/**
 * The WikiText layout and the word rules shared by its reader and writer: the three split files,
 * the '<eos>' and '<unk>' tokens, and Python's notion of white space (str.isspace(), str.split()),
 * which the tokeniser reproduces; lines end at "\n", "\r" or "\r\n".
 */

export const WIKITEXT_FILES = {
  train: 'wiki.train.tokens',
  valid: 'wiki.valid.tokens',
  test: 'wiki.test.tokens',
} as const;

export const EOS = '<eos>';
export const UNK = '<unk>';

/** Carriage return and line feed, the line terminators (universal newlines). */
export const CR = 0x0d;
export const LF = 0x0a;

/** Python's str.isspace() for one UTF-16 code unit (not the regex `\s`: it includes U+001C..U+001F and U+0085, excludes U+FEFF). */
export function isPythonSpace(c: number): boolean {
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

/** Whether `text` has a character that is not white space. */
export function hasWord(text: string): boolean {
  for (let i = 0; i < text.length; i++) if (!isPythonSpace(text.charCodeAt(i))) return true;
  return false;
}

/** str.split() with no arguments, on one line. */
export function splitWords(line: string): string[] {
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
