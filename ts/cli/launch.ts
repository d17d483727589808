/**
 * `accordion launch`: one training process per worker on this node, as torchrun starts them; also
 * what `accordion train --workers N` becomes outside a launched job. With `--max-restarts N`, a
 * failed job is started again, every worker from the run's last checkpoint, up to N times.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { UsageError } from '../base/errors.js';
import { DEFAULT_MASTER_ADDR, DEFAULT_MASTER_PORT } from '../comm/environment.js';
import { launch } from '../cluster/launch.js';
import { resolveCheckpointDir } from '../train/checkpoint.js';
import { checkRunDir } from '../train/rundir.js';
import { parseTrainArgs } from './args.js';
import { parseWrapperArgs, wrapperHelp, type CommandOptions } from './wrapper-args.js';

/** The command-line program every worker runs (`node lib/cli.js train …`). */
export const CLI_PATH = fileURLToPath(new URL('../cli.js', import.meta.url));

export const LAUNCH_OPTIONS = {
  nprocPerNode: { flag: '--nproc-per-node', type: 'int', min: 1, default: 1, help: 'worker processes on this node' },
  nnodes: { flag: '--nnodes', type: 'int', min: 1, default: 1, help: 'nodes in the job' },
  nodeRank: { flag: '--node-rank', type: 'int', min: 0, default: 0, help: "this node's index" },
  masterAddr: { flag: '--master-addr', type: 'string', default: DEFAULT_MASTER_ADDR, help: "node 0's address (the store listens there)" },
  masterPort: { flag: '--master-port', type: 'int', min: 1, max: 65535, default: DEFAULT_MASTER_PORT, help: "the store's port" },
  token: { flag: '--token', type: 'string', default: '', help: 'job token shared by all nodes (default: ACCORDION_JOB_TOKEN, or random for one node)' },
  maxRestarts: { flag: '--max-restarts', type: 'int', min: 0, default: 0, help: "restarts of the whole job after a worker fails, each from the run's last checkpoint (one node)" },
} as const satisfies CommandOptions;

/** Runs the training command once per worker through the launcher and returns its exit code. */
export async function runLaunch(options: {
  nprocPerNode: number;
  nnodes?: number;
  nodeRank?: number;
  masterAddr?: string;
  masterPort?: number;
  token?: string;
  maxRestarts?: number;
  trainArgs: string[];
}): Promise<number> {
  let trainArgs = [...options.trainArgs];
  // Every worker must write to the same run directory, so it is chosen once, here.
  const parsed = parseTrainArgs(trainArgs);
  if (!parsed.outDir && !parsed.resume) trainArgs.push('--out', defaultRunDir(String(parsed.model ?? 'run')));
  // Rank 0 checks this too; checking here, where rank 0's node starts, refuses before any worker starts.
  if ((options.nodeRank ?? 0) === 0) checkRunDir(parsed as { outDir?: string; resume?: string; overwrite?: boolean });
  const maxRestarts = options.maxRestarts ?? 0;
  if (maxRestarts > 0 && (options.nnodes ?? 1) > 1)
    throw new UsageError('--max-restarts restarts the job of one node: with --nnodes above 1 the nodes would have to agree on each restart, which they do not yet');
  for (let attempt = 0; ; attempt++) {
    const result = await launch({
      nprocPerNode: options.nprocPerNode,
      nnodes: options.nnodes ?? 1,
      nodeRank: options.nodeRank ?? 0,
      masterAddr: options.masterAddr ?? DEFAULT_MASTER_ADDR,
      masterPort: options.masterPort ?? DEFAULT_MASTER_PORT,
      token: options.token || undefined,
      command: [process.execPath, CLI_PATH, 'train', ...trainArgs],
    });
    if (!result.failure) return result.exitCode;
    process.stderr.write(`accordion launch: job failed: ${result.failure}\n`);
    if (attempt >= maxRestarts || result.interrupted) {
      if (maxRestarts > 0 && !result.interrupted) process.stderr.write(`accordion launch: no restart left (${maxRestarts} used)\n`);
      return result.exitCode;
    }
    const restart = restartArgs(trainArgs);
    process.stderr.write(`accordion launch: restart ${attempt + 1} of ${maxRestarts}, ${restart.from}\n`);
    trainArgs = restart.args;
  }
}

/** The value of a training flag (`--flag value` or `--flag=value`), or undefined. */
function flagValue(args: string[], flag: string): string | undefined {
  for (let i = 0; i < args.length; i++) {
    if (args[i] === flag) return args[i + 1];
    if (args[i]!.startsWith(`${flag}=`)) return args[i]!.slice(flag.length + 1);
  }
  return undefined;
}

/** The arguments without a flag (and its value, unless it is a switch). */
function withoutFlag(args: string[], flag: string, takesValue: boolean): string[] {
  const out: string[] = [];
  for (let i = 0; i < args.length; i++) {
    if (args[i] === flag) {
      if (takesValue) i++;
      continue;
    }
    if (!args[i]!.startsWith(`${flag}=`)) out.push(args[i]!);
  }
  return out;
}

/**
 * The training arguments of a restart and where it starts from: the run's last checkpoint when its
 * directory holds one (`--resume DIR`, continuing the run in place), else the start again (the
 * failed attempt's files replaced with `--overwrite`).
 */
function restartArgs(args: string[]): { args: string[]; from: string } {
  const resumed = flagValue(args, '--resume');
  const runDir = flagValue(args, '--out') ?? (resumed && path.resolve(resolveCheckpointDir(resumed), '..', '..'));
  if (!runDir) throw new UsageError('a restart needs the run directory (--out or --resume)');
  const latest = path.join(runDir, 'checkpoints', 'latest');
  if (fs.existsSync(latest)) {
    const args2 = withoutFlag(withoutFlag(args, '--resume', true), '--overwrite', false);
    return { args: [...args2, '--resume', runDir], from: `every worker from the checkpoint ${path.join(runDir, 'checkpoints', fs.readFileSync(latest, 'utf8').trim())}` };
  }
  const again = args.includes('--overwrite') ? args : [...args, '--overwrite'];
  return { args: again, from: `from the start (${runDir} holds no checkpoint yet)` };
}

export function defaultRunDir(model: string): string {
  return path.join('runs', `${model}-${new Date().toISOString().replace(/[:.]/g, '-')}`);
}

export async function launchCommand(argv: string[]): Promise<number> {
  const own = parseWrapperArgs('launch', argv, LAUNCH_OPTIONS);
  if (!own) {
    process.stdout.write(wrapperHelp('launch', [], LAUNCH_OPTIONS, '--nproc-per-node 4 -- --model resnet18 --compressor powersgd') + '\n');
    return 0;
  }
  return runLaunch({ ...own.values, trainArgs: own.trainArgs });
}
