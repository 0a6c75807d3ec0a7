/* See addr.h. */
#include "addr.h"

#include <netinet/in.h>
#include <string.h>

/* An address reduced to what decides where a connection goes. */
typedef struct {
  int family;                 /* AF_INET or AF_INET6; 0: neither */
  unsigned char bytes[16];    /* 4 for IPv4 */
  unsigned port;
} endpoint;

static const unsigned char V4_MAPPED[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

static endpoint endpoint_of(const struct sockaddr *sa) {
  endpoint e;
  memset(&e, 0, sizeof e);
  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
    e.family = AF_INET;
    memcpy(e.bytes, &in->sin_addr, 4);
    e.port = ntohs(in->sin_port);
  } else if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
    const unsigned char *b = (const unsigned char *)&in6->sin6_addr;
    e.port = ntohs(in6->sin6_port);
    if (memcmp(b, V4_MAPPED, sizeof V4_MAPPED) == 0) {
      e.family = AF_INET;
      memcpy(e.bytes, b + 12, 4);
    } else {
      e.family = AF_INET6;
      memcpy(e.bytes, b, 16);
    }
  }
  return e;
}

static int is_wildcard(const endpoint *e) {
  static const unsigned char zero[16];
  return memcmp(e->bytes, zero, e->family == AF_INET ? 4 : 16) == 0;
}

static int is_loopback(const endpoint *e) {
  static const unsigned char v6_loopback[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  if (e->family == AF_INET) return e->bytes[0] == 127;
  return memcmp(e->bytes, v6_loopback, 16) == 0;
}

int lg_addr_reaches(const struct sockaddr *bound, const struct sockaddr *peer) {
  endpoint b = endpoint_of(bound), p = endpoint_of(peer);
  if (!b.family || !p.family || b.port != p.port || b.port == 0) return 0;
  if (b.family == p.family && memcmp(b.bytes, p.bytes, b.family == AF_INET ? 4 : 16) == 0) return 1;
  /* the same family only: whether :: also takes IPv4 depends on a sysctl
   * (bindv6only), and when it does not, another process may hold 0.0.0.0 */
  return b.family == p.family && is_wildcard(&b) && is_loopback(&p);
}
