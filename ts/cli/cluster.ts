/**
 * `accordion cluster`: a job over simulated hosts on this machine, each a network namespace with its
 * outgoing traffic shaped.
 */
import * as path from 'node:path';
import { UsageError } from '../base/errors.js';
import { ARCHITECTURES, OPTIONS } from '../config/options.js';
import { parseBandwidthSchedule, parseHostBandwidths, parseLatency, parseLoss, parseSubnet, runCluster } from '../cluster/cluster.js';
import { resolveCheckpointDir } from '../train/checkpoint.js';
import { parseTrainArgs } from './args.js';
import { parseWrapperArgs, wrapperHelp, type WrapperOption } from './wrapper-args.js';
import { CLI_PATH, defaultRunDir } from './launch.js';

const CLUSTER_OPTIONS: WrapperOption[] = [
  { flag: '--hosts', value: 'N', help: 'simulated hosts, one network namespace each', dflt: '2' },
  { flag: '--nproc-per-host', value: 'N', help: 'worker processes per host', dflt: '1' },
  {
    flag: '--bandwidth', value: 'RATE', dflt: '1gbit',
    help: "rate of each host's outgoing traffic: bit, kbit, mbit, gbit (tbf); or a schedule of rates from times after the hosts start, e.g. 0s:1gbit,120s:100mbit,300s:1gbit (each change logged in network.jsonl)",
  },
  { flag: '--host-bandwidth', value: 'H:RATE,…', help: 'hosts with a rate of their own for the whole job, e.g. 1:100mbit for a slow host 1', dflt: '' },
  { flag: '--latency', value: 'TIME', help: "delay added to each host's outgoing packets: us, ms, s (the kernel's netem, which some kernels lack; a round trip gains twice it)", dflt: '0ms' },
  { flag: '--loss', value: 'PCT', help: "share of each host's outgoing packets dropped at random, e.g. 1%", dflt: '0%' },
  { flag: '--subnet', value: 'CIDR', help: "the hosts' IPv4 subnet; host i gets its address i + 1", dflt: '10.87.0.0/24' },
];

const ABOUT = [
  'Runs a job over simulated hosts on this machine: each host is a network namespace with its own',
  "address on one bridge and its outgoing traffic shaped with tc; every host runs accordion launch with",
  "host 0's address as the master. Each host's bytes sent and received per epoch go to <run>/network.jsonl.",
  'Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN). The namespaces are removed when the command ends.',
];

export async function clusterCommand(argv: string[]): Promise<number> {
  const own = parseWrapperArgs('cluster', argv, CLUSTER_OPTIONS);
  if (!own) {
    process.stdout.write(wrapperHelp('cluster', ABOUT, CLUSTER_OPTIONS, '--hosts 4 --bandwidth 100mbit --latency 1ms -- --model resnet18 --compressor powersgd') + '\n');
    return 0;
  }
  const { values: raw, trainArgs } = own;
  const count = (flag: string) => {
    const value = raw.get(flag)!;
    if (!/^\d+$/.test(value) || Number(value) < 1 || Number(value) > 1000) throw new UsageError(`option ${flag}: expected an integer from 1 to 1000, got '${value}'`);
    return Number(value);
  };
  const hosts = count('--hosts');
  const nprocPerHost = count('--nproc-per-host');
  const schedule = parseBandwidthSchedule(raw.get('--bandwidth')!);
  const hostRates = parseHostBandwidths(raw.get('--host-bandwidth')!, hosts);
  const shape = { bitsPerSecond: schedule[0]!.bitsPerSecond, delaySeconds: parseLatency(raw.get('--latency')!), loss: parseLoss(raw.get('--loss')!) };
  const subnet = parseSubnet(raw.get('--subnet')!, hosts);
  // Every host must write to the same run directory, so it is chosen once, here.
  const parsed = parseTrainArgs(trainArgs);
  if (!parsed.model) throw new UsageError(`option --model is required (one of: ${ARCHITECTURES.join(', ')})`);
  let runDir = parsed.outDir as string | undefined;
  if (!runDir && typeof parsed.resume === 'string') runDir = path.resolve(resolveCheckpointDir(parsed.resume), '..', '..');
  if (!runDir) trainArgs.push('--out', (runDir = defaultRunDir(String(parsed.model))));
  const timeoutMs = typeof parsed.timeoutMs === 'number' ? parsed.timeoutMs : (OPTIONS.timeoutMs.default as number);
  const result = await runCluster({ hosts, nprocPerHost, shape, schedule, hostRates, subnet, trainArgs, runDir, timeoutMs, cli: CLI_PATH });
  if (result.failure) process.stderr.write(`accordion cluster: job failed: ${result.failure}\n`);
  return result.exitCode;
}
