/* Benchmark floors (not a test): the least a client can do per streamed
 * chunk. libcurl (connections reused) POSTs R requests to
 * bench/stream_server.lua, C of them at a time (one multi handle, C easy
 * handles), and per SSE event does either
 *   memchr: count events ("\n\n") with memchr only: no parsing, no JSON;
 *   cjson:  frame each event, decode its data payload with cJSON (built
 *           with -DFLOOR_CJSON, -lcjson) and count the chunks with
 *           choices[0].delta.content, as a client that looks at every chunk.
 * Reports the CPU this process used for them; one warm-up request (the
 * connection) is not measured. Prints one line:
 * "<mode> chunks=<events> text=<content chunks> cpu=<s>".
 * Build: cc -std=c11 -O2 bench/floor_client.c -lcurl -o build/bench/floor_client
 *   (add -DFLOOR_CJSON ... -lcjson for the cjson mode)
 * Run:   build/bench/floor_client URL R [memchr|cjson] [C] */
#define _POSIX_C_SOURCE 200809L
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef FLOOR_CJSON
#include <cjson/cJSON.h>
#endif

typedef struct {
  long events;   /* "\n\n" seen */
  long text;     /* cjson mode: chunks with delta content */
  int last_lf;   /* the previous piece ended with '\n' */
  int cjson;     /* decode every event's data */
  char *buf;     /* cjson mode: bytes of the event in progress */
  size_t len, cap;
} counter;

/* CPU seconds used by this process. */
static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

#ifdef FLOOR_CJSON
/* Decodes the data line of one event (`ev`, n bytes, without its blank
 * line) and counts it when it carries content text. */
static void decode_event(counter *c, const char *ev, size_t n) {
  if (n < 6 || memcmp(ev, "data: ", 6) != 0) return;
  ev += 6;
  n -= 6;
  if (n == 6 && memcmp(ev, "[DONE]", 6) == 0) return;
  cJSON *j = cJSON_ParseWithLength(ev, n);
  if (!j) {
    fprintf(stderr, "floor_client: bad JSON in an event\n");
    exit(1);
  }
  cJSON *choice = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "choices"), 0);
  cJSON *delta = cJSON_GetObjectItemCaseSensitive(choice, "delta");
  if (cJSON_IsString(cJSON_GetObjectItemCaseSensitive(delta, "content"))) c->text++;
  cJSON_Delete(j);
}
#endif

/* cjson mode: appends a piece to the event buffer and decodes every event
 * it completes, keeping the rest. */
static void frame(counter *c, const char *data, size_t len) {
#ifdef FLOOR_CJSON
  if (c->len + len > c->cap) {
    c->cap = (c->len + len) * 2;
    c->buf = realloc(c->buf, c->cap);
    if (!c->buf) exit(1);
  }
  memcpy(c->buf + c->len, data, len);
  c->len += len;
  size_t start = 0;
  for (;;) {
    const char *p = c->buf + start, *end = c->buf + c->len;
    const char *lf = NULL;
    for (const char *q = p; (q = memchr(q, '\n', (size_t)(end - q))) && q + 1 < end; q++) {
      if (q[1] == '\n') { lf = q; break; }
    }
    if (!lf) break;
    decode_event(c, p, (size_t)(lf - p));
    c->events++;
    start = (size_t)(lf + 2 - c->buf);
  }
  memmove(c->buf, c->buf + start, c->len - start);
  c->len -= start;
#else
  (void)c; (void)data; (void)len;
  fprintf(stderr, "floor_client: built without cJSON (-DFLOOR_CJSON)\n");
  exit(2);
#endif
}

/* Write callback: counts "\n\n", also when a pair straddles two pieces. */
static size_t on_body(char *data, size_t size, size_t nmemb, void *ud) {
  counter *c = ud;
  size_t len = size * nmemb;
  if (c->cjson) {
    frame(c, data, len);
    return len;
  }
  const char *p = data, *end = data + len;
  if (len > 0 && c->last_lf && data[0] == '\n') {
    c->events++;
    p++;
  }
  c->last_lf = 0;
  while (p < end) {
    const char *lf = memchr(p, '\n', (size_t)(end - p));
    if (!lf) break;
    if (lf + 1 == end) {
      c->last_lf = 1;
      break;
    }
    if (lf[1] == '\n') {
      c->events++;
      p = lf + 2;
    } else {
      p = lf + 1;
    }
  }
  return len;
}

static const char body[] =
    "{\"model\":\"bench\",\"messages\":[{\"role\":\"user\",\"content\":\"Say something.\"}],"
    "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"max_completion_tokens\":4096}";

/* A configured easy handle for one stream, writing into `c`. */
static CURL *make_easy(const char *url, struct curl_slist *h, counter *c) {
  CURL *e = curl_easy_init();
  curl_easy_setopt(e, CURLOPT_URL, url);
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
  curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
  curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE, (long)(sizeof body - 1));
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, c);
  curl_easy_setopt(e, CURLOPT_PRIVATE, (char *)c);
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  return e;
}

/* Exits unless a finished transfer succeeded with HTTP 200. */
static void check(CURL *e, CURLcode rc) {
  long status = 0;
  curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
  if (rc != CURLE_OK || status != 200) {
    fprintf(stderr, "floor_client: %s, HTTP %ld\n", curl_easy_strerror(rc), status);
    exit(1);
  }
}

/* Runs `r` requests, `conc` at a time, on one multi handle; the counters of
 * the `conc` streams are summed into `total`. */
static void run_multi(const char *url, struct curl_slist *h, long r, long conc, int cjson,
                      counter *total) {
  CURLM *m = curl_multi_init();
  curl_multi_setopt(m, CURLMOPT_MAXCONNECTS, conc);
  CURL **easy = calloc((size_t)conc, sizeof *easy);
  counter *cs = calloc((size_t)conc, sizeof *cs);
  long started = 0, running_n = 0;
  for (long i = 0; i < conc && started < r; i++, started++) {
    cs[i].cjson = cjson;
    easy[i] = make_easy(url, h, &cs[i]);
    curl_multi_add_handle(m, easy[i]);
    running_n++;
  }
  while (running_n > 0) {
    int still;
    curl_multi_perform(m, &still);
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(m, &left))) {
      if (msg->msg != CURLMSG_DONE) continue;
      CURL *e = msg->easy_handle;
      check(e, msg->data.result);
      curl_multi_remove_handle(m, e);
      if (started < r) { /* the next request on this handle */
        started++;
        curl_multi_add_handle(m, e);
      } else {
        running_n--;
      }
    }
    if (running_n > 0) curl_multi_poll(m, NULL, 0, 1000, NULL);
  }
  for (long i = 0; i < conc; i++) {
    total->events += cs[i].events;
    total->text += cs[i].text;
    free(cs[i].buf);
    if (easy[i]) curl_easy_cleanup(easy[i]);
  }
  free(cs);
  free(easy);
  curl_multi_cleanup(m);
}

int main(int argc, char **argv) {
  if (argc < 3 || argc > 5) {
    fprintf(stderr, "usage: floor_client URL R [memchr|cjson] [C]\n");
    return 2;
  }
  long r = strtol(argv[2], NULL, 10);
  const char *mode = argc > 3 ? argv[3] : "memchr";
  long conc = argc > 4 ? strtol(argv[4], NULL, 10) : 1;
  int cjson = strcmp(mode, "cjson") == 0;
  if ((!cjson && strcmp(mode, "memchr") != 0) || conc < 1 || r < 1) {
    fprintf(stderr, "usage: floor_client URL R [memchr|cjson] [C]\n");
    return 2;
  }
  char url[512];
  snprintf(url, sizeof url, "%s/chat/completions", argv[1]);

  curl_global_init(CURL_GLOBAL_DEFAULT);
  struct curl_slist *h = NULL;
  h = curl_slist_append(h, "content-type: application/json");
  h = curl_slist_append(h, "accept: text/event-stream");
  h = curl_slist_append(h, "authorization: Bearer x");
  h = curl_slist_append(h, "Expect:");
  counter c = {0};
  c.cjson = cjson;
  double cpu;
  if (conc == 1) {
    CURL *e = make_easy(url, h, &c);
    check(e, curl_easy_perform(e));
    c.events = c.text = 0;
    c.last_lf = 0;
    c.len = 0;
    double t0 = cpu_now();
    for (long i = 0; i < r; i++) check(e, curl_easy_perform(e));
    cpu = cpu_now() - t0;
    curl_easy_cleanup(e);
    free(c.buf);
  } else {
    double t0 = cpu_now();
    run_multi(url, h, r, conc, cjson, &c);
    cpu = cpu_now() - t0;
  }
  printf("%s chunks=%ld text=%ld cpu=%.4f\n", mode, c.events, c.text, cpu);

  curl_slist_free_all(h);
  curl_global_cleanup();
  return 0;
}
