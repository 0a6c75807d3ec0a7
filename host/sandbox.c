/* Running user Lua (policy files, hooks, Lua tools) under bounds that hold
 * in wall time and memory, in the host's own Lua state.
 *
 * Why not a Lua state of its own on a worker thread: a hook is a closure of
 * its policy file, so that file would have to live in the worker's state and
 * every argument and result be copied across; a runaway there can only be
 * abandoned, still burning a CPU (the backtracking match of issue 11 runs
 * for hours). Here the bound is exact instead, because every way user code
 * can spend time or memory is covered:
 *   - Lua instructions: a count hook checks the instruction budget and the
 *     wall-clock deadline; once stopped it raises at every instruction, in
 *     whichever coroutine of the box runs, so pcall cannot swallow the
 *     stop. The interval between two checks starts at one instruction at
 *     each resume and adapts (box_pace) so that checks come about every
 *     CHECK_GAP of wall time, at most HOOK_EVERY instructions apart. The
 *     adapting follows what the last interval took, so a run of slow
 *     instructions (C calls on big strings) after fast ones is checked
 *     only HOOK_EVERY instructions on: HOOK_EVERY is what bounds how late
 *     that stop comes, and is kept small (a count hook makes Lua trap
 *     every instruction whatever its interval: a longer one saves only the
 *     checks, which measure no cheaper at 10000 than at 1000). The clock is
 *     the wall clock, not the CPU time a loaded machine hands out slowly;
 *   - long C calls: the only library functions whose time is not linear in
 *     what they allocate are the pattern functions (backtracking) and
 *     string.rep of an empty string; sandboxed code gets find, match,
 *     gmatch and gsub from host/pattern.c, which checks the same deadline
 *     every few thousand steps, and so do string.rep (which loops without
 *     allocating on an empty string) and table.move (2^40 nils). While a
 *     box runs, the host's own string and table libraries hold them too
 *     (SWAPS), so string methods (s:find(...)) and host functions the user
 *     code calls are bounded;
 *   - memory: while a box runs, the state's allocator is wrapped and counts
 *     the net growth over the box's life (all its resumes: a tool that
 *     keeps what it allocates cannot pass the bound by waiting between
 *     allocations); past the limit allocations fail (a Lua memory error)
 *     and the box is stopped. What is counted is the heap's net growth
 *     while the box runs, garbage included, which the collector may free
 *     only long after (or while other code runs, unseen): so once the
 *     count is half way from what was live at the last such collection to
 *     the limit, the hook collects in full (box_collect), and what the
 *     code dropped is no growth. A box keeps no credit for frees of
 *     others' garbage past a wait (the count starts each resume at 0 or
 *     above): the bound is a guard against a runaway, not an exact
 *     measure;
 *   - metamethods that would run later, outside the bounds (__index,
 *     __pairs, __gc): sandboxed code gets no setmetatable (a tool file one
 *     that refuses __gc), and the host reads what it returns with
 *     rawget/next only, or inside the box (lua/luagent/base/sandbox.lua).
 *
 * A box runs one coroutine at a time: a call of box:resume (policy files
 * and hooks, which may not wait), or each resume of a task the scheduler
 * runs under it (host/loop.c: Lua tools, which may wait, and the tasks
 * they start). Its wall bound counts from its creation over all its
 * resumes. Boxes nest (a tool whose code calls a policy hook): the inner
 * one wraps the outer one's allocator. The allocator, the hook and the
 * swapped functions are put back when a resume ends, before anything else
 * runs, so no state outlives it; and when the state is closed while a box
 * runs (os.exit(code, true) from a plain script), the box's __gc puts them
 * back before its memory goes. A thread created inside a box inherits its
 * hook (lua_newthread): the hook removes itself where no box runs, and the
 * loop removes it from a task that leaves its box. */
#include "sandbox.h"

#include <lauxlib.h>
#include <limits.h>
#include <string.h>
#include <uv.h>

#include "core.h"
#include "pattern.h"

#define BOX_MT "luagent.Sandbox"
#define SWAPS_KEY "luagent.Sandbox.swaps"
#define HOOK_EVERY 1000   /* instructions between two checks, at most */
#define CHECK_GAP 1000000 /* nanoseconds between two checks the hook aims at */

/* The functions of the host's libraries a running box replaces by the
 * bounded ones of the same name (registered below). */
static const struct {
  const char *lib, *name;
} SWAPS[] = {{"string", "find"}, {"string", "match"}, {"string", "gmatch"},
             {"string", "gsub"}, {"string", "rep"},   {"table", "move"}};
#define NSWAPS ((int)(sizeof SWAPS / sizeof SWAPS[0]))

enum { RUN_OK, STOP_TIME, STOP_MEMORY, STOP_INSTRUCTIONS };

typedef struct {
  double wall;              /* the wall bound in seconds (messages); <= 0: none */
  uint64_t deadline;        /* uv_hrtime() at which it ends; 0: no bound */
  double grace;             /* box:deadline's seconds (messages); < 0: not set */
  size_t memory;            /* net bytes the box may add; 0: no bound */
  lua_Integer instructions; /* over the box's life; 0: no bound */
  lua_Integer counted;      /* instructions so far */
  int stop;                 /* RUN_OK or why it was stopped (for good) */
  char why[200];            /* "file:line: time limit (0.1 s) exceeded" */
  long long used;           /* net bytes over the box's life (may go negative) */
  long long collect_at;     /* `used` past which the hook collects in full */
  /* while armed (one resume) */
  int armed;
  lua_Alloc base_f;         /* the state's allocator (or an outer box's), wrapped */
  void *base_ud;
  uint64_t last_check;      /* uv_hrtime() of the last check */
  lua_State *co;
} lg_box;

/* ------------------------------------------------------------- bounds */

static void box_hook(lua_State *L, lua_Debug *ar);

/* The innermost box whose resume is running in L's state, or NULL. */
static lg_box *armed_box(lua_State *L);

static const char *stop_name(int stop) {
  return stop == STOP_TIME ? "time" : stop == STOP_MEMORY ? "memory" : "instructions";
}

/* Writes why the box stopped into b->why, with the position of the Lua
 * code running in L (the first frame with a line; none when L is NULL). */
static void box_describe(lg_box *b, lua_State *L) {
  char what[120];
  if (b->stop == STOP_TIME && b->grace >= 0)
    snprintf(what, sizeof what, "time limit (%g s, then a grace of %g s) exceeded", b->wall, b->grace);
  else if (b->stop == STOP_TIME)
    snprintf(what, sizeof what, "time limit (%g s) exceeded", b->wall);
  else if (b->stop == STOP_MEMORY)
    snprintf(what, sizeof what, "memory limit (%zu bytes) exceeded", b->memory);
  else
    snprintf(what, sizeof what, "instruction limit (%lld) exceeded", (long long)b->instructions);
  lua_Debug ar;
  for (int level = 0; L && lua_getstack(L, level, &ar); level++) {
    lua_getinfo(L, "Sl", &ar);
    if (ar.currentline >= 0) {
      const char *src = ar.source[0] == '@' ? ar.source + 1 : ar.short_src;
      snprintf(b->why, sizeof b->why, "%s:%d: %s", src, ar.currentline, what);
      return;
    }
  }
  snprintf(b->why, sizeof b->why, "%s", what);
}

/* Makes the count hook of L fire at every instruction (a stopped box). */
static void hook_every_instruction(lua_State *L) {
  if (lua_gethook(L) != box_hook || lua_gethookcount(L) != 1)
    lua_sethook(L, box_hook, LUA_MASKCOUNT, 1);
}

/* Stops the box for good (the first reason stays) and, if it runs, makes
 * the count hook fire at every instruction, so the stop is raised again
 * wherever it is caught. L is the running code, or NULL (inside the
 * allocator, or from outside: described when it is raised). A coroutine
 * of the box's code other than L and co gets its hook so at its next
 * check (box_hook). */
static void box_stop(lg_box *b, lua_State *L, int why) {
  if (b->stop) return;
  b->stop = why;
  b->why[0] = '\0';
  if (L) box_describe(b, L);
  if (b->co) hook_every_instruction(b->co);
  if (L && L != b->co) hook_every_instruction(L);
}

/* Raises the box's stop message (a string without further position). */
static int box_raise(lua_State *L, lg_box *b) {
  if (!b->why[0]) box_describe(b, L);
  lua_pushstring(L, b->why);
  return lua_error(L);
}

/* Whether the box ran past its deadline (and stops it if so). */
static int box_late(lg_box *b, lua_State *L) {
  if (!b->stop && b->deadline && uv_hrtime() >= b->deadline) box_stop(b, L, STOP_TIME);
  return b->stop != RUN_OK;
}

/* Adapts L's hook interval to the time the last one took: fewer
 * instructions when they were slow, up to HOOK_EVERY while they are fast,
 * and never past the instruction budget. */
static void box_pace(lg_box *b, lua_State *L, uint64_t now) {
  uint64_t gap = now - b->last_check;
  b->last_check = now;
  int n = lua_gethookcount(L), next = n;
  if (gap > CHECK_GAP) {
    uint64_t scaled = (uint64_t)n * CHECK_GAP / gap;
    next = scaled < 1 ? 1 : (int)scaled;
  } else if (gap < CHECK_GAP / 2 && n < HOOK_EVERY) {
    next = n * 2 > HOOK_EVERY ? HOOK_EVERY : n * 2;
  }
  if (b->instructions > 0 && b->instructions - b->counted < next)
    next = (int)(b->instructions - b->counted) + 1;
  if (next != n) lua_sethook(L, box_hook, LUA_MASKCOUNT, next);
}

/* A full collection inside the box, its frees counted: what the box's
 * code allocated and dropped is no growth. The next one comes half way
 * from what is left to the limit, so code that keeps near its limit does
 * not collect at every check. */
static void box_collect(lg_box *b, lua_State *L) {
  lua_gc(L, LUA_GCCOLLECT);
  long long live = b->used > 0 ? b->used : 0;
  b->collect_at = live + ((long long)b->memory - live) / 2;
}

/* The count hook: instruction budget, memory and deadline. Where no box
 * runs (a thread created inside one that outlived it) it removes itself. */
static void box_hook(lua_State *L, lua_Debug *ar) {
  (void)ar;
  lg_box *b = armed_box(L);
  if (!b) {
    lua_sethook(L, NULL, 0, 0);
    return;
  }
  if (!b->stop) {
    b->counted += lua_gethookcount(L);
    if (b->instructions > 0 && b->counted > b->instructions) {
      box_stop(b, L, STOP_INSTRUCTIONS);
    } else {
      if (b->memory && b->used > b->collect_at) box_collect(b, L);
      uint64_t now = uv_hrtime();
      if (b->deadline && now >= b->deadline) box_stop(b, L, STOP_TIME);
      else box_pace(b, L, now);
    }
  }
  if (b->stop) {
    hook_every_instruction(L); /* L may be a coroutine of the box's code */
    box_raise(L, b);
  }
}

/* The allocator while a box runs: the state's own, refusing growth past
 * the box's memory limit. */
static void *box_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  lg_box *b = ud;
  size_t old = ptr ? osize : 0;
  if (b->memory && nsize > old && b->used + (long long)(nsize - old) > (long long)b->memory) {
    box_stop(b, NULL, STOP_MEMORY);
    return NULL;
  }
  void *r = b->base_f(b->base_ud, ptr, osize, nsize);
  if (r || nsize == 0) b->used += (long long)nsize - (long long)old;
  return r;
}

static lg_box *armed_box(lua_State *L) {
  void *ud;
  return lua_getallocf(L, &ud) == box_alloc ? ud : NULL;
}

int lg_sandbox_running(lua_State *L) { return armed_box(L) != NULL; }

/* sandbox_running() -> whether sandboxed code is running (cli.lua's
 * os.exit refuses to end the host from a tool). */
static int l_sandbox_running(lua_State *L) {
  lua_pushboolean(L, lg_sandbox_running(L));
  return 1;
}

void lg_sandbox_unhook(lua_State *co) {
  if (lua_gethook(co) == box_hook) lua_sethook(co, NULL, 0, 0);
}

/* Puts the bounded functions into the host's libraries (in) or what they
 * replaced back (out); the replaced ones are kept in the box's user value. */
static void swap_functions(lua_State *L, int box, int in) {
  if (lua_getfield(L, LUA_REGISTRYINDEX, SWAPS_KEY) != LUA_TTABLE) {
    lua_pop(L, 1);
    return;
  }
  lua_getiuservalue(L, box, 1);
  int swaps = lua_gettop(L) - 1, saved = lua_gettop(L);
  for (int i = 1; i <= NSWAPS; i++) {
    if (lua_rawgeti(L, swaps, i) != LUA_TTABLE) { /* that library is absent */
      lua_pop(L, 1);
      continue;
    }
    lua_rawgeti(L, -1, 1); /* the library */
    lua_pushstring(L, SWAPS[i - 1].name);
    if (in) {
      lua_pushvalue(L, -1);
      lua_rawget(L, -3);
      lua_rawseti(L, saved, i);
      lua_rawgeti(L, -3, 2); /* the bounded function */
    } else {
      lua_rawgeti(L, saved, i);
      lua_pushboolean(L, 0);
      lua_rawseti(L, saved, i);
    }
    lua_rawset(L, -3);
    lua_pop(L, 2);
  }
  lua_pop(L, 2);
}

int lg_sandbox_is_box(lua_State *L, int idx) { return luaL_testudata(L, idx, BOX_MT) != NULL; }

int lg_sandbox_arm(lua_State *L, int idx, lua_State *co) {
  idx = lua_absindex(L, idx);
  lg_box *b = luaL_checkudata(L, idx, BOX_MT);
  if (b->armed) return -1;
  swap_functions(L, idx, 1);
  b->armed = 1;
  if (b->used < 0) b->used = 0; /* no credit for others' garbage past a wait */
  b->co = co;
  b->last_check = uv_hrtime();
  b->base_f = lua_getallocf(L, &b->base_ud);
  lua_setallocf(L, box_alloc, b);
  lua_sethook(co, box_hook, LUA_MASKCOUNT, 1); /* the first check at once */
  return 0;
}

/* Takes the armed box b out of the state's chain of allocators: the
 * state's allocator again if b is the innermost box, else the base of the
 * box that wraps b (the state closing: finalizers may run in any order). */
static void box_unlink(lua_State *L, lg_box *b) {
  void *ud;
  lua_Alloc f = lua_getallocf(L, &ud);
  if (f == box_alloc && ud == b) {
    lua_setallocf(L, b->base_f, b->base_ud);
    return;
  }
  for (lg_box *in = f == box_alloc ? ud : NULL; in; in = in->base_f == box_alloc ? in->base_ud : NULL) {
    if (in->base_f == box_alloc && in->base_ud == b) {
      in->base_f = b->base_f;
      in->base_ud = b->base_ud;
      return;
    }
  }
}

void lg_sandbox_disarm(lua_State *L, int idx) {
  idx = lua_absindex(L, idx);
  lg_box *b = luaL_checkudata(L, idx, BOX_MT);
  if (!b->armed) return;
  box_unlink(L, b);
  /* a stop in the allocator has no position until raised: a task that
   * died of the memory error has it on its stack still */
  if (b->stop && !b->why[0]) box_describe(b, b->co);
  lg_sandbox_unhook(b->co);
  b->co = NULL;
  b->armed = 0;
  swap_functions(L, idx, 0);
}

/* __gc: a box is collected while armed only when the state closes inside
 * its resume (os.exit(code, true)); its memory must leave the allocator
 * chain first, or the frees that follow would go through it. */
static int l_box_gc(lua_State *L) {
  lg_sandbox_disarm(L, 1);
  return 0;
}

int lg_sandbox_stopped(lua_State *L, int idx) {
  lg_box *b = luaL_checkudata(L, idx, BOX_MT);
  return b->stop != RUN_OK;
}

int lg_sandbox_raise(lua_State *L, int idx) {
  return box_raise(L, luaL_checkudata(L, idx, BOX_MT));
}

/* ---------------------------------------------------------------- box */

/* sandbox{wall=, memory=, instructions=} -> a box: bounds for running user
 * code over all its resumes: wall in seconds from now, memory in bytes of
 * net growth, instructions. Absent or 0: no bound. */
static int l_sandbox(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lg_box *b = lua_newuserdatauv(L, sizeof *b, 1);
  memset(b, 0, sizeof *b);
  luaL_setmetatable(L, BOX_MT);
  lua_createtable(L, NSWAPS, 0); /* the functions a resume replaced */
  for (int i = 1; i <= NSWAPS; i++) {
    lua_pushboolean(L, 0);
    lua_rawseti(L, -2, i);
  }
  lua_setiuservalue(L, -2, 1);
  lua_getfield(L, 1, "wall");
  b->wall = luaL_optnumber(L, -1, 0);
  lua_getfield(L, 1, "memory");
  lua_Number mem = luaL_optnumber(L, -1, 0);
  lua_getfield(L, 1, "instructions");
  lua_Number ins = luaL_optnumber(L, -1, 0);
  lua_pop(L, 3);
  if (!(b->wall >= 0 && b->wall < 1e9) || !(mem >= 0 && mem < 1e15) || !(ins >= 0 && ins < 1e15))
    return luaL_error(L, "sandbox: wall must be seconds from 0 to 1e9, memory and instructions "
                         "numbers from 0 to 1e15");
  b->grace = -1;
  b->memory = (size_t)mem;
  b->collect_at = (long long)b->memory / 2;
  b->instructions = (lua_Integer)ins;
  if (b->wall > 0) b->deadline = uv_hrtime() + (uint64_t)(b->wall * 1e9);
  return 1;
}

/* box:resume(co, ...) -> like coroutine.resume, within the box's bounds:
 * true, results (or the yielded values: co is then suspended), or false,
 * the error value, and when a bound stopped it, why ("file:line: time
 * limit (0.1 s) exceeded"). Not re-entrant: a box runs one resume at a
 * time (another box may run inside it). */
static int l_box_resume(lua_State *L) {
  lg_box *b = luaL_checkudata(L, 1, BOX_MT);
  lua_State *co = lua_tothread(L, 2);
  luaL_argexpected(L, co != NULL, 2, "coroutine");
  if (b->armed) return luaL_error(L, "sandbox: resume of a box that is running");
  int nargs = lua_gettop(L) - 2;
  if (!lua_checkstack(co, nargs + LUA_MINSTACK)) return luaL_error(L, "sandbox: too many arguments");
  lua_xmove(L, co, nargs);
  lg_sandbox_arm(L, 1, co);
  int nres = 0;
  int status = lua_resume(co, L, 0 + nargs, &nres);
  lg_sandbox_disarm(L, 1);
  if (status == LUA_OK || status == LUA_YIELD) {
    if (!lua_checkstack(L, nres + 1)) return luaL_error(L, "sandbox: too many results");
    lua_pushboolean(L, 1);
    lua_xmove(co, L, nres);
    return nres + 1;
  }
  lua_pushboolean(L, 0);
  lua_xmove(co, L, 1);
  if (b->stop) {
    if (!b->why[0]) box_describe(b, co);
    lua_pushstring(L, b->why);
  } else {
    lua_pushnil(L);
  }
  return 3;
}

/* box:deadline(seconds): the wall bound ends `seconds` from now (a task
 * cancelled at its timeout gets its grace so). */
static int l_box_deadline(lua_State *L) {
  lg_box *b = luaL_checkudata(L, 1, BOX_MT);
  lua_Number s = luaL_checknumber(L, 2);
  if (!(s >= 0 && s < 1e9)) return luaL_error(L, "deadline: seconds must be a number from 0 to 1e9");
  b->deadline = uv_hrtime() + (uint64_t)(s * 1e9);
  b->grace = s;
  return 0;
}

/* box:stop(): stops the box for good, as its wall bound would: code it
 * runs raises at every instruction and may not wait. */
static int l_box_stop(lua_State *L) {
  box_stop(luaL_checkudata(L, 1, BOX_MT), NULL, STOP_TIME);
  return 0;
}

/* box:stopped() -> false, or why ("time" | "memory" | "instructions") and
 * the message ("file:line: time limit (0.5 s) exceeded"). */
static int l_box_stopped(lua_State *L) {
  lg_box *b = luaL_checkudata(L, 1, BOX_MT);
  if (!b->stop) {
    lua_pushboolean(L, 0);
    return 1;
  }
  if (!b->why[0]) box_describe(b, NULL);
  lua_pushstring(L, stop_name(b->stop));
  lua_pushstring(L, b->why);
  return 2;
}

/* box:stats() -> {instructions=, memory=} used so far (memory: the net
 * growth over its resumes). */
static int l_box_stats(lua_State *L) {
  lg_box *b = luaL_checkudata(L, 1, BOX_MT);
  lua_createtable(L, 0, 2);
  lua_pushinteger(L, b->counted);
  lua_setfield(L, -2, "instructions");
  lua_pushinteger(L, (lua_Integer)b->used);
  lua_setfield(L, -2, "memory");
  return 1;
}

/* ------------------------------------------------- bounded patterns */

/* What the matcher's tick needs: the running box and the calling code. */
typedef struct {
  lg_box *box;
  lua_State *L;
} tick_ctx;

/* tick of host/pattern.c: whether the running box is out of time. */
static int pattern_tick(void *ud) {
  tick_ctx *t = ud;
  return box_late(t->box, t->L);
}

/* Starts a match over s under the running box's deadline, if any. */
static void match_init(lua_State *L, lg_match *m, tick_ctx *t, const char *s, size_t len) {
  t->box = armed_box(L);
  t->L = L;
  lg_pattern_init(m, s, len, t->box ? pattern_tick : NULL, t);
}

/* Raises the error of a match that returned -1: the box's stop (the hook
 * keeps raising it) or what is wrong with the pattern. */
static int match_error(lua_State *L, lg_match *m, const char *fn) {
  lg_box *b = armed_box(L);
  if (b && b->stop) return box_raise(L, b);
  return luaL_error(L, "%s (in string.%s)", m->error, fn);
}

/* Lua's rule for a start position: negative counts from the end; 1-based.
 * Returns the 0-based offset, which may be len + 1 (past the end). */
static size_t start_offset(lua_Integer pos, size_t len) {
  if (pos > 0) return (size_t)pos - 1;
  if (pos == 0 || pos < -(lua_Integer)len) return 0;
  return len + (size_t)pos;
}

/* Pushes capture i of the last match (the whole match s..e when there are
 * none and i is 0). */
static void push_capture(lua_State *L, lg_match *m, int i, const char *s, const char *e) {
  if (i >= m->level) {
    if (i != 0) luaL_error(L, "invalid capture index %%%d", i + 1);
    lua_pushlstring(L, s, (size_t)(e - s));
    return;
  }
  ptrdiff_t len = m->capture[i].len;
  if (len == LG_PATTERN_UNFINISHED) luaL_error(L, "unfinished capture");
  if (len == LG_PATTERN_POSITION)
    lua_pushinteger(L, (lua_Integer)(m->capture[i].init - m->src) + 1);
  else
    lua_pushlstring(L, m->capture[i].init, (size_t)len);
}

/* Pushes every capture (or the whole match when `whole` and there are
 * none); returns how many. */
static int push_captures(lua_State *L, lg_match *m, const char *s, const char *e, int whole) {
  int n = (m->level == 0 && whole) ? 1 : m->level;
  luaL_checkstack(L, n, "too many captures");
  for (int i = 0; i < n; i++) push_capture(L, m, i, s, e);
  return n;
}

/* Whether p has none of the characters that make a pattern. */
static int is_plain(const char *p, size_t len) {
  for (size_t i = 0; i < len; i++)
    if (strchr("^$*+?.([%-", p[i]) && p[i] != '\0') return 0;
  return 1;
}

/* find and match: string.find(s, p [, init [, plain]]), string.match(s, p
 * [, init]), bounded. */
static int find_or_match(lua_State *L, int find) {
  size_t len, plen;
  const char *s = luaL_checklstring(L, 1, &len);
  const char *p = luaL_checklstring(L, 2, &plen);
  size_t init = start_offset(luaL_optinteger(L, 3, 1), len);
  const char *fn = find ? "find" : "match";
  if (init > len) {
    luaL_pushfail(L);
    return 1;
  }
  lg_match m;
  tick_ctx tc;
  match_init(L, &m, &tc, s, len);
  const char *start, *end;
  int r;
  if (find && (lua_toboolean(L, 4) || is_plain(p, plen))) {
    r = lg_pattern_plain(&m, s + init, p, plen, &start);
    if (r < 0) return match_error(L, &m, fn);
    if (!r) {
      luaL_pushfail(L);
      return 1;
    }
    lua_pushinteger(L, (lua_Integer)(start - s) + 1);
    lua_pushinteger(L, (lua_Integer)(start - s + (ptrdiff_t)plen));
    return 2;
  }
  int anchored = plen > 0 && p[0] == '^';
  r = lg_pattern_search(&m, s + init, p + anchored, plen - (size_t)anchored, anchored, NULL,
                        &start, &end);
  if (r < 0) return match_error(L, &m, fn);
  if (!r) {
    luaL_pushfail(L);
    return 1;
  }
  if (!find) return push_captures(L, &m, start, end, 1);
  lua_pushinteger(L, (lua_Integer)(start - s) + 1);
  lua_pushinteger(L, (lua_Integer)(end - s));
  return push_captures(L, &m, NULL, NULL, 0) + 2;
}

static int l_find(lua_State *L) { return find_or_match(L, 1); }
static int l_match(lua_State *L) { return find_or_match(L, 0); }

/* The iterator of gmatch; upvalues: s, p, next offset, end of the last
 * match (-1: none). */
static int gmatch_next(lua_State *L) {
  size_t len, plen;
  const char *s = lua_tolstring(L, lua_upvalueindex(1), &len);
  const char *p = lua_tolstring(L, lua_upvalueindex(2), &plen);
  lua_Integer at = lua_tointeger(L, lua_upvalueindex(3));
  lua_Integer last = lua_tointeger(L, lua_upvalueindex(4));
  if (at > (lua_Integer)len) return 0;
  lg_match m;
  tick_ctx tc;
  match_init(L, &m, &tc, s, len);
  const char *start, *end;
  int r = lg_pattern_search(&m, s + at, p, plen, 0, last >= 0 ? s + last : NULL, &start, &end);
  if (r < 0) return match_error(L, &m, "gmatch");
  if (!r) {
    lua_pushinteger(L, (lua_Integer)len + 1);
    lua_replace(L, lua_upvalueindex(3));
    return 0;
  }
  lua_pushinteger(L, end - s);
  lua_pushvalue(L, -1);
  lua_replace(L, lua_upvalueindex(3));
  lua_replace(L, lua_upvalueindex(4));
  return push_captures(L, &m, start, end, 1);
}

/* string.gmatch(s, p [, init]): '^' is not an anchor here, as in Lua. */
static int l_gmatch(lua_State *L) {
  size_t len;
  luaL_checklstring(L, 1, &len);
  luaL_checkstring(L, 2);
  size_t init = start_offset(luaL_optinteger(L, 3, 1), len);
  lua_settop(L, 2);
  lua_pushinteger(L, init > len ? (lua_Integer)len + 1 : (lua_Integer)init);
  lua_pushinteger(L, -1);
  lua_pushcclosure(L, gmatch_next, 4);
  return 1;
}

/* Appends the replacement of one match s..e to b (gsub's repl at index 3). */
static void add_replacement(lua_State *L, luaL_Buffer *b, lg_match *m, const char *s,
                            const char *e, int type) {
  if (type == LUA_TFUNCTION) {
    lua_pushvalue(L, 3);
    int n = push_captures(L, m, s, e, 1);
    lua_call(L, n, 1);
  } else if (type == LUA_TTABLE) {
    push_capture(L, m, 0, s, e);
    lua_gettable(L, 3); /* as Lua's: its __index runs here, inside the box */
  } else {
    size_t rlen;
    const char *r = lua_tolstring(L, 3, &rlen);
    for (size_t i = 0; i < rlen; i++) {
      if (r[i] != '%') {
        luaL_addchar(b, r[i]);
        continue;
      }
      i++;
      if (i < rlen && r[i] == '%') {
        luaL_addchar(b, '%');
      } else if (i < rlen && r[i] >= '0' && r[i] <= '9') {
        if (r[i] == '0') lua_pushlstring(L, s, (size_t)(e - s));
        else push_capture(L, m, r[i] - '1', s, e);
        luaL_tolstring(L, -1, NULL);
        lua_remove(L, -2);
        luaL_addvalue(b);
      } else {
        luaL_error(L, "invalid use of '%%' in replacement string");
      }
    }
    return;
  }
  if (!lua_toboolean(L, -1)) {
    lua_pop(L, 1);
    luaL_addlstring(b, s, (size_t)(e - s));
  } else if (!lua_isstring(L, -1)) {
    luaL_error(L, "invalid replacement value (a %s)", luaL_typename(L, -1));
  } else {
    luaL_addvalue(b);
  }
}

/* string.gsub(s, p, repl [, n]), bounded. */
static int l_gsub(lua_State *L) {
  size_t len, plen;
  const char *s = luaL_checklstring(L, 1, &len);
  const char *p = luaL_checklstring(L, 2, &plen);
  int type = lua_type(L, 3);
  lua_Integer max = luaL_optinteger(L, 4, (lua_Integer)len + 1);
  luaL_argexpected(L, type == LUA_TNUMBER || type == LUA_TSTRING || type == LUA_TFUNCTION ||
                   type == LUA_TTABLE, 3, "string/function/table");
  int anchored = plen > 0 && p[0] == '^';
  p += anchored;
  plen -= (size_t)anchored;
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  lg_match m;
  tick_ctx tc;
  match_init(L, &m, &tc, s, len);
  const char *src = s, *last = NULL;
  lua_Integer n = 0;
  while (n < max) {
    const char *start, *end;
    int r = lg_pattern_search(&m, src, p, plen, 1, last, &start, &end);
    if (r < 0) return match_error(L, &m, "gsub");
    if (r) {
      n++;
      add_replacement(L, &b, &m, src, end, type);
      src = last = end;
    } else if (src < s + len) {
      luaL_addchar(&b, *src++);
    } else {
      break;
    }
    if (anchored) break;
  }
  luaL_addlstring(&b, src, (size_t)(s + len - src));
  luaL_pushresult(&b);
  lua_pushinteger(L, n);
  return 2;
}

/* string.rep(s, n [, sep]): Lua's, except that nothing repeated is answered
 * at once (Lua loops n times copying nothing, which no memory bound stops)
 * and the copying checks the deadline. Its cap is Lua 5.4's (MAXSIZE in
 * lstrlib.c: INT_MAX bytes where size_t is wider than int). */
static int l_rep(lua_State *L) {
  size_t l, lsep;
  const char *s = luaL_checklstring(L, 1, &l);
  lua_Integer n = luaL_checkinteger(L, 2);
  const char *sep = luaL_optlstring(L, 3, "", &lsep);
  if (n <= 0 || l + lsep == 0) {
    lua_pushliteral(L, "");
    return 1;
  }
  if (l + lsep < l || l + lsep > (size_t)INT_MAX / (lua_Unsigned)n)
    return luaL_error(L, "resulting string too large");
  size_t total = (size_t)n * l + (size_t)(n - 1) * lsep;
  luaL_Buffer b;
  char *p = luaL_buffinitsize(L, &b, total);
  lg_box *box = armed_box(L);
  for (lua_Integer i = 0; i < n; i++) {
    if (box && (i & 4095) == 0 && box_late(box, L)) return box_raise(L, box);
    memcpy(p, s, l);
    p += l;
    if (lsep > 0 && i + 1 < n) {
      memcpy(p, sep, lsep);
      p += lsep;
    }
  }
  luaL_pushresultsize(&b, total);
  return 1;
}

/* What table.move needs of an argument that is no table (ltablib.c's
 * checktab): a metatable with the metamethods it uses. */
#define TAB_R 1 /* read: __index */
#define TAB_W 2 /* write: __newindex */

/* Whether the metatable under the n - 1 values pushed since has `key`. */
static int has_field(lua_State *L, const char *key, int n) {
  lua_pushstring(L, key);
  return lua_rawget(L, -n) != LUA_TNIL;
}

static void check_tab(lua_State *L, int arg, int what) {
  if (lua_type(L, arg) == LUA_TTABLE) return;
  int n = 1; /* the metatable and the fields looked up */
  if (lua_getmetatable(L, arg) && (!(what & TAB_R) || has_field(L, "__index", ++n)) &&
      (!(what & TAB_W) || has_field(L, "__newindex", ++n))) {
    lua_pop(L, n);
    return;
  }
  luaL_checktype(L, arg, LUA_TTABLE); /* raises the usual error */
}

/* table.move(a1, f, e, t [, a2]): Lua's, with the deadline checked as it
 * goes (Lua's moves 2^40 nils without a pause). */
static int l_move(lua_State *L) {
  lua_Integer f = luaL_checkinteger(L, 2);
  lua_Integer e = luaL_checkinteger(L, 3);
  lua_Integer t = luaL_checkinteger(L, 4);
  int to = lua_isnoneornil(L, 5) ? 1 : 5;
  check_tab(L, 1, TAB_R);
  check_tab(L, to, TAB_W);
  if (e >= f) {
    luaL_argcheck(L, f > 0 || e < LUA_MAXINTEGER + f, 3, "too many elements to move");
    lua_Integer n = e - f;
    luaL_argcheck(L, t <= LUA_MAXINTEGER - n, 4, "destination wrap around");
    lg_box *box = armed_box(L);
    int forward = t > e || t <= f || (to != 1 && !lua_compare(L, 1, to, LUA_OPEQ));
    for (lua_Integer i = 0; i <= n; i++) {
      if (box && (i & 4095) == 0 && box_late(box, L)) return box_raise(L, box);
      lua_Integer k = forward ? i : n - i;
      lua_geti(L, 1, f + k);
      lua_seti(L, to, t + k);
    }
  }
  lua_pushvalue(L, to);
  return 1;
}

/* Records in the registry, for each of SWAPS, {library, bounded function}
 * (the library as package.loaded holds it: the table string methods use). */
static void register_swaps(lua_State *L, int bounded_string, int bounded_table) {
  lua_createtable(L, NSWAPS, 0);
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
  for (int i = 0; i < NSWAPS; i++) {
    if (lua_getfield(L, -1, SWAPS[i].lib) != LUA_TTABLE) {
      lua_pop(L, 1);
      continue;
    }
    lua_createtable(L, 2, 0);
    lua_insert(L, -2);
    lua_rawseti(L, -2, 1);
    lua_getfield(L, strcmp(SWAPS[i].lib, "string") == 0 ? bounded_string : bounded_table, SWAPS[i].name);
    lua_rawseti(L, -2, 2);
    lua_rawseti(L, -3, i + 1);
  }
  lua_pop(L, 1);
  lua_setfield(L, LUA_REGISTRYINDEX, SWAPS_KEY);
}

void lg_sandbox_register(lua_State *L) {
  static const luaL_Reg box_methods[] = {
      {"resume", l_box_resume}, {"deadline", l_box_deadline}, {"stop", l_box_stop},
      {"stopped", l_box_stopped}, {"stats", l_box_stats}, {NULL, NULL}};
  lg_class_new(L, BOX_MT, box_methods, NULL, l_box_gc);
  lua_pushcfunction(L, l_sandbox);
  lua_setfield(L, -2, "sandbox");
  lua_pushcfunction(L, l_sandbox_running);
  lua_setfield(L, -2, "sandbox_running");
  static const luaL_Reg patterns[] = {
      {"find", l_find}, {"match", l_match}, {"gmatch", l_gmatch}, {"gsub", l_gsub},
      {"rep", l_rep},   {NULL, NULL}};
  luaL_newlib(L, patterns);
  lua_createtable(L, 0, 1);
  lua_pushcfunction(L, l_move);
  lua_setfield(L, -2, "move");
  register_swaps(L, lua_gettop(L) - 1, lua_gettop(L));
  lua_setfield(L, -3, "bounded_table");
  lua_setfield(L, -2, "bounded_string");
}
