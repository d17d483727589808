// Jobs of collective workers (test/helpers/collective-worker.js) on 127.0.0.1, for the collective and
// rendezvous suites: each worker a real process, killed if it hangs or its test fails.
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { expect } from 'chai';
import { freePort } from './ports.js';

const WORKER = fileURLToPath(new URL('./collective-worker.js', import.meta.url));

/** Children still running; killLive (an afterEach hook of each suite) kills them so a failed test never leaves a job behind. */
const live = new Set();

export function killLive() {
  for (const child of live) child.kill('SIGKILL');
  live.clear();
}

/** The worker started last, while it runs. */
export function newestWorker() {
  return [...live].at(-1);
}

/**
 * Starts one worker; resolves with its exit status and output once it exits. A worker still
 * running after `killAfterMs` is killed, so a hang shows up as `hung: true` rather than as a
 * mocha timeout with orphaned processes.
 */
export function startWorker(spec, env, killAfterMs = 30000) {
  const started = Date.now();
  // Mocha itself may run under a launcher; none of its job's settings may leak into these jobs.
  const inherited = { ...process.env };
  for (const name of ['RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_PORT', 'ACCORDION_JOB_TOKEN', 'ACCORDION_STORE_HOSTED'])
    delete inherited[name];
  const child = spawn(process.execPath, [WORKER, JSON.stringify(spec)], {
    env: { ...inherited, MASTER_ADDR: '127.0.0.1', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  live.add(child);
  let stdout = '';
  let stderr = '';
  child.stdout.setEncoding('utf8').on('data', (s) => (stdout += s));
  child.stderr.setEncoding('utf8').on('data', (s) => (stderr += s));
  let hung = false;
  const timer = setTimeout(() => {
    hung = true;
    child.kill('SIGKILL');
  }, killAfterMs);
  return new Promise((resolve, reject) => {
    child.once('error', (err) => {
      clearTimeout(timer);
      live.delete(child);
      reject(err);
    });
    child.once('close', (code, signal) => {
      clearTimeout(timer);
      live.delete(child);
      resolve({ rank: Number(env.RANK), code, signal, hung, stdout, stderr, ms: Date.now() - started });
    });
  });
}

/** An exit for assertion messages; 13 is Node's status for a top-level await that never settled. */
export function exitText(e) {
  if (e.hung) return `rank ${e.rank} hung and was killed`;
  const status = e.code ?? e.signal;
  const note = e.code === 13 ? ' (a top-level await never settled: a promise was left pending)' : '';
  return `rank ${e.rank} exited with ${status}${note}; stderr:\n${e.stderr}`;
}

export function jobEnv(rank, worldSize, port, token = 'test-job') {
  return { RANK: String(rank), WORLD_SIZE: String(worldSize), MASTER_PORT: String(port), ACCORDION_JOB_TOKEN: token };
}

/** Runs a whole job; every rank must exit 0. Returns each rank's parsed output, in rank order. */
export async function runJob(worldSize, spec, killAfterMs) {
  const port = await freePort();
  const exits = await Promise.all(
    Array.from({ length: worldSize }, (_, r) => startWorker(spec, jobEnv(r, worldSize, port), killAfterMs)),
  );
  for (const e of exits) expect(e.code, exitText(e)).to.equal(0);
  return exits.map((e) => JSON.parse(e.stdout.trim().split('\n').at(-1)));
}

export function decode(base64) {
  const bytes = Buffer.from(base64, 'base64');
  return new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
}
