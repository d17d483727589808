/**
 * Time to a target quality from a run's evaluations: the training clock at each evaluation (the
 * epochs' training seconds summed, evaluation left out) and the moment the quality first reaches the
 * target, interpolated linearly between the evaluation before the crossing and the one at it.
 */

/** One evaluation: the training seconds spent before it and the quality it found. */
export interface Evaluation {
  seconds: number;
  quality: number;
}

/** Accuracy: higher is better; perplexity: lower is better. */
export type Direction = 'higher' | 'lower';

/**
 * The training clock of an engine run's epoch records: each epoch's training seconds, its
 * end-of-epoch bookkeeping (Accordion's norms, a plan) and its replica check, summed over the
 * epochs; evaluation and checkpoints are not counted.
 */
export function engineClock(epochs: { seconds: number; bookkeepingSeconds?: number; syncSeconds?: number }[]): number[] {
  let total = 0;
  return epochs.map((e) => (total += e.seconds + (e.bookkeepingSeconds ?? 0) + (e.syncSeconds ?? 0)));
}

/**
 * A run's evaluations on its training clock, from its epoch records and the clock at each epoch's end
 * (`engineClock`, or a peer's epoch seconds summed): those within an epoch (`evaluations`, timed from
 * the epoch's start) on the clock of the epoch before, then the epoch's own.
 */
export function evaluationsOnClock(
  epochs: { testAccuracy: number; evaluations?: { seconds: number; testAccuracy: number }[] }[],
  clock: number[],
): Evaluation[] {
  return epochs.flatMap((e, i) => [
    ...(e.evaluations ?? []).map((w) => ({ seconds: (clock[i - 1] ?? 0) + w.seconds, quality: w.testAccuracy })),
    { seconds: clock[i], quality: e.testAccuracy },
  ]);
}

/**
 * Training seconds until the quality first reaches `target`, or null if no evaluation reaches it.
 * Between the last evaluation short of the target and the first at it, the quality is taken to move
 * linearly with time; a target reached at the first evaluation counts that evaluation's time (the
 * quality before training is not measured).
 */
export function timeToTarget(evaluations: Evaluation[], target: number, direction: Direction = 'higher'): number | null {
  const reached = (q: number) => (direction === 'higher' ? q >= target : q <= target);
  const i = evaluations.findIndex((e) => reached(e.quality));
  if (i < 0) return null;
  if (i === 0) return evaluations[0].seconds;
  const a = evaluations[i - 1];
  const b = evaluations[i];
  return a.seconds + ((target - a.quality) / (b.quality - a.quality)) * (b.seconds - a.seconds);
}
