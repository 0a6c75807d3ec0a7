// A real OTLP receiver for spec/otlp_spec.lua: @elastic/mockotlpserver
// (pinned in peers/package.json) serving OTLP/HTTP on 127.0.0.1:PORT. Each
// trace export it accepts is normalized by the receiver's own code
// (normalizeTrace: hex ids checked, kinds and status codes mapped to their
// enum names, 64-bit integers read) and appended as one JSON line to OUT,
// after checks of what the OTLP JSON encoding requires; a request that
// fails them is written as {"invalid": "..."}.
//   node otlp_receiver.js PEERS_DIR PORT OUT
const path = require('path');
const fs = require('fs');
const [peersDir, port, out] = process.argv.slice(2);
const {MockOtlpServer, normalizeTrace} = require(
  path.resolve(peersDir, 'node_modules/@elastic/mockotlpserver'));

function check(raw) {
  const problems = [];
  for (const rs of raw.resourceSpans || []) {
    for (const ss of rs.scopeSpans || []) {
      for (const s of ss.spans || []) {
        if (!/^[0-9a-f]{32}$/.test(s.traceId)) problems.push(`traceId ${s.traceId}`);
        if (!/^[0-9a-f]{16}$/.test(s.spanId)) problems.push(`spanId ${s.spanId}`);
        if (s.parentSpanId !== undefined && !/^[0-9a-f]{16}$/.test(s.parentSpanId))
          problems.push(`parentSpanId ${s.parentSpanId}`);
        for (const f of ['startTimeUnixNano', 'endTimeUnixNano'])
          if (typeof s[f] !== 'string' || !/^[0-9]+$/.test(s[f])) problems.push(`${f} ${s[f]}`);
        if (BigInt(s.endTimeUnixNano) < BigInt(s.startTimeUnixNano)) problems.push(`${s.name} ends before it starts`);
        for (const a of s.attributes || [])
          if ('intValue' in a.value && typeof a.value.intValue !== 'string')
            problems.push(`${a.key}: intValue not a string`);
      }
    }
  }
  return problems;
}

const server = new MockOtlpServer({
  services: ['http'], httpHostname: '127.0.0.1', httpPort: Number(port), logLevel: 'warn',
  onTrace(raw) {
    let line;
    try {
      const problems = check(raw);
      line = problems.length ? {invalid: problems.join('; ')} : normalizeTrace(raw);
    } catch (e) {
      line = {invalid: String(e && e.stack || e)};
    }
    fs.appendFileSync(out, JSON.stringify(line) + '\n');
  },
});
server.start().then(() => process.stdout.write(`listening ${port}\n`));
process.on('SIGTERM', () => server.close().then(() => process.exit(0)));
