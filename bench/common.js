// Helpers shared by the bench suites: a suite's command line, engine and exit, statistics, table
// output, machine facts, the PyTorch peer and simulated hosts.
import { execFile, spawn, spawnSync } from 'node:child_process';
import { closeSync, openSync, readFileSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { basename, dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { parseSubnet } from '../lib/cluster/cluster.js';
import { HOST_DEVICE, createNetwork, removeNetwork } from '../lib/cluster/netns.js';

export const BENCH_DIR = dirname(fileURLToPath(import.meta.url));
export const ROOT = join(BENCH_DIR, '..');
/** The PyTorch programs the benchmarks run beside the engine, which the tests use as oracles. */
export const ORACLES = join(ROOT, 'test', 'oracles');

// Debian's python3-torch is only importable by the system interpreter; a `python3` on PATH
// (venv, pyenv) would usually lack it. The override exists for machines that keep torch elsewhere.
export const PYTHON = process.env.ACCORDION_BENCH_PYTHON || '/usr/bin/python3';
const TORCH_STEP = join(ORACLES, 'torch_step.py');

// The peer runs in the machine's own environment: a packed Node (scripts/gpu-check/run.sh) puts its
// libraries on LD_LIBRARY_PATH, which PyTorch must not load.
export function peerEnv(threads) {
  const env = { ...process.env, OMP_NUM_THREADS: String(threads) };
  if (process.env.ACCORDION_SYSTEM_LD_LIBRARY_PATH !== undefined) env.LD_LIBRARY_PATH = process.env.ACCORDION_SYSTEM_LD_LIBRARY_PATH;
  return env;
}

/** The options every suite with a report takes: --json FILE, --markdown and -h/--help. */
const REPORT_OPTIONS = {
  json: { type: 'string' },
  markdown: { type: 'boolean', default: false },
  help: { type: 'boolean', short: 'h', default: false },
};

/**
 * A suite's options from its command line: `spec` (node:util parseArgs options) and REPORT_OPTIONS,
 * turned into the suite's options by `build(values)`, which throws on a bad value. --help prints
 * `usage` and exits 0; a bad option prints what is wrong and `usage`, and exits 2.
 */
export function suiteOptions(script, usage, spec, build) {
  try {
    const { values } = parseArgs({ args: process.argv.slice(2), options: { ...spec, ...REPORT_OPTIONS } });
    if (values.help) {
      console.log(usage);
      process.exit(0);
    }
    return build(values);
  } catch (err) {
    console.error(`${script}: ${err.message}\n${usage}`);
    process.exit(2);
  }
}

/**
 * The library's index (this checkout's lib/, or `dir`), imported late because OpenMP sizes its pool
 * from the environment when the addon loads; exits 1 saying how to build it when it does not load.
 */
export async function loadEngine(script, dir = join(ROOT, 'lib')) {
  try {
    return await import(pathToFileURL(join(dir, 'index.js')).href);
  } catch (err) {
    console.error(`${script}: cannot load the engine from ${dir} (${err.message.split('\n')[0]}).\n` +
      'Build it first: npm run build (or npx tsc -p tsconfig.json if the addon is already built).');
    process.exit(1);
  }
}

/** Runs a suite's `main()` and exits with the code it resolves to (0 for none), or 1 with the error. */
export function runMain(script, main) {
  main().then(
    (code) => process.exit(code ?? 0),
    (err) => {
      console.error(`${script}: ${err.stack ?? err}`);
      process.exit(1);
    },
  );
}

/** What a suite's report (--json FILE) says first: the suite, its start, command line and options, the machine, and why PyTorch is missing. */
export function reportHead(suite, started, opts, machine, torch) {
  return {
    suite,
    date: started.toISOString(),
    command: `node bench/${suite}.js ${process.argv.slice(2).join(' ')}`.trim(),
    options: { ...opts, json: undefined, markdown: undefined },
    machine,
    torchNote: torch.ok ? undefined : torch.reason,
  };
}

/** Writes a suite's report (--json FILE) and says so. */
export function writeReport(file, report) {
  writeFileSync(file, `${JSON.stringify(report, null, 2)}\n`);
  console.log(`wrote ${file}`);
}

/** Says so when a row's rounds (ours or PyTorch's) spread over 25%: the machine was busy and the ratio is soft. */
export function noteBusyRounds(what, spreads) {
  const worst = Math.max(...spreads.filter(Number.isFinite));
  if (worst > 25) {
    console.log(`note: ${what}rounds differ by up to ${worst.toFixed(0)}%: the machine was busy; ` +
      'rerun with more --rounds before quoting the ratio');
  }
}

/**
 * Times `step(i)` for i = 0 … warmup + steps − 1, the first `warmup` calls untimed; `afterWarmup()`,
 * where given, runs once between the two, outside the timing. Returns the timed calls' milliseconds
 * and results.
 */
export async function timeSteps(warmup, steps, step, { afterWarmup } = {}) {
  const ms = [];
  const results = [];
  for (let i = 0; i < warmup + steps; i++) {
    if (i === warmup && afterWarmup) await afterWarmup();
    const t0 = performance.now();
    const result = await step(i);
    const elapsed = performance.now() - t0;
    if (i >= warmup) {
      ms.push(elapsed);
      results.push(result);
    }
  }
  return { ms, results };
}

/** Two-sided 95% quantiles of Student's t for 1…30 degrees of freedom (1.96 beyond). */
const T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.16, 2.145, 2.131, 2.12, 2.11, 2.101, 2.093, 2.086, 2.08, 2.074, 2.069, 2.064, 2.06, 2.056, 2.052, 2.048, 2.045, 2.042];

/** The two-sided 95% quantile of Student's t with `df` degrees of freedom. */
export const t95 = (df) => T95[df - 1] ?? 1.96;

/** The mean of `values` with its 95% interval (Student's t): { n, mean, sd, low, high } (NaN bounds for one value). */
export function meanInterval(values) {
  const n = values.length;
  const mean = values.reduce((a, b) => a + b, 0) / n;
  const sd = n > 1 ? Math.sqrt(values.reduce((a, b) => a + (b - mean) ** 2, 0) / (n - 1)) : NaN;
  const half = n > 1 ? (t95(n - 1) * sd) / Math.sqrt(n) : NaN;
  return { n, mean, sd, low: mean - half, high: mean + half };
}

export function median(values) {
  if (values.length === 0) return NaN;
  const s = [...values].sort((a, b) => a - b);
  const mid = s.length >> 1;
  return s.length % 2 ? s[mid] : (s[mid - 1] + s[mid]) / 2;
}

export function fmt(value, digits = 1) {
  return Number.isFinite(value) ? value.toFixed(digits) : 'n/a';
}

/** Renders rows as an aligned text table; `markdown` gives a GitHub table for BENCHMARKS.md. */
export function formatTable(columns, rows, { markdown = false } = {}) {
  const cells = rows.map((r) => columns.map((c) => String(r[c.key] ?? '')));
  const widths = columns.map((c, i) => Math.max(c.title.length, ...cells.map((r) => r[i].length)));
  const pad = (text, i) => (columns[i].align === 'left' ? text.padEnd(widths[i]) : text.padStart(widths[i]));
  const line = (texts) => (markdown ? `| ${texts.map(pad).join(' | ')} |` : texts.map(pad).join('  '));
  const rule = markdown
    ? `|${widths.map((w, i) => (columns[i].align === 'left' ? ` ${'-'.repeat(w)} ` : ` ${'-'.repeat(w - 1)}: `)).join('|')}|`
    : widths.map((w) => '-'.repeat(w)).join('  ');
  return [line(columns.map((c) => c.title)), rule, ...cells.map(line)].join('\n');
}

let torchProbe;
/**
 * Whether the peer can run at all, checked once: { ok: true, version } or { ok: false, reason }.
 * Never throws, so a machine without torch still gets our own figures.
 */
export function probeTorch() {
  if (torchProbe) return torchProbe;
  const r = spawnSync(PYTHON, ['-c', 'import torch; print(torch.__version__)'], {
    encoding: 'utf8',
    env: peerEnv(1),
    timeout: 120_000,
  });
  if (r.error) torchProbe = { ok: false, reason: `${PYTHON} could not be started (${r.error.message})` };
  else if (r.status !== 0) {
    const last = (r.stderr || '').trim().split('\n').pop();
    torchProbe = { ok: false, reason: `${PYTHON} cannot import torch (${last || `exit ${r.status}`})` };
  } else torchProbe = { ok: true, version: r.stdout.trim() };
  return torchProbe;
}

/**
 * Runs a PyTorch peer script once and returns the JSON record on its last stdout line (warnings on
 * stderr are passed on). OMP_NUM_THREADS is set to the same thread count because OpenMP sizes its
 * pool from it when torch is imported.
 */
export function runTorchPeer(script, args, threads) {
  const name = basename(script);
  return new Promise((resolve, reject) => {
    execFile(PYTHON, [script, ...args.map(String)], {
      cwd: ROOT,
      env: peerEnv(threads),
      maxBuffer: 16 << 20,
    }, (err, stdout, stderr) => {
      if (err) {
        const tail = (stderr || '').trim().split('\n').slice(-3).join('\n');
        reject(new Error(`${name} failed (${err.code ?? err.signal}): ${tail || err.message}`));
        return;
      }
      if (stderr.trim()) process.stderr.write(stderr.replace(/^/gm, '  [torch] '));
      const last = stdout.trim().split('\n').pop();
      try {
        const rec = JSON.parse(last);
        if (!Number.isFinite(rec.step_ms_median)) throw new Error('no step_ms_median');
        resolve(rec);
      } catch (e) {
        reject(new Error(`${name} printed no usable JSON (${e.message}): ${last}`));
      }
    });
  });
}

/** One training step of a CNN in PyTorch (test/oracles/torch_step.py), on the CPU or a GPU. */
export function runTorchStep({ model, batch, threads, warmup, steps, classes = 10, channelsLast = false, device = 'cpu', autocast = false }) {
  const args = ['--model', model, '--batch', batch, '--threads', threads, '--warmup', warmup, '--steps', steps, '--classes', classes];
  if (channelsLast) args.push('--channels-last');
  if (autocast) args.push('--autocast');
  if (device !== 'cpu') args.push('--device', 'cuda');
  return runTorchPeer(TORCH_STEP, args, threads);
}

/** Statistics over the rounds' medians, shared by the step suites. */
export const round3 = (x) => Math.round(x * 1000) / 1000;
export const pct = (x) => (Number.isFinite(x) ? `${x.toFixed(0)}%` : 'n/a');
export const spread = (xs) => (xs.length > 1 ? ((Math.max(...xs) - Math.min(...xs)) / median(xs)) * 100 : NaN);
export const fastest = (xs) => (xs.length ? Math.min(...xs) : NaN);

function cpuModel() {
  try {
    const r = spawnSync('lscpu', [], { encoding: 'utf8', env: { ...process.env, LC_ALL: 'C' } });
    const m = /^Model name:\s*(.+)$/m.exec(r.stdout ?? '');
    if (m) return m[1].trim();
  } catch { /* lscpu is optional; fall back to what Node reports */ }
  return os.cpus()[0]?.model ?? 'unknown';
}

/** Facts a reader needs to compare figures across machines. */
export function machineInfo(buildInfo) {
  let pkgVersion;
  try { pkgVersion = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')).version; } catch { /* informational */ }
  const torch = probeTorch();
  return {
    cpu: cpuModel(),
    cores: os.availableParallelism?.() ?? os.cpus().length,
    memoryGiB: Math.round(os.totalmem() / 2 ** 30),
    platform: `${os.type()} ${os.release()} ${os.arch()}`,
    node: process.version,
    engine: pkgVersion,
    onednn: buildInfo?.dnnl,
    openblas: buildInfo?.openblas,
    torch: torch.ok ? torch.version : null,
  };
}

/** Threads for a suite: --threads, else OMP_NUM_THREADS, else 2 (the reference machine's cores). */
export function defaultThreads() {
  const n = Number.parseInt(process.env.OMP_NUM_THREADS ?? '', 10);
  return Number.isInteger(n) && n > 0 ? n : 2;
}

/**
 * Ends a GPU benchmark at once, with exit code 1 and the cause, unless `device` can run a model.
 * `requireDevice` is the library's (the benchmarks load the library themselves).
 */
export function exitUnlessDevice(script, device, requireDevice) {
  if (device === 'cpu') return;
  try {
    requireDevice(device);
  } catch (err) {
    console.error(`${script}: --device ${device}: ${err.message}`);
    process.exit(1);
  }
}

export function positiveInt(name, text, { min = 1 } = {}) {
  const n = Number(text);
  if (!Number.isInteger(n) || n < min) {
    throw new Error(`${name} must be an integer ≥ ${min}, got '${text}'`);
  }
  return n;
}

/** A loopback TCP port that was free a moment ago (shared with the tests' jobs). */
export { freePort } from '../test/helpers/ports.js';

/**
 * Runs `fn(network)` on `hosts` simulated hosts (`accordion cluster`'s network namespaces on
 * `subnet`, each host's egress shaped to `bitsPerSecond`, no delay or loss), then removes them.
 * Needs root.
 */
export async function onShapedHosts(hosts, subnet, bitsPerSecond, fn) {
  const network = await createNetwork({ hosts, subnet: parseSubnet(subnet, hosts), shape: { bitsPerSecond, delaySeconds: 0, loss: 0 } });
  try {
    return await fn(network);
  } finally {
    await removeNetwork(network.id);
  }
}

/**
 * PyTorch DDP (test/oracles/torch_train.py with `args`) on `hosts` simulated hosts on `subnet`, each
 * host's egress shaped to `bitsPerSecond`, one process of one thread a host; each rank's output goes
 * to <dir>/rankN.log and rank 0's epoch records to <dir>/ddp.jsonl. One rank failing stops the
 * others (which would wait for it until Gloo's 30-minute timeout); rank 0 exits after the last
 * epoch's barrier, when every rank has trained, and a rank left spinning in PyTorch 1.13's
 * destroy_process_group is stopped LINGER_MS later (awaitRanks). Resolves to the first failing
 * rank's status, or 0.
 */
export function ddpOnShapedHosts(hosts, subnet, bitsPerSecond, args, dir) {
  const script = join(ORACLES, 'torch_train.py');
  return onShapedHosts(hosts, subnet, bitsPerSecond, async (network) => {
    const master = `${network.hosts[0].address}:29513`;
    // Gloo listens on the address of the interface named here (else on the hostname's, loopback).
    const env = { ...peerEnv(1), GLOO_SOCKET_IFNAME: HOST_DEVICE };
    const runs = network.hosts.map((host) =>
      runLogged('ip', ['netns', 'exec', host.namespace, PYTHON, script, '--rank', String(host.index), '--world', String(hosts), '--master', master, ...args],
        join(dir, `rank${host.index}.log`), { stdout: 'pipe', spawn: { env } }),
    );
    const { results, status } = await awaitRanks(runs, LINGER_MS);
    writeFileSync(join(dir, 'ddp.jsonl'), results[0].out);
    return status;
  });
}

/**
 * The ranks' results (runLogged's) and the job's status: that of the first rank to fail by itself,
 * or 0. A rank that fails stops those still running; once rank 0 has exited cleanly, those still
 * running after `lingerMs` are stopped with a warning. Ranks stopped here do not count as failed.
 */
export async function awaitRanks(runs, lingerMs) {
  const stopped = new Set();
  const stop = () => {
    for (const r of runs.filter((o) => o.child.exitCode === null && o.child.signalCode === null)) {
      stopped.add(r);
      r.child.kill('SIGKILL');
    }
  };
  let linger;
  runs.forEach((r, rank) =>
    r.then((result) => {
      if (stopped.has(r)) return;
      if (exitStatus(result) !== 0) stop();
      else if (rank === 0)
        linger = setTimeout(() => {
          stop();
          console.warn(`rank 0 finished ${lingerMs / 1000} s ago; stopped the ${stopped.size} rank(s) still running`);
        }, lingerMs);
    }),
  );
  const results = await Promise.all(runs);
  clearTimeout(linger);
  const failed = runs.filter((r, rank) => !stopped.has(r) && exitStatus(results[rank]) !== 0);
  return { results, status: failed.length ? exitStatus(await failed[0]) : 0 };
}

/** How long the other ranks of a DDP run may take to exit after rank 0 has. */
const LINGER_MS = 60_000;

/** A child's exit as a shell reports it: its code, or 128 + the number of the signal that ended it. */
const exitStatus = ({ code, signal }) => code ?? 128 + (os.constants.signals[signal] ?? 0);

/** A PyTorch peer's epoch records (<dir>/ddp.jsonl, rank 0's lines). */
export const readPeerEpochs = (dir) => readFileSync(join(dir, 'ddp.jsonl'), 'utf8').trim().split('\n').filter(Boolean).map((l) => JSON.parse(l));

/** Runs a command, its output to `logFile` (stdout kept instead with `stdout: 'pipe'`); { code, signal, out, child }. */
export function runLogged(command, args, logFile, options = {}) {
  const log = openSync(logFile, 'w');
  const child = spawn(command, args, { stdio: ['ignore', options.stdout ?? log, log], ...options.spawn });
  let out = '';
  child.stdout?.setEncoding('utf8').on('data', (s) => (out += s));
  const exited = new Promise((resolve) => {
    child.on('exit', (code, signal) => {
      closeSync(log);
      resolve({ code, signal, out });
    });
  });
  return Object.assign(exited, { child });
}
