/*
 * setup: the set-up stream of the backends that meet over TCP first (rdma.c, shm.c).  Each
 * connection of theirs begins as an authenticated TCP stream of the net's own TCP net
 * (tcp.h): the connecting side sends one ZS_OP_HELLO frame with the backend's text (queue
 * pair numbers, a socket name), the accepting side answers with its own hello or refuses with
 * a ZS_OP_ERROR frame, and the stream is then kept, idle, so that a dead peer is noticed at
 * once.  What the hello says is the backend's; how it travels and how a refusal reads is here.
 *
 * Both hellos have the same id and a fixed size per backend, and the hello buffer is registered
 * with the TCP net for both directions: the connecting side's buffer takes the answer once its
 * own hello is out.
 */
#ifndef ZS_TRANSPORT_SETUP_H
#define ZS_TRANSPORT_SETUP_H

#include <stdint.h>

#include "transport/core.h"

/* The connecting side: sends the hello in hello_mr (`bytes` bytes, frame id `id`) on the
 * stream tc and waits until deadline (timeout_ms is for the message) for the answer, which
 * lands in the same buffer; *len is its length.  A refusal fails with the server's text
 * ("BACKEND ADDR: the server refused the set-up: TEXT"), as does an answer that is not a
 * hello.  Every request it started is finished or cancelled when it returns. */
zs_err zs_setup_exchange(zs_conn *tc, zs_mr *hello_mr, const uint8_t *hello, uint64_t bytes,
                         uint64_t id, const char *backend, const char *addr, int timeout_ms,
                         int64_t deadline, uint64_t *len);

/* The accepting side gives up on a stream from listener l (NULL: it was closed): queues
 * ZS_EV_REFUSED on q ("BACKEND PEER: set-up failed: WHY") and, while the stream tc is open,
 * tells the peer why in a ZS_OP_ERROR frame with the hello's id, written at once on tcp (the
 * caller closes the stream next). */
void zs_setup_refuse(zs_evq *q, zs_net *tcp, zs_conn *tc, zs_listener *l, uint64_t id,
                     const char *backend, const char *peer, const char *why);

/* A stream the TCP net refused (ZS_EV_REFUSED ev: its handshake failed) reported as the
 * backend's own refusal on q, on listener l (the backend's, or NULL). */
void zs_setup_forward_refused(zs_evq *q, const zs_event *ev, zs_listener *l, const char *backend);

/* The TCP options of a set-up stream: one stream, the caller's timeout and authentication;
 * the rest of opts (the backend's own options) stays with the backend. */
zs_conn_opts zs_setup_tcp_opts(const zs_conn_opts *opts, int timeout_ms);

#endif
