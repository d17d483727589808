/** File helpers shared by the writers of datasets, checkpoints, metrics and reports. */
import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';

/** The name of the temporary file beside `file` that an atomic write renames into place. */
function tmpName(file: string): string {
  return `${file}.tmp-${process.pid}-${randomBytes(6).toString('hex')}`;
}

/**
 * Writes `chunks` to `file` atomically: a temporary file beside it is written, flushed to disk and
 * renamed over `file`, so afterwards either the complete new file is in place or the old contents
 * are untouched and no temporary file remains. Failures are thrown as `Failure` (e.g. DataError).
 */
export function writeFileAtomic(file: string, chunks: (Uint8Array | string)[], Failure: new (message: string) => Error): void {
  const tmp = tmpName(file);
  let fd: number | undefined;
  try {
    fd = fs.openSync(tmp, 'wx');
    for (const chunk of chunks) {
      const bytes = typeof chunk === 'string' ? Buffer.from(chunk, 'utf8') : chunk;
      let off = 0;
      while (off < bytes.byteLength) off += fs.writeSync(fd, bytes, off, bytes.byteLength - off);
    }
    fs.fsyncSync(fd);
    fs.closeSync(fd);
    fd = undefined;
    fs.renameSync(tmp, file);
  } catch (err) {
    if (fd !== undefined) {
      try {
        fs.closeSync(fd);
      } catch {
        /* already failing; the original error is the useful one */
      }
    }
    fs.rmSync(tmp, { force: true });
    throw new Failure(`cannot write ${file}: ${(err as Error).message}`);
  }
  fsyncDirectory(path.dirname(path.resolve(file)));
}

/** Bytes handed to one write call: the thread pool writes them while the event loop runs on. */
const WRITE_SLICE = 4 << 20;

/**
 * The same atomic write as writeFileAtomic, off the event loop: the writes, the flush to disk, the
 * rename and the directory flush run on libuv's thread pool, so a caller in a service keeps
 * answering while tens of MB go to disk. Chunks are written one after the other (never joined into
 * one buffer); they must not change until the promise settles.
 */
export async function writeFileAtomicAsync(
  file: string,
  chunks: Iterable<Uint8Array | string>,
  Failure: new (message: string) => Error,
): Promise<void> {
  const tmp = tmpName(file);
  let handle: fs.promises.FileHandle | undefined;
  try {
    handle = await fs.promises.open(tmp, 'wx');
    for (const chunk of chunks) {
      const bytes = typeof chunk === 'string' ? Buffer.from(chunk, 'utf8') : chunk;
      let off = 0;
      while (off < bytes.byteLength) {
        const { bytesWritten } = await handle.write(bytes, off, Math.min(WRITE_SLICE, bytes.byteLength - off));
        off += bytesWritten;
      }
    }
    await handle.sync();
    await handle.close();
    handle = undefined;
    await fs.promises.rename(tmp, file);
  } catch (err) {
    if (handle !== undefined) await handle.close().catch(() => undefined); // already failing; the original error is the useful one
    await fs.promises.rm(tmp, { force: true }).catch(() => undefined);
    throw new Failure(`cannot write ${file}: ${(err as Error).message}`);
  }
  await fsyncDirectoryAsync(path.dirname(path.resolve(file)));
}

/** fsyncDirectory on the thread pool. */
export async function fsyncDirectoryAsync(dir: string): Promise<void> {
  let handle: fs.promises.FileHandle | undefined;
  try {
    handle = await fs.promises.open(dir, 'r');
    await handle.sync();
  } catch {
    /* as in fsyncDirectory: the file is already in place */
  } finally {
    await handle?.close().catch(() => undefined);
  }
}

/** Makes a rename durable. Best effort: some platforms cannot fsync a directory. */
function fsyncDirectory(dir: string): void {
  let fd: number | undefined;
  try {
    fd = fs.openSync(dir, 'r');
    fs.fsyncSync(fd);
  } catch {
    /* the file is already in place; failing here would misreport a successful write */
  } finally {
    if (fd !== undefined) fs.closeSync(fd);
  }
}

/** fs.statSync, or null when the path does not exist; other failures are thrown as `Failure`. */
export function statOrNull(p: string, Failure: new (message: string) => Error): fs.Stats | null {
  try {
    return fs.statSync(p);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
    throw new Failure(`cannot access ${p}: ${(err as Error).message}`);
  }
}
