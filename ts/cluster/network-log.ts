/**
 * The hosts' interface counters per epoch and their changes of rate: network.jsonl, written while the
 * job runs by following rank 0's metrics.jsonl (CounterSampler), and read back (readNetworkLog).
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { MetricsLog, readMetrics, type MetricsEvent } from '../base/metrics.js';
import type { ClusterOptions } from './cluster-options.js';
import { DEFAULT_BURST_SECONDS, readCounters, readCountersOf, type ClusterNetwork, type Counters } from './netns.js';

/**
 * One line of network.jsonl. Byte and packet counts are of the host's interface, from the kernel
 * (start and epoch records); a rate record is a change of the host's egress rate (--bandwidth's
 * schedule), with `bitsPerSecond` and `atSeconds`.
 */
export interface NetworkRecord {
  event: 'start' | 'epoch' | 'rate';
  time?: string;
  /** epoch: the epoch (from 1) whose end this is. */
  epoch?: number;
  /** start: the epochs completed before it (0, or where a resumed job goes on from). */
  epochsCompleted?: number;
  host: number;
  address: string;
  /** Totals since the host's interface was made (the cluster's start). */
  txBytesTotal?: number;
  rxBytesTotal?: number;
  txPacketsTotal?: number;
  rxPacketsTotal?: number;
  /** start: the job's shape, from the cluster and rank 0's start (or resume) record. */
  hosts?: number;
  procsPerHost?: number;
  workers?: number;
  compressor?: string;
  /** The precision the exchange sent (--comm-dtype); absent in logs of runs before it existed (fp32). */
  commDtype?: string;
  /** start: the host's rate at the cluster's start; rate: its rate from now on. */
  bitsPerSecond?: number;
  /** rate: when the schedule set it, in seconds after the hosts started. */
  atSeconds?: number;
  delaySeconds?: number;
  burstSeconds?: number;
  loss?: number;
  /** epoch: counts since the previous record of this host, and rank 0's floats and bytes accounting. */
  txBytes?: number;
  rxBytes?: number;
  txPackets?: number;
  rxPackets?: number;
  floatsSent?: number;
  floatsSentTotal?: number;
  bytesSent?: number;
  /** epoch: the floats rank 0 broadcast (its running statistics, before each step and evaluation). */
  broadcastFloats?: number;
  /** epoch: the floats all-reduced since the previous record to measure the link (--auto-cost seconds: at the start, and probes). */
  linkFloats?: number;
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
export class CounterSampler {
  private readonly metricsPath: string;
  private offset = 0;
  private partial = '';
  private timer?: NodeJS.Timeout;
  private busy?: Promise<void>;
  private log?: MetricsLog;
  private readonly last = new Map<number, Counters>();
  private warned = false;
  /** The floats the link measurement all-reduced since the last epoch record. */
  private linkFloats = 0;
  /** Records to write once the run directory holds the log (rank 0 makes it). */
  private readonly waiting: NetworkRecord[] = [];

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
    this.flushWaiting(true);
    this.log?.close();
  }

  /** Logs a record of the cluster's own (a change of rate), at once if the log is open, else with its next records. */
  note(record: NetworkRecord): void {
    this.waiting.push({ time: new Date().toISOString(), ...record });
    if (this.log) this.flushWaiting();
  }

  /** Writes the waiting records; at the end (`last`) into a log of their own when the job never started. */
  private flushWaiting(last = false): void {
    if (last && !this.log && this.waiting.length && fs.existsSync(this.runDir)) this.log = new MetricsLog(path.join(this.runDir, 'network.jsonl'));
    if (!this.log) return;
    for (const r of this.waiting.splice(0)) this.log.write(r as unknown as MetricsEvent);
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
      if (event.event === 'link' || event.event === 'probe') this.linkFloats += Number(event.allReducedFloats ?? 0);
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
          bytesSent: event.bytesSent,
          broadcastFloats: event.broadcastFloats,
          ...(this.linkFloats ? { linkFloats: this.linkFloats } : {}),
        });
      } else {
        Object.assign(record, {
          hosts: this.options.hosts,
          procsPerHost: this.options.nprocPerHost,
          workers: event.workers,
          compressor: event.compressor,
          commDtype: event.commDtype,
          bitsPerSecond: this.options.hostRates?.[host.index] ?? this.options.shape.bitsPerSecond,
          delaySeconds: this.options.shape.delaySeconds,
          burstSeconds: this.options.shape.burstSeconds ?? DEFAULT_BURST_SECONDS,
          loss: this.options.shape.loss,
        });
      }
      this.last.set(host.index, now);
      this.log.write(record as unknown as MetricsEvent);
    }
    if (epochRecord) this.linkFloats = 0;
    if (!epochRecord) this.flushWaiting(); // changes made before the job's start record follow it
  }
}

/** The records of a run's network.jsonl, in order. */
export function readNetworkLog(runDir: string): NetworkRecord[] {
  return readMetrics(path.join(runDir, 'network.jsonl')) as unknown as NetworkRecord[];
}
