/*
 * rdma: the RDMA backend of the data-plane transport (transport.h), on libibverbs with
 * reliable-connected (RC) queue pairs.  zs_rdma_ops is its function table; the meaning of
 * every call is transport.h's.  docs/transport.md has the protocol and a line-rate model.
 *
 * Set-up.  A connection starts as a TCP stream of the TCP backend (tcp.h), with its
 * authentication handshake when zs_conn_opts.auth is given, so RDMA connections are proved
 * exactly as TCP ones.  Over that stream each side sends one ZS_OP_HELLO frame with its queue
 * pair's number, first packet sequence number, GID, LID, path MTU and receive credits; then
 * both move their QP to ready-to-send.  The stream stays open beside the QP: a peer process
 * that dies closes it at once, where a QP alone would notice only after its retries.
 *
 * Device.  A net opens one device, at its first listen(), connect() or reg_mr(): the one
 * named by zs_rdma_conn_opts.device (or ZS_RDMA_DEVICE), else the one whose GID table holds
 * the listening or connecting address, else the first device with an active port.  The GID
 * of a connection is zs_rdma_conn_opts.gid_index when given, else the RoCE v2 GID of the
 * stream's local IPv4 address, else the port's first RoCE v2 IPv4 GID, else index 0.  No
 * device: connect() and listen() fail naming what was looked for.
 *
 * Messages on the QP (all SEND, into receive slots of RD_SLOT bytes the receiver posted):
 *   EAGER   a frame header and its payload (payloads up to ZS_NET_INLINE_MAX): copied once on
 *           each side, complete for the sender once copied into its send slot.
 *   RNDV    a frame header with the address, length and rkey of the sender's payload in its
 *           registered region: the receiver RDMA READs the payload straight into the
 *           destination (an irecv's, or recv_payload's), then sends DONE.  The sender's send
 *           completes only at DONE, so its buffer is untouched until the reader has it: a
 *           server's fetch reply is an RDMA READ of its published copy, and the server, which
 *           republishes only once its sends are complete, never lets a reader see half of a
 *           new version.
 *   DONE    the receiver has read (or skipped) an RNDV payload.
 *   CREDIT  receive slots freed, when no other message carries them.
 * Frames are sent under credits (RD_CREDITS per direction): a frame occupies one of the
 * receiver's slots until it is handed to the caller; a header reported as ZS_EV_HEADER keeps
 * its slot until recv_payload() or discard(), and later frames wait behind it (back-pressure,
 * as with TCP).  DONE and CREDIT messages are not counted and are handled at once on arrival.
 * No memory is registered for remote writes: peers only read what we send from.
 *
 * Sends are signaled one in RD_SEND_SLOTS / 4 (selective signaling); READs always.  The
 * completion channel, the device's async events and the TCP streams are all behind wait_fd().
 * A completion in error, an async QP error, a malformed message or the stream closing fails
 * the connection (ZS_EV_CLOSED with the verbs status in the reason); its QP goes to the error
 * state, and ZS_EV_CLOSED comes once the QP's outstanding work has been flushed, so no request
 * is reported failed while the NIC may still write into its buffer.  An RNDV send whose DONE
 * does not come within ZS_RDMA_SEND_TIMEOUT_MS fails its connection.
 *
 * Differences from TCP: zs_conn_opts.conns is ignored (one QP carries a connection at full
 * rate); batch_sends is ignored (posting is cheap); cancel() of a receive whose READ is in
 * flight waits up to a second for it, then fails the connection to stop it.
 *
 * Tunables (read when the option field is 0):
 *   ZS_RDMA_DEVICE, ZS_RDMA_PORT, ZS_RDMA_GID_INDEX   the device, port (default 1) and GID
 *   ZS_RDMA_SEND_TIMEOUT_MS    how long a reader may take to read an RNDV payload (120000)
 *   ZS_RDMA_SETUP_MS           how long an accepted stream's set-up may take (5000)
 *   ZS_RDMA_DISABLE            1: act as if this host had no RDMA device
 */
#ifndef ZS_RDMA_H
#define ZS_RDMA_H

#include "transport/transport.h"

/* RDMA's own options of connect() and listen(): zs_conn_opts.backend with backend_name "rdma"
 * (cluster.rdma in the job's config). */
typedef struct {
    const char *device; /* "rxe0", "mlx5_0"; NULL or "": ZS_RDMA_DEVICE, else chosen */
    int port;           /* 1.., 0: ZS_RDMA_PORT, else 1 */
    int gid_index;      /* >= 0: that index (0 too: set -1 unless you mean it); -1:
                           ZS_RDMA_GID_INDEX, else chosen by address */
} zs_rdma_conn_opts;

extern const zs_transport_ops zs_rdma_ops;

/* 1 if this process can use RDMA: a device with an active port (libibverbs lists one) and a
 * locked-memory limit of at least 1 GiB (or root), else 0 with a reason in why (may be NULL):
 * what "auto" and capability bits are decided by. */
int zs_rdma_available(char *why, size_t cap);

/* For the backend's tests: moves c's queue pair to the error state as a failing NIC would,
 * without telling the connection. */
zs_err zs_rdma_test_break_qp(zs_conn *c);
/* For the backend's tests: the next RNDV frame c sends names rkey + 1 (a bad key). */
void zs_rdma_test_bad_key(zs_conn *c);
/* For the backend's tests: treats mr, registered from host memory, as a dma-buf region (device
 * memory the CPU must not touch): its payloads go by rendezvous however small, and inline
 * payloads arriving for it are placed with copy(ctx, ...), as zs_dmabuf's. */
void zs_rdma_test_as_device(zs_mr *mr,
                            int (*copy)(void *ctx, void *dst, const void *src, size_t n,
                                        int to_region),
                            void *ctx);

#endif
