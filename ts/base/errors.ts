/**
 * Error classes shared by the TypeScript layer and the native binding.
 *
 * Every error carries a stable `code` so callers (and the CLI's exit-status
 * mapping) can branch on the kind of failure without parsing messages, which
 * are meant for humans and may change wording.
 */

export class AccordionError extends Error {
  readonly code: string;

  constructor(code: string, message: string) {
    super(message);
    this.code = code;
    // new.target makes stack traces and `${err}` show the concrete subclass
    // without every subclass having to repeat this assignment.
    this.name = new.target.name;
  }
}

/** A dataset file or directory is missing, malformed or inconsistent. */
export class DataError extends AccordionError {
  constructor(message: string) {
    super('ERR_DATA', message);
  }
}

/** A checkpoint could not be written, or a file on disk is not a valid checkpoint. */
export class CheckpointError extends AccordionError {
  constructor(message: string) {
    super('ERR_CHECKPOINT', message);
  }
}

/** Bad command-line arguments or option values; the user has to change the invocation. */
export class UsageError extends AccordionError {
  constructor(message: string) {
    super('ERR_USAGE', message);
  }
}

/**
 * A failure reported by the C++ addon. The addon picks the code (e.g. an
 * out-of-memory or CUDA failure gets its own), so it is a parameter here.
 */
export class NativeError extends AccordionError {
  constructor(code: string, message: string) {
    // An empty code from the addon would defeat code-based handling downstream.
    super(code || 'ERR_NATIVE', message);
  }
}

/** The shell's convention for a process stopped by a signal: 128 + its number (130 SIGINT, 143 SIGTERM). */
export function signalExitCode(signal: NodeJS.Signals): number {
  return signal === 'SIGTERM' ? 143 : 130;
}

/**
 * Writes the message of an error that ends a command (`accordion: …`; a bug's stack) and returns the
 * exit code: 2 for a usage error, 1 for any other.
 */
export function reportFailure(err: unknown): number {
  const e = err as Error;
  process.stderr.write(`accordion: ${e instanceof AccordionError ? e.message : (e.stack ?? e.message)}\n`);
  return e instanceof UsageError ? 2 : 1;
}
