/* Random ids for traces and spans. */
#ifndef LG_IDS_H
#define LG_IDS_H

struct lua_State;

/* Sets random_id into the table on top of the stack. */
void lg_ids_register(struct lua_State *L);

#endif
