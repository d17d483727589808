// Devices: their names, each worker's GPU, how --device cuda fails without a usable GPU (the cause's code,
// before anything is built), and where the NVIDIA libraries of pip's wheels are looked for.
import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { Batcher, Model, parseDevice } from '../../lib/index.js';
import { binding } from '../../lib/native/binding.js';
import { workerDevice } from '../../lib/native/device.js';
import { UsageError } from '../../lib/base/errors.js';
import { gpuUnavailable } from '../helpers/devices.js';
import { CLI, ROOT } from '../helpers/paths.js';

const DEVICE_CODES = ['ERR_NO_CUDA', 'ERR_NO_CUDA_DEVICE', 'ERR_CUDA_LIBRARY'];

/** Whether the dynamic loader can find the NVIDIA driver's libcuda.so.1 here. */
function driverLibraryPresent() {
  for (const ldconfig of ['/sbin/ldconfig', 'ldconfig']) {
    const r = spawnSync(ldconfig, ['-p'], { encoding: 'utf8' });
    if (!r.error && r.status === 0) return /\blibcuda\.so\.1\b/.test(r.stdout) || (process.env.LD_LIBRARY_PATH ?? '').split(':').some((d) => d && fs.existsSync(path.join(d, 'libcuda.so.1')));
  }
  return fs.existsSync('/proc/driver/nvidia');
}

function runCli(args) {
  const r = spawnSync(process.execPath, [CLI, ...args], { encoding: 'utf8', env: { ...process.env, OMP_NUM_THREADS: '2' } });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

describe('devices', function () {
  it('names devices as cpu, cuda or cuda:N', function () {
    for (const good of ['cpu', 'cuda', 'cuda:0', 'cuda:12']) expect(parseDevice(good)).to.equal(good);
    for (const bad of ['gpu', 'CUDA', 'cuda:', 'cuda:-1', 'cuda:x', '', 3]) expect(() => parseDevice(bad), String(bad)).to.throw(/expected cpu, cuda or cuda:N/);
  });

  it('refuses a malformed --device with exit code 2', function () {
    const r = runCli(['train', '--model', 'resnet18', '--device', 'gpu']);
    expect(r.code, r.stderr).to.equal(2);
    expect(r.stderr).to.match(/device: expected cpu, cuda or cuda:N, got 'gpu'/);
  });

  it('gives each worker of a job its own GPU, refusing more workers per host than GPUs', function () {
    const gpus = binding.deviceQuery().count;
    expect(workerDevice('cpu', { rank: 3, localRank: 1, worldSize: 4 })).to.equal('cpu');
    expect(workerDevice('cuda:2', { rank: 0, localRank: 0, worldSize: 1 })).to.equal('cuda:2');
    expect(() => workerDevice('cuda:0', { rank: 1, localRank: 1, worldSize: 2 })).to.throw(UsageError, /pins every worker of a host to one GPU/);
    if (gpus > 0) {
      expect(() => workerDevice('cuda', { rank: 5, localRank: gpus, worldSize: 8 })).to.throw(
        UsageError,
        new RegExp(`rank 5 is worker ${gpus} of its host \\(LOCAL_RANK\\), which has ${gpus} GPU\\(s\\).*at most ${gpus} worker`),
      );
      expect(workerDevice('cuda', { rank: 1, localRank: gpus - 1, worldSize: 2 })).to.equal(`cuda:${gpus - 1}`);
    } else {
      // No GPU at all: the device check that follows names the cause instead.
      expect(workerDevice('cuda', { rank: 1, localRank: 1, worldSize: 2 })).to.equal('cuda:1');
    }
  });

  it('lets the workers of a host share GPUs over Gloo', function () {
    const gpus = Math.max(1, binding.deviceQuery().count);
    expect(workerDevice('cuda', { rank: 5, localRank: 5, worldSize: 8 }, 'gloo')).to.equal(`cuda:${5 % gpus}`);
    expect(workerDevice('cuda:0', { rank: 1, localRank: 1, worldSize: 2 }, 'gloo')).to.equal('cuda:0');
    expect(workerDevice('cpu', { rank: 1, localRank: 1, worldSize: 2 }, 'gloo')).to.equal('cpu');
  });

  it('reports the host memory a model holds on the CPU', async function () {
    const model = await Model.create({ architecture: 'resnet18' });
    try {
      const stats = await model.memoryStats();
      expect(stats.device).to.equal('cpu');
      expect(stats.peak).to.be.at.least(stats.allocated);
    } finally {
      await model.dispose();
    }
  });

  describe('without a usable GPU', function () {
    let cause;
    before(function () {
      cause = gpuUnavailable();
      if (!cause) this.skip();
    });

    it('says why cuda cannot be used, with a code, before building anything', async function () {
      expect(DEVICE_CODES).to.include(cause.code);
      const err = await Model.create({ architecture: 'resnet18', device: 'cuda' }).then(
        () => null,
        (e) => e,
      );
      expect(err, 'Model.create on cuda').to.not.equal(null);
      expect(err.code).to.equal(cause.code);
      expect(err.message).to.equal(cause.message);
    });

    for (const model of ['vgg19bn', 'lstm']) {
      it(`fails \`train --model ${model} --device cuda\` with exit code 1 and the cause, before reading data or making the run directory`, function () {
        const out = fs.mkdtempSync(path.join(os.tmpdir(), 'acc-gpu-'));
        try {
          const r = runCli(['train', '--model', model, '--device', 'cuda', '--data', path.join(out, 'missing'), '--out', path.join(out, 'run')]);
          expect(r.code, r.stderr).to.equal(1);
          expect(r.stderr).to.include(cause.message);
          expect(r.stderr).to.not.match(/missing/); // the data directory was never opened
          expect(fs.existsSync(path.join(out, 'run'))).to.equal(false);
        } finally {
          fs.rmSync(out, { recursive: true, force: true });
        }
      });
    }

    it('refuses an lstm on cuda for the missing device, not for the model', async function () {
      const err = await Model.create({ architecture: 'lstm', classes: 50, hidden: 8, device: 'cuda' }).then(
        () => null,
        (e) => e,
      );
      expect(err?.code).to.equal(cause.code);
      expect(err.message).to.equal(cause.message);
    });

    it('says "no NVIDIA driver found" when libcuda.so.1 does not load, not the runtime\'s "driver version is insufficient"', function () {
      if (!binding.buildInfo().cuda.built || driverLibraryPresent()) this.skip();
      const q = binding.deviceQuery();
      expect(q.count).to.equal(0);
      expect(q.error).to.match(/^no NVIDIA driver found: .*libcuda\.so\.1/);
      expect(cause.message).to.match(/no NVIDIA driver found/);
      expect(runCli(['info']).stdout).to.not.match(/insufficient/);
    });

    it('refuses to assemble batches for a GPU, naming the cause', function () {
      const images = { images: new Uint8Array(4 * 3072), labels: new Int32Array(4), count: 4, classes: 10 };
      expect(() => new Batcher(images, { batchSize: 2, device: 'cuda' })).to.throw().with.property('code').that.is.oneOf(DEVICE_CODES);
    });
  });
});

describe('NVIDIA libraries from pip', function () {
  this.timeout(60_000);
  let root;
  before(function () {
    if (!binding.buildInfo().cuda.built) this.skip();
    root = fs.mkdtempSync(path.join(os.tmpdir(), 'acc-pip-'));
  });
  after(() => root && fs.rmSync(root, { recursive: true, force: true }));

  /**
   * What deviceQuery() says in a process with `env`, none of the ACCORDION_* library variables and no
   * LD_LIBRARY_PATH directory holding an NVIDIA library (the others stay: the addon's own libraries
   * may come from there, as on a machine with the packed runtime).
   */
  function queryWith(env) {
    const clean = { ...process.env, ...env };
    for (const name of ['ACCORDION_CUDNN', 'ACCORDION_CUBLAS', 'ACCORDION_NCCL', 'VIRTUAL_ENV', 'CONDA_PREFIX']) delete clean[name];
    const nvidia = /^lib(cudnn|cublas|nccl)\.so/;
    const kept = (process.env.LD_LIBRARY_PATH ?? '').split(':').filter((dir) => dir && !(fs.existsSync(dir) && fs.readdirSync(dir).some((f) => nvidia.test(f))));
    if (kept.length) clean.LD_LIBRARY_PATH = kept.join(':');
    else delete clean.LD_LIBRARY_PATH;
    const r = spawnSync(process.execPath, ['--input-type=module', '-e', "import('./lib/index.js').then((m) => console.log(JSON.stringify(m.deviceQuery())))"], {
      cwd: ROOT,
      env: clean,
      encoding: 'utf8',
    });
    expect(r.status, r.stderr).to.equal(0);
    return JSON.parse(r.stdout);
  }

  /** Stand-ins for the wheels' libraries (not loadable: the loader says why, naming the file). */
  function fakeWheels(site, files) {
    for (const file of files) {
      fs.mkdirSync(path.join(site, path.dirname(file)), { recursive: true });
      fs.writeFileSync(path.join(site, file), '');
    }
  }

  it("looks in the CUDA 13 wheels' layout (nvidia/cu13/lib, nvidia/cu12/lib, nvidia/<library>/lib) of the user's site-packages, without environment variables", function () {
    const home = path.join(root, 'home');
    const site = path.join(home, '.local', 'lib', 'python3.12', 'site-packages');
    fakeWheels(site, ['nvidia/cu13/lib/libcublas.so.13', 'nvidia/cudnn/lib/libcudnn.so.9', 'nvidia/nccl/lib/libnccl.so.2', 'nvidia/cu12/lib/libcublas.so.12']);
    const q = queryWith({ HOME: home });
    for (const [library, file] of [
      ['cublas', 'nvidia/cu13/lib/libcublas.so.13'],
      ['cublas', 'nvidia/cu12/lib/libcublas.so.12'],
      ['cudnn', 'nvidia/cudnn/lib/libcudnn.so.9'],
      ['nccl', 'nvidia/nccl/lib/libnccl.so.2'],
    ]) {
      if (q[library].loaded) continue; // a real one was found first: the search works all the same
      expect(q[library].error, library).to.include(path.join(site, file));
    }
  });

  it('looks in the environment of a python3 on the PATH (a virtual environment)', function () {
    const venv = path.join(root, 'venv');
    fs.mkdirSync(path.join(venv, 'bin'), { recursive: true });
    fs.writeFileSync(path.join(venv, 'bin', 'python3'), '');
    fakeWheels(path.join(venv, 'lib', 'python3.12', 'site-packages'), ['nvidia/cu13/lib/libcublas.so.13']);
    const q = queryWith({ HOME: path.join(root, 'nobody'), PATH: `${path.join(venv, 'bin')}:${process.env.PATH}` });
    // As the loader globbed it: the python3's directory, then ../lib/python3.*/site-packages.
    if (!q.cublas.loaded) expect(q.cublas.error).to.include(`${venv}/bin/../lib/python3.12/site-packages/nvidia/cu13/lib/libcublas.so.13`);
  });
});
