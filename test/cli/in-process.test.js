// accordion train --workers N --in-process: the job's workers as trainers in one process. Its outside
// reference is the launched job (one process per worker), which test/comm checks against PyTorch DDP
// and float64: the in-process job must write the same checkpoints, tensor for tensor, bit for bit.
import { expect } from 'chai';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { readSafetensors } from '../../lib/index.js';
import { exitWithin, waitFor } from '../helpers/processes.js';
import { killJobsAfterEach, start } from '../helpers/job-processes.js';
import { CLI } from '../helpers/paths.js';

killJobsAfterEach();

describe('accordion train --in-process', function () {
  let tmp;
  before(() => (tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'acc-in-process-'))));
  after(() => fs.rmSync(tmp, { recursive: true, force: true }));

  const common = ['--model', 'resnet18', '--width', '0.25', '--synthetic-train', '256', '--synthetic-test', '64', '--batch-size', '16', '--eval-batch-size', '64', '--quiet'];
  const train = (args, env = {}) => start([CLI, 'train', ...common, ...args], { XDG_CACHE_HOME: path.join(tmp, 'cache'), ...env });

  /** Every tensor of a checkpoint's files (the model's and each rank's trainer state), by file and name. */
  function checkpointTensors(runDir, epoch) {
    const dir = path.join(runDir, 'checkpoints', `epoch-${String(epoch).padStart(4, '0')}`);
    const out = new Map();
    for (const file of fs.readdirSync(dir).sort())
      for (const [name, t] of readSafetensors(path.join(dir, file)).tensors) out.set(`${file}:${name}`, { shape: t.shape, data: Buffer.from(t.data) });
    return out;
  }

  /** The metrics of each epoch that do not depend on the clock. */
  function epochFigures(runDir) {
    return fs
      .readFileSync(path.join(runDir, 'metrics.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((line) => JSON.parse(line))
      .filter((e) => e.event === 'epoch')
      .map(({ epoch, trainLoss, trainAccuracy, testLoss, testAccuracy, floatsSent, levels, norms }) => ({ epoch, trainLoss, trainAccuracy, testLoss, testAccuracy, floatsSent, levels, norms }));
  }

  it('2 workers with PowerSGD and Accordion write the checkpoints of the launched job bit for bit (weights, momenta, error memories, statistics) and the same metrics', async function () {
    const args = ['--epochs', '2', '--workers', '2', '--compressor', 'powersgd', '--accordion-interval', '1'];
    const launched = await exitWithin(train([...args, '--out', path.join(tmp, 'launched')]), 240000);
    expect(launched.code, launched.stderr).to.equal(0);
    const here = await exitWithin(train([...args, '--in-process', '--out', path.join(tmp, 'here')]), 240000);
    expect(here.code, here.stderr).to.equal(0);
    expect(here.stderr).to.match(/× 2 workers in this process/);
    for (const epoch of [1, 2]) {
      const a = checkpointTensors(path.join(tmp, 'launched'), epoch);
      const b = checkpointTensors(path.join(tmp, 'here'), epoch);
      expect([...b.keys()], `epoch ${epoch}`).to.deep.equal([...a.keys()]);
      expect([...a.keys()].some((k) => k.startsWith('trainer-rank1')), 'rank 1 keeps its own state').to.equal(true);
      for (const [key, t] of a) {
        expect(b.get(key).shape, key).to.deep.equal(t.shape);
        expect(b.get(key).data.equals(t.data), `epoch ${epoch}, ${key}`).to.equal(true);
      }
    }
    const figures = epochFigures(path.join(tmp, 'launched'));
    expect(figures).to.have.length(2);
    expect(epochFigures(path.join(tmp, 'here'))).to.deep.equal(figures);
  });

  it('a worker that fails (rank 1 resuming from a checkpoint without its state) ends the job at once, exit 1, naming the rank and the file', async function () {
    const run = path.join(tmp, 'here');
    fs.rmSync(path.join(run, 'checkpoints', 'epoch-0002', 'trainer-rank1.safetensors'));
    // Rank 0 would wait 10 minutes in its first collective for rank 1: the job must not.
    const r = await exitWithin(train(['--resume', run, '--epochs', '3', '--in-process', '--timeout', '600000']), 60000);
    expect(r.code, r.stderr).to.equal(1);
    expect(r.stderr).to.match(/rank 1: .*epoch-0002 holds no trainer state for rank 1 \(trainer-rank1\.safetensors\)/);
  });

  it('Ctrl-C (SIGINT) stops every worker with status 130, keeps the last checkpoint and names the command that resumes it', async function () {
    const run = path.join(tmp, 'stopped');
    const job = train(['--epochs', '50', '--workers', '2', '--in-process', '--out', run]);
    await waitFor('the first checkpoint', () => {
      if (job.done) throw new Error(`the job ended before its first checkpoint; stderr:\n${job.stderr}`);
      return fs.existsSync(path.join(run, 'checkpoints', 'latest'));
    }, 120000);
    job.child.kill('SIGINT');
    const r = await exitWithin(job, 30000);
    expect(r.code, r.stderr).to.equal(130);
    expect(r.stderr).to.match(/interrupted by SIGINT; this run did not finish \(\d+ of 50 epochs completed\)/);
    expect(r.stderr, r.stderr).to.include(`accordion train --resume ${run} --in-process`);
    const latest = fs.readFileSync(path.join(run, 'checkpoints', 'latest'), 'utf8').trim();
    expect(fs.readdirSync(path.join(run, 'checkpoints', latest)).sort()).to.deep.equal(['model.safetensors', 'trainer-rank1.safetensors', 'trainer.safetensors']);
  });

  it('refuses --in-process without --workers above 1, and under a launcher (each process is a worker there)', async function () {
    const alone = await exitWithin(train(['--in-process']), 30000);
    expect(alone.code).to.equal(2);
    expect(alone.stderr).to.match(/option --in-process needs --workers N with N above 1/);
    const torchrun = { RANK: '0', WORLD_SIZE: '2', LOCAL_RANK: '0', MASTER_ADDR: '127.0.0.1', MASTER_PORT: '29500' };
    const launched = await exitWithin(train(['--workers', '2', '--in-process'], torchrun), 30000);
    expect(launched.code).to.equal(2);
    expect(launched.stderr).to.match(/option --in-process runs a job's workers in one process; under torchrun .* each process is one worker already/);
  });
});
