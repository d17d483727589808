// WikiText-2 word-level corpus: tokenisation that matches the PyTorch word_language_model example,
// vocabulary from the training split only, the error cases, and the batching / sharding / BPTT
// arithmetic, all on hand-made files whose expected ids are written out by hand.
import { expect } from 'chai';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import {
  batchify,
  bpttWindows,
  readWikiText,
  shardForRank,
  splitTextIntoWikiText,
  unigramPerplexity,
} from '../../lib/data/wikitext.js';
import { DataError, UsageError } from '../../lib/base/errors.js';
import { LanguageTask } from '../../lib/train/tasks.js';
import { readShakespeare } from '../helpers/outside.js';
import { thrownBy } from '../helpers/throws.js';

const made = [];
function tmpDir() {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), 'acc-wikitext-'));
  made.push(d);
  return d;
}

function writeCorpus(dir, { train, valid, test }) {
  if (train !== undefined) fs.writeFileSync(path.join(dir, 'wiki.train.tokens'), train);
  if (valid !== undefined) fs.writeFileSync(path.join(dir, 'wiki.valid.tokens'), valid);
  if (test !== undefined) fs.writeFileSync(path.join(dir, 'wiki.test.tokens'), test);
  return dir;
}

function corpus(files) {
  return writeCorpus(tmpDir(), files);
}

function expectDataError(fn, ...fragments) {
  const caught = thrownBy(fn);
  expect(caught, 'expected a DataError').to.be.instanceOf(DataError);
  expect(caught.code).to.equal('ERR_DATA');
  for (const f of fragments) expect(caught.message).to.include(f);
  return caught;
}

function expectUsageError(fn, fragment) {
  const caught = thrownBy(fn);
  expect(caught, 'expected a UsageError').to.be.instanceOf(UsageError);
  expect(caught.code).to.equal('ERR_USAGE');
  if (fragment) expect(caught.message).to.include(fragment);
}

const ids = (a) => Array.from(a);

after(() => {
  for (const d of made) fs.rmSync(d, { recursive: true, force: true });
});

describe('readWikiText', () => {
  it('assigns ids in order of first appearance and appends <eos> to every line, blank ones included', () => {
    // Line 2 is blank, line 3 has leading/trailing blanks and a tab, and there is no newline after
    // the last line: all as in real WikiText files (which start with " \n").
    const dir = corpus({
      train: 'the cat sat\n\n  the  dog\tsat \nend',
      valid: 'the dog\n',
      test: 'sat cat\n\nend\n',
    });
    const c = readWikiText(dir);
    expect(c.dir).to.equal(dir);
    expect(c.vocabulary).to.deep.equal(['the', 'cat', 'sat', '<eos>', 'dog', 'end']);
    expect([...c.index.entries()]).to.deep.equal(c.vocabulary.map((w, i) => [w, i]));
    // the cat sat <eos> | <eos> | the dog sat <eos> | end <eos>
    expect(ids(c.train)).to.deep.equal([0, 1, 2, 3, 3, 0, 4, 2, 3, 5, 3]);
    expect(c.train).to.be.instanceOf(Int32Array);
    expect(ids(c.valid)).to.deep.equal([0, 4, 3]);
    expect(ids(c.test)).to.deep.equal([2, 1, 3, 3, 5, 3]);
    expect(c.unknownId).to.equal(undefined);
  });

  it('ends lines at \\n, \\r\\n and \\r, and splits words on Python whitespace, not on NBSP-like look-alikes', () => {
    // \u00a0 and \u3000 are str.isspace() in Python; \u200b (zero-width space) and \ufeff are not.
    const dir = corpus({
      train: 'a b\r\nc\rd\n\r\ne\u00a0f\u3000g h\u200bi\n',
      valid: 'a\r\n',
      test: 'a\r',
    });
    const c = readWikiText(dir);
    expect(c.vocabulary).to.deep.equal(['a', 'b', '<eos>', 'c', 'd', 'e', 'f', 'g', 'h\u200bi']);
    // a b <eos> | c <eos> | d <eos> | <eos> | e f g h​i <eos>
    expect(ids(c.train)).to.deep.equal([0, 1, 2, 3, 2, 4, 2, 2, 5, 6, 7, 8, 2]);
    expect(ids(c.valid)).to.deep.equal([0, 2]);
    expect(ids(c.test)).to.deep.equal([0, 2]);
  });

  it('builds the vocabulary from the training split only and maps unseen evaluation words to <unk>', () => {
    const dir = corpus({
      train: 'x <unk> y\ny x\n',
      valid: 'x zebra y\n',
      test: 'yak\nx <unk>\n',
    });
    const c = readWikiText(dir);
    expect(c.vocabulary).to.deep.equal(['x', '<unk>', 'y', '<eos>']);
    expect(c.unknownId).to.equal(1);
    expect(c.index.has('zebra')).to.equal(false);
    expect(ids(c.valid)).to.deep.equal([0, 1, 2, 3]);
    expect(ids(c.test)).to.deep.equal([1, 3, 0, 1, 3]);
  });

  it('rejects evaluation words outside the vocabulary when there is no <unk>, naming file, line, word and count', () => {
    const dir = corpus({
      train: 'a b\n',
      valid: 'a b\n',
      test: 'a\nb\n\nb zebra a yak zebra\n',
    });
    const err = expectDataError(
      () => readWikiText(dir),
      path.join(dir, 'wiki.test.tokens') + ':4',
      '"zebra"',
      '3 out-of-vocabulary tokens',
      '2 distinct words',
    );
    expect(err.message).to.include('<unk>');
  });

  it('checks the validation split for unknown words too', () => {
    const dir = corpus({ train: 'a\n', valid: 'a\na B\n', test: 'a\n' });
    expectDataError(() => readWikiText(dir), 'wiki.valid.tokens:2', '"B"', '1 out-of-vocabulary token,');
  });

  it('names the missing directory, or the missing file', () => {
    const missing = path.join(tmpDir(), 'nope');
    expectDataError(() => readWikiText(missing), missing);

    const notDir = path.join(tmpDir(), 'file');
    fs.writeFileSync(notDir, 'x');
    expectDataError(() => readWikiText(notDir), notDir, 'not a directory');

    expectDataError(() => readWikiText(corpus({ valid: 'a\n', test: 'a\n' })), 'wiki.train.tokens');
    expectDataError(() => readWikiText(corpus({ train: 'a\n', test: 'a\n' })), 'wiki.valid.tokens');
    expectDataError(() => readWikiText(corpus({ train: 'a\n', valid: 'a\n' })), 'wiki.test.tokens');
  });

  it('rejects an empty training split: zero bytes, or only blank lines', () => {
    expectDataError(() => readWikiText(corpus({ train: '', valid: '', test: '' })), 'wiki.train.tokens', 'empty');
    expectDataError(
      () => readWikiText(corpus({ train: '\n \n\t\n', valid: '\n', test: '\n' })),
      'wiki.train.tokens',
      'blank',
    );
  });

  it('accepts empty evaluation splits', () => {
    const c = readWikiText(corpus({ train: 'a\n', valid: '', test: '\n' }));
    expect(ids(c.valid)).to.deep.equal([]);
    expect(ids(c.test)).to.deep.equal([1]);
  });

  it('a training task names the evaluation file that is empty or too small for its batch', () => {
    const words = 'the cat sat on the mat and the dog ran off\n'.repeat(20);
    const options = { batchSize: 4, evalBatchSize: 10, bptt: 5, clip: 0, rank: 0, worldSize: 1 };
    const empty = corpus({ train: words, valid: words, test: '' });
    expectDataError(() => new LanguageTask(readWikiText(empty), options), path.join(empty, 'wiki.test.tokens'), 'empty');
    const small = corpus({ train: words, valid: 'the cat\n', test: words });
    expectUsageError(() => new LanguageTask(readWikiText(small), options), path.join(small, 'wiki.valid.tokens'));
    expectUsageError(() => new LanguageTask(readWikiText(small), options), '--eval-batch-size 10');
  });

  it('reports invalid UTF-8 with file, line and byte offset', () => {
    const bad = Buffer.concat([Buffer.from('ok\nfine w\u00f6rd\nbad '), Buffer.from([0xc3, 0x28]), Buffer.from('\n')]);
    const dir = corpus({ train: bad, valid: 'ok\n', test: 'ok\n' });
    // 'ok\n' = 3 bytes, 'fine wörd\n' = 11 bytes, 'bad ' = 4 bytes → offset 18 on line 3.
    expectDataError(() => readWikiText(dir), 'wiki.train.tokens:3', 'invalid UTF-8', 'offset 18');
  });
});

describe('batchify', () => {
  it('lays contiguous slices out as columns of a row-major matrix, dropping the remainder', () => {
    const tokens = Int32Array.from({ length: 10 }, (_, i) => i);
    const b = batchify(tokens, 3);
    expect(b.rows).to.equal(3);
    expect(b.columns).to.equal(3);
    expect(ids(b.data)).to.deep.equal([0, 3, 6, 1, 4, 7, 2, 5, 8]);

    const one = batchify(tokens, 1);
    expect(one.rows).to.equal(10);
    expect(ids(one.data)).to.deep.equal(ids(tokens));

    const wide = batchify(tokens, 10);
    expect(wide.rows).to.equal(1);
    expect(ids(wide.data)).to.deep.equal(ids(tokens));
  });

  it('refuses fewer tokens than columns and non-positive column counts', () => {
    expectUsageError(() => batchify(new Int32Array(2), 3), 'fewer tokens than columns');
    expectUsageError(() => batchify(new Int32Array(4), 0));
    expectUsageError(() => batchify(new Int32Array(4), 1.5));
  });
});

describe('shardForRank', () => {
  it('gives every rank floor(n / W) contiguous tokens, in rank order', () => {
    const tokens = Int32Array.from({ length: 11 }, (_, i) => i * 10);
    const shards = [0, 1, 2].map((r) => ids(shardForRank(tokens, r, 3)));
    expect(shards).to.deep.equal([
      [0, 10, 20],
      [30, 40, 50],
      [60, 70, 80],
    ]);
    expect(ids(shardForRank(tokens, 0, 1))).to.deep.equal(ids(tokens));
  });

  it('refuses bad ranks and world sizes', () => {
    const tokens = new Int32Array(8);
    expectUsageError(() => shardForRank(tokens, 2, 2), 'rank');
    expectUsageError(() => shardForRank(tokens, -1, 2), 'rank');
    expectUsageError(() => shardForRank(tokens, 0, 0), 'world size');
    expectUsageError(() => shardForRank(tokens, 0, 9), 'empty');
  });
});

describe('bpttWindows', () => {
  it('cuts rows − 1 input rows into windows of at most bptt', () => {
    expect(bpttWindows(10, 4)).to.deep.equal([
      { start: 0, length: 4 },
      { start: 4, length: 4 },
      { start: 8, length: 1 },
    ]);
    expect(bpttWindows(9, 4)).to.deep.equal([
      { start: 0, length: 4 },
      { start: 4, length: 4 },
    ]);
    expect(bpttWindows(2, 35)).to.deep.equal([{ start: 0, length: 1 }]);
    expect(bpttWindows(1, 35)).to.deep.equal([]);
    expect(bpttWindows(0, 35)).to.deep.equal([]);
  });

  it('covers every input row exactly once', () => {
    for (const [rows, bptt] of [[100, 7], [36, 35], [37, 35], [5, 1]]) {
      const seen = [];
      for (const w of bpttWindows(rows, bptt)) for (let r = w.start; r < w.start + w.length; r++) seen.push(r);
      expect(seen).to.deep.equal(Array.from({ length: rows - 1 }, (_, i) => i));
    }
  });

  it('refuses a non-positive bptt', () => {
    expectUsageError(() => bpttWindows(10, 0), 'bptt');
  });
});

describe('splitTextIntoWikiText', () => {
  it('splits lines in order, 90/5/5 by default, and leaves no temporary files', () => {
    // Every valid/test word also occurs in the training lines, so the text is written unchanged.
    const lines = Array.from({ length: 40 }, (_, i) => (i % 5 === 4 ? '' : ` w${i % 4}  w${(i + 1) % 4} `));
    const dir = path.join(tmpDir(), 'nested', 'wt');
    splitTextIntoWikiText(lines.join('\r\n') + '\r\n', dir);
    expect(fs.readdirSync(dir).sort()).to.deep.equal(['wiki.test.tokens', 'wiki.train.tokens', 'wiki.valid.tokens']);
    const read = (n) => fs.readFileSync(path.join(dir, n), 'utf8');
    expect(read('wiki.train.tokens')).to.equal(lines.slice(0, 36).join('\n') + '\n');
    expect(read('wiki.valid.tokens')).to.equal(lines.slice(36, 38).join('\n') + '\n');
    expect(read('wiki.test.tokens')).to.equal(lines.slice(38).join('\n') + '\n');

    const c = readWikiText(dir);
    expect(c.vocabulary).to.deep.equal(['w0', 'w1', '<eos>', 'w2', 'w3']);
    expect(c.unknownId).to.equal(undefined);
  });

  it('honours explicit fractions and rejects ones that do not sum to 1', () => {
    const dir = tmpDir();
    splitTextIntoWikiText('a\nb a\na\nb\n', dir, [0.5, 0.25, 0.25]);
    expect(fs.readFileSync(path.join(dir, 'wiki.train.tokens'), 'utf8')).to.equal('a\nb a\n');
    expect(fs.readFileSync(path.join(dir, 'wiki.valid.tokens'), 'utf8')).to.equal('a\n');
    expect(fs.readFileSync(path.join(dir, 'wiki.test.tokens'), 'utf8')).to.equal('b\n');
    expectUsageError(() => splitTextIntoWikiText('a\n', dir, [0.5, 0.5, 0.5]), 'fractions');
  });

  it('turns rare training words and unseen evaluation words into <unk> so the corpus reads back', () => {
    // Training part: a ×3, b ×2, c ×1 → c is rare. Valid/test: zebra and yak are unseen, and c is
    // out of the vocabulary once it has become <unk>.
    const dir = tmpDir();
    splitTextIntoWikiText('a  b a\nc b a\na zebra c\n yak b\n', dir, [0.5, 0.25, 0.25]);
    const read = (n) => fs.readFileSync(path.join(dir, n), 'utf8');
    expect(read('wiki.train.tokens')).to.equal('a  b a\n<unk> b a\n');
    expect(read('wiki.valid.tokens')).to.equal('a <unk> <unk>\n');
    expect(read('wiki.test.tokens')).to.equal('<unk> b\n');
    const c = readWikiText(dir);
    expect(c.vocabulary).to.deep.equal(['a', 'b', '<eos>', '<unk>']);
    expect(c.unknownId).to.equal(3);
    expect(ids(c.valid)).to.deep.equal([0, 3, 3, 2]);
  });

  it('refuses text whose unseen evaluation words cannot be mapped to a trained <unk>', () => {
    const dir = path.join(tmpDir(), 'out');
    expectDataError(() => splitTextIntoWikiText('a a\nb\n', dir, [0.5, 0.25, 0.25]), '<unk>', dir);
    expect(fs.existsSync(dir)).to.equal(false);
  });

  it('turns tinyshakespeare into a corpus readWikiText reads back', function () {
    const text = readShakespeare();
    const dir = tmpDir();
    splitTextIntoWikiText(text, dir);
    const c = readWikiText(dir);

    const eos = c.index.get('<eos>');
    const lineCount = (a) => a.reduce((n, id) => n + (id === eos ? 1 : 0), 0);
    const [tr, va, te] = [lineCount(c.train), lineCount(c.valid), lineCount(c.test)];
    const total = text.split('\n').length - (text.endsWith('\n') ? 1 : 0);
    expect(tr + va + te).to.equal(total);
    expect(tr / total).to.be.closeTo(0.9, 0.001);
    expect(va / total).to.be.closeTo(0.05, 0.001);
    expect(te / total).to.be.closeTo(0.05, 0.001);

    // Whitespace-split words keep their punctuation, so even without hapaxes this is ~10k words.
    expect(c.vocabulary.length).to.be.within(3000, 30000);
    expect(c.vocabulary[0]).to.equal('First');
    expect(c.unknownId).to.be.a('number');
    const unknownShare = (a) => a.reduce((n, id) => n + (id === c.unknownId ? 1 : 0), 0) / a.length;
    expect(unknownShare(c.train)).to.be.within(0.01, 0.2);
    expect(unknownShare(c.valid)).to.be.within(0.01, 0.3);
    expect(c.train.length).to.be.greaterThan(150000);

    const ppl = unigramPerplexity(c.train, c.valid, c.vocabulary.length);
    expect(ppl).to.be.greaterThan(50).and.lessThan(c.vocabulary.length);
  });
});

describe('unigramPerplexity', () => {
  it('matches a hand computation with add-one smoothing', () => {
    // counts 2, 1, 0 over N = 3 tokens, V = 3 → p = 3/6, 2/6, 1/6; perplexity = (1 / (1/2·1/3·1/6))^(1/3) = 36^(1/3)
    const ppl = unigramPerplexity(Int32Array.of(0, 0, 1), Int32Array.of(0, 1, 2), 3);
    expect(ppl).to.be.closeTo(Math.cbrt(36), 1e-12);
    // No training data: the smoothed distribution is uniform and perplexity equals V.
    expect(unigramPerplexity(new Int32Array(0), Int32Array.of(1, 2, 3), 7)).to.be.closeTo(7, 1e-12);
  });

  it('refuses ids outside the vocabulary and an empty evaluation stream', () => {
    expectUsageError(() => unigramPerplexity(Int32Array.of(0, 3), Int32Array.of(0), 3), 'outside the vocabulary');
    expectUsageError(() => unigramPerplexity(Int32Array.of(0), Int32Array.of(-1), 3), 'outside the vocabulary');
    expectUsageError(() => unigramPerplexity(Int32Array.of(0), new Int32Array(0), 3), 'at least one');
  });
});
