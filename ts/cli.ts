#!/usr/bin/env node
/**
 * Command line: `accordion train [options]`, `accordion info`. Usage errors exit with code 2 and a
 * message naming the option; runtime errors exit with code 1.
 */
import * as path from 'node:path';
import { readFileSync, realpathSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { AccordionError, DataError, UsageError, signalExitCode } from './errors.js';
import { DEFAULT_CONFIG, Trainer, type TrainConfig, type TrainSummary } from './trainer.js';
import { ARCHITECTURES } from './model.js';
import { distributedEnv } from './cluster/group.js';
import { LAUNCHER_NAMES, describeLaunch } from './cluster/environment.js';
import { watchLifeline } from './cluster/lifeline.js';
import { launch } from './cluster/launch.js';
import { parseBandwidth, parseLatency, parseLoss, parseSubnet, runCluster } from './cluster/cluster.js';
import { writeReport } from './report/report.js';
import { resolveCheckpointDir } from './checkpoint.js';
import { splitTextFile } from './data/wikitext.js';
import { checkRunDir } from './rundir.js';

type Kind = 'int' | 'number' | 'string' | 'list' | 'numbers' | 'flag';

interface OptionSpec {
  flag: string;
  key: keyof TrainConfig | 'help' | 'config' | 'text';
  kind: Kind;
  help: string;
  choices?: readonly string[];
  /** For flags that set a boolean key to false (e.g. --no-nesterov). */
  negate?: boolean;
}

const TRAIN_OPTIONS: OptionSpec[] = [
  { flag: '--model', key: 'model', kind: 'string', choices: ARCHITECTURES, help: 'model architecture (required)' },
  { flag: '--device', key: 'device', kind: 'string', help: 'where the model trains: cpu, cuda (GPU 0) or cuda:N' },
  { flag: '--dataset', key: 'dataset', kind: 'string', choices: ['synthetic', 'cifar10', 'cifar100', 'wikitext2'], help: 'dataset; cifar10 when --data is given (wikitext2 for lstm)' },
  { flag: '--data', key: 'dataDir', kind: 'string', help: 'directory of the CIFAR binary files, or of wiki.{train,valid,test}.tokens for lstm' },
  { flag: '--text', key: 'text', kind: 'string', help: 'lstm: a plain text file to train on instead of --data, its lines split 90/5/5 into train/valid/test' },
  { flag: '--epochs', key: 'epochs', kind: 'int', help: 'epochs to train (6 on synthetic data)' },
  { flag: '--batch-size', key: 'batchSize', kind: 'int', help: 'batch size per worker (64 on synthetic data)' },
  { flag: '--eval-batch-size', key: 'evalBatchSize', kind: 'int', help: 'batch size for evaluation' },
  { flag: '--lr', key: 'lr', kind: 'number', help: 'base learning rate for one worker (0.02 on synthetic data)' },
  { flag: '--momentum', key: 'momentum', kind: 'number', help: 'SGD momentum' },
  { flag: '--weight-decay', key: 'weightDecay', kind: 'number', help: 'weight decay' },
  { flag: '--no-nesterov', key: 'nesterov', kind: 'flag', negate: true, help: 'plain heavy-ball momentum instead of Nesterov' },
  { flag: '--warmup-epochs', key: 'warmupEpochs', kind: 'number', help: 'linear warm-up to lr × workers over this many epochs' },
  { flag: '--milestones', key: 'milestones', kind: 'list', help: 'comma-separated milestones m: the lr is multiplied by --lr-decay from epoch m + 3 on (counting from 1)' },
  { flag: '--lr-decay', key: 'lrDecay', kind: 'number', help: 'factor applied to the lr at each milestone' },
  { flag: '--seed', key: 'seed', kind: 'int', help: 'seed of initialisation, shuffling and augmentation' },
  { flag: '--workers', key: 'workers', kind: 'int', help: 'number of worker processes' },
  { flag: '--compressor', key: 'compressor', kind: 'string', choices: ['none', 'powersgd', 'topk'], help: 'gradient compressor' },
  { flag: '--rank', key: 'rank', kind: 'int', help: 'PowerSGD rank' },
  { flag: '--topk-ratio', key: 'topkRatio', kind: 'number', help: 'fraction of entries TopK sends, in (0, 1]' },
  { flag: '--min-compression-rate', key: 'minCompressionRate', kind: 'number', help: 'PowerSGD sends a matrix dense unless (n+m)·r·rate < n·m; 0 compresses all' },
  { flag: '--accordion', key: 'accordion', kind: 'string', choices: ['auto', 'on', 'off'], help: 'adaptive compression; auto: on with a compressor unless --rank/--topk-ratio fix the level' },
  { flag: '--eta', key: 'eta', kind: 'number', help: "Accordion's threshold on the relative change of a layer's gradient norm" },
  { flag: '--accordion-interval', key: 'accordionInterval', kind: 'int', help: 'epochs between Accordion checks (2 on synthetic data)' },
  { flag: '--low-rank', key: 'lowRank', kind: 'int', help: 'PowerSGD rank in critical regimes (low compression)' },
  { flag: '--high-rank', key: 'highRank', kind: 'int', help: 'PowerSGD rank otherwise (high compression)' },
  { flag: '--low-ratio', key: 'lowRatio', kind: 'number', help: 'TopK ratio in critical regimes (low compression)' },
  { flag: '--high-ratio', key: 'highRatio', kind: 'number', help: 'TopK ratio otherwise (high compression)' },
  { flag: '--adapt', key: 'adapt', kind: 'string', choices: ['compression', 'batch', 'smith', 'auto', 'batch+compression'], help: "what Accordion adapts: per-layer compression (compression: low/high levels; auto: each layer's level from candidates under an error budget), the global batch (batch: B_low → B_high; smith: Smith et al.'s baseline), or batch and levels together" },
  { flag: '--auto-ranks', key: 'autoRanks', kind: 'list', help: 'adapt auto: candidate PowerSGD ranks (with dense and --rank, the reference)' },
  { flag: '--auto-ratios', key: 'autoRatios', kind: 'numbers', help: 'adapt auto: candidate TopK ratios (with dense and --topk-ratio, the reference)' },
  { flag: '--error-budget', key: 'errorBudget', kind: 'number', help: "adapt auto: the layers' summed compression error may reach this multiple of the reference level's" },
  { flag: '--critical-budget', key: 'criticalBudget', kind: 'number', help: "adapt auto: factor on a layer's share of the budget where Accordion detects a critical regime (a norm change of η or more, or a learning-rate decay; < 1: tighter)" },
  { flag: '--error-measure', key: 'errorMeasure', kind: 'string', choices: ['squared', 'relative'], help: "adapt auto: a layer's error in the budget: squared ‖G − C(G)‖² (large layers weigh more) or relative ‖G − C(G)‖ / ‖G‖ (every layer alike)" },
  { flag: '--auto-cost', key: 'autoCost', kind: 'string', choices: ['floats', 'seconds'], help: 'adapt auto: what a level costs: floats per step, or seconds (kernel time + bytes over the link measured at start)' },
  { flag: '--batch-low', key: 'batchLow', kind: 'int', help: 'global batch in critical regimes (batch-size mode)' },
  { flag: '--batch-high', key: 'batchHigh', kind: 'int', help: 'global batch afterwards (batch-size mode)' },
  { flag: '--out', key: 'outDir', kind: 'string', help: 'run directory (default runs/<model>-<time>); one that holds a run needs --resume or --overwrite' },
  { flag: '--overwrite', key: 'overwrite', kind: 'flag', help: "replace the run in --out: removes its config.json, metrics.jsonl, summary.json, report.html and checkpoints" },
  { flag: '--checkpoint-every', key: 'checkpointEvery', kind: 'int', help: 'epochs between checkpoints' },
  { flag: '--resume', key: 'resume', kind: 'string', help: 'continue from a run or checkpoint directory' },
  { flag: '--synthetic-train', key: 'syntheticTrain', kind: 'int', help: 'training images of the synthetic dataset' },
  { flag: '--synthetic-test', key: 'syntheticTest', kind: 'int', help: 'test images of the synthetic dataset' },
  { flag: '--hidden', key: 'hidden', kind: 'int', help: 'lstm: hidden and embedding size' },
  { flag: '--layers', key: 'layers', kind: 'int', help: 'lstm: layers' },
  { flag: '--dropout', key: 'dropout', kind: 'number', help: 'lstm: dropout on the embedding, between layers and on the output' },
  { flag: '--bptt', key: 'bptt', kind: 'int', help: 'lstm: steps of truncated backpropagation through time' },
  { flag: '--clip', key: 'clip', kind: 'number', help: 'lstm: global gradient-norm clip (0: none)' },
  { flag: '--threads', key: 'threads', kind: 'int', help: 'native threads (default: OMP_NUM_THREADS or all cores); an overlapped exchange takes one for its communication thread' },
  { flag: '--bucket-mb', key: 'bucketMb', kind: 'number', help: 'overlap the exchange with backward in buckets of this many MiB of gradients (default 25, as PyTorch DDP; 0: exchange after backward)' },
  { flag: '--timeout', key: 'timeoutMs', kind: 'int', help: 'milliseconds before a rendezvous or collective gives up' },
  { flag: '--quiet', key: 'progress', kind: 'flag', negate: true, help: 'no progress bar or per-epoch lines' },
  { flag: '--config', key: 'config', kind: 'string', help: "JSON file of options (names as here or as in a run's config.json); flags override it" },
  { flag: '--help', key: 'help', kind: 'flag', help: 'show this help' },
];

function parseValue(spec: OptionSpec, raw: string): unknown {
  const bad = (what: string) => new UsageError(`option ${spec.flag}: ${what}, got '${raw}'`);
  switch (spec.kind) {
    case 'int': {
      if (!/^-?\d+$/.test(raw)) throw bad('expected an integer');
      if (!Number.isSafeInteger(Number(raw))) throw bad(`expected an integer of at most ${Number.MAX_SAFE_INTEGER} in magnitude`);
      return Number(raw);
    }
    case 'number': {
      const v = Number(raw);
      if (raw.trim() === '' || !Number.isFinite(v)) throw bad('expected a number');
      return v;
    }
    case 'list': {
      const parts = raw === '' ? [] : raw.split(',');
      if (parts.some((p) => !/^\d+$/.test(p.trim()))) throw bad('expected comma-separated non-negative integers');
      return parts.map((p) => Number(p));
    }
    case 'numbers': {
      const parts = raw.split(',');
      if (parts.some((p) => p.trim() === '' || !Number.isFinite(Number(p)))) throw bad('expected comma-separated numbers');
      return parts.map((p) => Number(p));
    }
    default:
      if (spec.choices && !spec.choices.includes(raw)) throw bad(`expected one of ${spec.choices.join(', ')}`);
      return raw;
  }
}

/** Options from a JSON file: keys are flag names without dashes or config names (camelCase). */
function readConfigFile(file: string): Record<string, unknown> {
  let parsed: unknown;
  try {
    parsed = JSON.parse(readFileSync(file, 'utf8'));
  } catch (err) {
    throw new UsageError(`option --config: cannot read ${file}: ${(err as Error).message}`);
  }
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) throw new UsageError(`option --config: ${file} must hold a JSON object`);
  const out: Record<string, unknown> = {};
  for (const [name, value] of Object.entries(parsed)) {
    const spec = TRAIN_OPTIONS.find((o) => o.key === name || o.flag === `--${name}`);
    if (!spec || spec.key === 'config' || spec.key === 'help') throw new UsageError(`option --config: ${file} has an unknown option '${name}'`);
    if (spec.kind === 'flag') {
      if (typeof value !== 'boolean') throw new UsageError(`option --config: '${name}' in ${file} must be true or false`);
      out[spec.key] = spec.key === name ? value : spec.negate ? !value : value;
      continue;
    }
    out[spec.key] = parseValue(spec, Array.isArray(value) ? value.join(',') : String(value));
  }
  return out;
}

export function parseTrainArgs(argv: string[]): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    const eq = arg.indexOf('=');
    const flag = arg.startsWith('--') && eq > 0 ? arg.slice(0, eq) : arg;
    const spec = TRAIN_OPTIONS.find((o) => o.flag === flag);
    if (!spec) {
      throw new UsageError(arg.startsWith('-') ? `unknown option ${flag} (see --help)` : `unexpected argument '${arg}' (options start with --)`);
    }
    if (spec.kind === 'flag') {
      if (eq > 0) throw new UsageError(`option ${spec.flag} takes no value`);
      out[spec.key] = !spec.negate;
      continue;
    }
    const raw = eq > 0 ? arg.slice(eq + 1) : argv[++i];
    if (raw === undefined || (eq < 0 && raw.startsWith('--'))) throw new UsageError(`option ${spec.flag} needs a value`);
    out[spec.key] = parseValue(spec, raw);
  }
  if (typeof out.config === 'string') {
    const file = out.config;
    delete out.config;
    return { ...readConfigFile(file), ...out };
  }
  return out;
}

function trainHelp(): string {
  const defaults = DEFAULT_CONFIG as unknown as Record<string, unknown>;
  const lines = TRAIN_OPTIONS.map((o) => {
    const value = o.kind === 'flag' ? '' : ` ${o.kind === 'list' || o.kind === 'numbers' ? 'A,B' : o.kind === 'int' || o.kind === 'number' ? 'N' : 'VALUE'}`;
    const dflt = defaults[o.key];
    const shown = dflt === undefined || o.kind === 'flag' ? '' : ` (default: ${Array.isArray(dflt) ? dflt.join(',') : dflt})`;
    const choices = o.choices ? ` [${o.choices.join('|')}]` : '';
    return `  ${(o.flag + value).padEnd(26)} ${o.help}${choices}${shown}`;
  });
  return ['Usage: accordion train --model resnet18|vgg19bn|lstm [options]', '', 'Options:', ...lines].join('\n');
}

const USAGE = `Usage: accordion <command> [options]

Commands:
  train    train a model (accordion train --help for options; --workers N starts N processes)
  launch   start one training process per worker, like torchrun (accordion launch --help)
  cluster  run a job over N simulated hosts with shaped links; needs root (accordion cluster --help)
  report   write an HTML report of run directories: accordion report RUN_DIR [RUN_DIR …] [--out FILE]
  info     show how the native addon was built, which devices it sees and which launcher started it`;

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
async function runLaunch(options: {
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
    command: [process.execPath, fileURLToPath(import.meta.url), 'train', ...trainArgs],
  });
  if (result.failure) process.stderr.write(`accordion launch: job failed: ${result.failure}\n`);
  return result.exitCode;
}

function defaultRunDir(model: string): string {
  return path.join('runs', `${model}-${new Date().toISOString().replace(/[:.]/g, '-')}`);
}

async function launchCommand(argv: string[]): Promise<number> {
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

const CLUSTER_OPTIONS: { flag: string; value: string; help: string; dflt: string }[] = [
  { flag: '--hosts', value: 'N', help: 'simulated hosts, one network namespace each', dflt: '2' },
  { flag: '--nproc-per-host', value: 'N', help: 'worker processes per host', dflt: '1' },
  { flag: '--bandwidth', value: 'RATE', help: "rate of each host's outgoing traffic: bit, kbit, mbit, gbit (tbf)", dflt: '1gbit' },
  { flag: '--latency', value: 'TIME', help: "delay added to each host's outgoing packets: us, ms, s (netem; a round trip gains twice it)", dflt: '0ms' },
  { flag: '--loss', value: 'PCT', help: "share of each host's outgoing packets dropped at random, e.g. 1%", dflt: '0%' },
  { flag: '--subnet', value: 'CIDR', help: "the hosts' IPv4 subnet; host i gets its address i + 1", dflt: '10.87.0.0/24' },
];

function clusterHelp(): string {
  return [
    'Usage: accordion cluster [cluster options] -- <train options>',
    '',
    'Runs a job over simulated hosts on this machine: each host is a network namespace with its own',
    "address on one bridge and its outgoing traffic shaped with tc; every host runs accordion launch with",
    "host 0's address as the master. Each host's bytes sent and received per epoch go to <run>/network.jsonl.",
    'Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN). The namespaces are removed when the command ends.',
    '',
    'Cluster options:',
    ...CLUSTER_OPTIONS.map((o) => `  ${`${o.flag} ${o.value}`.padEnd(26)} ${o.help} (default: ${o.dflt})`),
    '',
    'Example: accordion cluster --hosts 4 --bandwidth 100mbit --latency 1ms -- --model resnet18 --compressor powersgd',
  ].join('\n');
}

async function clusterCommand(argv: string[]): Promise<number> {
  const split = argv.indexOf('--');
  const own = split < 0 ? argv : argv.slice(0, split);
  const trainArgs = split < 0 ? [] : argv.slice(split + 1);
  const raw = new Map(CLUSTER_OPTIONS.map((o) => [o.flag, o.dflt]));
  for (let i = 0; i < own.length; i++) {
    const arg = own[i]!;
    if (arg === '--help') {
      process.stdout.write(clusterHelp() + '\n');
      return 0;
    }
    const eq = arg.indexOf('=');
    const flag = eq > 0 ? arg.slice(0, eq) : arg;
    if (!raw.has(flag)) throw new UsageError(`unknown cluster option ${flag} (training options go after --; see accordion cluster --help)`);
    const value = eq > 0 ? arg.slice(eq + 1) : own[++i];
    if (value === undefined) throw new UsageError(`option ${flag} needs a value`);
    raw.set(flag, value);
  }
  const count = (flag: string) => {
    const value = raw.get(flag)!;
    if (!/^\d+$/.test(value) || Number(value) < 1 || Number(value) > 1000) throw new UsageError(`option ${flag}: expected an integer from 1 to 1000, got '${value}'`);
    return Number(value);
  };
  const hosts = count('--hosts');
  const nprocPerHost = count('--nproc-per-host');
  const shape = { bitsPerSecond: parseBandwidth(raw.get('--bandwidth')!), delaySeconds: parseLatency(raw.get('--latency')!), loss: parseLoss(raw.get('--loss')!) };
  const subnet = parseSubnet(raw.get('--subnet')!, hosts);
  if (trainArgs.length === 0) throw new UsageError('accordion cluster needs training options after -- (e.g. -- --model resnet18)');
  // Every host must write to the same run directory, so it is chosen once, here.
  const parsed = parseTrainArgs(trainArgs);
  if (!parsed.model) throw new UsageError(`option --model is required (one of: ${ARCHITECTURES.join(', ')})`);
  let runDir = parsed.outDir as string | undefined;
  if (!runDir && typeof parsed.resume === 'string') runDir = path.resolve(resolveCheckpointDir(parsed.resume), '..', '..');
  if (!runDir) trainArgs.push('--out', (runDir = defaultRunDir(String(parsed.model))));
  const timeoutMs = typeof parsed.timeoutMs === 'number' ? parsed.timeoutMs : DEFAULT_CONFIG.timeoutMs;
  const result = await runCluster({ hosts, nprocPerHost, shape, subnet, trainArgs, runDir, timeoutMs, cli: fileURLToPath(import.meta.url) });
  if (result.failure) process.stderr.write(`accordion cluster: job failed: ${result.failure}\n`);
  return result.exitCode;
}

async function train(argv: string[]): Promise<number> {
  const args = parseTrainArgs(argv);
  if (args.help) {
    process.stdout.write(trainHelp() + '\n');
    return 0;
  }
  if (!args.model) throw new UsageError(`option --model is required (one of: ${ARCHITECTURES.join(', ')})`);
  const distributed = distributedEnv();
  // A worker of `accordion launch` stops the moment its launcher is gone, even one killed outright,
  // as if the launcher had stopped it with SIGTERM: leaving now keeps the last complete checkpoint.
  watchLifeline(() => process.exit(signalExitCode('SIGTERM')));
  // --workers N outside a launched job: become the launcher of N workers on this machine.
  if (!distributed && typeof args.workers === 'number' && args.workers > 1) {
    const masterPort = argv.includes('--master-port') ? undefined : 0;
    return runLaunch({ nprocPerNode: args.workers, masterPort, trainArgs: argv });
  }
  // The default run directory is stamped with each process's own clock; `accordion launch` picks one.
  if (distributed && distributed.launcher !== 'accordion' && distributed.worldSize > 1 && !args.outDir && !args.resume)
    throw new UsageError(`under ${LAUNCHER_NAMES[distributed.launcher]} the ranks write one run directory: give every rank the same --out (or --resume)`);
  if (args.dataDir && !args.dataset) args.dataset = args.model === 'lstm' ? 'wikitext2' : 'cifar10';
  // The library prints nothing unless asked; the command line shows progress unless --quiet.
  args.progress ??= true;
  args.outDir ??= args.resume ? undefined : defaultRunDir(String(args.model));
  if (args.text !== undefined) useTextFile(args);
  // A signal while the data is read and the model built: nothing has been trained or written yet.
  const onEarlySignal = (signal: NodeJS.Signals) => {
    process.stderr.write(`\naccordion: interrupted by ${signal} before training started; no checkpoint was written\n`);
    process.exit(signalExitCode(signal));
  };
  process.once('SIGINT', onEarlySignal);
  process.once('SIGTERM', onEarlySignal);
  let trainer: Trainer;
  try {
    trainer = await Trainer.create(args as Partial<TrainConfig> & { model: TrainConfig['model'] });
  } finally {
    process.off('SIGINT', onEarlySignal);
    process.off('SIGTERM', onEarlySignal);
  }
  let stoppedBy: NodeJS.Signals | undefined;
  const onSignal = (signal: NodeJS.Signals) => {
    if (distributed) {
      // The other workers are being stopped too; a checkpoint being written is a temporary
      // directory, so leaving now keeps the last complete one.
      process.exit(signalExitCode(signal));
    }
    stoppedBy = signal;
    process.stderr.write(`\n${signal}: stopping after the current step; the last checkpoint is kept\n`);
    trainer.stop();
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  const { config } = trainer;
  const reporting = trainer.rank === 0;
  if (reporting) process.stderr.write(
    `accordion: ${config.model} (${trainer.model.parameterCount().toLocaleString('en-US')} parameters) on ${config.dataset}` +
      ` (${trainer.task.trainSamples} train / ${trainer.task.testSamples} test ${trainer.task.kind === 'language' ? 'tokens' : 'images'}), ${config.epochs} epochs,` +
      ` batch ${config.batchSize}${config.workers > 1 ? ` per worker × ${config.workers} workers` : ''}, device ${config.device}, compressor ${describeCompressor(config)}, run directory ${config.outDir}\n`,
  );
  try {
    const summary = await trainer.fit();
    if (stoppedBy && summary.interrupted) {
      process.stderr.write(describeInterruption(stoppedBy, summary, config, argv));
      return signalExitCode(stoppedBy);
    }
    const last = summary.epochs[summary.epochs.length - 1];
    if (reporting) process.stdout.write(
      [
        `model ${summary.model}, ${summary.parameters.toLocaleString('en-US')} parameters, dataset ${summary.dataset}`,
        `epochs ${summary.epochs.length}, time ${summary.seconds.toFixed(1)} s` +
          (last ? `, ${last.samplesPerSecond.toFixed(1)} samples/s in the last epoch` : ''),
        `final test accuracy ${(100 * summary.finalTestAccuracy).toFixed(2)}%, best ${(100 * summary.bestTestAccuracy).toFixed(2)}%` +
          (last?.testPerplexity !== undefined ? `; perplexity: validation ${last.validPerplexity!.toFixed(2)}, test ${last.testPerplexity.toFixed(2)}` : ''),
        `compressor ${describeCompressor(config)}: ${summary.floatsSentTotal.toLocaleString('en-US')} floats sent by this worker` +
          (last ? ` (${last.floatsSent.toLocaleString('en-US')} in the last epoch)` : ''),
        ...(config.adapt !== 'compression' && config.adapt !== 'auto' && summary.epochs.length
          ? [`global batch ${summary.epochs[0]!.batchSize} → ${summary.epochs[summary.epochs.length - 1]!.batchSize} (${config.adapt === 'smith' ? 'grown at the LR milestones' : 'Accordion on the whole-model norm'})`]
          : []),
        ...(summary.accordion ? [`Accordion: ${summary.switches.length} level switch${summary.switches.length === 1 ? '' : 'es'}`, ...describeSwitches(summary)] : []),
        `run directory ${summary.runDir}`,
      ].join('\n') + '\n',
    );
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    await trainer.dispose();
  }
  return 0;
}

/**
 * --text FILE: the lstm trains on a plain text file. Its lines are split 90/5/5 into the WikiText
 * layout in the run directory's text-split/ folder (the split depends on the file only, so a resumed
 * run makes the same one), which the run then reads as --data.
 */
function useTextFile(args: Record<string, unknown>): void {
  const file = args.text as string;
  delete args.text;
  if (args.model !== 'lstm') throw new UsageError(`option --text is for --model lstm; ${String(args.model)} trains on images (--data DIR)`);
  if (args.dataDir !== undefined)
    throw new UsageError('options --text and --data exclude each other: --text FILE splits a plain text file, --data DIR reads a WikiText directory');
  if (args.dataset !== undefined && args.dataset !== 'wikitext2')
    throw new UsageError(`option --text trains the lstm on a text file, not on --dataset ${String(args.dataset)}`);
  if (file === '') throw new UsageError('option --text needs a file name');
  const runDir = typeof args.outDir === 'string' ? args.outDir : path.resolve(resolveCheckpointDir(String(args.resume)), '..', '..');
  const dir = path.join(runDir, 'text-split');
  try {
    splitTextFile(file, dir);
  } catch (err) {
    if (err instanceof DataError) throw new DataError(`option --text: ${err.message}`);
    throw err;
  }
  args.dataDir = dir;
  args.dataset = 'wikitext2';
}

/** A word as a POSIX shell reads it back. */
function shellQuote(word: string): string {
  return /^[\w@%+=:,./-]+$/.test(word) ? word : `'${word.replace(/'/g, `'\\''`)}'`;
}

/**
 * What a run stopped by a signal tells its user: how far it got, the last complete checkpoint, and
 * the command that resumes from it (the same options, with --resume RUN_DIR in place of --out).
 */
function describeInterruption(signal: NodeJS.Signals, summary: TrainSummary, config: TrainConfig, argv: string[]): string {
  const done = summary.epochs.length ? summary.epochs[summary.epochs.length - 1]!.epoch : undefined;
  const lines = [
    `accordion: interrupted by ${signal}; this run did not finish` +
      (done !== undefined ? ` (${done} of ${config.epochs} epochs completed)` : ` (${config.epochs} epochs were planned)`),
  ];
  let checkpoint: string | undefined;
  try {
    checkpoint = config.outDir ? resolveCheckpointDir(config.outDir) : undefined;
  } catch {
    checkpoint = undefined;
  }
  if (checkpoint && config.outDir) {
    const kept: string[] = [];
    for (let i = 0; i < argv.length; i++) {
      const flag = argv[i]!.split('=')[0]!;
      if (flag === '--out' || flag === '--resume') {
        if (!argv[i]!.includes('=')) i++;
        continue;
      }
      if (flag === '--overwrite') continue; // it would delete the run being resumed
      kept.push(argv[i]!);
    }
    lines.push(
      `the last checkpoint is ${checkpoint}; resume with:`,
      `  accordion train ${[...kept, '--resume', config.outDir].map(shellQuote).join(' ')}`,
    );
  } else {
    lines.push(`no checkpoint was written${config.outDir ? ` in ${config.outDir}` : ''}, so there is nothing to resume from`);
  }
  return lines.join('\n') + '\n';
}

function describeCompressor(c: TrainConfig): string {
  const every = `η ${c.eta}, checked every ${c.accordionInterval} epoch${c.accordionInterval > 1 ? 's' : ''}`;
  if (c.adapt === 'auto') {
    const [unit, list, reference] = c.compressor === 'topk' ? ['ratios', c.autoRatios, c.topkRatio] : ['ranks', c.autoRanks, c.rank];
    return (
      `${c.compressor} with automatic levels (${unit} ${list.join(', ')} or dense, costed in ${c.autoCost}; ${c.errorMeasure} error budget ${c.errorBudget} × ` +
      `that of ${c.compressor === 'topk' ? 'ratio' : 'rank'} ${reference}, ×${c.criticalBudget} for critical layers; ${every})`
    );
  }
  if (c.compressor === 'powersgd')
    return c.accordion === 'on' ? `powersgd with Accordion (rank ${c.lowRank} in critical regimes, ${c.highRank} otherwise; ${every})` : `powersgd rank ${c.rank}`;
  if (c.compressor === 'topk')
    return c.accordion === 'on' ? `topk with Accordion (ratio ${c.lowRatio} in critical regimes, ${c.highRatio} otherwise; ${every})` : `topk ratio ${c.topkRatio}`;
  return 'none (dense all-reduce)';
}

/** One line per epoch that changed levels: "after epoch 3: 9 layers rank 2 → 1 (conv1.weight, …)". */
function describeSwitches(summary: TrainSummary): string[] {
  const byEpoch = new Map<number, TrainSummary['switches']>();
  for (const s of summary.switches) byEpoch.set(s.epoch, [...(byEpoch.get(s.epoch) ?? []), s]);
  const unit = summary.compressor === 'topk' ? 'ratio' : 'rank';
  return [...byEpoch].map(([epoch, list]) => {
    const groups = new Map<string, string[]>();
    for (const s of list) {
      const show = (level: number) => (level === 0 ? 'dense' : String(level));
      const change = `${show(s.from)} → ${show(s.to)}${s.reason === 'lr-decay' ? ' (lr decay)' : ''}`;
      groups.set(change, [...(groups.get(change) ?? []), s.parameter]);
    }
    const parts = [...groups].map(([change, names]) => `${names.length} layer${names.length > 1 ? 's' : ''} ${unit} ${change} (${names.slice(0, 3).join(', ')}${names.length > 3 ? ', …' : ''})`);
    return `  after epoch ${epoch}: ${parts.join('; ')}`;
  });
}

async function reportCommand(argv: string[]): Promise<number> {
  const dirs: string[] = [];
  let out: string | undefined;
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--out') {
      out = argv[++i];
      if (!out) throw new UsageError('option --out needs a file name');
    } else if (argv[i]!.startsWith('--')) throw new UsageError(`unknown report option ${argv[i]}`);
    else dirs.push(argv[i]!);
  }
  if (dirs.length === 0) throw new UsageError('usage: accordion report RUN_DIR [RUN_DIR …] [--out FILE]');
  const file = await writeReport(dirs, out, { onWarning: (message) => process.stderr.write(`accordion: warning: ${message}\n`) });
  process.stdout.write(`report written to ${file}\n`);
  return 0;
}

async function info(): Promise<void> {
  const { binding } = await import('./native.js');
  // The launcher this process would train under, or why its environment is not usable.
  let job: string;
  try {
    job = describeLaunch(distributedEnv());
  } catch (err) {
    if (!(err instanceof UsageError)) throw err;
    job = `error: ${err.message}`;
  }
  // The thread budget (--threads, else OMP_NUM_THREADS or every core) and how a model shares it out.
  const total = Number(process.env.OMP_NUM_THREADS) || binding.buildInfo().threads;
  const threads = {
    total,
    overlapped: { compute: Math.max(1, total - 1), communication: 1 },
    alone: { compute: total, communication: 0 },
    rule: 'an image model on the CPU with 2 or more workers and --bucket-mb > 0 (the default) overlaps its exchange with backward: one thread communicates, the others compute; otherwise all compute',
  };
  // NCCL's load failure (every path tried) is shown once, under devices.nccl.
  const build = binding.buildInfo();
  const devices = binding.deviceQuery();
  if (build.cuda.nccl !== true) build.cuda.nccl = 'not loaded: see devices.nccl.error';
  process.stdout.write(JSON.stringify({ build, devices, job, threads }, null, 2) + '\n');
}

export async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  try {
    if (command === 'train') return await train(rest);
    if (command === 'launch') return await launchCommand(rest);
    if (command === 'cluster') return await clusterCommand(rest);
    if (command === 'report') return await reportCommand(rest);
    if (command === 'info') await info();
    else if (command === undefined || command === '--help' || command === 'help') process.stdout.write(USAGE + '\n');
    else throw new UsageError(`unknown command '${command}'\n${USAGE}`);
    return 0;
  } catch (err) {
    const e = err as Error & { code?: string };
    process.stderr.write(`accordion: ${e instanceof AccordionError ? e.message : (e.stack ?? e.message)}\n`);
    return e instanceof UsageError ? 2 : 1;
  }
}

const invokedDirectly = process.argv[1] !== undefined && realpathSync(process.argv[1]) === fileURLToPath(import.meta.url);
if (invokedDirectly) {
  main(process.argv.slice(2)).then((code) => {
    process.exitCode = code;
  });
}
