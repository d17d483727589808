/**
 * `accordion report`: an HTML report of run directories.
 */
import { UsageError } from '../base/errors.js';
import { writeReport } from '../report/report.js';

const REPORT_USAGE = `Usage: accordion report RUN_DIR [RUN_DIR …] [--out FILE]

Writes one HTML page comparing the runs: test accuracy against epochs, floats sent and wall-clock
time; the level each layer ran at in each epoch; the per-layer norm-change ratios at the checks; and
the link as training measured it.

Options:
  --out FILE   where to write the page (default: report.html in the first run's directory)
  --help       this text`;

export async function reportCommand(argv: string[]): Promise<number> {
  if (argv.includes('--help') || argv.includes('-h')) {
    process.stdout.write(REPORT_USAGE + '\n');
    return 0;
  }
  const dirs: string[] = [];
  let out: string | undefined;
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--out') {
      out = argv[++i];
      if (!out) throw new UsageError('option --out needs a file name');
    } else if (argv[i]!.startsWith('--')) throw new UsageError(`unknown report option ${argv[i]}`);
    else dirs.push(argv[i]!);
  }
  if (dirs.length === 0) throw new UsageError(`no run directory given\n${REPORT_USAGE}`);
  const file = await writeReport(dirs, out, { onWarning: (message) => process.stderr.write(`accordion: warning: ${message}\n`) });
  process.stdout.write(`report written to ${file}\n`);
  return 0;
}
