/* Whether a TCP connection to one address reaches a socket bound to
 * another: the test the virtual clock uses to tell a transfer to this
 * loop's own server from one to a peer outside the process. Pure C. */
#ifndef LG_ADDR_H
#define LG_ADDR_H

#include <sys/socket.h>

/* True when a connection to `peer` (IPv4 or IPv6) is accepted by a socket
 * listening on `bound`: same port, and the same address, or `bound` is a
 * wildcard (0.0.0.0, ::) and `peer` a loopback address of its family.
 * IPv4-mapped IPv6 addresses count as IPv4. Exact, given that nobody else can listen on an
 * address and port a socket of ours is bound to (no SO_REUSEPORT); a
 * wildcard listener reached through one of the host's other addresses
 * reads as not reached, which only makes the clock wait for it. */
int lg_addr_reaches(const struct sockaddr *bound, const struct sockaddr *peer);

#endif
