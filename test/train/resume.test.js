// A resume starts from the run's own configuration, as Lightning's ckpt_path and Hugging Face's
// resume_from_checkpoint do: `accordion train --resume RUN_DIR` alone continues the run, a flag may
// change what a resume may change (epochs, workers, threads, …), and a flag that contradicts the run
// is refused naming both values. The reference is the uninterrupted run, bit for bit.
import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { Trainer, readMetrics, readSafetensors, writeSafetensors } from '../../lib/index.js';
import { CLI } from '../helpers/paths.js';

function cli(args) {
  const r = spawnSync(process.execPath, [CLI, 'train', ...args], { encoding: 'utf8', timeout: 240000, env: { ...process.env, OMP_NUM_THREADS: '2' } });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** The weights of a run's latest checkpoint. */
function weights(run) {
  const latest = fs.readFileSync(path.join(run, 'checkpoints', 'latest'), 'utf8').trim();
  return readSafetensors(path.join(run, 'checkpoints', latest, 'model.safetensors')).tensors;
}

describe("resume from the run's own configuration", function () {
  this.timeout(600000);
  let tmp, whole;
  const settings = (data) => ['--model', 'resnet18', '--width', '0.25', '--dataset', 'synthetic', '--data', data, '--synthetic-train', '64', '--synthetic-test', '16',
    '--batch-size', '16', '--eval-batch-size', '16', '--lr', '0.03', '--seed', '9', '--quiet'];
  /** A copy of the finished 2-epoch run stopped after its first epoch: its latest checkpoint is epoch 1's. */
  const stoppedAfterOne = (name) => {
    const run = path.join(tmp, name);
    fs.cpSync(whole, run, { recursive: true });
    fs.writeFileSync(path.join(run, 'checkpoints', 'latest'), 'epoch-0001\n');
    fs.rmSync(path.join(run, 'checkpoints', 'epoch-0002'), { recursive: true });
    fs.rmSync(path.join(run, 'summary.json'));
    return run;
  };
  before(() => {
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'acc-resume-'));
    whole = path.join(tmp, 'whole');
    const r = cli([...settings(path.join(tmp, 'data')), '--epochs', '2', '--out', whole]);
    expect(r.code, r.stderr).to.equal(0);
  });
  after(() => fs.rmSync(tmp, { recursive: true, force: true }));

  it("the README's and docs/training.md's `--resume RUN_DIR` alone finishes the run as the uninterrupted one did, bit for bit", () => {
    const run = stoppedAfterOne('as-written');
    const r = cli(['--resume', run]);
    expect(r.code, r.stderr).to.equal(0);
    const [a, b] = [weights(whole), weights(run)];
    expect([...b.keys()]).to.deep.equal([...a.keys()]);
    for (const [name, t] of a) expect(Buffer.compare(Buffer.from(t.data), Buffer.from(b.get(name).data)), name).to.equal(0);
    expect(readMetrics(path.join(run, 'metrics.jsonl')).map((e) => e.event)).to.include('resume');
  });

  it('a changed --epochs trains on to the new end; the library resumes from the run alone too', async () => {
    const run = stoppedAfterOne('longer');
    const r = cli(['--resume', run, '--epochs', '3']);
    expect(r.code, r.stderr).to.equal(0);
    expect(fs.readFileSync(path.join(run, 'checkpoints', 'latest'), 'utf8').trim()).to.equal('epoch-0003');
    const trainer = await Trainer.create({ resume: run, epochs: 4, progress: false });
    expect([trainer.config.model, trainer.config.width, trainer.config.batchSize, trainer.config.lr, trainer.config.epochs]).to.deep.equal(['resnet18', 0.25, 16, 0.03, 4]);
    await trainer.dispose();
  });

  it('a flag that contradicts the run is refused with exit 2, naming both values, nothing written', () => {
    const run = stoppedAfterOne('contradicted');
    const before = fs.readFileSync(path.join(run, 'metrics.jsonl'), 'utf8');
    const r = cli(['--resume', run, '--batch-size', '8']);
    expect(r.code).to.equal(2);
    expect(r.stderr).to.include(`cannot resume from ${path.join(run, 'checkpoints', 'epoch-0001')}: it was trained with batchSize = 16, this run gives 8 (--batch-size)`);
    expect(fs.readFileSync(path.join(run, 'metrics.jsonl'), 'utf8')).to.equal(before);
  });

  it('--workers changes the worker count, and a later resume keeps the run\'s new count', () => {
    const run = stoppedAfterOne('regrouped');
    const two = cli(['--resume', run, '--workers', '2', '--epochs', '2']);
    expect(two.code, two.stderr).to.equal(0);
    const again = cli(['--resume', run, '--epochs', '3']);
    expect(again.code, again.stderr).to.equal(0);
    const resumes = readMetrics(path.join(run, 'metrics.jsonl')).filter((e) => e.event === 'resume');
    expect(resumes.map((e) => e.workers)).to.deep.equal([2, 2]);
  });

  it('a run trained on a GPU with --tf32 and channels-first activations resumes on the CPU with TF32 off and channels-last, as the uninterrupted CPU run, bit for bit; either given on the CPU is refused', () => {
    const run = stoppedAfterOne('from-a-gpu');
    // The checkpoint as a GPU run with --tf32 writes it: its configuration names both.
    const file = path.join(run, 'checkpoints', 'epoch-0001', 'trainer.safetensors');
    const saved = readSafetensors(file);
    const position = JSON.parse(saved.metadata.position);
    Object.assign(position.config, { device: 'cuda', tf32: true, memoryFormat: 'channels-first' });
    writeSafetensors(file, [...saved.tensors.values()], { ...saved.metadata, position: JSON.stringify(position) });
    const r = cli(['--resume', run, '--device', 'cpu']);
    expect(r.code, r.stderr).to.equal(0);
    const [a, b] = [weights(whole), weights(run)];
    for (const [name, t] of a) expect(Buffer.compare(Buffer.from(t.data), Buffer.from(b.get(name).data)), name).to.equal(0);
    const given = cli([...settings(path.join(tmp, 'data')), '--tf32', '--epochs', '1', '--out', path.join(tmp, 'tf32-on-cpu')]);
    expect(given.code).to.equal(2);
    expect(given.stderr).to.include("--tf32 is a GPU's tensor-core format");
    expect(fs.existsSync(path.join(tmp, 'tf32-on-cpu'))).to.equal(false);
    const layout = cli([...settings(path.join(tmp, 'data')), '--memory-format', 'channels-first', '--epochs', '1', '--out', path.join(tmp, 'nchw-on-cpu')]);
    expect(layout.code).to.equal(2);
    expect(layout.stderr).to.include('--memory-format channels-first is for a GPU');
    expect(fs.existsSync(path.join(tmp, 'nchw-on-cpu'))).to.equal(false);
  });

  it('a missing run directory is named before anything else', () => {
    const missing = path.join(tmp, 'no', 'such', 'run');
    const r = cli(['--resume', missing, '--workers', '3']);
    expect(r.code).to.equal(1);
    expect(r.stderr).to.include(`checkpoint not found: ${missing}`);
    expect(r.stderr).to.not.include('--model');
  });
});
