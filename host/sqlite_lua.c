/* Lua binding of SQLite (Debian's libsqlite3), the storage of the run
 * journal (lua/luagent/agent/journal/sqlite.lua):
 *
 *   core.sqlite_open(path, [opts]) -> db | nil, err
 *   db:exec(sql) -> true | nil, err          (statements without parameters)
 *   db:prepare(sql) -> stmt | nil, err
 *   stmt:run(...) -> rows, changes | nil, err (binds, steps to the end, resets)
 *   db:close(), stmt:close()                  (idempotent; also __gc/__close)
 *
 * Operational failures are error records of kind "journal" with `file`,
 * `code` (SQLite's extended result code), `code_name` and `corrupt` (true
 * for SQLITE_CORRUPT and SQLITE_NOTADB). Misuse (a closed handle, a value
 * that cannot be bound) raises. Calls are synchronous on the loop's thread:
 * with WAL and synchronous=NORMAL a commit is a write(), not an fsync. */
#include <lauxlib.h>
#include <sqlite3.h>
#include <string.h>

#include "core.h"
#include "errors.h"
#include "loop.h"
#include "sqlite_lua.h"

#define DB_MT "luagent.Sqlite"
#define STMT_MT "luagent.SqliteStmt"
#define DEFAULT_BUSY_MS 5000

typedef struct {
  sqlite3 *db; /* NULL until opened and once closed */
} db_ud;

typedef struct {
  sqlite3_stmt *s; /* NULL once closed; the db userdata is its user value */
} stmt_ud;

/* ---------------------------------------------------------------- errors */

/* The name of an extended result code ("SQLITE_CORRUPT", ...). */
static const char *code_name(int code) {
  switch (code & 0xff) {
  case SQLITE_BUSY: return "SQLITE_BUSY";
  case SQLITE_LOCKED: return "SQLITE_LOCKED";
  case SQLITE_NOMEM: return "SQLITE_NOMEM";
  case SQLITE_READONLY: return "SQLITE_READONLY";
  case SQLITE_IOERR: return "SQLITE_IOERR";
  case SQLITE_CORRUPT: return "SQLITE_CORRUPT";
  case SQLITE_FULL: return "SQLITE_FULL";
  case SQLITE_CANTOPEN: return "SQLITE_CANTOPEN";
  case SQLITE_PROTOCOL: return "SQLITE_PROTOCOL";
  case SQLITE_SCHEMA: return "SQLITE_SCHEMA";
  case SQLITE_CONSTRAINT: return "SQLITE_CONSTRAINT";
  case SQLITE_MISMATCH: return "SQLITE_MISMATCH";
  case SQLITE_NOTADB: return "SQLITE_NOTADB";
  case SQLITE_PERM: return "SQLITE_PERM";
  default: return "SQLITE_ERROR";
  }
}

/* Pushes nil and a "journal" error record: "<file>: <what>: <sqlite's
 * message>" with file, code, code_name and corrupt. Returns 2. */
int lg_sqlite_push_fail(lua_State *L, const char *file, const char *what, int code, const char *msg) {
  lua_pushnil(L);
  lua_pushfstring(L, "%s: %s: %s", file ? file : "?", what, msg ? msg : sqlite3_errstr(code));
  lg_error_push(L, LG_ERR_JOURNAL, lua_tostring(L, -1));
  lua_remove(L, -2);
  lua_pushstring(L, file ? file : "?");
  lua_setfield(L, -2, "file");
  lua_pushinteger(L, code);
  lua_setfield(L, -2, "code");
  lua_pushstring(L, code_name(code));
  lua_setfield(L, -2, "code_name");
  int primary = code & 0xff;
  lua_pushboolean(L, primary == SQLITE_CORRUPT || primary == SQLITE_NOTADB);
  lua_setfield(L, -2, "corrupt");
  return 2;
}

/* push_fail with the connection's own code and message. */
static int push_db_fail(lua_State *L, sqlite3 *db, const char *what) {
  return lg_sqlite_push_fail(L, sqlite3_db_filename(db, "main"), what, sqlite3_extended_errcode(db),
                             sqlite3_errmsg(db));
}

/* ------------------------------------------------------------ connection */

/* The open db at argument 1; raises "fn: database is closed" once closed. */
static db_ud *check_db(lua_State *L, const char *fn) {
  db_ud *u = luaL_checkudata(L, 1, DB_MT);
  if (!u->db) luaL_error(L, "%s: database is closed", fn);
  return u;
}

/* The one close (close, __close, __gc). sqlite3_close_v2 defers the real
 * close while statements are alive: each keeps the db userdata as its user
 * value, so the connection ends with the last of them. Idempotent. */
static int l_db_close(lua_State *L) {
  db_ud *u = luaL_checkudata(L, 1, DB_MT);
  if (u->db) {
    sqlite3_close_v2(u->db);
    u->db = NULL;
  }
  return 0;
}

/* opts.busy_ms of the options at index `opts` (nil: the default); raises
 * naming fn when out of range. */
int lg_sqlite_busy_ms(lua_State *L, int opts, const char *fn) {
  if (lua_isnoneornil(L, opts)) return DEFAULT_BUSY_MS;
  luaL_checktype(L, opts, LUA_TTABLE);
  lua_getfield(L, opts, "busy_ms");
  lua_Integer busy = lua_isnil(L, -1) ? DEFAULT_BUSY_MS : luaL_checkinteger(L, -1);
  lua_pop(L, 1);
  if (busy < 0 || busy > 3600000) return luaL_error(L, "%s: opts.busy_ms must be 0..3600000", fn);
  return (int)busy;
}

/* sqlite_open(path, [opts]) -> db | nil, err. opts: create (default true:
 * the file is created if missing; an existing file is never replaced),
 * readonly, uri (path is a "file:" URI, whose query may hold SQLite's
 * parameters: mode=ro, readonly_shm=1, immutable=1), busy_ms (how long to
 * wait for another process's lock, default 5000). The database is not read
 * yet: the first statement finds a file that is not a database. Returns a
 * new "luagent.Sqlite". */
static int l_sqlite_open(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  int create = 1, readonly = 0, uri = 0;
  int busy = lg_sqlite_busy_ms(L, 2, "sqlite_open");
  if (!lua_isnoneornil(L, 2)) {
    lua_getfield(L, 2, "create");
    if (!lua_isnil(L, -1)) create = lua_toboolean(L, -1);
    lua_getfield(L, 2, "readonly");
    readonly = lua_toboolean(L, -1);
    lua_getfield(L, 2, "uri");
    uri = lua_toboolean(L, -1);
    lua_pop(L, 3);
  }
  db_ud *u = lua_newuserdatauv(L, sizeof *u, 0);
  u->db = NULL;
  luaL_setmetatable(L, DB_MT);
  int flags = readonly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | (create ? SQLITE_OPEN_CREATE : 0);
  if (uri) flags |= SQLITE_OPEN_URI;
  sqlite3 *db = NULL;
  int rc = sqlite3_open_v2(path, &db, flags | SQLITE_OPEN_NOMUTEX, NULL);
  if (rc != SQLITE_OK) {
    int code = db ? sqlite3_extended_errcode(db) : rc;
    lua_pushstring(L, db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
    sqlite3_close_v2(db);
    lg_sqlite_push_fail(L, path, "cannot open", code, lua_tostring(L, -1));
    return 2;
  }
  sqlite3_extended_result_codes(db, 1);
  sqlite3_busy_timeout(db, busy);
  u->db = db;
  return 1;
}

/* db:exec(sql) -> true | nil, err: runs one or more statements that take
 * no parameters (schema, pragmas, BEGIN/COMMIT). */
static int l_db_exec(lua_State *L) {
  db_ud *u = check_db(L, "exec");
  const char *sql = luaL_checkstring(L, 2);
  char *msg = NULL;
  int rc = sqlite3_exec(u->db, sql, NULL, NULL, &msg);
  if (rc != SQLITE_OK) {
    lua_pushstring(L, msg ? msg : sqlite3_errstr(rc));
    sqlite3_free(msg);
    return lg_sqlite_push_fail(L, sqlite3_db_filename(u->db, "main"), "exec", sqlite3_extended_errcode(u->db),
                     lua_tostring(L, -1));
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* db:changes() -> rows changed by the last statement. */
static int l_db_changes(lua_State *L) {
  db_ud *u = check_db(L, "changes");
  lua_pushinteger(L, sqlite3_changes(u->db));
  return 1;
}

/* ------------------------------------------------------------ statements */

/* db:prepare(sql) -> stmt | nil, err. The statement keeps the connection
 * alive (its user value) and is finalized by stmt:close() or collection. */
static int l_db_prepare(lua_State *L) {
  db_ud *u = check_db(L, "prepare");
  size_t len;
  const char *sql = luaL_checklstring(L, 2, &len);
  stmt_ud *s = lua_newuserdatauv(L, sizeof *s, 1);
  s->s = NULL;
  luaL_setmetatable(L, STMT_MT);
  lua_pushvalue(L, 1);
  lua_setiuservalue(L, -2, 1);
  int rc = sqlite3_prepare_v2(u->db, sql, (int)len, &s->s, NULL);
  if (rc != SQLITE_OK) {
    sqlite3_finalize(s->s);
    s->s = NULL;
    return push_db_fail(L, u->db, "prepare");
  }
  return 1;
}

/* The one close of a statement: finalizes it. Idempotent. */
static int l_stmt_close(lua_State *L) {
  stmt_ud *s = luaL_checkudata(L, 1, STMT_MT);
  if (s->s) {
    sqlite3_finalize(s->s);
    s->s = NULL;
  }
  return 0;
}

/* The open statement at argument 1 whose connection is open too. */
static stmt_ud *check_stmt(lua_State *L, const char *fn) {
  stmt_ud *s = luaL_checkudata(L, 1, STMT_MT);
  if (!s->s) luaL_error(L, "%s: statement is closed", fn);
  lua_getiuservalue(L, 1, 1);
  db_ud *u = lua_touserdata(L, -1);
  lua_pop(L, 1);
  if (!u || !u->db) luaL_error(L, "%s: database is closed", fn);
  return s;
}

/* Binds argument `arg` to parameter `i`: nil, boolean (0/1), integer,
 * number, string (as text). Anything else is misuse. */
static int bind_one(lua_State *L, sqlite3_stmt *st, int i, int arg) {
  switch (lua_type(L, arg)) {
  case LUA_TNIL: return sqlite3_bind_null(st, i);
  case LUA_TBOOLEAN: return sqlite3_bind_int(st, i, lua_toboolean(L, arg));
  case LUA_TNUMBER:
    if (lua_isinteger(L, arg)) return sqlite3_bind_int64(st, i, (sqlite3_int64)lua_tointeger(L, arg));
    return sqlite3_bind_double(st, i, lua_tonumber(L, arg));
  case LUA_TSTRING: {
    size_t len;
    const char *p = lua_tolstring(L, arg, &len);
    return sqlite3_bind_text64(st, i, p, len, SQLITE_TRANSIENT, SQLITE_UTF8);
  }
  default:
    return luaL_error(L, "run: parameter %d is a %s (nil, boolean, number or string expected)", i,
                      luaL_typename(L, arg));
  }
}

/* Pushes the current row as a table keyed by column name. */
static void push_row(lua_State *L, sqlite3_stmt *st) {
  int n = sqlite3_column_count(st);
  lua_createtable(L, 0, n);
  for (int c = 0; c < n; c++) {
    switch (sqlite3_column_type(st, c)) {
    case SQLITE_INTEGER: lua_pushinteger(L, (lua_Integer)sqlite3_column_int64(st, c)); break;
    case SQLITE_FLOAT: lua_pushnumber(L, sqlite3_column_double(st, c)); break;
    case SQLITE_NULL: continue;
    default:
      lua_pushlstring(L, (const char *)sqlite3_column_text(st, c), (size_t)sqlite3_column_bytes(st, c));
    }
    lua_setfield(L, -2, sqlite3_column_name(st, c));
  }
}

/* stmt:run(...) -> rows, changes | nil, err. Binds the arguments to the
 * parameters in order, steps to the end collecting each row ({column =
 * value}, NULL columns absent), then resets the statement for its next
 * use. The rows table is new and owned by the caller. */
static int l_stmt_run(lua_State *L) {
  stmt_ud *s = check_stmt(L, "run");
  int nargs = lua_gettop(L) - 1;
  int want = sqlite3_bind_parameter_count(s->s);
  if (nargs != want) return luaL_error(L, "run: %d parameter(s) expected, got %d", want, nargs);
  /* a run that raised midway (a bad parameter, out of memory while
   * collecting rows) left the statement mid-step: start from a reset */
  sqlite3_reset(s->s);
  sqlite3_clear_bindings(s->s);
  for (int i = 1; i <= nargs; i++) {
    if (bind_one(L, s->s, i, i + 1) != SQLITE_OK) {
      sqlite3 *db = sqlite3_db_handle(s->s);
      sqlite3_reset(s->s);
      sqlite3_clear_bindings(s->s);
      return push_db_fail(L, db, "bind");
    }
  }
  lua_newtable(L);
  int rc, n = 0;
  while ((rc = sqlite3_step(s->s)) == SQLITE_ROW) {
    push_row(L, s->s);
    lua_rawseti(L, -2, ++n);
  }
  sqlite3 *db = sqlite3_db_handle(s->s);
  if (rc != SQLITE_DONE) {
    /* the step's own message before reset clears it */
    int code = sqlite3_extended_errcode(db);
    lua_pushstring(L, sqlite3_errmsg(db));
    sqlite3_reset(s->s);
    sqlite3_clear_bindings(s->s);
    return lg_sqlite_push_fail(L, sqlite3_db_filename(db, "main"), "step", code, lua_tostring(L, -1));
  }
  sqlite3_reset(s->s);
  sqlite3_clear_bindings(s->s);
  lua_pushinteger(L, sqlite3_changes(db));
  return 2;
}

/* ----------------------------------------------------------- registering */

/* Creates the two metatables and sets sqlite_open (and sqlite_version)
 * into the table on the stack. */
void lg_sqlite_register(lua_State *L) {
  static const luaL_Reg db_methods[] = {{"exec", l_db_exec},     {"prepare", l_db_prepare},
                                        {"changes", l_db_changes}, {"close", l_db_close},
                                        {NULL, NULL}};
  static const luaL_Reg stmt_methods[] = {{"run", l_stmt_run}, {"close", l_stmt_close}, {NULL, NULL}};
  lg_class_new(L, DB_MT, db_methods, l_db_close, l_db_close);
  lg_class_new(L, STMT_MT, stmt_methods, l_stmt_close, l_stmt_close);
  lua_pushcfunction(L, l_sqlite_open);
  lua_setfield(L, -2, "sqlite_open");
  lua_pushstring(L, sqlite3_libversion());
  lua_setfield(L, -2, "sqlite_version");
  lg_sqlite_writer_register(L);
}
