/* libcurl, loaded on first use: the executable does not link it, so a
 * script that makes no request never pays for loading libcurl and its
 * TLS, GSSAPI and LDAP dependencies (most of luagent's start-up time).
 * lg_curl_load() opens it once per process and runs curl_global_init;
 * after that, CURLFN(name) calls curl_<name>. */
#ifndef LG_CURL_API_H
#define LG_CURL_API_H

#define CURL_DISABLE_TYPECHECK /* calls go through the pointers below */
#include <curl/curl.h>

typedef struct {
  CURLcode (*global_init)(long);
  curl_version_info_data *(*version_info)(CURLversion);
  CURL *(*easy_init)(void);
  CURLcode (*easy_setopt)(CURL *, CURLoption, ...);
  CURLcode (*easy_getinfo)(CURL *, CURLINFO, ...);
  CURLcode (*easy_pause)(CURL *, int);
  void (*easy_cleanup)(CURL *);
  const char *(*easy_strerror)(CURLcode);
  CURLM *(*multi_init)(void);
  CURLMcode (*multi_setopt)(CURLM *, CURLMoption, ...);
  CURLMcode (*multi_add_handle)(CURLM *, CURL *);
  CURLMcode (*multi_remove_handle)(CURLM *, CURL *);
  CURLMcode (*multi_assign)(CURLM *, curl_socket_t, void *);
  CURLMcode (*multi_socket_action)(CURLM *, curl_socket_t, int, int *);
  CURLMsg *(*multi_info_read)(CURLM *, int *);
  CURLMcode (*multi_cleanup)(CURLM *);
  struct curl_slist *(*slist_append)(struct curl_slist *, const char *);
  void (*slist_free_all)(struct curl_slist *);
} lg_curl_api;

/* Loads libcurl and initializes it, once per process (thread-safe). Returns
 * the functions, or NULL and sets *err to a static message. */
const lg_curl_api *lg_curl_load(const char **err);

/* The loaded functions; only after lg_curl_load() succeeded. */
const lg_curl_api *lg_curl(void);
#define CURLFN(name) (lg_curl()->name)

#endif
