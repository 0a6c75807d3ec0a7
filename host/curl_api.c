/* libcurl loaded on first use; see curl_api.h. */
#include "curl_api.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <uv.h>

/* The process's libcurl, written once under uv_once and read-only after.
 * They are process-wide on purpose, three of the C core's four such
 * variables (the fourth is the stop signals' loop, loop.c): libcurl is
 * loaded once per process, and curl_global_init must run once per process,
 * before any other curl call and on no other thread at the same time
 * (libcurl's own design), so every loop and Lua state shares what it gives. */
static uv_once_t once = UV_ONCE_INIT;
static lg_curl_api api;
static char load_err[256]; /* why loading failed; empty when it did not */

/* Resolves symbol `name` into *slot; 0 or -1 (with load_err set). */
static int sym(void *lib, const char *name, void *slot) {
  void *p = dlsym(lib, name);
  if (!p) {
    snprintf(load_err, sizeof load_err, "libcurl has no %s", name);
    return -1;
  }
  memcpy(slot, &p, sizeof p);
  return 0;
}

/* Opens libcurl (the soname the build linked against, then the plain
 * name), resolves every function and runs curl_global_init. */
static void load(void) {
  static const char *const names[] = {"libcurl.so.4", "libcurl.so"};
  void *lib = NULL;
  for (size_t i = 0; i < sizeof names / sizeof *names && !lib; i++)
    lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    snprintf(load_err, sizeof load_err, "cannot load libcurl: %s", dlerror());
    return;
  }
  lg_curl_api a;
  if (sym(lib, "curl_global_init", &a.global_init) || sym(lib, "curl_version_info", &a.version_info) ||
      sym(lib, "curl_easy_init", &a.easy_init) || sym(lib, "curl_easy_setopt", &a.easy_setopt) ||
      sym(lib, "curl_easy_getinfo", &a.easy_getinfo) || sym(lib, "curl_easy_pause", &a.easy_pause) ||
      sym(lib, "curl_easy_cleanup", &a.easy_cleanup) ||
      sym(lib, "curl_easy_strerror", &a.easy_strerror) || sym(lib, "curl_multi_init", &a.multi_init) ||
      sym(lib, "curl_multi_setopt", &a.multi_setopt) ||
      sym(lib, "curl_multi_add_handle", &a.multi_add_handle) ||
      sym(lib, "curl_multi_remove_handle", &a.multi_remove_handle) ||
      sym(lib, "curl_multi_assign", &a.multi_assign) ||
      sym(lib, "curl_multi_socket_action", &a.multi_socket_action) ||
      sym(lib, "curl_multi_info_read", &a.multi_info_read) ||
      sym(lib, "curl_multi_cleanup", &a.multi_cleanup) || sym(lib, "curl_slist_append", &a.slist_append) ||
      sym(lib, "curl_slist_free_all", &a.slist_free_all))
    return;
  if (a.global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
    snprintf(load_err, sizeof load_err, "curl_global_init failed");
    return;
  }
  api = a;
}

/* Loads libcurl on the process's first call: its functions (the process's,
 * read-only), or NULL and *err a message in the process's buffer. */
const lg_curl_api *lg_curl_load(const char **err) {
  uv_once(&once, load);
  if (load_err[0]) {
    if (err) *err = load_err;
    return NULL;
  }
  return &api;
}

/* The loaded functions, once lg_curl_load succeeded. */
const lg_curl_api *lg_curl(void) { return &api; }
