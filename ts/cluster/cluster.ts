/**
 * `accordion cluster`: a job over N simulated hosts on this machine. It builds the hosts (one network
 * namespace each on a shared bridge, egress shaped with tc: see netns.ts), runs `accordion launch`
 * in every host with host 0's bridge address as the master, relays the hosts' output, records each
 * host's interface counters per epoch in <run>/network.jsonl (network-log.ts), changes the hosts'
 * rates as --bandwidth's schedule says (logging each change there), stops every host when one fails,
 * and removes the namespaces on every way out (success, failure, SIGINT/SIGTERM; a SIGKILLed command
 * leaves them to the next run's sweep).
 *
 * The option parsers (cluster-options.ts), network.jsonl's reader (network-log.ts) and the wire
 * prediction (wire.ts) are re-exported from here.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import * as os from 'node:os';
import { UsageError, signalExitCode } from '../base/errors.js';
import { type ClusterOptions, type RateChange } from './cluster-options.js';
import { DEFAULT_MASTER_PORT } from '../comm/environment.js';
import { formatRate } from '../base/units.js';
import { ProcessSet, relay } from './launch.js';
import { DEFAULT_BURST_SECONDS, createNetwork, killNamespace, missingCapabilities, removeNetwork, setEgressRate, sweepStale, type ClusterNetwork } from './netns.js';
import { CounterSampler } from './network-log.js';

export { parseBandwidth, parseBandwidthSchedule, parseBurst, parseHostBandwidths, parseLatency, parseLoss, parseSubnet, type ClusterOptions, type RateChange } from './cluster-options.js';
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

/**
 * --bandwidth's later rates, each applied at its time after the hosts start to every host without a
 * rate of its own, and logged (network.jsonl and stderr) once tc holds it.
 */
class RateSchedule {
  private readonly timers: NodeJS.Timeout[] = [];
  private changing: Promise<void> = Promise.resolve();

  constructor(
    private readonly network: ClusterNetwork,
    private readonly options: ClusterOptions,
    private readonly sampler: CounterSampler,
    private readonly err: NodeJS.WritableStream,
  ) {}

  start(): void {
    const started = performance.now();
    for (const change of this.options.schedule ?? []) {
      if (change.atSeconds === 0) continue; // the rate the hosts were made with
      this.timers.push(setTimeout(() => (this.changing = this.changing.then(() => this.apply(change, started))), change.atSeconds * 1000));
    }
  }

  /** Cancels the changes still to come, and waits for one under way. */
  async stop(): Promise<void> {
    this.timers.forEach(clearTimeout);
    await this.changing;
  }

  private async apply(change: RateChange, started: number): Promise<void> {
    const hosts = this.network.hosts.filter((h) => this.options.hostRates?.[h.index] === undefined);
    try {
      for (const h of hosts) await setEgressRate(h, change.bitsPerSecond, this.options.shape);
    } catch (e) {
      this.err.write(`accordion cluster: the rate could not change to ${formatRate(change.bitsPerSecond)}: ${(e as Error).message}\n`);
      return;
    }
    for (const h of hosts) this.sampler.note({ event: 'rate', host: h.index, address: h.address, bitsPerSecond: change.bitsPerSecond, atSeconds: change.atSeconds });
    const which = hosts.length === this.network.hosts.length ? 'every host now sends' : hosts.length > 1 ? `hosts ${hosts.map((h) => h.index).join(', ')} now send` : `host ${hosts[0]!.index} now sends`;
    this.err.write(
      `accordion cluster: ${((performance.now() - started) / 1000).toFixed(1)} s: ${which} at ` +
        `${formatRate(change.bitsPerSecond)} (scheduled at ${change.atSeconds} s)\n`,
    );
  }
}

/** "each host sends at 1 Gbit/s, then 100 Mbit/s from 120 s", "host 1 sends at 100 Mbit/s; the others at 1 Gbit/s". */
function describeRates(options: ClusterOptions): string {
  const later = (options.schedule ?? []).filter((c) => c.atSeconds > 0).map((c) => `${formatRate(c.bitsPerSecond)} from ${c.atSeconds} s`);
  const shared = `${formatRate(options.shape.bitsPerSecond)}${later.length ? `, then ${later.join(', ')}` : ''}`;
  const own = (options.hostRates ?? []).flatMap((r, host) => (r === undefined ? [] : [`host ${host} sends at ${formatRate(r)}`]));
  return own.length ? `${own.join(', ')}; the others at ${shared}` : `each host sends at ${shared}`;
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
  let rates: RateSchedule | undefined;
  try {
    const swept = await sweepStale();
    if (swept.length) err.write(`accordion cluster: removed the namespaces of ${swept.length} earlier run(s) whose process is gone (${swept.join(', ')})\n`);
    const laterRates = (options.schedule ?? []).filter((c) => c.atSeconds > 0).map((c) => c.bitsPerSecond);
    network = await createNetwork({ hosts, subnet: options.subnet, shape: options.shape, hostRates: options.hostRates, laterRates });
    const master = network.hosts[0]!.address;
    err.write(
      `accordion cluster: ${hosts} host${hosts > 1 ? 's' : ''} × ${nprocPerHost} worker${nprocPerHost > 1 ? 's' : ''} in namespaces ${network.id}-h0…h${hosts - 1}, ` +
        `${master}…${network.hosts[hosts - 1]!.address}/${network.prefixLength} on one bridge; ${describeRates(options)}` +
        `, latency ${options.shape.delaySeconds > 0 ? `${+(options.shape.delaySeconds * 1e3).toPrecision(4)} ms` : 'none'}, burst ${+((options.shape.burstSeconds ?? DEFAULT_BURST_SECONDS) * 1e3).toPrecision(4)} ms, loss ${+(options.shape.loss * 100).toPrecision(4)}%; run directory ${options.runDir}\n`,
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
        ...['--master-addr', master, '--master-port', String(options.masterPort ?? DEFAULT_MASTER_PORT), '--', ...options.trainArgs],
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
    rates = new RateSchedule(network, options, sampler, err);
    rates.start();
    await Promise.all(exits);
    if (failure) return { exitCode: hostLaunchers.interrupted ? signalExitCode(hostLaunchers.interrupted) : 1, failure };
    return { exitCode: 0 };
  } finally {
    clearTimeout(stopTimer);
    await rates?.stop();
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
