// Benchmark client (not a test): the official `openai` node SDK (installed
// by `make peers` into .peers/node_modules) streaming from
// bench/stream_server.lua, as bench/stream_client.lua does for luagent:
// R requests, C at a time, every chunk decoded by the SDK.
//   node bench/stream_node.js URL R N [C]
// One warm-up request is not measured when C is 1. Prints one line:
// "node chunks=<SSE events> text=<chunks with content> cpu=<s>" (the SDK
// hides `data: [DONE]`, counted here as the one event per response it is).
"use strict";
const path = require("path");
const OpenAI = require(path.join(__dirname, "..", ".peers", "node_modules", "openai"));

const [url, rArg, nArg, cArg] = process.argv.slice(2);
const r = Number(rArg), n = Number(nArg), c = Number(cArg || 1);
if (!url || !(r > 0) || !(n > 0) || !(c > 0)) {
  process.stderr.write("usage: node bench/stream_node.js URL R N [C]\n");
  process.exit(2);
}
const client = new OpenAI({ apiKey: "x", baseURL: url, maxRetries: 0 });
let chunks = 0, text = 0;

// Streams one request; counts its chunks and content chunks.
async function one() {
  const stream = await client.chat.completions.create({
    model: "bench", messages: [{ role: "user", content: "Say something." }],
    stream: true, stream_options: { include_usage: true }, max_completion_tokens: 4096,
  });
  for await (const chunk of stream) {
    chunks++;
    const choice = chunk.choices[0];
    if (choice && typeof choice.delta.content === "string") text++;
  }
  chunks++; // [DONE]
}

// CPU seconds (user + system) this process used so far.
function cpu() {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1e6;
}

(async () => {
  if (c === 1) {
    await one();
    chunks = text = 0;
  }
  const t0 = cpu();
  if (c === 1) {
    for (let i = 0; i < r; i++) await one();
  } else {
    let started = 0;
    const worker = async () => { while (started < r) { started++; await one(); } };
    await Promise.all(Array.from({ length: c }, worker));
  }
  const used = cpu() - t0;
  if (text !== r * n) throw new Error(`content chunks: ${text}, expected ${r * n}`);
  console.log(`node chunks=${chunks} text=${text} cpu=${used.toFixed(4)}`);
})().catch((e) => { console.error(e); process.exit(1); });
