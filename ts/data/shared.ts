/**
 * Datasets read once for several trainers: the workers of one process (`accordion train --workers N
 * --in-process`) each take their shard of the same images or text, so the first trainer's read
 * serves the others, which neither read the files again nor hold a copy of their own. The trainers
 * only read what they are given.
 */
export class SharedData {
  private readonly loaded = new Map<string, unknown>();

  /** What `read` returns for `key`, reading it on the first call only. */
  get<T>(key: string, read: () => T): T {
    if (!this.loaded.has(key)) this.loaded.set(key, read());
    return this.loaded.get(key) as T;
  }
}
