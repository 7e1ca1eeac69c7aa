/*
 * transport: the data-plane interface.  Workers fetch parameter ranges from partition servers
 * and push gradient ranges to them as frames (transport/frame.h: a 64-byte header, then
 * `length` payload bytes); this header is what every backend (tcp.c now, rdma.c and shm.c
 * later) implements, as one versioned table of functions in the style of NCCL's net_v8.
 *
 * Objects.
 *   zs_net       one event loop with everything attached to it: listeners, connections,
 *                registered memory, requests.  A zs_net and everything it owns is used by one
 *                thread at a time (no locks inside); a program with several driving threads
 *                opens one zs_net per thread.  A zs_net may hold connections to many peers.
 *   zs_listener  a bound, listening endpoint; new connections arrive as ZS_EV_ACCEPT events.
 *   zs_conn      a connection to one peer.  A connecting side may ask for several underlying
 *                streams per connection (zs_conn_opts.conns); frames are then spread over them
 *                (how is the backend's: see its header) and frames sent on one connection are
 *                ordered only when it has one stream.  Replies are matched by frame id, never
 *                by order.
 *   zs_mr        a registered memory region.  Payloads are sent only from, and received only
 *                into, registered memory: TCP just records the range, RDMA pins and registers
 *                it with the NIC.  Register once (it may be slow), use for many frames.
 *   zs_req       an in-flight send or receive.
 *
 * Receiving.  Frames arrive header first.  There are two ways to say where a payload goes:
 *   - expected receive (irecv): before sending a request, the client posts "the frame with
 *     id X on this connection goes to mr[off, off+cap)".  When that header arrives its payload
 *     is read straight into the buffer and the request completes; no event for the header.
 *   - header first (ZS_EV_HEADER): any other frame is reported by poll() with its decoded
 *     header; the payload waits in the backend (for TCP, in the socket) until the caller
 *     decides: recv_payload() gives the destination, discard() skips the payload (to reject
 *     a frame and keep the connection), conn_close() drops the connection.  While a header
 *     with a payload is pending, nothing more is read from that stream (back-pressure).
 *     A header with length 0 is complete as reported and needs no call.
 * Either way the payload is written straight into its destination, with no intermediate
 * copy, and a receive completes only when the whole payload has arrived.  If the peer goes
 * away mid-payload the receive fails (ZS_ERR_IO, "mid-payload"): the destination may hold
 * part of the bytes and must not be used.
 *
 * Completions.  Every send or receive call takes `zs_req **req`:
 *   - req != NULL: the caller gets a handle, and learns the outcome only from test() or
 *     wait() (which free the handle once they report it done) or gives up with cancel().
 *   - req == NULL: no handle; the outcome comes as exactly one ZS_EV_SEND or ZS_EV_RECV from
 *     poll() carrying the `user` cookie, success or failure, even if the connection is
 *     closed first (then ev.conn is NULL).  A server can count buffer references on this.
 * A call that returns an error started nothing; once a call returned ZS_OK, every outcome,
 * including a connection failing, comes through its request.  A send completes when its
 * buffer may be reused (for TCP: handed to the kernel), not when the peer has it.
 *
 * What may block: connect() (up to its timeout), wait() and poll() and accept() (up to the
 * timeout they are given), close(); nothing else.  A loop that also waits for other things
 * (a control socket, another thread) waits on wait_fd() together with them.  All progress --
 * reading, writing, accepting -- happens inside test(), wait(), poll(), accept() and flush(), and
 * sends also write immediately unless the net batches them (zs_net_opts); events produced while a
 * thread is in test()/wait() are queued for its next poll().  A connection fails (ZS_EV_CLOSED,
 * reason in the event) on a peer closing, an I/O error, or a malformed header; a backend then tells
 * the peer why if it can (ZS_FS_BAD_FRAME) and closes only that connection.  A closed connection
 * still needs conn_close() to free it.
 *
 * Authentication.  With zs_conn_opts.auth, every stream opens with a mutual challenge-response
 * before any frame (docs/security.md): the connecting side names its member id and both sides
 * prove, with fresh nonces, that they know that member's token (common/secret.h).  A server
 * finds the token with auth->token_of, which refuses unknown and departed members.  Only then
 * is the stream a connection (ZS_EV_ACCEPT), and conn_member() says whose; a failed or stalled
 * handshake is closed and reported as ZS_EV_REFUSED, never as a connection.  Both sides must
 * agree on using it: a stream without the handshake meets one that expects it and fails.
 *
 * Results are zs_err (common/err.h) with a message naming the peer and the reason.
 */
#ifndef ZS_TRANSPORT_H
#define ZS_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/err.h"
#include "common/secret.h"
#include "transport/frame.h"

#define ZS_TRANSPORT_OPS_VERSION 6

struct zs_transport_ops;

/* The longest payload isend_inline() copies (an error text, a small reply). */
#define ZS_NET_INLINE_MAX ZS_FRAME_MAX_ERROR_TEXT
/* Room for a failure's message in an event. */
#define ZS_NET_REASON_MAX 256
/* The most streams one connection may have. */
#define ZS_NET_MAX_CONNS 16

/* Opaque handles; each backend defines its own objects behind them. */
typedef struct zs_net zs_net;
typedef struct zs_listener zs_listener;
typedef struct zs_conn zs_conn;
typedef struct zs_mr zs_mr;
typedef struct zs_req zs_req;

/* Access a region is registered for (RDMA maps them to local/remote read/write rights).
 * ZS_MR_REMOTE_READ and ZS_MR_REMOTE_WRITE open it to one-sided reads and writes by the peers
 * this net is connected to, through the descriptor mr_export() gives.  ZS_MR_PINNED, with any
 * of them, says that someone else holds the pages where they are (a GPU driver's page-locked
 * buffer): the backend must not move them (shm then reads the region from the owner's memory
 * with process_vm_readv instead of moving its pages into a shared memfd). */
enum {
    ZS_MR_SEND = 1,
    ZS_MR_RECV = 2,
    ZS_MR_REMOTE_READ = 4,
    ZS_MR_REMOTE_WRITE = 8,
    ZS_MR_PINNED = 16
};

/* Memory given as a dma-buf: device memory (a GPU's) that its driver exported as a file
 * descriptor, for reg_dmabuf_mr().  The region is [addr, addr + len) as the caller names it:
 * offsets of sends, receives and one-sided operations count from addr as for any region, and the
 * NIC reaches the bytes through the dma-buf, never through the CPU.  So that the backend never
 * touches the bytes with the CPU (they may not be mapped in this process at all), it sends a
 * region's payloads by rendezvous however small; the few bytes it must place itself (a short
 * payload the peer sent inline, an error's text) it hands to `copy`, which moves n bytes from
 * host memory into the region (to_region 1) or back (0) and returns 0, or -errno.  copy is called
 * from the net's progress functions, on the thread that drives the net. */
typedef struct {
    int fd;          /* the dma-buf; the backend takes its own reference (the caller may close
                        fd once reg_dmabuf_mr returned) */
    uint64_t offset; /* of the region's first byte in the dma-buf */
    size_t len;      /* bytes */
    void *addr;      /* the region's first byte as the caller names it (a device pointer) */
    int (*copy)(void *ctx, void *dst, const void *src, size_t n, int to_region);
    void *ctx;
} zs_dmabuf;

/* A registered region as a peer names it in one-sided reads and writes: exported by
 * mr_export() on the side that owns the memory, carried to the peer by the caller (in a frame's
 * payload, on the control plane: zs_mr_desc_encode), and given to iread()/iwrite() on a
 * connection to the owner.  addr is the region's first byte in the owner's address space,
 * key names the registration (RDMA: the rkey; tcp and shm: a random key of the owner's net),
 * so that a descriptor outlives nothing: once the owner deregisters the region, operations
 * that name it fail. */
typedef struct {
    uint64_t addr;
    uint64_t len;
    uint32_t key;
    uint32_t access; /* ZS_MR_REMOTE_READ and/or ZS_MR_REMOTE_WRITE */
} zs_mr_desc;

/* A descriptor on the wire: addr, len, key, access, little-endian. */
#define ZS_MR_DESC_BYTES 24
void zs_mr_desc_encode(const zs_mr_desc *d, uint8_t out[ZS_MR_DESC_BYTES]);
/* ZS_ERR_FORMAT when access has other bits than the remote ones or none, or addr + len wraps. */
zs_err zs_mr_desc_decode(const uint8_t in[ZS_MR_DESC_BYTES], zs_mr_desc *d);

/* Options of a net, given to set_opts() after open().  Zero in a field means: the backend's
 * tunable (read at open()) or its default. */
typedef struct {
    int batch_sends; /* 1: a send is only queued, and written at the net's next poll(),
                        test(), wait(), accept() or flush(), together with the others queued
                        by then (one system call and one wake-up of the peer for a batch of
                        frames: a server answering the events of one poll(), a client issuing
                        the pieces of a range); -1 or the default: written at once, as far as
                        the socket takes it */
} zs_net_opts;

/* A data-plane identity (connect) or the way to check one (listen). */
typedef struct {
    /* connect: the member id this side proves, and its token */
    uint32_t member;
    uint8_t token[ZS_TOKEN_BYTES];
    /* listen: fills token with member's token and returns 0, or returns -1 to refuse the
     * member (unknown, or gone), or -2 when it cannot tell yet (the client retries within its
     * connect timeout), with a reason of at most ZS_NET_REASON_MAX / 2 bytes in why.  Called from
     * inside the net's progress functions. */
    int (*token_of)(void *ctx, uint32_t member, uint8_t token[ZS_TOKEN_BYTES], char *why);
    void *ctx;
} zs_auth;

/* Options of connect() and listen().  Zero in a field means: the backend's tunable (an
 * environment variable, see the backend's header) or its default. */
typedef struct {
    int conns;              /* connect: streams per connection, 1..ZS_NET_MAX_CONNS */
    int connect_timeout_ms; /* connect: give up after this long (handshake included) */
    const zs_auth *auth;    /* NULL: no handshake; else it must outlive the listener */
    const void *backend;    /* the backend's own options (tcp: zs_tcp_conn_opts in tcp.h, rdma:
                               zs_rdma_conn_opts in rdma.h), for the backend named in
                               backend_name; NULL: its tunables */
    const char *backend_name;
    const struct zs_transport_ops *ops; /* zs_client_open (client.h) only: the backend it
                                           connects with; NULL: tcp */
} zs_conn_opts;

typedef enum {
    ZS_EV_ACCEPT = 1,  /* a new connection on ev.listener: ev.conn, already usable */
    ZS_EV_HEADER = 2,  /* a frame ev.frame arrived on ev.conn that no irecv expected; if
                          ev.frame.length > 0 call recv_payload(), discard() or conn_close() */
    ZS_EV_RECV = 3,    /* a handle-less receive finished: ev.user, ev.frame, ev.err */
    ZS_EV_SEND = 4,    /* a handle-less send finished: ev.user, ev.err; its buffer is free */
    ZS_EV_CLOSED = 5,  /* ev.conn failed or was closed by the peer: ev.err, ev.reason; all its
                          requests were completed (failed) before this event */
    ZS_EV_REFUSED = 6, /* a stream accepted on ev.listener failed its handshake, stalled in it,
                          or found no room; it is closed (ev.conn NULL), ev.reason says why */
    ZS_EV_WRITTEN = 7, /* the peer on ev.conn wrote into one of this net's regions with
                          iwrite(..., notify): ev.frame.offset is the first byte's address,
                          ev.frame.count the bytes, ev.frame.chunk the immediate value; the
                          bytes are in place */
} zs_ev_type;

typedef struct {
    zs_ev_type type;
    zs_conn *conn;                  /* NULL for a request whose connection was closed locally */
    zs_listener *listener;          /* ZS_EV_ACCEPT */
    zs_frame frame;                 /* ZS_EV_HEADER, ZS_EV_RECV: the frame's header */
    void *user;                     /* ZS_EV_SEND, ZS_EV_RECV: the cookie given with the request */
    zs_err err;                     /* ZS_EV_SEND, ZS_EV_RECV, ZS_EV_CLOSED: ZS_OK or the failure */
    char reason[ZS_NET_REASON_MAX]; /* the failure's message; "" when err is ZS_OK */
} zs_event;

typedef struct zs_transport_ops {
    int version;      /* ZS_TRANSPORT_OPS_VERSION */
    const char *name; /* "tcp" */

    /* Creates an event loop.  Cheap; does not block. */
    zs_err (*open)(zs_net **out);
    /* Sets the net's options (zs_net_opts); call before use.  Does not block. */
    zs_err (*set_opts)(zs_net *net, const zs_net_opts *opts);
    /* Closes every connection and listener, frees every request (outstanding handles become
     * invalid), registered region and queued event.  No events are produced.  May block
     * briefly (socket close). */
    void (*close)(zs_net *net);

    /* Binds and listens on "HOST:PORT" (HOST may be a name, an address, "*" or empty for all
     * addresses; PORT 0 picks a free port).  opts (may be NULL) set accepted streams' buffer
     * sizes.  Does not block. */
    zs_err (*listen)(zs_net *net, const char *addr, const zs_conn_opts *opts, zs_listener **out);
    /* The port a listener is bound to (the chosen one for port 0). */
    int (*listener_port)(const zs_listener *l);
    /* The endpoint peers give connect() to reach l, as the backend names it (tcp, rdma and
     * shm: "HOST:PORT", "[V6]:PORT"; their set-up runs over TCP).  The control plane carries
     * it as an opaque string from the server that listens to the workers that connect.  A
     * listener bound to one address names that address; one bound to all of them names the
     * address of this host that the route to `toward` leaves from (a host or address the
     * peers are known to reach, such as the coordinator's), else the host's name, so that
     * peers on other hosts can reach it.  Does not block (toward is resolved numerically or
     * by the resolver's cache: a name may block briefly). */
    zs_err (*listener_endpoint)(const zs_listener *l, const char *toward, char *out, size_t cap);
    /* Stops listening; connections accepted from it stay open. */
    void (*listener_close)(zs_listener *l);
    /* Blocks up to timeout_ms (-1: forever) for a new connection on l, driving all progress
     * of the net meanwhile, and takes it out of the event queue (no ZS_EV_ACCEPT for it).
     * *out is NULL on timeout.  A poll()-driven server needs no accept(). */
    zs_err (*accept)(zs_listener *l, int timeout_ms, zs_conn **out);

    /* Connects to "HOST:PORT" with opts (may be NULL); blocks until every stream is
     * established or opts' timeout passes (then fails, naming the address). */
    zs_err (*connect)(zs_net *net, const char *addr, const zs_conn_opts *opts, zs_conn **out);
    /* "HOST:PORT" of the peer, for logs; valid until conn_close(). */
    const char *(*conn_peer)(const zs_conn *c);
    /* A pointer the caller associates with the connection (NULL at first). */
    void (*conn_set_user)(zs_conn *c, void *user);
    void *(*conn_user)(const zs_conn *c);
    /* The member id the peer proved in the handshake (an accepted connection), the one this
     * side proved (a connected one), or 0 without authentication. */
    uint32_t (*conn_member)(const zs_conn *c);
    /* 1 once the connection has failed or been closed by the peer, else 0. */
    int (*conn_closed)(const zs_conn *c);
    /* Closes and frees c.  Its unfinished requests fail: handles report the failure through
     * test()/wait(); handle-less ones are reported as events with ev.conn NULL.  Events
     * already queued for c that name it (ZS_EV_HEADER, ZS_EV_CLOSED) are dropped. */
    void (*conn_close)(zs_conn *c);

    /* Registers [base, base+len) for access (ZS_MR_SEND | ZS_MR_RECV).  May be slow (RDMA
     * pins pages); not on the hot path.  The memory must outlive the registration. */
    zs_err (*reg_mr)(zs_net *net, void *base, size_t len, int access, zs_mr **out);
    /* Deregisters; fails (ZS_ERR_INVALID) while a request still uses the region.  Also for a
     * region of reg_dmabuf_mr(). */
    zs_err (*dereg_mr)(zs_mr *mr);

    /* Sends frame f: the header, then f->length bytes from mr at byte offset off (mr may be
     * NULL when f->length is 0).  f is validated as zs_frame_decode() would; magic and
     * version are filled in.  The payload must stay untouched until the send completes.
     * Does not block. */
    zs_err (*isend)(zs_conn *c, const zs_frame *f, zs_mr *mr, size_t off, void *user, zs_req **req);
    /* As isend, but the payload (f->length <= ZS_NET_INLINE_MAX bytes at data) is copied
     * into the request, so it needs no registered memory: error texts and small replies. */
    zs_err (*isend_inline)(zs_conn *c, const zs_frame *f, const void *data, void *user,
                           zs_req **req);
    /* Expects the frame with id `id` on c: its payload goes to mr[off, off+cap).  On arrival
     * the request completes with that frame's header (which may be a ZS_OP_ERROR with its
     * text in the buffer); a payload longer than cap is skipped and the request fails
     * ("exceeds").  Post before sending the request the reply answers.  Ids from 2^63 up are
     * the transport's own (one-sided operations) and refused.  Does not block. */
    zs_err (*irecv)(zs_conn *c, uint64_t id, zs_mr *mr, size_t off, size_t cap, void *user,
                    zs_req **req);
    /* Reads the payload of c's pending header (ZS_EV_HEADER) into mr at off; its length must
     * fit.  On failure the header stays pending.  Fails too on a connection that failed
     * since the header was reported (ZS_EV_CLOSED follows).  Does not block. */
    zs_err (*recv_payload)(zs_conn *c, zs_mr *mr, size_t off, void *user, zs_req **req);
    /* Skips the payload of c's pending header; the connection goes on with the next frame.
     * Fails on a connection that failed meanwhile, as recv_payload.  Does not block. */
    zs_err (*discard)(zs_conn *c);
    /* Reading the payload of c's pending header where it lies, with no copy, when the backend
     * holds its bytes in memory this process can read: shm a payload in pages of the sender's
     * that are mapped here (registered regions of 1 MiB or more) or one small enough to travel
     * inline.  Sets *data to the first of the frame's `length` bytes, or to NULL when the
     * payload cannot be read in place (tcp: it waits in the socket; rdma: in the peer's memory;
     * shm: a small region read with process_vm_readv); then the header is still pending, and
     * recv_payload() or discard() takes it.  A view lasts until view_release(c) (the payload is
     * taken: the sender's send completes, and the connection goes on with the next frame), or
     * discard() or conn_close(); meanwhile the caller makes no other call on c's net, since
     * progress could close c and unmap the bytes.  The bytes are the sender's: a sender that
     * writes its buffer before its send completes may change them under the reader, as it may
     * during any copy, so read each byte once.  Fails as recv_payload (no pending header, a
     * connection that failed), and on a payload that lies outside the sender's region (the
     * connection fails).  Does not block. */
    zs_err (*view_payload)(zs_conn *c, const void **data);
    zs_err (*view_release)(zs_conn *c);

    /* Makes progress without blocking; *done is 1 when req finished, in which case the
     * request's outcome is returned (ZS_OK or its failure, with the message), *f (if not
     * NULL) receives the frame's header (receives) and req is freed. */
    zs_err (*test)(zs_req *req, int *done, zs_frame *f);
    /* As test(), but blocks up to timeout_ms (-1: forever) for req to finish, driving all
     * progress of its net.  On timeout *done is 0 and req stays valid. */
    zs_err (*wait)(zs_req *req, int timeout_ms, int *done, zs_frame *f);
    /* Gives up on a request and frees the handle; the destination or source is no longer
     * touched once cancel returns.  An irecv not yet matched stays registered without a
     * buffer, so that a late reply with its id is skipped silently (the id stays taken until
     * then); a receive in progress finishes into a scratch buffer; a send not yet started
     * is withdrawn.  A send partly written cannot be recalled: cancel fails (ZS_ERR_INVALID)
     * and the request stays.  A finished request's outcome is dropped. */
    zs_err (*cancel)(zs_req *req);

    /* One-sided operations.  The peer's application takes no part: on tcp and shm the peer's
     * net serves them inside its progress functions and hands its caller no event (but
     * ZS_EV_WRITTEN for a notifying write); on rdma the NICs do (RDMA READ and WRITE, and a
     * frame behind a notifying write: docs/transport.md).  The peer checks every operation against
     * its registrations: an unknown or deregistered key, bytes outside the region, or access it was
     * not registered for fail the request ("bad key"); on RDMA the NIC's remote access error also
     * fails the connection (ZS_EV_CLOSED), as verbs do.  Nothing orders them against the peer's own
     * use of the region: a read of bytes the peer is rewriting may see some of each (the caller's
     * protocol, a version number or a notification, says when bytes are whole).
     * Completions are as for sends and receives: a handle, or one ZS_EV_RECV (iread) or
     * ZS_EV_SEND (iwrite) whose ev.frame.op is ZS_OP_RMA_READ or ZS_OP_RMA_WRITE.  cancel()
     * fails (ZS_ERR_INVALID) once the operation may have started: its bytes may still move.
     *
     * Exports mr's descriptor; fails unless mr was registered with ZS_MR_REMOTE_READ or
     * ZS_MR_REMOTE_WRITE.  Does not block. */
    zs_err (*mr_export)(zs_mr *mr, zs_mr_desc *out);
    /* Reads len bytes at byte remote_off of the peer's region `remote` into mr at off (mr
     * registered for ZS_MR_RECV).  Completes when they are in mr.  Does not block. */
    zs_err (*iread)(zs_conn *c, zs_mr *mr, size_t off, const zs_mr_desc *remote,
                    uint64_t remote_off, size_t len, void *user, zs_req **req);
    /* Writes len bytes of mr at off (registered for ZS_MR_SEND) to byte remote_off of the
     * peer's region `remote`.  Completes when they are in the peer's memory.  With notify, the
     * peer's net reports ZS_EV_WRITTEN carrying imm once they are.  Does not block. */
    zs_err (*iwrite)(zs_conn *c, zs_mr *mr, size_t off, const zs_mr_desc *remote,
                     uint64_t remote_off, size_t len, int notify, uint32_t imm, void *user,
                     zs_req **req);

    /* Writes what batched sends have queued (and resumes any other work that waits for a
     * turn of the loop) without blocking. */
    zs_err (*flush)(zs_net *net);
    /* Drives all progress of net and returns up to max queued events in ev[0..*n).  Blocks
     * up to timeout_ms (-1: forever, 0: not at all) until at least one event is ready.
     * Fails only if the event loop itself fails (then the net should be closed). */
    zs_err (*poll)(zs_net *net, zs_event *ev, int max, int timeout_ms, int *n);
    /* Waiting for the net together with other things.  Returns a file descriptor that polls
     * readable (poll(2), zmq_poll) when the net has I/O to make progress on, and sets
     * *timeout_ms to how long such a wait may last before the net needs a turn anyway: 0 when
     * it has work now (queued events, sockets to resume), its next timer otherwise, -1 when it
     * has none.  After the wait, drive the net (poll with timeout 0, test, wait).  So a loop
     * blocks until something happens instead of waking on a timer.  Does not block. */
    int (*wait_fd)(zs_net *net, int *timeout_ms);

    /* Version 6.  Registers the dma-buf `buf` (see zs_dmabuf) for access as reg_mr() does
     * (ZS_MR_PINNED is implied: the pages are the exporter's).  rdma registers it with the NIC
     * (ibv_reg_dmabuf_mr: GPUDirect RDMA where the NIC and the exporter allow it); tcp and shm
     * cannot reach device memory and refuse with ZS_ERR_UNSUPPORTED, naming themselves, as does
     * rdma where the device, its driver or the build lacks dma-buf registration (the errno in
     * the message).  May be slow; not on the hot path. */
    zs_err (*reg_dmabuf_mr)(zs_net *net, const zs_dmabuf *buf, int access, zs_mr **out);
} zs_transport_ops;

/* The backends: TCP (transport/tcp.h), RDMA (transport/rdma.h), shared memory
 * (transport/shm.h). */
extern const zs_transport_ops zs_tcp_ops;
extern const zs_transport_ops zs_rdma_ops;
extern const zs_transport_ops zs_shm_ops;

/* The backend named `name` ("tcp", "rdma", "shm"), or NULL. */
static inline const zs_transport_ops *zs_transport_find(const char *name)
{
    const zs_transport_ops *all[] = {&zs_tcp_ops, &zs_rdma_ops, &zs_shm_ops};
    for (size_t i = 0; name && i < sizeof all / sizeof *all; i++)
        if (!strcmp(name, all[i]->name))
            return all[i];
    return NULL;
}

#endif
