// The GPU check's stages. Each gets the stage's Output and a function giving the seconds left
// before its deadline; it returns its exit status: 0 passed, 1 failed, 3 no usable device, 5 not
// run on this machine (the sanitizer where compute-sanitizer refuses the device).
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { SUITE } from './plan.js';
import { KERNEL_CHECK, buildLoads, buildOrigin, checkDevice, families, findInNvidia, libraries, machineEnv, nvidiaDirs, quick, rebuild, runtimeSha, sanitizerPath } from './machine.js';

/** A signal's name for an exit status above 128. */
const signalOf = (status) => (status > 128 ? ` (signal ${Object.entries(os.constants.signals).find(([, n]) => n === status - 128)?.[0] ?? status - 128})` : '');

/** The opening of every stage but the probe: a usable device and a build that loads (rebuilt if need be). Returns a status, or 0. */
export async function open(out, left, { rebuilds = true } = {}) {
  let device = checkDevice();
  if (device.noDevice) {
    out.say(`gpu-check: ${out.stage}: no device: ${device.noDevice}`);
    out.row({ event: 'no device', error: device.noDevice });
    return 3;
  }
  if (!buildLoads() && !(rebuilds && (await rebuild(out, left())) && buildLoads())) {
    out.say(`gpu-check: ${out.stage}: the build does not load here${rebuilds ? '' : '; run bash scripts/gpu-check/run.sh rebuild'}`);
    out.row({ event: 'build does not load' });
    return 1;
  }
  if (!device.device) device = checkDevice(); // after a rebuild
  if (!device.device) {
    out.say(`gpu-check: ${out.stage}: no device: ${device.noDevice}`);
    out.row({ event: 'no device', error: device.noDevice });
    return 3;
  }
  out.say(`gpu-check: ${out.stage} on ${device.device.device}; build ${buildOrigin()}; runtime ${runtimeSha().slice(0, 12)}`);
  return 0;
}

export async function probe(out) {
  const smi = quick('nvidia-smi', ['--query-gpu=name,driver_version,memory.total,clocks.max.sm', '--format=csv,noheader'], { env: machineEnv() });
  const nvidiaSmi = smi.status === 127 ? 'not installed' : smi.status === 0 ? smi.output.trim() : `failed: ${smi.output.trim()}`;
  out.say(`nvidia-smi: ${nvidiaSmi}`);
  const loads = buildLoads();
  out.say(`build: ${buildOrigin()}, ${loads ? 'loads' : 'does NOT load here: run bash scripts/gpu-check/run.sh rebuild next'}; C++ runtime: ${process.env.ACCORDION_CXX_CHOICE ?? ''}`);
  const device = checkDevice();
  out.say(`device: ${device.device ? JSON.stringify(device.device) : device.noDevice ?? 'the driver lists a GPU'}`);
  const libs = libraries();
  out.say(`libraries found by the engine: ${JSON.stringify(libs.found)}${libs.set ? `; set by gpu-check: ${libs.set}` : ''}`);
  const sanitizer = { path: sanitizerPath(), version: '', acceptsDevice: false, why: '' };
  if (!sanitizer.path) sanitizer.why = 'compute-sanitizer is not installed';
  else {
    sanitizer.version = quick(sanitizer.path, ['--version'], { env: machineEnv() }).output.split('\n').find((l) => /version/i.test(l)) ?? '';
    if (!device.device) sanitizer.why = 'no usable device';
    else {
      const r = quick(sanitizer.path, ['--tool', 'memcheck', '--error-exitcode', '99', KERNEL_CHECK, '--device-info'], { seconds: 25 });
      sanitizer.acceptsDevice = r.status === 0;
      if (r.status !== 0) sanitizer.why = r.output.split('\n').find((l) => /not supported|error|unable/i.test(l)) ?? `exit status ${r.status}`;
    }
  }
  out.say(`compute-sanitizer: ${sanitizer.path || 'none'} ${sanitizer.version}; accepts the device: ${sanitizer.acceptsDevice}${sanitizer.why ? ` (${sanitizer.why})` : ''}`);
  const torch = quick('python3', ['-c', 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available" if torch.cuda.is_available() else "unavailable")'], { env: machineEnv(), seconds: 20 }).output.trim().split('\n').at(-1);
  out.say(`python3: ${quick('python3', ['--version'], { env: machineEnv() }).output.trim()}; torch: ${torch}`);
  const first = (cmd, args, tail = false) => { const lines = quick(cmd, args, { env: machineEnv() }).output.trim().split('\n'); return tail ? lines.at(-1) : lines[0]; };
  out.row({
    event: 'probe', nvidiaSmi, device: device.device ?? null, noDevice: device.noDevice ?? '', build: buildOrigin(), buildLoads: loads,
    packed: fs.existsSync(path.join(process.env.ACCORDION_RUNTIME ?? '', 'app', 'PACKED')) ? fs.readFileSync(path.join(process.env.ACCORDION_RUNTIME, 'app', 'PACKED'), 'utf8') : '',
    runtimeSha256: runtimeSha(), cxx: process.env.ACCORDION_CXX_CHOICE ?? '', libraries: libs.found, librariesSetByGpuCheck: libs.set, sanitizer,
    nvcc: first('nvcc', ['--version'], true), cmake: first('cmake', ['--version']), gxx: first('g++', ['--version']), torch, cpus: os.cpus().length,
  });
  if (!device.device && device.noDevice) {
    out.say(`gpu-check: probe: no device: ${device.noDevice}`);
    return 3;
  }
  return loads ? 0 : 1;
}

/** The verdict of one kernel_check process as a row: 'passed', 'failed' or 'crashed (why)'. */
function familyVerdict(out, family, status, limit) {
  const lost = () => /kernel_check: the CUDA context was lost: (.*)/.exec(fs.readFileSync(out.log, 'utf8').split('\n').filter((l) => l.includes('context was lost')).at(-1) ?? '')?.[1];
  const [verdict, why] = status === 0 ? ['passed'] : status === 1 ? ['failed'] : status === 3 ? ['crashed', 'no usable device'] : status === 4 ? ['crashed', lost()]
    : status === 124 || status === 137 ? ['crashed', `timed out after ${limit} s`] : ['crashed', `exit status ${status}${signalOf(status)}`];
  out.row({ event: 'family', family, status: verdict, exitCode: status, ...(why ? { error: why } : {}) });
  return why ? `${verdict} (${why})` : verdict;
}

export async function abiLab(out, left) {
  const opened = await open(out, left);
  if (opened) return opened;
  libraries();
  // abi: our declarations of cuDNN, cuBLAS and NCCL against the real headers. pip's include
  // directories come after nvcc's own (-idirafter): nvidia/cu13/include also holds the CUDA
  // runtime's headers, which must not shadow those of the nvcc that compiles.
  out.say('== abi');
  const headers = ['cudnn.h', 'cublas_v2.h', 'nccl.h'].map(findInNvidia);
  let abiPassed = false;
  if (headers.some((h) => !h)) {
    out.say(`abi: no cudnn.h, cublas_v2.h or nccl.h in pip's nvidia packages (${nvidiaDirs().join(' ') || 'none'})`);
    out.row({ event: 'abi', pass: false, error: 'headers not found' });
  } else {
    const flags = headers.flatMap((h) => ['-Xcompiler', '-idirafter', '-Xcompiler', path.dirname(h)]);
    const binary = path.join(os.tmpdir(), 'accordion-abi-check');
    const compiled = await out.run('nvcc', ['-std=c++17', '-Icpp', '-Icuda', ...flags, 'cuda/lab/abi_check.cu', '-o', binary], { env: machineEnv(), seconds: 120, cap: 60 });
    const ran = compiled.status === 0 ? await out.run(binary, [], { seconds: 60, cap: 60 }) : compiled;
    abiPassed = ran.status === 0;
    out.row({ event: 'abi', pass: abiPassed, output: `${compiled.output}${ran === compiled ? '' : ran.output}`.split('\n').slice(0, 40).join('\n'), headers });
  }
  return (await lab(out, left, families())) && abiPassed ? 0 : 1;
}

/**
 * The kernel lab, quick (5 timed launches per op), over `names`: one process per op family, so that
 * a fault in one leaves the others measured. A family may take at most a minute, less the `reserve`
 * seconds kept for each family after it, so that a slow one leaves the rest theirs. Resolves to
 * whether every family passed.
 */
export async function lab(out, left, names, { reserve = 0 } = {}) {
  out.say('== lab (quick: 5 timed launches per op; one process per family)');
  const verdicts = {};
  for (const [i, family] of names.entries()) {
    const per = Math.min(60, Math.floor(left() - reserve * (names.length - 1 - i)));
    if (per < 5) {
      out.row({ event: 'family', family, status: 'not run', error: "the stage's time ran out" });
      verdicts[family] = 'not run';
      continue;
    }
    const r = await out.run(KERNEL_CHECK, ['--only', family, '--iterations', '5', '--jsonl', out.results, '--stage', out.stage], { seconds: per, cap: 600 });
    verdicts[family] = familyVerdict(out, family, r.status, per);
  }
  out.say(`lab: ${Object.entries(verdicts).map(([f, v]) => `${f} ${v}`).join('; ')}`);
  out.row({ event: 'lab summary', families: verdicts });
  return Object.values(verdicts).every((v) => v === 'passed');
}

/** One family under one tool of compute-sanitizer, its findings as a row; resolves to whether it ran clean. */
async function sanitizeFamily(out, sanitizer, tool, family, seconds, cap) {
  if (seconds < 10) {
    out.row({ event: 'sanitizer', tool, family, status: 'not run', error: "the stage's time ran out" });
    return false;
  }
  const started = Date.now();
  // Racecheck instruments the engine's own kernels only (all in namespace accordion): over cuDNN's
  // convolutions it ran past 4 minutes, and the libraries' kernels are not ours to fix.
  const onlyOurs = tool === 'racecheck' ? ['--kernel-name', 'kns=accordion'] : [];
  const r = await out.run(sanitizer, ['--tool', tool, '--error-exitcode', '99', ...onlyOurs, '--print-limit', '20', KERNEL_CHECK, '--only', family, '--iterations', '1', '--max-elements', String(cap)], { seconds, quiet: true });
  const errors = [...r.output.matchAll(/(?:ERROR|RACECHECK) SUMMARY: (\d+) (?:error|hazard)/g)].at(-1)?.[1];
  const findings = r.output.split('\n').filter((l) => l.startsWith('========= ') && !/COMPUTE-SANITIZER|SUMMARY/.test(l)).slice(0, 40).join('\n');
  const [verdict, why] = r.status === 0 ? ['clean'] : r.status === 99 ? ['findings'] : r.status === 124 || r.status === 137 ? ['timed out', `after ${seconds} s`]
    : r.status === 1 ? ['check failed'] : r.status === 4 ? ['crashed', /the CUDA context was lost: (.*)/.exec(r.output)?.[1]] : ['crashed', `exit status ${r.status}${signalOf(r.status)}`];
  const took = Math.round((Date.now() - started) / 1000);
  out.say(`-- ${tool} ${family}: ${verdict}${why ? ` (${why})` : ''}${errors ? `, ${errors} reported` : ''} (${took} s)${findings ? `\n${findings}` : ''}`);
  out.row({ event: 'sanitizer', tool, family, status: verdict, exitCode: r.status, errors: errors === undefined ? null : Number(errors), seconds: took, findings, ...(why ? { error: why } : {}) });
  return r.status === 0;
}

export async function sanitizer(out, left) {
  const opened = await open(out, left);
  if (opened) return opened;
  libraries();
  const tool = sanitizerPath();
  if (!tool) {
    out.say('gpu-check: sanitizer: compute-sanitizer is not installed: not run');
    out.row({ event: 'sanitizer', status: 'not run', error: 'compute-sanitizer is not installed' });
    return 5;
  }
  const accepted = quick(tool, ['--tool', 'memcheck', '--error-exitcode', '99', KERNEL_CHECK, '--device-info'], { seconds: 30 });
  if (accepted.status !== 0) {
    const why = accepted.output.split('\n').find((l) => /not supported|error|unable/i.test(l)) ?? `exit status ${accepted.status}`;
    out.say(`gpu-check: sanitizer: compute-sanitizer does not accept this device: ${why}; not run`);
    out.row({ event: 'sanitizer', status: 'not run', error: `compute-sanitizer does not accept the device: ${why}` });
    return 5;
  }
  out.say(`== sanitizer: ${quick(tool, ['--version']).output.split('\n').find((l) => /version/i.test(l)) ?? ''}; 4 families at a time`);
  // Memcheck first, then racecheck, each over every family, 4 processes at a time (the sanitizer's
  // work is on the CPU). Tensors above a cap are skipped (kernel_check --max-elements), so that the
  // odd sizes and the model shapes fit the time; the big bandwidth cases are the lab's.
  let clean = true;
  for (const [tool_, cap, share] of [['memcheck', 1 << 22, 0.55], ['racecheck', 1 << 20, 1]]) {
    const seconds = Math.floor(tool_ === 'memcheck' ? left() * share : left() - 10);
    const end = Date.now() + seconds * 1000;
    out.say(`-- ${tool_} (tensors up to ${cap} elements, ${seconds} s)`);
    const queue = [...families()];
    const worker = async () => {
      while (queue.length) {
        const family = queue.shift();
        if (!(await sanitizeFamily(out, tool, tool_, family, Math.floor((end - Date.now()) / 1000), cap))) clean = false;
      }
    };
    await Promise.all([worker(), worker(), worker(), worker()]);
  }
  return clean ? 0 : 1;
}

export async function suite(out, left) {
  const opened = await open(out, left);
  if (opened) return opened;
  libraries();
  return (await tests(out, left(), SUITE)) ? 0 : 1;
}

/**
 * The test files `files`, a row per test, with ACCORDION_REQUIRE_GPU=1 (a missing GPU fails them;
 * `requireGpu` false: they are pending, as in a dry run); resolves to whether all passed.
 */
export async function tests(out, seconds, files, { requireGpu = true } = {}) {
  out.say(`== tests: ${files.join(' ')}${requireGpu ? ' (ACCORDION_REQUIRE_GPU=1)' : ''}`);
  const env = { ...process.env, ...(requireGpu && { ACCORDION_REQUIRE_GPU: '1' }), ACCORDION_TEST_PYTHON: process.env.ACCORDION_TEST_PYTHON || quick('sh', ['-c', 'command -v python3'], { env: machineEnv() }).output.trim() };
  // mocha's json-stream reporter gives a line per test as it ends: each becomes a row.
  const r = await out.run(process.execPath, ['node_modules/mocha/bin/mocha.js', '--no-config', '--timeout', '600000', '--reporter', 'json-stream', ...files], { env, seconds, quiet: true });
  let failed = r.status !== 0;
  for (const line of r.output.split('\n')) {
    let event;
    try {
      event = JSON.parse(line);
    } catch {
      if (line) out.say(line);
      continue;
    }
    if (!Array.isArray(event)) continue;
    const [kind, data] = event;
    if (kind === 'pass' || kind === 'fail') {
      const row = { event: 'test', test: data.fullTitle, state: kind === 'pass' ? 'passed' : 'failed', ms: data.duration ?? null, ...(kind === 'fail' ? { error: String(data.err ?? '').slice(0, 4000) } : {}) };
      if (kind === 'fail') failed = true;
      out.row(row);
      out.say(`${kind === 'pass' ? '  ok    ' : '  FAILED'} ${data.fullTitle}${row.error ? `\n      ${row.error.split('\n').slice(0, 6).join('\n      ')}` : ''}`);
    } else if (kind === 'end') {
      out.row({ event: 'tests', ...data });
      out.say(`tests: ${data.passes} passing, ${data.failures} failing, ${data.pending} pending (${data.duration} ms)`);
    }
  }
  return !failed;
}

/** bench-quick and bench-full: the three benchmarks, each a row with its JSON, within the stage's time. */
export async function bench(out, left, size) {
  const opened = await open(out, left);
  if (opened) return opened;
  libraries();
  process.env.ACCORDION_BENCH_PYTHON ||= quick('sh', ['-c', 'command -v python3'], { env: machineEnv() }).output.trim();
  const rounds = size === 'quick' ? ['--warmup', '2', '--steps', '5', '--rounds', '1'] : ['--warmup', '5', '--steps', '20', '--rounds', '2'];
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'gpu-check-bench-'));
  const commands = {
    step: ['bench/step.js', '--device', 'cuda', '--batch', '128', '--models', 'resnet18,vgg19bn', ...rounds],
    lstm: ['bench/lstm.js', '--device', 'cuda', ...rounds],
    compression: ['bench/compression.js', '--device', 'cuda', ...(size === 'quick' ? ['--quick'] : [])],
  };
  let failed = false;
  // The time left is shared: half to the CNN steps, half of the rest to the LSTM, the rest to compression.
  for (const [name, args] of Object.entries(commands))
    if (!(await benchmark(out, name, args, Math.floor(name === 'compression' ? left() - 5 : left() / 2), tmp))) failed = true;
  fs.rmSync(tmp, { recursive: true, force: true });
  return failed ? 1 : 0;
}

/** One benchmark (`node ARGS --json FILE` in folder `tmp`) within `seconds`, its JSON as a row; resolves to whether it passed. */
export async function benchmark(out, name, args, seconds, tmp) {
  if (seconds < 20) {
    out.row({ event: 'bench', bench: name, status: 'not run', error: "the stage's time ran out" });
    return false;
  }
  out.say(`== bench ${name}: ${args.join(' ')} (${seconds} s at most)`);
  const json = path.join(tmp, `${name}.json`);
  const r = await out.run(process.execPath, [...args, '--json', json], { seconds });
  let result = null;
  try {
    result = JSON.parse(fs.readFileSync(json, 'utf8'));
  } catch {
    // no result written
  }
  out.row({ event: 'bench', bench: name, status: r.status === 0 ? 'passed' : r.status === 124 ? 'timed out' : 'failed', exitCode: r.status, result });
  return r.status === 0;
}

export async function rebuildStage(out, left) {
  if (!(await rebuild(out, left()))) return 1;
  if (buildLoads()) return 0;
  out.say('gpu-check: the rebuilt build does not load either');
  return 1;
}
