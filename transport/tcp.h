/*
 * tcp: the TCP backend of the data-plane transport (transport.h), an epoll event loop over
 * non-blocking sockets.  zs_tcp_ops is its function table; the functions are also callable
 * by name (zs_tcp_poll, ...), with the meaning documented in transport.h.
 *
 * Choices (docs/transport.md has the reasons):
 *   - Authentication (zs_conn_opts.auth): connect() runs the client side of the handshake on
 *     each of its sockets before it returns (within the connect timeout); a listener runs the
 *     server side of each accepted socket in the event loop, at most 64 at once (more are
 *     closed at once) and each within ZS_TCP_HANDSHAKE_MS, before the socket becomes a
 *     connection.  A listener out of descriptors (EMFILE) rests 100 ms instead of spinning,
 *     and its log lines are rate-limited.
 *   - Every socket has TCP_NODELAY; SO_SNDBUF/SO_RCVBUF are set only when asked (zs_tcp_conn_opts,
 * or ZS_TCP_SNDBUF / ZS_TCP_RCVBUF), before connect() or listen() so that the window scale is
 * negotiated for them; otherwise the kernel autotunes.
 *   - Sends are sendmsg(MSG_NOSIGNAL) of an iovec list: header and payload straight from the
 *     registered buffer, and several queued frames in one call.  No SIGPIPE, no copy.
 *   - Receives read the 64 header bytes into the stream's own header buffer, and the payload
 *     with recv() straight into its destination; a skipped payload goes through a 64 KiB
 *     scratch buffer.  Partial reads and writes resume where they stopped; EINTR is retried,
 *     EAGAIN waits for epoll (edge-triggered, so each socket costs one epoll_ctl in its life).
 *   - A connection made with conns = k > 1 has k sockets; each frame goes whole on one of
 *     them, the one with the fewest unsent bytes (ties round-robin).  A large payload is not
 *     cut across sockets: a 4 MiB range that should use two streams is two frames.  A server
 *     sees the k sockets as k independent connections (each with its own authentication
 *     handshake) and answers each request on the socket it came from; the client matches
 *     replies by id.
 *   - A malformed header (or any bytes that are not our protocol) closes that connection
 *     only: first a best-effort ZS_OP_ERROR frame with status ZS_FS_BAD_FRAME and the
 *     decoder's message (id taken from bytes 16..23 as sent), then up to 256 KiB of what the
 *     peer already sent is read and dropped so the close is a FIN rather than a reset, then
 *     ZS_EV_CLOSED with err ZS_ERR_FORMAT and the message.
 *   - Fairness: one socket reads or writes at most 16 MiB per turn of the loop before the
 *     others get theirs.
 *
 *   - Batched sends (zs_net_opts.batch_sends): a send marks its socket for the next turn of
 *     the loop instead of writing at once; that turn writes every frame queued by then in one
 *     sendmsg() (up to 32).  For 64 KiB frames on loopback this is worth ~2x, because each
 *     sendmsg() pushes segments and wakes the peer.
 *
 * Tunables (read at open(), set_opts(), connect() or listen() for an option field left 0):
 *   ZS_TCP_BATCH_SENDS         1 batches sends (default 0)
 *   ZS_TCP_CONNS               sockets per connection (default 1, at most ZS_NET_MAX_CONNS)
 *   ZS_TCP_SNDBUF, ZS_TCP_RCVBUF   socket buffer bytes, -1 for kernel autotuning (default:
 *                              autotuning, but a send buffer of 512 KiB towards a peer on
 *                              this host: docs/transport.md)
 *   ZS_TCP_CONNECT_TIMEOUT_MS  connect timeout (default 10000)
 *   ZS_TCP_HANDSHAKE_MS        how long an accepted socket's handshake may take (default 5000)
 */
#ifndef ZS_TCP_H
#define ZS_TCP_H

#include "transport/transport.h"

/* TCP's own options of connect() and listen(): zs_conn_opts.backend, with backend_name "tcp"
 * (options meant for another backend are ignored).  Zero: the tunable, or the default. */
typedef struct {
    int sndbuf_bytes; /* per socket SO_SNDBUF; -1 = kernel default (autotuning); 0 = 512 KiB
                         for a peer on this host, autotuning for others (tcp.c) */
    int rcvbuf_bytes; /* per socket SO_RCVBUF; -1 = kernel default (autotuning) */
} zs_tcp_conn_opts;

zs_err zs_tcp_open(zs_net **out);
zs_err zs_tcp_set_opts(zs_net *net, const zs_net_opts *opts);
void zs_tcp_close(zs_net *net);
zs_err zs_tcp_listen(zs_net *net, const char *addr, const zs_conn_opts *opts, zs_listener **out);
int zs_tcp_listener_port(const zs_listener *l);
void zs_tcp_listener_close(zs_listener *l);
zs_err zs_tcp_accept(zs_listener *l, int timeout_ms, zs_conn **out);
zs_err zs_tcp_connect(zs_net *net, const char *addr, const zs_conn_opts *opts, zs_conn **out);
const char *zs_tcp_conn_peer(const zs_conn *c);
void zs_tcp_conn_set_user(zs_conn *c, void *user);
void *zs_tcp_conn_user(const zs_conn *c);
uint32_t zs_tcp_conn_member(const zs_conn *c);
int zs_tcp_conn_closed(const zs_conn *c);
void zs_tcp_conn_close(zs_conn *c);
zs_err zs_tcp_reg_mr(zs_net *net, void *base, size_t len, int access, zs_mr **out);
zs_err zs_tcp_dereg_mr(zs_mr *mr);
zs_err zs_tcp_reg_dmabuf_mr(zs_net *net, const zs_dmabuf *buf, int access, zs_mr **out);
zs_err zs_tcp_isend(zs_conn *c, const zs_frame *f, zs_mr *mr, size_t off, void *user, zs_req **req);
zs_err zs_tcp_isend_inline(zs_conn *c, const zs_frame *f, const void *data, void *user,
                           zs_req **req);
zs_err zs_tcp_irecv(zs_conn *c, uint64_t id, zs_mr *mr, size_t off, size_t cap, void *user,
                    zs_req **req);
zs_err zs_tcp_recv_payload(zs_conn *c, zs_mr *mr, size_t off, void *user, zs_req **req);
zs_err zs_tcp_discard(zs_conn *c);
zs_err zs_tcp_test(zs_req *req, int *done, zs_frame *f);
zs_err zs_tcp_wait(zs_req *req, int timeout_ms, int *done, zs_frame *f);
zs_err zs_tcp_cancel(zs_req *req);
zs_err zs_tcp_listener_endpoint(const zs_listener *l, const char *toward, char *out, size_t cap);
zs_err zs_tcp_mr_export(zs_mr *mr, zs_mr_desc *out);
zs_err zs_tcp_iread(zs_conn *c, zs_mr *mr, size_t off, const zs_mr_desc *remote,
                    uint64_t remote_off, size_t len, void *user, zs_req **req);
zs_err zs_tcp_iwrite(zs_conn *c, zs_mr *mr, size_t off, const zs_mr_desc *remote,
                     uint64_t remote_off, size_t len, int notify, uint32_t imm, void *user,
                     zs_req **req);
zs_err zs_tcp_flush(zs_net *net);
zs_err zs_tcp_poll(zs_net *net, zs_event *ev, int max, int timeout_ms, int *n);
int zs_tcp_wait_fd(zs_net *net, int *timeout_ms);

/* The local address of c's first stream (getsockname), for a backend that runs its set-up over
 * TCP and picks its own interface by it (rdma.c).  Returns 0, or -1 with errno set. */
struct sockaddr_storage;
int zs_tcp_conn_local(const zs_conn *c, struct sockaddr_storage *out);

/* SO_SNDBUF of c's first stream as the kernel reports it (twice what was set), or -1: for
 * tests of the send buffer a stream gets (tcp.c, TCP_LOCAL_SNDBUF). */
int zs_tcp_conn_sndbuf(const zs_conn *c);

/* Makes a connection of an already connected stream socket fd (TCP, or one end of an
 * AF_UNIX socketpair in tests and the fuzzer), with peer name `peer` for messages, without a
 * handshake: the caller vouches that it is member `member` (0: none).  On success the
 * connection owns fd (made non-blocking); on failure the caller still does. */
zs_err zs_tcp_adopt(zs_net *net, int fd, const char *peer, uint32_t member, zs_conn **out);

#endif
