-- Help text of `luagent mcp` (`luagent mcp --help`; `luagent help mcp` prints docs/guide/mcp.md).
return {
  mcp = [[
usage: luagent mcp list [options] -- COMMAND [ARGS...]
       luagent mcp list [options] --url URL

Starts an MCP server (a command speaking stdio, or a Streamable HTTP
address), does the handshake, lists its tools and prints each with the
flags luagent would give it (read_only, idempotent: they decide retries)
and the hints the server declares, then stops the server.

Hints become flags only when the tool policy trusts the server
(trust_hints); its overrides per tool name win (policies/README.md).
A tool of the list luagent leaves out (a schema it cannot use, past the
cap of 1,000 tools) is reported on stderr.

options:
  --url URL         a Streamable HTTP server instead of a command
  --name NAME       the server's name, as trust_hints lists it (default:
                    the command line, or the URL)
  --trust           trust the server's hints (trust_hints = true)
  --policy FILE     take trust_hints and overrides from this policy's tool
                    section (a file, or a name from policies/)
  --timeout S       seconds for the handshake and the list (default 10)
  -h, --help        show this help

Exit codes: 0 listed; 1 the server failed (the error on stderr, with the
server's stderr); 2 usage error.
]],
}
