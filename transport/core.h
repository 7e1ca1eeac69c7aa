/*
 * core: what every data-plane backend (tcp.c, rdma.c) needs and none should write again: the
 * event queue that poll() hands out, the monotonic clock and deadlines of blocking calls, and
 * bounded message formatting.  Nothing here knows about sockets or verbs.
 *
 * The event queue keeps the order in which events were produced.  Forgetting a connection
 * (conn_close) leaves tombstones where its own events were (ACCEPT, HEADER, CLOSED) and keeps
 * request completions in place with the connection pointer cleared, so a request's single
 * outcome is never lost (transport.h, "Completions").
 */
#ifndef ZS_TRANSPORT_CORE_H
#define ZS_TRANSPORT_CORE_H

#include <stddef.h>
#include <stdint.h>

#include "transport/transport.h"

typedef struct {
    zs_event *ring; /* cap entries; len of them from head, tombstones have type 0 */
    size_t head, len, cap;
    size_t live; /* entries that are not tombstones: what poll() would hand out */
} zs_evq;

/* Appends an event of `type` about conn (may be NULL) with every other field cleared, and
 * returns it for the caller to fill in; NULL when memory ran out (then the event is lost,
 * logged with `who`). */
zs_event *zs_evq_push(zs_evq *q, zs_ev_type type, zs_conn *conn, const char *who);
/* Tombstones the events about conn; request completions keep their place with conn NULL. */
void zs_evq_forget(zs_evq *q, const zs_conn *conn);
/* Takes the oldest live event into *out; 0 when there is none. */
int zs_evq_pop(zs_evq *q, zs_event *out);
/* Frees the ring; the queue is empty afterwards. */
void zs_evq_free(zs_evq *q);

/* CLOCK_MONOTONIC in milliseconds. */
int64_t zs_net_now_ms(void);
/* The deadline of a timeout: -1 (none) for a negative timeout. */
int64_t zs_net_deadline(int timeout_ms);
/* Milliseconds left until deadline, for poll(2)-like calls: -1 for none, 0 when passed. */
int zs_net_remaining_ms(int64_t deadline);

/* Copies src (NULL: "") into dst[cap], cut short if needed and always terminated. */
void zs_net_copy_str(char *dst, size_t cap, const char *src);
/* snprintf for messages, where cutting a long one short is the right outcome. */
void zs_net_fmt(char *dst, size_t cap, const char *f, ...) __attribute__((format(printf, 3, 4)));

#endif
