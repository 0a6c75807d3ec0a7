/* Reading a file whole under a bound: regular files only, at most so many
 * bytes (tool files of a watched folder). */
#ifndef LG_READFILE_H
#define LG_READFILE_H

#include <lua.h>

/* Sets read_file into the table on top of the stack. */
void lg_readfile_register(lua_State *L);

#endif
