/*
 * setup: the set-up stream of rdma.c and shm.c (setup.h).
 */
#include "transport/setup.h"

#include <string.h>

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

void zs_setup_refuse(zs_evq *q, zs_net *tcp, zs_conn *tc, zs_listener *l, uint64_t id,
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

void zs_setup_forward_refused(zs_evq *q, const zs_event *ev, zs_listener *l, const char *backend)
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
