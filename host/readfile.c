/* core.read_file(path, max_bytes) -> the whole file, or nil and an error
 * record (kind usage, message "path: why", reason = "missing" |
 * "not_regular" | "too_large" | "changed" | "unreadable").
 *
 * For files that arrive by name in a folder user code fills (tool files): a
 * FIFO named x.lua would block the loop in open() or read() for good, a
 * link to /dev/zero would be read until memory runs out, a huge file would
 * hold the loop while it is read. So the file's type and size are checked
 * before it is opened (links followed: the target must be a regular file,
 * so a device found there is not opened, since opening some has effects),
 * checked again on the open descriptor (the name may have been swapped
 * meanwhile: a device swapped in between the stat and the open is opened,
 * then refused unread; the open never waits, O_NONBLOCK, and O_NOCTTY
 * keeps a terminal from becoming ours), and the read stops one byte past
 * what the check allowed. The bytes read must be as many as the open
 * file's size: a file that grew or shrank meanwhile is "changed", never
 * returned cut. Synchronous: max_bytes bounds its time too. */
#include "readfile.h"

#include <errno.h>
#include <fcntl.h>
#include <lauxlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errors.h"

/* What a file that is not regular is, for messages. */
static const char *type_name(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "an unknown kind of file";
}

/* Pushes nil and the record for the message on top of the stack; returns 2. */
static int fail(lua_State *L, const char *reason) {
  const char *message = lua_tostring(L, -1);
  lua_pushnil(L);
  lg_error_push(L, LG_ERR_USAGE, message);
  lua_pushstring(L, reason);
  lua_setfield(L, -2, "reason");
  return 2;
}

static int fail_errno(lua_State *L, const char *path, int err) {
  lua_pushfstring(L, "%s: %s", path, strerror(err));
  return fail(L, err == ENOENT || err == ENOTDIR ? "missing" : "unreadable");
}

static int fail_type(lua_State *L, const char *path, mode_t mode) {
  lua_pushfstring(L, "%s: not a regular file (%s)", path, type_name(mode));
  return fail(L, "not_regular");
}

static int fail_size(lua_State *L, const char *path, lua_Integer size, lua_Integer max) {
  lua_pushfstring(L, "%s: the file is %I bytes; at most %I are read", path, size, max);
  return fail(L, "too_large");
}

static int l_read_file(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  lua_Integer max = luaL_checkinteger(L, 2);
  luaL_argcheck(L, max >= 0, 2, "max_bytes must be >= 0");
  struct stat st;
  if (stat(path, &st) != 0) return fail_errno(L, path, errno);
  if (!S_ISREG(st.st_mode)) return fail_type(L, path, st.st_mode);
  if ((lua_Integer)st.st_size > max) return fail_size(L, path, (lua_Integer)st.st_size, max);
  /* the buffer first: a memory error raises before a descriptor exists.
   * One byte more than the size tells a file that grew. */
  size_t cap = (size_t)st.st_size + 1;
  luaL_Buffer b;
  char *buf = luaL_buffinitsize(L, &b, cap);
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) return fail_errno(L, path, errno);
  struct stat now;
  if (fstat(fd, &now) != 0) {
    int err = errno;
    close(fd);
    return fail_errno(L, path, err);
  }
  if (!S_ISREG(now.st_mode)) { /* swapped since the stat */
    close(fd);
    return fail_type(L, path, now.st_mode);
  }
  size_t n = 0;
  while (n < cap) {
    ssize_t r = read(fd, buf + n, cap - n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      int err = errno;
      close(fd);
      return fail_errno(L, path, err);
    }
    if (r == 0) break;
    n += (size_t)r;
  }
  close(fd);
  if ((lua_Integer)n > max) { /* it grew past the bound since the stat */
    lua_Integer size = (lua_Integer)now.st_size > (lua_Integer)n ? (lua_Integer)now.st_size : (lua_Integer)n;
    return fail_size(L, path, size, max);
  }
  if (n == cap || (lua_Integer)n != (lua_Integer)now.st_size) { /* grew, or shrank */
    lua_pushfstring(L, "%s: the file changed while it was read", path);
    return fail(L, "changed");
  }
  luaL_pushresultsize(&b, n);
  return 1;
}

void lg_readfile_register(lua_State *L) {
  lua_pushcfunction(L, l_read_file);
  lua_setfield(L, -2, "read_file");
}
