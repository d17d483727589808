/**
 * `accordion report`: an HTML report of run directories.
 */
import { UsageError } from '../base/errors.js';
import { writeReport } from '../report/report.js';

export async function reportCommand(argv: string[]): Promise<number> {
  const dirs: string[] = [];
  let out: string | undefined;
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--out') {
      out = argv[++i];
      if (!out) throw new UsageError('option --out needs a file name');
    } else if (argv[i]!.startsWith('--')) throw new UsageError(`unknown report option ${argv[i]}`);
    else dirs.push(argv[i]!);
  }
  if (dirs.length === 0) throw new UsageError('usage: accordion report RUN_DIR [RUN_DIR …] [--out FILE]');
  const file = await writeReport(dirs, out, { onWarning: (message) => process.stderr.write(`accordion: warning: ${message}\n`) });
  process.stdout.write(`report written to ${file}\n`);
  return 0;
}
