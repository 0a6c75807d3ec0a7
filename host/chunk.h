/* A fast path for the commonest streamed chunk: an OpenAI Chat Completions
 * chunk's JSON read straight into the few fields the adapter
 * (lua/luagent/model/providers/openai.lua) turns into normalized events, without
 * building the decoded table. Pure C, no allocation. It accepts only what
 * it is sure to read exactly as lua-cjson and the adapter would (strict
 * JSON, valid UTF-8, at most one choice, no tool calls, no usage, no error,
 * every field it reads a string or null where a string is expected);
 * anything else is declined and takes the ordinary path (cjson). */
#ifndef LG_CHUNK_H
#define LG_CHUNK_H

#include <stddef.h>

/* A string field: `set` when the key held a JSON string; its decoded bytes
 * are p[0, n) (in the input, or in the caller's scratch when it had
 * escapes). */
typedef struct {
  const char *p;
  size_t n;
  int set;
} lg_chunk_str;

typedef struct {
  lg_chunk_str id, model;   /* top-level "id", "model" when strings */
  int choices;              /* elements of "choices": 0 or 1 */
  lg_chunk_str content;     /* choices[1].delta.content */
  lg_chunk_str thinking;    /* delta.reasoning_content, else delta.reasoning,
                               as the adapter's `or` picks it */
  lg_chunk_str reason;      /* choices[1].finish_reason */
} lg_chunk;

/* Reads chunk `s` (n bytes). `scratch` must hold n bytes (decoded escapes go
 * there). Returns 1 and fills `out`, or 0 when the chunk must take the
 * ordinary path. */
int lg_chunk_openai(const char *s, size_t n, char *scratch, lg_chunk *out);

/* The Lua binding: sets openai_chunk into the table on top of the stack. */
struct lua_State;
void lg_chunk_register(struct lua_State *L);

#endif
