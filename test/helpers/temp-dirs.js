// Temporary directories for a test file, removed after its tests.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

/** A function that makes a new directory under the system's temporary one, each removed by an `after` hook. */
export function tempDirs(prefix) {
  const made = [];
  after(() => {
    for (const d of made) fs.rmSync(d, { recursive: true, force: true });
  });
  return () => {
    const d = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
    made.push(d);
    return d;
  };
}
