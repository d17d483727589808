// The GPU check's Node driver (scripts/gpu-check/), checked on the CPU: its plan, its usage, a stage
// on a machine with no runtime to run with, the summary it reads back from its rows, and the
// dry runs of its experiments on the CPU. A stage past the device check needs a GPU machine.
import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { ROOT } from '../helpers/paths.js';
import { requireFashionMnist } from '../helpers/outside.js';

const MAIN = path.join(ROOT, 'scripts', 'gpu-check', 'main.js');
const RUN = path.join(ROOT, 'scripts', 'gpu-check', 'run.sh');
const rowsOf = (file) => fs.readFileSync(file, 'utf8').trim().split('\n').map((l) => JSON.parse(l));

/** A stage run dry on the CPU (GPU_CHECK_DRY=1) with its results in `out`: it must pass; its rows. */
function dryRun(stage, out, env = {}) {
  const r = spawnSync(process.execPath, [MAIN, stage], { encoding: 'utf8', env: { ...process.env, OUT: out, GPU_CHECK_DRY: '1', ...env } });
  expect(r.status, r.stdout + r.stderr).to.equal(0);
  return rowsOf(path.join(out, 'gpu-check.jsonl'));
}

describe('the GPU check in Node (scripts/gpu-check/)', function () {
  this.timeout(60_000);

  it('plans its stages in order, each limit inside a 10-minute command and above its expected time, all chained within a session\'s 15 device minutes', function () {
    const r = spawnSync(process.execPath, [MAIN, 'plan'], { encoding: 'utf8' });
    expect(r.status, r.stderr).to.equal(0);
    const stages = [...r.stdout.matchAll(/^\s+\d+\s+bash scripts\/gpu-check\/run\.sh (\S+)\s+([\d.]+) min\s+(\d+) s/gm)].map((m) => ({ stage: m[1], minutes: Number(m[2]), limit: Number(m[3]) }));
    expect(stages.map((s) => s.stage)).to.deep.equal(['probe', 'abi-lab', 'sanitizer', 'suite', 'bench-quick', 'bench-full']);
    for (const s of stages) {
      expect(s.limit, `${s.stage}: within a command's 10 minutes`).to.be.at.most(480);
      expect(s.limit, `${s.stage}: covers its expected time`).to.be.at.least(s.minutes * 60);
    }
    const chained = stages.reduce((a, s) => a + s.minutes, 0) + 1;
    expect(chained).to.be.at.most(15);
    expect(r.stdout).to.include(`= ${chained.toFixed(1)} min with the stages chained`);
  });

  it('refuses an unknown stage with exit code 2, naming the stages', function () {
    const r = spawnSync(process.execPath, [MAIN, 'lab'], { encoding: 'utf8' });
    expect(r.status).to.equal(2);
    expect(r.stderr).to.match(/^usage: node scripts\/gpu-check\/main\.js plan \| probe \| abi-lab/);
  });

  it('ends a stage with no runtime to run with: exit code 6, rows begin, no runtime, end, and the two files only', function () {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'acc-gpu-check-'));
    try {
      fs.cpSync(path.dirname(RUN), path.join(dir, 'scripts', 'gpu-check'), { recursive: true });
      const out = path.join(dir, 'out');
      const r = spawnSync('bash', [path.join(dir, 'scripts', 'gpu-check', 'run.sh'), 'suite'], { encoding: 'utf8', env: { ...process.env, OUT: out } });
      expect(r.status, r.stdout + r.stderr).to.equal(6);
      expect(r.stdout).to.include('no .node-dist/runtime.tar.xz');
      const rows = rowsOf(path.join(out, 'gpu-check.jsonl'));
      expect(rows.map((row) => row.event)).to.deep.equal(['begin', 'no runtime', 'end']);
      expect(rows.every((row) => row.stage === 'suite')).to.equal(true);
      expect(rows[2]).to.include({ status: 'no runtime', exitCode: 6 });
      expect(fs.readdirSync(out).sort()).to.deep.equal(['gpu-check.jsonl', 'gpu-check.log']);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it('summarises rows stage by stage: passed families together, every failure on a line of its own', function () {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'acc-gpu-summary-'));
    try {
      const file = path.join(dir, 'gpu-check.jsonl');
      const rows = [
        { stage: 'abi-lab', event: 'abi', pass: true },
        { stage: 'abi-lab', event: 'family', family: 'conv', status: 'passed' },
        { stage: 'abi-lab', event: 'family', family: 'pool', status: 'passed' },
        { stage: 'abi-lab', event: 'family', family: 'lstm', status: 'crashed', error: 'timed out after 60 s' },
        { stage: 'abi-lab', event: 'end', status: 'failed', exitCode: 1, seconds: 99 },
        { stage: 'suite', event: 'test', test: 'a test', state: 'failed', error: 'AssertionError: 1 to equal 2\n  at …' },
        { stage: 'suite', event: 'tests', passes: 3, failures: 1, pending: 0 },
        { stage: 'suite', event: 'end', status: 'failed', exitCode: 1, seconds: 40 },
      ];
      fs.writeFileSync(file, rows.map((r) => JSON.stringify(r)).join('\n') + '\nnot json\n');
      const r = spawnSync(process.execPath, [MAIN, 'summary', file], { encoding: 'utf8' });
      expect(r.status, r.stderr).to.equal(0);
      expect(r.stdout.trimEnd().split('\n')).to.deep.equal([
        '  abi: passed',
        '  lab lstm: crashed (timed out after 60 s)',
        '  lab families passed (2): conv, pool',
        'abi-lab: failed (exit 1, 99 s)',
        '  FAILED a test: AssertionError: 1 to equal 2',
        '  tests: 3 passing, 1 failing, 0 pending',
        'suite: failed (exit 1, 40 s)',
        '  (an unreadable line: not json)',
      ]);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it('runs the reproduce experiment dry on the CPU (GPU_CHECK_DRY=1): two pilot epochs, then each run a row for 2 seeds, and the report', function () {
    this.timeout(600_000);
    requireFashionMnist();
    const out = fs.mkdtempSync(path.join(os.tmpdir(), 'acc-gpu-reproduce-'));
    try {
      const rows = dryRun('reproduce', out);
      const plan = rows.find((row) => row.event === 'reproduce plan');
      expect(plan.epochs).to.equal(2);
      expect(plan.epochSeconds).to.be.above(0);
      const runs = rows.filter((row) => row.event === 'reproduce run');
      expect(runs.map((row) => `${row.config} ${row.seed}`)).to.have.members(['low 1', 'high 1', 'accordion 1', 'low 2', 'high 2', 'accordion 2']);
      for (const run of runs) {
        expect(run.exitCode).to.equal(0);
        expect(run.testAccuracies).to.have.length(2);
      }
      expect(rows.find((row) => row.event === 'reproduce report').exitCode).to.equal(0);
      expect(fs.readFileSync(path.join(out, 'reproduce', 'reproduce-resnet18-powersgd-quick.md'), 'utf8')).to.include('static low (--compressor powersgd --rank 2)');
      expect(rows.at(-1)).to.include({ event: 'end', status: 'passed', exitCode: 0 });
    } finally {
      fs.rmSync(out, { recursive: true, force: true });
    }
  });

  it('runs the precision experiment dry on the CPU (GPU_CHECK_DRY=1): no lab, the GPU tests pending, the LSTM in fp32 and bf16, then each PyTorch configuration and the engine a row with its step, repeats on the CPU and the compiled one left out', function () {
    this.timeout(600_000);
    const out = fs.mkdtempSync(path.join(os.tmpdir(), 'acc-gpu-precision-'));
    try {
      const all = dryRun('precision', out);
      expect(Object.values(all.find((row) => row.event === 'lab summary').families)).to.satisfy((v) => v.every((s) => s.startsWith('not run')));
      const tests = all.find((row) => row.event === 'tests');
      expect([tests.failures, tests.pending > 0]).to.deep.equal([0, true]);
      const benches = all.filter((row) => row.event === 'bench');
      expect(benches.map((row) => `${row.bench} ${row.status}`)).to.deep.equal(['lstm-fp32 passed', 'lstm-bf16 passed']);
      expect(benches.map((row) => row.result.options.precision)).to.deep.equal(['fp32', 'bf16']);
      const rows = all.filter((row) => row.event === 'peer');
      expect(rows.map((row) => `${row.model} ${row.config}`)).to.deep.equal(['resnet18 fp32-all-algorithms', 'resnet18 bf16-autocast-channels-last', 'engine fp32', 'engine bf16']);
      for (const row of rows.slice(0, 2)) {
        expect(row.status).to.equal('passed');
        expect(row.result.step_ms_median).to.be.above(0);
        expect(row.result.autocast).to.equal(row.config.startsWith('bf16'));
        expect(row.result.channels_last).to.equal(row.config.startsWith('bf16'));
      }
      for (const row of rows.slice(2)) {
        expect(row.status, row.config).to.equal('passed');
        expect(row.result.results.map((x) => x.model)).to.deep.equal(['resnet18']); // a dry run's engine rows: ResNet-18 alone
      }
      expect(all.at(-1)).to.include({ event: 'end', exitCode: 0 });
    } finally {
      fs.rmSync(out, { recursive: true, force: true });
    }
  });

  it('runs the prebuilt experiment dry on the CPU (GPU_CHECK_DRY=1): the platform package in a fresh node_modules gives the addon and its bundled libraries, and trains an epoch', function () {
    this.timeout(300_000);
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'acc-gpu-prebuilt-'));
    try {
      const built = spawnSync(process.execPath, [path.join(ROOT, 'scripts', 'platform-package.js'), '--out', path.join(dir, 'dist')], { encoding: 'utf8' });
      expect(built.status, built.stdout + built.stderr).to.equal(0);
      const tarball = path.join(dir, 'prebuilt.tar.xz');
      const packed = spawnSync('sh', ['-c', `tar -C "${path.join(dir, 'dist')}" -cf - linux-x64-gnu | xz -0 -T2 > "${tarball}"`], { encoding: 'utf8' });
      expect(packed.status, packed.stderr).to.equal(0);
      const row = dryRun('prebuilt', path.join(dir, 'out'), { ACCORDION_PREBUILT: tarball }).find((x) => x.event === 'prebuilt');
      expect(row).to.include({ status: 'passed', device: 'cpu', trainExitCode: 0 });
      expect(row.addon.kind).to.equal('platform package');
      expect(row.libraries['libdnnl.so.2']).to.match(/node_modules\/@accordion-engine\/linux-x64-gnu\/prebuilds\/linux-x64\/libdnnl\.so\.2$/);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
