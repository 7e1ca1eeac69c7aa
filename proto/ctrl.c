/*
 * ctrl: ZeroMQ ROUTER/DEALER sockets carrying envelopes.  A ROUTER receives [routing id,
 * payload]; a DEALER sends and receives [payload].  One context per socket keeps the module
 * free of global state.
 */
#include "proto/ctrl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

struct zs_ctrl {
    void *ctx;
    void *sock;
    int router;
    char endpoint[256];
};

static zs_err open_socket(const char *endpoint, int router, zs_ctrl **out)
{
    *out = NULL;
    zs_ctrl *c = calloc(1, sizeof *c);
    if (!c)
        return zs_error(ZS_ERR_NOMEM, "control socket %s: out of memory", endpoint);
    c->router = router;
    c->ctx = zmq_ctx_new();
    if (!c->ctx) {
        free(c);
        return zs_error(ZS_ERR_IO, "control socket %s: zmq_ctx_new: %s", endpoint,
                        zmq_strerror(errno));
    }
    c->sock = zmq_socket(c->ctx, router ? ZMQ_ROUTER : ZMQ_DEALER);
    int linger = 0, mandatory = 1;
    int64_t maxmsg = (int64_t)ZS_MSG_MAX_BYTES;
    if (!c->sock || zmq_setsockopt(c->sock, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
        zmq_setsockopt(c->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) != 0 ||
        (router &&
         zmq_setsockopt(c->sock, ZMQ_ROUTER_MANDATORY, &mandatory, sizeof mandatory) != 0)) {
        zs_err e = zs_error(ZS_ERR_IO, "control socket %s: %s", endpoint, zmq_strerror(errno));
        zs_ctrl_close(c);
        return e;
    }
    int rc = router ? zmq_bind(c->sock, endpoint) : zmq_connect(c->sock, endpoint);
    if (rc != 0) {
        zs_err e = zs_error(ZS_ERR_IO, "control socket: cannot %s %s: %s",
                            router ? "bind" : "connect to", endpoint, zmq_strerror(errno));
        zs_ctrl_close(c);
        return e;
    }
    size_t len = sizeof c->endpoint;
    if (!router || zmq_getsockopt(c->sock, ZMQ_LAST_ENDPOINT, c->endpoint, &len) != 0)
        snprintf(c->endpoint, sizeof c->endpoint, "%s", endpoint);
    *out = c;
    return ZS_OK;
}

zs_err zs_ctrl_bind(const char *endpoint, zs_ctrl **out)
{
    return open_socket(endpoint, 1, out);
}

zs_err zs_ctrl_connect(const char *endpoint, zs_ctrl **out)
{
    return open_socket(endpoint, 0, out);
}

const char *zs_ctrl_endpoint(const zs_ctrl *c)
{
    return c->endpoint;
}

void zs_ctrl_close(zs_ctrl *c)
{
    if (!c)
        return;
    if (c->sock)
        zmq_close(c->sock);
    if (c->ctx)
        zmq_ctx_term(c->ctx);
    free(c);
}

int zs_ctrl_fd(const zs_ctrl *c)
{
    int fd = -1;
    size_t len = sizeof fd;
    zmq_getsockopt(c->sock, ZMQ_FD, &fd, &len);
    return fd;
}

zs_err zs_ctrl_send(zs_ctrl *c, const zs_ctrl_peer *to, const Zshard__Envelope *env)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    ZS_CHECK(zs_msg_encode(env, &buf, &len));
    zs_err res = ZS_OK;
    if (c->router && (!to || zmq_send(c->sock, to->id, to->len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)) {
        res = zs_error(ZS_ERR_IO, "control: cannot address %s: %s",
                       zs_msg_body_name(env->body_case), to ? zmq_strerror(errno) : "no peer");
        goto out;
    }
    if (zmq_send(c->sock, buf, len, ZMQ_DONTWAIT) < 0)
        res = zs_error(ZS_ERR_IO, "control: sending %s (%zu bytes): %s",
                       zs_msg_body_name(env->body_case), len, zmq_strerror(errno));
out:
    free(buf);
    return res;
}

void zs_ctrl_stamp(Zshard__Envelope *env, uint32_t sender)
{
    env->has_protocol_version = env->has_sender = 1;
    env->protocol_version = ZS_PROTOCOL_VERSION;
    env->sender = sender;
}

zs_err zs_ctrl_send_as(zs_ctrl *c, const zs_ctrl_peer *to, uint32_t sender, Zshard__Envelope *env)
{
    zs_ctrl_stamp(env, sender);
    return zs_ctrl_send(c, to, env);
}

zs_err zs_ctrl_register(zs_ctrl *c, Zshard__Role role, const char *endpoint)
{
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    char *endpoints[1] = {(char *)endpoint};
    Zshard__Register r = ZSHARD__REGISTER__INIT;
    r.has_role = r.has_protocol_version = r.has_capabilities = r.has_pid = 1;
    r.role = role;
    r.n_endpoints = endpoint ? 1 : 0;
    r.endpoints = endpoint ? endpoints : NULL;
    r.protocol_version = ZS_PROTOCOL_VERSION;
    r.capabilities = ZSHARD__CAPABILITY__CAP_FETCH_FP32 | ZSHARD__CAPABILITY__CAP_FETCH_BF16 |
                     ZSHARD__CAPABILITY__CAP_TRANSPORT_TCP;
    r.hostname = host;
    r.pid = (uint32_t)getpid();
    r.build = (char *)ZS_VERSION;
    Zshard__Envelope env = ZSHARD__ENVELOPE__INIT;
    env.body_case = ZSHARD__ENVELOPE__BODY_REGISTRATION;
    env.registration = &r;
    return zs_ctrl_send_as(c, NULL, 0, &env);
}

/* Receives one part into msg; *more says whether another part follows. */
static int recv_part(void *sock, zmq_msg_t *msg, int *more)
{
    if (zmq_msg_recv(msg, sock, ZMQ_DONTWAIT) < 0)
        return -1;
    *more = zmq_msg_more(msg);
    return 0;
}

zs_err zs_ctrl_recv(zs_ctrl *c, int timeout_ms, const zs_msg_ctx *ctx, zs_ctrl_peer *from,
                    Zshard__Envelope **env)
{
    *env = NULL;
    if (from)
        from->len = 0;
    zmq_pollitem_t item = {.socket = c->sock, .events = ZMQ_POLLIN};
    int rc = zmq_poll(&item, 1, timeout_ms);
    if (rc < 0 && errno == EINTR)
        return ZS_OK;
    if (rc < 0)
        return zs_error(ZS_ERR_IO, "control: poll: %s", zmq_strerror(errno));
    if (rc == 0 || !(item.revents & ZMQ_POLLIN))
        return ZS_OK;
    zmq_msg_t part;
    int more = 0;
    zmq_msg_init(&part);
    if (recv_part(c->sock, &part, &more) != 0) {
        zmq_msg_close(&part);
        return errno == EAGAIN ? ZS_OK
                               : zs_error(ZS_ERR_IO, "control: recv: %s", zmq_strerror(errno));
    }
    if (c->router) {
        /* The routing id, then the payload. */
        if (from) {
            size_t n = zmq_msg_size(&part);
            from->len = n < ZS_CTRL_ID_MAX ? n : ZS_CTRL_ID_MAX;
            memcpy(from->id, zmq_msg_data(&part), from->len);
        }
        zmq_msg_close(&part);
        zmq_msg_init(&part);
        if (!more || recv_part(c->sock, &part, &more) != 0) {
            zmq_msg_close(&part);
            return zs_error(ZS_ERR_FORMAT, "control: a message without a payload part");
        }
    }
    zs_err res = ZS_OK;
    if (more) {
        /* Our peers send one part; drain the rest and refuse. */
        while (more && recv_part(c->sock, &part, &more) == 0)
            ;
        res = zs_error(ZS_ERR_FORMAT, "control: a message of several parts");
    } else {
        res = zs_msg_decode(zmq_msg_data(&part), zmq_msg_size(&part), ctx, env);
    }
    zmq_msg_close(&part);
    return res;
}
