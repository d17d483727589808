// The LSTM's inputs: the errors that malformed token files and bad command lines produce, each
// naming the file, the offset or the option.
import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';

import { Trainer } from '../../lib/index.js';
import { DataError } from '../../lib/base/errors.js';
import { CLI } from '../helpers/paths.js';
import { tempDirs } from '../helpers/temp-dirs.js';

const tmpDir = tempDirs('acc-lstm-');

describe('LSTM language model', function () {
  describe('malformed corpora and command lines', function () {
    const lstmOptions = (dataDir) => ({
      model: 'lstm',
      dataset: 'wikitext2',
      dataDir,
      hidden: 8,
      layers: 1,
      dropout: 0,
      bptt: 4,
      batchSize: 2,
      evalBatchSize: 2,
      epochs: 1,
      lr: 1,
      warmupEpochs: 0,
      progress: false,
    });

    function corpus(files) {
      const dir = tmpDir();
      for (const [split, body] of Object.entries(files)) fs.writeFileSync(path.join(dir, `wiki.${split}.tokens`), body);
      return dir;
    }

    async function rejection(promise) {
      try {
        const trainer = await promise;
        await trainer.dispose();
      } catch (err) {
        return err;
      }
      throw new Error('Trainer.create did not reject');
    }

    function cli(args) {
      const r = spawnSync(process.execPath, [CLI, ...args], { encoding: 'utf8', env: { ...process.env, OMP_NUM_THREADS: '2' } });
      return { code: r.status, stdout: r.stdout, stderr: r.stderr };
    }

    const valid = 'the cat sat\n';

    it('rejects an empty training file with a DataError naming it', async function () {
      const dir = corpus({ train: '', valid, test: valid });
      const err = await rejection(Trainer.create(lstmOptions(dir)));
      expect(err).to.be.instanceOf(DataError);
      expect(err.code).to.equal('ERR_DATA');
      expect(err.message).to.include(path.join(dir, 'wiki.train.tokens')).and.to.match(/empty/);
    });

    it('rejects a missing training split with a DataError naming the expected file', async function () {
      const dir = corpus({ valid, test: valid });
      const err = await rejection(Trainer.create(lstmOptions(dir)));
      expect(err).to.be.instanceOf(DataError);
      expect(err.code).to.equal('ERR_DATA');
      expect(err.message).to.include(path.join(dir, 'wiki.train.tokens')).and.to.match(/not found/);
    });

    it('rejects unknown validation words when the training split has no <unk>, naming file, line and word', async function () {
      const dir = corpus({ train: 'the cat sat on the mat\n', valid: 'the cat sat\nthe dog sat\n', test: valid });
      const err = await rejection(Trainer.create(lstmOptions(dir)));
      expect(err).to.be.instanceOf(DataError);
      expect(err.code).to.equal('ERR_DATA');
      expect(err.message).to.include(`${path.join(dir, 'wiki.valid.tokens')}:2`).and.to.include('"dog"').and.to.include('<unk>');
    });

    it('maps unknown validation and test words to <unk> when the training split has it, and trains', async function () {
      const train = 'the cat sat on the <unk> mat\nthe mat sat on the cat\n'.repeat(6);
      const dir = corpus({ train, valid: 'the dog sat on the cat\nthe cat ate the mat\n', test: 'a cat sat\nthe mat sat on the cat\n' });
      const trainer = await Trainer.create(lstmOptions(dir));
      try {
        const { corpus: c } = trainer.task;
        const unk = c.index.get('<unk>');
        expect(c.unknownId).to.equal(unk);
        const id = (w) => c.index.get(w);
        expect(Array.from(c.valid)).to.deep.equal(
          ['the', '<unk>', 'sat', 'on', 'the', 'cat', '<eos>', 'the', 'cat', '<unk>', 'the', 'mat', '<eos>'].map(id),
        );
        expect(c.test[0]).to.equal(unk);
        const summary = await trainer.fit();
        expect(summary.epochs).to.have.length(1);
        expect(summary.epochs[0].validPerplexity).to.be.a('number').and.to.satisfy(Number.isFinite);
        expect(summary.epochs[0].testPerplexity).to.satisfy(Number.isFinite);
      } finally {
        await trainer.dispose();
      }
    });

    it('command line: --model lstm without --data exits 2 asking for it', function () {
      const r = cli(['train', '--model', 'lstm', '--quiet', '--out', path.join(tmpDir(), 'run')]);
      expect(r.code, r.stderr).to.equal(2);
      expect(r.stderr).to.match(/wikitext2 needs --data DIR/);
    });

    it('command line: --model lstm --dataset cifar10 exits 2 naming the mismatch', function () {
      const r = cli(['train', '--model', 'lstm', '--dataset', 'cifar10', '--data', tmpDir(), '--quiet', '--out', path.join(tmpDir(), 'run')]);
      expect(r.code, r.stderr).to.equal(2);
      expect(r.stderr).to.match(/lstm model trains on --dataset wikitext2, not cifar10/);
    });

    it('command line: an empty training file exits 1 naming it', function () {
      const dir = corpus({ train: '\n\n', valid, test: valid });
      const r = cli(['train', '--model', 'lstm', '--data', dir, '--quiet', '--out', path.join(tmpDir(), 'run')]);
      expect(r.code, r.stderr).to.equal(1);
      expect(r.stderr).to.include(path.join(dir, 'wiki.train.tokens')).and.to.match(/only blank lines/);
    });

    it('command line: trains a tiny lstm on --data and reports its parameters and perplexities', function () {
      const dir = corpus({ train: 'the cat sat on the mat\nthe mat sat on the cat\n'.repeat(8), valid: 'the cat sat on the mat\n', test: 'the mat sat\n' });
      const r = cli(['train', '--model', 'lstm', '--data', dir, '--hidden', '8', '--layers', '1', '--epochs', '1', '--batch-size', '2',
        '--eval-batch-size', '1', '--bptt', '5', '--lr', '1', '--quiet', '--out', path.join(tmpDir(), 'run')]);
      expect(r.code, r.stderr).to.equal(0);
      // 6 words (the, cat, sat, on, mat, <eos>): V·H + V + 8H² + 8H with V 6, H 8.
      expect(r.stdout).to.include(`model lstm, ${6 * 8 + 6 + 8 * 64 + 64} parameters, dataset wikitext2`);
      expect(r.stdout).to.match(/perplexity: validation \d+\.\d\d, test \d+\.\d\d/);
    });

    // --text FILE: a plain text file, split 90/5/5 by lines into the run directory.
    const WORDS = ['the', 'cat', 'sat', 'on', 'a', 'mat'];
    const textLines = (n) => Array.from({ length: n }, (_, i) => Array.from({ length: 3 + (i % 4) }, (_, j) => WORDS[(i + 2 * j) % WORDS.length]).join(' '));
    const tinyText = ['--hidden', '8', '--layers', '1', '--epochs', '1', '--batch-size', '2', '--eval-batch-size', '1', '--bptt', '5', '--lr', '1', '--quiet'];

    it('command line: --text FILE trains on a plain text file split 90/5/5 by lines, and resumes with it', function () {
      const lines = textLines(40);
      const file = path.join(tmpDir(), 'story.txt');
      fs.writeFileSync(file, lines.join('\n') + '\n');
      const run = path.join(tmpDir(), 'run');
      const r = cli(['train', '--model', 'lstm', '--text', file, ...tinyText, '--out', run]);
      expect(r.code, r.stderr).to.equal(0);
      // Lines 1–36 train, 37–38 validate, 39–40 test, in order; every word is in the training lines.
      const split = path.join(run, 'text-split');
      const read = (name) => fs.readFileSync(path.join(split, name), 'utf8');
      expect(read('wiki.train.tokens')).to.equal(lines.slice(0, 36).join('\n') + '\n');
      expect(read('wiki.valid.tokens')).to.equal(lines.slice(36, 38).join('\n') + '\n');
      expect(read('wiki.test.tokens')).to.equal(lines.slice(38).join('\n') + '\n');
      const tokens = (part) => part.reduce((n, line) => n + line.split(' ').length + 1, 0); // words and <eos> per line
      expect(r.stderr).to.include(`(${tokens(lines.slice(0, 36))} train / ${tokens(lines.slice(38))} test tokens)`);
      const v = WORDS.length + 1; // the six words and <eos>
      expect(r.stdout).to.include(`model lstm, ${v * 8 + v + 8 * 64 + 64} parameters, dataset wikitext2`);
      expect(r.stdout).to.match(/perplexity: validation \d+\.\d\d, test \d+\.\d\d/);

      const resumed = cli(['train', '--model', 'lstm', '--text', file, ...tinyText, '--epochs', '2', '--resume', run]);
      expect(resumed.code, resumed.stderr).to.equal(0);
      expect(resumed.stdout).to.include('epochs 2,');
    });

    for (const [what, setup, code, message] of [
      ['a missing file', (dir) => path.join(dir, 'absent.txt'), 1, /option --text: text file not found: .*absent\.txt/],
      ['a directory', (dir) => dir, 1, /option --text: .* is a directory, not a text file/],
      ['an empty file', (dir) => (fs.writeFileSync(path.join(dir, 'empty.txt'), ''), path.join(dir, 'empty.txt')), 1, /option --text: text file .*empty\.txt is empty/],
      ['a file of white space', (dir) => (fs.writeFileSync(path.join(dir, 'blank.txt'), ' \n\t\n'), path.join(dir, 'blank.txt')), 1, /has no words/],
      ['a file of 3 lines', (dir) => (fs.writeFileSync(path.join(dir, 'short.txt'), 'a b\nc d\ne f\n'), path.join(dir, 'short.txt')), 1, /has 3 lines, too few to split 90\/5\/5/],
    ])
      it(`command line: --text with ${what} exits ${code} naming the problem`, function () {
        const dir = tmpDir();
        const run = path.join(tmpDir(), 'run');
        const r = cli(['train', '--model', 'lstm', '--text', setup(dir), ...tinyText, '--out', run]);
        expect(r.code, r.stderr).to.equal(code);
        expect(r.stderr).to.match(message);
        expect(fs.existsSync(path.join(run, 'text-split')), 'no split is written').to.equal(false);
      });

    it('command line: --text with --data, or with an image model, exits 2', function () {
      const file = path.join(tmpDir(), 'story.txt');
      fs.writeFileSync(file, textLines(40).join('\n') + '\n');
      const both = cli(['train', '--model', 'lstm', '--text', file, '--data', tmpDir(), '--quiet', '--out', path.join(tmpDir(), 'run')]);
      expect(both.code, both.stderr).to.equal(2);
      expect(both.stderr).to.match(/--text and --data exclude each other/);
      const image = cli(['train', '--model', 'resnet18', '--text', file, '--quiet', '--out', path.join(tmpDir(), 'run')]);
      expect(image.code, image.stderr).to.equal(2);
      expect(image.stderr).to.match(/--text is for --model lstm/);
    });
  });
});
