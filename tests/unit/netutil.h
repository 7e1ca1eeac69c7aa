/*
 * netutil.h: loopback helpers for the multi-process tests: a free port, and a peer that sends
 * random bytes.
 */
#ifndef ZS_TEST_NETUTIL_H
#define ZS_TEST_NETUTIL_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

/* A port on 127.0.0.1 that was free a moment ago (-1 on failure). */
static inline int zs_test_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

/* Connects to 127.0.0.1:port, sends 4 KiB of pseudo-random bytes and reads until the peer
 * closes (or wait_s seconds pass).  Returns 1 if the peer closed the connection, else 0. */
static inline int zs_test_send_garbage(int port, uint64_t seed, int wait_s)
{
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        if (fd >= 0)
            close(fd);
        return 0;
    }
    uint8_t noise[4096];
    for (size_t i = 0; i < sizeof noise; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        noise[i] = (uint8_t)(seed >> 56);
    }
    ssize_t w = write(fd, noise, sizeof noise);
    (void)w;
    struct timeval tv = {.tv_sec = wait_s};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char buf[4096];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0)
        ; /* an error frame may come first */
    close(fd);
    return n == 0 || (n < 0 && errno == ECONNRESET);
}

/* The port of "HOST:PORT" or "tcp://HOST:PORT". */
static inline int zs_test_port_of(const char *endpoint)
{
    const char *colon = strrchr(endpoint, ':');
    return colon ? atoi(colon + 1) : -1;
}

#endif
