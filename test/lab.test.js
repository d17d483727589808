// The kernel lab's comparison (cuda/lab/compare.h), checked on the CPU: the lab itself needs a GPU,
// but whether its verdicts can be trusted does not. compare_check.cpp is compiled with the C++
// compiler the addon is built with and must fail unwritten (NaN-poisoned), NaN and Inf outputs,
// and keep a NaN error instead of dropping it.
import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = path.join(path.dirname(fileURLToPath(import.meta.url)), '..');
const SOURCE = path.join(ROOT, 'cuda', 'lab', 'compare_check.cpp');

describe('kernel lab: the comparison of outputs (CPU)', function () {
  this.timeout(120_000);
  let dir;
  before(() => (dir = fs.mkdtempSync(path.join(os.tmpdir(), 'acc-lab-'))));
  after(() => fs.rmSync(dir, { recursive: true, force: true }));

  it('fails unwritten, NaN and Inf outputs and never drops a NaN error (compare_check.cpp)', function () {
    const binary = path.join(dir, 'compare_check');
    const compiler = process.env.CXX || 'c++';
    const built = spawnSync(compiler, ['-std=c++17', '-O1', '-Wall', '-Wextra', '-Werror', '-o', binary, SOURCE], { encoding: 'utf8' });
    if (built.error) expect.fail(`${compiler} could not be started (${built.error.message}): install a C++ compiler (apt-get install g++), as the addon's build needs`);
    expect(built.status, built.stderr).to.equal(0);
    const r = spawnSync(binary, [], { encoding: 'utf8' });
    expect(r.status, r.stdout + r.stderr).to.equal(0);
    expect(r.stdout).to.include('fails unwritten, NaN and Inf outputs and keeps NaN errors');
  });
});
