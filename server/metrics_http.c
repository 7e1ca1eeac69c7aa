/*
 * metrics_http: see metrics_http.h.
 *
 * We bind the listening socket ourselves and hand it to libmicrohttpd
 * (MHD_OPTION_LISTEN_SOCKET): that way a bad address fails with our message naming it, port 0
 * works, and the port chosen is read back with getsockname.  libmicrohttpd's internal polling
 * thread (epoll where it has it) does all the I/O; the access handler runs on that thread and
 * takes the registry's mutex only while it copies the values out.
 */
#include "server/metrics_http.h"

#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/log.h"

#define MAX_CONNECTIONS 32
#define MAX_PER_IP 4
#define IDLE_TIMEOUT_S 10
#define CONNECTION_MEMORY (16 * 1024)

struct zs_metrics_http {
    struct MHD_Daemon *daemon;
    zs_prom *reg;
    int fd;
    int port;
    char target[300];
    zs_log_limit log; /* used by the daemon's thread only */
};

static enum MHD_Result answer_text(struct MHD_Connection *conn, unsigned status, const char *text)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_PERSISTENT);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    enum MHD_Result res = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return res;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    zs_metrics_http *h = cls;
    (void)version;
    (void)upload_data;
    (void)con_cls;
    /* Anything but GET or HEAD is answered at once, its body (if any) never read: the
     * connection is closed after the answer. */
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
        return answer_text(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET /metrics is served here\n");
    if (strcmp(url, "/metrics") != 0)
        return answer_text(conn, MHD_HTTP_NOT_FOUND, "not found: only /metrics is served here\n");
    /* A GET with a body: the body is ignored. */
    *upload_data_size = 0;
    char *text;
    size_t len;
    if (zs_prom_write(h->reg, &text, &len) != ZS_OK) {
        zs_log_limited(&h->log, ZS_LOG_WARN, "metrics endpoint %s: %s", h->target, zs_last_error());
        return answer_text(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                            "text/plain; version=0.0.4; charset=utf-8");
    enum MHD_Result res = MHD_queue_response(conn, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return res;
}

/* Splits "HOST:PORT" / "[V6]:PORT" / "*:PORT" into host (NULL: every address) and port. */
static zs_err split_addr(const char *addr, char *host, size_t n, int *wild, long *port)
{
    const char *colon = strrchr(addr, ':');
    if (!colon || colon == addr || !colon[1])
        return zs_error(ZS_ERR_INVALID, "metrics address \"%s\": expected HOST:PORT", addr);
    size_t hl = (size_t)(colon - addr);
    const char *hs = addr;
    if (hs[0] == '[') {
        if (hl < 3 || hs[hl - 1] != ']')
            return zs_error(ZS_ERR_INVALID, "metrics address \"%s\": expected [V6]:PORT", addr);
        hs++;
        hl -= 2;
    } else if (memchr(hs, ':', hl)) {
        return zs_error(ZS_ERR_INVALID,
                        "metrics address \"%s\": write an IPv6 address in brackets, [V6]:PORT",
                        addr);
    }
    if (hl + 1 > n)
        return zs_error(ZS_ERR_INVALID, "metrics address \"%s\": host name too long", addr);
    memcpy(host, hs, hl);
    host[hl] = '\0';
    *wild = strcmp(host, "*") == 0;
    char *end;
    errno = 0;
    *port = strtol(colon + 1, &end, 10);
    if (errno || *end || *port < 0 || *port > 65535)
        return zs_error(ZS_ERR_INVALID, "metrics address \"%s\": \"%s\" is not a port (0-65535)",
                        addr, colon + 1);
    return ZS_OK;
}

static zs_err bind_addr(const char *addr, int *fd_out, int *port_out, char *target, size_t tn)
{
    char host[256];
    int wild = 0;
    long port = 0;
    ZS_CHECK(split_addr(addr, host, sizeof host, &wild, &port));
    char service[16];
    snprintf(service, sizeof service, "%ld", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    int g = getaddrinfo(wild ? NULL : host, service, &hints, &ai);
    if (g != 0)
        return zs_error(ZS_ERR_INVALID, "metrics address \"%s\": cannot resolve \"%s\": %s", addr,
                        host, gai_strerror(g));
    zs_err res = ZS_ERR_IO;
    int err = 0;
    for (struct addrinfo *p = ai; p; p = p->ai_next) {
        int fd = socket(p->ai_family, p->ai_socktype | SOCK_CLOEXEC, p->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, p->ai_addr, p->ai_addrlen) != 0 || listen(fd, 64) != 0) {
            err = errno;
            close(fd);
            continue;
        }
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
            err = errno;
            close(fd);
            continue;
        }
        *port_out = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                   : ((struct sockaddr_in *)&ss)->sin_port);
        *fd_out = fd;
        int v6 = strchr(host, ':') != NULL;
        snprintf(target, tn, "%s%s%s:%d", v6 ? "[" : "", wild ? "127.0.0.1" : host, v6 ? "]" : "",
                 *port_out);
        res = ZS_OK;
        break;
    }
    freeaddrinfo(ai);
    if (res != ZS_OK)
        return zs_error(ZS_ERR_IO, "metrics address \"%s\": cannot listen: %s", addr,
                        strerror(err ? err : EADDRNOTAVAIL));
    return ZS_OK;
}

zs_err zs_metrics_http_start(const char *addr, zs_prom *reg, zs_metrics_http **out)
{
    *out = NULL;
    zs_metrics_http *h = calloc(1, sizeof *h);
    if (!h)
        return zs_error(ZS_ERR_NOMEM, "metrics endpoint: out of memory");
    h->reg = reg;
    h->fd = -1;
    zs_err res = bind_addr(addr, &h->fd, &h->port, h->target, sizeof h->target);
    if (res != ZS_OK)
        goto fail;
    /* The daemon's thread takes our signal mask: it blocks the signals that stop a process,
     * so that they reach the loop's thread and interrupt its wait, not this idle one. */
    sigset_t stop, old;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &stop, &old);
    /* No MHD_USE_ERROR_LOG: what clients do wrong is theirs, and would fill our log. */
    h->daemon = MHD_start_daemon(
        MHD_USE_AUTO | MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL, on_request, h,
        MHD_OPTION_LISTEN_SOCKET, (MHD_socket)h->fd, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)MAX_CONNECTIONS, MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)MAX_PER_IP,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)IDLE_TIMEOUT_S, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        (size_t)CONNECTION_MEMORY, MHD_OPTION_END);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!h->daemon) {
        res = zs_error(ZS_ERR_IO, "metrics address \"%s\": libmicrohttpd could not start", addr);
        goto fail;
    }
    *out = h;
    return ZS_OK;
fail:
    if (h->fd >= 0)
        close(h->fd);
    free(h);
    return res;
}

int zs_metrics_http_port(const zs_metrics_http *h)
{
    return h->port;
}

const char *zs_metrics_http_target(const zs_metrics_http *h)
{
    return h->target;
}

void zs_metrics_http_stop(zs_metrics_http *h)
{
    if (!h)
        return;
    /* The daemon closes the listening socket it was given when it stops. */
    MHD_stop_daemon(h->daemon);
    free(h);
}
