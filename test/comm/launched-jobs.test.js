// A launched data-parallel job (accordion train --workers 2) that is stopped: a worker killed or frozen,
// Ctrl-C or SIGTERM, and its checkpoints resumed (with 3 workers and 1 too, and as the run without a stop).
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { expect } from 'chai';
import { loadCheckpoint } from '../../lib/index.js';
import { exitWithin, waitFor } from '../helpers/processes.js';
import { jobProcesses, killJobsAfterEach, newToken, start } from '../helpers/job-processes.js';
import { CLI } from '../helpers/paths.js';

// ---------------------------------------------------------------------------------------------
// Whatever a test starts is killed after it, even when the test failed halfway.

killJobsAfterEach();

describe('data parallel: a launched job that is stopped', function () {
  let cacheDir;
  const runDirs = [];

  before(function () {
    // The synthetic dataset is generated into this cache, by both workers at once on the first run.
    cacheDir = fs.mkdtempSync(path.join(os.tmpdir(), 'accordion-dp-cache-'));
  });

  after(function () {
    for (const dir of [cacheDir, ...runDirs]) fs.rmSync(dir, { recursive: true, force: true });
  });

  const common = ['--model', 'resnet18', '--width', '0.25', '--synthetic-train', '256', '--synthetic-test', '64', '--batch-size', '16', '--eval-batch-size', '64', '--checkpoint-every', '1', '--quiet'];

  function launchJob(extra, token) {
    return start([CLI, 'train', ...common, '--workers', '2', ...extra], { ACCORDION_JOB_TOKEN: token, XDG_CACHE_HOME: cacheDir }, { detached: true });
  }

  function latestOf(dir) {
    const file = path.join(dir, 'checkpoints', 'latest');
    return fs.existsSync(file) ? fs.readFileSync(file, 'utf8').trim() : undefined;
  }

  /** Starts a 50-epoch job and waits until its first checkpoint is published. */
  async function jobAfterFirstCheckpoint() {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'accordion-dp-run-'));
    runDirs.push(dir);
    const token = newToken();
    const launcher = launchJob(['--epochs', '50', '--out', dir], token);
    await waitFor('the first checkpoint', () => {
      if (launcher.done) throw new Error(`the job ended before its first checkpoint; stderr:\n${launcher.stderr}`);
      return latestOf(dir);
    }, 120000);
    return { dir, token, launcher };
  }

  function expectCheckpointLoads(dir, label) {
    const name = latestOf(dir);
    const epochs = Number(/^epoch-(\d+)$/.exec(name)?.[1]);
    for (const rank of [0, 1]) {
      const c = loadCheckpoint(dir, rank);
      expect(c.dir, `${label}: rank ${rank}`).to.equal(path.join(dir, 'checkpoints', name));
      expect(c.position.epochsCompleted, `${label}: rank ${rank}`).to.equal(epochs);
      expect(c.position.config.workers, `${label}: rank ${rank}`).to.equal(2);
      expect(c.model.some((t) => t.name === 'conv1.weight'), `${label}: rank ${rank}: model`).to.equal(true);
      expect(c.trainer.length, `${label}: rank ${rank}: trainer state`).to.be.above(0);
    }
    return epochs;
  }

  it('a worker killed with SIGKILL stops the job, leaves no process and a checkpoint to resume', async function () {
    const { dir, token, launcher } = await jobAfterFirstCheckpoint();
    const workers = await waitFor('both workers', () => {
      const ws = jobProcesses(token).filter((p) => p.ppid === launcher.child.pid && p.rank !== undefined);
      return ws.length === 2 ? ws : undefined;
    }, 10000);
    const victim = workers.find((w) => w.rank === 1);
    const killedAt = Date.now();
    process.kill(victim.pid, 'SIGKILL');

    const exit = await exitWithin(launcher, 30000);
    const stopMs = Date.now() - killedAt;
    expect(exit.timedOut, `the launcher still runs 30 s after rank 1 was killed; stderr:\n${launcher.stderr}`).to.not.equal(true);
    expect(exit.code, `launcher exit; stderr:\n${exit.stderr}`).to.equal(1);
    expect(exit.stderr).to.include('accordion launch: rank 1 was killed by SIGKILL');
    expect(exit.stderr).to.match(/accordion launch: job failed: .*rank 1.*SIGKILL/);
    expect(jobProcesses(token), 'processes of the job left running').to.deep.equal([]);

    const epochs = expectCheckpointLoads(dir, 'after the kill');
    expect(epochs).to.be.at.least(1);

    const resumeStarted = Date.now();
    const resumed = launchJob(['--resume', dir, '--epochs', String(epochs + 1)], newToken());
    const resumedExit = await exitWithin(resumed, 120000);
    expect(resumedExit.timedOut, `the resumed run did not finish; stderr:\n${resumed.stderr}`).to.not.equal(true);
    expect(resumedExit.code, `resumed run; stderr:\n${resumedExit.stderr}`).to.equal(0);
    expect(latestOf(dir)).to.equal(`epoch-${String(epochs + 1).padStart(4, '0')}`);
    expect(expectCheckpointLoads(dir, 'after resuming')).to.equal(epochs + 1);
    expect(loadCheckpoint(dir, 0).position.extra.history).to.have.length(epochs + 1);
    this.test.title += ` [stopped ${stopMs} ms after the kill, resumed epoch ${epochs + 1} in ${Date.now() - resumeStarted} ms]`;
  });

  it('a frozen worker (SIGSTOP) ends the job after the timeout, and the error names it, not the rank that waited', async function () {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'accordion-dp-run-'));
    runDirs.push(dir);
    const token = newToken();
    const timeoutMs = 3000;
    const launcher = launchJob(['--epochs', '50', '--out', dir, '--timeout', String(timeoutMs)], token);
    await waitFor('the first checkpoint', () => {
      if (launcher.done) throw new Error(`the job ended before its first checkpoint; stderr:\n${launcher.stderr}`);
      return latestOf(dir);
    }, 120000);
    const workers = jobProcesses(token).filter((p) => p.ppid === launcher.child.pid && p.rank !== undefined);
    const victim = workers.find((w) => w.rank === 1);
    const frozenAt = Date.now();
    process.kill(victim.pid, 'SIGSTOP');
    try {
      const exit = await exitWithin(launcher, timeoutMs + 15000);
      const stopMs = Date.now() - frozenAt;
      expect(exit.timedOut, `the launcher still runs ${timeoutMs + 15000} ms after rank 1 froze; stderr:\n${launcher.stderr}`).to.not.equal(true);
      expect(exit.code, `launcher exit; stderr:\n${exit.stderr}`).to.equal(1);
      // Rank 0 waited in a collective; its error names rank 1 as the one that did not answer.
      expect(exit.stderr).to.match(/accordion: .* failed on rank 0 of 2: rank 1 does not answer \(no heartbeat/);
      expect(exit.stderr).to.match(/accordion launch: job failed: rank 0 exited with code 1 \(rank 1 is stopped and did not answer\)/);
      expect(stopMs, 'the job should end soon after the timeout').to.be.below(timeoutMs + 10000);
      expect(jobProcesses(token), 'processes of the job left running').to.deep.equal([]);
      this.test.title += ` [ended ${stopMs} ms after the freeze]`;
    } finally {
      try {
        process.kill(victim.pid, 'SIGKILL');
        process.kill(victim.pid, 'SIGCONT');
      } catch {
        // already gone
      }
    }
  });

  it('a checkpoint of 2 workers resumes with 3 and with 1: each memory the mean of the saved ones (the mass owed to the averaged gradient kept), the shared state rank 0\'s', async function () {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'accordion-dp-regroup-'));
    runDirs.push(dir);
    // A small epoch (3 steps of 16 images per worker): the state, not the training, is under test.
    const topk = [...common, '--synthetic-train', '96', '--synthetic-test', '32', '--eval-batch-size', '32', '--compressor', 'topk', '--topk-ratio', '0.1', '--accordion', 'off'];
    const first = await exitWithin(start([CLI, 'train', ...topk, '--workers', '2', '--epochs', '1', '--out', path.join(dir, 'two')], { ACCORDION_JOB_TOKEN: newToken(), XDG_CACHE_HOME: cacheDir }), 240000);
    expect(first.code, first.stderr).to.equal(0);
    const saved = path.join(dir, 'two');
    const floats = (t) => new Float32Array(t.data.buffer.slice(t.data.byteOffset, t.data.byteOffset + t.data.byteLength));
    const byName = (list) => new Map(list.map((t) => [t.name, t]));
    const old = [0, 1].map((r) => byName(loadCheckpoint(saved, r).trainer));
    const memoryNames = [...old[0].keys()].filter((n) => n.startsWith('compressor.memory.'));
    expect(memoryNames.length, 'TopK memories in the checkpoint').to.be.above(10);
    // The two ranks' memories differ (their data shards do), so a mean is not one of them.
    expect(floats(old[0].get(memoryNames[0])).some((v, i) => v !== floats(old[1].get(memoryNames[0]))[i])).to.equal(true);
    for (const W of [3, 1]) {
      const states = Array.from({ length: W }, (_, r) => loadCheckpoint(saved, r, W));
      for (const name of memoryNames) {
        const a = floats(old[0].get(name)), b = floats(old[1].get(name));
        const owedBefore = Float64Array.from(a, (v, i) => (v + b[i]) / 2);
        const owedAfter = new Float64Array(a.length);
        for (const st of states) floats(byName(st.trainer).get(name)).forEach((v, i) => (owedAfter[i] += v / W));
        const worst = owedAfter.reduce((m, v, i) => Math.max(m, Math.abs(v - owedBefore[i]) / (Math.abs(owedBefore[i]) + 1e-30)), 0);
        expect(worst, `${name} with ${W} workers: (1/W')·Σ e' against (1/2)·Σ e`).to.be.below(1e-6);
      }
      for (const [r, st] of states.entries()) {
        const mine = byName(st.trainer);
        // Momentum and levels are rank 0's; a saved rank keeps its random streams, a new one draws its own.
        for (const [name, t] of old[0]) {
          if (name.startsWith('optimizer.') || name === 'compressor.levels') expect(Buffer.from(mine.get(name).data).equals(Buffer.from(t.data)), `${W} workers, rank ${r}: ${name}`).to.equal(true);
          if (name.startsWith('rng.')) expect(mine.has(name), `${W} workers, rank ${r}: ${name}`).to.equal(r < 2);
        }
      }
    }
    // The resumed jobs run: 3 workers and 1, each into its own directory.
    for (const W of [3, 1]) {
      const out = path.join(dir, `resumed-${W}`);
      const exit = await exitWithin(start([CLI, 'train', ...topk, '--workers', String(W), '--epochs', '2', '--resume', saved, '--out', out], { ACCORDION_JOB_TOKEN: newToken(), XDG_CACHE_HOME: cacheDir }), 300000);
      expect(exit.code, exit.stderr).to.equal(0);
      expect(exit.stderr).to.include(`resuming a run of 2 workers with ${W}`);
      expect(loadCheckpoint(out, 0).position.config.workers).to.equal(W);
      expect(loadCheckpoint(out, 0).position.epochsCompleted).to.equal(2);
    }
  });

  it('Ctrl-C (SIGINT to the process group) stops every process with status 130 and keeps the checkpoint', async function () {
    const { dir, token, launcher } = await jobAfterFirstCheckpoint();
    const before = latestOf(dir);
    const interruptedAt = Date.now();
    // A terminal sends SIGINT to the whole foreground process group, not just the launcher.
    process.kill(-launcher.child.pid, 'SIGINT');

    const exit = await exitWithin(launcher, 30000);
    const stopMs = Date.now() - interruptedAt;
    expect(exit.timedOut, `the launcher still runs 30 s after SIGINT; stderr:\n${launcher.stderr}`).to.not.equal(true);
    expect(exit.code, `launcher exit; stderr:\n${exit.stderr}`).to.equal(130);
    expect(exit.stderr).to.include('accordion launch: job failed:');
    expect(jobProcesses(token), 'processes of the job left running').to.deep.equal([]);
    // A checkpoint may have been published between our read and the signal, never a partial one.
    expect(Number(latestOf(dir).slice(6))).to.be.at.least(Number(before.slice(6)));
    expectCheckpointLoads(dir, 'after Ctrl-C');
    this.test.title += ` [stopped ${stopMs} ms after SIGINT]`;
  });

  it('SIGTERM to the launcher (a scheduler stopping the job) stops every process with status 143 and keeps the checkpoint', async function () {
    const { dir, token, launcher } = await jobAfterFirstCheckpoint();
    process.kill(launcher.child.pid, 'SIGTERM');
    const exit = await exitWithin(launcher, 30000);
    expect(exit.timedOut, `the launcher still runs 30 s after SIGTERM; stderr:\n${launcher.stderr}`).to.not.equal(true);
    expect(exit.code, `launcher exit; stderr:\n${exit.stderr}`).to.equal(143);
    expect(exit.stderr).to.include('interrupted by SIGTERM');
    expect(jobProcesses(token), 'processes of the job left running').to.deep.equal([]);
    expectCheckpointLoads(dir, 'after SIGTERM');
  });
});

describe('data parallel: resuming a launched job', function () {
  let cacheDir;
  let runDir;

  before(function () {
    cacheDir = fs.mkdtempSync(path.join(os.tmpdir(), 'accordion-dp-cache-'));
    runDir = fs.mkdtempSync(path.join(os.tmpdir(), 'accordion-dp-resume-'));
  });

  after(function () {
    for (const dir of [cacheDir, runDir]) fs.rmSync(dir, { recursive: true, force: true });
  });

  // Batch norm in training mode: each step starts from rank 0's running statistics.
  const common = ['--model', 'resnet18', '--width', '0.25', '--synthetic-train', '64', '--synthetic-test', '32', '--batch-size', '16', '--eval-batch-size', '16', '--compressor', 'powersgd', '--accordion-interval', '1', '--checkpoint-every', '1', '--workers', '2', '--quiet'];

  async function trainTo(dir, extra) {
    const job = start([CLI, 'train', ...common, ...extra], { ACCORDION_JOB_TOKEN: newToken(), XDG_CACHE_HOME: cacheDir });
    const exit = await exitWithin(job, 180000);
    expect(exit.timedOut, `the job did not finish; stderr:\n${job.stderr}`).to.not.equal(true);
    expect(exit.code, `job exit; stderr:\n${exit.stderr}`).to.equal(0);
    return JSON.parse(fs.readFileSync(path.join(dir, 'summary.json'), 'utf8'));
  }

  it('2 workers stopped after epoch 1 and resumed give the metrics of the uninterrupted run, and every rank holds rank 0\'s batch-norm statistics', async function () {
    const straightDir = path.join(runDir, 'straight');
    const splitDir = path.join(runDir, 'split');
    const straight = await trainTo(straightDir, ['--epochs', '2', '--out', straightDir]);
    await trainTo(splitDir, ['--epochs', '1', '--out', splitDir]);
    // Before the checkpoint every rank took rank 0's running statistics (PyTorch DDP's semantics).
    const epoch1 = path.join(splitDir, 'checkpoints', 'epoch-0001');
    const rank0 = loadCheckpoint(epoch1, 0);
    const rank1 = loadCheckpoint(epoch1, 1);
    for (const name of ['bn1.running_mean', 'layer4.1.bn2.running_var', 'conv1.weight'])
      expect(Buffer.from(rank0.model.find((t) => t.name === name).data).equals(Buffer.from(rank1.model.find((t) => t.name === name).data)), `rank 1's ${name}`).to.equal(true);
    const resumed = await trainTo(splitDir, ['--epochs', '2', '--resume', splitDir]);

    const fields = ['trainLoss', 'trainAccuracy', 'testLoss', 'testAccuracy', 'samples', 'floatsSent', 'floatsSentTotal', 'overheadFloats', 'levels', 'norms', 'lr'];
    const pick = (summary) => summary.epochs.map((e) => Object.fromEntries(fields.map((f) => [f, e[f]])));
    expect(pick(resumed)).to.deep.equal(pick(straight));
    // 64 images over 2 workers at batch 16: 2 steps an epoch, each agreeing on finiteness with 2
    // floats after rank 0's 2,400 running statistics were broadcast (a mean and a variance for each of
    // the 1,200 batch-norm channels of ResNet-18 at a quarter of its width).
    expect(straight.epochs.map((e) => e.overheadFloats)).to.deep.equal([2 * 2402, 2 * 2402]);
    // Rank 0's statistics broadcast before each step and once more before evaluation.
    expect(straight.epochs.map((e) => e.broadcastFloats)).to.deep.equal([3 * 2400, 3 * 2400]);
    // Every rank's final state, buffers included, is the uninterrupted run's.
    for (const rank of [0, 1]) {
      const a = loadCheckpoint(straightDir, rank);
      const b = loadCheckpoint(splitDir, rank);
      for (const list of ['model', 'trainer']) {
        const want = new Map(a[list].map((t) => [t.name, Buffer.from(t.data)]));
        const got = new Map(b[list].map((t) => [t.name, Buffer.from(t.data)]));
        expect([...got.keys()].sort(), `rank ${rank} ${list}`).to.deep.equal([...want.keys()].sort());
        for (const [name, bytes] of want) expect(got.get(name).equals(bytes), `rank ${rank}: ${name}`).to.equal(true);
      }
    }
  });
});
