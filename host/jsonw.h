/* JSON text for the observers' hot paths: a log line's object and an OTLP
 * span (or a finished trace's spans), written into one buffer, so the only
 * allocation is the result.
 * Strings are written exactly as lua/luagent/base/json.lua writes them. */
#ifndef LG_JSONW_H
#define LG_JSONW_H

struct lua_State;

/* Sets json_quote, json_fields, otlp_span and otlp_traces into the table on
 * top of the stack. */
void lg_jsonw_register(struct lua_State *L);

#endif
