#!/usr/bin/env node
// Oracle for the tokenizer tests: encodes each string of a JSON array with the reference encoder
// (the npm package gpt-3-encoder) and writes a JSON array of id arrays.
//   usage: node gpt2_encode.js <package dir> <vocab dir> <in.json> <out.json>
// <vocab dir> holds encoder.json + vocab.bpe; when it is not the package's own, the package's Encoder.js is
// run with its __dirname pointed there (it reads its files from __dirname).
'use strict';
const fs = require('fs');
const path = require('path');

const [pkg, vocab, inPath, outPath] = process.argv.slice(2);
if (!outPath) {
  console.error('usage: node gpt2_encode.js <package dir> <vocab dir> <in.json> <out.json>');
  process.exit(2);
}
let encoder;
if (path.resolve(pkg) === path.resolve(vocab)) {
  encoder = require(path.resolve(pkg));
} else {
  const file = path.join(pkg, 'Encoder.js');
  const mod = {exports: {}};
  new Function('require', 'module', 'exports', '__dirname', '__filename', fs.readFileSync(file, 'utf-8'))(
      require, mod, mod.exports, path.resolve(vocab), file);
  encoder = mod.exports;
}
const texts = JSON.parse(fs.readFileSync(inPath, 'utf-8'));
const out = texts.map(t => encoder.encode(t));
for (const ids of out) {
  for (const id of ids) {
    if (!Number.isInteger(id)) throw new Error('reference encoder produced a non-integer id: ' + id);
  }
}
fs.writeFileSync(outPath, JSON.stringify(out));
