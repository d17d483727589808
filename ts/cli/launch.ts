/**
 * `accordion launch`: one training process per worker on this node, as torchrun starts them; also
 * what `accordion train --workers N` becomes outside a launched job.
 */
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { UsageError } from '../base/errors.js';
import { launch } from '../cluster/launch.js';
import { checkRunDir } from '../train/rundir.js';
import { parseTrainArgs } from './args.js';
import { parseWrapperArgs, wrapperHelp, type WrapperOption } from './wrapper-args.js';

/** The command-line program every worker runs (`node lib/cli.js train …`). */
export const CLI_PATH = fileURLToPath(new URL('../cli.js', import.meta.url));

const LAUNCH_OPTIONS: WrapperOption[] = [
  { flag: '--nproc-per-node', value: 'N', help: 'worker processes on this node', dflt: '1' },
  { flag: '--nnodes', value: 'N', help: 'nodes in the job', dflt: '1' },
  { flag: '--node-rank', value: 'N', help: "this node's index", dflt: '0' },
  { flag: '--master-addr', value: 'VALUE', help: "node 0's address (the store listens there)", dflt: '127.0.0.1' },
  { flag: '--master-port', value: 'N', help: "the store's port", dflt: '29500' },
  { flag: '--token', value: 'VALUE', help: 'job token shared by all nodes (default: ACCORDION_JOB_TOKEN, or random for one node)', dflt: '' },
];

/** Runs the training command once per worker through the launcher and returns its exit code. */
export async function runLaunch(options: {
  nprocPerNode: number;
  nnodes?: number;
  nodeRank?: number;
  masterAddr?: string;
  masterPort?: number;
  token?: string;
  trainArgs: string[];
}): Promise<number> {
  const trainArgs = [...options.trainArgs];
  // Every worker must write to the same run directory, so it is chosen once, here.
  const parsed = parseTrainArgs(trainArgs);
  if (!parsed.outDir && !parsed.resume) trainArgs.push('--out', defaultRunDir(String(parsed.model ?? 'run')));
  // Rank 0 checks this too; checking here, where rank 0's node starts, refuses before any worker starts.
  if ((options.nodeRank ?? 0) === 0) checkRunDir(parsed as { outDir?: string; resume?: string; overwrite?: boolean });
  const result = await launch({
    nprocPerNode: options.nprocPerNode,
    nnodes: options.nnodes ?? 1,
    nodeRank: options.nodeRank ?? 0,
    masterAddr: options.masterAddr ?? '127.0.0.1',
    masterPort: options.masterPort ?? 29500,
    token: options.token || undefined,
    command: [process.execPath, CLI_PATH, 'train', ...trainArgs],
  });
  if (result.failure) process.stderr.write(`accordion launch: job failed: ${result.failure}\n`);
  return result.exitCode;
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
  const { values, trainArgs } = own;
  const count = (flag: string) => {
    const raw = values.get(flag)!;
    if (!/^\d+$/.test(raw)) throw new UsageError(`option ${flag}: expected a non-negative integer, got '${raw}'`);
    return Number(raw);
  };
  const masterPort = count('--master-port');
  if (!(masterPort >= 1 && masterPort <= 65535)) throw new UsageError(`option --master-port: expected a TCP port from 1 to 65535, got '${values.get('--master-port')}'`);
  return runLaunch({
    nprocPerNode: count('--nproc-per-node'),
    nnodes: count('--nnodes'),
    nodeRank: count('--node-rank'),
    masterAddr: values.get('--master-addr')!,
    masterPort,
    token: values.get('--token')!,
    trainArgs,
  });
}
