/**
 * Seconds per training step predicted for a cluster (`accordion plan`): α-β models of the collectives
 * the exchange runs over W workers, applied to a model's parameter shapes at a compression level, with
 * the compute and compression times measured (or given).
 *
 * A message of b bytes costs α + b/β (α the latency, β the bandwidth of one worker's link):
 *  - all-reduce of B bytes: two workers swap their buffers, α + B/β (the engine's pair exchange);
 *    a ring (Gloo; NCCL's ring) 2(W − 1)·α + 2(W − 1)/W · B/β; a pipelined binary tree (NCCL's
 *    trees) 2⌈log₂ W⌉·α + 2·B/β;
 *  - all-gather of b bytes per worker (TopK; a ring whatever the all-reduce's algorithm):
 *    (W − 1)·(α + b/β);
 *  - broadcast of B bytes (rank 0's batch-norm statistics before each step; a binomial tree):
 *    ⌈log₂ W⌉·(α + B/β).
 * The exchange runs per bucket (the engine's buckets: reverse order, the first of 1 MiB): its dense
 * tensors in one all-reduce, PowerSGD's P and Q in one each, TopK's pairs in one all-gather; then the
 * workers' agreement on finite gradients, an all-reduce of W floats. A step takes
 *  - the exchange after backward: broadcast + compute + compression + communication;
 *  - overlapped with backward: broadcast + max(compute + compression, forward + compression +
 *    communication): the exchange starts once forward has ended and, with one core for both,
 *    compression takes the core from backward (the bound the overlap benchmark measures against).
 * Assumed: every link alike and full duplex, no contention beyond the algorithm's, collectives back
 * to back, compute the same on every worker (no waiting for a straggler).
 */
import type { CompressionSpec } from '../config/compression.js';

export type Algorithm = 'ring' | 'tree';

/** A worker's link: bytes a second once under way, and the seconds of a message that carries nothing. */
export interface LinkModel {
  bytesPerSecond: number;
  latencySeconds: number;
}

function rounds(workers: number): number {
  return Math.ceil(Math.log2(workers));
}

/** Seconds of an all-reduce of `bytes` per worker among `workers`. */
export function allReduceSeconds(bytes: number, workers: number, link: LinkModel, algorithm: Algorithm): number {
  if (workers < 2 || bytes <= 0) return 0;
  const { latencySeconds: a, bytesPerSecond: b } = link;
  if (workers === 2) return a + bytes / b;
  if (algorithm === 'tree') return 2 * rounds(workers) * a + (2 * bytes) / b;
  return 2 * (workers - 1) * a + ((2 * (workers - 1)) / workers) * (bytes / b);
}

/** Seconds of an all-gather of `bytes` from each of `workers` (a ring). */
export function allGatherSeconds(bytes: number, workers: number, link: LinkModel): number {
  if (workers < 2 || bytes <= 0) return 0;
  return (workers - 1) * (link.latencySeconds + bytes / link.bytesPerSecond);
}

/** Seconds of a broadcast of `bytes` from one worker to `workers` (a binomial tree). */
export function broadcastSeconds(bytes: number, workers: number, link: LinkModel): number {
  if (workers < 2 || bytes <= 0) return 0;
  return rounds(workers) * (link.latencySeconds + bytes / link.bytesPerSecond);
}

/** What one bucket of the exchange sends per worker, in bytes, by collective. */
export interface BucketTraffic {
  dense: number;
  powerSgdP: number;
  powerSgdQ: number;
  topkPairs: number;
}

/** The exchange of a model at a level, as the engine buckets it. */
export interface ExchangeShape {
  /** Parameter shapes, state_dict order. */
  shapes: number[][];
  spec: CompressionSpec;
  /** Every matrix's level (0: dense). */
  level: number;
  /** Bytes of a value sent: 4 (fp32) or 2 (bf16, fp16); TopK's indices take 4. */
  valueBytes: number;
  /** Buckets of at most this many bytes of gradients; 0: everything after backward, one bucket. */
  bucketBytes: number;
}

/** The first bucket's size when buckets are larger (the engine's kFirstBucketBytes). */
const FIRST_BUCKET_BYTES = 1 << 20;

/** Per bucket, in the order they travel, the bytes each collective sends per worker. */
export function bucketTraffic(x: ExchangeShape): BucketTraffic[] {
  const buckets: number[][] = [];
  let filled = 0;
  for (let k = x.shapes.length - 1; k >= 0; k--) {
    const limit = buckets.length === 1 ? Math.min(x.bucketBytes, FIRST_BUCKET_BYTES) : x.bucketBytes;
    if (buckets.length === 0 || (x.bucketBytes > 0 && filled >= limit)) {
      buckets.push([]);
      filled = 0;
    }
    buckets.at(-1)!.push(k);
    filled += 4 * numel(x.shapes[k]!);
  }
  return buckets.map((bucket) => {
    const t: BucketTraffic = { dense: 0, powerSgdP: 0, powerSgdQ: 0, topkPairs: 0 };
    for (const k of bucket) {
      const shape = x.shapes[k]!;
      const size = numel(shape);
      const rows = shape[0] ?? 1, cols = size / rows;
      if (x.spec.kind === 'none' || x.level <= 0 || shape.length < 2) {
        t.dense += size * x.valueBytes;
      } else if (x.spec.kind === 'powersgd') {
        const r = Math.min(x.level, rows, cols);
        if ((rows + cols) * r * x.spec.minCompressionRate < rows * cols) {
          t.powerSgdP += rows * r * x.valueBytes;
          t.powerSgdQ += cols * r * x.valueBytes;
        } else t.dense += size * x.valueBytes;
      } else {
        t.topkPairs += Math.max(1, Math.floor(x.level * size)) * (4 + x.valueBytes);
      }
    }
    return t;
  });
}

function numel(shape: readonly number[]): number {
  return shape.reduce((a, b) => a * b, 1);
}

/** The seconds one step spends apart from the exchange's collectives, measured or given. */
export interface StepWork {
  /** Forward, backward and the update; forward alone. */
  computeSeconds: number;
  forwardSeconds: number;
  /** The compression kernels at the level (0 dense). */
  compressionSeconds: number;
  /** Floats rank 0 broadcasts before each step (its batch-norm running statistics). */
  broadcastFloats: number;
}

/** One row of a plan: a worker count and every level's prediction there. */
export interface PlanRow {
  workers: number;
  levels: { level: number; prediction: StepPrediction }[];
}

export interface StepPrediction {
  workers: number;
  /** Seconds of the step's collectives: the exchange, the agreement and the broadcast. */
  communicationSeconds: number;
  /** Seconds per step with the exchange after backward, and overlapped with it. */
  afterBackwardSeconds: number;
  overlappedSeconds: number;
  /** Collectives per step. */
  collectives: number;
}

/** Seconds of one training step among `workers` over `link`. */
export function predictStep(x: ExchangeShape, work: StepWork, workers: number, link: LinkModel, algorithm: Algorithm): StepPrediction {
  let exchange = 0, collectives = 0;
  if (workers > 1) {
    for (const t of bucketTraffic(x)) {
      for (const bytes of [t.dense, t.powerSgdP, t.powerSgdQ]) {
        if (bytes > 0) collectives++;
        exchange += allReduceSeconds(bytes, workers, link, algorithm);
      }
      if (t.topkPairs > 0) collectives++;
      exchange += allGatherSeconds(t.topkPairs, workers, link);
    }
    exchange += allReduceSeconds(4 * workers, workers, link, algorithm); // the agreement
    collectives++;
  }
  const broadcast = broadcastSeconds(4 * work.broadcastFloats, workers, link);
  if (workers > 1 && work.broadcastFloats > 0) collectives++;
  const { computeSeconds: c, forwardSeconds: f, compressionSeconds: k } = work;
  return {
    workers,
    communicationSeconds: exchange + broadcast,
    afterBackwardSeconds: broadcast + c + k + exchange,
    overlappedSeconds: broadcast + Math.max(c + k, f + k + exchange),
    collectives,
  };
}
