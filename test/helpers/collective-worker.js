// A worker of the multi-process collective tests: connects through the environment (RANK,
// WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ACCORDION_JOB_TOKEN), runs the collectives named in
// argv[2] (JSON) on deterministic per-rank data, and prints one JSON line with the results.
//
// Spec fields besides `cases`, `timeoutMs`, `config` and `configByRank`:
//   encoding: 'base64'   results as base64 of the float32 bytes (exact, and small for large cases)
//   exitAfterConnect: { rank, code }   that rank exits with `code` once every rank has connected
//   case.sleepByRank: [ms per rank]    a pause before the case (to make arrival order observable)
//   configDelayByRank: { rank: ms }    a pause before checkConfig (a rank that is late to it)
// The output also has `times`: [entered, left] (Date.now()) per case.
// Any failure prints `error: CODE message` on stderr, disposes the group and exits 1.
import { pathToFileURL } from 'node:url';
import { ProcessGroup, distributedEnv } from '../../lib/comm/group.js';

/** Rank r's data for case c: values anyone can recompute. */
export function dataFor(rank, length, salt) {
  return Float32Array.from({ length }, (_, i) => Math.fround(Math.sin(0.1 * i + 1.7 * rank + salt) * (rank + 1)));
}

function encode(result, encoding) {
  if (encoding === 'base64') return Buffer.from(result.buffer, result.byteOffset, result.byteLength).toString('base64');
  return Array.from(result);
}

let group;

async function main(spec) {
  const env = distributedEnv();
  const timeoutMs = spec.timeoutMs ?? 20000;
  group = await ProcessGroup.fromEnv(env, timeoutMs);
  if (spec.exitAfterConnect) {
    // Waiting until every rank reports itself connected keeps the exit out of another rank's
    // connect (a rendezvous failure, not the mid-job death this option is for).
    await group.store.set(`test/connected/${env.rank}`, '1');
    if (env.rank === spec.exitAfterConnect.rank) {
      for (let r = 0; r < env.worldSize; r++) await group.store.get(`test/connected/${r}`, timeoutMs);
      process.exit(spec.exitAfterConnect.code ?? 3);
    }
  }
  const out = { rank: env.rank, results: [], times: [] };
  for (const c of spec.cases ?? []) {
    const pause = c.sleepByRank?.[env.rank] ?? 0;
    if (pause) await new Promise((resolve) => setTimeout(resolve, pause));
    const length = c.lengths ? c.lengths[env.rank] : c.length;
    const data = dataFor(env.rank, length, c.salt ?? 0);
    const entered = Date.now();
    if (c.op === 'allReduce') await group.allReduce(data, { average: c.average, commDtype: c.commDtype });
    if (c.op === 'broadcast') await group.broadcast(data, c.root);
    if (c.op === 'barrier') await group.barrier();
    const result = c.op === 'allGather' ? await group.allGather(data, c.lengths) : data;
    out.times.push([entered, Date.now()]);
    out.results.push(encode(result, spec.encoding));
  }
  if (spec.config) {
    const pause = spec.configDelayByRank?.[env.rank] ?? 0;
    if (pause) await new Promise((resolve) => setTimeout(resolve, pause));
    await group.checkConfig({ ...spec.config, ...(spec.configByRank?.[env.rank] ?? {}) });
  }
  process.stdout.write(JSON.stringify(out) + '\n');
  await group.dispose();
}

// Only as a script: the tests import dataFor from this module.
if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  try {
    await main(JSON.parse(process.argv[2] ?? '{}'));
  } catch (err) {
    process.stderr.write(`error: ${err?.code ?? 'ERR_UNKNOWN'} ${err?.message ?? err}\n`);
    // Shut down the way Trainer.create does (dispose, which closes rank 0's store) rather than
    // vanishing, so what the other ranks see is the library's doing; bounded, and then exit in
    // case a broken group keeps the event loop alive.
    if (group) await Promise.race([group.dispose().catch(() => {}), new Promise((resolve) => setTimeout(resolve, 2000))]);
    process.exit(1);
  }
}
