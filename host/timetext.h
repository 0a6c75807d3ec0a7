/* Durations and times as the observers write them. */
#ifndef LG_TIMETEXT_H
#define LG_TIMETEXT_H

struct lua_State;

/* Sets duration_text and iso_time into the table on top of the stack. */
void lg_timetext_register(struct lua_State *L);

#endif
