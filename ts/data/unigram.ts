/**
 * The baseline a language model should beat: the perplexity of the add-one-smoothed unigram
 * distribution of the training tokens.
 */
import { UsageError } from '../base/errors.js';
import { requireInteger } from './wikitext-batches.js';

/**
 * Perplexity of the add-one-smoothed unigram distribution of `train` on `evalTokens`:
 * p(w) = (count(w) + 1) / (N + V), perplexity = exp(−mean log p(w)).
 */
export function unigramPerplexity(train: Int32Array, evalTokens: Int32Array, vocabularySize: number): number {
  requireInteger(vocabularySize, 'vocabulary size', 1);
  if (evalTokens.length === 0) throw new UsageError('unigram perplexity needs at least one evaluation token');
  const counts = new Float64Array(vocabularySize);
  for (let i = 0; i < train.length; i++) {
    const id = train[i];
    if (id < 0 || id >= vocabularySize) {
      throw new UsageError(`training token ${i} has id ${id}, outside the vocabulary 0..${vocabularySize - 1}`);
    }
    counts[id]++;
  }
  const logDenominator = Math.log(train.length + vocabularySize);
  let sum = 0;
  for (let i = 0; i < evalTokens.length; i++) {
    const id = evalTokens[i];
    if (id < 0 || id >= vocabularySize) {
      throw new UsageError(`evaluation token ${i} has id ${id}, outside the vocabulary 0..${vocabularySize - 1}`);
    }
    sum += Math.log(counts[id] + 1) - logDenominator;
  }
  return Math.exp(-sum / evalTokens.length);
}
