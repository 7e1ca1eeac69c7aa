/*
 * test_metrics_http: the /metrics endpoint (server/metrics_http.h) against what strangers can
 * send: GET /metrics answers the registry's text; HEAD too, without the body; other paths
 * 404; other methods 405 with Allow; garbage, a request cut short, headers beyond the limit;
 * clients that connect and say nothing (from one address past the per-address limit, from
 * many past the connection limit; and one that the idle timeout closes) -- and after each,
 * the endpoint still answers.  Bad addresses and a port in use are refused with the address
 * named; stopping closes every descriptor it opened.
 *
 * Clients bind 127.0.0.2, 127.0.0.3, ... (all loopback on Linux) to be different addresses.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/prom.h"
#include "server/metrics_http.h"
#include "test.h"

static int port;

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    if (!d)
        return -1;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

/* A connection from 127.0.0.<src> to the endpoint, or -1. */
static int connect_from(int src)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in me = {.sin_family = AF_INET,
                             .sin_addr.s_addr = htonl(0x7f000000u | (unsigned)src)};
    struct sockaddr_in to = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0 || bind(fd, (struct sockaddr *)&me, sizeof me) != 0 ||
        connect(fd, (struct sockaddr *)&to, sizeof to) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

/* Reads until the peer closes or deadline_s passes; returns the bytes read (into buf, NUL
 * terminated) or -1 on timeout. */
static int read_all(int fd, char *buf, size_t n, double deadline_s)
{
    size_t got = 0;
    double end = zs_now_s() + deadline_s;
    for (;;) {
        double left = end - zs_now_s();
        if (left <= 0)
            return -1;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, (int)(left * 1e3) + 1) <= 0)
            continue;
        ssize_t r = recv(fd, buf + got, n - 1 - got, 0);
        if (r <= 0) /* EOF or reset: the answer is whatever came */
            break;
        got += (size_t)r;
        if (got == n - 1)
            break;
    }
    buf[got] = '\0';
    return (int)got;
}

/* Sends req from 127.0.0.<src> and reads the answer into buf (the connection closes after
 * each answer: Connection: close).  Returns the bytes of the answer, or -1. */
static int ask(int src, const char *req, char *buf, size_t n)
{
    int fd = connect_from(src);
    if (fd < 0)
        return -1;
    if (send(fd, req, strlen(req), MSG_NOSIGNAL) != (ssize_t)strlen(req)) {
        close(fd);
        return -1;
    }
    int got = read_all(fd, buf, n, 10);
    close(fd);
    return got;
}

static char buf[1 << 16];

#define GET "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"

/* The endpoint answers a plain scrape from 127.0.0.1 with the registry's series. */
static int scrape_ok(void)
{
    return ask(1, GET, buf, sizeof buf) > 0 && strncmp(buf, "HTTP/1.1 200", 12) == 0 &&
           strstr(buf, "\nzs_test_requests_total 42\n") != NULL;
}

/* Polls (up to 10 s) until a scrape succeeds again: closed connections are noticed by the
 * endpoint's thread, not at once. */
static int scrape_ok_soon(void)
{
    double end = zs_now_s() + 10;
    while (zs_now_s() < end)
        if (scrape_ok())
            return 1;
    return 0;
}

int main(void)
{
    int fds_before = count_fds();
    zs_prom *r;
    CHECK_OK(zs_prom_open(&r));
    zs_prom_series *c = zs_prom_counter(r, "zs_test_requests_total", "Requests", NULL);
    zs_prom_add(c, 42);
    zs_metrics_http *h = NULL;
    CHECK_OK(zs_metrics_http_start("127.0.0.1:0", r, &h));
    if (!h)
        return zs_test_result("test_metrics_http");
    port = zs_metrics_http_port(h);
    CHECK(port > 0);
    char want[64];
    snprintf(want, sizeof want, "127.0.0.1:%d", port);
    CHECK(strcmp(zs_metrics_http_target(h), want) == 0);

    /* The scrape, with the exposition format's content type. */
    CHECK(scrape_ok());
    CHECK(strstr(buf, "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
    CHECK(strstr(buf, "# TYPE zs_test_requests_total counter\n"));
    CHECK(ask(1, "HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", buf,
              sizeof buf) > 0);
    CHECK(strncmp(buf, "HTTP/1.1 200", 12) == 0 && !strstr(buf, "zs_test_requests_total"));
    /* HTTP/1.0 without a Host header is fine too. */
    CHECK(ask(1, "GET /metrics HTTP/1.0\r\n\r\n", buf, sizeof buf) > 0);
    CHECK(strncmp(buf, "HTTP/1.", 7) == 0 && strstr(buf, " 200 ") && strstr(buf, "zs_test_"));

    /* Wrong path, wrong method. */
    static const char *const not_found[] = {"/", "/metrics/", "/metricsx", "/../metrics",
                                            "/metrics?x=1#y"};
    for (size_t i = 0; i < sizeof not_found / sizeof not_found[0]; i++) {
        char req[256];
        snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                 not_found[i]);
        CHECK(ask(1, req, buf, sizeof buf) > 0);
        /* A query string is not part of the path: /metrics?x=1 is /metrics. */
        if (strncmp(not_found[i], "/metrics?", 9) == 0)
            CHECK(strncmp(buf, "HTTP/1.1 200", 12) == 0);
        else if (strncmp(buf, "HTTP/1.1 404", 12) != 0) {
            CHECK(!"404 for a path other than /metrics");
            fprintf(stderr, "  %s: %.40s\n", not_found[i], buf);
        }
    }
    static const char *const methods[] = {"POST", "PUT", "DELETE", "OPTIONS", "PATCH", "BREW"};
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
        char req[256];
        snprintf(req, sizeof req,
                 "%s /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: "
                 "close\r\n\r\nhello",
                 methods[i]);
        CHECK(ask(1, req, buf, sizeof buf) > 0);
        if (strncmp(buf, "HTTP/1.1 405", 12) != 0 || !strstr(buf, "\r\nAllow: GET, HEAD\r\n")) {
            CHECK(!"405 with Allow for a method other than GET and HEAD");
            fprintf(stderr, "  %s: %.60s\n", methods[i], buf);
        }
    }

    /* Garbage (a TLS hello's first bytes), a request cut short, an oversized header: answered with
     * an error or closed, and the endpoint goes on. */
    CHECK(ask(1, "\x16\x03\x01\x02\x05\x01\xfc\x03\x03 not http at all\r\n\r\n", buf, sizeof buf) >=
          0);
    CHECK(strncmp(buf, "HTTP/1.1 200", 12) != 0);
    int fd = connect_from(1);
    CHECK(fd >= 0);
    if (fd >= 0) {
        CHECK(send(fd, "GET /metr", 9, MSG_NOSIGNAL) == 9);
        close(fd);
    }
    char *big = malloc(64 * 1024);
    if (big) {
        int n = snprintf(big, 64 * 1024, "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: ");
        memset(big + n, 'a', 40 * 1024);
        strcpy(big + n + 40 * 1024, "\r\nConnection: close\r\n\r\n");
        CHECK(ask(1, big, buf, sizeof buf) >= 0);
        CHECK(strncmp(buf, "HTTP/1.1 200", 12) != 0);
        free(big);
    }
    CHECK(scrape_ok_soon());

    /* Four silent clients from 127.0.0.2 take that address's places: its fifth connection is
     * closed unanswered, while 127.0.0.1 is still served. */
    int idle[40];
    int n_idle = 0;
    for (int i = 0; i < 4; i++)
        if ((idle[n_idle] = connect_from(2)) >= 0)
            n_idle++;
    CHECK_EQ_INT(n_idle, 4);
    CHECK(ask(2, GET, buf, sizeof buf) == 0); /* closed without a byte */
    CHECK(scrape_ok());

    /* Silent clients from 127.0.0.3 .. 127.0.0.9 too: 32 in all, the connection limit.  The
     * endpoint stops accepting: a scrape waits in the kernel's queue, unanswered (for the 1 s
     * looked at), and is answered once the silent ones are gone. */
    for (int src = 3; src <= 9; src++)
        for (int i = 0; i < 4; i++)
            if ((idle[n_idle] = connect_from(src)) >= 0)
                n_idle++;
    CHECK_EQ_INT(n_idle, 32);
    fd = connect_from(10);
    CHECK(fd >= 0);
    if (fd >= 0) {
        CHECK(send(fd, GET, strlen(GET), MSG_NOSIGNAL) == (ssize_t)strlen(GET));
        CHECK(read_all(fd, buf, sizeof buf, 1) == -1);
    }
    for (int i = 0; i < n_idle; i++)
        close(idle[i]);
    if (fd >= 0) {
        CHECK(read_all(fd, buf, sizeof buf, 10) > 0);
        CHECK(strncmp(buf, "HTTP/1.1 200", 12) == 0);
        close(fd);
    }
    CHECK(scrape_ok_soon());

    /* A silent client is closed by the endpoint after the idle timeout (10 s). */
    double t0 = zs_now_s();
    fd = connect_from(2);
    CHECK(fd >= 0);
    if (fd >= 0) {
        CHECK(read_all(fd, buf, sizeof buf, 20) == 0);
        double waited = zs_now_s() - t0;
        CHECK(waited > 8 && waited < 20);
        close(fd);
    }
    CHECK(scrape_ok());

    /* Addresses refused, with the address named. */
    zs_metrics_http *h2 = NULL;
    CHECK_FAILS_WITH(zs_metrics_http_start("nonsense", r, &h2), "\"nonsense\": expected HOST:PORT");
    CHECK_FAILS_WITH(zs_metrics_http_start("127.0.0.1:99999", r, &h2), "is not a port");
    CHECK_FAILS_WITH(zs_metrics_http_start("127.0.0.1:http", r, &h2), "is not a port");
    CHECK_FAILS_WITH(zs_metrics_http_start("::1:9000", r, &h2), "[V6]:PORT");
    CHECK_FAILS_WITH(zs_metrics_http_start("no.such.host.invalid:0", r, &h2), "cannot resolve");
    CHECK_FAILS_WITH(zs_metrics_http_start(want, r, &h2), "cannot listen: Address already in use");
    CHECK(strstr(zs_last_error(), want));
    CHECK(h2 == NULL);
    /* Every address: the target names loopback. */
    CHECK_OK(zs_metrics_http_start("*:0", r, &h2));
    if (h2) {
        CHECK(strncmp(zs_metrics_http_target(h2), "127.0.0.1:", 10) == 0);
        zs_metrics_http_stop(h2);
    }

    zs_metrics_http_stop(h);
    zs_metrics_http_stop(NULL);
    zs_prom_free(r);
    CHECK_EQ_INT(count_fds(), fds_before);
    return zs_test_result("test_metrics_http");
}
