/*
 * ctrl: ZeroMQ ROUTER/DEALER sockets carrying envelopes.  A ROUTER receives [routing id,
 * payload]; a DEALER sends and receives [payload].  One context per socket keeps the module
 * free of global state.
 *
 * Authentication (with a job secret): ZeroMQ's CURVE, with both key pairs derived from the
 * secret (zs_secret_derive): the coordinator's ROUTER is the CURVE server, every peer a CURVE
 * client with the "member" key pair.  A peer must know the server's public key to complete
 * the handshake at all, and the ROUTER's ZAP handler (a thread answering ZeroMQ's
 * inproc://zeromq.zap.01 requests for that socket's context) admits only clients whose
 * long-term public key is the member key: both are derived from the secret, so only a
 * process that holds it gets a message through.  Every message is then encrypted and
 * authenticated by CURVE.  The same thread logs the handshakes that fail (the ROUTER's
 * monitor), which is where a peer without the secret is stopped, at a bounded rate.  Without
 * a secret (insecure) the sockets are plain.
 */
#include "proto/ctrl.h"

#include <errno.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "common/log.h"

#define CURVE_KEY 32 /* bytes of a CURVE public or secret key */
#define ZAP_ENDPOINT "inproc://zeromq.zap.01"
#define ZAP_DOMAIN "zshard"
#define CTRL_CLOSE_LINGER_MS 200

struct zs_ctrl {
    void *ctx;
    void *sock;
    int router;
    char endpoint[256];
    /* The ZAP handler of an authenticated ROUTER: its thread and socket (NULL: none). */
    void *zap;
    void *monitor; /* PAIR receiving the ROUTER's failed handshakes */
    pthread_t zap_thread;
    int zap_running;
    uint8_t member_public[CURVE_KEY]; /* the one client key the handler admits */
    char zap_name[256];               /* the endpoint as asked for, for the handler's logs */
};

/* The CURVE key pair for purpose ("coordinator" or "member"), derived from the secret. */
static void curve_keys(const zs_secret *secret, const char *purpose, uint8_t pub[CURVE_KEY],
                       uint8_t sec[CURVE_KEY])
{
    char name[64];
    uint8_t seed[32];
    snprintf(name, sizeof name, "zshard/ctrl/curve-%s", purpose);
    zs_secret_derive(secret, name, seed);
    crypto_box_seed_keypair(pub, sec, seed);
    sodium_memzero(seed, sizeof seed);
}

/* Receives one frame of a ZAP request into buf (at most cap bytes kept); its size, or -1 when
 * the context is ending. */
static int zap_frame(void *sock, void *buf, size_t cap, int *more)
{
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, sock, 0) < 0) {
        zmq_msg_close(&m);
        return -1;
    }
    size_t n = zmq_msg_size(&m);
    memcpy(buf, zmq_msg_data(&m), n < cap ? n : cap);
    *more = zmq_msg_more(&m);
    zmq_msg_close(&m);
    return (int)(n < cap ? n : cap);
}

/*
 * Answers one ZAP request (RFC 27): [version "1.0", request id, domain, address, routing id,
 * mechanism, credentials...] gets [version, request id, status "200" or "400", status text,
 * user id, metadata].  Admits mechanism CURVE with the member public key, refuses the rest.
 * Returns -1 once the context is ending.
 */
static int zap_answer(zs_ctrl *c, zs_log_limit *refusals)
{
    char part[7][256];
    int len[7] = {0};
    int n = 0, more = 1;
    while (more) {
        int k = zap_frame(c->zap, part[n < 7 ? n : 6], sizeof part[0], &more);
        if (k < 0)
            return -1;
        if (n < 7)
            len[n] = k;
        n++;
    }
    int ok = n == 7 && len[0] == 3 && memcmp(part[0], "1.0", 3) == 0 && len[5] == 5 &&
             memcmp(part[5], "CURVE", 5) == 0 && len[6] == CURVE_KEY &&
             sodium_memcmp(part[6], c->member_public, CURVE_KEY) == 0;
    if (!ok) {
        char addr[64];
        int al = n > 3 && len[3] < (int)sizeof addr ? len[3] : 0;
        memcpy(addr, part[3], (size_t)al);
        addr[al] = '\0';
        zs_log_limited(refusals, ZS_LOG_WARN,
                       "control %s: refused a connection from %s: it did not prove the job "
                       "secret",
                       c->zap_name, al ? addr : "an unknown address");
    }
    /* The reply echoes the request id (frame 1); with a malformed request, an empty one. */
    const char *status = ok ? "200" : "400";
    const char *text = ok ? "OK" : "not a member of this job";
    if (zmq_send(c->zap, "1.0", 3, ZMQ_SNDMORE) < 0 ||
        zmq_send(c->zap, part[1], n > 1 ? (size_t)len[1] : 0, ZMQ_SNDMORE) < 0 ||
        zmq_send(c->zap, status, 3, ZMQ_SNDMORE) < 0 ||
        zmq_send(c->zap, text, strlen(text), ZMQ_SNDMORE) < 0 ||
        zmq_send(c->zap, "", 0, ZMQ_SNDMORE) < 0 || zmq_send(c->zap, "", 0, 0) < 0)
        return errno == ETERM ? -1 : 0;
    return 0;
}

/* Logs one event of the ROUTER's monitor: a handshake that failed.  A peer without the job
 * secret fails there, before ZAP is asked (it cannot even encrypt its hello to the
 * coordinator's key), as does a plain socket or one that is not ZeroMQ.  The event names the
 * listening endpoint, not the peer.  Returns -1 once the context is ending. */
static int monitor_event(zs_ctrl *c, zs_log_limit *refusals)
{
    uint8_t head[6];
    char where[256];
    int more = 0;
    int k = zap_frame(c->monitor, head, sizeof head, &more);
    if (k < 0)
        return -1;
    int w = more ? zap_frame(c->monitor, where, sizeof where - 1, &more) : 0;
    if (w < 0)
        return -1;
    where[w] = '\0';
    while (more) { /* a later libzmq may add frames */
        char skip[64];
        if (zap_frame(c->monitor, skip, sizeof skip, &more) < 0)
            return -1;
    }
    if (k != (int)sizeof head)
        return 0;
    uint16_t event;
    uint32_t value;
    memcpy(&event, head, 2);
    memcpy(&value, head + 2, 4);
    const char *why = event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH ? "refused by the ZAP handler"
                      : value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
                          ? "it does not use CURVE (started with --insecure?)"
                      : value == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC
                          ? "its keys are not this job's (another secret?)"
                          : "not our protocol";
    zs_log_limited(refusals, ZS_LOG_WARN,
                   "control %s: refused a connection: it did not prove the job secret: %s",
                   w ? where : c->zap_name, why);
    return 0;
}

/* The authentication thread of a ROUTER: answers ZAP requests and logs failed handshakes,
 * until the context ends. */
static void *auth_main(void *arg)
{
    zs_ctrl *c = arg;
    zs_log_limit refusals = ZS_LOG_LIMIT_INIT;
    for (;;) {
        zmq_pollitem_t items[2] = {{.socket = c->zap, .events = ZMQ_POLLIN},
                                   {.socket = c->monitor, .events = ZMQ_POLLIN}};
        if (zmq_poll(items, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            return NULL; /* ETERM: the context is ending */
        }
        if ((items[0].revents & ZMQ_POLLIN) && zap_answer(c, &refusals) < 0)
            return NULL;
        if ((items[1].revents & ZMQ_POLLIN) && monitor_event(c, &refusals) < 0)
            return NULL;
    }
}

/* Sets sock up as a CURVE server (router) or client with keys derived from the secret, and for
 * a server starts the ZAP handler that admits only members. */
static zs_err secure_socket(zs_ctrl *c, const zs_secret *secret, const char *endpoint)
{
    uint8_t coord_pub[CURVE_KEY], coord_sec[CURVE_KEY], mem_pub[CURVE_KEY], mem_sec[CURVE_KEY];
    ZS_CHECK(zs_sodium_init());
    curve_keys(secret, "coordinator", coord_pub, coord_sec);
    curve_keys(secret, "member", mem_pub, mem_sec);
    int one = 1, rc;
    if (c->router) {
        memcpy(c->member_public, mem_pub, CURVE_KEY);
        snprintf(c->zap_name, sizeof c->zap_name, "%s", endpoint);
        c->zap = zmq_socket(c->ctx, ZMQ_REP);
        c->monitor = zmq_socket(c->ctx, ZMQ_PAIR);
        char mon[64];
        snprintf(mon, sizeof mon, "inproc://zshard-ctrl-monitor-%p", (void *)c);
        int linger = 0;
        rc = !c->zap || !c->monitor ||
                     zmq_setsockopt(c->zap, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
                     zmq_setsockopt(c->monitor, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
                     zmq_bind(c->zap, ZAP_ENDPOINT) != 0 ||
                     zmq_socket_monitor(c->sock, mon,
                                        ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                                            ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                            ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) != 0 ||
                     zmq_connect(c->monitor, mon) != 0
                 ? -1
                 : 0;
        if (rc == 0 && pthread_create(&c->zap_thread, NULL, auth_main, c) != 0) {
            errno = EAGAIN;
            rc = -1;
        }
        if (rc == 0)
            c->zap_running = 1;
        if (rc == 0)
            rc =
                zmq_setsockopt(c->sock, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
                        zmq_setsockopt(c->sock, ZMQ_CURVE_SECRETKEY, coord_sec, CURVE_KEY) != 0 ||
                        zmq_setsockopt(c->sock, ZMQ_ZAP_DOMAIN, ZAP_DOMAIN, strlen(ZAP_DOMAIN)) != 0
                    ? -1
                    : 0;
    } else {
        rc = zmq_setsockopt(c->sock, ZMQ_CURVE_SERVERKEY, coord_pub, CURVE_KEY) != 0 ||
                     zmq_setsockopt(c->sock, ZMQ_CURVE_PUBLICKEY, mem_pub, CURVE_KEY) != 0 ||
                     zmq_setsockopt(c->sock, ZMQ_CURVE_SECRETKEY, mem_sec, CURVE_KEY) != 0
                 ? -1
                 : 0;
    }
    int err = errno;
    sodium_memzero(coord_sec, sizeof coord_sec);
    sodium_memzero(mem_sec, sizeof mem_sec);
    if (rc != 0)
        return zs_error(ZS_ERR_IO, "control socket %s: cannot set up CURVE authentication: %s",
                        endpoint, zmq_strerror(err));
    return ZS_OK;
}

static zs_err open_socket(const char *endpoint, int router, const zs_secret *secret, zs_ctrl **out)
{
    *out = NULL;
    if (!secret)
        return zs_error(ZS_ERR_INVALID, "control socket %s: no secret (not even insecure)",
                        endpoint);
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
    if (!secret->insecure) {
        zs_err e = secure_socket(c, secret, endpoint);
        if (e != ZS_OK) {
            zs_ctrl_close(c);
            return e;
        }
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

zs_err zs_ctrl_bind(const char *endpoint, const zs_secret *secret, zs_ctrl **out)
{
    return open_socket(endpoint, 1, secret, out);
}

zs_err zs_ctrl_connect(const char *endpoint, const zs_secret *secret, zs_ctrl **out)
{
    return open_socket(endpoint, 0, secret, out);
}

const char *zs_ctrl_endpoint(const zs_ctrl *c)
{
    return c->endpoint;
}

void zs_ctrl_close(zs_ctrl *c)
{
    if (!c)
        return;
    if (c->sock) {
        /* The last messages (a peer's leaving notice, the coordinator's shutdowns) still go
         * out, for at most CTRL_CLOSE_LINGER_MS: closing must not lose them, nor wait long for
         * a peer that is gone. */
        int linger = CTRL_CLOSE_LINGER_MS;
        zmq_setsockopt(c->sock, ZMQ_LINGER, &linger, sizeof linger);
        zmq_close(c->sock);
    }
    /* Ending the context makes the ZAP thread's receive fail with ETERM; it returns, and its
     * socket is closed here once it has (zmq_ctx_shutdown does not wait for sockets, and a
     * socket belongs to one thread at a time). */
    if (c->ctx && c->zap_running) {
        zmq_ctx_shutdown(c->ctx);
        pthread_join(c->zap_thread, NULL);
    }
    if (c->zap)
        zmq_close(c->zap);
    if (c->monitor)
        zmq_close(c->monitor);
    if (c->ctx)
        zmq_ctx_term(c->ctx);
    free(c);
}

void *zs_ctrl_socket(const zs_ctrl *c)
{
    return c->sock;
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

zs_err zs_ctrl_send_raw(zs_ctrl *c, const void *buf, size_t len)
{
    if (c->router)
        return zs_error(ZS_ERR_INVALID, "control: raw sends are for a DEALER");
    if (zmq_send(c->sock, buf, len, ZMQ_DONTWAIT) < 0)
        return zs_error(ZS_ERR_IO, "control: sending %zu bytes: %s", len, zmq_strerror(errno));
    return ZS_OK;
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

zs_err zs_ctrl_register(zs_ctrl *c, Zshard__Role role, const char *endpoint, uint32_t transports)
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
                     ZSHARD__CAPABILITY__CAP_FETCH_FP16 | (transports & ZS_MSG_CAPS_TRANSPORT);
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
    if (from) {
        from->len = 0;
        from->addr[0] = '\0';
    }
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
    const char *addr = from && c->router ? zmq_msg_gets(&part, "Peer-Address") : NULL;
    if (addr)
        snprintf(from->addr, sizeof from->addr, "%s", addr);
    zmq_msg_close(&part);
    return res;
}
