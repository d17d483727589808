/**
 * The cluster command's options: parsing the link's values as written on the command line
 * (--bandwidth and its schedule, --host-bandwidth, --latency, --loss, --subnet), and the options
 * runCluster takes.
 */
import { UsageError } from '../base/errors.js';
import { formatAddress, type LinkShape, type Subnet } from './netns.js';

/** A rate in tc's units: bit, kbit, mbit, gbit, tbit (powers of 1000 bits per second). */
export function parseBandwidth(raw: string, option = '--bandwidth'): number {
  const m = /^(\d+(?:\.\d+)?)\s*(bit|kbit|mbit|gbit|tbit)(?:\/s)?$/i.exec(raw.trim());
  const hint = /bps$/i.test(raw) ? " (tc's 'bps' means bytes per second; write the rate in bits, e.g. 100mbit)" : '';
  if (!m) throw new UsageError(`option ${option}: expected a rate such as 100mbit or 1gbit (units bit, kbit, mbit, gbit, tbit), got '${raw}'${hint}`);
  const scale = { bit: 1, kbit: 1e3, mbit: 1e6, gbit: 1e9, tbit: 1e12 }[m[2]!.toLowerCase() as 'bit'];
  const bits = Number(m[1]) * scale;
  if (!(bits >= 1000)) throw new UsageError(`option ${option}: at least 1kbit, got '${raw}'`);
  return bits;
}

/** A time in us, ms, s or m as seconds, or undefined when `raw` is none. */
function parseSeconds(raw: string): number | undefined {
  const m = /^(\d+(?:\.\d+)?)\s*(us|ms|s|m)$/.exec(raw.trim());
  return m ? Number(m[1]) * { us: 1e-6, ms: 1e-3, s: 1, m: 60 }[m[2] as 'us'] : undefined;
}

/** A delay in us, ms or s; 0 for none. */
export function parseLatency(raw: string): number {
  const seconds = /m$/.test(raw.trim()) ? undefined : parseSeconds(raw);
  if (seconds === undefined) throw new UsageError(`option --latency: expected a delay such as 1ms, 500us or 0ms (units us, ms, s), got '${raw}'`);
  if (seconds > 10) throw new UsageError(`option --latency: at most 10s, got '${raw}'`);
  return seconds;
}

/** A token bucket as time at the host's rate, e.g. 2ms; more than 0, at most 10 s. */
export function parseBurst(raw: string): number {
  const seconds = /m$/.test(raw.trim()) ? undefined : parseSeconds(raw);
  if (seconds === undefined || !(seconds > 0)) throw new UsageError(`option --burst: expected a time above 0 such as 2ms or 50ms (units us, ms, s), got '${raw}'`);
  if (seconds > 10) throw new UsageError(`option --burst: at most 10s, got '${raw}'`);
  return seconds;
}

/** The hosts' rate from `atSeconds` after the hosts start. */
export interface RateChange {
  atSeconds: number;
  bitsPerSecond: number;
}

/**
 * --bandwidth: one rate for the whole job ("1gbit"), or rates from given times after the hosts
 * start ("0s:1gbit,120s:100mbit,300s:1gbit"), the first at 0, the times increasing.
 */
export function parseBandwidthSchedule(raw: string): RateChange[] {
  if (!raw.includes(':')) return [{ atSeconds: 0, bitsPerSecond: parseBandwidth(raw) }];
  const schedule = raw.split(',').map((part) => {
    const [time, rate, ...rest] = part.split(':');
    const atSeconds = parseSeconds(time ?? '');
    if (atSeconds === undefined || rate === undefined || rest.length)
      throw new UsageError(`option --bandwidth: expected a rate, or TIME:RATE pairs such as 0s:1gbit,120s:100mbit (times in ms, s or m), got '${part}'`);
    return { atSeconds, bitsPerSecond: parseBandwidth(rate) };
  });
  if (schedule[0]!.atSeconds !== 0) throw new UsageError(`option --bandwidth: a schedule starts at 0s (the rate the hosts start with), got '${raw}'`);
  schedule.forEach((c, i) => {
    if (i > 0 && !(c.atSeconds > schedule[i - 1]!.atSeconds)) throw new UsageError(`option --bandwidth: the schedule's times must increase, got '${raw}'`);
  });
  return schedule;
}

/**
 * --host-bandwidth: hosts whose own rate replaces --bandwidth's for the whole job, as HOST:RATE pairs
 * ("1:100mbit" makes host 1 a slow host). Per host, its rate or undefined.
 */
export function parseHostBandwidths(raw: string, hosts: number): (number | undefined)[] {
  const rates = new Array<number | undefined>(hosts).fill(undefined);
  if (raw.trim() === '') return rates;
  for (const part of raw.split(',')) {
    const m = /^(\d+):(.+)$/.exec(part.trim());
    if (!m) throw new UsageError(`option --host-bandwidth: expected HOST:RATE pairs such as 1:100mbit, got '${part}'`);
    const host = Number(m[1]);
    if (host >= hosts) throw new UsageError(`option --host-bandwidth: host ${host} is not one of the ${hosts} hosts (0 to ${hosts - 1})`);
    if (rates[host] !== undefined) throw new UsageError(`option --host-bandwidth: host ${host} is given twice`);
    rates[host] = parseBandwidth(m[2]!, '--host-bandwidth');
  }
  return rates;
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


export interface ClusterOptions {
  hosts: number;
  nprocPerHost: number;
  /** Every host's egress at the start (the schedule's first rate). */
  shape: LinkShape;
  /** Later rates of the hosts without one of their own, each from its time after the hosts start. */
  schedule?: RateChange[];
  /** Per host, a rate of its own for the whole job (undefined: the shape's, then the schedule's). */
  hostRates?: (number | undefined)[];
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
