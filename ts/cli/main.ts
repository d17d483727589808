/**
 * The command line's commands: each parses its own options; usage errors exit with code 2 and a
 * message naming the option, runtime errors with code 1.
 */
import { UsageError, reportFailure } from '../base/errors.js';
import { clusterCommand } from './cluster.js';
import { info } from './info.js';
import { launchCommand } from './launch.js';
import { planCommand } from './plan.js';
import { reportCommand } from './report.js';
import { train } from './train.js';

const USAGE = `Usage: accordion <command> [options]

Commands:
  train    train a model (accordion train --help for options; --workers N starts N processes, or N threads with --in-process)
  launch   start one training process per worker, like torchrun (accordion launch --help)
  cluster  run a job over N simulated hosts with shaped links; needs root (accordion cluster --help)
  report   write an HTML report of run directories (accordion report --help)
  plan     predict seconds per step on a cluster of 2 to 1,024 workers (accordion plan --help)
  info     show how the native addon was built, which devices it sees and which launcher started it

Every command takes --help.`;

export async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  try {
    if (command === 'train') return await train(rest);
    if (command === 'launch') return await launchCommand(rest);
    if (command === 'cluster') return await clusterCommand(rest);
    if (command === 'report') return await reportCommand(rest);
    if (command === 'plan') return await planCommand(rest);
    if (command === 'info') await info(rest);
    else if (command === undefined || command === '--help' || command === 'help') process.stdout.write(USAGE + '\n');
    else throw new UsageError(`unknown command '${command}'\n${USAGE}`);
    return 0;
  } catch (err) {
    return reportFailure(err);
  }
}
