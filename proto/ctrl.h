/*
 * ctrl: the control plane's transport: ZeroMQ sockets carrying one zshard.Envelope per
 * message.  The coordinator binds a ROUTER; servers, workers and tools connect a DEALER.
 *
 * Invariant: zs_ctrl_recv hands out only envelopes that zs_msg_decode accepted for the
 * receiver (protocol version, body type, every field checked); anything else is reported as
 * ZS_ERR_FORMAT with the reason and the peer, and the socket stays usable.  Messages larger
 * than ZS_MSG_MAX_BYTES are refused by ZeroMQ itself (ZMQ_MAXMSGSIZE), which drops the peer.
 */
#ifndef ZS_CTRL_H
#define ZS_CTRL_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/secret.h"
#include "proto/messages.h"

#define ZS_CTRL_ID_MAX 255 /* bytes of a ZeroMQ routing id */

typedef struct zs_ctrl zs_ctrl;

#define ZS_CTRL_ADDR_MAX 64 /* bytes of a peer's address text, with its terminator */

/* Who sent a message to a ROUTER, or whom to send to (empty for a DEALER). */
typedef struct {
    uint8_t id[ZS_CTRL_ID_MAX];
    size_t len;
    char addr[ZS_CTRL_ADDR_MAX]; /* received: the sender's IP address as ZeroMQ saw the
                                    connection ("Peer-Address"); "" when it does not say */
} zs_ctrl_peer;

/* A ROUTER bound to endpoint ("tcp://HOST:PORT"; port 0 or "*" picks one: see
 * zs_ctrl_endpoint).  With a secret (not insecure) it is a CURVE server that admits only
 * peers holding the same secret (ctrl.c says how).  Does not block. */
zs_err zs_ctrl_bind(const char *endpoint, const zs_secret *secret, zs_ctrl **out);
/* A DEALER connected to endpoint, a CURVE client with keys from the secret unless insecure.
 * ZeroMQ connects in the background; does not block.  A peer with another secret (or none)
 * never completes the handshake: nothing it sends arrives, and nothing comes back. */
zs_err zs_ctrl_connect(const char *endpoint, const zs_secret *secret, zs_ctrl **out);
/* The endpoint actually bound ("tcp://127.0.0.1:40123"). */
const char *zs_ctrl_endpoint(const zs_ctrl *c);
/* Closes the socket; messages still queued get at most 200 ms to leave. */
void zs_ctrl_close(zs_ctrl *c);

/* Encodes and sends env (to `to` on a ROUTER; to is ignored on a DEALER).  Does not block:
 * a message that cannot be queued fails with ZS_ERR_IO. */
zs_err zs_ctrl_send(zs_ctrl *c, const zs_ctrl_peer *to, const Zshard__Envelope *env);

/* Stamps env with ZS_PROTOCOL_VERSION and sender (our id; 0 before registration and for the
 * coordinator). */
void zs_ctrl_stamp(Zshard__Envelope *env, uint32_t sender);

/* zs_ctrl_stamp, then zs_ctrl_send. */
zs_err zs_ctrl_send_as(zs_ctrl *c, const zs_ctrl_peer *to, uint32_t sender, Zshard__Envelope *env);

/* Sends len bytes as one message, as they are (DEALER only): for tests that play a peer
 * breaking the protocol.  Does not block. */
zs_err zs_ctrl_send_raw(zs_ctrl *c, const void *buf, size_t len);

/* Sends this process's Register (DEALER side): role, the data-plane endpoint (NULL: none),
 * the capabilities of this build with the data-plane backends this process offers
 * (transports: CAP_TRANSPORT_* bits; a server offers the one it serves, a worker every one it
 * can use), hostname and pid. */
zs_err zs_ctrl_register(zs_ctrl *c, Zshard__Role role, const char *endpoint, uint32_t transports);

/*
 * Waits up to timeout_ms (-1: forever) for one message.  ZS_OK with *env NULL: timeout.
 * ZS_OK with *env set: a valid envelope (free with zs_msg_free), from *from on a ROUTER.
 * ZS_ERR_FORMAT: a message arrived and was refused (the message names the reason); *from is
 * set so that the caller can answer with an Error.
 */
zs_err zs_ctrl_recv(zs_ctrl *c, int timeout_ms, const zs_msg_ctx *ctx, zs_ctrl_peer *from,
                    Zshard__Envelope **env);

/* The ZeroMQ socket, for a zmq_poll item (ZMQ_POLLIN) beside other descriptors: a loop waits
 * on it together with its data plane, then calls zs_ctrl_recv with timeout 0 until it times
 * out.  (Not its ZMQ_FD: that descriptor is edge-triggered and misses messages already
 * queued; zmq_poll on the socket does not.) */
void *zs_ctrl_socket(const zs_ctrl *c);

#endif
