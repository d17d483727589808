// The kernel lab, checked on the CPU: the lab itself needs a GPU, but whether its verdicts can be
// trusted and what its rows look like do not (the GPU check that runs it: test/gpu/gpu-check.test.js).
// compare_check.cpp is compiled with the C++ compiler the addon is built with and must fail
// unwritten (NaN-poisoned), NaN and Inf outputs, keep a NaN error instead of dropping it, and write
// rows that parse as JSON. kernel_check (built when nvcc is) checks its float64 references against
// the CPU without a device, and says when there is none.
import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { gpuUnavailable } from '../helpers/devices.js';
import { ROOT } from '../helpers/paths.js';

const SOURCE = path.join(ROOT, 'cuda', 'lab', 'compare_check.cpp');
const KERNEL_CHECK = path.join(ROOT, 'build', 'Release', 'kernel_check');

describe('kernel lab: the comparison of outputs (CPU)', function () {
  this.timeout(120_000);
  let dir, binary;
  before(function () {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'acc-lab-'));
    binary = path.join(dir, 'compare_check');
    const compiler = process.env.CXX || 'c++';
    const built = spawnSync(compiler, ['-std=c++17', '-O1', '-Wall', '-Wextra', '-Werror', '-o', binary, SOURCE], { encoding: 'utf8' });
    if (built.error) expect.fail(`${compiler} could not be started (${built.error.message}): install a C++ compiler (apt-get install g++), as the addon's build needs`);
    expect(built.status, built.stderr).to.equal(0);
  });
  after(() => fs.rmSync(dir, { recursive: true, force: true }));

  it('fails unwritten, NaN and Inf outputs and never drops a NaN error (compare_check.cpp)', function () {
    const r = spawnSync(binary, [], { encoding: 'utf8' });
    expect(r.status, r.stdout + r.stderr).to.equal(0);
    expect(r.stdout).to.include('fails unwritten, NaN and Inf outputs and keeps NaN errors');
  });

  it('writes each check as one line of JSON: stage, family, verdict, a NaN error as null, the algorithms, why skipped', function () {
    const r = spawnSync(binary, ['--rows'], { encoding: 'utf8' });
    expect(r.status, r.stderr).to.equal(0);
    const rows = r.stdout.trim().split('\n').map((line) => JSON.parse(line));
    expect(rows).to.have.length(3);
    const [timed, failed, skipped] = rows;
    expect(timed).to.include({ stage: 'lab', family: 'conv2d', op: 'conv2d.forward', pass: true, error: 0, medianUs: 412.5, gbPerS: null });
    expect(timed.algorithms).to.match(/^forward IMPLICIT_PRECOMP_GEMM \(FMA/);
    expect(failed).to.include({ pass: false, error: null, shape: '(3,5,7,9), "batch" statistics' });
    expect(failed.failures).to.deep.equal(['dx[3]: got nan, want 0.5\n\tsecond line']);
    expect(skipped).to.include({ pass: true, skipped: '67108864 elements, beyond --max-elements 4194304' });
  });
});

describe('kernel lab: kernel_check without a GPU', function () {
  this.timeout(120_000);
  before(function () {
    if (!fs.existsSync(KERNEL_CHECK)) this.skip(); // built only when nvcc is found
  });

  it('checks its float64 batch-norm reference against the CPU batch norm, with no device (--self-check)', function () {
    const r = spawnSync(KERNEL_CHECK, ['--self-check'], { encoding: 'utf8' });
    expect(r.status, r.stdout + r.stderr).to.equal(0);
    expect(r.stdout).to.include('reference self-check passed: the float64 batch norm agrees with the CPU');
  });

  it('names the op families in --help, which the GPU check (scripts/gpu-check/) runs one process each', function () {
    const r = spawnSync(KERNEL_CHECK, ['--help'], { encoding: 'utf8' });
    expect(r.status).to.equal(0);
    const line = r.stdout.split('\n')[r.stdout.split('\n').findIndex((l) => l.includes('--only NAMES')) + 1];
    const families = line.trim().split(/,\s*/);
    expect(families).to.include.members(['memory', 'conv2d', 'batchNorm2d', 'powerSgd', 'topK']);
    expect(families.length).to.be.above(20);
  });

  it('exits 3 naming the cause when no device is usable, and says so in its rows', function () {
    if (!gpuUnavailable()) this.skip();
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'acc-lab-'));
    try {
      const info = spawnSync(KERNEL_CHECK, ['--device-info'], { encoding: 'utf8' });
      expect(info.status, info.stderr).to.equal(3);
      expect(info.stderr).to.match(/cuda:0 is not usable: /);
      const rows = path.join(dir, 'rows.jsonl');
      const r = spawnSync(KERNEL_CHECK, ['--only', 'relu', '--jsonl', rows], { encoding: 'utf8' });
      expect(r.status, r.stderr).to.equal(3);
      const [row] = fs.readFileSync(rows, 'utf8').trim().split('\n').map((l) => JSON.parse(l));
      expect(row).to.include({ stage: 'lab', family: 'relu', event: 'no device' });
      expect(row.error).to.be.a('string').and.not.equal('');
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
