/**
 * The process groups of a job whose workers all live in this process (`accordion train --workers N
 * --in-process`): one rendezvous store hosted here on a free loopback port, and one Gloo group per
 * rank joined through it. Each group is used from its own worker's native thread, as a launched
 * worker uses its one group.
 */
import { randomBytes } from 'node:crypto';
import { ProcessGroup } from './group.js';
import { StoreServer } from './store.js';

const LOOPBACK = '127.0.0.1';

export interface LocalGroups {
  /** Rank r's group at index r. */
  readonly groups: ProcessGroup[];
  /** Closes every group, then the store. */
  dispose(): Promise<void>;
}

export async function connectLocalGroups(worldSize: number, timeoutMs?: number): Promise<LocalGroups> {
  const token = randomBytes(16).toString('hex');
  const store = await StoreServer.listen({ host: LOOPBACK, port: 0, token });
  try {
    const groups = await Promise.all(
      Array.from({ length: worldSize }, (_, rank) => ProcessGroup.connect({ rank, worldSize, masterAddr: LOOPBACK, masterPort: store.port, token, timeoutMs })),
    );
    return {
      groups,
      async dispose() {
        await Promise.all(groups.map((g) => g.dispose()));
        await store.close();
      },
    };
  } catch (err) {
    await store.close();
    throw err;
  }
}
