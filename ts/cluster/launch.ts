/**
 * The launcher: starts one training process per worker on this node, like torchrun. It hosts the
 * job's rendezvous store (on node 0), gives every worker RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
 * MASTER_PORT and the job token, shows rank 0's output as is and prefixes the others' lines, and
 * stops the whole job when any worker fails: the remaining workers get SIGTERM, then SIGKILL after
 * a grace period, and the launcher exits non-zero naming the rank and its exit cause. Every worker
 * holds a lifeline to the launcher (lifeline.ts), so that a launcher killed outright (SIGKILL, out of
 * memory) takes its workers with it.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs';
import * as os from 'node:os';
import { UsageError, signalExitCode } from '../base/errors.js';
import { LIFELINE_FD, LIFELINE_VARIABLE } from '../comm/lifeline.js';
import { StoreServer } from '../comm/store.js';

export interface LaunchOptions {
  nprocPerNode: number;
  nnodes: number;
  nodeRank: number;
  masterAddr: string;
  /** Port 0 lets node 0 pick a free port (single-node jobs). */
  masterPort: number;
  /** Shared by every node of the job; generated when one node runs the whole job. */
  token?: string;
  /** The command each worker runs (node and its arguments). */
  command: string[];
  /** Seconds between SIGTERM and SIGKILL when the job is stopped. */
  graceSeconds?: number;
  env?: NodeJS.ProcessEnv;
  out?: NodeJS.WritableStream;
  err?: NodeJS.WritableStream;
}

export interface LaunchResult {
  exitCode: number;
  /** The first failure, e.g. "rank 1 was killed by SIGKILL". */
  failure?: string;
  /** The launcher itself was stopped by SIGINT or SIGTERM (a user's stop: not to be restarted). */
  interrupted?: boolean;
}

/** Copies a child's stream to `target`, prefixing each complete line. */
export function relay(stream: NodeJS.ReadableStream, target: NodeJS.WritableStream, prefix: string): void {
  let pending = '';
  stream.setEncoding('utf8');
  stream.on('data', (chunk: string) => {
    if (prefix === '') {
      target.write(chunk);
      return;
    }
    const lines = (pending + chunk).split(/(?<=[\n\r])/);
    pending = lines[lines.length - 1]!.endsWith('\n') || lines[lines.length - 1]!.endsWith('\r') ? '' : lines.pop()!;
    for (const line of lines) target.write(prefix + line.replace(/\r$/, '\n'));
  });
  stream.on('end', () => {
    if (pending) target.write(prefix + pending + '\n');
  });
}

function describeExit(code: number | null, signal: NodeJS.Signals | null): string {
  return signal ? `was killed by ${signal}` : `exited with code ${code}`;
}

/** Whether a process is stopped (SIGSTOP, SIGTSTP, a debugger); false where /proc cannot tell. */
function isStopped(pid: number | undefined): boolean {
  if (pid === undefined) return false;
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    return /^[Tt]$/.test(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[0] ?? '');
  } catch {
    return false;
  }
}

/**
 * Child processes that are stopped together: SIGTERM (with SIGCONT, so that a stopped one can act on
 * it), then SIGKILL for those still running `graceMs` later. While it watches, SIGINT and SIGTERM
 * sent to this process stop them all and are kept as `interrupted`.
 */
export class ProcessSet<T extends { child: ChildProcess; exited: boolean }> {
  readonly members: T[] = [];
  interrupted?: NodeJS.Signals;
  private killTimer?: NodeJS.Timeout;
  private readonly onSignal = (signal: NodeJS.Signals) => {
    this.interrupted ??= signal;
    this.onInterrupt(signal);
    this.stopAll();
  };

  constructor(
    private readonly graceMs: number,
    private readonly onInterrupt: (signal: NodeJS.Signals) => void,
  ) {
    process.on('SIGINT', this.onSignal);
    process.on('SIGTERM', this.onSignal);
  }

  add(member: T): T {
    this.members.push(member);
    return member;
  }

  stopAll(): void {
    for (const m of this.members)
      if (!m.exited) {
        m.child.kill('SIGTERM');
        m.child.kill('SIGCONT');
      }
    this.killTimer ??= setTimeout(() => {
      for (const m of this.members) if (!m.exited) m.child.kill('SIGKILL');
    }, this.graceMs);
  }

  /** Stops watching the signals and forgets the pending SIGKILL. */
  close(): void {
    clearTimeout(this.killTimer);
    process.off('SIGINT', this.onSignal);
    process.off('SIGTERM', this.onSignal);
  }
}

export async function launch(options: LaunchOptions): Promise<LaunchResult> {
  const { nprocPerNode, nnodes, nodeRank } = options;
  if (!Number.isInteger(nprocPerNode) || nprocPerNode < 1) throw new UsageError(`--nproc-per-node must be a positive integer, got ${nprocPerNode}`);
  if (!Number.isInteger(nnodes) || nnodes < 1) throw new UsageError(`--nnodes must be a positive integer, got ${nnodes}`);
  if (!Number.isInteger(nodeRank) || nodeRank < 0 || nodeRank >= nnodes)
    throw new UsageError(`--node-rank ${nodeRank} is outside 0..${nnodes - 1}`);
  const baseEnv = options.env ?? process.env;
  const token = options.token ?? baseEnv.ACCORDION_JOB_TOKEN ?? (nnodes === 1 ? randomBytes(16).toString('hex') : undefined);
  if (token === undefined)
    throw new UsageError('a job over several nodes needs the same token on every node: set ACCORDION_JOB_TOKEN (or --token)');
  const out = options.out ?? process.stdout;
  const err = options.err ?? process.stderr;
  const grace = (options.graceSeconds ?? 10) * 1000;
  const worldSize = nnodes * nprocPerNode;
  // Node 0 hosts the store so that it outlives any worker.
  const store = nodeRank === 0 ? await StoreServer.listen({ host: options.masterAddr, port: options.masterPort, token }) : undefined;
  const masterPort = store?.port ?? options.masterPort;
  const threadsPerWorker = String(Math.max(1, Math.floor((os.availableParallelism?.() ?? os.cpus().length) / nprocPerNode)));

  let failure: string | undefined;
  const workers = new ProcessSet<{ rank: number; child: ChildProcess; exited: boolean }>(grace, (signal) => (failure ??= `interrupted by ${signal}`));
  const children = workers.members;

  const exits = [];
  for (let local = 0; local < nprocPerNode; local++) {
    const rank = nodeRank * nprocPerNode + local;
    const child = spawn(options.command[0]!, options.command.slice(1), {
      // The last one is the lifeline: this process holds its other end until it ends.
      stdio: ['ignore', 'pipe', 'pipe', 'pipe'],
      env: {
        ...baseEnv,
        RANK: String(rank),
        WORLD_SIZE: String(worldSize),
        LOCAL_RANK: String(local),
        LOCAL_WORLD_SIZE: String(nprocPerNode),
        MASTER_ADDR: options.masterAddr,
        MASTER_PORT: String(masterPort),
        ACCORDION_JOB_TOKEN: token,
        ACCORDION_STORE_HOSTED: '1',
        [LIFELINE_VARIABLE]: String(LIFELINE_FD),
        OMP_NUM_THREADS: baseEnv.OMP_NUM_THREADS ?? threadsPerWorker,
      },
    });
    const entry = workers.add({ rank, child, exited: false });
    const prefix = rank === 0 ? '' : `[rank ${rank}] `;
    relay(child.stdout!, out, prefix);
    relay(child.stderr!, err, prefix);
    exits.push(
      new Promise<void>((resolve) => {
        child.on('error', (e) => {
          failure ??= `rank ${rank} could not start: ${e.message}`;
          entry.exited = true;
          workers.stopAll();
          resolve();
        });
        child.on('exit', (code, signal) => {
          entry.exited = true;
          child.stdio[LIFELINE_FD]?.destroy();
          if ((code !== 0 || signal) && !failure) {
            // A worker that waited in vain for a stopped one fails first: name the stopped one too.
            const stopped = children.filter((c) => !c.exited && isStopped(c.child.pid)).map((c) => c.rank);
            failure =
              `rank ${rank} ${describeExit(code, signal)}` +
              (stopped.length ? ` (${stopped.length === 1 ? `rank ${stopped[0]} is` : `ranks ${stopped.join(', ')} are`} stopped and did not answer)` : '');
            err.write(`accordion launch: ${failure}; stopping the other workers\n`);
            workers.stopAll();
          }
          resolve();
        });
      }),
    );
  }
  await Promise.all(exits);
  workers.close();
  await store?.close();
  if (failure) return { exitCode: workers.interrupted ? signalExitCode(workers.interrupted) : 1, failure, ...(workers.interrupted ? { interrupted: true } : {}) };
  return { exitCode: 0 };
}
