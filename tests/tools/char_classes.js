#!/usr/bin/env node
// Oracle for the Unicode tables: writes one byte per code point 0..0x10FFFF, the class JavaScript's regex
// engine gives it: 1 = \p{L}, 2 = \p{N}, 3 = \s, 0 = none of them (surrogates included).
//   usage: node char_classes.js <out file>
'use strict';
const fs = require('fs');
const out = Buffer.alloc(0x110000);
const L = /\p{L}/u, N = /\p{N}/u, S = /\s/u;
for (let cp = 0; cp < 0x110000; cp++) {
  if (cp >= 0xd800 && cp <= 0xdfff) continue;
  const s = String.fromCodePoint(cp);
  out[cp] = L.test(s) ? 1 : N.test(s) ? 2 : S.test(s) ? 3 : 0;
}
fs.writeFileSync(process.argv[2], out);
