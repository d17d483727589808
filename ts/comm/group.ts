/**
 * A process group for data-parallel training: Gloo collectives (native) between one process per
 * worker, connected through the job's rendezvous store. Workers find each other through their
 * launcher's environment (RANK, WORLD_SIZE, MASTER_ADDR … or SLURM's or MPI's variables).
 */
import { createHash } from 'node:crypto';
import { binding, call, type CommDtype, type NativeProcessGroup } from '../native/binding.js';
import { UsageError } from '../base/errors.js';
import { DEFAULT_MASTER_ADDR, DEFAULT_MASTER_PORT, detectLauncher, type LaunchEnvironment } from './environment.js';
import { OPTIONS } from '../config/options.js';
import { RendezvousError, StoreClient, StoreServer } from './store.js';

export type DistributedEnv = LaunchEnvironment;

/**
 * The worker's place in the job from its launcher's environment (accordion launch, torchrun,
 * Kubeflow, SLURM, Open MPI, MPICH: see environment.ts); undefined when it runs alone.
 */
export function distributedEnv(env: NodeJS.ProcessEnv = process.env): DistributedEnv | undefined {
  return detectLauncher(env);
}

export interface ConnectOptions {
  rank: number;
  worldSize: number;
  masterAddr?: string;
  masterPort?: number;
  token?: string;
  /** Timeout of the rendezvous and of every collective. */
  timeoutMs?: number;
  /** Host the store in this process (rank 0 when no launcher hosts it). */
  hostStore?: boolean;
}

export class ProcessGroup {
  /** @internal */
  readonly native: NativeProcessGroup;

  private constructor(
    readonly rank: number,
    readonly worldSize: number,
    readonly timeoutMs: number,
    /** The TS side's connection to the job's store. */
    readonly store: StoreClient,
    native: NativeProcessGroup,
    private readonly server?: StoreServer,
  ) {
    this.native = native;
  }

  static fromEnv(env: DistributedEnv, timeoutMs?: number): Promise<ProcessGroup> {
    return ProcessGroup.connect({ ...env, timeoutMs, hostStore: !env.storeHosted && env.rank === 0 });
  }

  static async connect(options: ConnectOptions): Promise<ProcessGroup> {
    const { rank, worldSize } = options;
    if (!Number.isInteger(worldSize) || worldSize < 1 || !Number.isInteger(rank) || rank < 0 || rank >= worldSize)
      throw new UsageError(`rank ${rank} is outside a world of size ${worldSize}`);
    const host = options.masterAddr ?? DEFAULT_MASTER_ADDR;
    const port = options.masterPort ?? DEFAULT_MASTER_PORT;
    const token = options.token ?? '';
    const timeoutMs = options.timeoutMs ?? (OPTIONS.timeoutMs.default as number);
    const server = options.hostStore ? await StoreServer.listen({ host, port, token }) : undefined;
    let store: StoreClient | undefined;
    try {
      store = await StoreClient.connect(host, port, token, timeoutMs);
      const native = new binding.ProcessGroup({
        rank,
        worldSize,
        storeHost: host,
        storePort: port,
        token,
        hostname: store.localAddress,
        timeoutMs,
      });
      try {
        await call(native.ready());
        // Every rank returns only once all are connected: until then the store (possibly hosted by
        // this process) must stay responsive for the ranks still exchanging addresses.
        await call(native.barrier());
      } catch (err) {
        await native.dispose();
        throw err;
      }
      return new ProcessGroup(rank, worldSize, timeoutMs, store, native, server);
    } catch (err) {
      store?.close();
      await server?.close();
      throw err;
    }
  }

  /**
   * Element-wise sum (or mean) over the workers, in place. With `commDtype` 'bf16' or 'fp16' the
   * values travel in 16 bits (half the bytes) and are summed in fp32: each is divided by the world
   * size and rounded, each rank sums its share of every rank's values, and the rounded averages are
   * gathered. A value beyond fp16's ±65504 once divided comes back as ±Infinity.
   */
  async allReduce(data: Float32Array, options: { average?: boolean; commDtype?: CommDtype } = {}): Promise<void> {
    await call(this.native.allReduce(data, options.average ?? false, options.commDtype ?? 'fp32'));
  }

  /**
   * Every worker's data in rank order; with `counts`, rank r contributes counts[r] floats. The result
   * is written into `output` when given (no allocation per call), else into a new array.
   */
  async allGather(data: Float32Array, counts?: number[], output?: Float32Array): Promise<Float32Array> {
    return call(this.native.allGather(data, counts, output));
  }

  /** Rank `root`'s data copied into every worker's array, in place. */
  async broadcast(data: Float32Array, root = 0): Promise<void> {
    await call(this.native.broadcast(data, root));
  }

  async barrier(): Promise<void> {
    await call(this.native.barrier());
  }

  /**
   * Stops every rank with the same message when the ranks' configurations differ, naming the first
   * setting in which a rank differs from rank 0. Compares through the store, before any training;
   * every rank reads every configuration before any rank goes on (or stops and closes the store).
   */
  async checkConfig(config: Record<string, unknown>, name = 'config'): Promise<void> {
    await this.store.set(`${name}/${this.rank}`, JSON.stringify(config));
    const configs: Record<string, unknown>[] = [];
    for (let r = 0; r < this.worldSize; r++)
      configs.push(r === this.rank ? config : (JSON.parse((await this.store.get(`${name}/${r}`, this.timeoutMs)).toString()) as Record<string, unknown>));
    if ((await this.store.add(`${name}/read`, 1)) === this.worldSize) await this.store.set(`${name}/all-read`, '1');
    await this.store.get(`${name}/all-read`, this.timeoutMs);
    const reference = configs[0]!;
    for (let r = 1; r < this.worldSize; r++) {
      const other = configs[r]!;
      if (digest(other) === digest(reference)) continue;
      const keys = [...new Set([...Object.keys(reference), ...Object.keys(other)])].sort();
      const key = keys.find((k) => JSON.stringify(reference[k]) !== JSON.stringify(other[k]))!;
      throw new RendezvousError(
        `the workers' configurations differ: ${key} is ${JSON.stringify(reference[key])} on rank 0 but ${JSON.stringify(other[key])} on rank ${r}`,
      );
    }
  }

  async dispose(): Promise<void> {
    await this.native.dispose();
    this.store.close();
    await this.server?.close();
  }
}

function digest(config: Record<string, unknown>): string {
  return createHash('sha256').update(JSON.stringify(config, Object.keys(config).sort())).digest('hex');
}
