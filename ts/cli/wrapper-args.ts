/**
 * The own options of the commands that run training after `--` (launch, cluster): splitting the
 * command line, reading the options before `--`, and their help.
 */
import { UsageError } from '../base/errors.js';

/** One option: its flag, the name of its value in the help, its help and its default as written. */
export interface WrapperOption {
  flag: string;
  value: string;
  help: string;
  dflt: string;
}

/**
 * Each option's text (its default where not given) and the training options after `--`; null when
 * --help was asked. Unknown options, a flag without its value and no training options are errors.
 */
export function parseWrapperArgs(
  command: string,
  argv: string[],
  options: readonly WrapperOption[],
): { values: Map<string, string>; trainArgs: string[] } | null {
  const split = argv.indexOf('--');
  const own = split < 0 ? argv : argv.slice(0, split);
  const trainArgs = split < 0 ? [] : argv.slice(split + 1);
  const values = new Map(options.map((o) => [o.flag, o.dflt]));
  for (let i = 0; i < own.length; i++) {
    const arg = own[i]!;
    if (arg === '--help') return null;
    const eq = arg.indexOf('=');
    const flag = eq > 0 ? arg.slice(0, eq) : arg;
    if (!values.has(flag)) throw new UsageError(`unknown ${command} option ${flag} (training options go after --; see accordion ${command} --help)`);
    const value = eq > 0 ? arg.slice(eq + 1) : own[++i];
    if (value === undefined) throw new UsageError(`option ${flag} needs a value`);
    values.set(flag, value);
  }
  if (trainArgs.length === 0) throw new UsageError(`accordion ${command} needs training options after -- (e.g. -- --model resnet18)`);
  return { values, trainArgs };
}

/** The help text: usage, what the command does, its options with their defaults, an example. */
export function wrapperHelp(command: string, about: string[], options: readonly WrapperOption[], example: string): string {
  return [
    `Usage: accordion ${command} [${command} options] -- <train options>`,
    '',
    ...(about.length ? [...about, ''] : []),
    `${command[0]!.toUpperCase()}${command.slice(1)} options:`,
    ...options.map((o) => `  ${`${o.flag} ${o.value}`.padEnd(26)} ${o.help}${o.dflt ? ` (default: ${o.dflt})` : ''}`),
    '',
    `Example: accordion ${command} ${example}`,
  ].join('\n');
}
