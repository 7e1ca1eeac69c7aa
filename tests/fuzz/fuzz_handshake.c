/*
 * fuzz_handshake: libFuzzer target for the server side of the data plane's authentication
 * handshake (transport/tcp.c: listener_accept, hs_start, hs_progress, run_timers, hs_done) and
 * for the protocol after it on a connection that passed it.
 *
 * One zs_net for the whole process, with two listeners on 127.0.0.1 that authenticate with a
 * fixed data key: members 1..8 are known, 5 is gone (token_of -1), 6 is not ready (-2), every
 * other id is unknown (-1).  Handshakes on the "long" listener may take 60 s, on the "short"
 * one 3 ms (ZS_TCP_HANDSHAKE_MS at listen()), so that only inputs that ask for it wait for the
 * timeout path.  Each input opens a fresh loopback TCP stream to one of them and plays the
 * client by hand, one record at a time: a valid hello or a mutated one, the valid proof
 * (computed with zs_token_of / zs_token_proof from the challenge read back) or one of the wrong
 * ones, raw bytes, data-plane frames, turns of the server's loop, a stall, a half close, a
 * reset.  The server's net is turned with zs_tcp_poll (timeout 0, or 1 ms when nothing moved)
 * between writes and reads, and the connection it accepts is served the way fuzz_frame serves
 * one (irecvs for ids 1 and 2; a header's payload is read, skipped or the connection closed,
 * by its id).  Optionally (setup byte), 64 + k streams flood the listener first.
 *
 * Input: byte 0 is the setup (bits 0-1 == 3: the short listener; bits 2-4 == 7 on the long
 * listener: a flood, with k = 1 + b % 4 streams beyond the limit, which leave at the end in the
 * order b / 4 % 3 picks, b the next byte); then records, a tag byte (its value % N_OPS picks
 * the OP_* below) and its operands.  The end of the input ends the client: it half-closes, the
 * server reads what is left, everything is closed.
 *
 * Invariants checked (abort on failure; ASan, UBSan and LeakSanitizer catch the rest):
 *  - the server answers a hello only once it has all 48 bytes; the challenge's status is the
 *    one the documented protocol gives for the hello sent (bad magic or version, flags or the
 *    zero word not 0: BAD_HELLO; member 6: NOT_READY; unknown or gone: UNKNOWN_MEMBER; else
 *    OK), a refusal's remaining bytes are zero
 *    and nothing follows it; an OK challenge carries the valid server proof for the client's
 *    nonce and the member; the result is OK exactly when the 32 bytes after the hello are the
 *    valid client proof, and nothing follows a BAD_PROOF;
 *  - ZS_EV_ACCEPT only for the stream of this input (matched by peer address), on its
 *    listener, after the valid proof for a known, non-gone, ready member; conn_member() is the
 *    hello's member; on the long listener a valid proof from a client that stays is accepted;
 *  - every stream ends with exactly one of ZS_EV_ACCEPT or ZS_EV_REFUSED (conn NULL, on its
 *    listener, with a reason); no event names a stream that does not exist;
 *  - no more than 64 handshakes at once: of a flood of 64 + k silent streams exactly the last
 *    k are closed at once, and the others stay in their handshake until they leave;
 *  - a stalled handshake on the short listener is refused (within 3 s; see below);
 *  - after the frames, the accepted connection reports ZS_EV_CLOSED on the client's half
 *    close (no hang); a receive never reports more bytes than its buffer;
 *  - after each input no event is left, no socket is leaked (/proc/self/fd), and the
 *    server's objects are freed (LeakSanitizer at exit: the net is reachable, a lost
 *    handshake or connection is not).
 *
 * Seeds: tests/fuzz/corpus/handshake/, written by running the target with
 * ZS_FUZZ_WRITE_CORPUS=DIR.  ZS_FUZZ_TRACE=1 prints every record and event on stderr.
 * ZS_FUZZ_STRICT_TIMERS=1 makes a stall on the short listener wait in one zs_tcp_poll() of
 * 1000 ms, which must return within 500 ms with the handshake's ZS_EV_REFUSED (net_turn runs
 * its timers before it decides how long to wait); off by default only because it is slow.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/secret.h"
#include "transport/tcp.h"

#define REQUIRE(cond)                                                                              \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "fuzz_handshake: %s:%d: %s\n", __FILE__, __LINE__, #cond);             \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#define TRACE(...)                                                                                 \
    do {                                                                                           \
        if (trace)                                                                                 \
            fprintf(stderr, __VA_ARGS__);                                                          \
    } while (0)

/* The handshake as documented above HS_MAGIC in transport/tcp.c, written out again here on
 * purpose: the server is checked against the protocol, not against its own constants. */
#define HS_MAGIC 0x3141535au
#define HS_VERSION 1
#define HS_HELLO 48
#define HS_CHALLENGE 72
#define HS_PROOF 32
#define HS_RESULT 8
enum { HS_OK = 0, HS_UNKNOWN_MEMBER = 1, HS_BAD_HELLO = 2, HS_BAD_PROOF = 3, HS_NOT_READY = 4 };
#define MAX_HANDSHAKES 64 /* transport/tcp.h: "at most 64 at once" */

#define N_MEMBERS 8
#define MEMBER_GONE 5
#define MEMBER_NOT_READY 6
#define SHORT_HANDSHAKE_MS "3"
#define LONG_HANDSHAKE_MS "60000"
#define FLOOD_EXTRA_MAX 4
#define MAX_STREAMS (MAX_HANDSHAKES + FLOOD_EXTRA_MAX)
/* Wall-clock bounds of waits that must end (a hang otherwise); never reached when all is well. */
#define WAIT_MS 3000
#define BUF_BYTES 8192

/* The records of an input. */
enum {
    OP_HELLO,     /* member, split: a valid hello, in two writes split at byte split % 49 */
    OP_HELLO_MUT, /* member, pos, val, split: a valid hello with byte pos % 48 xored with val */
    OP_PROOF,     /* kind, split [, pos, val]: a proof (PROOF_*) once the challenge is read */
    OP_RAW,       /* len, bytes: written as they are */
    OP_FRAME,     /* op, dtype, id, count lo, count hi, step: a data-plane frame and its payload */
    OP_TURNS,     /* n: 1 + n % 16 turns of the server's loop */
    OP_STALL,     /* short listener: wait for the handshake timeout; long: a few turns */
    OP_SHUT_WR,   /* the client half-closes */
    OP_RESET,     /* the client closes with a reset and is gone */
    OP_HANDSHAKE, /* member: hello, challenge, valid proof, result: the whole exchange */
    N_OPS
};
enum {
    PROOF_VALID,
    PROOF_FLIP,        /* the valid one with byte pos % 32 xored with val */
    PROOF_ECHO,        /* the server's proof sent back (a reflection) */
    PROOF_OTHER_TOKEN, /* the proof with member + 1's token */
    PROOF_SERVER_SIDE, /* the "server" proof computed by the client */
    PROOF_SWAPPED,     /* the nonces in the wrong order */
    PROOF_OTHER_ID,    /* the right token, member ^ 1 in the proof */
    PROOF_ZERO,
    N_PROOFS
};

typedef struct {
    int fd;         /* the client's end; -1 once closed */
    char peer[40];  /* "127.0.0.1:PORT", as the server names it */
    zs_listener *l; /* the listener it connected to */
    int shut_wr;    /* the client half-closed */
    int reset;      /* the client closed (with a reset) */
    int stopped;    /* no more writes: one failed, or the server stopped reading */
    int eof;        /* the client read the end (or a reset) */
    uint8_t sent[HS_HELLO + HS_PROOF];     /* the first bytes written */
    size_t nsent;                          /* bytes written in all */
    uint8_t rcv[HS_CHALLENGE + HS_RESULT]; /* the first bytes read */
    size_t nrcv;                           /* bytes read in all */
    int ch_checked, ch_status;             /* the challenge was read and checked; its status */
    int res_checked, res_status;           /* the result was read and checked; its status */
    int accepted, refused, at_once;
    char why[ZS_NET_REASON_MAX]; /* the refusal's reason */
    zs_conn *conn;               /* the accepted connection, until conn_close() */
    int conn_closed;             /* ZS_EV_CLOSED seen */
    int want_close;              /* a header asked for the connection to be closed */
} stream;

static zs_net *net;
static zs_listener *long_l, *short_l;
static struct sockaddr_in long_addr, short_addr;
static uint8_t *buf;
static zs_mr *mr;
static uint8_t data_key[ZS_TOKEN_BYTES];
static int trace;
static int strict_timers; /* ZS_FUZZ_STRICT_TIMERS=1: OP_STALL waits in one long poll */
static int baseline_fds;  /* sockets open between inputs (the two listeners) */
static stream streams[1 + MAX_STREAMS]; /* [0] the input's stream; then the flood */
static int nstreams;
static int flood_order; /* 0: the flood leaves first to last, 1: last to first, 2: evens, odds */

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The listeners' token_of: 0 and the token for a member that may connect, -1 unknown or gone,
 * -2 not ready yet. */
static int token_of(void *ctx, uint32_t member, uint8_t token[ZS_TOKEN_BYTES], char *why)
{
    (void)ctx;
    if (member == MEMBER_NOT_READY) {
        snprintf(why, 32, "not registered yet");
        return -2;
    }
    if (member == MEMBER_GONE) {
        snprintf(why, 32, "declared gone");
        return -1;
    }
    if (member < 1 || member > N_MEMBERS)
        return -1;
    zs_token_of(data_key, member, token);
    return 0;
}

static const zs_auth auth = {.token_of = token_of};

/* The status the server must answer a hello with. */
static uint32_t expected_status(const uint8_t hello[HS_HELLO])
{
    if (get32(hello) != HS_MAGIC || (hello[4] | hello[5] << 8) != HS_VERSION || hello[6] ||
        hello[7] || get32(hello + 12))
        return HS_BAD_HELLO;
    uint32_t m = get32(hello + 8);
    if (m == MEMBER_NOT_READY)
        return HS_NOT_READY;
    if (m < 1 || m > N_MEMBERS || m == MEMBER_GONE)
        return HS_UNKNOWN_MEMBER;
    return HS_OK;
}

/* 1 if the stream's bytes 48..80 are the valid client proof for its hello and the challenge
 * the server sent (which the client must have read to compute it). */
static int proof_valid(const stream *s)
{
    if (s->nsent < HS_HELLO + HS_PROOF || !s->ch_checked || s->ch_status != HS_OK)
        return 0;
    uint32_t m = get32(s->sent + 8);
    uint8_t token[ZS_TOKEN_BYTES], want[ZS_TOKEN_BYTES];
    zs_token_of(data_key, m, token);
    zs_token_proof(token, "client", s->sent + 16, s->rcv + 8, m, want);
    return memcmp(want, s->sent + HS_HELLO, HS_PROOF) == 0;
}

/* Checks what the client read so far against the protocol. */
static void check_responses(stream *s)
{
    if (!s->ch_checked && s->nrcv >= HS_CHALLENGE) {
        REQUIRE(s->nsent >= HS_HELLO); /* no answer before the whole hello */
        REQUIRE(get32(s->rcv) == HS_MAGIC);
        uint32_t st = get32(s->rcv + 4);
        REQUIRE(st == expected_status(s->sent));
        if (st == HS_OK) {
            uint32_t m = get32(s->sent + 8);
            uint8_t token[ZS_TOKEN_BYTES], want[ZS_TOKEN_BYTES];
            zs_token_of(data_key, m, token);
            zs_token_proof(token, "server", s->sent + 16, s->rcv + 8, m, want);
            REQUIRE(memcmp(want, s->rcv + 8 + ZS_NONCE_BYTES, ZS_TOKEN_BYTES) == 0);
        } else {
            for (int i = 8; i < HS_CHALLENGE; i++)
                REQUIRE(s->rcv[i] == 0);
        }
        s->ch_checked = 1;
        s->ch_status = (int)st;
    }
    if (s->ch_checked && s->ch_status != HS_OK)
        REQUIRE(s->nrcv <= HS_CHALLENGE); /* nothing after a refusal */
    if (!s->res_checked && s->nrcv >= HS_CHALLENGE + HS_RESULT) {
        REQUIRE(s->nsent >= HS_HELLO + HS_PROOF);
        REQUIRE(get32(s->rcv + HS_CHALLENGE) == HS_MAGIC);
        uint32_t st = get32(s->rcv + HS_CHALLENGE + 4);
        REQUIRE(st == (proof_valid(s) ? HS_OK : HS_BAD_PROOF));
        s->res_checked = 1;
        s->res_status = (int)st;
    }
    if (s->res_checked && s->res_status != HS_OK)
        REQUIRE(s->nrcv <= HS_CHALLENGE + HS_RESULT);
}

/* Reads what the server sent to the client (without blocking); returns 1 if anything
 * changed. */
static int client_read(stream *s)
{
    if (s->fd < 0 || s->eof)
        return 0;
    int moved = 0;
    for (;;) {
        uint8_t b[4096];
        ssize_t r = recv(s->fd, b, sizeof b, MSG_DONTWAIT);
        if (r > 0) {
            size_t keep = sizeof s->rcv - (s->nrcv < sizeof s->rcv ? s->nrcv : sizeof s->rcv);
            if (keep > (size_t)r)
                keep = (size_t)r;
            memcpy(s->rcv + s->nrcv, b, keep);
            s->nrcv += (size_t)r;
            moved = 1;
            continue;
        }
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        /* the end, or a reset (the server closed with unread bytes) */
        s->eof = 1;
        moved = 1;
        break;
    }
    check_responses(s);
    return moved;
}

static stream *find_stream(const char *peer)
{
    for (int i = 0; i < nstreams; i++)
        if (!strcmp(streams[i].peer, peer))
            return &streams[i];
    return NULL;
}

static void on_event(const zs_event *e)
{
    stream *s0 = &streams[0];
    switch (e->type) {
    case ZS_EV_ACCEPT: {
        REQUIRE(e->conn && e->listener);
        const char *peer = zs_tcp_conn_peer(e->conn);
        TRACE("  event ACCEPT %s member %u\n", peer, zs_tcp_conn_member(e->conn));
        stream *s = find_stream(peer);
        REQUIRE(s == s0); /* the flood's streams never say a word */
        REQUIRE(!s->accepted && !s->refused);
        REQUIRE(e->listener == s->l);
        REQUIRE(proof_valid(s));
        REQUIRE(zs_tcp_conn_member(e->conn) == get32(s->sent + 8));
        s->accepted = 1;
        s->conn = e->conn;
        REQUIRE(zs_tcp_irecv(s->conn, 1, mr, 0, 16, (void *)1, NULL) == ZS_OK);
        REQUIRE(zs_tcp_irecv(s->conn, 2, NULL, 0, 0, (void *)2, NULL) == ZS_OK);
        return;
    }
    case ZS_EV_REFUSED: {
        TRACE("  event REFUSED %s\n", e->reason);
        REQUIRE(!e->conn && e->listener && e->reason[0]);
        /* The reason starts with the peer: "127.0.0.1:PORT: ..." */
        const char *colon = strstr(e->reason, ": ");
        REQUIRE(colon && (size_t)(colon - e->reason) < sizeof s0->peer);
        char peer[sizeof s0->peer];
        memcpy(peer, e->reason, (size_t)(colon - e->reason));
        peer[colon - e->reason] = '\0';
        stream *s = find_stream(peer);
        REQUIRE(s);
        REQUIRE(e->listener == s->l);
        REQUIRE(!s->accepted && !s->refused);
        s->refused = 1;
        s->at_once = strstr(e->reason, "handshakes in progress") != NULL;
        snprintf(s->why, sizeof s->why, "%s", e->reason);
        return;
    }
    case ZS_EV_RECV:
        TRACE("  event RECV user %p err %d length %llu\n", e->user, (int)e->err,
              (unsigned long long)e->frame.length);
        REQUIRE(!e->conn || e->conn == s0->conn);
        if (e->err == ZS_OK && e->user == (void *)1)
            REQUIRE(e->frame.length <= 16);
        if (e->err == ZS_OK && e->user == (void *)2)
            REQUIRE(e->frame.length == 0);
        return;
    case ZS_EV_CLOSED:
        TRACE("  event CLOSED %s\n", e->reason);
        REQUIRE(s0->conn && e->conn == s0->conn && !s0->conn_closed);
        s0->conn_closed = 1;
        return;
    case ZS_EV_HEADER:
        TRACE("  event HEADER op %u id %llu length %llu\n", e->frame.op,
              (unsigned long long)e->frame.id, (unsigned long long)e->frame.length);
        REQUIRE(s0->conn && e->conn == s0->conn);
        if (s0->want_close || s0->conn_closed || e->frame.length == 0)
            return;
        switch (e->frame.id % 3) {
        case 0:
            if (e->frame.length <= BUF_BYTES)
                REQUIRE(zs_tcp_recv_payload(s0->conn, mr, BUF_BYTES - e->frame.length, NULL,
                                            NULL) == ZS_OK);
            else
                REQUIRE(zs_tcp_discard(s0->conn) == ZS_OK);
            return;
        case 1:
            REQUIRE(zs_tcp_discard(s0->conn) == ZS_OK);
            return;
        default:
            s0->want_close = 1;
            return;
        }
    default:
        /* ZS_EV_SEND: this server sends nothing itself. */
        REQUIRE(0);
    }
}

/* One turn of the server's loop (poll with timeout_ms); returns the number of events. */
static int turn(int timeout_ms)
{
    zs_event ev[16];
    int n;
    REQUIRE(zs_tcp_poll(net, ev, 16, timeout_ms, &n) == ZS_OK);
    for (int i = 0; i < n; i++)
        on_event(&ev[i]);
    stream *s0 = &streams[0];
    if (s0->want_close && s0->conn) {
        zs_tcp_conn_close(s0->conn);
        s0->conn = NULL;
    }
    return n;
}

/* Turns the loop (and reads the client) until done(s) holds or budget_ms passed; returns
 * done(s).  A turn waits 1 ms only when the previous one moved nothing. */
static int pump(stream *s, int (*done)(const stream *), int budget_ms)
{
    int64_t end = now_ms() + budget_ms;
    int idle = 0;
    for (;;) {
        int moved = client_read(&streams[0]);
        if (done(s))
            return 1;
        if (now_ms() > end)
            return 0;
        moved |= turn(idle ? 1 : 0) > 0;
        idle = !moved;
    }
}

/* Turns until twice in a row nothing moved (what was written has been taken in). */
static void settle(void)
{
    for (int quiet = 0, i = 0; quiet < 2 && i < 256; i++) {
        int moved = client_read(&streams[0]);
        moved |= turn(0) > 0;
        quiet = moved ? 0 : quiet + 1;
    }
}

static int resolved(const stream *s)
{
    return s->accepted || s->refused;
}

static int has_challenge(const stream *s)
{
    return s->ch_checked || s->eof || s->fd < 0;
}

static int has_result(const stream *s)
{
    return s->res_checked || s->eof || s->fd < 0 || (s->ch_checked && s->ch_status != HS_OK);
}

static int conn_ended(const stream *s)
{
    return !s->conn || s->conn_closed;
}

static int all_resolved(const stream *s)
{
    (void)s;
    for (int i = 0; i < nstreams; i++)
        if (!resolved(&streams[i]))
            return 0;
    return 1;
}

static int count_at_once(void)
{
    int k = 0;
    for (int i = 0; i < nstreams; i++)
        k += streams[i].at_once;
    return k;
}

static int at_once_seen;
static int flood_done(const stream *s)
{
    (void)s;
    return count_at_once() >= at_once_seen;
}

/* Writes len bytes on the client's stream (the part the socket takes; when the server is not
 * reading, what is left is dropped, unless it is an open connection, which must read). */
static void client_send(stream *s, const uint8_t *p, size_t len)
{
    int64_t end = now_ms() + WAIT_MS;
    size_t off = 0;
    while (off < len && s->fd >= 0 && !s->shut_wr && !s->stopped) {
        ssize_t k = send(s->fd, p + off, len - off, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (k > 0) {
            for (size_t i = 0; i < (size_t)k && s->nsent + i < sizeof s->sent; i++)
                s->sent[s->nsent + i] = p[off + i];
            s->nsent += (size_t)k;
            off += (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (!s->conn || s->conn_closed || s->want_close) {
                s->stopped = 1; /* a handshake reads only what it needs; a closed conn nothing */
                break;
            }
            REQUIRE(now_ms() < end); /* an open connection stopped reading: a hang */
            client_read(s);
            turn(1);
            continue;
        }
        s->stopped = 1; /* EPIPE, ECONNRESET: the server closed */
    }
}

/* Writes p in two pieces split at k (when 0 < k < len), with a turn of the server between. */
static void send_split(stream *s, const uint8_t *p, size_t len, size_t k)
{
    if (k > 0 && k < len) {
        client_send(s, p, k);
        client_read(s);
        turn(0);
        client_send(s, p + k, len - k);
    } else {
        client_send(s, p, len);
    }
}

static void client_close(stream *s)
{
    if (s->fd >= 0) {
        close(s->fd);
        s->fd = -1;
    }
}

/* Connects a new stream to listener l (address a). */
static stream *open_stream(zs_listener *l, const struct sockaddr_in *a)
{
    REQUIRE(nstreams < (int)(sizeof streams / sizeof streams[0]));
    stream *s = &streams[nstreams];
    memset(s, 0, sizeof *s);
    s->l = l;
    s->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(s->fd >= 0);
    /* close() resets the stream: nothing lingers in TIME_WAIT on either side, so that
     * thousands of streams a second do not run out of ports. */
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    REQUIRE(setsockopt(s->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg) == 0);
    int one = 1;
    setsockopt(s->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    REQUIRE(connect(s->fd, (const struct sockaddr *)a, sizeof *a) == 0);
    struct sockaddr_in me;
    socklen_t sl = sizeof me;
    REQUIRE(getsockname(s->fd, (struct sockaddr *)&me, &sl) == 0);
    snprintf(s->peer, sizeof s->peer, "127.0.0.1:%u", ntohs(me.sin_port));
    nstreams++;
    return s;
}

/* ---- the input ------------------------------------------------------------------------- */

typedef struct {
    const uint8_t *p;
    size_t n, off;
} input;

static unsigned take(input *in)
{
    return in->off < in->n ? in->p[in->off++] : 0;
}

/* A member id: one byte below 0xf0 gives 0..9 (0 and 9 unknown); above, four more bytes. */
static uint32_t take_member(input *in)
{
    unsigned b = take(in);
    if (b < 0xf0)
        return b % 10;
    uint32_t m = 0;
    for (int i = 0; i < 4; i++)
        m |= (uint32_t)take(in) << (8 * i);
    return m;
}

static void make_hello(uint32_t member, uint8_t hello[HS_HELLO])
{
    memset(hello, 0, HS_HELLO);
    put32(hello, HS_MAGIC);
    hello[4] = HS_VERSION;
    put32(hello + 8, member);
    for (int i = 0; i < ZS_NONCE_BYTES; i++)
        hello[16 + i] = (uint8_t)(i * 37 + member);
}

/* Computes a proof of the given kind from what the stream sent and read so far (a wrong one,
 * whatever the kind, when the challenge is not there). */
static void make_proof(const stream *s, unsigned kind, uint8_t proof[HS_PROOF])
{
    static const uint8_t zero[ZS_NONCE_BYTES];
    uint32_t m = s->nsent >= 12 ? get32(s->sent + 8) : 0;
    const uint8_t *nc = s->nsent >= HS_HELLO ? s->sent + 16 : zero;
    int ok = s->ch_checked && s->ch_status == HS_OK;
    const uint8_t *ns = ok ? s->rcv + 8 : zero;
    uint8_t token[ZS_TOKEN_BYTES];
    zs_token_of(data_key, m, token);
    switch (kind) {
    case PROOF_VALID:
    case PROOF_FLIP:
        zs_token_proof(token, "client", nc, ns, m, proof);
        break;
    case PROOF_ECHO:
        memcpy(proof, ok ? s->rcv + 8 + ZS_NONCE_BYTES : zero, HS_PROOF);
        break;
    case PROOF_OTHER_TOKEN:
        zs_token_of(data_key, m + 1, token);
        zs_token_proof(token, "client", nc, ns, m, proof);
        break;
    case PROOF_SERVER_SIDE:
        zs_token_proof(token, "server", nc, ns, m, proof);
        break;
    case PROOF_SWAPPED:
        zs_token_proof(token, "client", ns, nc, m, proof);
        break;
    case PROOF_OTHER_ID:
        zs_token_proof(token, "client", nc, ns, m ^ 1, proof);
        break;
    default:
        memset(proof, 0, HS_PROOF);
        break;
    }
}

/* Waits for the challenge once the whole hello is out.  On the long listener the server must
 * answer it (or close) within the bound. */
static void wait_challenge(stream *s)
{
    if (s->nsent < HS_HELLO || has_challenge(s))
        return;
    int ok = pump(s, has_challenge, s->l == long_l ? WAIT_MS : 50);
    REQUIRE(ok || s->l == short_l);
}

/* On the long listener a valid proof from a client that is still there must be accepted. */
static void expect_accept(stream *s)
{
    if (s->l != long_l || s->reset || !proof_valid(s) || s->accepted)
        return;
    REQUIRE(pump(s, resolved, WAIT_MS));
    REQUIRE(s->accepted);
}

static void op_frame(stream *s, input *in)
{
    unsigned b0 = take(in), b1 = take(in), id = take(in), lo = take(in), hi = take(in);
    unsigned step = take(in);
    zs_frame f = {0};
    f.op = (uint16_t)(1 + b0 % 5);
    f.dtype = (uint8_t)(b1 % 3);
    f.flags = (b1 & 4) ? ZS_FRAME_FLAG_STATE : 0;
    f.status = f.op == ZS_OP_FETCH || f.op == ZS_OP_PUSH ? 0 : (b1 >> 3) % 8;
    f.id = id;
    f.step = step;
    f.chunk = step % 4;
    f.sender = b0 >> 4;
    f.offset = (uint64_t)b0 << 8;
    f.count = (lo | hi << 8) & 0x3ff;
    size_t dsize = zs_frame_dtype_size((zs_frame_dtype)f.dtype);
    switch (f.op) {
    case ZS_OP_FETCH_REPLY:
    case ZS_OP_PUSH:
        f.length = f.count * dsize;
        break;
    case ZS_OP_ERROR:
        f.length = f.dtype == ZS_DTYPE_TEXT ? f.count : 0;
        break;
    default:
        f.length = 0;
        break;
    }
    if (hi & 0x80) /* a length that disagrees (or a header the decoder must refuse) */
        f.length = (lo | hi << 8) & 0x7fff;
    uint8_t h[ZS_FRAME_HEADER_BYTES];
    zs_frame_encode(&f, h);
    TRACE("op FRAME op %u dtype %u id %u count %llu length %llu\n", f.op, f.dtype, id,
          (unsigned long long)f.count, (unsigned long long)f.length);
    client_send(s, h, sizeof h);
    static uint8_t payload[0x8000];
    for (size_t i = 0; i < f.length; i++)
        payload[i] = (uint8_t)(i * 7 + id);
    client_send(s, payload, (size_t)f.length);
}

static void run_op(stream *s, input *in)
{
    unsigned op = take(in) % N_OPS;
    uint8_t msg[HS_HELLO];
    switch (op) {
    case OP_HELLO: {
        uint32_t m = take_member(in);
        unsigned split = take(in) % (HS_HELLO + 1);
        TRACE("op HELLO member %u split %u\n", m, split);
        make_hello(m, msg);
        send_split(s, msg, HS_HELLO, split);
        break;
    }
    case OP_HELLO_MUT: {
        uint32_t m = take_member(in);
        unsigned pos = take(in) % HS_HELLO, val = take(in), split = take(in) % (HS_HELLO + 1);
        TRACE("op HELLO_MUT member %u byte %u ^ %u split %u\n", m, pos, val, split);
        make_hello(m, msg);
        msg[pos] ^= (uint8_t)(val ? val : 1);
        send_split(s, msg, HS_HELLO, split);
        break;
    }
    case OP_PROOF: {
        unsigned kind = take(in) % N_PROOFS, split = take(in) % (HS_PROOF + 1);
        unsigned pos = 0, val = 0;
        if (kind == PROOF_FLIP) {
            pos = take(in) % HS_PROOF;
            val = take(in);
        }
        TRACE("op PROOF kind %u split %u\n", kind, split);
        wait_challenge(s);
        make_proof(s, kind, msg);
        if (kind == PROOF_FLIP)
            msg[pos] ^= (uint8_t)(val ? val : 1);
        send_split(s, msg, HS_PROOF, split);
        break;
    }
    case OP_RAW: {
        size_t len = take(in);
        if (len > in->n - in->off)
            len = in->n - in->off;
        TRACE("op RAW %zu bytes\n", len);
        client_send(s, in->p + in->off, len);
        in->off += len;
        break;
    }
    case OP_FRAME:
        op_frame(s, in);
        break;
    case OP_TURNS: {
        unsigned n = 1 + take(in) % 16;
        TRACE("op TURNS %u\n", n);
        for (unsigned i = 0; i < n; i++) {
            client_read(s);
            turn(0);
        }
        break;
    }
    case OP_STALL:
        TRACE("op STALL\n");
        if (s->l == short_l && strict_timers) {
            /* One poll with a long timeout must return as soon as the timer ended the
             * handshake (transport.h: poll blocks "until at least one event is ready"). */
            int64_t t0 = now_ms();
            while (!resolved(s) && now_ms() - t0 < WAIT_MS) {
                client_read(s);
                turn(1000);
            }
            REQUIRE(resolved(s));
            REQUIRE(now_ms() - t0 < 500);
        } else if (s->l == short_l) {
            /* The server's timer ends the handshake (if nothing else did first). */
            REQUIRE(pump(s, resolved, WAIT_MS));
        } else {
            settle();
        }
        break;
    case OP_SHUT_WR:
        TRACE("op SHUT_WR\n");
        if (s->fd >= 0 && !s->shut_wr)
            shutdown(s->fd, SHUT_WR);
        s->shut_wr = 1;
        break;
    case OP_RESET:
        TRACE("op RESET\n");
        client_close(s);
        s->reset = 1;
        break;
    case OP_HANDSHAKE: {
        uint32_t m = take_member(in);
        TRACE("op HANDSHAKE member %u\n", m);
        make_hello(m, msg);
        client_send(s, msg, HS_HELLO);
        wait_challenge(s);
        make_proof(s, PROOF_VALID, msg);
        client_send(s, msg, HS_PROOF);
        if (s->ch_checked && s->ch_status == HS_OK && s->nsent >= HS_HELLO + HS_PROOF)
            pump(s, has_result, s->l == long_l ? WAIT_MS : 50);
        expect_accept(s);
        break;
    }
    }
}

/* 64 + extra silent streams after the input's own (which holds a place): the last `extra`
 * must be closed at once, the others must wait in their handshakes. */
static void flood(int extra)
{
    stream *s0 = &streams[0];
    int n = MAX_HANDSHAKES - 1 + extra;
    TRACE("flood: %d streams\n", n);
    for (int i = 0; i < n; i++)
        open_stream(long_l, &long_addr);
    at_once_seen = extra;
    REQUIRE(pump(s0, flood_done, WAIT_MS));
    settle();
    REQUIRE(count_at_once() == extra);
    for (int i = 0; i < nstreams; i++)
        REQUIRE(streams[i].refused == (i >= nstreams - extra));
}

/* The process's open sockets (listed on stderr when `show`).  Only sockets: the sanitizers
 * open pipes of their own mid-run (the symbolizer, for libFuzzer's NEW_FUNC lines). */
static int count_sockets(int show)
{
    DIR *d = opendir("/proc/self/fd");
    REQUIRE(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        char path[300], target[256] = "";
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t k = readlink(path, target, sizeof target - 1);
        target[k > 0 ? k : 0] = '\0';
        if (strncmp(target, "socket:", 7) != 0)
            continue;
        n++;
        if (show)
            fprintf(stderr, "fd %s -> %s\n", e->d_name, target);
    }
    closedir(d);
    return n;
}

static void run(const uint8_t *data, size_t size)
{
    input in = {data, size, 0};
    unsigned setup = take(&in);
    nstreams = 0;
    int is_short = (setup & 3) == 3;
    stream *s = open_stream(is_short ? short_l : long_l, is_short ? &short_addr : &long_addr);
    TRACE("input: %zu bytes, %s listener, stream %s\n", size, is_short ? "short" : "long", s->peer);
    flood_order = 0;
    if (!is_short && ((setup >> 2) & 7) == 7) {
        unsigned b = take(&in);
        flood_order = (int)(b / FLOOD_EXTRA_MAX % 3);
        flood(1 + (int)(b % FLOOD_EXTRA_MAX));
    }
    while (in.off < in.n)
        run_op(s, &in);

    /* The end of the input: the server takes in what was written; a valid proof is accepted. */
    TRACE("end\n");
    if (s->fd >= 0)
        settle();
    expect_accept(s);
    /* A handshake still in progress ends: on the short listener by its timeout, on the long
     * one because the client leaves. */
    if (!resolved(s) && s->l == long_l)
        client_close(s);
    REQUIRE(pump(s, resolved, WAIT_MS));
    /* The accepted connection reads what is left and then the client's end of the stream. */
    if (s->conn && !s->conn_closed) {
        if (s->fd >= 0 && !s->shut_wr)
            shutdown(s->fd, SHUT_WR);
        s->shut_wr = 1;
        REQUIRE(pump(s, conn_ended, WAIT_MS));
    }
    /* The client's reset first (no TIME_WAIT left behind), then the server's close. */
    client_close(s);
    if (s->conn) {
        zs_tcp_conn_close(s->conn);
        s->conn = NULL;
    }
    /* The flood's streams leave in the order the input chose: the server's list of handshakes
     * loses its tail, its head, or entries in the middle. */
    int nf = nstreams - 1, half = (nf + 1) / 2;
    for (int i = 0; i < nf; i++) {
        int k = flood_order == 0   ? i
                : flood_order == 1 ? nf - 1 - i
                : i < half         ? 2 * i
                                   : 2 * (i - half) + 1;
        client_close(&streams[1 + k]);
        if (i % 8 == 7)
            turn(0);
    }
    REQUIRE(pump(s, all_resolved, WAIT_MS));
    /* Completions of the closed connection's requests, then nothing more. */
    for (int i = 0; i < 1000 && turn(0) > 0; i++)
        ;
    REQUIRE(turn(0) == 0);
    for (int i = 0; i < nstreams; i++)
        REQUIRE(streams[i].accepted + streams[i].refused == 1);
    int fds = count_sockets(0);
    if (fds != baseline_fds) {
        fprintf(stderr, "fuzz_handshake: %d sockets open, %d before\n", fds, baseline_fds);
        count_sockets(1);
        abort();
    }
}

static void write_corpus(const char *dir);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    trace = getenv("ZS_FUZZ_TRACE") != NULL;
    strict_timers = getenv("ZS_FUZZ_STRICT_TIMERS") != NULL;
    if (!getenv("ZS_LOG"))
        zs_log_set_level(ZS_LOG_ERROR);
    const char *corpus = getenv("ZS_FUZZ_WRITE_CORPUS");
    if (corpus) {
        write_corpus(corpus);
        exit(0);
    }
    REQUIRE(zs_sodium_init() == ZS_OK);
    for (int i = 0; i < ZS_TOKEN_BYTES; i++)
        data_key[i] = (uint8_t)(0x5a ^ i * 11);
    buf = malloc(BUF_BYTES);
    REQUIRE(buf);
    REQUIRE(zs_tcp_open(&net) == ZS_OK);
    REQUIRE(zs_tcp_reg_mr(net, buf, BUF_BYTES, ZS_MR_RECV, &mr) == ZS_OK);
    zs_conn_opts o = {.auth = &auth};
    struct {
        const char *ms;
        zs_listener **l;
        struct sockaddr_in *a;
    } ls[2] = {{LONG_HANDSHAKE_MS, &long_l, &long_addr},
               {SHORT_HANDSHAKE_MS, &short_l, &short_addr}};
    for (int i = 0; i < 2; i++) {
        setenv("ZS_TCP_HANDSHAKE_MS", ls[i].ms, 1);
        REQUIRE(zs_tcp_listen(net, "127.0.0.1:0", &o, ls[i].l) == ZS_OK);
        memset(ls[i].a, 0, sizeof *ls[i].a);
        ls[i].a->sin_family = AF_INET;
        ls[i].a->sin_port = htons((uint16_t)zs_tcp_listener_port(*ls[i].l));
        ls[i].a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    }
    unsetenv("ZS_TCP_HANDSHAKE_MS");
    baseline_fds = count_sockets(0);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    run(data, size);
    return 0;
}

/* ---- seeds ---------------------------------------------------------------------------- */

typedef struct {
    uint8_t b[1024];
    size_t n;
} seed;

static void put(seed *s, int n, ...)
{
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++)
        s->b[s->n++] = (uint8_t)va_arg(ap, int);
    va_end(ap);
}

static void save(const char *dir, const char *name, const seed *s)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    REQUIRE(f);
    REQUIRE(fwrite(s->b, 1, s->n, f) == s->n);
    REQUIRE(fclose(f) == 0);
}

static void write_corpus(const char *dir)
{
    seed s;
    uint8_t hello[HS_HELLO];

    /* A whole handshake of member 1, then a push (id 3, 4 floats) and a fetch (id 1). */
    s = (seed){0};
    put(&s, 3, 0, OP_HANDSHAKE, 1);
    put(&s, 7, OP_FRAME, 2, 0, 3, 4, 0, 1);
    put(&s, 7, OP_FRAME, 0, 0, 1, 4, 0, 1);
    save(dir, "valid_frame", &s);

    /* The same by records: hello and proof each in two writes, then an expected receive of
     * id 1 (16 bytes), one that does not fit it, and an error text. */
    s = (seed){0};
    put(&s, 8, 0, OP_HELLO, 7, 20, OP_PROOF, PROOF_VALID, 10, OP_TURNS);
    put(&s, 1, 2);
    put(&s, 7, OP_FRAME, 1, 0, 1, 4, 0, 0);
    put(&s, 7, OP_FRAME, 1, 0, 1, 8, 0, 0);
    put(&s, 7, OP_FRAME, 4, 2, 2, 12, 0, 0);
    save(dir, "valid_split", &s);

    /* A valid proof with frames right behind it, in the same burst as the proof. */
    s = (seed){0};
    put(&s, 7, 0, OP_HELLO, 4, 0, OP_PROOF, PROOF_VALID, 0);
    put(&s, 7, OP_FRAME, 1, 0, 1, 4, 0, 0);
    put(&s, 7, OP_FRAME, 2, 0, 6, 2, 0, 0);
    save(dir, "valid_pipelined_frames", &s);

    /* Valid handshake, then bytes that are not a frame. */
    s = (seed){0};
    put(&s, 3, 0, OP_HANDSHAKE, 8);
    put(&s, 2, OP_RAW, 64);
    for (int i = 0; i < 64; i++)
        put(&s, 1, i * 5);
    save(dir, "valid_garbage", &s);

    /* Wrong proofs. */
    static const struct {
        const char *name;
        int kind;
    } wrong[] = {{"wrong_proof_flip", PROOF_FLIP},         {"wrong_proof_echo", PROOF_ECHO},
                 {"wrong_proof_token", PROOF_OTHER_TOKEN}, {"wrong_proof_side", PROOF_SERVER_SIDE},
                 {"wrong_proof_swap", PROOF_SWAPPED},      {"wrong_proof_id", PROOF_OTHER_ID},
                 {"wrong_proof_zero", PROOF_ZERO}};
    for (size_t i = 0; i < sizeof wrong / sizeof wrong[0]; i++) {
        s = (seed){0};
        put(&s, 6, 0, OP_HELLO, 3, 0, OP_PROOF, wrong[i].kind);
        put(&s, 1, 0);
        if (wrong[i].kind == PROOF_FLIP)
            put(&s, 2, 5, 0x40);
        put(&s, 7, OP_FRAME, 2, 0, 3, 4, 0, 1);
        save(dir, wrong[i].name, &s);
    }

    /* Members the server refuses: unknown (0, 9, a large id), gone (5), not ready (6). */
    static const struct {
        const char *name;
        int member;
    } refused[] = {{"unknown_member_0", 0},
                   {"unknown_member_9", 9},
                   {"gone_member", MEMBER_GONE},
                   {"not_ready_member", MEMBER_NOT_READY}};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        s = (seed){0};
        put(&s, 3, 0, OP_HANDSHAKE, refused[i].member);
        put(&s, 7, OP_FRAME, 2, 0, 3, 4, 0, 1);
        save(dir, refused[i].name, &s);
    }
    s = (seed){0};
    put(&s, 7, 0, OP_HANDSHAKE, 0xff, 0x01, 0x00, 0x00, 0x80);
    save(dir, "unknown_member_large", &s);

    /* Truncated hellos: the client stops, half-closes, resets, or stalls (short listener). */
    make_hello(1, hello);
    static const struct {
        const char *name;
        int setup, len, then;
    } cut[] = {{"truncated_hello", 0, 20, -1},
               {"truncated_hello_shut", 0, 47, OP_SHUT_WR},
               {"truncated_hello_reset", 0, 4, OP_RESET},
               {"truncated_hello_stall", 3, 30, OP_STALL}};
    for (size_t i = 0; i < sizeof cut / sizeof cut[0]; i++) {
        s = (seed){0};
        put(&s, 3, cut[i].setup, OP_RAW, cut[i].len);
        memcpy(s.b + s.n, hello, (size_t)cut[i].len);
        s.n += (size_t)cut[i].len;
        if (cut[i].then >= 0)
            put(&s, 1, cut[i].then);
        save(dir, cut[i].name, &s);
    }

    /* A truncated proof, and a stall after the challenge on the short listener. */
    s = (seed){0};
    put(&s, 8, 0, OP_HELLO, 2, 0, OP_RAW, 16, 1, 2);
    for (int i = 0; i < 14; i++)
        put(&s, 1, i);
    put(&s, 1, OP_SHUT_WR);
    save(dir, "truncated_proof", &s);
    s = (seed){0};
    put(&s, 5, 3, OP_HELLO, 2, 0, OP_STALL);
    save(dir, "stall_after_challenge", &s);

    /* Bad magic, bad version, nonzero flags: each a bad hello. */
    static const struct {
        const char *name;
        int pos;
    } mut[] = {{"bad_magic", 0}, {"bad_version", 4}, {"flags_set", 6}};
    for (size_t i = 0; i < sizeof mut / sizeof mut[0]; i++) {
        s = (seed){0};
        put(&s, 9, 0, OP_HELLO_MUT, 1, mut[i].pos, 0x10, 0, OP_PROOF, PROOF_VALID, 0);
        save(dir, mut[i].name, &s);
    }

    /* A proof pipelined behind the hello (before the challenge could be read). */
    s = (seed){0};
    put(&s, 6, 0, OP_HELLO, 4, 0, OP_RAW, 40);
    for (int i = 0; i < 40; i++)
        put(&s, 1, 0xa0 + i);
    save(dir, "pipelined_proof", &s);

    /* Valid proof, then the client resets at once. */
    s = (seed){0};
    put(&s, 7, 0, OP_HELLO, 1, 0, OP_PROOF, PROOF_VALID, 0);
    put(&s, 1, OP_RESET);
    save(dir, "valid_then_reset", &s);

    /* A flood of 64 + k streams, then a whole handshake of the input's own stream; the flood
     * leaves first to last (k = 2), last to first (k = 2), evens then odds (k = 4). */
    static const struct {
        const char *name;
        int b;
    } floods[] = {{"flood", 1}, {"flood_reverse", 5}, {"flood_interleaved", 11}};
    for (size_t i = 0; i < sizeof floods / sizeof floods[0]; i++) {
        s = (seed){0};
        put(&s, 5, 0x1c, floods[i].b, OP_HANDSHAKE, 2, OP_FRAME);
        put(&s, 6, 2, 0, 3, 4, 0, 1);
        save(dir, floods[i].name, &s);
    }
}
