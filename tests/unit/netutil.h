/*
 * netutil.h: loopback helpers for the multi-process tests: a free port, a wait until a port
 * accepts connections, a peer that sends random bytes, and what /proc says about a loopback
 * connection (whether a process accepted it, read what was sent, still holds it), so that a
 * test waits for the event it means instead of sleeping.  Linux only (/proc/net/tcp).
 */
#ifndef ZS_TEST_NETUTIL_H
#define ZS_TEST_NETUTIL_H

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/types.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/secret.h"

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

/* A TCP connection to 127.0.0.1:port (-1 if refused or on failure). */
static inline int zs_test_connect(int port)
{
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* Writes (out) or reads exactly n bytes on a blocking socket: 1 on success, 0 on failure,
 * end of stream or the socket's timeout. */
static inline int zs_test_io(int fd, void *buf, size_t n, int out)
{
    uint8_t *p = buf;
    while (n > 0) {
        ssize_t k = out ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return 0;
        p += k;
        n -= (size_t)k;
    }
    return 1;
}

/*
 * A raw stream to 127.0.0.1:port that has passed the data plane's handshake as `member`, whose
 * token is `token`, so that whatever a test writes on it next reaches the server's frame
 * decoder as that member's.  The wire format (transport/tcp.c) is written out here on
 * purpose: this is a peer that does not use our transport.  -1 if the server refused the
 * member or did not prove itself, or nothing came within 10 s.
 */
static inline int zs_test_connect_member(int port, uint32_t member,
                                         const uint8_t token[ZS_TOKEN_BYTES])
{
    int fd = zs_test_connect(port);
    if (fd < 0)
        return -1;
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    uint8_t hello[48] = {'Z', 'S', 'A', '1', 1, 0, 0, 0}, challenge[72], proof[32], want[32],
            result[8];
    for (int i = 0; i < 4; i++)
        hello[8 + i] = (uint8_t)(member >> (8 * i));
    const uint8_t *nonce_c = hello + 16, *nonce_s = challenge + 8;
    zs_random_bytes(hello + 16, ZS_NONCE_BYTES);
    int ok = zs_test_io(fd, hello, sizeof hello, 1) &&
             zs_test_io(fd, challenge, sizeof challenge, 0) && !memcmp(challenge, "ZSA1", 4) &&
             !memcmp(challenge + 4, "\0\0\0\0", 4);
    if (ok) {
        zs_token_proof(token, "server", nonce_c, nonce_s, member, want);
        ok = memcmp(want, challenge + 8 + ZS_NONCE_BYTES, sizeof want) == 0;
    }
    if (ok) {
        zs_token_proof(token, "client", nonce_c, nonce_s, member, proof);
        ok = zs_test_io(fd, proof, sizeof proof, 1) && zs_test_io(fd, result, sizeof result, 0) &&
             !memcmp(result, "ZSA1\0\0\0\0", 8);
    }
    if (!ok) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Polls (every 10 ms) until 127.0.0.1:port accepts a TCP connection, which it closes at once:
 * 1 once it did, 0 if it did not within timeout_ms. */
static inline int zs_test_wait_listening(int port, int timeout_ms)
{
    uint64_t until = zs_now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        int fd = zs_test_connect(port);
        if (fd >= 0) {
            close(fd);
            return 1;
        }
        if (zs_now_ms() >= until)
            return 0;
        usleep(10000);
    }
}

/* Connects to 127.0.0.1:port, sends 4 KiB of pseudo-random bytes and reads until the peer
 * closes (or wait_s seconds pass).  Returns 1 if the peer closed the connection, 0 if it did
 * not within wait_s, -1 if there was no connection to send on. */
static inline int zs_test_send_garbage(int port, uint64_t seed, int wait_s)
{
    int fd = zs_test_connect(port);
    if (fd < 0)
        return -1;
    uint8_t noise[4096];
    for (size_t i = 0; i < sizeof noise; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        noise[i] = (uint8_t)(seed >> 56);
    }
    /* A peer that closes while the bytes go out fails the write (EPIPE, ECONNRESET): the read
     * below sees the close too. */
    if (write(fd, noise, sizeof noise) < 0 && errno != EPIPE && errno != ECONNRESET) {
        close(fd);
        return -1;
    }
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

/* The local port of a connected socket (-1 on failure). */
static inline int zs_test_local_port(int fd)
{
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    if (getsockname(fd, (struct sockaddr *)&a, &len) != 0)
        return -1;
    return ntohs(a.sin_port);
}

/*
 * One end of a loopback TCP connection, as /proc/net/tcp shows it: the end at local_port whose
 * peer is at remote_port.  A connection that a process has not accepted yet has inode 0 (it
 * waits in the listener's queue); so has one whose process closed it.
 */
typedef struct {
    int found;           /* 0: no such end (never was, or closed and gone) */
    int state;           /* TCP_ESTABLISHED, TCP_CLOSE_WAIT, ... (netinet/tcp.h) */
    unsigned long rx;    /* bytes received and not yet read by the process */
    unsigned long inode; /* of its socket; 0: no process holds it */
} zs_test_tcp_end;

static inline zs_test_tcp_end zs_test_tcp_lookup(int local_port, int remote_port)
{
    zs_test_tcp_end e = {0};
    FILE *f = fopen("/proc/net/tcp", "r");
    if (!f)
        return e;
    char line[512];
    if (!fgets(line, sizeof line, f)) { /* the column titles */
        fclose(f);
        return e;
    }
    while (fgets(line, sizeof line, f)) {
        unsigned lport, rport, st;
        unsigned long tx, rx, inode;
        if (sscanf(line, " %*d: %*x:%x %*x:%x %x %lx:%lx %*x:%*x %*x %*u %*u %lu", &lport, &rport,
                   &st, &tx, &rx, &inode) != 6)
            continue;
        if ((int)lport == local_port && (int)rport == remote_port) {
            e = (zs_test_tcp_end){.found = 1, .state = (int)st, .rx = rx, .inode = inode};
            break;
        }
    }
    fclose(f);
    return e;
}

/* Whether the end is still open on its process's side: it has not closed it (or not accepted
 * it yet).  One that is gone, or in a state past the process's close, is not. */
static inline int zs_test_tcp_open(const zs_test_tcp_end *e)
{
    return e->found &&
           (e->state == TCP_SYN_RECV || e->state == TCP_ESTABLISHED || e->state == TCP_CLOSE_WAIT);
}

/* Whether process pid holds socket inode (one of /proc/pid/fd names it).  0 also when pid has
 * exited. */
static inline int zs_test_holds_socket(pid_t pid, unsigned long inode)
{
    char dir[64], want[64];
    snprintf(dir, sizeof dir, "/proc/%d/fd", (int)pid);
    snprintf(want, sizeof want, "socket:[%lu]", inode);
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int held = 0;
    struct dirent *de;
    while (!held && (de = readdir(d)) != NULL) {
        char path[320], link[64];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        ssize_t n = readlink(path, link, sizeof link - 1);
        if (n > 0) {
            link[n] = 0;
            held = strcmp(link, want) == 0;
        }
    }
    closedir(d);
    return held;
}

#endif
