/**
 * The link as training sees it, estimated from the exchange's own collectives (no traffic of its
 * own): each collective reports the bytes this rank sent by its algorithm (2(W − 1)/W of an
 * all-reduce's buffer, W − 1 contributions of an all-gather) and its seconds, which include any
 * waiting for a peer that reached the collective later. For a ring this is the ring's slowest hop as
 * this rank meets it; with two workers, the link between them.
 *
 * A link lets a burst through at once: a token bucket, a switch's or a NIC's buffer, refilled while
 * the step computes. Within a step, the bytes sent before a collective decide how much of it the
 * burst still covers, so a collective takes
 *
 *   latency + waiting + (bytes of it beyond the step's first `burst` bytes) / bandwidth.
 *
 * Waiting only ever adds, so:
 *  - the latency is the lower quartile of the smallest collectives' seconds (the workers'
 *    agreement on finite gradients, one per step, carries W floats);
 *  - the burst and the bandwidth are fitted together. Timed are the collectives that sent at least
 *    RATE_COLLECTIVE_BYTES and took at least a latency beyond it. Without a burst, the seconds per
 *    byte is the timed collectives' bytes-weighted lower quintile (those that did not wait are the
 *    fastest, and the large transfers, timed best, weigh most). With one, each timed collective's
 *    seconds per byte is tried in turn, as if it lay wholly beyond the burst, which then follows
 *    from the steps' totals (burstAt). The fit kept is the one whose predictions miss the seconds
 *    least by the quintile's measure (the pinball loss, which charges a collective that took longer
 *    than predicted, as waiting does, a quarter of one that took less);
 *  - each collective's waiting is what its seconds exceed the prediction by.
 * With little traffic beyond the burst (a highly compressed exchange on a fast link) the bandwidth
 * is unknown, and with one timed collective a step the burst cannot be told from the rate: a
 * policy that follows the link then has it probed (ProbeSchedule).
 */

import { formatBytes, formatRate } from '../base/units.js';
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

/** The link over a set of steps' collectives (an epoch's, or the last steps'): bytesPerSecond undefined without a transfer to time. */
export interface LinkEstimate extends Omit<Link, 'bytesPerSecond'> {
  bytesPerSecond?: number;
  /** The bytes a step sends before the bandwidth holds (0 when none shows). */
  burstBytes: number;
  /** The collectives' seconds spent waiting for a late peer, and the rest (latency and transfer). */
  waitSeconds: number;
  transferSeconds: number;
  /** The collectives the estimate rests on. */
  collectives: number;
}

/** A collective of at most this many bytes sent times the latency (the agreement sends 4·W·(W − 1)/W·2). */
export const SMALL_COLLECTIVE_BYTES = 1024;
/** A collective of at least this many bytes sent beyond the burst times the rate. */
export const RATE_COLLECTIVE_BYTES = 64 * 1024;
/** The quantile of seconds per byte the bandwidth is read from (waiting only makes a collective slower). */
const FAST_QUANTILE = 0.2;
/** How much less a fit with a burst must miss by than one without. */
const BURST_GAIN = 0.05;
/** At most this many fits with a burst are tried (evenly spread over the candidates when there are more). */
const MAX_FITS = 128;

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

/** A collective with the bytes its step had sent before it. */
interface Placed {
  step: number;
  before: number;
  bytes: number;
  /** Its seconds beyond the latency (at least 0). */
  seconds: number;
}

/** The bytes of a collective beyond its step's first `burst` bytes. */
function beyond(c: Placed, burst: number): number {
  return Math.max(0, c.before + c.bytes - burst) - Math.max(0, c.before - burst);
}

/** The pinball loss of predicting each collective's seconds as `secondsPerByte` × its bytes beyond `burst`. */
function missed(placed: Placed[], burst: number, secondsPerByte: number): number {
  let loss = 0;
  for (const c of placed) {
    const miss = c.seconds - secondsPerByte * beyond(c, burst);
    loss += miss >= 0 ? FAST_QUANTILE * miss : (FAST_QUANTILE - 1) * miss;
  }
  return loss;
}

/** Whether a collective times the rate: enough bytes, and a transfer that took at least a latency. */
function timed(c: Placed, bytes: number, latencySeconds: number): boolean {
  return bytes >= RATE_COLLECTIVE_BYTES && c.seconds >= Math.max(latencySeconds, 1e-6);
}

/**
 * The burst that `secondsPerByte` leaves: a step that sent S bytes in T seconds beyond the latencies
 * had S − T / secondsPerByte of them let through at once. Waiting only lowers it, so the upper
 * quartile (at least 0) of the steps with a collective of RATE_COLLECTIVE_BYTES (a step of small ones
 * may have fitted in the burst, and says nothing of its size).
 */
function burstAt(placed: Placed[], steps: number, secondsPerByte: number): number {
  const sent = new Array<number>(steps).fill(0), took = new Array<number>(steps).fill(0), large = new Array<boolean>(steps).fill(false);
  for (const c of placed) {
    sent[c.step] += c.bytes;
    took[c.step] += c.seconds;
    if (c.bytes >= RATE_COLLECTIVE_BYTES) large[c.step] = true;
  }
  const free = sent.flatMap((s, i) => (large[i] ? [s - took[i]! / secondsPerByte] : []));
  return free.length ? Math.max(0, weightedQuantile(free, free.map(() => 1), 0.75)) : 0;
}

/** The link over `steps` (each step's collectives in the order they ran), or undefined when there is no collective. */
export function estimateLink(steps: readonly (readonly CollectiveSample[])[]): LinkEstimate | undefined {
  const all = steps.flat();
  if (all.length === 0) return undefined;
  const small = all.filter((s) => s.bytes <= SMALL_COLLECTIVE_BYTES);
  const latencySeconds = small.length ? weightedQuantile(small.map((s) => s.seconds), small.map(() => 1), 0.25) : 0;
  const placed: Placed[] = steps.flatMap((samples, step) => {
    let before = 0;
    return samples.map((s) => {
      const c = { step, before, bytes: s.bytes, seconds: Math.max(0, s.seconds - latencySeconds) };
      before += s.bytes;
      return c;
    });
  });
  // No burst: the rate of the collectives' bytes.
  const whole = placed.filter((c) => timed(c, c.bytes, latencySeconds));
  const fits: { burst: number; secondsPerByte: number }[] = [];
  if (whole.length) fits.push({ burst: 0, secondsPerByte: weightedQuantile(whole.map((c) => c.seconds / c.bytes), whole.map((c) => c.bytes), FAST_QUANTILE) });
  // A burst: each timed collective's seconds per byte in turn, as if it lay wholly beyond the burst.
  let rates = [...new Set(whole.map((c) => c.seconds / c.bytes))].sort((x, y) => x - y);
  if (rates.length > MAX_FITS) rates = Array.from({ length: MAX_FITS }, (_, i) => rates[Math.round((i * (rates.length - 1)) / (MAX_FITS - 1))]!);
  for (const secondsPerByte of rates) {
    const burst = burstAt(placed, steps.length, secondsPerByte);
    // A burst below the bytes that time a rate is not told from the latencies.
    if (burst >= RATE_COLLECTIVE_BYTES && placed.some((c) => timed(c, beyond(c, burst), latencySeconds))) fits.push({ burst, secondsPerByte });
  }
  let best: { burst: number; secondsPerByte: number; loss: number } | undefined;
  for (const fit of fits) {
    const loss = missed(placed, fit.burst, fit.secondsPerByte);
    // A burst must explain the seconds clearly better than none (by BURST_GAIN).
    if (!best || loss < best.loss * (best.burst === 0 && fit.burst > 0 ? 1 - BURST_GAIN : 1)) best = { ...fit, loss };
  }
  const burstBytes = best?.burst ?? 0, secondsPerByte = best?.secondsPerByte ?? 0;
  let waitSeconds = 0;
  for (const c of placed) waitSeconds += Math.max(0, c.seconds - secondsPerByte * beyond(c, burstBytes));
  return {
    ...(best ? { bytesPerSecond: 1 / Math.max(secondsPerByte, 1e-15) } : {}),
    latencySeconds,
    burstBytes,
    waitSeconds,
    transferSeconds: all.reduce((a, s) => a + s.seconds, 0) - waitSeconds,
    collectives: all.length,
  };
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
    return estimateLink(this.window);
  }
}

/** "94.17 Mbit/s, 0.31 ms" or "94.17 Mbit/s after 250 kB, 0.31 ms": a link estimate as the progress line shows it. */
export function describeLink(link: LinkEstimate): string {
  const rate = link.bytesPerSecond === undefined ? 'rate unknown' : formatRate(8 * link.bytesPerSecond);
  const burst = link.burstBytes > 0 ? ` after ${formatBytes(link.burstBytes)}` : '';
  return `${rate}${burst}, ${(1000 * link.latencySeconds).toFixed(2)} ms`;
}

function median(values: number[]): number {
  const s = [...values].sort((a, b) => a - b);
  return s.length % 2 ? s[s.length >> 1]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
}

/** The first probe comes after this many steps, and each next one at least this many steps later (the monitor's window). */
export const PROBE_STEPS = 10;
/** The floats of each of a probe's two all-reduces (1 MiB: more than a switch's or a token bucket's burst). */
export const PROBE_FLOATS = 1 << 18;
/** The share of the training time the probes may take: a probe's successor waits until the steps since have taken its seconds over this share. */
export const PROBE_SHARE = 0.05;

/**
 * Whether a step's collectives leave the link unmeasured: fewer than two of them send
 * RATE_COLLECTIVE_BYTES, so that no rate is timed, or none beyond a burst. The collectives' sizes
 * are the same on every worker, so every worker decides alike.
 */
export function needsProbe(step: readonly CollectiveSample[]): boolean {
  return step.filter((c) => c.bytes >= RATE_COLLECTIVE_BYTES).length < 2;
}

/** A timed all-reduce of `buffer` on every rank: the bytes this rank sent (2(W − 1)/W of the buffer) and its seconds. */
async function timedAllReduce(group: ProcessGroup, buffer: Float32Array): Promise<CollectiveSample> {
  const start = performance.now();
  await group.allReduce(buffer);
  const w = group.worldSize;
  return { bytes: (4 * buffer.length * 2 * (w - 1)) / w, seconds: (performance.now() - start) / 1000 };
}

/** A probe as the trainer records it: the two all-reduces' samples, the floats they carried and their seconds. */
export interface Probe {
  samples: CollectiveSample[];
  allReducedFloats: number;
  seconds: number;
  /** The mean seconds of this worker's steps since the probe before (or the run's start); rank 0's price the next interval. */
  stepSeconds: number;
  /** The run step of the next probe, as every worker has it. */
  nextStep: number;
}

/**
 * When the link is probed, and the probe (probe()): two all-reduces of PROBE_FLOATS floats after a
 * step's exchange, timed, to be counted with the step's collectives. The first drains what the
 * burst still holds, the second then runs at the rate, and at two places of the step the burst can
 * be told from the rate.
 *
 * The probes cost about PROBE_SHARE of the training time: rank 0 prices each probe's successor on
 * the seconds of the probe before it (the link's, as last seen) against the seconds its steps have
 * taken since, at least PROBE_STEPS steps apart. Every worker must probe at the same step, and the
 * seconds are rank 0's own, so rank 0's interval travels in the probe's first buffer (the others
 * add zeros): the probes need no collective of their own. A step is probed once it is due and the
 * exchange alone cannot time the link (needsProbe: the same on every worker).
 */
export class ProbeSchedule {
  private nextStep: number;
  /** Rank 0's figures since the last probe: its step seconds, and the seconds of that probe (0 before the first). */
  private stepSeconds = 0;
  private steps = 0;
  private lastSeconds = 0;

  /** A schedule from `runStep` on (the run's start, or the step a resumed run starts from). */
  constructor(runStep: number) {
    this.nextStep = runStep + PROBE_STEPS;
  }

  /** Counts a step's seconds (its compute and exchange, without a probe). */
  addStep(seconds: number): void {
    this.stepSeconds += seconds;
    this.steps++;
  }

  /** Whether the step just run is probed. */
  due(runStep: number, step: readonly CollectiveSample[]): boolean {
    return runStep >= this.nextStep && needsProbe(step);
  }

  /** Rank 0's steps from this probe to the next: its predecessor's seconds over PROBE_SHARE of a step's. */
  interval(): number {
    if (this.lastSeconds === 0 || this.steps === 0) return PROBE_STEPS;
    return Math.max(PROBE_STEPS, Math.ceil(this.lastSeconds / (PROBE_SHARE * Math.max(this.meanStepSeconds(), 1e-9))));
  }

  private meanStepSeconds(): number {
    return this.steps === 0 ? 0 : this.stepSeconds / this.steps;
  }

  /** Probes the link after `runStep` on every rank alike. */
  async probe(group: ProcessGroup, runStep: number): Promise<Probe> {
    const buffer = new Float32Array(PROBE_FLOATS);
    if (group.rank === 0) buffer[0] = this.interval();
    const first = await timedAllReduce(group, buffer);
    const interval = buffer[0]!;
    const second = await timedAllReduce(group, buffer);
    const seconds = first.seconds + second.seconds;
    const stepSeconds = this.meanStepSeconds();
    this.nextStep = runStep + interval;
    this.lastSeconds = seconds;
    this.stepSeconds = 0;
    this.steps = 0;
    return { samples: [first, second], allReducedFloats: 2 * PROBE_FLOATS, seconds, stepSeconds, nextStep: this.nextStep };
  }
}

/**
 * The link as the exchange sees it, with timed all-reduces on every rank: the latency is the median
 * time of a 1-float all-reduce, the bandwidth what a host sends in an all-reduce of `floats`
 * floats (2(W−1)/W of the buffer) over the median time beyond that latency. `allReducedFloats`: the
 * floats all-reduced to measure it (a warm-up and `rounds` rounds of both), traffic of its own.
 */
export async function measureLink(group: ProcessGroup, floats = 1 << 20, rounds = 5): Promise<Link & { allReducedFloats: number }> {
  const big = new Float32Array(floats), small = new Float32Array(1);
  await timedAllReduce(group, big); // connections and buffers warm
  const bigs: CollectiveSample[] = [], smallTimes: number[] = [];
  for (let r = 0; r < rounds; r++) {
    smallTimes.push((await timedAllReduce(group, small)).seconds);
    bigs.push(await timedAllReduce(group, big));
  }
  const latencySeconds = median(smallTimes);
  const seconds = median(bigs.map((b) => b.seconds));
  return { bytesPerSecond: bigs[0]!.bytes / Math.max(seconds - latencySeconds, 1e-9), latencySeconds, allReducedFloats: (rounds + 1) * floats + rounds };
}
