/* Benchmark floor (not a test): the least a client can do per streamed
 * chunk. libcurl easy handle (one connection, reused), POSTs R requests to
 * bench/stream_server.lua one after another and counts SSE events ("\n\n")
 * with memchr only: no parsing, no JSON. Reports the CPU this process used
 * for them; one warm-up request (the connection) is not measured. Prints one
 * line: "floor chunks=<events> cpu=<s>".
 * Build: cc -std=c11 -O2 bench/floor_client.c -lcurl -o build/bench/floor_client
 * Run:   build/bench/floor_client URL R */
#define _POSIX_C_SOURCE 200809L
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
  long events;   /* "\n\n" seen */
  int last_lf;   /* the previous piece ended with '\n' */
} counter;

/* CPU seconds used by this process. */
static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Write callback: counts "\n\n", also when a pair straddles two pieces. */
static size_t on_body(char *data, size_t size, size_t nmemb, void *ud) {
  counter *c = ud;
  size_t len = size * nmemb;
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

/* Performs one request on the reused handle; exits on any failure. */
static void one(CURL *e) {
  CURLcode rc = curl_easy_perform(e);
  long status = 0;
  curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
  if (rc != CURLE_OK || status != 200) {
    fprintf(stderr, "floor_client: %s, HTTP %ld\n", curl_easy_strerror(rc), status);
    exit(1);
  }
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: floor_client URL R\n");
    return 2;
  }
  long r = strtol(argv[2], NULL, 10);
  char url[512];
  snprintf(url, sizeof url, "%s/chat/completions", argv[1]);
  static const char body[] =
      "{\"model\":\"bench\",\"messages\":[{\"role\":\"user\",\"content\":\"Say something.\"}],"
      "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"max_completion_tokens\":4096}";

  curl_global_init(CURL_GLOBAL_DEFAULT);
  CURL *e = curl_easy_init();
  struct curl_slist *h = NULL;
  h = curl_slist_append(h, "content-type: application/json");
  h = curl_slist_append(h, "accept: text/event-stream");
  h = curl_slist_append(h, "authorization: Bearer x");
  h = curl_slist_append(h, "Expect:");
  counter c = {0, 0};
  curl_easy_setopt(e, CURLOPT_URL, url);
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
  curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
  curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE, (long)(sizeof body - 1));
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, &c);
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);

  one(e);
  c.events = 0;
  c.last_lf = 0;
  double t0 = cpu_now();
  for (long i = 0; i < r; i++) one(e);
  double cpu = cpu_now() - t0;
  printf("floor chunks=%ld cpu=%.4f\n", c.events, cpu);

  curl_slist_free_all(h);
  curl_easy_cleanup(e);
  curl_global_cleanup();
  return 0;
}
