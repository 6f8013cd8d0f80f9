#!/usr/bin/env node
// Oracle for the SentencePiece-style BPE tests: the npm packages llama-tokenizer-js (Llama 1/2's vocabulary) and
// mistral-tokenizer-js (Mistral 7B's), independent JS implementations of SentencePiece BPE with their vocabulary
// and merges baked in.
//   node sentencepiece_tokenizer.js <package dir> dump <tokenizer.json>   writes the package's vocabulary and merges
//        as an HF tokenizer.json, in the layout transformers saves for Llama 2 and Mistral (the Prepend + Replace
//        normalizer, no pre-tokenizer, byte_fallback)
//   node sentencepiece_tokenizer.js <package dir> encode <in.json> <out.json>   the package's ids for each string
//        of a JSON array (no <s>; the leading space the tokenizers add, added); encode-bos: with <s> first
//
// The packages order equal merges by position with `rank + position / text.length` against merge ranks 2 apart, so
// they are exact only while a text has fewer than 2 * text.length starting symbols (a symbol is a character, or a
// byte of one the vocabulary lacks). `encode` refuses a text beyond that rather than return an order it cannot vouch
// for.
'use strict';
const fs = require('fs');
const path = require('path');
const {pathToFileURL} = require('url');

const [pkg, mode, a, b] = process.argv.slice(2);
if (!pkg || !(mode === 'dump' && a) && !((mode === 'encode' || mode === 'encode-bos') && b)) {
  console.error('usage: node sentencepiece_tokenizer.js <package dir> dump <out.json> | encode[-bos] <in.json> <out.json>');
  process.exit(2);
}

async function load(dir) {
  const meta = JSON.parse(fs.readFileSync(path.join(dir, 'package.json'), 'utf-8'));
  const mod = await import(pathToFileURL(path.join(path.resolve(dir), meta.main)).href);
  if (mod.LlamaTokenizer) return new mod.LlamaTokenizer();  // llama-tokenizer-js: a class
  return mod.default;                                       // mistral-tokenizer-js: an initialised object
}

(async () => {
  const tok = await load(pkg);
  const kSpace = '\u2581';
  if (mode === 'dump') {
    const vocab = {};
    tok.vocabById.forEach((s, i) => { vocab[s] = i; });
    const merges = [...tok.merges.entries()].sort((x, y) => x[1] - y[1]).map(e => e[0]);
    const added = ['<unk>', '<s>', '</s>'].map((content, id) => {
      if (tok.vocabById[id] !== content) throw new Error(`id ${id} is ${tok.vocabById[id]}, not ${content}`);
      return {id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true};
    });
    const json = {
      version: '1.0', truncation: null, padding: null, added_tokens: added,
      normalizer: {type: 'Sequence', normalizers: [
        {type: 'Prepend', prepend: kSpace},
        {type: 'Replace', pattern: {String: ' '}, content: kSpace}]},
      pre_tokenizer: null,
      post_processor: {type: 'TemplateProcessing',  // <s> before a text, as transformers saves Llama 2's
                       single: [{SpecialToken: {id: '<s>', type_id: 0}}, {Sequence: {id: 'A', type_id: 0}}],
                       pair: [{SpecialToken: {id: '<s>', type_id: 0}}, {Sequence: {id: 'A', type_id: 0}},
                              {SpecialToken: {id: '<s>', type_id: 1}}, {Sequence: {id: 'B', type_id: 1}}],
                       special_tokens: {'<s>': {id: '<s>', ids: [1], tokens: ['<s>']}}},
      decoder: {type: 'Sequence', decoders: [
        {type: 'Replace', pattern: {String: kSpace}, content: ' '}, {type: 'ByteFallback'}, {type: 'Fuse'},
        {type: 'Strip', content: ' ', start: 1, stop: 0}]},
      model: {type: 'BPE', dropout: null, unk_token: '<unk>', continuing_subword_prefix: null,
              end_of_word_suffix: null, fuse_unk: true, byte_fallback: true, vocab, merges},
    };
    fs.writeFileSync(a, JSON.stringify(json));
  } else {
    const texts = JSON.parse(fs.readFileSync(a, 'utf-8'));
    const enc = new TextEncoder();
    const out = texts.map(t => {
      let symbols = 0;
      for (const c of Array.from((' ' + t).replaceAll(' ', kSpace)))
        symbols += tok.vocabByString.has(c) ? 1 : enc.encode(c).length;
      if (t.length > 0 && symbols >= 2 * t.length)
        throw new Error(`a text of ${t.length} UTF-16 units starts as ${symbols} symbols: beyond what the ` +
                        `package orders exactly (fewer than twice its length)`);
      return tok.encode(t, /*add_bos_token=*/mode === 'encode-bos', /*add_preceding_space=*/true);
    });
    for (const ids of out)
      for (const id of ids)
        if (!Number.isInteger(id)) throw new Error('the reference produced a non-integer id: ' + id);
    fs.writeFileSync(b, JSON.stringify(out));
  }
})().catch(e => { console.error(e.stack || String(e)); process.exit(1); });
