/* Lines from standard input on the loop (core.line_reader): libedit's line
 * editing and history on a terminal, plain lines from a pipe or a file;
 * and what a REPL needs of its terminal (terminal_size, text_width). */
#ifndef LG_LINE_LUA_H
#define LG_LINE_LUA_H

#include <lua.h>

void lg_line_register(lua_State *L);

#endif
