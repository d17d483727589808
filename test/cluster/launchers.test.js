// Workers started by other launchers: 2 real ranks under a torchrun-like and a SLURM-like environment
// and under Open MPI's mpirun, each against the same job under our own launcher, and workers of
// `accordion launch` that stop when their launcher is killed outright.
import { spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import { expect } from 'chai';
import { freePort } from '../helpers/ports.js';
import { loadCheckpoint } from '../../lib/index.js';
import { exitWithin, processesWithEnv, waitFor } from '../helpers/processes.js';
import { CLI } from '../helpers/paths.js';

// ---------------------------------------------------------------------------------------------
// Real jobs. Every process is started with a marker in its environment, and killLeftovers kills
// whatever still carries it, so a failed test never leaves ranks behind.

const marker = `launchers-test-${randomBytes(6).toString('hex')}`;
const live = new Set();

/** Processes (not zombies) whose environment holds `name`=`value`, as { pid, ppid }. */
function markedProcesses(name, value) {
  return processesWithEnv(name, value).map(({ pid, ppid }) => ({ pid, ppid }));
}

/** The test's environment without any launcher's variables, plus the marker. */
function cleanEnv(extra) {
  const env = {};
  for (const [name, value] of Object.entries(process.env))
    if (!/^(RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|MASTER_ADDR|MASTER_PORT|TORCHELASTIC_.*|SLURM_.*|OMPI_.*|PMIX_.*|PMI_.*|MPI_LOCALRANKID|ACCORDION_.*)$/.test(name))
      env[name] = value;
  return { ...env, OMP_NUM_THREADS: '1', LAUNCHERS_TEST: marker, ...extra };
}

/** Starts a process; `exited` resolves with { code, signal, stdout, stderr } once it has exited. */
function start(command, args, env, options = {}) {
  const child = spawn(command, args, { env, stdio: ['ignore', 'pipe', 'pipe'], ...options });
  const entry = { child, stdout: '', stderr: '' };
  live.add(entry);
  child.stdout.setEncoding('utf8').on('data', (s) => (entry.stdout += s));
  child.stderr.setEncoding('utf8').on('data', (s) => (entry.stderr += s));
  entry.exited = new Promise((resolve) => {
    child.once('error', (err) => resolve({ code: null, signal: null, stdout: entry.stdout, stderr: `${entry.stderr}${err.message}` }));
    child.once('close', (code, signal) => {
      live.delete(entry);
      resolve({ code, signal, stdout: entry.stdout, stderr: entry.stderr });
    });
  });
  return entry;
}

/** A TCP server listening on 127.0.0.1:`port`. */
function listenOn(port) {
  return new Promise((resolve, reject) => {
    const server = net.createServer((socket) => socket.destroy());
    server.once('error', reject);
    server.listen(port, '127.0.0.1', () => resolve(server));
  });
}

/** A port held by a listening server (as torchrun's store holds MASTER_PORT) whose next port is free. */
async function heldPortBeforeFreeOne() {
  for (let attempt = 0; attempt < 20; attempt++) {
    const port = await freePort();
    const server = await listenOn(port).catch(() => undefined);
    const next = server && (await listenOn(port + 1).catch(() => undefined));
    if (next) {
      await new Promise((resolve) => next.close(resolve));
      return { port, server };
    }
    server?.close();
  }
  throw new Error('found no free port followed by a free one');
}

async function killLeftovers() {
  for (const entry of live) entry.child.kill('SIGKILL');
  for (const p of markedProcesses('LAUNCHERS_TEST', marker)) {
    try {
      process.kill(p.pid, 'SIGKILL');
    } catch {
      // already gone
    }
  }
  await Promise.all([...live].map((e) => exitWithin(e, 5000)));
}

describe('launchers: 2 ranks started by other launchers train as under accordion launch', function () {
  let root;
  let reference;
  afterEach(killLeftovers);
  // One short epoch of the synthetic preset on each of 2 ranks.
  const trainArgs = ['--model', 'resnet18', '--width', '0.25', '--dataset', 'synthetic', '--synthetic-train', '64', '--synthetic-test', '32', '--batch-size', '16',
    '--eval-batch-size', '16', '--epochs', '1', '--quiet'];

  before(async function () {
    this.timeout(240000);
    root = fs.mkdtempSync(path.join(os.tmpdir(), 'accordion-launchers-'));
    reference = path.join(root, 'reference');
    const job = start(process.execPath, [CLI, 'train', ...trainArgs, '--workers', '2', '--out', reference], cleanEnv({ XDG_CACHE_HOME: path.join(root, 'cache') }));
    const exit = await exitWithin(job, 180000);
    expect(exit.timedOut, `the reference job did not finish; stderr:\n${job.stderr}`).to.not.equal(true);
    expect(exit.code, `the reference job exited with ${exit.code ?? exit.signal}; stderr:\n${exit.stderr}`).to.equal(0);
  });

  after(function () {
    if (root) fs.rmSync(root, { recursive: true, force: true });
  });

  /** Each rank's exit must be 0, within 3 minutes. */
  async function expectAllSucceeded(entries, label) {
    const exits = await Promise.all(entries.map((e) => exitWithin(e, 180000)));
    exits.forEach((exit, rank) => {
      expect(exit.timedOut, `${label}: process ${rank} did not finish; stderr:\n${entries[rank].stderr}`).to.not.equal(true);
      expect(exit.code, `${label}: process ${rank} exited with ${exit.code ?? exit.signal}; stderr:\n${exit.stderr}`).to.equal(0);
    });
    return exits;
  }

  /**
   * The run in `dir` is the reference job's: the same metrics for the epoch, and for every rank the
   * same model and trainer state (momentum, running statistics), bit for bit. Ranks that ran alone,
   * or any other world, would see other batches and end elsewhere.
   */
  function expectSameAsReference(dir, label) {
    const summary = (d) => JSON.parse(fs.readFileSync(path.join(d, 'summary.json'), 'utf8'));
    const fields = ['trainLoss', 'trainAccuracy', 'testLoss', 'testAccuracy', 'samples', 'batchSize', 'floatsSent', 'lr'];
    const pick = (s) => s.epochs.map((e) => Object.fromEntries(fields.map((f) => [f, e[f]])));
    const want = summary(reference);
    expect(want.epochs.length).to.equal(1);
    expect(pick(summary(dir)), `${label}: metrics`).to.deep.equal(pick(want));
    for (const rank of [0, 1]) {
      const a = loadCheckpoint(reference, rank);
      const b = loadCheckpoint(dir, rank);
      expect(b.position.config.workers, `${label}: rank ${rank}: workers`).to.equal(2);
      for (const list of ['model', 'trainer']) {
        const got = new Map(b[list].map((t) => [t.name, Buffer.from(t.data)]));
        expect([...got.keys()].sort(), `${label}: rank ${rank} ${list}`).to.deep.equal(a[list].map((t) => t.name).sort());
        for (const t of a[list]) expect(got.get(t.name).equals(Buffer.from(t.data)), `${label}: rank ${rank}: ${t.name}`).to.equal(true);
      }
    }
  }

  it("a torchrun-like environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT held by torchrun's own store) set by hand", async function () {
    this.timeout(240000);
    const dir = path.join(root, 'torchrun');
    // torchrun's agent listens on MASTER_PORT (its store) while the workers run; the job's store takes the next port.
    const { port, server: agentStore } = await heldPortBeforeFreeOne();
    try {
      const ranks = [0, 1].map((rank) =>
        start(process.execPath, [CLI, 'train', ...trainArgs, '--out', dir], cleanEnv({
          XDG_CACHE_HOME: path.join(root, 'cache'),
          RANK: String(rank),
          WORLD_SIZE: '2',
          LOCAL_RANK: String(rank),
          LOCAL_WORLD_SIZE: '2',
          MASTER_ADDR: '127.0.0.1',
          MASTER_PORT: String(port),
          TORCHELASTIC_RUN_ID: 'none',
          TORCHELASTIC_USE_AGENT_STORE: 'True',
        })),
      );
      await expectAllSucceeded(ranks, 'torchrun-like');
      expectSameAsReference(dir, 'torchrun-like');
    } finally {
      agentStore.close();
    }
  });

  it('a SLURM-like environment (an srun step: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODELIST) set by hand', async function () {
    this.timeout(240000);
    const dir = path.join(root, 'slurm');
    const port = await freePort();
    // Rank 0 is on the first host of the list; a later one would not be reachable.
    const ranks = [0, 1].map((rank) =>
      start(process.execPath, [CLI, 'train', ...trainArgs, '--out', dir], cleanEnv({
        XDG_CACHE_HOME: path.join(root, 'cache'),
        SLURM_JOB_ID: '4242',
        SLURM_STEP_ID: '0',
        SLURM_PROCID: String(rank),
        SLURM_NTASKS: '2',
        SLURM_LOCALID: String(rank),
        SLURM_NODELIST: 'localhost,unreachable-node[2-3]',
        MASTER_PORT: String(port),
      })),
    );
    await expectAllSucceeded(ranks, 'SLURM-like');
    expectSameAsReference(dir, 'SLURM-like');
  });

  it("2 ranks under Open MPI's mpirun", async function () {
    this.timeout(240000);
    const version = spawnSync('mpirun', ['--version'], { encoding: 'utf8' });
    if (version.error) expect.fail(`mpirun is not available (${version.error.message}): install openmpi-bin (apt-get install openmpi-bin)`);
    if (!/Open MPI/.test(version.stdout + version.stderr)) expect.fail(`mpirun is not Open MPI's (${version.stdout.trim()}): install openmpi-bin`);
    const dir = path.join(root, 'openmpi');
    const port = await freePort();
    const env = cleanEnv({ XDG_CACHE_HOME: path.join(root, 'cache'), MASTER_ADDR: '127.0.0.1', MASTER_PORT: String(port) });
    const asRoot = process.getuid?.() === 0 ? ['--allow-run-as-root'] : [];
    const forwarded = ['MASTER_ADDR', 'MASTER_PORT', 'OMP_NUM_THREADS', 'XDG_CACHE_HOME', 'LAUNCHERS_TEST'].flatMap((name) => ['-x', name]);
    const job = start('mpirun', [...asRoot, '--oversubscribe', '-n', '2', ...forwarded, process.execPath, CLI, 'train', ...trainArgs, '--out', dir], env);
    await expectAllSucceeded([job], 'mpirun');
    expectSameAsReference(dir, 'mpirun');
  });

  it('a rank started by another launcher without --out is refused before the rendezvous (exit 2)', function () {
    const r = spawnSync(process.execPath, [CLI, 'train', ...trainArgs], { encoding: 'utf8', timeout: 60000,
      env: cleanEnv({ SLURM_JOB_ID: '1', SLURM_STEP_ID: '0', SLURM_PROCID: '1', SLURM_NTASKS: '2', SLURM_LOCALID: '1', SLURM_NODELIST: 'localhost' }) });
    expect(r.status, r.stderr).to.equal(2);
    expect(r.stderr).to.include('under SLURM (srun) the ranks write one run directory: give every rank the same --out (or --resume)');
  });

  it('accordion info shows the launcher detected, or running alone', function () {
    const info = (extra) => {
      const r = spawnSync(process.execPath, [CLI, 'info'], { encoding: 'utf8', env: cleanEnv(extra), timeout: 60000 });
      expect(r.status, r.stderr).to.equal(0);
      return JSON.parse(r.stdout).job;
    };
    expect(info({})).to.equal('running alone');
    expect(info({ SLURM_JOB_ID: '1', SLURM_STEP_ID: '0', SLURM_PROCID: '1', SLURM_NTASKS: '4', SLURM_LOCALID: '1', SLURM_NODELIST: 'gpu[07-08]' })).to.equal(
      'SLURM (srun): rank 1 of 4, local rank 1, master gpu07:29500 (rank 0 hosts the store)',
    );
    expect(info({ RANK: '2', WORLD_SIZE: '3', LOCAL_RANK: '0', MASTER_ADDR: 'm', MASTER_PORT: '23456' })).to.equal(
      'torchrun or Kubeflow PyTorchJob: rank 2 of 3, local rank 0, master m:23456 (rank 0 hosts the store)',
    );
    expect(info({ OMPI_COMM_WORLD_RANK: '1', OMPI_COMM_WORLD_SIZE: '2' })).to.equal(
      "error: Open MPI gives no master address: set MASTER_ADDR (and MASTER_PORT) to rank 0's host",
    );
  });
});

describe('launchers: workers of accordion launch when the launcher is killed', function () {
  let root;
  afterEach(killLeftovers);

  before(function () {
    root = fs.mkdtempSync(path.join(os.tmpdir(), 'accordion-lifeline-'));
  });

  after(function () {
    if (root) fs.rmSync(root, { recursive: true, force: true });
  });

  const epochsIn = (dir) => {
    const checkpoints = path.join(dir, 'checkpoints');
    return fs.existsSync(checkpoints) ? fs.readdirSync(checkpoints).filter((n) => /^epoch-\d+$/.test(n)).sort() : [];
  };

  it('stop at once when the launcher gets SIGKILL (--quiet), and write no further checkpoint', async function () {
    this.timeout(240000);
    const dir = path.join(root, 'run');
    const job = `lifeline-${randomBytes(4).toString('hex')}`;
    const launcher = start(
      process.execPath,
      [CLI, 'train', '--model', 'resnet18', '--width', '0.25', '--dataset', 'synthetic', '--synthetic-train', '256', '--synthetic-test', '64', '--batch-size', '16',
        '--eval-batch-size', '64', '--epochs', '50', '--checkpoint-every', '1', '--quiet', '--workers', '2', '--out', dir],
      cleanEnv({ XDG_CACHE_HOME: path.join(root, 'cache'), LIFELINE_JOB: job }),
    );
    const workers = () => markedProcesses('LIFELINE_JOB', job).filter((p) => p.pid !== launcher.child.pid);
    await waitFor('the first checkpoint', () => {
      if (launcher.child.exitCode !== null) throw new Error(`the job ended before its first checkpoint; stderr:\n${launcher.stderr}`);
      return epochsIn(dir).length > 0;
    }, 180000);
    const before = epochsIn(dir);
    const pids = workers().map((p) => p.pid);
    expect(pids, 'the launcher has two workers').to.have.length(2);
    launcher.child.kill('SIGKILL');
    // Bounded, generous: the workers would otherwise train on through 50 epochs.
    await waitFor('both workers to stop after the launcher was killed', () => pids.every((pid) => !workers().some((p) => p.pid === pid)), 30000);
    expect(workers(), 'processes of the job left running').to.deep.equal([]);
    expect(epochsIn(dir), 'checkpoints after the launcher was killed').to.deep.equal(before);
  });
});

describe('launchers: accordion launch --max-restarts', function () {
  let root;
  afterEach(killLeftovers);

  before(function () {
    root = fs.mkdtempSync(path.join(os.tmpdir(), 'accordion-restarts-'));
  });

  after(function () {
    if (root) fs.rmSync(root, { recursive: true, force: true });
  });

  const train = ['--model', 'resnet18', '--width', '0.25', '--dataset', 'synthetic', '--synthetic-train', '128', '--synthetic-test', '32', '--batch-size', '16',
    '--eval-batch-size', '32', '--checkpoint-every', '1', '--seed', '3', '--quiet'];
  const launch = async (job, args) =>
    start(process.execPath, [CLI, 'launch', '--nproc-per-node', '2', '--master-port', String(await freePort()), ...args], cleanEnv({ XDG_CACHE_HOME: path.join(root, 'cache'), RESTART_JOB: job }));

  it('kill -9 of a worker mid-epoch: the job restarts from the last checkpoint and ends with the weights of a run stopped and resumed there by hand', async function () {
    this.timeout(480000);
    const dir = path.join(root, 'restarted');
    const job = `restart-${randomBytes(4).toString('hex')}`;
    // Epochs of about 0.3 s at quarter width: six leave the kill time to land before the job ends.
    const epochs = '6';
    const launcher = await launch(job, ['--max-restarts', '1', '--', ...train, '--epochs', epochs, '--out', dir]);
    const latest = path.join(dir, 'checkpoints', 'latest');
    await waitFor('the first checkpoint', () => {
      if (launcher.child.exitCode !== null) throw new Error(`the job ended before its first checkpoint; stderr:\n${launcher.stderr}`);
      return fs.existsSync(latest);
    }, 240000);
    const rank1 = processesWithEnv('RESTART_JOB', job).find((p) => p.environ.includes('RANK=1'));
    expect(rank1, 'rank 1 of the first attempt').to.not.equal(undefined);
    process.kill(rank1.pid, 'SIGKILL');
    const exit = await exitWithin(launcher, 300000);
    expect(exit.timedOut, 'the restarted job hung').to.not.equal(true);
    expect(exit.code, exit.stderr).to.equal(0);
    expect(exit.stderr).to.include('accordion launch: job failed: rank 1 was killed by SIGKILL');
    const from = /restart 1 of 1, every worker from the checkpoint (\S+epoch-(\d+))/.exec(exit.stderr);
    expect(from, exit.stderr).to.not.equal(null);
    const resumedAt = Number(from[2]);
    expect(markedProcesses('RESTART_JOB', job), 'processes of the job left running').to.deep.equal([]);

    // By hand: the same job stopped after that checkpoint's epoch, then resumed to the end.
    const manual = path.join(root, 'manual');
    const first = await exitWithin(await launch(`${job}-a`, ['--', ...train, '--epochs', String(resumedAt), '--out', manual]), 300000);
    expect(first.code, first.stderr).to.equal(0);
    const second = await exitWithin(await launch(`${job}-b`, ['--', ...train, '--epochs', epochs, '--resume', manual]), 300000);
    expect(second.code, second.stderr).to.equal(0);
    const a = loadCheckpoint(dir, 0).model, b = loadCheckpoint(manual, 0).model;
    expect(a.map((t) => t.name)).to.deep.equal(b.map((t) => t.name));
    const differ = a.filter((t, i) => !Buffer.from(t.data).equals(Buffer.from(b[i].data))).map((t) => t.name);
    expect(differ, `tensors that differ (restarted from epoch ${resumedAt})`).to.deep.equal([]);
    this.test.title += ` [restarted from epoch ${resumedAt}]`;
  });

  it('a job that fails on every attempt ends after N restarts with the last attempt\'s exit code, leaving nothing running', async function () {
    this.timeout(240000);
    const dir = path.join(root, 'failing');
    const job = `failing-${randomBytes(4).toString('hex')}`;
    const launcher = await launch(job, ['--max-restarts', '2', '--', '--model', 'resnet18', '--dataset', 'cifar10', '--data', path.join(root, 'no-such-data'), '--quiet', '--out', dir]);
    const exit = await exitWithin(launcher, 200000);
    expect(exit.timedOut, 'the launcher hung').to.not.equal(true);
    expect(exit.code, exit.stderr).to.equal(1);
    expect(exit.stderr.match(/accordion launch: job failed: rank \d exited with code \d+/g), exit.stderr).to.have.length(3);
    expect(exit.stderr).to.include('restart 1 of 2, from the start');
    expect(exit.stderr).to.include('restart 2 of 2, from the start');
    expect(exit.stderr).to.include('no restart left (2 used)');
    expect(markedProcesses('RESTART_JOB', job), 'processes of the job left running').to.deep.equal([]);
  });

  it('refuses --max-restarts over several nodes, and a count that is not a number', function () {
    const run = (args) => spawnSync(process.execPath, [CLI, 'launch', ...args, '--', '--model', 'resnet18'], { encoding: 'utf8', env: cleanEnv({}) });
    let r = run(['--nnodes', '2', '--max-restarts', '1', '--token', 'x']);
    expect(r.status).to.equal(2);
    expect(r.stderr).to.include('--max-restarts restarts the job of one node');
    r = run(['--max-restarts', 'two']);
    expect(r.status).to.equal(2);
    expect(r.stderr).to.include("option --max-restarts: expected an integer, got 'two'");
  });
});

