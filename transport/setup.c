/*
 * setup: the set-up stream, the connections and the event loop of rdma.c and shm.c (setup.h).
 */
#include "transport/setup.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "common/log.h"
#include "transport/tcp.h"

zs_err zs_setup_exchange(zs_conn *tc, zs_mr *hello_mr, const uint8_t *hello, uint64_t bytes,
                         uint64_t id, const char *backend, const char *addr, int timeout_ms,
                         int64_t deadline, uint64_t *len)
{
    zs_req *rr, *sr;
    ZS_CHECK(zs_tcp_irecv(tc, id, hello_mr, 0, bytes, NULL, &rr));
    zs_frame f = {.op = ZS_OP_HELLO, .dtype = ZS_DTYPE_TEXT, .id = id, .length = bytes};
    int done = 0;
    zs_frame got;
    zs_err res = zs_tcp_isend(tc, &f, hello_mr, 0, NULL, &sr);
    /* The hello goes out before the answer can come: once the send is done, the buffer takes
     * the answer. */
    if (res == ZS_OK) {
        res = zs_tcp_wait(sr, zs_net_remaining_ms(deadline), &done, NULL);
        if (!done)
            zs_tcp_cancel(sr);
        if (res == ZS_OK && !done)
            res = zs_error(ZS_ERR_IO, "%s %s: set-up: the hello did not go out in %d ms", backend,
                           addr, timeout_ms);
    }
    done = 0;
    if (res == ZS_OK) {
        res = zs_tcp_wait(rr, zs_net_remaining_ms(deadline), &done, &got);
        if (res == ZS_OK && !done)
            res = zs_error(ZS_ERR_IO, "%s %s: set-up: no answer within %d ms", backend, addr,
                           timeout_ms);
    }
    if (!done)
        zs_tcp_cancel(rr);
    if (res != ZS_OK)
        return res;
    if (got.op == ZS_OP_ERROR) {
        char text[ZS_FRAME_MAX_ERROR_TEXT + 1];
        size_t n = got.length < bytes ? got.length : bytes;
        if (n > ZS_FRAME_MAX_ERROR_TEXT)
            n = ZS_FRAME_MAX_ERROR_TEXT;
        memcpy(text, hello, n);
        text[n] = '\0';
        return zs_error(ZS_ERR_IO, "%s %s: the server refused the set-up: %s%s", backend, addr,
                        text, got.length > n ? "..." : "");
    }
    if (got.op != ZS_OP_HELLO)
        return zs_error(ZS_ERR_FORMAT, "%s %s: set-up answered with a %s frame", backend, addr,
                        zs_frame_op_name(got.op));
    *len = got.length;
    return ZS_OK;
}

/* The accepting side gives up on a stream from listener l (NULL: it was closed): queues
 * ZS_EV_REFUSED on q ("BACKEND PEER: set-up failed: WHY") and, while the stream tc is open,
 * tells the peer why in a ZS_OP_ERROR frame with the hello's id, written at once on tcp (the
 * caller closes the stream next). */
static void setup_refuse(zs_evq *q, zs_net *tcp, zs_conn *tc, zs_listener *l, uint64_t id,
                         const char *backend, const char *peer, const char *why)
{
    zs_event *e = zs_evq_push(q, ZS_EV_REFUSED, NULL, backend);
    if (e) {
        e->listener = l;
        zs_net_fmt(e->reason, sizeof e->reason, "%s %s: set-up failed: %s", backend, peer, why);
    }
    if (tc && !zs_tcp_conn_closed(tc)) {
        char text[ZS_NET_REASON_MAX];
        zs_net_copy_str(text, sizeof text, why);
        zs_frame f = {.op = ZS_OP_ERROR,
                      .dtype = ZS_DTYPE_TEXT,
                      .status = ZS_FS_BAD_FRAME,
                      .id = id,
                      .length = strlen(text)};
        zs_tcp_isend_inline(tc, &f, text, NULL, NULL);
        zs_tcp_flush(tcp);
    }
}

/* A stream the TCP net refused (ZS_EV_REFUSED ev: its handshake failed) reported as the
 * backend's own refusal on q, on listener l (the backend's, or NULL). */
static void forward_refused(zs_evq *q, const zs_event *ev, zs_listener *l, const char *backend)
{
    zs_event *e = zs_evq_push(q, ZS_EV_REFUSED, NULL, backend);
    if (e) {
        e->listener = l;
        zs_net_copy_str(e->reason, sizeof e->reason, ev->reason);
    }
}

zs_conn_opts zs_setup_tcp_opts(const zs_conn_opts *opts, int timeout_ms)
{
    return (zs_conn_opts){
        .conns = 1, .connect_timeout_ms = timeout_ms, .auth = opts ? opts->auth : NULL};
}

/* ---------------------------------------------------------------------------------------- */
/* the net */

int zs_setup_env_int(const char *who, const char *name, int dflt, int lo, int hi)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return dflt;
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v < lo || v > hi) {
        ZS_WARN("%s: %s=%s is not a number in %d..%d; using %d", who, name, s, lo, hi, dflt);
        return dflt;
    }
    return (int)v;
}

/* The connection a handle-less request's outcome names: none once the caller closed it. */
static zs_conn *event_conn(void *conn)
{
    zs_setup_conn *c = conn;
    return c && c->ready ? (zs_conn *)c : NULL;
}

/* zs_setup_run as core's driver of test() and wait(). */
static zs_err net_drive(void *n, int64_t deadline, int (*ready)(void *), void *arg)
{
    zs_setup_run(n, deadline, ready, arg);
    return ZS_OK;
}

zs_err zs_setup_net_open(zs_setup_net *n, const zs_setup_ops *ops)
{
    const char *who = ops->name;
    n->ops = ops;
    n->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (n->epfd < 0)
        return zs_error(ZS_ERR_IO, "%s: epoll_create1: %s", who, strerror(errno));
    zs_err res = zs_tcp_open(&n->tcp);
    if (res != ZS_OK)
        goto fail_ep;
    int tt;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    if (epoll_ctl(n->epfd, EPOLL_CTL_ADD, zs_tcp_wait_fd(n->tcp, &tt), &ev) < 0) {
        res = zs_error(ZS_ERR_IO, "%s: epoll_ctl: %s", who, strerror(errno));
        goto fail_tcp;
    }
    n->reqs = (zs_rq_pool){.who = who, .evq = &n->evq, .event_conn = event_conn, .run = net_drive};
    return ZS_OK;
fail_tcp:
    zs_tcp_close(n->tcp);
fail_ep:
    close(n->epfd);
    return res;
}

void zs_setup_net_close_conns(zs_setup_net *n)
{
    while (n->conns) {
        zs_setup_conn *c = n->conns;
        c->ready = 0; /* no events from a closing net */
        n->ops->conn_free(c);
    }
}

void zs_setup_net_close(zs_setup_net *n)
{
    zs_rq_pool_free(&n->reqs);
    zs_tcp_close(n->tcp);
    zs_evq_free(&n->evq);
    close(n->epfd);
}

/* ---------------------------------------------------------------------------------------- */
/* connections */

zs_err zs_setup_conn_init(zs_setup_net *n, zs_setup_conn *c, zs_conn *tcp)
{
    c->net = n;
    c->tcp = tcp;
    c->member = zs_tcp_conn_member(tcp);
    zs_net_copy_str(c->peer, sizeof c->peer, zs_tcp_conn_peer(tcp));
    zs_tcp_conn_set_user(tcp, c);
    ZS_CHECK(
        zs_tcp_reg_mr(n->tcp, c->hello, sizeof c->hello, ZS_MR_SEND | ZS_MR_RECV, &c->hello_mr));
    c->next = n->conns;
    if (n->conns)
        n->conns->prev = c;
    n->conns = c;
    return ZS_OK;
}

void zs_setup_conn_release(zs_setup_conn *c)
{
    zs_setup_net *n = c->net;
    if (c->prev)
        c->prev->next = c->next;
    else
        n->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    if (c->tcp)
        zs_tcp_conn_close(c->tcp);
    c->tcp = NULL;
    if (c->hello_mr)
        zs_tcp_dereg_mr(c->hello_mr);
    c->hello_mr = NULL;
}

int zs_setup_conn_fail(zs_setup_conn *c, const char *why, va_list ap)
{
    if (c->closed)
        return 0;
    char msg[ZS_NET_REASON_MAX];
    vsnprintf(msg, sizeof msg, why, ap);
    c->closed = 1;
    zs_net_fmt(c->reason, sizeof c->reason, "%s %s: %s", c->net->ops->name, c->peer, msg);
    /* The peer learns at once from its set-up stream, not after its data path's timeouts. */
    if (c->tcp) {
        zs_tcp_conn_close(c->tcp);
        c->tcp = NULL;
    }
    return 1;
}

void zs_setup_emit_closed(zs_setup_conn *c, zs_err err)
{
    if (!c->ready)
        return;
    zs_event *e = zs_evq_push(&c->net->evq, ZS_EV_CLOSED, (zs_conn *)c, c->net->ops->name);
    if (e) {
        e->err = err;
        zs_net_copy_str(e->reason, sizeof e->reason, c->reason);
    }
}

void zs_setup_conn_refuse(zs_setup_conn *c, const char *why)
{
    zs_setup_net *n = c->net;
    setup_refuse(&n->evq, n->tcp, c->tcp, (zs_listener *)c->l, n->ops->hello_id, n->ops->name,
                 c->peer, why);
    n->ops->conn_free(c);
}

zs_err zs_setup_answer(zs_setup_conn *c)
{
    const zs_setup_ops *ops = c->net->ops;
    zs_frame f = {
        .op = ZS_OP_HELLO, .dtype = ZS_DTYPE_TEXT, .id = ops->hello_id, .length = ops->hello_bytes};
    zs_err e = zs_tcp_isend(c->tcp, &f, c->hello_mr, 0, NULL, NULL);
    if (e != ZS_OK)
        zs_setup_conn_refuse(c, zs_last_error());
    return e;
}

void zs_setup_conn_accepted(zs_setup_conn *c)
{
    c->ready = 1;
    zs_event *e = zs_evq_push(&c->net->evq, ZS_EV_ACCEPT, (zs_conn *)c, c->net->ops->name);
    if (e)
        e->listener = (zs_listener *)c->l;
    c->l = NULL;
}

zs_err zs_setup_check_open(const zs_setup_conn *c, const char *what)
{
    if (c->closed)
        return zs_error(ZS_ERR_IO, "%s %s: %s on a failed connection: %s", c->net->ops->name,
                        c->peer, what, c->reason);
    return ZS_OK;
}

zs_rq *zs_setup_expected(zs_setup_conn *c, const zs_frame *f, int *skip)
{
    *skip = 0;
    zs_rq *r = zs_rq_list_find(c->expect, f->id);
    if (!r)
        return NULL;
    zs_rq_list_del(&c->expect, r);
    *skip = 1;
    if (r->silent) {
        zs_rq_release(r);
        return NULL;
    }
    r->frame = *f;
    if (f->length > r->len) {
        char msg[ZS_NET_REASON_MAX];
        zs_net_fmt(msg, sizeof msg, "%s %s: reply id %llu of %llu bytes exceeds the %llu posted",
                   c->net->ops->name, c->peer, (unsigned long long)f->id,
                   (unsigned long long)f->length, (unsigned long long)r->len);
        zs_rq_finish(r, ZS_ERR_INVALID, msg);
        return NULL;
    }
    *skip = 0;
    return r;
}

/* ---------------------------------------------------------------------------------------- */
/* listeners */

zs_err zs_setup_listen(zs_setup_net *n, zs_setup_listener *l, const char *addr,
                       const zs_conn_opts *opts, const char *env, int dflt_ms)
{
    zs_conn_opts to = {.auth = opts ? opts->auth : NULL};
    ZS_CHECK(zs_tcp_listen(n->tcp, addr, &to, &l->tcp));
    l->net = n;
    l->setup_ms = zs_setup_env_int(n->ops->name, env, dflt_ms, 10, INT_MAX / 2);
    l->next = n->listeners;
    if (n->listeners)
        n->listeners->prev = l;
    n->listeners = l;
    return ZS_OK;
}

void zs_setup_listener_drop(zs_setup_listener *l)
{
    zs_setup_net *n = l->net;
    for (zs_setup_conn *c = n->conns; c; c = c->next)
        if (c->l == l)
            c->l = NULL; /* its set-up goes on; ACCEPT names no listener */
    zs_tcp_listener_close(l->tcp);
    if (l->prev)
        l->prev->next = l->next;
    else
        n->listeners = l->next;
    if (l->next)
        l->next->prev = l->prev;
    zs_evq_forget_listener(&n->evq, (zs_listener *)l);
}

static zs_setup_listener *listener_of(zs_setup_net *n, zs_listener *tl)
{
    for (zs_setup_listener *l = n->listeners; l; l = l->next)
        if (l->tcp == tl)
            return l;
    return NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* the set-up stream's events */

/* Fails open connection c with a message (printf-formatted) through the backend. */
static void conn_fail(zs_setup_conn *c, zs_err err, const char *why, ...)
    __attribute__((format(printf, 3, 4)));

static void conn_fail(zs_setup_conn *c, zs_err err, const char *why, ...)
{
    char msg[ZS_NET_REASON_MAX];
    va_list ap;
    va_start(ap, why);
    vsnprintf(msg, sizeof msg, why, ap);
    va_end(ap);
    c->net->ops->fail(c, err, msg);
}

static void on_tcp_event(zs_setup_net *n, zs_event *ev)
{
    const zs_setup_ops *ops = n->ops;
    zs_setup_conn *c = ev->conn ? zs_tcp_conn_user(ev->conn) : NULL;
    switch (ev->type) {
    case ZS_EV_ACCEPT: {
        zs_setup_listener *l = listener_of(n, ev->listener);
        zs_setup_conn *nc;
        if (!l || ops->conn_new(n, ev->conn, &nc) != ZS_OK) {
            zs_tcp_conn_close(ev->conn);
            return;
        }
        nc->l = l;
        nc->setup_deadline = zs_net_now_ms() + l->setup_ms;
        break;
    }
    case ZS_EV_REFUSED:
        forward_refused(&n->evq, ev, (zs_listener *)listener_of(n, ev->listener), ops->name);
        break;
    case ZS_EV_HEADER:
        if (!c)
            return;
        if (c->ready || c->answered || ev->frame.op != ZS_OP_HELLO ||
            ev->frame.length != ops->hello_bytes) {
            if (c->ready)
                conn_fail(c, ZS_ERR_FORMAT, "unexpected %s frame on the set-up stream",
                          zs_frame_op_name(ev->frame.op));
            else
                zs_setup_conn_refuse(c, "the first frame was not a hello of the expected size");
            return;
        }
        if (zs_tcp_recv_payload(c->tcp, c->hello_mr, 0, c, NULL) != ZS_OK)
            zs_setup_conn_refuse(c, zs_last_error());
        break;
    case ZS_EV_RECV:
        if (!ev->conn || !c || c->ready)
            return;
        if (ev->err != ZS_OK) {
            zs_setup_conn_refuse(c, ev->reason);
            return;
        }
        c->answered = 1;
        ops->answer(c, ev->frame.length);
        break;
    case ZS_EV_CLOSED:
        if (!c)
            return;
        if (c->ready)
            conn_fail(c, ZS_ERR_IO, "peer closed its set-up stream (%s)", ev->reason);
        else
            zs_setup_conn_refuse(c, ev->reason);
        break;
    case ZS_EV_SEND:
    case ZS_EV_WRITTEN: /* the set-up stream carries no one-sided writes */
        break;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* the loop */

/* One turn: waits up to timeout_ms for the epoll descriptor, then the TCP net's events, the
 * backend's I/O, then timers and each connection's deferred work.  -1 if epoll failed. */
static int net_turn(zs_setup_net *n, int timeout_ms)
{
    const zs_setup_ops *ops = n->ops;
    struct epoll_event evs[32];
    int k = epoll_wait(n->epfd, evs, 32, timeout_ms);
    if (k < 0 && errno != EINTR)
        return -1;
    zs_event tev[32];
    int tk;
    while (zs_tcp_poll(n->tcp, tev, 32, 0, &tk) == ZS_OK && tk > 0)
        for (int i = 0; i < tk; i++)
            on_tcp_event(n, &tev[i]);
    ops->io(n, evs, k < 0 ? 0 : k);
    int64_t now = zs_net_now_ms();
    if (ops->expire)
        ops->expire(n, now);
    zs_setup_conn *next;
    for (zs_setup_conn *c = n->conns; c; c = next) {
        next = c->next;
        if (!c->ready && c->l && now >= c->setup_deadline) {
            zs_setup_conn_refuse(c, "set-up stalled");
            continue;
        }
        if (c->closed || !c->ready)
            continue;
        for (zs_rq *r = c->await; r; r = r->next)
            if (now >= r->deadline) {
                conn_fail(c, ZS_ERR_IO, "peer did not read a %llu-byte payload within %d ms",
                          (unsigned long long)r->frame.length, n->send_timeout_ms);
                break;
            }
        if (c->closed || !c->dirty)
            continue;
        c->dirty = 0;
        ops->resume(c);
    }
    return 0;
}

/* The longest a wait may sleep before the net needs a turn: 0 with work ready. */
static int net_timeout(zs_setup_net *n)
{
    if (n->evq.live)
        return 0;
    int tt;
    zs_tcp_wait_fd(n->tcp, &tt);
    int64_t next = tt < 0 ? -1 : zs_net_now_ms() + tt;
    if (n->ops->next_timer) {
        int64_t d = n->ops->next_timer(n);
        if (d >= 0 && (next < 0 || d < next))
            next = d;
    }
    for (zs_setup_conn *c = n->conns; c; c = c->next) {
        if (c->dirty && !c->closed)
            return 0;
        int64_t d = !c->ready && c->l ? c->setup_deadline : -1;
        for (zs_rq *r = c->await; r; r = r->next)
            if (d < 0 || r->deadline < d)
                d = r->deadline;
        if (d >= 0 && (next < 0 || d < next))
            next = d;
    }
    return zs_net_remaining_ms(next);
}

int zs_setup_run(zs_setup_net *n, int64_t deadline, int (*ready)(void *), void *arg)
{
    if (net_turn(n, 0) < 0)
        return 0;
    for (;;) {
        if (ready(arg))
            return 1;
        int left = zs_net_remaining_ms(deadline);
        if (left == 0)
            return 0;
        int t = net_timeout(n);
        if (t < 0 || (left >= 0 && left < t))
            t = left;
        if (net_turn(n, t) < 0)
            return 0;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* the interface */

zs_err zs_setup_listener_endpoint(const zs_listener *l, const char *toward, char *out, size_t cap)
{
    return zs_tcp_listener_endpoint(((const zs_setup_listener *)l)->tcp, toward, out, cap);
}

int zs_setup_listener_port(const zs_listener *l)
{
    return zs_tcp_listener_port(((const zs_setup_listener *)l)->tcp);
}

static int accept_ready(void *arg)
{
    void **a = arg; /* the listener, then the connection taken */
    zs_setup_listener *l = a[0];
    return (a[1] = zs_evq_take_accept(&l->net->evq, a[0])) != NULL;
}

zs_err zs_setup_accept(zs_listener *ll, int timeout_ms, zs_conn **out)
{
    zs_setup_listener *l = (zs_setup_listener *)ll;
    void *a[2] = {l, NULL};
    *out = NULL;
    if (zs_setup_run(l->net, zs_net_deadline(timeout_ms), accept_ready, a))
        *out = a[1];
    return ZS_OK;
}

const char *zs_setup_conn_peer(const zs_conn *c)
{
    return ((const zs_setup_conn *)c)->peer;
}
void zs_setup_conn_set_user(zs_conn *c, void *user)
{
    ((zs_setup_conn *)c)->user = user;
}
void *zs_setup_conn_user(const zs_conn *c)
{
    return ((const zs_setup_conn *)c)->user;
}
uint32_t zs_setup_conn_member(const zs_conn *c)
{
    return ((const zs_setup_conn *)c)->member;
}
int zs_setup_conn_closed(const zs_conn *c)
{
    return ((const zs_setup_conn *)c)->closed;
}

void zs_setup_conn_close(zs_conn *cc)
{
    zs_setup_conn *c = (zs_setup_conn *)cc;
    zs_evq_forget(&c->net->evq, cc);
    c->ready = 0; /* its requests' events name no connection from now on */
    c->net->ops->conn_free(c);
}

zs_err zs_setup_irecv(zs_conn *cc, uint64_t id, zs_mr *mr, size_t off, size_t cap, void *user,
                      zs_req **out)
{
    zs_setup_conn *c = (zs_setup_conn *)cc;
    if (out)
        *out = NULL;
    ZS_CHECK(zs_setup_check_open(c, "receive"));
    /* Both backends' regions begin with core's zs_region. */
    return zs_rq_expect(&c->net->reqs, c->net, c, c->peer, &c->expect, id, (zs_region *)mr, off,
                        cap, user, out);
}

zs_err zs_setup_test(zs_req *req, int *done, zs_frame *f)
{
    return zs_rq_wait((zs_rq *)req, 0, done, f, "test");
}

zs_err zs_setup_wait(zs_req *req, int timeout_ms, int *done, zs_frame *f)
{
    return zs_rq_wait((zs_rq *)req, timeout_ms, done, f, "wait");
}

zs_err zs_setup_flush(zs_net *net)
{
    net_turn((zs_setup_net *)net, 0);
    return ZS_OK;
}

static int events_ready(void *arg)
{
    return ((zs_setup_net *)arg)->evq.live > 0;
}

zs_err zs_setup_poll(zs_net *net, zs_event *ev, int max, int timeout_ms, int *n_out)
{
    zs_setup_net *n = (zs_setup_net *)net;
    zs_setup_run(n, zs_net_deadline(timeout_ms), events_ready, n);
    int k = 0;
    while (k < max && zs_evq_pop(&n->evq, &ev[k]))
        k++;
    *n_out = k;
    return ZS_OK;
}

int zs_setup_wait_fd(zs_net *net, int *timeout_ms)
{
    zs_setup_net *n = (zs_setup_net *)net;
    *timeout_ms = net_timeout(n);
    return n->epfd;
}
