/* The key scrubber behind lua/luagent/base/secrets.lua: the forms of every
 * registered key (as is, percent-encoded, JSON-escaped; secrets.lua makes
 * them) held in C, so that scrubbing a string, and a stream's delta with
 * the key prefix its end may hold, is one call and a memmem per form
 * instead of a Lua loop of string.find. */
#ifndef LG_SCRUB_H
#define LG_SCRUB_H

struct lua_State;

/* Sets `scrubber` (the constructor) into the table on top of the stack. */
void lg_scrub_register(struct lua_State *L);

#endif
