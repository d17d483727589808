// What the addon reports about itself, each figure against a source of its own: the libraries this
// process mapped (/proc/self/maps), the build configuration (CMakeLists.txt), the library's model
// list, and the GPUs the driver lists (nvidia-smi, /proc/driver/nvidia) in a process of its own.
import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { ARCHITECTURES, Model, buildInfo, deviceQuery } from '../../lib/index.js';
import { ROOT } from '../helpers/paths.js';

/** The real paths of the files this process has mapped whose name matches `pattern`. */
function mapped(pattern) {
  const files = new Set();
  for (const line of fs.readFileSync('/proc/self/maps', 'utf8').split('\n')) {
    const file = line.split(/\s+/).slice(5).join(' ');
    if (file.startsWith('/') && pattern.test(path.basename(file))) files.add(fs.realpathSync(file));
  }
  return [...files];
}

/** The CUDA architectures CMakeLists.txt builds the kernels for, as the addon names them ('sm_80,sm_90'). */
function configuredArchitectures() {
  const cmake = fs.readFileSync(path.join(ROOT, 'CMakeLists.txt'), 'utf8');
  const m = /set\(CMAKE_CUDA_ARCHITECTURES ([\d ]+)\)/.exec(cmake);
  expect(m, 'CMakeLists.txt sets CMAKE_CUDA_ARCHITECTURES').to.not.equal(null);
  return m[1].trim().split(/\s+/).map((a) => `sm_${a}`).join(',');
}

/**
 * How many GPUs the driver lists, asked without CUDA: `nvidia-smi -L` when it is installed, else the
 * kernel driver's /proc/driver/nvidia/gpus, else none.
 */
function driverGpuCount() {
  const smi = spawnSync('nvidia-smi', ['-L'], { encoding: 'utf8' });
  if (!smi.error && smi.status === 0) return smi.stdout.split('\n').filter((l) => /^GPU \d+:/.test(l)).length;
  const dir = '/proc/driver/nvidia/gpus';
  return fs.existsSync(dir) ? fs.readdirSync(dir).length : 0;
}

describe('native addon', function () {
  it('reports the oneDNN and OpenBLAS this process loaded', function () {
    const info = buildInfo();
    const [dnnl] = mapped(/^libdnnl\.so/);
    expect(dnnl, 'libdnnl.so in /proc/self/maps').to.be.a('string');
    const soVersion = /libdnnl\.so\.(\d+)(?:\.(\d+))?/.exec(path.basename(dnnl));
    expect(info.dnnl).to.match(/^\d+\.\d+\.\d+$/);
    expect(info.dnnl.split('.')[0], `major version against ${dnnl}`).to.equal(soVersion[1]);
    if (soVersion[2] !== undefined) expect(info.dnnl.split('.')[1], `minor version against ${dnnl}`).to.equal(soVersion[2]);

    const [openblas] = mapped(/^libopenblas/);
    expect(openblas, 'libopenblas in /proc/self/maps').to.be.a('string');
    expect(info.openblas).to.match(/^OpenBLAS \d+\.\d+\.\d+/);
    const fileVersion = /r(\d+\.\d+\.\d+)/.exec(path.basename(openblas));
    if (fileVersion) expect(info.openblas, `version against ${openblas}`).to.include(`OpenBLAS ${fileVersion[1]}`);
    expect(info.threads).to.be.at.least(1);
  });

  it('lists the models the library offers, and each of them builds', async function () {
    this.timeout(120_000);
    const { models } = buildInfo();
    expect([...models].sort()).to.deep.equal([...ARCHITECTURES].sort());
    for (const architecture of models) {
      const model = await Model.create({ architecture, classes: 10, hidden: 8 });
      expect(model.parameterCount(), architecture).to.be.above(0);
      await model.dispose();
    }
  });

  it('reports the CUDA architectures the build configured, and the runtime it was built with', function () {
    const { cuda } = buildInfo();
    expect(cuda.built).to.be.a('boolean');
    if (!cuda.built) {
      expect(cuda.architectures).to.equal('');
      expect(cuda.runtimeVersion).to.equal(0);
      return;
    }
    expect(cuda.architectures).to.equal(configuredArchitectures());
    expect(cuda.runtimeVersion).to.be.at.least(11000);
    // Each GPU present must run one of them: CMake embeds the code and the PTX of every listed
    // architecture, which run on that architecture and on any later one.
    for (const d of deviceQuery().devices) {
      const [major, minor] = d.computeCapability.split('.').map(Number);
      const runs = cuda.architectures.split(',').some((a) => Number(a.slice(3)) <= major * 10 + minor);
      expect(runs, `${d.name} (compute capability ${d.computeCapability}) against ${cuda.architectures}`).to.equal(true);
    }
  });

  it('counts the GPUs the driver lists, and says why when there are none', function () {
    // In a process of its own without CUDA_VISIBLE_DEVICES, which the driver's own listing ignores.
    const env = { ...process.env };
    delete env.CUDA_VISIBLE_DEVICES;
    const child = spawnSync(process.execPath, ['--input-type=module', '-e', "import('./lib/index.js').then((m) => console.log(JSON.stringify(m.deviceQuery())))"], {
      cwd: ROOT,
      env,
      encoding: 'utf8',
    });
    expect(child.status, child.stderr).to.equal(0);
    const q = JSON.parse(child.stdout);
    const expected = buildInfo().cuda.built ? driverGpuCount() : 0;
    expect(q.count, `GPUs the driver lists: ${expected}`).to.equal(expected);
    expect(q.devices).to.have.length(q.count);
    if (q.count === 0) expect(q.error).to.be.a('string').and.not.equal('');
    if (!buildInfo().cuda.built) expect(q.error).to.match(/built without CUDA/);
    for (const d of q.devices) expect(d.computeCapability).to.match(/^\d+\.\d+$/);
  });

  it('reports the NCCL it loaded, its version agreeing with the file, or why it did not load', function () {
    const { cuda } = buildInfo();
    const { nccl } = deviceQuery();
    expect(cuda.nccl === true, 'buildInfo and deviceQuery agree').to.equal(nccl.loaded);
    if (!nccl.loaded) {
      expect(nccl.error).to.match(/NCCL/);
      if (!cuda.built) expect(nccl.error).to.match(/built without CUDA/);
      else expect(nccl.error).to.match(/libnccl\.so/); // the paths tried
      return;
    }
    expect(fs.existsSync(nccl.path), nccl.path).to.equal(true);
    expect(nccl.version).to.match(/^\d+\.\d+\.\d+$/);
    const [major, minor] = nccl.version.split('.').map(Number);
    expect(major * 100 + minor, 'NCCL 2.14 or later').to.be.at.least(214);
    // The soname carries the major version, and the real file the full one when it is versioned.
    const real = path.basename(fs.realpathSync(nccl.path));
    const fromFile = /libnccl\.so\.(\d+)(?:\.(\d+)\.(\d+))?/.exec(real) ?? /libnccl\.so\.(\d+)/.exec(path.basename(nccl.path));
    expect(fromFile, `a versioned NCCL file: ${nccl.path} → ${real}`).to.not.equal(null);
    expect(String(major), `major version against ${real}`).to.equal(fromFile[1]);
    if (fromFile[2] !== undefined) expect(nccl.version, `version against ${real}`).to.equal(`${fromFile[1]}.${fromFile[2]}.${fromFile[3]}`);
  });
});
