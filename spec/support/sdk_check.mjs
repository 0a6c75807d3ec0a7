// Drives the official openai and @anthropic-ai/sdk clients against a mock
// provider and prints what each call gave, for spec/sdk_clients_spec.lua.
//
//   node sdk_check.mjs BASE_URL PEERS_DIR SAY
//
// BASE_URL is the mock (http://127.0.0.1:PORT), PEERS_DIR the folder whose
// node_modules holds the SDKs (.peers), SAY the user message. Every case runs
// once without tools and once with one tool offered (the mock then answers
// with a call of it). Prints one JSON array on stdout: per case {name=, ok=,
// text=, tool={id=, name=, arguments=<decoded>}, finish=, error=}. A case
// that throws is reported with ok=false and the error, never retried.
import { createRequire } from 'node:module';
import path from 'node:path';

const [baseURL, peersDir, SAY] = process.argv.slice(2);
if (!baseURL || !peersDir || !SAY) {
  process.stderr.write('usage: node sdk_check.mjs BASE_URL PEERS_DIR SAY\n');
  process.exit(2);
}

// The SDKs resolve from PEERS_DIR/node_modules, as if required from there.
const require = createRequire(path.resolve(peersDir, 'package.json'));
const openaiModule = require('openai');
const anthropicModule = require('@anthropic-ai/sdk');
const OpenAI = openaiModule.OpenAI ?? openaiModule.default;
const Anthropic = anthropicModule.Anthropic ?? anthropicModule.default;

const MODEL = 'sdk-check-model';
const SCHEMA = {
  type: 'object',
  properties: { city: { type: 'string', description: 'The city' } },
  required: ['city'],
};
const DESCRIPTION = 'The weather in a city';

// Clients that fail at once: no retries, a short timeout.
const openai = new OpenAI({ apiKey: 'sk-sdk-openai-secret', baseURL: `${baseURL}/v1`,
  maxRetries: 0, timeout: 15000 });
const anthropic = new Anthropic({ apiKey: 'sk-ant-sdk-secret', baseURL,
  maxRetries: 0, timeout: 15000 });

// Request parameters per API, with or without the tool.
const chatParams = (tools) => ({
  model: MODEL,
  messages: [{ role: 'user', content: SAY }],
  ...(tools && { tools: [{ type: 'function',
    function: { name: 'get_weather', description: DESCRIPTION, parameters: SCHEMA } }] }),
});
const responsesParams = (tools) => ({
  model: MODEL,
  input: [{ role: 'user', content: SAY }],
  ...(tools && { tools: [{ type: 'function', name: 'get_weather',
    description: DESCRIPTION, parameters: SCHEMA, strict: false }] }),
});
const anthropicParams = (tools) => ({
  model: MODEL,
  max_tokens: 256,
  messages: [{ role: 'user', content: SAY }],
  ...(tools && { tools: [{ name: 'get_weather', description: DESCRIPTION,
    input_schema: SCHEMA }] }),
});

// A tool call as reported: arguments decoded from their JSON text.
const call = (id, name, json) => ({ id, name, arguments: JSON.parse(json) });

// Each case returns {text, tool, finish}.
const CASES = {
  // Chat completions, streamed: text and tool calls from the deltas.
  async 'openai chat.completions.create stream:true'(tools) {
    const stream = await openai.chat.completions.create({ ...chatParams(tools), stream: true,
      stream_options: { include_usage: true } });
    let text = '', finish = null, usage = null;
    const calls = [];
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      const choice = chunk.choices[0];
      if (!choice) continue;
      if (choice.delta?.content) text += choice.delta.content;
      for (const tc of choice.delta?.tool_calls ?? []) {
        const t = (calls[tc.index] ??= { id: '', name: '', args: '' });
        if (tc.id) t.id = tc.id;
        if (tc.function?.name) t.name += tc.function.name;
        if (tc.function?.arguments) t.args += tc.function.arguments;
      }
      if (choice.finish_reason) finish = choice.finish_reason;
    }
    if (!usage) throw new Error('no usage chunk although include_usage was asked');
    return { text, finish, tool: calls[0] && call(calls[0].id, calls[0].name, calls[0].args) };
  },

  // Chat completions through the SDK's stream helper (it checks chunk order).
  async 'openai chat.completions.stream'(tools) {
    const stream = openai.chat.completions.stream(chatParams(tools));
    const done = await stream.finalChatCompletion();
    const choice = done.choices[0];
    const tc = choice.message.tool_calls?.[0];
    return { text: choice.message.content ?? '', finish: choice.finish_reason,
      tool: tc && call(tc.id, tc.function.name, tc.function.arguments) };
  },

  // Chat completions, stream:false.
  async 'openai chat.completions.create stream:false'(tools) {
    const done = await openai.chat.completions.create({ ...chatParams(tools), stream: false });
    const choice = done.choices[0];
    const tc = choice.message.tool_calls?.[0];
    return { text: choice.message.content ?? '', finish: choice.finish_reason,
      tool: tc && call(tc.id, tc.function.name, tc.function.arguments) };
  },

  // Responses, streamed: text deltas, the function call item, completion.
  async 'openai responses.create stream:true'(tools) {
    const stream = await openai.responses.create({ ...responsesParams(tools), stream: true });
    let text = '', finish = null, tool;
    for await (const event of stream) {
      if (event.type === 'response.output_text.delta') text += event.delta;
      if (event.type === 'response.output_item.done' && event.item.type === 'function_call') {
        tool = call(event.item.call_id, event.item.name, event.item.arguments);
      }
      if (event.type === 'response.completed') finish = event.response.status;
      if (event.type === 'error' || event.type === 'response.failed') {
        throw new Error(`stream failed: ${JSON.stringify(event)}`);
      }
    }
    return { text, finish, tool };
  },

  // Responses through the SDK's stream helper (it rebuilds the response).
  async 'openai responses.stream'(tools) {
    const stream = openai.responses.stream(responsesParams(tools));
    const done = await stream.finalResponse();
    const fc = done.output.find((item) => item.type === 'function_call');
    return { text: done.output_text, finish: done.status,
      tool: fc && call(fc.call_id, fc.name, fc.arguments) };
  },

  // Anthropic messages, streamed: the raw events.
  async 'anthropic messages.create stream:true'(tools) {
    const stream = await anthropic.messages.create({ ...anthropicParams(tools), stream: true });
    let text = '', finish = null, stopped = false;
    const blocks = [];
    for await (const event of stream) {
      if (event.type === 'content_block_start') {
        blocks[event.index] = { ...event.content_block, json: '' };
      } else if (event.type === 'content_block_delta') {
        if (event.delta.type === 'text_delta') text += event.delta.text;
        if (event.delta.type === 'input_json_delta') blocks[event.index].json += event.delta.partial_json;
      } else if (event.type === 'message_delta') {
        finish = event.delta.stop_reason;
      } else if (event.type === 'message_stop') {
        stopped = true;
      }
    }
    if (!stopped) throw new Error('no message_stop');
    const use = blocks.find((b) => b.type === 'tool_use');
    return { text, finish, tool: use && call(use.id, use.name, use.json) };
  },

  // Anthropic messages through messages.stream() (it accumulates the message).
  async 'anthropic messages.stream'(tools) {
    const stream = anthropic.messages.stream(anthropicParams(tools));
    let streamed = '';
    stream.on('text', (delta) => { streamed += delta; });
    const message = await stream.finalMessage();
    const text = message.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
    if (text !== streamed) throw new Error(`text events "${streamed}" differ from "${text}"`);
    const use = message.content.find((b) => b.type === 'tool_use');
    return { text, finish: message.stop_reason,
      tool: use && { id: use.id, name: use.name, arguments: use.input } };
  },

  // Anthropic messages, stream:false.
  async 'anthropic messages.create stream:false'(tools) {
    const message = await anthropic.messages.create(anthropicParams(tools));
    const text = message.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
    const use = message.content.find((b) => b.type === 'tool_use');
    return { text, finish: message.stop_reason,
      tool: use && { id: use.id, name: use.name, arguments: use.input } };
  },
};

const results = [];
for (const [name, run] of Object.entries(CASES)) {
  for (const tools of [false, true]) {
    const label = tools ? `${name} with tools` : name;
    try {
      results.push({ name: label, ok: true, ...(await run(tools)) });
    } catch (e) {
      results.push({ name: label, ok: false, error: String(e?.stack ?? e) });
    }
  }
}
process.stdout.write(JSON.stringify(results) + '\n');
