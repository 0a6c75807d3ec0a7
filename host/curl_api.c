/* libcurl loaded on first use; see curl_api.h. */
#include "curl_api.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <uv.h>

/* Written once under uv_once, read-only after: the process's libcurl. */
static uv_once_t once = UV_ONCE_INIT;
static lg_curl_api api;
static const char *load_err;
static char load_msg[256];

/* Resolves symbol `name` into *slot; 0 or -1 (with load_msg set). */
static int sym(void *lib, const char *name, void *slot) {
  void *p = dlsym(lib, name);
  if (!p) {
    snprintf(load_msg, sizeof load_msg, "libcurl has no %s", name);
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
    snprintf(load_msg, sizeof load_msg, "cannot load libcurl: %s", dlerror());
    load_err = load_msg;
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
      sym(lib, "curl_slist_free_all", &a.slist_free_all)) {
    load_err = load_msg;
    return;
  }
  if (a.global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
    load_err = "curl_global_init failed";
    return;
  }
  api = a;
}

const lg_curl_api *lg_curl_load(const char **err) {
  uv_once(&once, load);
  if (load_err) {
    if (err) *err = load_err;
    return NULL;
  }
  return &api;
}

const lg_curl_api *lg_curl(void) { return &api; }
