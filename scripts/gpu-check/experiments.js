// The GPU check's experiments, apart from the check (plan.js lists them under their own heading):
// what they measure goes to BENCHMARKS.md. Each gets the stage's Output and a function giving the
// seconds left before its deadline, and returns its exit status as the stages do. GPU_CHECK_DRY=1
// tries each on the CPU, without a device.
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { REPO, libraries, machineEnv, quick } from './machine.js';
import { benchmark, lab, open, tests } from './stages.js';

/**
 * peers: PyTorch's training step as its users run it on this card, beside the engine's fp32 and bf16
 * steps (bench/step.js; bf16 on channels-last activations, and on channels-first ones for what the
 * layout gives), ResNet-18 and VGG-19bn at batch 128: fp32 with every cuDNN candidate timed
 * (benchmark_limit 0, TF32 off), bf16 autocast with channels-last and cudnn.benchmark, and that
 * under torch.compile for ResNet-18 (the next target). Each run a row with the step's median, the
 * peak memory after the warm-up and the kernels of one profiled step (the algorithms cuDNN chose).
 * The runs come in order of need; those the stage's time does not hold are rows saying so. `gpu`:
 * arguments for the GPU alone (a dry run on the CPU leaves them out). `dry: false`: a run a dry run
 * leaves out, as a repeat of one before it on the CPU (VGG-19bn's runs are ResNet-18's on another
 * model; the channels-first one differs in its GPU arguments alone) or as beyond torch 1.13 (compile).
 */
export const PEERS = [
  { model: 'resnet18', config: 'fp32-all-algorithms', args: [], gpu: ['--benchmark-limit', '0'] },
  { model: 'resnet18', config: 'bf16-autocast-channels-last', args: ['--autocast', '--channels-last'] },
  { model: 'vgg19bn', config: 'fp32-all-algorithms', args: [], gpu: ['--benchmark-limit', '0'], dry: false },
  { model: 'vgg19bn', config: 'bf16-autocast-channels-last', args: ['--autocast', '--channels-last'], dry: false },
  { model: 'engine', config: 'fp32', args: [] },
  { model: 'engine', config: 'bf16', args: ['--precision', 'bf16'] },
  { model: 'engine', config: 'bf16-channels-first', args: ['--precision', 'bf16'], gpu: ['--memory-format', 'channels-first'], dry: false },
  { model: 'resnet18', config: 'bf16-autocast-channels-last-compiled', args: ['--autocast', '--channels-last'], gpu: ['--compile', '--warmup', '10'], dry: false },
];

export async function peers(out, left) {
  const dry = process.env.GPU_CHECK_DRY === '1';
  const opened = dry ? 0 : await open(out, left);
  if (opened) return opened;
  if (!dry) libraries();
  return (await peerSteps(out, left, dry)) ? 0 : 1;
}

/** The runs of PEERS within the time `left()` gives; resolves to whether all passed. */
async function peerSteps(out, left, dry) {
  // The machine's python3 holds PyTorch on a GPU machine; on the CPU, Debian's does (as in the benchmarks).
  const python = process.env.ACCORDION_BENCH_PYTHON || (dry ? '/usr/bin/python3' : quick('sh', ['-c', 'command -v python3'], { env: machineEnv() }).output.trim());
  // A dry run times the engine's ResNet-18 alone (with its PyTorch peer): the runs' logic, not their figures.
  const shape = dry ? { device: 'cpu', batch: '4', steps: '2', warmup: '1', models: 'resnet18' } : { device: 'cuda', batch: '128', steps: '20', warmup: '5', models: 'resnet18,vgg19bn' };
  let failed = false;
  for (const peer of PEERS) {
    if (dry && peer.dry === false) continue;
    const seconds = Math.floor(left() - 5);
    if (seconds < 20) {
      out.row({ event: 'peer', ...peer, status: 'not run', error: "the stage's time ran out" });
      continue;
    }
    let r;
    let result = null;
    if (peer.model === 'engine') {
      const json = path.join(os.tmpdir(), `gpu-check-peers-${process.pid}.json`);
      r = await out.run(process.execPath, ['bench/step.js', '--device', shape.device, '--batch', shape.batch, '--models', shape.models, '--warmup', shape.warmup, '--steps', shape.steps, '--rounds', '1', ...peer.args, ...(dry ? [] : peer.gpu ?? []), '--json', json], { seconds, env: { ...process.env, ACCORDION_BENCH_PYTHON: python } });
      try {
        result = JSON.parse(fs.readFileSync(json, 'utf8'));
      } catch {
        // no result written
      }
      fs.rmSync(json, { force: true });
    } else {
      const args = ['test/oracles/torch_step.py', '--model', peer.model, '--device', shape.device, '--batch', shape.batch, '--warmup', shape.warmup, '--steps', shape.steps, '--threads', '2', ...peer.args, ...(dry ? [] : ['--kernels', '12', ...(peer.gpu ?? [])])];
      r = await out.run(python, args, { env: { ...machineEnv(), OMP_NUM_THREADS: '2' }, seconds });
      try {
        result = JSON.parse(r.output.trim().split('\n').filter((l) => l.startsWith('{')).at(-1));
      } catch {
        // no JSON line
      }
    }
    out.row({ event: 'peer', model: peer.model, config: peer.config, status: r.status === 0 ? 'passed' : r.status === 124 ? 'timed out' : 'failed', exitCode: r.status, result });
    if (r.status !== 0) failed = true;
  }
  return !failed;
}

/**
 * The kernel-lab families of the ops that mixed precision and channels-last change, and the seconds
 * the precision stage keeps for each of those still to come. On an H200 (2026-12-04) conv2d took 45 s
 * and batchNorm2d 47 s, and left maxPool2d 6 s and the rest none; so batchNorm2d, whose rows all
 * passed then, comes last, after the small families.
 */
export const PRECISION_FAMILIES = ['conv2d', 'maxPool2d', 'globalAvgPool', 'flatten', 'gemm', 'linear', 'dropout', 'clipTotalNorm', 'batchNorm2d'];
const FAMILY_RESERVE = 8;
/** The GPU tests of TF32 and bf16, and of training in both layouts. */
export const PRECISION_TESTS = ['test/gpu/gpu-precision.test.js', 'test/gpu/gpu-training.test.js'];

/**
 * precision: mixed precision and channels-last on this card, in one command: the kernel lab's rows
 * of the ops they change (both layouts, TF32 and bf16), the GPU tests of precision and of training
 * in both layouts, the LSTM step in fp32 and in bf16 beside PyTorch's cuDNN LSTM (under autocast for
 * bf16), then the peers (above). Each part ends by a share of the stage's time, so a slow part leaves
 * the next ones theirs; what a share cannot hold is a row saying so. GPU_CHECK_DRY=1 tries it on the
 * CPU: no lab (it needs a device), the tests pending, the benchmarks on small shapes.
 */
export async function precision(out, left) {
  const dry = process.env.GPU_CHECK_DRY === '1';
  const opened = dry ? 0 : await open(out, left);
  if (opened) return opened;
  if (!dry) libraries();
  process.env.ACCORDION_BENCH_PYTHON ||= dry ? '/usr/bin/python3' : quick('sh', ['-c', 'command -v python3'], { env: machineEnv() }).output.trim();
  const total = left();
  const until = (share) => () => left() - total * (1 - share); // a part's seconds: until `share` of the stage has gone
  let passed = true;
  if (dry) out.row({ event: 'lab summary', families: Object.fromEntries(PRECISION_FAMILIES.map((f) => [f, 'not run (dry run: no device)'])) });
  else passed = await lab(out, until(0.35), PRECISION_FAMILIES, { reserve: FAMILY_RESERVE });
  passed = (await tests(out, Math.floor(until(0.53)()), PRECISION_TESTS, { requireGpu: !dry })) && passed;
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'gpu-check-precision-'));
  const lstm = dry ? ['--device', 'cpu', '--vocab', '1000', '--hidden', '64', '--warmup', '1', '--steps', '2', '--rounds', '1'] : ['--device', 'cuda', '--warmup', '3', '--steps', '10', '--rounds', '1'];
  for (const [name, precisionArgs, share] of [['lstm-fp32', [], 0.58], ['lstm-bf16', ['--precision', 'bf16'], 0.64]])
    passed = (await benchmark(out, name, ['bench/lstm.js', ...lstm, ...precisionArgs], Math.floor(until(share)()), tmp)) && passed;
  fs.rmSync(tmp, { recursive: true, force: true });
  return (await peerSteps(out, left, dry)) && passed ? 0 : 1;
}

/** Where the stage `reproduce` reads Fashion-MNIST: packed beside the runtime, else the system's. */
const fashionMnist = () => [process.env.ACCORDION_FASHION_MNIST, path.join(REPO, '.node-dist', 'fashion-mnist'), '/usr/share/datasets/fashion-mnist']
  .find((d) => d && fs.existsSync(path.join(d, 'train-images-idx3-ubyte.gz')));

/**
 * reproduce: the paper's PowerSGD setting at full width on this one GPU (bench/reproduce.js
 * resnet18-powersgd --width 1, 4 workers in one process sharing the GPU over Gloo): static rank 2, static rank 1
 * and Accordion, seeds 1 and 2, for as many epochs as the stage's time holds. A pilot of two epochs
 * of the three side by side gives an epoch's and a start's seconds; the epochs follow from them. Each
 * finished run is a row; the report goes to $OUT/reproduce/. GPU_CHECK_DRY=1 tries the same steps
 * on the CPU at width 0.125 on reproduce.js's --quick sliver (no device needed).
 */
export async function reproduce(out, left) {
  const dry = process.env.GPU_CHECK_DRY === '1';
  const opened = dry ? 0 : await open(out, left);
  if (opened) return opened;
  if (!dry) libraries();
  const data = fashionMnist();
  if (!data) {
    out.say('gpu-check: reproduce: no Fashion-MNIST (pack it with scripts/pack-for-gpu.sh, or set ACCORDION_FASHION_MNIST)');
    out.row({ event: 'reproduce', status: 'not run', error: 'no Fashion-MNIST' });
    return 1;
  }
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'gpu-check-reproduce-'));
  try {
    const configs = ['low', 'high', 'accordion'];
    const shape = dry ? ['--device', 'cpu', '--width', '0.125', '--quick'] : ['--device', 'cuda', '--width', '1'];
    // Each run's 4 workers in one process: 3 CUDA contexts on the card, not 12.
    const base = ['bench/reproduce.js', 'resnet18-powersgd', ...shape, '--data', data, '--dir', dir];
    const runArgs = [...base.slice(1), '--in-process'];
    const side = (epochs, seed, seconds) =>
      Promise.all(configs.map((config) => out.run(process.execPath, [base[0], 'run', ...runArgs, '--epochs', String(epochs), '--configs', config, '--seeds', String(seed)], { seconds })));
    // The pilot: two epochs of each config at once. The first epoch pays for cuDNN's choice of
    // algorithms (18.5 s against about 9.5 s for the others on an H200), so the second one times
    // an epoch; the start and the first epoch's extra are what the wall clock has beyond two of them.
    const began = Date.now();
    const pilot = await side(2, 1, Math.floor(left() / 3));
    if (pilot.some((r) => r.status !== 0)) {
      out.row({ event: 'reproduce', status: 'failed', error: 'the pilot epochs failed', exitCodes: pilot.map((r) => r.status) });
      return 1;
    }
    const wall = (Date.now() - began) / 1000;
    // A run's directory: bench/reproduce.js names the setting's by its shape, epochs first among them.
    const runDir = (epochs, config, seed) => {
      const root = path.join(dir, 'resnet18-powersgd');
      return path.join(root, fs.readdirSync(root).find((d) => d.includes(`-e${epochs}-`)) ?? '', `${config}-seed${seed}`);
    };
    const metrics = fs.readFileSync(path.join(runDir(2, 'low', 1), 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l));
    const epochTimes = metrics.filter((m) => m.event === 'epoch').map((m) => Date.parse(m.time));
    const epochSeconds = (epochTimes[1] - epochTimes[0]) / 1000;
    const startSeconds = Math.max(0, wall - 2 * epochSeconds);
    // Two seeds one after the other, the report after them (30 s kept for it).
    const epochs = Math.max(1, Math.min(dry ? 2 : 30, Math.floor((left() - 30 - 2 * (startSeconds + 5)) / (2 * epochSeconds * 1.1))));
    out.say(`reproduce: an epoch ${epochSeconds.toFixed(1)} s with the three runs side by side (the pilot's second), ${startSeconds.toFixed(1)} s to start: ${epochs} epochs a run`);
    out.row({ event: 'reproduce plan', epochSeconds, startSeconds, epochs });
    let failed = false;
    for (const seed of [1, 2]) {
      const runs = await side(epochs, seed, Math.floor(left() - 30));
      runs.forEach((r, i) => {
        const summaryFile = path.join(runDir(epochs, configs[i], seed), 'summary.json');
        const s = fs.existsSync(summaryFile) ? JSON.parse(fs.readFileSync(summaryFile, 'utf8')) : {};
        out.row({ event: 'reproduce run', config: configs[i], seed, epochs, exitCode: r.status, finalTestAccuracy: s.finalTestAccuracy ?? null, floatsSentTotal: s.floatsSentTotal ?? null, seconds: s.seconds ?? null, testAccuracies: s.epochs?.map((e) => e.testAccuracy) ?? [] });
        if (r.status !== 0) failed = true;
      });
    }
    const results = path.join(path.dirname(out.results), 'reproduce');
    const report = await out.run(process.execPath, [base[0], 'report', ...base.slice(1), '--epochs', String(epochs), '--seeds', '1,2', '--results', results], { seconds: Math.max(5, left()) });
    out.row({ event: 'reproduce report', exitCode: report.status, files: fs.existsSync(results) ? fs.readdirSync(results) : [] });
    return failed || report.status !== 0 ? 1 : 0;
  } finally {
    fs.rmSync(dir, { recursive: true, force: true }); // the runs' figures are in the rows and the report
  }
}

/** What a process of the platform package maps from outside it by design: the C library, the C++ runtime and the loader, the GPU's driver. */
const SYSTEM_LIBRARY = /^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|libstdc\+\+\.so|libgcc_s\.so|libcuda\.so|libnvidia-)/;

/**
 * prebuilt: the platform package (pack-for-gpu.sh --prebuilt puts it in .node-dist/prebuilt.tar.xz,
 * ACCORDION_PREBUILT names another) on this GPU as a service meets it: the package and the main package's compiled code in a fresh
 * node_modules with no build beside them, and the runtime's libraries off the loader's path. Then
 * `accordion info` must name the platform package as the addon's origin, every library the package
 * bundles mapped from the package, and cuda:0 usable (what else it mapped, other than the C and C++
 * runtime, the driver and pip's NVIDIA packages, is listed in the row); and one epoch of ResNet-18 on cuda:0 must train from there (dry: on the
 * CPU).
 */
export async function prebuilt(out, left) {
  const dry = process.env.GPU_CHECK_DRY === '1';
  const opened = dry ? 0 : await open(out, left);
  if (opened) return opened;
  const tarball = process.env.ACCORDION_PREBUILT || path.join(REPO, '.node-dist', 'prebuilt.tar.xz');
  if (!fs.existsSync(tarball)) {
    out.say(`gpu-check: prebuilt: no ${tarball} (pack with bash scripts/pack-for-gpu.sh --prebuilt)`);
    out.row({ event: 'prebuilt', status: 'not run', error: `no ${tarball}` });
    return 1;
  }
  const app = fs.mkdtempSync(path.join(os.tmpdir(), 'gpu-check-prebuilt-'));
  try {
    // What npm lays out: the platform package, the main package (its compiled code, no build), and
    // the main package's dependencies beside them.
    const modules = path.join(app, 'node_modules');
    fs.mkdirSync(path.join(modules, '@accordion-engine'), { recursive: true });
    const unpacked = await out.run('tar', ['-xJf', tarball, '-C', path.join(modules, '@accordion-engine')], { seconds: 60 });
    if (unpacked.status !== 0) {
      out.row({ event: 'prebuilt', status: 'failed', error: `unpacking failed: ${unpacked.output.slice(0, 500)}` });
      return 1;
    }
    const main = path.join(modules, 'accordion-engine');
    fs.mkdirSync(main);
    fs.copyFileSync(path.join(REPO, 'package.json'), path.join(main, 'package.json'));
    fs.cpSync(path.join(REPO, 'lib'), path.join(main, 'lib'), { recursive: true });
    for (const entry of fs.readdirSync(path.join(REPO, 'node_modules'))) {
      if (!entry.startsWith('.') && !fs.existsSync(path.join(modules, entry))) fs.symlinkSync(path.join(REPO, 'node_modules', entry), path.join(modules, entry));
    }
    const cli = path.join(main, 'lib', 'cli.js');
    const device = dry ? 'cpu' : 'cuda:0';
    const env = { ...machineEnv(), OMP_NUM_THREADS: '2' };
    const info = await out.run(process.execPath, [cli, 'info'], { env, seconds: 60, quiet: true });
    let facts = null;
    try {
      facts = JSON.parse(info.output.slice(info.output.indexOf('{')));
    } catch {
      // reported below
    }
    const problems = [];
    const elsewhere = [];
    if (!facts) problems.push(`accordion info gave no JSON (exit ${info.status}): ${info.output.slice(0, 300)}`);
    else {
      if (facts.loaded.addon.kind !== 'platform package') problems.push(`the addon came from ${facts.loaded.addon.file} (${facts.loaded.addon.kind})`);
      const pkg = fs.realpathSync(path.join(modules, '@accordion-engine', 'linux-x64-gnu'));
      const bundled = new Set(fs.readdirSync(path.join(pkg, 'prebuilds', 'linux-x64')));
      for (const [name, file] of Object.entries(facts.loaded.libraries)) {
        const inPackage = fs.realpathSync(file).startsWith(`${pkg}/`);
        if (bundled.has(name) && !inPackage) problems.push(`${name}, which the package bundles, was loaded from ${file}`);
        else if (!inPackage && !SYSTEM_LIBRARY.test(name) && !file.includes('/nvidia/')) elsewhere.push(file);
      }
      if (!dry && !(facts.devices?.count > 0)) problems.push(`no usable GPU: ${facts.devices?.error ?? 'none listed'}`);
    }
    const run = path.join(app, 'run');
    const trained = await out.run(process.execPath, [cli, 'train', '--model', 'resnet18', '--width', '0.125', '--epochs', '1', '--synthetic-train', '256', '--synthetic-test', '64',
      '--batch-size', '32', '--device', device, '--quiet', '--out', run], { env, seconds: Math.max(10, left() - 5) });
    const summaryFile = path.join(run, 'summary.json');
    const summary = fs.existsSync(summaryFile) ? JSON.parse(fs.readFileSync(summaryFile, 'utf8')) : null;
    if (trained.status !== 0 || summary?.epochs?.length !== 1) problems.push(`one epoch on ${device} did not train (exit ${trained.status})`);
    for (const p of problems) out.say(`gpu-check: prebuilt: ${p}`);
    if (elsewhere.length) out.say(`gpu-check: prebuilt: mapped from outside the package, the C runtime, the driver and pip's NVIDIA packages: ${elsewhere.join(', ')}`);
    out.row({ event: 'prebuilt', status: problems.length ? 'failed' : 'passed', problems, elsewhere, addon: facts?.loaded?.addon ?? null, libraries: facts?.loaded?.libraries ?? null,
      devices: facts?.devices ?? null, build: facts?.build ?? null, device, trainExitCode: trained.status, testAccuracy: summary?.epochs?.[0]?.testAccuracy ?? null });
    return problems.length ? 1 : 0;
  } finally {
    fs.rmSync(app, { recursive: true, force: true });
  }
}
