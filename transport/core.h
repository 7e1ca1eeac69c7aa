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

/* A handle-less request's outcome as its one event (transport.h, "Completions"): ZS_EV_SEND
 * or ZS_EV_RECV on q with the frame, the cookie, the result and its message (err, "" on
 * success). */
void zs_evq_outcome(zs_evq *q, int is_send, zs_conn *conn, const zs_frame *f, void *user, zs_err st,
                    const char *err, const char *who);

/* The message of a request that failed because its connection went away:
 * "send of push id 7: REASON" or "receive of id 7: REASON". */
void zs_net_fail_text(char *out, size_t cap, int is_send, const zs_frame *f, const char *reason);

/* Checks that [off, off + len) of a registered region of region_len bytes, registered for
 * region_access, may be used for `access` (ZS_MR_SEND or ZS_MR_RECV) by `what` ("send",
 * "receive") on the connection to peer; has_region 0: no region was given.  The message
 * starts with "BACKEND WHAT PEER: ". */
zs_err zs_net_check_region(const char *backend, const char *what, const char *peer, int has_region,
                           size_t region_len, int region_access, size_t off, uint64_t len,
                           int access);

/* Little-endian fields of wire headers (frame.c, the handshake, rdma.c's messages). */
static inline void zs_le_put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void zs_le_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline void zs_le_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t zs_le_get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}
static inline uint32_t zs_le_get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t zs_le_get64(const uint8_t *p)
{
    return (uint64_t)zs_le_get32(p) | (uint64_t)zs_le_get32(p + 4) << 32;
}

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
