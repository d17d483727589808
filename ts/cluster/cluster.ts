/**
 * `accordion cluster`: a job over N simulated hosts on this machine. It builds the hosts (one network
 * namespace each on a shared bridge, egress shaped with tc: see netns.ts), runs `accordion launch`
 * in every host with host 0's bridge address as the master, relays the hosts' output, records each
 * host's interface counters per epoch in <run>/network.jsonl (network-log.ts), stops every host when
 * one fails, and removes the namespaces on every way out (success, failure, SIGINT/SIGTERM; a
 * SIGKILLed command leaves them to the next run's sweep).
 *
 * The option parsers (cluster-options.ts), network.jsonl's reader (network-log.ts) and the wire
 * prediction (wire.ts) are re-exported from here.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import * as os from 'node:os';
import { UsageError, signalExitCode } from '../base/errors.js';
import { type ClusterOptions } from './cluster-options.js';
import { formatRate } from '../base/units.js';
import { ProcessSet, relay } from './launch.js';
import { createNetwork, killNamespace, missingCapabilities, removeNetwork, sweepStale, type ClusterNetwork } from './netns.js';
import { CounterSampler } from './network-log.js';

export { parseBandwidth, parseLatency, parseLoss, parseSubnet, type ClusterOptions } from './cluster-options.js';
export { formatRate } from '../base/units.js';
export { readNetworkLog, type NetworkRecord } from './network-log.js';
export {
  PACKET_HEADER_BYTES,
  broadcastWireBytes,
  compareWire,
  predictedWireBytes,
  topkExchange,
  type Exchange,
  type WireComparison,
} from './wire.js';

export interface ClusterResult {
  exitCode: number;
  /** The first failure, e.g. "host 1 (rank 1): its launcher was killed by SIGKILL". */
  failure?: string;
}

function describeRanks(host: number, perHost: number): string {
  const first = host * perHost;
  return perHost === 1 ? `rank ${first}` : `ranks ${first}-${first + perHost - 1}`;
}

export async function runCluster(options: ClusterOptions): Promise<ClusterResult> {
  const missing = missingCapabilities();
  if (missing.length)
    throw new UsageError(
      `the cluster command needs root: creating network namespaces, veth pairs, a bridge and qdiscs takes CAP_NET_ADMIN and CAP_SYS_ADMIN, and this process lacks ${missing.join(' and ')} (run it as root, e.g. with sudo)`,
    );
  const out = options.out ?? process.stdout;
  const err = options.err ?? process.stderr;
  const grace = (options.graceSeconds ?? 15) * 1000;
  const { hosts, nprocPerHost } = options;

  let failure: string | undefined;
  // Watching signals before anything is built, so that Ctrl-C while the hosts are made still removes them.
  const hostLaunchers = new ProcessSet<{ host: number; child: ChildProcess; exited: boolean }>(grace, (signal) => (failure ??= `interrupted by ${signal}`));
  const launchers = hostLaunchers.members;
  const stopAll = () => hostLaunchers.stopAll();
  let stopTimer: NodeJS.Timeout | undefined;

  let network: ClusterNetwork | undefined;
  let sampler: CounterSampler | undefined;
  try {
    const swept = await sweepStale();
    if (swept.length) err.write(`accordion cluster: removed the namespaces of ${swept.length} earlier run(s) whose process is gone (${swept.join(', ')})\n`);
    network = await createNetwork({ hosts, subnet: options.subnet, shape: options.shape });
    const master = network.hosts[0]!.address;
    err.write(
      `accordion cluster: ${hosts} host${hosts > 1 ? 's' : ''} × ${nprocPerHost} worker${nprocPerHost > 1 ? 's' : ''} in namespaces ${network.id}-h0…h${hosts - 1}, ` +
        `${master}…${network.hosts[hosts - 1]!.address}/${network.prefixLength} on one bridge; each host sends at ${formatRate(options.shape.bitsPerSecond)}` +
        `, latency ${options.shape.delaySeconds > 0 ? `${+(options.shape.delaySeconds * 1e3).toPrecision(4)} ms` : 'none'}, loss ${+(options.shape.loss * 100).toPrecision(4)}%; run directory ${options.runDir}\n`,
    );
    if (hostLaunchers.interrupted) return { exitCode: signalExitCode(hostLaunchers.interrupted), failure };

    // While a host's launcher has not been reaped its pid is still its own, in the host's namespace.
    const launcherPid = (host: number) => launchers.find((l) => l.host === host && !l.exited)?.child.pid;
    sampler = new CounterSampler(options.runDir, network, options, launcherPid, err);
    sampler.start();
    const baseEnv = options.env ?? process.env;
    const threads = String(Math.max(1, Math.floor((os.availableParallelism?.() ?? os.cpus().length) / (hosts * nprocPerHost))));
    const env = { ...baseEnv, ACCORDION_JOB_TOKEN: randomBytes(16).toString('hex'), OMP_NUM_THREADS: baseEnv.OMP_NUM_THREADS ?? threads };
    const exits: Promise<void>[] = [];
    for (const host of network.hosts) {
      const launch = [
        ...['launch', '--nnodes', String(hosts), '--node-rank', String(host.index), '--nproc-per-node', String(nprocPerHost)],
        ...['--master-addr', master, '--master-port', String(options.masterPort ?? 29500), '--', ...options.trainArgs],
      ];
      const child = spawn('ip', ['netns', 'exec', host.namespace, process.execPath, options.cli, ...launch], { stdio: ['ignore', 'pipe', 'pipe'], env });
      const entry = hostLaunchers.add({ host: host.index, child, exited: false });
      // Host 0 shows rank 0's output as is (its launcher prefixes its other ranks); the others are prefixed.
      const prefix = host.index === 0 ? '' : `[host ${host.index}] `;
      relay(child.stdout!, out, prefix);
      relay(child.stderr!, err, prefix);
      const who = `host ${host.index} (${describeRanks(host.index, nprocPerHost)})`;
      exits.push(
        new Promise<void>((resolve) => {
          child.on('error', (e) => {
            entry.exited = true;
            failure ??= `${who} could not start: ${e.message}`;
            stopAll();
            resolve();
          });
          child.on('exit', (code, signal) => {
            entry.exited = true;
            if ((code !== 0 || signal) && !failure) {
              failure = `${who}: its launcher ${signal ? `was killed by ${signal}` : `exited with code ${code}`}`;
              const notice = options.timeoutMs + 10_000;
              if (launchers.some((l) => !l.exited))
                err.write(`accordion cluster: ${failure}; hosts still running ${Math.round(notice / 1000)} s from now (the job's timeout + 10 s) will be stopped\n`);
              stopTimer = setTimeout(stopAll, notice);
            }
            resolve();
          });
        }),
      );
    }
    await Promise.all(exits);
    if (failure) return { exitCode: hostLaunchers.interrupted ? signalExitCode(hostLaunchers.interrupted) : 1, failure };
    return { exitCode: 0 };
  } finally {
    clearTimeout(stopTimer);
    await sampler?.stop();
    if (network) {
      // A launcher killed by SIGKILL leaves its workers; nothing of the job outlives the cluster.
      for (const host of network.hosts) {
        const left = await killNamespace(host.namespace).catch(() => []);
        if (left.length) err.write(`accordion cluster: killed ${left.length} process(es) left in host ${host.index}\n`);
      }
      await removeNetwork(network.id);
    }
    hostLaunchers.close();
  }
}
