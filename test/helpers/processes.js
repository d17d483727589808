// Starting child processes in tests, finding a job's processes by their environment, and waiting on them and on
// conditions, with deadlines.
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';

/**
 * Starts a Node script (`args`: the script and its arguments) with OMP_NUM_THREADS=1 and `env` on top of
 * this process's environment, collecting its output on the returned entry, which stays in `live`
 * until the process has exited (so that an afterEach can kill what a failed test left running).
 * `exited` resolves with { code, signal, stdout, stderr, ms } once it has exited and its pipes are closed.
 */
export function startNode(live, args, env = {}, { detached = false } = {}) {
  const started = Date.now();
  const child = spawn(process.execPath, args, { env: { ...process.env, OMP_NUM_THREADS: '1', ...env }, stdio: ['ignore', 'pipe', 'pipe'], detached });
  const entry = { child, detached, stdout: '', stderr: '', done: false };
  live.add(entry);
  child.stdout.setEncoding('utf8').on('data', (text) => (entry.stdout += text));
  child.stderr.setEncoding('utf8').on('data', (text) => (entry.stderr += text));
  entry.exited = new Promise((resolve, reject) => {
    child.once('error', reject);
    child.once('close', (code, signal) => {
      entry.done = true;
      live.delete(entry);
      resolve({ code, signal, stdout: entry.stdout, stderr: entry.stderr, ms: Date.now() - started });
    });
  });
  return entry;
}

/**
 * Live processes (not zombies) whose environment holds `name`=`value`, as { pid, ppid, state, environ }
 * (`environ`: its NAME=value strings). Reads /proc; processes that end meanwhile, or that this user
 * may not read, are left out.
 */
export function processesWithEnv(name, value) {
  const found = [];
  for (const entry of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    let environ;
    let stat;
    try {
      environ = fs.readFileSync(`/proc/${entry}/environ`, 'utf8').split('\0');
      stat = fs.readFileSync(`/proc/${entry}/stat`, 'utf8');
    } catch {
      continue; // gone meanwhile, or not ours
    }
    if (!environ.includes(`${name}=${value}`)) continue;
    // The command name in field 2 may contain spaces; the fields after its closing parenthesis do not.
    const after = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    if (after[0] === 'Z') continue; // exited, only waiting for its parent to reap it
    found.push({ pid: Number(entry), ppid: Number(after[1]), state: after[0], environ });
  }
  return found;
}

/** Resolves with a started process's exit (`entry.exited`), or with { timedOut: true } after `ms`. */
export function exitWithin(entry, ms) {
  let timer;
  const timeout = new Promise((resolve) => (timer = setTimeout(() => resolve({ timedOut: true }), ms)));
  return Promise.race([entry.exited, timeout]).finally(() => clearTimeout(timer));
}

/** The first truthy value of `condition()` (sync or async), polled every `interval` ms; throws after `ms`. */
export async function waitFor(what, condition, ms, interval = 50) {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await condition();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, interval));
  }
}
