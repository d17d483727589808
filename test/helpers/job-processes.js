// The processes of the data-parallel suites' jobs (test/comm/): each job carries a token in its environment,
// so that whatever a test started, a launcher's workers included, can be found and killed after it.
import { randomBytes } from 'node:crypto';
import { exitWithin, processesWithEnv, startNode } from './processes.js';

const live = new Set();
const tokens = new Set();

/** A token for a new job's environment (ACCORDION_JOB_TOKEN), so that its processes can be found and killed. */
export function newToken() {
  const token = `dp-test-${randomBytes(8).toString('hex')}`;
  tokens.add(token);
  return token;
}

/** Processes whose environment carries `token`, as { pid, ppid, rank } (rank undefined for the launcher). */
export function jobProcesses(token) {
  return processesWithEnv('ACCORDION_JOB_TOKEN', token).map(({ pid, ppid, state, environ }) => {
    const rank = environ.find((e) => e.startsWith('RANK='));
    return { pid, ppid, state, rank: rank ? Number(rank.slice(5)) : undefined };
  });
}

/** A Node process of a test (see startNode), killed by afterEach if still running. */
export const start = (args, env, options) => startNode(live, args, env, options);

function killEverything() {
  for (const entry of live) {
    try {
      if (entry.detached) process.kill(-entry.child.pid, 'SIGKILL');
      else entry.child.kill('SIGKILL');
    } catch {
      // already gone
    }
  }
  for (const token of tokens)
    for (const p of jobProcesses(token)) {
      try {
        process.kill(p.pid, 'SIGKILL');
      } catch {
        // already gone
      }
    }
}

/**
 * At the top level of a test file: after each test, kills whatever it started, even when it failed
 * halfway, so that one failure never leaves a job running into the next test.
 */
export function killJobsAfterEach() {
  afterEach(async function () {
    killEverything();
    // Wait for the kills to land so that the next test starts on idle cores.
    await Promise.all([...live].map((e) => exitWithin(e, 5000)));
    for (const token of tokens) if (jobProcesses(token).length === 0) tokens.delete(token);
  });
}
