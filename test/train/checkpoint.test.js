import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { Trainer, Model, MetricsLog, loadCheckpoint, readSafetensors, writeSafetensors, readMetrics } from '../../lib/index.js';
import { splitTextIntoWikiText } from '../../lib/data/wikitext.js';
import { PYTHON, requireTorch } from '../helpers/outside.js';
import { ORACLES } from '../helpers/paths.js';

function small(tmp, extra = {}) {
  return {
    model: 'resnet18',
    width: 0.5,
    dataset: 'synthetic',
    dataDir: path.join(tmp, 'data'),
    syntheticTrain: 96,
    syntheticTest: 32,
    batchSize: 32,
    evalBatchSize: 32,
    epochs: 2,
    progress: false,
    seed: 5,
    ...extra,
  };
}

async function weightsOf(model) {
  const state = await model.stateDict(true);
  return new Map(state.map((t) => [t.name, Buffer.from(t.data)]));
}

describe('checkpoints', function () {
  let tmp;
  before(() => (tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'acc-ckpt-'))));
  after(() => fs.rmSync(tmp, { recursive: true, force: true }));

  it('a run stopped after epoch 1 and resumed equals an uninterrupted run, bit for bit', async function () {
    const straight = await Trainer.create(small(tmp, { outDir: path.join(tmp, 'straight') }));
    const summaryA = await straight.fit();
    const a = await weightsOf(straight.model);
    await straight.dispose();

    const first = await Trainer.create(small(tmp, { outDir: path.join(tmp, 'split'), epochs: 1 }));
    await first.fit();
    await first.dispose();
    const resumed = await Trainer.create(small(tmp, { resume: path.join(tmp, 'split') }));
    const summaryB = await resumed.fit();
    const b = await weightsOf(resumed.model);
    await resumed.dispose();

    expect([...b.keys()]).to.deep.equal([...a.keys()]);
    for (const [name, bytes] of a) expect(bytes.equals(b.get(name)), name).to.equal(true);
    expect(summaryB.epochs.map((e) => e.testLoss)).to.deep.equal(summaryA.epochs.map((e) => e.testLoss));
    const events = readMetrics(path.join(tmp, 'split', 'metrics.jsonl')).map((e) => e.event);
    expect(events).to.include.members(['start', 'epoch', 'checkpoint', 'resume']);
  });

  it('a checkpoint whose records count epochs from 0 (written before they counted from 1) resumes with its records renumbered', async function () {
    const dir = path.join(tmp, 'from-zero');
    const first = await Trainer.create(small(tmp, { outDir: dir, epochs: 1 }));
    await first.fit();
    await first.dispose();
    // The checkpoint as an earlier version wrote it: its one epoch record says epoch 0.
    const file = path.join(loadCheckpoint(dir).dir, 'trainer.safetensors');
    const { tensors, metadata } = readSafetensors(file);
    const position = JSON.parse(metadata.position);
    expect(position.extra.history.map((e) => e.epoch)).to.deep.equal([1]);
    position.extra.history[0].epoch = 0;
    writeSafetensors(file, [...tensors.values()], { ...metadata, position: JSON.stringify(position) });
    const resumed = await Trainer.create(small(tmp, { resume: dir }));
    const summary = await resumed.fit();
    await resumed.dispose();
    expect(summary.epochs.map((e) => e.epoch)).to.deep.equal([1, 2]);
  });

  it('keeps the latest checkpoints and a model file PyTorch-named and weights-only', function () {
    const ckpt = loadCheckpoint(path.join(tmp, 'straight'));
    expect(path.basename(ckpt.dir)).to.equal('epoch-0002');
    expect(ckpt.position.epochsCompleted).to.equal(2);
    const model = readSafetensors(path.join(ckpt.dir, 'model.safetensors'));
    expect([...model.tensors.keys()].some((n) => n.startsWith('optimizer.'))).to.equal(false);
    expect(model.tensors.get('conv1.weight').shape).to.deep.equal([32, 3, 3, 3]); // ResNet-18 at half width
    expect(ckpt.trainer.some((t) => t.name === 'optimizer.momentum_buffer.conv1.weight')).to.equal(true);
  });

  it('refuses to resume with a different configuration, naming the setting and both values', async function () {
    try {
      await Trainer.create(small(tmp, { resume: path.join(tmp, 'straight'), batchSize: 16 }));
      expect.fail('resumed with another batch size');
    } catch (err) {
      expect(err.code).to.equal('ERR_USAGE');
      expect(err.message).to.match(/it was trained with batchSize = 32, this run gives 16 \(--batch-size\)/);
    }
  });

  it('rejects a truncated checkpoint body with the file named, leaving the model untouched', async function () {
    const ckpt = loadCheckpoint(path.join(tmp, 'straight'));
    const file = path.join(tmp, 'truncated.safetensors');
    const bytes = fs.readFileSync(path.join(ckpt.dir, 'model.safetensors'));
    fs.writeFileSync(file, bytes.subarray(0, bytes.length - 1000));
    const model = await Model.create({ architecture: 'resnet18', seed: 9 });
    const before = await weightsOf(model);
    try {
      await model.load(file);
      expect.fail('loaded a truncated file');
    } catch (err) {
      expect(err.code).to.equal('ERR_CHECKPOINT');
      expect(err.message).to.include('truncated.safetensors');
      expect(err.message).to.match(/truncated/);
    }
    const after = await weightsOf(model);
    for (const [name, b] of before) expect(b.equals(after.get(name)), name).to.equal(true);
    await model.dispose();
  });

  it('rejects a tensor of the wrong shape by name, leaving the model untouched', async function () {
    const model = await Model.create({ architecture: 'resnet18', seed: 9 });
    const state = await model.stateDict();
    const bad = state.map((t) => (t.name === 'layer1.0.conv2.weight' ? { ...t, shape: [64, 64, 9, 1] } : t));
    const file = path.join(tmp, 'wrong-shape.safetensors');
    writeSafetensors(file, bad);
    const before = await weightsOf(model);
    try {
      await model.load(file);
      expect.fail('loaded a wrong shape');
    } catch (err) {
      expect(err.code).to.equal('ERR_CHECKPOINT');
      expect(err.message).to.match(/layer1\.0\.conv2\.weight.*\(64, 64, 9, 1\).*\(64, 64, 3, 3\)/);
    }
    const after = await weightsOf(model);
    for (const [name, b] of before) expect(b.equals(after.get(name)), name).to.equal(true);
    await model.dispose();
  });

  it('names the dtype a tensor declares when its bytes do not fit it (float64 over float32-sized bytes), before any cast', async function () {
    const model = await Model.create({ architecture: 'resnet18', width: 0.125 });
    const before = await weightsOf(model);
    const err = await model.loadStateDict([{ name: 'bn1.weight', dtype: 'F64', shape: [8], data: new Uint8Array(32) }]).then(() => null, (e) => e);
    expect(err?.code).to.equal('ERR_CHECKPOINT');
    expect(err.message).to.equal("tensor 'bn1.weight' is declared F64 of shape (8,), which takes 64 bytes, but holds 32");
    const after = await weightsOf(model);
    for (const [name, b] of before) expect(b.equals(after.get(name)), name).to.equal(true);
    await model.dispose();
  });

  it('reports a missing checkpoint directory', async function () {
    try {
      await Trainer.create(small(tmp, { resume: path.join(tmp, 'no-such-run') }));
      expect.fail('resumed from nothing');
    } catch (err) {
      expect(err.code).to.equal('ERR_CHECKPOINT');
      expect(err.message).to.match(/checkpoint not found: .*no-such-run/);
    }
  });

  it('resuming after a crash that tore the last line of metrics.jsonl cuts the fragment off first', async function () {
    const run = path.join(tmp, 'torn');
    fs.cpSync(path.join(tmp, 'split'), run, { recursive: true });
    const log = path.join(run, 'metrics.jsonl');
    const complete = fs.readFileSync(log, 'utf8');
    fs.appendFileSync(log, '{"time":"2024-01-01T00:00:00.000Z","event":"ep');
    const resumed = await Trainer.create(small(tmp, { resume: run, epochs: 3 }));
    await resumed.fit();
    await resumed.dispose();
    const text = fs.readFileSync(log, 'utf8');
    expect(text.startsWith(complete)).to.equal(true);
    expect(text.endsWith('\n')).to.equal(true);
    const events = text.trimEnd().split('\n').map((line) => JSON.parse(line).event);
    expect(events.slice(-3)).to.deep.equal(['resume', 'epoch', 'checkpoint']);
  });

  it('keeps a last line that is whole but lacks its newline, and leaves a sound log alone', function () {
    const log = path.join(tmp, 'whole.jsonl');
    fs.writeFileSync(log, '{"event":"a"}\n{"event":"b"}');
    let m = new MetricsLog(log);
    m.write({ event: 'c' });
    m.close();
    expect(readMetrics(log).map((e) => e.event)).to.deep.equal(['a', 'b', 'c']);
    const before = fs.readFileSync(log, 'utf8');
    m = new MetricsLog(log);
    m.close();
    expect(fs.readFileSync(log, 'utf8')).to.equal(before);
  });

  it('refuses to resume from a checkpoint whose weights hold NaN, naming the tensor', async function () {
    const run = path.join(tmp, 'nan');
    fs.cpSync(path.join(tmp, 'straight'), run, { recursive: true });
    const ckpt = loadCheckpoint(run);
    const file = path.join(ckpt.dir, 'model.safetensors');
    const { tensors, metadata } = readSafetensors(file);
    const t = tensors.get('layer2.0.conv1.weight');
    const data = Buffer.from(t.data);
    data.writeFloatLE(NaN, 4 * 7);
    tensors.set(t.name, { ...t, data });
    writeSafetensors(file, [...tensors.values()], metadata);
    try {
      await Trainer.create(small(tmp, { resume: run, epochs: 3 }));
      expect.fail('resumed from NaN weights');
    } catch (err) {
      expect(err.code).to.equal('ERR_CHECKPOINT');
      expect(err.message).to.include(ckpt.dir);
      expect(err.message).to.match(/non-finite/);
      expect(err.message).to.include('layer2.0.conv1.weight');
      expect(err.message).to.not.match(/learning rate/);
    }
  });

  describe('PyTorch interoperability (Debian python3-torch)', function () {
    before(function () {
      this.timeout(120_000);
      requireTorch(); // fails the suite, naming the package, when /usr/bin/python3 has no torch
    });

    // The input PyTorch's side uses (test/oracles/safetensors_io.py): x[n,c,h,w] = sin(0.37n + 1.3c + 0.11h − 0.07w).
    function formulaInput() {
      const x = new Float32Array(4 * 3 * 32 * 32);
      let i = 0;
      for (let n = 0; n < 4; n++)
        for (let c = 0; c < 3; c++)
          for (let h = 0; h < 32; h++) for (let w = 0; w < 32; w++) x[i++] = Math.fround(Math.sin(0.37 * n + 1.3 * c + 0.11 * h - 0.07 * w));
      return x;
    }

    function expectLogitsClose(ours, theirs) {
      const flat = theirs.flat();
      expect(ours.length).to.equal(flat.length);
      const scale = Math.max(...flat.map(Math.abs));
      for (let i = 0; i < flat.length; i++) expect(Math.abs(ours[i] - flat[i]), `logit ${i}`).to.be.below(1e-3 * scale + 1e-4);
    }

    // Width 0.3 rounds channels both ways (64 → 19, 256 → 77, 512 → 154): the two sides must round alike.
    for (const [architecture, classes, width] of [['resnet18', 10, 1], ['vgg19bn', 100, 1], ['resnet18', 10, 0.3], ['vgg19bn', 10, 0.3]]) {
      const named = `${architecture}/${classes}${width === 1 ? '' : ` at width ${width}`}`;
      it(`a ${named} state_dict saved by PyTorch loads here and gives the same logits`, async function () {
        const file = path.join(tmp, `${architecture}-${width}-torch.safetensors`);
        const r = spawnSync(PYTHON, [path.join(ORACLES, 'safetensors_io.py'), 'export', architecture, String(classes), '3', file, '--width', String(width)], {
          encoding: 'utf8',
          env: { ...process.env, OMP_NUM_THREADS: '2' },
        });
        expect(r.status, r.stderr).to.equal(0);
        const expected = JSON.parse(fs.readFileSync(`${file}.json`, 'utf8')).logits;
        const model = await Model.create({ architecture, classes, width });
        await model.load(file);
        expectLogitsClose(await model.predict(formulaInput(), 4), expected);
        await model.dispose();
      });

      it(`a ${named} model saved here loads in PyTorch (strict) and gives the same logits`, async function () {
        const model = await Model.create({ architecture, classes, width, seed: 11 });
        const file = path.join(tmp, `${architecture}-${width}-ours.safetensors`);
        await model.save(file);
        const ours = await model.predict(formulaInput(), 4);
        await model.dispose();
        const r = spawnSync(PYTHON, [path.join(ORACLES, 'safetensors_io.py'), 'check', architecture, String(classes), file, '--width', String(width)], {
          encoding: 'utf8',
          env: { ...process.env, OMP_NUM_THREADS: '2' },
        });
        expect(r.status, r.stdout + r.stderr).to.equal(0);
        expectLogitsClose(ours, JSON.parse(r.stdout).logits);
      });
    }

    // PyTorch's examples/word_language_model RNNModel, LSTM flavour with tie_weights (ninp = nhid),
    // returning the decoder's logits rather than their log-softmax. Loads each file strictly and
    // prints the logits of one (T, B) window from a zero state in evaluation mode.
    const RNN_MODEL = `
import json, sys
import torch
import torch.nn as nn
sys.path.insert(0, sys.argv[1])
from safetensors_io import load_state_dict

class RNNModel(nn.Module):
    def __init__(self, ntoken, ninp, nhid, nlayers, dropout=0.5):
        super().__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        self.decoder.weight = self.encoder.weight
        self.nlayers, self.nhid = nlayers, nhid

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid), weight.new_zeros(self.nlayers, bsz, self.nhid))

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        return self.decoder(output).view(-1, self.ntoken), hidden

spec = json.loads(sys.argv[2])
torch.set_num_threads(1)
out = {}
for path in spec['files']:
    state = load_state_dict(path)
    model = RNNModel(spec['vocabulary'], spec['hidden'], spec['hidden'], spec['layers'], 0.4)
    model.load_state_dict(state, strict=True)
    model.eval()
    tokens = torch.tensor(spec['tokens'], dtype=torch.long).view(spec['steps'], spec['batch'])
    with torch.no_grad():
        logits, _ = model(tokens, model.init_hidden(spec['batch']))
    out[path] = {
        'tied': bool(torch.equal(state['decoder.weight'], state['encoder.weight'])),
        'logits': logits.flatten().tolist(),
    }
print(json.dumps(out))
`;

    it("an LSTM checkpoint, and a saved LSTM, load into PyTorch's word_language_model (tied, strict) and give the same logits", async function () {
      // A short run on a small text: its checkpoint holds trained (not initial) weights.
      const words = ['the', 'cat', 'sat', 'on', 'a', 'mat', 'dog', 'ran', 'to', 'red', 'ball', 'and', 'saw', 'big', 'tree'];
      const lines = Array.from({ length: 120 }, (_, i) => Array.from({ length: 6 + (i % 5) }, (_, j) => words[(i * 7 + j * j * 3 + j) % words.length]).join(' '));
      const data = path.join(tmp, 'lstm-text');
      splitTextIntoWikiText(lines.join('\n') + '\n', data);
      const runDir = path.join(tmp, 'lstm-run');
      const trainer = await Trainer.create({
        model: 'lstm', dataset: 'wikitext2', dataDir: data, hidden: 12, layers: 2, epochs: 1, batchSize: 4, evalBatchSize: 4, bptt: 6,
        lr: 1, seed: 3, outDir: runDir, progress: false,
      });
      await trainer.fit();
      const vocabulary = trainer.task.classes;
      await trainer.dispose();
      const checkpointFile = path.join(loadCheckpoint(runDir).dir, 'model.safetensors');
      const names = [...readSafetensors(checkpointFile).tensors.keys()];
      expect(names).to.include('decoder.weight').and.include('encoder.weight');

      // Our logits on one window, from the checkpoint's weights (our strict loader takes the tied entry).
      const steps = 5, batch = 3;
      const tokens = Array.from({ length: steps * batch }, (_, i) => (i * 11 + 4) % vocabulary);
      const model = await Model.create({ architecture: 'lstm', classes: vocabulary, hidden: 12, layers: 2 });
      await model.load(checkpointFile);
      await model.resetState();
      const ours = await model.forward(Int32Array.from(tokens), { steps, batch });
      const savedFile = path.join(tmp, 'lstm-saved.safetensors');
      await model.save(savedFile);
      await model.dispose();

      const spec = { files: [checkpointFile, savedFile], vocabulary, hidden: 12, layers: 2, tokens, steps, batch };
      const r = spawnSync(PYTHON, ['-c', RNN_MODEL, ORACLES, JSON.stringify(spec)], {
        encoding: 'utf8',
        env: { ...process.env, OMP_NUM_THREADS: '1' },
      });
      expect(r.status, r.stdout + r.stderr).to.equal(0);
      const results = JSON.parse(r.stdout);
      for (const file of spec.files) {
        const { tied, logits } = results[file];
        expect(tied, `${file}: decoder.weight equals encoder.weight`).to.equal(true);
        expect(logits.length).to.equal(ours.length).and.to.equal(steps * batch * vocabulary);
        let worst = 0, scale = 0;
        for (let i = 0; i < logits.length; i++) {
          worst = Math.max(worst, Math.abs(ours[i] - logits[i]));
          scale = Math.max(scale, Math.abs(logits[i]));
        }
        expect(scale, 'logits of a trained model are not all zero').to.be.above(0.01);
        expect(worst / scale, `${file}: largest difference ${worst} against logits up to ${scale}`).to.be.below(1e-4);
      }
    });
  });
});
