/**
 * The own options of the commands that run training after `--` (launch, cluster, plan): each command's
 * typed table (config/options.ts's OptionSpec), read by the training options' value parser and bounds,
 * and its help from the same lines as `accordion train --help`.
 */
import { UsageError } from '../base/errors.js';
import { boundMessage, meetsBound, type OptionSpec } from '../config/options.js';
import { optionLine, parseValue } from './args.js';

/** A command's own options by name. */
export type CommandOptions = Record<string, OptionSpec>;

type ValueOf<S extends OptionSpec> = S['type'] extends 'int' | 'number' ? number
  : S['type'] extends 'ints' | 'numbers' ? number[]
  : S['type'] extends 'flag' ? boolean
  : S extends { choices: readonly (infer C)[] } ? C
  : string;

/** The values of a table's options: each of its type, undefined where the option has no default and was not given. */
export type CommandValues<T extends CommandOptions> = { [K in keyof T]: T[K] extends { default: unknown } ? ValueOf<T[K]> : ValueOf<T[K]> | undefined };

/**
 * Each option's value (its default where not given, within its bounds) and the training options after
 * `--`; null when --help was asked. Unknown options, a flag without its value, a value out of bounds
 * and no training options are errors.
 */
export function parseWrapperArgs<T extends CommandOptions>(command: string, argv: string[], options: T): { values: CommandValues<T>; trainArgs: string[] } | null {
  const split = argv.indexOf('--');
  const own = split < 0 ? argv : argv.slice(0, split);
  const trainArgs = split < 0 ? [] : argv.slice(split + 1);
  const entries = Object.entries(options);
  const values: Record<string, unknown> = Object.fromEntries(entries.map(([key, spec]) => [key, spec.default]));
  for (let i = 0; i < own.length; i++) {
    const arg = own[i]!;
    if (arg === '--help') return null;
    const eq = arg.indexOf('=');
    const flag = eq > 0 ? arg.slice(0, eq) : arg;
    const found = entries.find(([, spec]) => spec.flag === flag);
    if (!found) throw new UsageError(`unknown ${command} option ${flag} (training options go after --; see accordion ${command} --help)`);
    const [key, spec] = found;
    const raw = eq > 0 ? arg.slice(eq + 1) : own[++i];
    if (raw === undefined) throw new UsageError(`option ${flag} needs a value`);
    const value = parseValue(spec, raw);
    if (!meetsBound(spec, value)) throw new UsageError(boundMessage(`option ${flag}`, spec, value));
    values[key] = value;
  }
  if (trainArgs.length === 0) throw new UsageError(`accordion ${command} needs training options after -- (e.g. -- --model resnet18)`);
  return { values: values as CommandValues<T>, trainArgs };
}

/** The help text: usage, what the command does, its options with their defaults, an example. */
export function wrapperHelp(command: string, about: string[], options: CommandOptions, example: string): string {
  return [
    `Usage: accordion ${command} [${command} options] -- <train options>`,
    '',
    ...(about.length ? [...about, ''] : []),
    `${command[0]!.toUpperCase()}${command.slice(1)} options:`,
    ...Object.values(options).map(optionLine),
    '',
    `Example: accordion ${command} ${example}`,
  ].join('\n');
}
