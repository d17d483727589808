// Waiting on child processes and conditions in tests, with deadlines.

/** Resolves with a started process's exit (`entry.exited`), or with { timedOut: true } after `ms`. */
export function exitWithin(entry, ms) {
  let timer;
  const timeout = new Promise((resolve) => (timer = setTimeout(() => resolve({ timedOut: true }), ms)));
  return Promise.race([entry.exited, timeout]).finally(() => clearTimeout(timer));
}

/** The first truthy value of `condition()` (sync or async), polled every `interval` ms; throws after `ms`. */
export async function waitFor(what, condition, ms, interval = 50) {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await condition();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, interval));
  }
}
