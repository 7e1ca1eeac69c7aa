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

#include <stdarg.h>
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

/* The TCP options of a set-up stream: one stream, the caller's timeout and authentication;
 * the rest of opts (the backend's own options) stays with the backend. */
zs_conn_opts zs_setup_tcp_opts(const zs_conn_opts *opts, int timeout_ms);

/* ---------------------------------------------------------------------------------------- */
/* the net, connections and listeners both backends share
 *
 * A backend's net, connection and listener structs begin with zs_setup_net, zs_setup_conn and
 * zs_setup_listener (member `s`), so that the pointers the interface hands out (zs_net,
 * zs_conn, zs_listener) and core's requests (zs_rq.net, .conn) are both.  What is here: the
 * set-up stream's events (a hello accepted, answered or refused; a dead peer noticed), the
 * event loop (one epoll descriptor over the TCP net and the backend's own descriptors), the
 * timers every connection has (its set-up's deadline, its rendezvous sends' deadlines), the
 * connection accessors and the calls that only drive the loop (accept, test, wait, poll,
 * flush, wait_fd).  What a backend adds it says in zs_setup_ops. */

#define ZS_SETUP_HELLO_MAX 256 /* bytes: the largest hello (shm's) */
#define ZS_SETUP_PEER_MAX 80

struct epoll_event;
typedef struct zs_setup_net zs_setup_net;
typedef struct zs_setup_conn zs_setup_conn;
typedef struct zs_setup_listener zs_setup_listener;

/* What a backend does that the set-up and the loop cannot.  Called from inside the net's
 * progress functions. */
typedef struct {
    const char *name;     /* "rdma", "shm": the first word of messages */
    uint64_t hello_id;    /* the frame id of both hellos */
    uint64_t hello_bytes; /* the size of a hello, at most ZS_SETUP_HELLO_MAX */
    /* A connection for the accepted stream tcp: allocates the backend's struct and calls
     * zs_setup_conn_init. */
    zs_err (*conn_new)(zs_setup_net *n, zs_conn *tcp, zs_setup_conn **out);
    /* Fails what is the backend's, calls zs_setup_conn_release and frees c. */
    void (*conn_free)(zs_setup_conn *c);
    /* An accepted stream's hello of len bytes is in c->hello: answer it on c->tcp with
     * zs_setup_answer, or give up with zs_setup_conn_refuse.  The connection is accepted
     * (zs_setup_conn_accepted) here or later, when the backend's own path is joined. */
    void (*answer)(zs_setup_conn *c, uint64_t len);
    /* Fails an open connection with msg (the backend's conn_fail: "BACKEND PEER: MSG"). */
    void (*fail)(zs_setup_conn *c, zs_err err, const char *msg);
    /* The k events epoll reported for the backend's own descriptors (data.ptr NULL: the TCP
     * net's, handled already) and whatever else it polls without a descriptor. */
    void (*io)(zs_setup_net *n, const struct epoll_event *ev, int k);
    /* c is open and marked dirty: its deferred work (frames behind a reported header, sends
     * waiting for room). */
    void (*resume)(zs_setup_conn *c);
    /* Optional: the backend's own timers that passed by now, and the next one (-1: none). */
    void (*expire)(zs_setup_net *n, int64_t now);
    int64_t (*next_timer)(zs_setup_net *n);
} zs_setup_ops;

struct zs_setup_net {
    const zs_setup_ops *ops;
    zs_net *tcp; /* the set-up streams' TCP net */
    int epfd;    /* the TCP net's descriptor (data.ptr NULL) and the backend's */
    zs_evq evq;
    zs_setup_conn *conns;
    zs_setup_listener *listeners;
    zs_region *mrs; /* the backend's regions (core.h's table) */
    zs_rq_pool reqs;
    int send_timeout_ms; /* a rendezvous send's peer must read it within this */
};

struct zs_setup_conn {
    zs_setup_net *net;
    zs_conn *tcp;         /* the set-up stream, kept to notice a dead peer; NULL once failed */
    zs_setup_listener *l; /* accepted: its listener, until the set-up finished */
    int answered;         /* accepted: the peer's hello arrived (and was answered) */
    int ready;            /* the data path works and the caller knows the connection */
    int closed;           /* failed or closed: reason says why */
    int dirty;            /* deferred work waits for the next turn (zs_setup_ops.resume) */
    int64_t setup_deadline;
    char peer[ZS_SETUP_PEER_MAX];
    uint32_t member;
    void *user;
    uint8_t hello[ZS_SETUP_HELLO_MAX];
    zs_mr *hello_mr; /* hello[] registered with the TCP net */
    zs_rq *expect;   /* posted irecvs */
    zs_rq *await;    /* rendezvous sends waiting for the peer's DONE */
    uint64_t next_token;
    char reason[ZS_NET_REASON_MAX];
    zs_setup_conn *prev, *next;
};

struct zs_setup_listener {
    zs_setup_net *net;
    zs_listener *tcp;
    int setup_ms; /* an accepted stream's set-up must finish within this */
    zs_setup_listener *prev, *next;
};

/* An integer tunable from the environment: dflt when unset, or (with a warning naming
 * `who`) when not a number in lo..hi. */
int zs_setup_env_int(const char *who, const char *name, int dflt, int lo, int hi);

/* Opens n's epoll descriptor and TCP net and its request pool; on failure nothing is left
 * open.  zs_setup_net_close undoes it, after the backend closed its own. */
zs_err zs_setup_net_open(zs_setup_net *n, const zs_setup_ops *ops);
/* Frees every connection, quietly (no events). */
void zs_setup_net_close_conns(zs_setup_net *n);
void zs_setup_net_close(zs_setup_net *n);

/* Makes c (cleared by the caller) the connection of stream tcp on n: its peer and member are
 * the stream's, its hello buffer is registered and it is on n's list. */
zs_err zs_setup_conn_init(zs_setup_net *n, zs_setup_conn *c, zs_conn *tcp);
/* Takes c off its list and closes its stream; the backend frees c. */
void zs_setup_conn_release(zs_setup_conn *c);
/* The backend's conn_fail begins here: 0 if c had failed already, else c is closed, its
 * reason is "BACKEND PEER: MSG" (the rest printf-formatted) and its stream is closed. */
int zs_setup_conn_fail(zs_setup_conn *c, const char *why, va_list ap);
/* ... and ends here: ZS_EV_CLOSED with err and the reason, if the caller knows c. */
void zs_setup_emit_closed(zs_setup_conn *c, zs_err err);
/* The accepting side gives up on c: ZS_EV_REFUSED ("BACKEND PEER: set-up failed: WHY"), the
 * peer told why on the stream if it is open, and c freed. */
void zs_setup_conn_refuse(zs_setup_conn *c, const char *why);
/* The accepting side's answer: c->hello (hello_bytes) as a ZS_OP_HELLO frame on c's stream.
 * ZS_OK, or c was refused and freed. */
zs_err zs_setup_answer(zs_setup_conn *c);
/* c is ready: ZS_EV_ACCEPT on its listener. */
void zs_setup_conn_accepted(zs_setup_conn *c);
/* "BACKEND PEER: WHAT on a failed connection: REASON" when c failed, else ZS_OK. */
zs_err zs_setup_check_open(const zs_setup_conn *c, const char *what);
/* A frame f arrived on c: the irecv that expects it, taken off c->expect with its frame set,
 * to receive the payload into; or NULL, with *skip 1 when an irecv expected it but the payload
 * is to be skipped (a cancelled receive's, or one longer than was posted: that receive failed,
 * "exceeds"), 0 when none did (the frame is the caller's header). */
zs_rq *zs_setup_expected(zs_setup_conn *c, const zs_frame *f, int *skip);

/* Lets l (cleared by the caller) listen on addr with opts' authentication; its set-up time is
 * the tunable env (default dflt_ms). */
zs_err zs_setup_listen(zs_setup_net *n, zs_setup_listener *l, const char *addr,
                       const zs_conn_opts *opts, const char *env, int dflt_ms);
/* Stops l: its connections in set-up go on without it, its queued events name none; the
 * backend frees l. */
void zs_setup_listener_drop(zs_setup_listener *l);

/* Turns of the loop until ready(arg) or the deadline (-1: none); 1 if ready. */
int zs_setup_run(zs_setup_net *n, int64_t deadline, int (*ready)(void *), void *arg);

/* Interface functions both backends use as they are (transport.h says what they do). */
int zs_setup_listener_port(const zs_listener *l);
/* The set-up listener's endpoint (tcp.c's): where peers connect to. */
zs_err zs_setup_listener_endpoint(const zs_listener *l, const char *toward, char *out, size_t cap);
zs_err zs_setup_accept(zs_listener *l, int timeout_ms, zs_conn **out);
const char *zs_setup_conn_peer(const zs_conn *c);
void zs_setup_conn_set_user(zs_conn *c, void *user);
void *zs_setup_conn_user(const zs_conn *c);
uint32_t zs_setup_conn_member(const zs_conn *c);
int zs_setup_conn_closed(const zs_conn *c);
void zs_setup_conn_close(zs_conn *c);
zs_err zs_setup_irecv(zs_conn *c, uint64_t id, zs_mr *mr, size_t off, size_t cap, void *user,
                      zs_req **req);
zs_err zs_setup_test(zs_req *req, int *done, zs_frame *f);
zs_err zs_setup_wait(zs_req *req, int timeout_ms, int *done, zs_frame *f);
zs_err zs_setup_flush(zs_net *net);
zs_err zs_setup_poll(zs_net *net, zs_event *ev, int max, int timeout_ms, int *n);
int zs_setup_wait_fd(zs_net *net, int *timeout_ms);

#endif
