/* Text for a terminal: what the human-readable writers (the log's text
 * form, the --trace tree, the cost table, `luagent runs`, `luagent mcp
 * list`) print, with every byte or character a terminal would act on
 * written as a visible escape. */
#ifndef LG_TERMTEXT_H
#define LG_TERMTEXT_H

struct lua_State;

/* Sets terminal_text into the table on top of the stack. */
void lg_termtext_register(struct lua_State *L);

#endif
