/**
 * `accordion cluster`: a job over N simulated hosts on this machine. It builds the hosts (one network
 * namespace each on a shared bridge, egress shaped with tc: see netns.ts), runs `accordion launch`
 * in every host with host 0's bridge address as the master, relays the hosts' output, records each
 * host's interface counters per epoch in <run>/network.jsonl, stops every host when one fails, and
 * removes the namespaces on every way out (success, failure, SIGINT/SIGTERM; a SIGKILLed command
 * leaves them to the next run's sweep).
 *
 * It also predicts the bytes a host puts on the wire from the engine's floats accounting and Gloo's
 * algorithms (predictedWireBytes, compareWire), to check the accounting against the kernel's counters.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { UsageError, signalExitCode } from '../errors.js';
import { MetricsLog, readMetrics, type MetricsEvent } from '../metrics.js';
import { ProcessSet, relay } from './launch.js';
import {
  createNetwork,
  formatAddress,
  killNamespace,
  missingCapabilities,
  readCounters,
  readCountersOf,
  removeNetwork,
  sweepStale,
  type ClusterNetwork,
  type Counters,
  type LinkShape,
  type Subnet,
} from './netns.js';

// ---------------------------------------------------------------------------------------------
// Option values

/** A rate in tc's units: bit, kbit, mbit, gbit, tbit (powers of 1000 bits per second). */
export function parseBandwidth(raw: string): number {
  const m = /^(\d+(?:\.\d+)?)\s*(bit|kbit|mbit|gbit|tbit)(?:\/s)?$/i.exec(raw.trim());
  const hint = /bps$/i.test(raw) ? " (tc's 'bps' means bytes per second; write the rate in bits, e.g. 100mbit)" : '';
  if (!m) throw new UsageError(`option --bandwidth: expected a rate such as 100mbit or 1gbit (units bit, kbit, mbit, gbit, tbit), got '${raw}'${hint}`);
  const scale = { bit: 1, kbit: 1e3, mbit: 1e6, gbit: 1e9, tbit: 1e12 }[m[2]!.toLowerCase() as 'bit'];
  const bits = Number(m[1]) * scale;
  if (!(bits >= 1000)) throw new UsageError(`option --bandwidth: at least 1kbit, got '${raw}'`);
  return bits;
}

/** A delay in us, ms or s; 0 for none. */
export function parseLatency(raw: string): number {
  const m = /^(\d+(?:\.\d+)?)\s*(us|ms|s)$/.exec(raw.trim());
  if (!m) throw new UsageError(`option --latency: expected a delay such as 1ms, 500us or 0ms (units us, ms, s), got '${raw}'`);
  const seconds = Number(m[1]) * { us: 1e-6, ms: 1e-3, s: 1 }[m[2] as 'us'];
  if (seconds > 10) throw new UsageError(`option --latency: at most 10s, got '${raw}'`);
  return seconds;
}

/** A percentage of packets, e.g. 1% or 0.5%, below 100%; returned as a fraction. */
export function parseLoss(raw: string): number {
  const m = /^(\d+(?:\.\d+)?)\s*%$/.exec(raw.trim());
  if (!m) throw new UsageError(`option --loss: expected a percentage such as 1% or 0.5%, got '${raw}'`);
  const percent = Number(m[1]);
  if (percent >= 100) throw new UsageError(`option --loss: must be below 100% (a host that loses everything cannot join the job), got '${raw}'`);
  return percent / 100;
}

/** An IPv4 subnet in CIDR form with room for `hosts` addresses (network + 1 … network + hosts). */
export function parseSubnet(raw: string, hosts: number): Subnet {
  const m = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})\/(\d{1,2})$/.exec(raw.trim());
  const octets = m ? m.slice(1, 5).map(Number) : [];
  const prefixLength = m ? Number(m[5]) : NaN;
  if (!m || octets.some((o) => o > 255) || !(prefixLength >= 8 && prefixLength <= 30))
    throw new UsageError(`option --subnet: expected an IPv4 subnet such as 10.87.0.0/24 (prefix length 8 to 30), got '${raw}'`);
  const address = octets.reduce((a, o) => a * 256 + o, 0);
  const size = 2 ** (32 - prefixLength);
  const network = address - (address % size);
  if (network !== address) throw new UsageError(`option --subnet: ${raw} is not a network address (did you mean ${formatAddress(network)}/${prefixLength}?)`);
  if (hosts > size - 2) throw new UsageError(`option --subnet: ${raw} has room for ${size - 2} hosts, not ${hosts}`);
  return { network, prefixLength };
}

// ---------------------------------------------------------------------------------------------
// The command

export interface ClusterOptions {
  hosts: number;
  nprocPerHost: number;
  shape: LinkShape;
  subnet: Subnet;
  /** Training options; they name the run directory (--out) or a checkpoint (--resume). */
  trainArgs: string[];
  /** Where rank 0 writes metrics.jsonl, and network.jsonl goes. */
  runDir: string;
  /** The command-line program (lib/cli.js) that every host runs `launch` of. */
  cli: string;
  /** The store's port on host 0 (every cluster has its own addresses, so no port is taken). */
  masterPort?: number;
  /**
   * The job's --timeout. When a host fails, the others find out as on real machines (a closed
   * connection at once, a silent peer after the timeout) and end with their own errors; a host
   * still running this long plus 10 s later is stopped.
   */
  timeoutMs: number;
  /** Seconds between SIGTERM and SIGKILL for the hosts' launchers when the job is stopped. */
  graceSeconds?: number;
  env?: NodeJS.ProcessEnv;
  out?: NodeJS.WritableStream;
  err?: NodeJS.WritableStream;
}

export interface ClusterResult {
  exitCode: number;
  /** The first failure, e.g. "host 1 (rank 1): its launcher was killed by SIGKILL". */
  failure?: string;
}

function describeRanks(host: number, perHost: number): string {
  const first = host * perHost;
  return perHost === 1 ? `rank ${first}` : `ranks ${first}-${first + perHost - 1}`;
}

/** "100 Mbit/s", "1 Gbit/s": a rate in bits per second as people write it. */
export function formatRate(bits: number): string {
  for (const [unit, scale] of [['Gbit/s', 1e9], ['Mbit/s', 1e6], ['kbit/s', 1e3]] as const) if (bits >= scale) return `${+(bits / scale).toPrecision(4)} ${unit}`;
  return `${bits} bit/s`;
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

// ---------------------------------------------------------------------------------------------
// Counters per epoch

/** One line of network.jsonl. Byte and packet counts are of the host's interface, from the kernel. */
export interface NetworkRecord {
  event: 'start' | 'epoch';
  time?: string;
  /** epoch: the epoch (from 1) whose end this is. */
  epoch?: number;
  /** start: the epochs completed before it (0, or where a resumed job goes on from). */
  epochsCompleted?: number;
  host: number;
  address: string;
  /** Totals since the host's interface was made (the cluster's start). */
  txBytesTotal: number;
  rxBytesTotal: number;
  txPacketsTotal: number;
  rxPacketsTotal: number;
  /** start: the job's shape, from the cluster and rank 0's start (or resume) record. */
  hosts?: number;
  procsPerHost?: number;
  workers?: number;
  compressor?: string;
  bitsPerSecond?: number;
  delaySeconds?: number;
  loss?: number;
  /** epoch: counts since the previous record of this host, and rank 0's floats accounting. */
  txBytes?: number;
  rxBytes?: number;
  txPackets?: number;
  rxPackets?: number;
  floatsSent?: number;
  floatsSentTotal?: number;
  /** epoch: the floats rank 0 broadcast (its running statistics, before each step and evaluation). */
  broadcastFloats?: number;
}

/** How often rank 0's metrics.jsonl is looked at (a stat call). */
const POLL_MS = 5;

/**
 * Follows rank 0's metrics.jsonl and, at each start, resume and epoch record, reads every host's
 * counters and appends them to network.jsonl. A record is seen within POLL_MS and the counters are
 * read at once (within a few ms under load): that is safe, as the next exchange starts only after
 * the next step's compute (seconds for the real models; Gloo moves a buffer only once both ends
 * are in the collective). With a tiny model whose step computes in less time than that, a step's
 * bytes could be counted in the neighbouring epoch.
 */
class CounterSampler {
  private readonly metricsPath: string;
  private offset = 0;
  private partial = '';
  private timer?: NodeJS.Timeout;
  private busy?: Promise<void>;
  private log?: MetricsLog;
  private readonly last = new Map<number, Counters>();
  private warned = false;

  constructor(
    private readonly runDir: string,
    private readonly network: ClusterNetwork,
    private readonly options: ClusterOptions,
    private readonly launcherPid: (host: number) => number | undefined,
    private readonly err: NodeJS.WritableStream,
  ) {
    this.metricsPath = path.join(runDir, 'metrics.jsonl');
  }

  start(): void {
    // A resumed run appends to the log: only what this job writes counts.
    this.offset = fs.existsSync(this.metricsPath) ? fs.statSync(this.metricsPath).size : 0;
    this.timer = setInterval(() => {
      this.busy ??= this.poll().finally(() => (this.busy = undefined));
    }, POLL_MS);
  }

  async stop(): Promise<void> {
    clearInterval(this.timer);
    await this.busy;
    await this.poll();
    this.log?.close();
  }

  private async poll(): Promise<void> {
    let size: number;
    try {
      size = fs.statSync(this.metricsPath).size;
    } catch {
      return; // not written yet
    }
    if (size < this.offset) this.offset = 0; // a torn last line was cut off
    if (size === this.offset) return;
    const buffer = Buffer.alloc(size - this.offset);
    const fd = fs.openSync(this.metricsPath, 'r');
    try {
      fs.readSync(fd, buffer, 0, buffer.length, this.offset);
    } finally {
      fs.closeSync(fd);
    }
    this.offset = size;
    const lines = (this.partial + buffer.toString('utf8')).split('\n');
    this.partial = lines.pop()!;
    for (const line of lines) {
      if (!line.trim()) continue;
      let event: MetricsEvent;
      try {
        event = JSON.parse(line) as MetricsEvent;
      } catch {
        continue;
      }
      if (event.event === 'start' || event.event === 'resume' || event.event === 'epoch') await this.sample(event);
    }
  }

  private async sample(event: MetricsEvent): Promise<void> {
    let counters: Counters[];
    try {
      // Through a host's launcher when it runs (a file read: every host within a millisecond), else with ip.
      counters = await Promise.all(
        this.network.hosts.map((h) => {
          const pid = this.launcherPid(h.index);
          return (pid !== undefined ? readCountersOf(pid) : undefined) ?? readCounters(h.namespace);
        }),
      );
    } catch (e) {
      if (!this.warned) this.err.write(`accordion cluster: could not read the hosts' counters: ${(e as Error).message}\n`);
      this.warned = true;
      return;
    }
    this.log ??= new MetricsLog(path.join(this.runDir, 'network.jsonl'));
    const epochRecord = event.event === 'epoch';
    for (const host of this.network.hosts) {
      const now = counters[host.index]!;
      const record: NetworkRecord = {
        event: epochRecord ? 'epoch' : 'start',
        ...(epochRecord ? { epoch: Number(event.epoch) } : { epochsCompleted: Number(event.epochsCompleted) }),
        host: host.index,
        address: host.address,
        txBytesTotal: now.txBytes,
        rxBytesTotal: now.rxBytes,
        txPacketsTotal: now.txPackets,
        rxPacketsTotal: now.rxPackets,
      };
      if (epochRecord) {
        const before = this.last.get(host.index) ?? { txBytes: 0, rxBytes: 0, txPackets: 0, rxPackets: 0 };
        Object.assign(record, {
          txBytes: now.txBytes - before.txBytes,
          rxBytes: now.rxBytes - before.rxBytes,
          txPackets: now.txPackets - before.txPackets,
          rxPackets: now.rxPackets - before.rxPackets,
          floatsSent: event.floatsSent,
          floatsSentTotal: event.floatsSentTotal,
          broadcastFloats: event.broadcastFloats,
        });
      } else {
        Object.assign(record, {
          hosts: this.options.hosts,
          procsPerHost: this.options.nprocPerHost,
          workers: event.workers,
          compressor: event.compressor,
          bitsPerSecond: this.options.shape.bitsPerSecond,
          delaySeconds: this.options.shape.delaySeconds,
          loss: this.options.shape.loss,
        });
      }
      this.last.set(host.index, now);
      this.log.write(record as unknown as MetricsEvent);
    }
  }
}

/** The records of a run's network.jsonl, in order. */
export function readNetworkLog(runDir: string): NetworkRecord[] {
  return readMetrics(path.join(runDir, 'network.jsonl')) as unknown as NetworkRecord[];
}

// ---------------------------------------------------------------------------------------------
// What the wire should carry

/** Bytes of Ethernet (14), IPv4 (20) and TCP (32, with timestamps) headers in front of each packet's payload. */
export const PACKET_HEADER_BYTES = 66;

/** Floats one worker hands to the collectives: all-reduced buffers, and all-gather results. */
export interface Exchange {
  allReduceFloats: number;
  allGatherFloats: number;
}

/**
 * Payload bytes one host sends (and, by symmetry, receives) for an exchange, by Gloo's algorithms
 * over n = hosts × procsPerHost workers, ranks placed host by host:
 *  - all-reduce (gloo::allreduce, ring: reduce-scatter then all-gather of n chunks) sends
 *    2(n−1)/n of the buffer to the ring's next rank. For n = 2 each rank sends the half it does not
 *    own, receives the reduced other half back, and sends its reduced half: 2 × ½ = the whole buffer.
 *  - all-gather (gloo::allgather, ring) forwards n−1 of the n contributions: (n−1)/n of the result.
 * Only one edge of each ring leaves a host, so a host sends what one rank does; nothing with one host.
 */
export function predictedWireBytes(exchange: Exchange, hosts: number, procsPerHost: number): number {
  if (hosts < 2) return 0;
  const n = hosts * procsPerHost;
  return 4 * ((exchange.allReduceFloats * 2 * (n - 1)) / n + (exchange.allGatherFloats * (n - 1)) / n);
}

/**
 * Payload bytes each host sends and receives when rank 0 broadcasts `floats` floats, by Gloo's
 * binomial tree (gloo::broadcast): rank r > 0 receives the buffer once, from r with its highest bit
 * cleared, so the bytes leave a host only where that parent sits on another host (ranks placed host
 * by host). Indexed by host.
 */
export function broadcastWireBytes(floats: number, hosts: number, procsPerHost: number): { sent: number[]; received: number[] } {
  const sent = new Array<number>(hosts).fill(0);
  const received = new Array<number>(hosts).fill(0);
  const hostOf = (rank: number) => Math.floor(rank / procsPerHost);
  for (let rank = 1; rank < hosts * procsPerHost; rank++) {
    const parent = rank ^ (1 << Math.floor(Math.log2(rank)));
    if (hostOf(parent) === hostOf(rank)) continue;
    sent[hostOf(parent)]! += 4 * floats;
    received[hostOf(rank)]! += 4 * floats;
  }
  return { sent, received };
}

/**
 * The exchange of `floatsSent` floats of TopK steps: each step all-reduces the 1-D tensors and the
 * matrices at level 0 (dense), and all-gathers, of every other matrix i, 2·max(1, ⌊ratios[i]·numel⌋)
 * floats (indices and values) from each of the `workers`. Floats that are not whole steps are an
 * error in the accounting.
 */
export function topkExchange(parameters: { numel: number; matrix: boolean }[], ratios: number[], workers: number, floatsSent: number): Exchange {
  let dense = 0, gathered = 0;
  parameters.forEach((p, i) => {
    if (p.matrix && ratios[i]! > 0) gathered += 2 * Math.max(1, Math.floor(ratios[i]! * p.numel)) * workers;
    else dense += p.numel;
  });
  const steps = floatsSent / (dense + gathered);
  if (!Number.isInteger(steps)) throw new Error(`${floatsSent} floats are not whole TopK steps of ${dense} all-reduced + ${gathered} all-gathered floats`);
  return { allReduceFloats: steps * dense, allGatherFloats: steps * gathered };
}

export interface WireComparison {
  epoch: number;
  host: number;
  /** The exchange's bytes (the same sent and received) plus rank 0's broadcasts, as this host sends and receives them. */
  predictedSentBytes: number;
  predictedReceivedBytes: number;
  /** The interface's bytes less PACKET_HEADER_BYTES per packet. */
  sentPayloadBytes: number;
  receivedPayloadBytes: number;
  sentRatio: number;
  receivedRatio: number;
  /** Both ratios within 1 ± tolerance. */
  ok: boolean;
}

/**
 * Compares each epoch record of network.jsonl with the prediction from rank 0's floats: the
 * gradient exchange and rank 0's broadcasts of its running statistics. With compressor none or
 * powersgd every float sent is all-reduced; topk all-reduces the 1-D tensors and all-gathers the
 * rest, so `exchange` must split its floats. The small collectives (the finite agreement, the
 * replica digests) are not predicted.
 */
export function compareWire(records: NetworkRecord[], options: { exchange?: (r: NetworkRecord) => Exchange; tolerance?: number } = {}): WireComparison[] {
  const tolerance = options.tolerance ?? 0.1;
  let start: NetworkRecord | undefined;
  const rows: WireComparison[] = [];
  for (const r of records) {
    if (r.event === 'start') {
      start = r;
      continue;
    }
    if (!start) throw new UsageError('network.jsonl: an epoch record comes before any start record');
    let exchange: Exchange;
    if (options.exchange) exchange = options.exchange(r);
    else if (start.compressor === 'none' || start.compressor === 'powersgd') exchange = { allReduceFloats: r.floatsSent ?? 0, allGatherFloats: 0 };
    else throw new UsageError(`compareWire: the ${start.compressor} exchange mixes all-reduce and all-gather; give options.exchange`);
    const hosts = start.hosts ?? 1, procsPerHost = start.procsPerHost ?? 1;
    const exchanged = predictedWireBytes(exchange, hosts, procsPerHost);
    const broadcast = broadcastWireBytes(r.broadcastFloats ?? 0, hosts, procsPerHost);
    const predictedSentBytes = exchanged + broadcast.sent[r.host]!;
    const predictedReceivedBytes = exchanged + broadcast.received[r.host]!;
    const sentPayloadBytes = r.txBytes! - PACKET_HEADER_BYTES * r.txPackets!;
    const receivedPayloadBytes = r.rxBytes! - PACKET_HEADER_BYTES * r.rxPackets!;
    const sentRatio = sentPayloadBytes / predictedSentBytes;
    const receivedRatio = receivedPayloadBytes / predictedReceivedBytes;
    rows.push({
      epoch: r.epoch!,
      host: r.host,
      predictedSentBytes,
      predictedReceivedBytes,
      sentPayloadBytes,
      receivedPayloadBytes,
      sentRatio,
      receivedRatio,
      ok: Math.abs(sentRatio - 1) <= tolerance && Math.abs(receivedRatio - 1) <= tolerance,
    });
  }
  return rows;
}
