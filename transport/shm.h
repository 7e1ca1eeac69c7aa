/*
 * shm: the shared-memory backend of the data-plane transport (transport.h), for a worker on
 * the same host as its servers (ZeRO-Offload on one box).  zs_shm_ops is its function table;
 * the meaning of every call is transport.h's.  docs/transport.md has the protocol.
 *
 * Set-up.  A connection starts as a TCP stream of the TCP backend, with its authentication
 * handshake when zs_conn_opts.auth is given, so shared-memory connections are proved exactly
 * as TCP ones.  Over it each side sends one ZS_OP_HELLO: its pid and the address of a random
 * cookie in its memory; the server's also names an abstract Unix socket and a one-time key.
 * Each side reads the other's cookie with process_vm_readv: that proves the peer is a process
 * on this host whose memory we may read (same user, and a ptrace policy that allows it), and
 * is the only check that needs to pass for payloads to move.  The client then connects to the
 * Unix socket (SOCK_SEQPACKET) and sends the key; from there on messages go over that socket.
 *
 * Messages (one packet each): EAGER (a frame and its payload of up to ZS_NET_INLINE_MAX
 * bytes), RNDV (a frame and the address of its payload in the sender's registered memory),
 * DONE.  A receiver takes an RNDV payload with process_vm_readv straight from the sender's
 * memory into the destination: one copy, where TCP makes two and a trip through the kernel's
 * socket buffers; then it sends DONE, and only then is the sender's send complete, so the
 * sender's buffer is never changed under a reader (a server republishes only once its sends
 * completed).  A reader checks that every address lies in a region the sender announced in an
 * RNDV frame: it only ever reads what it was offered.
 *
 * A peer process that dies closes the Unix socket (and the TCP stream): its connections fail
 * at once, and a copy from its memory in progress fails with ESRCH, never a signal.  Frames
 * that arrive behind a header reported as ZS_EV_HEADER wait in the backend (up to 64, then the
 * socket is not read until recv_payload() or discard(), which slows the peer as TCP would).
 *
 * Differences from TCP: zs_conn_opts.conns and batch_sends are ignored; registering memory
 * only records the range.  The shared-memory permission check needs the two processes to run
 * as the same user; under Yama's ptrace_scope 1 the backend allows any process of that user to
 * read its memory (prctl PR_SET_PTRACER), which same-user processes could largely do anyway.
 *
 * Tunables: ZS_SHM_SEND_TIMEOUT_MS (120000): how long a reader may take to read an RNDV
 * payload; ZS_SHM_SETUP_MS (5000): how long an accepted stream's set-up may take.
 */
#ifndef ZS_SHM_H
#define ZS_SHM_H

#include "transport/transport.h"

extern const zs_transport_ops zs_shm_ops;

#endif
