/* Lines from standard input on the loop: core.line_reader{...} (the REPL of
 * `luagent chat`, lua/luagent/cli/chat.lua).
 *
 * On a terminal (stdin and stdout both are one, unless edit = false) a line
 * is edited with libedit (BSD editline: emacs keys, ~/.editrc, history kept
 * in a file), one character at a time: libedit's unbuffered mode, the way
 * its readline-compatible callback interface (rl_callback_read_char) drives
 * it, but through its own EditLine handle, so the reader holds all of its
 * state and no global of libedit's readline emulation is used. The loop
 * polls stdin; each time it is readable, el_gets() takes what came, and a
 * task waiting in reader:read() is woken once the line is done. Between two
 * reads the terminal is back in its own (cooked) mode, so what the REPL
 * prints while it answers, and a Ctrl-C, act as usual. libedit is told not
 * to catch signals (its handler would send them on to the whole process
 * group): SIGINT is the loop's (host/loop.c, sigint_trap), and the window
 * size is followed with a SIGWINCH watcher of libuv's.
 *
 * From a pipe or a file the lines are read as they are (no prompt, no
 * echo): a pipe through the same poll, a regular file or a device that
 * cannot be polled (/dev/null) by plain reads, which never wait long.
 *
 * reader:read([prompt]) -> line (without its newline) | nil (end of input)
 *   | nil, "interrupted", typed (reader:interrupt() from another task: the
 *   line being edited, `typed`, is dropped; "" from a pipe). Suspends under the suspension contract; a
 *   cancelled read gives the terminal back and raises `cancelled`.
 * reader:interrupt() -> whether a read was waiting (and is now ended).
 * reader:add_history(line): the line goes into the history (and its file).
 * reader:close(): gives the terminal back, saves the history; idempotent.
 * reader.edit: whether lines are edited (a terminal).
 *
 * Ownership: the reader userdata owns the EditLine and the history; the
 * poll and signal handles are in a heap block of their own, freed by their
 * close callbacks, which a reader closed (or collected) first detaches. */
#include "line_lua.h"

#include "core.h"
#include "loop.h"

#include <errno.h>
#include <histedit.h>
#include <lauxlib.h>
#include <langinfo.h>
#include <locale.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>
#include <wchar.h>

#define READER_MT "luagent.LineReader"
#define MAX_LINE (1 << 20) /* a plain line longer than this is handed out in pieces */

typedef struct reader reader;

/* The libuv handles: freed once both close callbacks ran. */
typedef struct {
  uv_poll_t poll;
  uv_signal_t winch;
  reader *r;  /* NULL once the reader let go */
  int open;   /* handles not yet closed */
} handles;

struct reader {
  lg_wait w;
  lg_loop *loop;
  handles *hs;      /* NULL: stdin cannot be polled (a regular file) or closed */
  int polling;
  int waiting;      /* a task waits in read() */
  int done;         /* the read in progress ended: line, eof or interrupt */
  int interrupted;
  int eof;
  int edit;
  int closed;
  int real;         /* counted in lg_loop_real while polling */
  EditLine *el;
  History *hist;
  char *history_file;
  char *prompt;
  char *buf;        /* plain mode: bytes read, not yet handed out */
  size_t len, cap;
  char *line;       /* edit mode: the finished line */
  size_t line_len;
};

static reader *check_reader(lua_State *L) {
  reader *r = luaL_checkudata(L, 1, READER_MT);
  if (r->closed) luaL_error(L, "read: the line reader is closed");
  return r;
}

/* ------------------------------------------------------------- polling */

static void poll_stop(reader *r) {
  if (!r->polling) return;
  r->polling = 0;
  uv_poll_stop(&r->hs->poll);
  if (r->real) {
    lg_loop_real(r->loop, -1);
    r->real = 0;
  }
}

static void poll_cb(uv_poll_t *p, int status, int events);

static int poll_start(reader *r) {
  if (r->polling) return 0;
  if (uv_poll_start(&r->hs->poll, UV_READABLE, poll_cb) != 0) return -1;
  r->polling = 1;
  /* input comes from outside: virtual time follows real time meanwhile */
  lg_loop_real(r->loop, 1);
  r->real = 1;
  return 0;
}

/* Ends the read in progress: the poll stops, the task is woken. */
static void finish_read(reader *r) {
  poll_stop(r);
  r->done = 1;
  if (r->waiting) lg_task_wake(&r->w);
}

static int append(reader *r, const char *p, size_t n) {
  if (r->len + n > r->cap) {
    size_t cap = r->cap ? r->cap : 4096;
    while (cap < r->len + n) cap *= 2;
    char *b = realloc(r->buf, cap);
    if (!b) return -1;
    r->buf = b;
    r->cap = cap;
  }
  memcpy(r->buf + r->len, p, n);
  r->len += n;
  return 0;
}

/* Plain mode: whether a whole line (or a long piece) is buffered. */
static int have_line(reader *r) {
  return (r->len > 0 && memchr(r->buf, '\n', r->len)) || r->len >= MAX_LINE;
}

/* Plain mode: reads what is there; 0, or -1 at the end of input. */
static int fill(reader *r) {
  char chunk[65536];
  ssize_t n;
  do n = read(0, chunk, sizeof chunk);
  while (n < 0 && errno == EINTR);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
  if (n <= 0 || append(r, chunk, (size_t)n) != 0) return -1;
  return 0;
}

/* Edit mode: one step of libedit; the line is done at a newline, the input
 * ends at Ctrl-D on an empty line or when the terminal goes away. */
static void edit_step(reader *r) {
  int count = 0;
  const char *s = el_gets(r->el, &count);
  if (!s || count <= 0) {
    r->eof = 1;
  } else if (count == 1 && s[0] == 4) { /* Ctrl-D on an empty line: libedit's EOF in this mode */
    r->eof = 1;
  } else if (s[count - 1] == '\n' || s[count - 1] == '\r') {
    free(r->line);
    r->line = malloc((size_t)count);
    if (!r->line) {
      r->eof = 1;
    } else {
      memcpy(r->line, s, (size_t)count - 1);
      r->line[count - 1] = '\0';
      r->line_len = (size_t)count - 1;
    }
  } else {
    return; /* the line goes on */
  }
  el_set(r->el, EL_UNBUFFERED, 0); /* the terminal back in its own mode */
  if (r->eof) fputs("\n", stdout), fflush(stdout);
  finish_read(r);
}

static void poll_cb(uv_poll_t *p, int status, int events) {
  (void)events;
  handles *hs = p->data;
  reader *r = hs->r;
  if (!r || !r->polling) return;
  lg_loop_activity(r->loop);
  if (status < 0) { /* the descriptor failed: the input ends */
    r->eof = 1;
    if (r->edit) el_set(r->el, EL_UNBUFFERED, 0);
    finish_read(r);
    return;
  }
  if (r->edit) {
    edit_step(r);
    return;
  }
  if (fill(r) != 0) r->eof = 1;
  if (r->eof || have_line(r)) finish_read(r);
}

static void winch_cb(uv_signal_t *s, int sig) {
  (void)sig;
  handles *hs = s->data;
  if (hs->r && hs->r->el) el_resize(hs->r->el);
}

static void handle_closed(uv_handle_t *h) {
  handles *hs = h->data;
  if (--hs->open == 0) free(hs);
}

/* ------------------------------------------------------------- reading */

/* Pushes the next line of the buffer (plain mode), or the rest at the end
 * of input; returns the number of values pushed (0: none buffered). */
static int push_buffered(lua_State *L, reader *r) {
  if (r->len == 0) return 0;
  char *nl = memchr(r->buf, '\n', r->len);
  size_t n;
  if (nl) n = (size_t)(nl - r->buf);
  else if (r->eof || r->len >= MAX_LINE) n = r->len > MAX_LINE ? MAX_LINE : r->len;
  else return 0;
  size_t take = nl ? n + 1 : n;
  size_t shown = n;
  if (shown > 0 && r->buf[shown - 1] == '\r') shown--; /* a CRLF line */
  lua_pushlstring(L, r->buf, shown);
  memmove(r->buf, r->buf + take, r->len - take);
  r->len -= take;
  return 1;
}

static int read_result(lua_State *L, reader *r) {
  r->waiting = 0;
  r->done = 0;
  if (r->interrupted) {
    r->interrupted = 0;
    lua_pushnil(L);
    lua_pushliteral(L, "interrupted");
    if (r->edit && r->line) lua_pushlstring(L, r->line, r->line_len);
    else lua_pushliteral(L, "");
    free(r->line);
    r->line = NULL;
    return 3;
  }
  if (r->edit) {
    if (r->line) {
      lua_pushlstring(L, r->line, r->line_len);
      free(r->line);
      r->line = NULL;
      return 1;
    }
    lua_pushnil(L);
    return 1;
  }
  if (push_buffered(L, r)) return 1;
  lua_pushnil(L);
  return 1;
}

static int read_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  (void)ctx;
  return read_result(L, luaL_checkudata(L, 1, READER_MT));
}

static void read_cancel(lg_wait *w) {
  reader *r = (reader *)w;
  poll_stop(r);
  r->waiting = 0;
  r->done = 0;
  if (r->edit && !r->closed) {
    el_set(r->el, EL_UNBUFFERED, 0);
    fputs("\n", stdout);
    fflush(stdout);
  }
}

static char *prompt_of(EditLine *el) {
  void *data = NULL;
  el_get(el, EL_CLIENTDATA, &data);
  reader *r = data;
  return r && r->prompt ? r->prompt : "";
}

/* reader:read([prompt]) -> line | nil | nil, "interrupted" */
static int l_read(lua_State *L) {
  reader *r = check_reader(L);
  const char *prompt = luaL_optstring(L, 2, "");
  lua_settop(L, 1);
  if (r->waiting) return luaL_error(L, "read: another task is reading");
  if (!r->edit) {
    if (push_buffered(L, r)) return 1;
    if (r->eof) {
      lua_pushnil(L);
      return 1;
    }
    if (!r->hs) { /* a regular file: plain reads do not wait long */
      while (!r->eof && !have_line(r))
        if (fill(r) != 0) r->eof = 1;
      return read_result(L, r);
    }
  } else {
    if (r->eof) {
      lua_pushnil(L);
      return 1;
    }
    char *p = strdup(prompt);
    if (!p) return luaL_error(L, "read: out of memory");
    free(r->prompt);
    r->prompt = p;
    fflush(stdout);
    el_set(r->el, EL_UNBUFFERED, 1); /* the terminal in libedit's mode; the prompt shows */
  }
  r->done = 0;
  r->interrupted = 0;
  if (poll_start(r) != 0) {
    if (r->edit) el_set(r->el, EL_UNBUFFERED, 0);
    return luaL_error(L, "read: cannot watch standard input");
  }
  r->waiting = 1;
  memset(&r->w, 0, sizeof r->w);
  r->w.cancel = read_cancel;
  return lg_task_suspend(L, &r->w, 0, read_k);
}

/* reader:interrupt() -> true when a read was waiting: it returns nil,
 * "interrupted" and the line being edited is dropped. */
static int l_interrupt(lua_State *L) {
  reader *r = luaL_checkudata(L, 1, READER_MT);
  if (r->closed || !r->waiting || r->done) {
    lua_pushboolean(L, 0);
    return 1;
  }
  if (r->edit) {
    /* the text typed so far: the caller tells a dropped line from an empty prompt */
    const LineInfo *li = el_line(r->el);
    size_t n = li && li->lastchar > li->buffer ? (size_t)(li->lastchar - li->buffer) : 0;
    free(r->line);
    r->line = malloc(n + 1);
    if (r->line) {
      if (n) memcpy(r->line, li->buffer, n);
      r->line[n] = '\0';
      r->line_len = n;
    }
    el_set(r->el, EL_UNBUFFERED, 0);
  }
  r->interrupted = 1;
  finish_read(r);
  lua_pushboolean(L, 1);
  return 1;
}

/* reader:add_history(line): into the history, and its file when it has one. */
static int l_add_history(lua_State *L) {
  reader *r = check_reader(L);
  const char *line = luaL_checkstring(L, 2);
  if (!r->hist || !*line) return 0;
  HistEvent ev;
  history(r->hist, &ev, H_ENTER, line);
  if (r->history_file) history(r->hist, &ev, H_SAVE, r->history_file);
  return 0;
}

static void reader_close(reader *r) {
  if (r->closed) return;
  r->closed = 1;
  if (r->hs) {
    if (r->polling) poll_stop(r);
    r->hs->r = NULL;
    uv_close((uv_handle_t *)&r->hs->poll, handle_closed);
    if (r->hs->open == 2) uv_close((uv_handle_t *)&r->hs->winch, handle_closed);
    r->hs = NULL;
  }
  if (r->el) {
    el_set(r->el, EL_UNBUFFERED, 0);
    el_end(r->el);
    r->el = NULL;
  }
  if (r->hist) {
    history_end(r->hist);
    r->hist = NULL;
  }
  free(r->history_file);
  free(r->prompt);
  free(r->buf);
  free(r->line);
  r->history_file = r->prompt = r->buf = r->line = NULL;
}

static int l_close(lua_State *L) {
  reader *r = luaL_checkudata(L, 1, READER_MT);
  reader_close(r);
  return 0;
}

static int l_gc(lua_State *L) {
  reader *r = luaL_checkudata(L, 1, READER_MT);
  /* at lua_close the reader goes before the loop (made before it), whose
   * own close then runs the handles' close callbacks */
  reader_close(r);
  return 0;
}

static int l_index(lua_State *L) {
  reader *r = luaL_checkudata(L, 1, READER_MT);
  const char *k = luaL_checkstring(L, 2);
  if (strcmp(k, "edit") == 0) {
    lua_pushboolean(L, r->edit);
    return 1;
  }
  luaL_getmetatable(L, READER_MT);
  lua_getfield(L, -1, "methods");
  lua_getfield(L, -1, k);
  return 1;
}

/* A UTF-8 LC_CTYPE, so libedit edits characters, not bytes: the
 * environment's, else C.UTF-8. */
static void utf8_ctype(void) {
  const char *cur = setlocale(LC_CTYPE, NULL);
  if (cur && strcmp(cur, "C") != 0 && strcmp(cur, "POSIX") != 0) return;
  if (setlocale(LC_CTYPE, "") && strcmp(nl_langinfo(CODESET), "UTF-8") == 0) return;
  if (!setlocale(LC_CTYPE, "C.UTF-8")) setlocale(LC_CTYPE, "C");
}

/* line_reader{edit=, history=FILE, history_size=N, name=} -> reader, reading
 * standard input. edit: true to edit lines (stdin and stdout must be a
 * terminal), false for plain lines; by default, whether both are one. */
static int l_line_reader(lua_State *L) {
  lua_settop(L, 1);
  if (!lua_isnoneornil(L, 1)) luaL_checktype(L, 1, LUA_TTABLE);
  int tty = isatty(0) && isatty(1);
  int edit = tty;
  const char *hfile = NULL, *name = "luagent";
  lua_Integer hsize = 1000;
  if (lua_istable(L, 1)) {
    if (lua_getfield(L, 1, "edit") != LUA_TNIL) edit = lua_toboolean(L, -1);
    lua_pop(L, 1);
    if (lua_getfield(L, 1, "history") != LUA_TNIL) hfile = luaL_checkstring(L, -1);
    lua_pop(L, 1);
    if (lua_getfield(L, 1, "history_size") != LUA_TNIL) hsize = luaL_checkinteger(L, -1);
    lua_pop(L, 1);
    if (lua_getfield(L, 1, "name") != LUA_TNIL) name = luaL_checkstring(L, -1);
    lua_pop(L, 1);
  }
  if (edit && !tty) return luaL_error(L, "line_reader: edit = true needs a terminal on stdin and stdout");
  if (hsize < 1 || hsize > 1000000) return luaL_error(L, "line_reader: history_size must be 1 to 1000000");
  lg_loop *loop = lg_loop_get(L);
  reader *r = lua_newuserdatauv(L, sizeof *r, 1);
  memset(r, 0, sizeof *r);
  r->closed = 1; /* closed until made whole: __gc is safe */
  luaL_setmetatable(L, READER_MT);
  r->loop = loop;
  r->closed = 0;
  handles *hs = calloc(1, sizeof *hs);
  if (!hs) return luaL_error(L, "line_reader: out of memory");
  if (uv_poll_init(lg_loop_uv(loop), &hs->poll, 0) == 0) {
    hs->poll.data = hs;
    hs->r = r;
    hs->open = 1; /* active only while a read waits */
    r->hs = hs;
  } else {
    free(hs); /* a regular file, /dev/null: read as it is */
    if (edit) return luaL_error(L, "line_reader: cannot watch standard input");
  }
  if (edit) {
    utf8_ctype();
    r->edit = 1;
    r->el = el_init(name, stdin, stdout, stderr);
    if (!r->el) {
      reader_close(r);
      return luaL_error(L, "line_reader: libedit could not start on this terminal");
    }
    el_set(r->el, EL_CLIENTDATA, r);
    el_set(r->el, EL_SIGNAL, 0); /* SIGINT is the loop's; SIGWINCH below */
    el_set(r->el, EL_EDITOR, "emacs");
    el_set(r->el, EL_PROMPT, prompt_of);
    r->hist = history_init();
    if (r->hist) {
      HistEvent ev;
      history(r->hist, &ev, H_SETSIZE, (int)hsize);
      history(r->hist, &ev, H_SETUNIQUE, 1);
      el_set(r->el, EL_HIST, history, r->hist);
      if (hfile) {
        r->history_file = strdup(hfile);
        history(r->hist, &ev, H_LOAD, hfile); /* none yet: an empty history */
      }
    }
    el_source(r->el, NULL); /* the user's ~/.editrc, if any */
    if (uv_signal_init(lg_loop_uv(loop), &hs->winch) == 0) {
      hs->winch.data = hs;
      hs->open = 2;
      uv_signal_start(&hs->winch, winch_cb, SIGWINCH);
      uv_unref((uv_handle_t *)&hs->winch);
    }
  }
  return 1;
}

/* terminal_size([fd]) -> columns, rows of the terminal on fd (default 1), or nil. */
static int l_terminal_size(lua_State *L) {
  int fd = (int)luaL_optinteger(L, 1, 1);
  struct winsize ws;
  if (ioctl(fd, TIOCGWINSZ, &ws) != 0 || ws.ws_col == 0) return 0;
  lua_pushinteger(L, ws.ws_col);
  lua_pushinteger(L, ws.ws_row);
  return 2;
}

/* text_width(s) -> the columns `s` takes on a terminal (UTF-8; a wide
 * character takes two, a combining one none, an invalid byte one). No
 * control character is counted: the caller lays out lines and escapes. */
static int l_text_width(lua_State *L) {
  size_t len;
  const char *s = luaL_checklstring(L, 1, &len);
  utf8_ctype();
  lua_Integer cols = 0;
  mbstate_t st;
  memset(&st, 0, sizeof st);
  size_t i = 0;
  while (i < len) {
    unsigned char c = (unsigned char)s[i];
    if (c < 0x80) {
      cols += c >= 0x20 && c != 0x7f;
      i++;
      continue;
    }
    wchar_t wc;
    size_t n = mbrtowc(&wc, s + i, len - i, &st);
    if (n == (size_t)-1 || n == (size_t)-2 || n == 0) {
      memset(&st, 0, sizeof st);
      cols++;
      i++;
      continue;
    }
    int w = wcwidth(wc);
    cols += w < 0 ? 1 : w;
    i += n;
  }
  lua_pushinteger(L, cols);
  return 1;
}

void lg_line_register(lua_State *L) {
  static const luaL_Reg methods[] = {
      {"read", l_read},   {"interrupt", l_interrupt}, {"add_history", l_add_history},
      {"close", l_close}, {NULL, NULL}};
  if (luaL_newmetatable(L, READER_MT)) {
    lua_newtable(L);
    luaL_setfuncs(L, methods, 0);
    lua_setfield(L, -2, "methods");
    lua_pushcfunction(L, l_index);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, l_close);
    lua_setfield(L, -2, "__close");
    lua_pushcfunction(L, l_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);
  lua_pushcfunction(L, l_line_reader);
  lua_setfield(L, -2, "line_reader");
  lua_pushcfunction(L, l_terminal_size);
  lua_setfield(L, -2, "terminal_size");
  lua_pushcfunction(L, l_text_width);
  lua_setfield(L, -2, "text_width");
}
