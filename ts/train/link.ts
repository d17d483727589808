/**
 * The link as training sees it, estimated from the exchange's own collectives (no traffic of its
 * own): each collective reports the bytes this rank sent by its algorithm (2(W − 1)/W of an
 * all-reduce's buffer, W − 1 contributions of an all-gather) and its seconds, which include any
 * waiting for a peer that reached the collective later. For a ring this is the ring's slowest hop as
 * this rank meets it; with two workers, the link between them.
 *
 * A collective takes latency + waiting + bytes / bandwidth. Waiting only ever adds, so:
 *  - the latency is the lower quartile of the smallest collectives' seconds (the workers'
 *    agreement on finite gradients, one per step, carries W floats);
 *  - the bandwidth is the bytes-weighted 80th percentile of the rates bytes / (seconds − latency) of
 *    the collectives that sent at least RATE_COLLECTIVE_BYTES and whose transfer took at least a
 *    latency: smaller ones say little about the rate (they fit in the buffers and token buckets a
 *    link lets through at once, and their time is mostly latency); those that did not wait are the
 *    fastest, and the weighting lets the large transfers, timed best, decide;
 *  - each collective's waiting is what its seconds exceed latency + bytes / bandwidth by.
 * With little traffic (a highly compressed exchange on a fast link) every transfer is short beside
 * the latency and the bandwidth is unknown.
 */

import { formatRate } from '../base/units.js';
import type { ProcessGroup } from '../comm/group.js';

/** One collective of an exchange: the bytes this rank sent and the seconds it took. */
export interface CollectiveSample {
  bytes: number;
  seconds: number;
}

/** A link: bytes a second once under way, and the seconds of a message that carries nothing. */
export interface Link {
  bytesPerSecond: number;
  latencySeconds: number;
}

/** The link over a set of collectives (an epoch's, or the last steps'): bytesPerSecond undefined without a transfer to time. */
export interface LinkEstimate extends Omit<Link, 'bytesPerSecond'> {
  bytesPerSecond?: number;
  /** The collectives' seconds spent waiting for a late peer, and the rest (latency and transfer). */
  waitSeconds: number;
  transferSeconds: number;
  /** The collectives the estimate rests on. */
  collectives: number;
}

/** A collective of at most this many bytes sent times the latency (the agreement sends 4·W·(W − 1)/W·2). */
export const SMALL_COLLECTIVE_BYTES = 1024;
/** A collective of at least this many bytes sent times the rate. */
export const RATE_COLLECTIVE_BYTES = 64 * 1024;

/** The samples of a step result's `collectives` (pairs of bytes sent and seconds). */
export function collectiveSamples(pairs: Float64Array): CollectiveSample[] {
  const out: CollectiveSample[] = [];
  for (let i = 0; i + 1 < pairs.length; i += 2) out.push({ bytes: pairs[i]!, seconds: pairs[i + 1]! });
  return out;
}

/** The value below which a fraction `q` of the weight lies (values ascending with their weights). */
function weightedQuantile(values: number[], weights: number[], q: number): number {
  const order = values.map((_, i) => i).sort((a, b) => values[a]! - values[b]!);
  const total = weights.reduce((a, b) => a + b, 0);
  let below = 0;
  for (const i of order) {
    below += weights[i]!;
    if (below >= q * total) return values[i]!;
  }
  return values[order[order.length - 1]!]!;
}

/** The link over `samples`, or undefined when there is none. */
export function estimateLink(samples: readonly CollectiveSample[]): LinkEstimate | undefined {
  if (samples.length === 0) return undefined;
  const small = samples.filter((s) => s.bytes <= SMALL_COLLECTIVE_BYTES);
  const latencySeconds = small.length ? weightedQuantile(small.map((s) => s.seconds), small.map(() => 1), 0.25) : 0;
  const large = samples.filter((s) => s.bytes >= RATE_COLLECTIVE_BYTES && s.seconds - latencySeconds >= Math.max(latencySeconds, 1e-6));
  const rates = large.map((s) => s.bytes / Math.max(s.seconds - latencySeconds, 1e-9));
  const bytesPerSecond = large.length ? weightedQuantile(rates, large.map((s) => s.bytes), 0.8) : undefined;
  let waitSeconds = 0, totalSeconds = 0;
  for (const s of samples) {
    totalSeconds += s.seconds;
    const expected = latencySeconds + (bytesPerSecond ? s.bytes / bytesPerSecond : 0);
    waitSeconds += Math.max(0, s.seconds - expected);
  }
  return { ...(bytesPerSecond ? { bytesPerSecond } : {}), latencySeconds, waitSeconds, transferSeconds: totalSeconds - waitSeconds, collectives: samples.length };
}

/**
 * The running estimate of the training loop: the collectives of the last `steps` steps, estimated
 * again after each step (a window, so that a change of the link shows within `steps` steps).
 */
export class LinkMonitor {
  private readonly window: CollectiveSample[][] = [];

  constructor(private readonly steps = 10) {}

  /** Adds a step's collectives; returns the estimate over the window. */
  addStep(samples: CollectiveSample[]): LinkEstimate | undefined {
    this.window.push(samples);
    if (this.window.length > this.steps) this.window.shift();
    return estimateLink(this.window.flat());
  }
}

/** "94.17 Mbit/s, 0.31 ms": a link estimate as the progress line shows it. */
export function describeLink(link: LinkEstimate): string {
  const rate = link.bytesPerSecond === undefined ? 'rate unknown' : formatRate(8 * link.bytesPerSecond);
  return `${rate}, ${(1000 * link.latencySeconds).toFixed(2)} ms`;
}

function median(values: number[]): number {
  const s = [...values].sort((a, b) => a - b);
  return s.length % 2 ? s[s.length >> 1]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
}

/**
 * The link as the exchange sees it, with timed all-reduces on every rank: the latency is the median
 * time of a 1-float all-reduce, the bandwidth what a host sends in an all-reduce of `floats`
 * floats (2(W−1)/W of the buffer) over the median time beyond that latency. `allReducedFloats`: the
 * floats all-reduced to measure it (a warm-up and `rounds` rounds of both), traffic of its own.
 */
export async function measureLink(group: ProcessGroup, floats = 1 << 20, rounds = 5): Promise<Link & { allReducedFloats: number }> {
  const big = new Float32Array(floats), small = new Float32Array(1);
  const time = async (buffer: Float32Array) => {
    const start = performance.now();
    await group.allReduce(buffer);
    return (performance.now() - start) / 1000;
  };
  await time(big); // connections and buffers warm
  const bigTimes: number[] = [], smallTimes: number[] = [];
  for (let r = 0; r < rounds; r++) {
    smallTimes.push(await time(small));
    bigTimes.push(await time(big));
  }
  const latencySeconds = median(smallTimes);
  const w = group.worldSize;
  const bytes = (4 * floats * 2 * (w - 1)) / w;
  return { bytesPerSecond: bytes / Math.max(median(bigTimes) - latencySeconds, 1e-9), latencySeconds, allReducedFloats: (rounds + 1) * floats + rounds };
}
