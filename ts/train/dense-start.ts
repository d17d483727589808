/**
 * The dense start of a compressed run (`--compress-after STEPS`, PyTorch PowerSGD's
 * start_powerSGD_iter): the first STEPS steps send every gradient dense, then each weight matrix
 * takes the level its policy set. The error memories are empty when compression starts (a
 * matrix sent dense holds no error). Policies keep deciding during the dense phase: their levels
 * wait here and apply at its end, while the model's levels read 0 (dense), as the epoch records
 * and the checks see them.
 */
import type { Model } from '../engine/model.js';

export class DenseStart {
  /** The policy's levels, held back while the phase lasts; undefined once compression runs. */
  private waiting?: number[];

  constructor(private readonly steps: number) {}

  /**
   * At the start of training, after `stepsDone` steps (a resumed run's): enters the dense phase
   * when it is not over, holding the model's levels, or those a checkpoint taken inside the phase
   * held (`saved`).
   */
  async begin(model: Model, stepsDone: number, saved?: number[]): Promise<void> {
    if (stepsDone >= this.steps) return;
    this.waiting = saved ?? Array.from(await model.levels());
    await model.setLevels(this.waiting.map(() => 0));
  }

  /** True while the gradients go dense whatever the policy set. */
  get active(): boolean {
    return this.waiting !== undefined;
  }

  /** The levels the policy set (the model's own when no phase is running). */
  async levels(model: Model): Promise<number[]> {
    return this.waiting ? [...this.waiting] : Array.from(await model.levels());
  }

  /** Sets the policy's levels: held while the phase lasts, else on the model at once. */
  async setLevels(model: Model, levels: number[]): Promise<void> {
    if (this.waiting) this.waiting = [...levels];
    else await model.setLevels(levels);
  }

  /** After each step: `stepsDone` steps have run; the phase ends after its last one. */
  async stepDone(model: Model, stepsDone: number): Promise<void> {
    if (!this.waiting || stepsDone < this.steps) return;
    const levels = this.waiting;
    this.waiting = undefined;
    await model.setLevels(levels);
  }

  /** What a checkpoint keeps: the held levels while the phase lasts. */
  save(): { denseStartLevels?: number[] } {
    return this.waiting ? { denseStartLevels: [...this.waiting] } : {};
  }
}
