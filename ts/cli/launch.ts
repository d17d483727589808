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

/** The command-line program every worker runs (`node lib/cli.js train …`). */
export const CLI_PATH = fileURLToPath(new URL('../cli.js', import.meta.url));

const LAUNCH_OPTIONS: { flag: string; key: string; kind: 'int' | 'string'; help: string; dflt: string }[] = [
  { flag: '--nproc-per-node', key: 'nprocPerNode', kind: 'int', help: 'worker processes on this node', dflt: '1' },
  { flag: '--nnodes', key: 'nnodes', kind: 'int', help: 'nodes in the job', dflt: '1' },
  { flag: '--node-rank', key: 'nodeRank', kind: 'int', help: "this node's index", dflt: '0' },
  { flag: '--master-addr', key: 'masterAddr', kind: 'string', help: "node 0's address (the store listens there)", dflt: '127.0.0.1' },
  { flag: '--master-port', key: 'masterPort', kind: 'int', help: "the store's port", dflt: '29500' },
  { flag: '--token', key: 'token', kind: 'string', help: 'job token shared by all nodes (default: ACCORDION_JOB_TOKEN, or random for one node)', dflt: '' },
];

function launchHelp(): string {
  return [
    'Usage: accordion launch [launch options] -- <train options>',
    '',
    'Launch options:',
    ...LAUNCH_OPTIONS.map((o) => `  ${(o.flag + (o.kind === 'int' ? ' N' : ' VALUE')).padEnd(26)} ${o.help}${o.dflt ? ` (default: ${o.dflt})` : ''}`),
    '',
    'Example: accordion launch --nproc-per-node 4 -- --model resnet18 --compressor powersgd',
  ].join('\n');
}

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
  const split = argv.indexOf('--');
  const own = split < 0 ? argv : argv.slice(0, split);
  const trainArgs = split < 0 ? [] : argv.slice(split + 1);
  const values: Record<string, string | number> = {};
  for (let i = 0; i < own.length; i++) {
    const arg = own[i]!;
    if (arg === '--help') {
      process.stdout.write(launchHelp() + '\n');
      return 0;
    }
    const eq = arg.indexOf('=');
    const flag = eq > 0 ? arg.slice(0, eq) : arg;
    const spec = LAUNCH_OPTIONS.find((o) => o.flag === flag);
    if (!spec) throw new UsageError(`unknown launch option ${flag} (training options go after --; see accordion launch --help)`);
    const raw = eq > 0 ? arg.slice(eq + 1) : own[++i];
    if (raw === undefined) throw new UsageError(`option ${flag} needs a value`);
    if (spec.kind === 'int' && !/^\d+$/.test(raw)) throw new UsageError(`option ${flag}: expected a non-negative integer, got '${raw}'`);
    if (spec.key === 'masterPort' && !(Number(raw) >= 1 && Number(raw) <= 65535))
      throw new UsageError(`option ${flag}: expected a TCP port from 1 to 65535, got '${raw}'`);
    values[spec.key] = spec.kind === 'int' ? Number(raw) : raw;
  }
  if (trainArgs.length === 0) throw new UsageError('accordion launch needs training options after -- (e.g. -- --model resnet18)');
  return runLaunch({ nprocPerNode: 1, ...values, trainArgs } as Parameters<typeof runLaunch>[0]);
}
