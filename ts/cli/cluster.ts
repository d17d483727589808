/**
 * `accordion cluster`: a job over simulated hosts on this machine, each a network namespace with its
 * outgoing traffic shaped.
 */
import * as path from 'node:path';
import { UsageError } from '../base/errors.js';
import { ARCHITECTURES, OPTIONS } from '../config/options.js';
import { parseBandwidthSchedule, parseBurst, parseHostBandwidths, parseLatency, parseLoss, parseSubnet, runCluster } from '../cluster/cluster.js';
import { resolveCheckpointDir } from '../train/checkpoint.js';
import { parseTrainArgs } from './args.js';
import { parseWrapperArgs, wrapperHelp, type CommandOptions } from './wrapper-args.js';
import { CLI_PATH, defaultRunDir } from './launch.js';

export const CLUSTER_OPTIONS = {
  hosts: { flag: '--hosts', type: 'int', min: 1, max: 1000, default: 2, help: 'simulated hosts, one network namespace each' },
  nprocPerHost: { flag: '--nproc-per-host', type: 'int', min: 1, max: 1000, default: 1, help: 'worker processes per host' },
  bandwidth: {
    flag: '--bandwidth', type: 'string', value: 'RATE', default: '1gbit',
    help: "rate of each host's outgoing traffic: bit, kbit, mbit, gbit (tbf); or a schedule of rates from times after the hosts start, e.g. 0s:1gbit,120s:100mbit,300s:1gbit (each change logged in network.jsonl)",
  },
  hostBandwidth: { flag: '--host-bandwidth', type: 'string', value: 'H:RATE,…', default: '', help: 'hosts with a rate of their own for the whole job, e.g. 1:100mbit for a slow host 1' },
  latency: { flag: '--latency', type: 'string', value: 'TIME', default: '0ms', help: "delay added to each host's outgoing packets: us, ms, s (the kernel's netem, which some kernels lack; a round trip gains twice it)" },
  burst: {
    flag: '--burst', type: 'string', value: 'TIME', default: '2ms',
    help: "what each host's token bucket lets through at once, as time at its rate: us, ms, s (as a switch's or NIC's buffer would; the link's rate holds beyond it)",
  },
  loss: { flag: '--loss', type: 'string', value: 'PCT', default: '0%', help: "share of each host's outgoing packets dropped at random, e.g. 1%" },
  subnet: { flag: '--subnet', type: 'string', value: 'CIDR', default: '10.87.0.0/24', help: "the hosts' IPv4 subnet; host i gets its address i + 1" },
} as const satisfies CommandOptions;

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
  const { values: o, trainArgs } = own;
  const { hosts, nprocPerHost } = o;
  const schedule = parseBandwidthSchedule(o.bandwidth);
  const hostRates = parseHostBandwidths(o.hostBandwidth, hosts);
  const shape = { bitsPerSecond: schedule[0]!.bitsPerSecond, delaySeconds: parseLatency(o.latency), loss: parseLoss(o.loss), burstSeconds: parseBurst(o.burst) };
  const subnet = parseSubnet(o.subnet, hosts);
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
