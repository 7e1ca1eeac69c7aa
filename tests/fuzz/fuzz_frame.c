/*
 * fuzz_frame: libFuzzer target for the data-plane frame header and the TCP backend's
 * receive state machine.
 *
 * Each input is (1) decoded as headers, at every 64-byte window, checking that whatever is
 * accepted encodes back to the same bytes; and (2) written into one end of an AF_UNIX
 * socketpair whose other end is a zs_conn of a zs_net (zs_tcp_adopt), then the net is polled
 * until the connection reports closed.  Headers are answered the ways a server answers them,
 * chosen by the frame's id: payload into a registered buffer, skip, or close; ids 1 and 2 are
 * expected receives (a 16-byte and a 0-byte buffer).  A hang (the connection never closing)
 * aborts, as does a receive reporting more bytes than its buffer.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport/tcp.h"

static zs_net *net;
static uint8_t *buf;
static zs_mr *mr;
#define BUF_BYTES 8192

static void decode_windows(const uint8_t *data, size_t size)
{
    uint8_t h[ZS_FRAME_HEADER_BYTES];
    for (size_t off = 0; off < size || off == 0; off += ZS_FRAME_HEADER_BYTES) {
        size_t n = size - off < ZS_FRAME_HEADER_BYTES ? size - off : ZS_FRAME_HEADER_BYTES;
        memset(h, 0, sizeof h);
        if (n)
            memcpy(h, data + off, n);
        zs_frame f;
        if (zs_frame_decode(h, &f) == ZS_OK) {
            uint8_t back[ZS_FRAME_HEADER_BYTES];
            zs_frame_encode(&f, back);
            if (memcmp(back, h, sizeof h) != 0)
                abort();
            if (f.length > ZS_FRAME_MAX_PAYLOAD)
                abort();
        }
        if (size == 0)
            break;
    }
}

static void run_stream(const uint8_t *data, size_t size)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv))
        return;
    zs_conn *c;
    if (zs_tcp_adopt(net, sv[0], "fuzz", 0, &c) != ZS_OK) {
        close(sv[0]);
        close(sv[1]);
        return;
    }
    zs_tcp_irecv(c, 1, mr, 0, 16, (void *)1, NULL);
    zs_tcp_irecv(c, 2, NULL, 0, 0, (void *)2, NULL);
    /* Inputs are small (libFuzzer's -max_len); what does not fit the socket is cut. */
    size_t put = 0;
    while (put < size) {
        ssize_t k = send(sv[1], data + put, size - put, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (k <= 0)
            break;
        put += (size_t)k;
    }
    shutdown(sv[1], SHUT_WR);

    int open = 1;
    for (int turn = 0; open; turn++) {
        if (turn > 100000)
            abort(); /* the connection never finished: a hang */
        zs_event ev[16];
        int n;
        if (zs_tcp_poll(net, ev, 16, 0, &n) != ZS_OK)
            abort();
        for (int i = 0; i < n && open; i++) {
            if (ev[i].type == ZS_EV_RECV) {
                if (ev[i].err == ZS_OK && ev[i].user == (void *)1 && ev[i].frame.length > 16)
                    abort();
                if (ev[i].err == ZS_OK && ev[i].user == (void *)2 && ev[i].frame.length > 0)
                    abort();
                continue;
            }
            if (ev[i].type == ZS_EV_CLOSED) {
                open = 0;
                continue;
            }
            if (ev[i].type != ZS_EV_HEADER || ev[i].frame.length == 0)
                continue;
            /* A payload call fails only on a connection that failed meanwhile
             * (ZS_EV_CLOSED follows). */
            switch (ev[i].frame.id % 3) {
            case 0:
                if (ev[i].frame.length <= BUF_BYTES) {
                    if (zs_tcp_recv_payload(c, mr, BUF_BYTES - ev[i].frame.length, NULL, NULL) !=
                            ZS_OK &&
                        !zs_tcp_conn_closed(c))
                        abort();
                } else if (zs_tcp_discard(c) != ZS_OK && !zs_tcp_conn_closed(c)) {
                    abort();
                }
                break;
            case 1:
                if (zs_tcp_discard(c) != ZS_OK && !zs_tcp_conn_closed(c))
                    abort();
                break;
            default:
                open = 0;
                break;
            }
        }
    }
    zs_tcp_conn_close(c);
    /* Drain anything left queued (completions reported without a connection). */
    zs_event ev[16];
    int n;
    do {
        zs_tcp_poll(net, ev, 16, 0, &n);
    } while (n > 0);
    close(sv[1]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!net) {
        buf = malloc(BUF_BYTES);
        if (zs_tcp_open(&net) != ZS_OK || zs_tcp_reg_mr(net, buf, BUF_BYTES, ZS_MR_RECV, &mr))
            abort();
    }
    decode_windows(data, size);
    run_stream(data, size);
    return 0;
}
