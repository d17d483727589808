/**
 * The lifeline between `accordion launch` and its workers: the launcher gives every worker one end
 * of a pipe (the file descriptor named by ACCORDION_LAUNCHER_FD) and keeps the other open for as
 * long as it lives. The kernel closes it when the launcher ends, however it ends (SIGKILL
 * included), so the worker reads end-of-file at once and stops instead of training on unwatched.
 */
import * as fs from 'node:fs';
import * as net from 'node:net';

export const LIFELINE_VARIABLE = 'ACCORDION_LAUNCHER_FD';

/** The worker's descriptor of the lifeline (after stdin, stdout and stderr). */
export const LIFELINE_FD = 3;

/**
 * Calls `onLauncherGone` once the launcher's end of the lifeline closes. Returns false (and watches
 * nothing) when this process has no lifeline. The variable is removed from the environment so that
 * processes this one starts do not take their own descriptor for it. The watch does not keep the
 * process alive.
 */
export function watchLifeline(onLauncherGone: () => void, env: NodeJS.ProcessEnv = process.env): boolean {
  const raw = env[LIFELINE_VARIABLE];
  if (raw === undefined) return false;
  delete env[LIFELINE_VARIABLE];
  const fd = Number(raw);
  if (!/^\d+$/.test(raw) || fd < 3) return false;
  let pipe: net.Socket;
  try {
    if (!fs.fstatSync(fd).isSocket() && !fs.fstatSync(fd).isFIFO()) return false;
    pipe = new net.Socket({ fd, readable: true, writable: false });
  } catch {
    return false; // not open, or not a pipe: started by hand with a stale variable
  }
  let called = false;
  const gone = () => {
    if (called) return;
    called = true;
    onLauncherGone();
  };
  pipe.on('end', gone);
  pipe.on('close', gone);
  pipe.on('error', gone);
  pipe.resume();
  pipe.unref();
  return true;
}
