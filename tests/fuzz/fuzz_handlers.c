/*
 * fuzz_handlers: libFuzzer target for the control-plane handlers of the coordinator
 * (server/coord.c: on_message and everything it calls, and the step machine behind it) and of
 * the partition server (server/server.c: on_ctrl, with the data-plane pushes and fetches whose
 * state the control messages move on).  Both run in process, for real: messages go in through
 * zs_coord_feed / zs_server_feed (the bytes a turn of the loop would take from ZeroMQ), and
 * everything they send comes out through their hooks, where it is checked.  The server's
 * data plane is one end of an AF_UNIX socketpair (zs_server_adopt) that this target writes
 * frames into and reads replies from, turning the server's loop (zs_server_turn) in between.
 * No ZeroMQ, no network, no thread; a fresh coordinator or server per input, and the
 * coordinator's clock is the input's (heartbeat timeouts happen when it says).
 *
 * Input: byte 0 picks the side (bit 0: 0 coordinator, 1 server; bit 1: the coordinator's final
 * checkpoint and export fail: the finish hook), then records, each a tag byte and its operands. The
 * tag's low 3 bits are a peer slot (the coordinator's side: eight peers with routing ids
 * "slot0".."slot7"), the rest picks an operation (the CO_* and SV_* lists below).  An operation
 * either feeds raw bytes (a length and the bytes, so that libFuzzer mutates real envelopes), or
 * builds a well-formed message from a few operand bytes with the ids and the step the peer would
 * use, so that deep states (a whole step, a dead worker's chunks reassigned, a verdict, a
 * publication) are a few records away, or acts on the data plane (push, fetch, garbage, hang up) or
 * the clock.
 *
 * Invariants checked (abort on failure; ASan, UBSan and LeakSanitizer catch the rest):
 *  - whatever either side sends passes zs_msg_encode and its receiver's zs_msg_decode;
 *  - coordinator: ids are given out 1, 2, 3, ...; a StepAssign names a worker whose data
 *    matched, for the current step, and steps never go back; a ClipVerdict for step s comes
 *    only after a StepAssign for s, ChunkDone for every chunk of s and partials for every
 *    shard, and in one turn only; a step counts as finished only after its verdict and a
 *    VersionPublished(s + 1) from every server after it, one step at a time; Shutdown DONE
 *    only after the last step; a job that ends well ran every step;
 *  - server: Ready once, at version 0; the version never goes back and moves by one, only
 *    after a ClipVerdict fed once its partials were out; partials once per step, only when
 *    every element of the shards they name received every chunk (from push replies seen);
 *    a push is accepted only from the worker a StepAssign gave the chunk; a fetch reply
 *    carries exactly the version, range and dtype asked for, and never a version not yet
 *    published; every frame it sends decodes; Shutdown ends it.
 *
 * Seeds: tests/fuzz/corpus/handlers/, written by running the target with
 * ZS_FUZZ_WRITE_CORPUS=DIR (complete jobs on both sides, a dead worker, refusals, each also
 * with every message as raw bytes), plus inputs that once found a bug.  ZS_FUZZ_TRACE=1 prints
 * every message in and out, to read what an input does.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/config.h"
#include "common/data.h"
#include "common/log.h"
#include "common/shardmap.h"
#include "common/tensors.h"
#include "proto/messages.h"
#include "proto/shardmap_msg.h"
#include "server/coord.h"
#include "server/server.h"
#include "transport/frame.h"

#define REQUIRE(cond)                                                                              \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "fuzz_handlers: %s:%d: %s\n", __FILE__, __LINE__, #cond);              \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* The job: a model small enough that a server's whole step is a few kilobytes. */
static const char config_text[] =
    "{\"seed\": 7, \"train_batch_size\": 3, \"train_micro_batch_size_per_gpu\": 1,\n"
    " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001, \"betas\": [0.9, 0.95],"
    " \"weight_decay\": 0.01}},\n"
    " \"gradient_clipping\": 1.0,\n"
    " \"model\": {\"n_layer\": 1, \"n_head\": 2, \"n_embd\": 8, \"vocab_size\": 32,"
    " \"block_size\": 8},\n"
    " \"cluster\": {\"shard_size\": 1024, \"heartbeat_interval_ms\": 100,"
    " \"heartbeat_timeout_ms\": 1000},\n"
    " \"elasticity\": {\"enabled\": true, \"min_workers\": 1, \"max_workers\": 3}}\n";

enum {
    SLOTS = 8,        /* peers of the coordinator */
    COORD_S = 2,      /* its servers */
    COORD_STEPS = 2,  /* its steps */
    SERVER_STEPS = 4, /* steps the server side tracks (later ones are not checked) */
    MAX_C = 8,        /* chunks per step, at most */
    MAX_SHARDS = 64,
    MAX_IDS = 512,     /* ids the coordinator gives out in one input, at most */
    MAX_RECORDS = 400, /* records per input */
    MAX_RAW = 0xffff,  /* bytes of one raw record */
    MAX_REQ = 256,     /* data-plane requests in flight */
    WORKER0 = 10,      /* the server side's workers are ids 10..13 */
};

/* What every input shares, set up once. */
static struct {
    char dir[256], config_path[300], data_path[300], out_dir[300];
    zs_config cfg;
    zs_tensor_table tt;
    zs_dataset data;
    int C; /* chunks per step */
    int n_shards;
    size_t shard_floats;
    /* The server side's coordinator messages, packed once. */
    uint8_t *job[2]; /* the job; a job with another model */
    size_t job_len[2];
    uint8_t *map[3]; /* S = 1 {1}; S = 2 {1, 2}; S = 2 {2, 3} */
    size_t map_len[3];
    float *grad; /* [C + 1][total]: what a worker pushes for each chunk */
} g;

/* ---- input ---- */

typedef struct {
    const uint8_t *p;
    size_t n;
} input;

static unsigned take8(input *in)
{
    if (!in->n)
        return 0;
    in->n--;
    return *in->p++;
}

static unsigned take16(input *in)
{
    unsigned lo = take8(in);
    return lo | take8(in) << 8;
}

static size_t take_bytes(input *in, size_t want, const uint8_t **out)
{
    size_t k = want < in->n ? want : in->n;
    *out = in->p;
    in->p += k;
    in->n -= k;
    return k;
}

/*
 * Seed writing: with `conv` set, every record that fed a built message is written out again
 * as a raw record of the same bytes, the others as they were, so that each seed comes with a
 * twin whose messages libFuzzer can mutate byte by byte.
 */
static struct {
    int on;
    uint8_t *buf;
    size_t len, cap;
    const uint8_t *rec; /* where the current record began */
    int fed;            /* the current record fed a built message (written already) */
} conv;

static void conv_put(const void *p, size_t n)
{
    if (n == 0)
        return;
    if (conv.len + n > conv.cap) {
        conv.cap = (conv.len + n) * 2;
        conv.buf = realloc(conv.buf, conv.cap);
        REQUIRE(conv.buf);
    }
    memcpy(conv.buf + conv.len, p, n);
    conv.len += n;
}

/* Records the built message b as raw record `op` of slot. */
static void conv_raw(unsigned op, int slot, const uint8_t *b, size_t n)
{
    if (!conv.on)
        return;
    REQUIRE(n <= 0xffff);
    uint8_t h[3] = {(uint8_t)(op << 3 | (unsigned)slot), (uint8_t)(n & 0xff), (uint8_t)(n >> 8)};
    conv_put(h, 3);
    conv_put(b, n);
    conv.fed = 1;
}

static void conv_end_record(const input *in)
{
    if (conv.on && !conv.fed)
        conv_put(conv.rec, (size_t)(in->p - conv.rec));
    conv.fed = 0;
}

/* Packs env as `sender` would send it, valid or not (the handlers see what the gate lets in). */
static uint8_t *pack(Zshard__Envelope *env, uint32_t sender, size_t *len)
{
    env->has_protocol_version = env->has_sender = 1;
    env->protocol_version = ZS_PROTOCOL_VERSION;
    env->sender = sender;
    *len = zshard__envelope__get_packed_size(env);
    uint8_t *b = malloc(*len ? *len : 1);
    REQUIRE(b);
    zshard__envelope__pack(env, b);
    return b;
}

/* ZS_FUZZ_TRACE=1: every message in and out on stderr, to read a crash's input. */
static int trace;

static void trace_env(const char *dir, int slot, const Zshard__Envelope *env)
{
    if (!trace)
        return;
    uint64_t step =
        env->body_case == ZSHARD__ENVELOPE__BODY_STEP_ASSIGN         ? env->step_assign->step
        : env->body_case == ZSHARD__ENVELOPE__BODY_CHUNK_DONE        ? env->chunk_done->step
        : env->body_case == ZSHARD__ENVELOPE__BODY_CLIP_VERDICT      ? env->clip_verdict->step
        : env->body_case == ZSHARD__ENVELOPE__BODY_GRAD_NORM_PARTIAL ? env->grad_norm_partial->step
        : env->body_case == ZSHARD__ENVELOPE__BODY_VERSION_PUBLISHED
            ? env->version_published->version
            : 0;
    fprintf(stderr, "trace: %s slot %d: %s from %u (step/version %llu)\n", dir, slot,
            zs_msg_body_name(env->body_case), env->sender, (unsigned long long)step);
}

/* What is sent must be accepted by its receiver. */
static void check_sendable(const Zshard__Envelope *env, const zs_msg_ctx *rx)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    REQUIRE(zs_msg_encode(env, &buf, &len) == ZS_OK);
    Zshard__Envelope *back = NULL;
    zs_err e = zs_msg_decode(buf, len, rx, &back);
    if (e != ZS_OK)
        fprintf(stderr, "fuzz_handlers: %s refused: %s\n", zs_msg_body_name(env->body_case),
                zs_last_error());
    REQUIRE(e == ZS_OK && back->body_case == env->body_case);
    zs_msg_free(back);
    free(buf);
}

/* ======================================================================================== */
/* The coordinator                                                                           */
/* ======================================================================================== */

enum {
    CO_RAW,       /* u16 length, bytes: a message from the slot */
    CO_REGISTER,  /* f a b: Register, role 1 + (a & 3) % 3, an endpoint if a & 4 */
    CO_READY,     /* f a b: Ready: a & 1 version (server), else data (wrong if a & 2) */
    CO_HEARTBEAT, /* f a b */
    CO_CHUNK,     /* f a b: ChunkDone of chunk a % (C + 1), loss from b */
    CO_PARTIAL,   /* f a b: GradNormPartial: a & 1 every shard of the sender, else one */
    CO_PUBLISHED, /* f a b: VersionPublished of the current step + 1 */
    CO_LEAVE,     /* f a b: Shutdown LEAVING (a & 1) or an Error */
    CO_CLOCK,     /* a: the clock moves a * 10 ms, then a turn */
    CO_TURN,      /* a: a turn; with a == 0xa5 a stop flag (the job is aborted) */
    CO_STATUS,    /* f a b: StatusRequest, as a registered peer if a & 1 (else sender 0) */
    CO_OPS
};
/* Operand byte f of the built messages: bit 7 spoofs the sender (id f & 15 instead of the
 * slot's own), bit 6 takes the step from bits 4-5 instead of the current step. */

typedef struct {
    uint32_t id;      /* the last id the coordinator gave this slot, 0: none */
    int pending_role; /* role of the last Register it fed */
    unsigned roles;   /* bit r: the slot holds an id of role r */
    unsigned asked;   /* bit r: the slot fed a Register of role r */
} co_slot;

static struct {
    zs_coord *co;
    zs_coord_opts opts;
    int finish_fails;
    co_slot slot[SLOTS];
    int idrole[MAX_IDS + 1]; /* by assigned id */
    int idslot[MAX_IDS + 1];
    uint8_t data_ok[MAX_IDS + 1]; /* fed a Ready with the job's data */
    uint32_t last_id;
    uint64_t clock_ms;
    long feed; /* the number of the current feed or turn */
    long last_assign_step;
    uint8_t assigned[COORD_STEPS];
    uint8_t chunk_fed[COORD_STEPS][MAX_C];
    uint8_t partial_fed[COORD_STEPS][MAX_SHARDS];
    long verdict_feed[COORD_STEPS]; /* the feed whose turn sent step s's verdict, -1: none */
    uint8_t published[COORD_STEPS][MAX_IDS + 1]; /* VersionPublished(s + 1) after the verdict */
    uint32_t shard_owner[MAX_SHARDS];            /* from the ShardMap sent, 0: not yet */
    uint32_t map_servers[2 * COORD_S];           /* a recovery's map may hold spares */
    int map_n;
    int recoveries;  /* zs_coord_recoveries when last looked */
    int restore_fed; /* a Restore went out in the current feed or turn */
    int have_map;
    int done_sent;
} co;

static int slot_of(const zs_ctrl_peer *p)
{
    if (p->len != 5 || memcmp(p->id, "slot", 4) != 0 || p->id[4] < '0' || p->id[4] >= '0' + SLOTS)
        return -1;
    return p->id[4] - '0';
}

static zs_ctrl_peer slot_peer(int s)
{
    zs_ctrl_peer p = {.len = 5};
    memcpy(p.id, "slot", 4);
    p.id[4] = (uint8_t)('0' + s);
    return p;
}

static uint64_t co_now(void *user)
{
    (void)user;
    return co.clock_ms;
}

static zs_err co_finish(void *user)
{
    (void)user;
    return co.finish_fails ? zs_error(ZS_ERR_IO, "fuzz: the final checkpoint and export fail")
                           : ZS_OK;
}

static void co_sent(void *user, const zs_ctrl_peer *to, const Zshard__Envelope *env)
{
    (void)user;
    int s = slot_of(to);
    REQUIRE(s >= 0);
    trace_env("sent to", s, env);
    int role = co.slot[s].pending_role;
    unsigned asked = co.slot[s].asked, server_bit = 1u << ZSHARD__ROLE__ROLE_SERVER;
    /* The receiver: a server, a worker (or client tool), or, for a slot that asked to be
     * both, anyone (the checks below say which bodies go where). */
    zs_msg_ctx rx = {.self = env->body_case == ZSHARD__ENVELOPE__BODY_STATUS_REPLY ? ZS_MSG_WORKER
                             : asked == server_bit                                 ? ZS_MSG_SERVER
                             : asked && !(asked & server_bit)                      ? ZS_MSG_WORKER
                                                                                   : ZS_MSG_ANY,
                     .chunks = (uint32_t)g.C,
                     .n_shards = (uint32_t)g.n_shards,
                     .steps = COORD_STEPS};
    check_sendable(env, &rx);
    long step_now = zs_coord_steps_done(co.co);
    switch (env->body_case) {
    case ZSHARD__ENVELOPE__BODY_REGISTRATION_REPLY: {
        const Zshard__RegisterReply *r = env->registration_reply;
        if (r->outcome_case != ZSHARD__REGISTER_REPLY__OUTCOME_ASSIGNED_ID)
            break;
        REQUIRE(r->assigned_id == co.last_id + 1 && r->assigned_id <= MAX_IDS);
        co.last_id = r->assigned_id;
        co.idrole[r->assigned_id] = role;
        co.idslot[r->assigned_id] = s;
        co.slot[s].id = r->assigned_id;
        co.slot[s].roles |= 1u << role;
        break;
    }
    case ZSHARD__ENVELOPE__BODY_JOB_SPEC:
        REQUIRE(co.slot[s].id != 0);
        break;
    case ZSHARD__ENVELOPE__BODY_SHARD_MAP: {
        REQUIRE(co.slot[s].id != 0);
        const Zshard__ShardMap *m = env->shard_map;
        REQUIRE(m->n_shards == (size_t)g.n_shards && m->n_servers >= 1 &&
                m->n_servers <= 2 * COORD_S);
        REQUIRE(!co.have_map || m->n_servers == (size_t)co.map_n);
        co.map_n = (int)m->n_servers;
        for (size_t i = 0; i < m->n_servers; i++) {
            REQUIRE(co.idrole[m->servers[i]->id] == ZSHARD__ROLE__ROLE_SERVER);
            REQUIRE(!co.have_map || co.map_servers[i] == m->servers[i]->id);
            co.map_servers[i] = m->servers[i]->id;
        }
        for (size_t k = 0; k < m->n_shards; k++)
            co.shard_owner[k] = m->shards[k]->server;
        co.have_map = 1;
        break;
    }
    case ZSHARD__ENVELOPE__BODY_STEP_ASSIGN: {
        const Zshard__StepAssign *a = env->step_assign;
        REQUIRE((long)a->step == step_now && (long)a->step >= co.last_assign_step);
        co.last_assign_step = (long)a->step;
        REQUIRE(a->worker <= MAX_IDS && co.idrole[a->worker] == ZSHARD__ROLE__ROLE_WORKER);
        REQUIRE(co.data_ok[a->worker]);
        REQUIRE((co.slot[s].roles & server_bit) || co.idslot[a->worker] == s);
        co.assigned[a->step] = 1;
        break;
    }
    case ZSHARD__ENVELOPE__BODY_CLIP_VERDICT: {
        long st = (long)env->clip_verdict->step;
        REQUIRE(co.slot[s].roles & server_bit);
        REQUIRE(st == step_now);
        REQUIRE(co.assigned[st]);
        REQUIRE(co.verdict_feed[st] == -1 || co.verdict_feed[st] == co.feed);
        co.verdict_feed[st] = co.feed;
        for (int c = 0; c < g.C; c++)
            REQUIRE(co.chunk_fed[st][c]);
        for (int k = 0; k < g.n_shards; k++)
            REQUIRE(co.partial_fed[st][k]);
        break;
    }
    case ZSHARD__ENVELOPE__BODY_RESTORE: {
        /* A server was lost: every server goes back to this version and the steps since run
         * again, on a new map. */
        long r = (long)env->restore->version;
        REQUIRE(co.slot[s].roles & server_bit);
        REQUIRE(zs_coord_recoveries(co.co) > 0 && r < COORD_STEPS);
        for (long st = r; st < COORD_STEPS; st++) {
            co.assigned[st] = 0;
            co.verdict_feed[st] = -1;
            memset(co.chunk_fed[st], 0, sizeof co.chunk_fed[st]);
            memset(co.partial_fed[st], 0, sizeof co.partial_fed[st]);
            memset(co.published[st], 0, sizeof co.published[st]);
        }
        co.last_assign_step = r;
        co.have_map = 0; /* the new map follows */
        co.restore_fed = 1;
        break;
    }
    case ZSHARD__ENVELOPE__BODY_STATUS_REPLY:
        REQUIRE((long)env->status_reply->steps_done == step_now);
        REQUIRE(env->status_reply->steps == COORD_STEPS);
        break;
    case ZSHARD__ENVELOPE__BODY_SHUTDOWN:
        if (env->shutdown->kind == ZSHARD__SHUTDOWN_KIND__SHUTDOWN_DONE) {
            REQUIRE(step_now == COORD_STEPS);
            co.done_sent = 1;
        }
        break;
    default:
        break;
    }
}

/* The shadow of what was fed: only ever more than the coordinator accepted. */
static void co_shadow(int s, const Zshard__Envelope *env)
{
    uint32_t id = env->sender;
    int mine = id > 0 && id <= MAX_IDS && co.idslot[id] == s && co.idrole[id];
    switch (env->body_case) {
    case ZSHARD__ENVELOPE__BODY_REGISTRATION:
        co.slot[s].pending_role = env->registration->role;
        co.slot[s].asked |= 1u << env->registration->role;
        break;
    case ZSHARD__ENVELOPE__BODY_READY: {
        const Zshard__Ready *r = env->ready;
        if (mine && r->what_case == ZSHARD__READY__WHAT_DATA &&
            r->data->fingerprint == g.data.fingerprint && r->data->ntokens == g.data.ntokens)
            co.data_ok[id] = 1;
        break;
    }
    case ZSHARD__ENVELOPE__BODY_CHUNK_DONE: {
        const Zshard__ChunkDone *d = env->chunk_done;
        if (mine && d->step < COORD_STEPS && d->chunk < MAX_C)
            co.chunk_fed[d->step][d->chunk] = 1;
        break;
    }
    case ZSHARD__ENVELOPE__BODY_GRAD_NORM_PARTIAL: {
        const Zshard__GradNormPartial *p = env->grad_norm_partial;
        if (!mine || co.idrole[id] != ZSHARD__ROLE__ROLE_SERVER || p->step >= COORD_STEPS)
            break;
        for (size_t i = 0; i < p->n_partials; i++)
            if (p->partials[i]->shard < MAX_SHARDS)
                co.partial_fed[p->step][p->partials[i]->shard] = 1;
        break;
    }
    case ZSHARD__ENVELOPE__BODY_VERSION_PUBLISHED: {
        uint64_t v = env->version_published->version;
        if (mine && v >= 1 && v <= COORD_STEPS && co.verdict_feed[v - 1] != -1)
            co.published[v - 1][id] = 1;
        break;
    }
    default:
        break;
    }
}

/* After each feed or turn: steps finish one at a time, and only when they are finished. */
static void co_check_steps(long before)
{
    long after = zs_coord_steps_done(co.co);
    int rec = zs_coord_recoveries(co.co);
    if (rec != co.recoveries || co.restore_fed) {
        /* A recovery began (the step count reads 0 until it ends) or ended (the count is the
         * version the servers went back to): steps go back, once, by design. */
        co.recoveries = rec;
        co.restore_fed = 0;
        REQUIRE(after <= COORD_STEPS);
        return;
    }
    REQUIRE(after == before || after == before + 1);
    REQUIRE(after <= COORD_STEPS);
    if (after == before + 1) {
        REQUIRE(co.have_map && co.verdict_feed[before] != -1 && co.verdict_feed[before] < co.feed);
        for (int i = 0; i < co.map_n; i++)
            REQUIRE(co.published[before][co.map_servers[i]]);
    }
    zs_err res;
    if (zs_coord_done(co.co, &res) && res == ZS_OK)
        REQUIRE(after == COORD_STEPS && co.done_sent);
}

static void co_feed(int s, const uint8_t *b, size_t n)
{
    zs_msg_ctx ctx = {.self = ZS_MSG_COORDINATOR};
    Zshard__Envelope *env = NULL;
    if (zs_msg_decode(b, n, &ctx, &env) == ZS_OK) {
        trace_env("fed from", s, env);
        co_shadow(s, env);
        zs_msg_free(env);
    }
    co.feed++;
    long before = zs_coord_steps_done(co.co);
    zs_ctrl_peer from = slot_peer(s);
    zs_coord_feed(co.co, &from, b, n);
    co_check_steps(before);
}

static void co_turn(volatile int *stop)
{
    co.feed++;
    long before = zs_coord_steps_done(co.co);
    zs_coord_turn(co.co, 0, stop);
    co_check_steps(before);
}

/* Feeds a built message (and writes it raw when writing seeds). */
static void co_feed_env(int s, Zshard__Envelope *env, uint32_t sender)
{
    size_t n;
    uint8_t *b = pack(env, sender, &n);
    conv_raw(CO_RAW, s, b, n);
    co_feed(s, b, n);
    free(b);
}

static void co_record(input *in)
{
    unsigned tag = take8(in);
    int s = (int)(tag & 7);
    unsigned op = (tag >> 3) % CO_OPS;
    if (op == CO_RAW) {
        const uint8_t *b;
        size_t n = take_bytes(in, take16(in) % (MAX_RAW + 1), &b);
        co_feed(s, b, n);
        return;
    }
    if (op == CO_CLOCK || op == CO_TURN) {
        unsigned a = take8(in);
        volatile int stop = op == CO_TURN && a == 0xa5;
        if (op == CO_CLOCK)
            co.clock_ms += 10 * (uint64_t)a;
        co_turn(&stop);
        return;
    }
    unsigned f = take8(in), a = take8(in), b = take8(in);
    uint32_t sender = f & 0x80 ? f & 15 : co.slot[s].id;
    uint64_t step = f & 0x40 ? (f >> 4) & 3 : (uint64_t)zs_coord_steps_done(co.co);
    Zshard__Envelope env = ZSHARD__ENVELOPE__INIT;
    switch (op) {
    case CO_REGISTER: {
        char ep[32], *eps[1] = {ep};
        snprintf(ep, sizeof ep, "127.0.0.1:%d", 7000 + s);
        Zshard__Register r = ZSHARD__REGISTER__INIT;
        r.has_role = r.has_protocol_version = r.has_capabilities = r.has_pid = 1;
        r.role = (Zshard__Role)(1 + (a & 3) % 3);
        r.n_endpoints = a & 4 ? 1 : 0;
        r.endpoints = a & 4 ? eps : NULL;
        r.protocol_version = ZS_PROTOCOL_VERSION;
        r.capabilities = ZSHARD__CAPABILITY__CAP_FETCH_FP32 | ZSHARD__CAPABILITY__CAP_TRANSPORT_TCP;
        r.hostname = (char *)"fuzz";
        r.pid = b;
        env.body_case = ZSHARD__ENVELOPE__BODY_REGISTRATION;
        env.registration = &r;
        co_feed_env(s, &env, f & 0x80 ? sender : 0);
        break;
    }
    case CO_READY: {
        Zshard__Ready r = ZSHARD__READY__INIT;
        Zshard__DataCheck d = ZSHARD__DATA_CHECK__INIT;
        if (a & 1) {
            r.what_case = ZSHARD__READY__WHAT_VERSION;
            r.version = 0;
        } else {
            r.what_case = ZSHARD__READY__WHAT_DATA;
            r.data = &d;
            d.has_fingerprint = d.has_ntokens = 1;
            d.fingerprint = g.data.fingerprint ^ (a & 2 ? b + 1u : 0u);
            d.ntokens = g.data.ntokens;
        }
        env.body_case = ZSHARD__ENVELOPE__BODY_READY;
        env.ready = &r;
        co_feed_env(s, &env, sender);
        break;
    }
    case CO_HEARTBEAT: {
        Zshard__Heartbeat h = ZSHARD__HEARTBEAT__INIT;
        h.has_sender = h.has_step = 1;
        h.sender = sender;
        h.step = step;
        env.body_case = ZSHARD__ENVELOPE__BODY_HEARTBEAT;
        env.heartbeat = &h;
        co_feed_env(s, &env, sender);
        break;
    }
    case CO_CHUNK: {
        Zshard__ChunkDone d = ZSHARD__CHUNK_DONE__INIT;
        d.has_step = d.has_chunk = d.has_worker = d.has_loss = 1;
        d.step = step;
        d.chunk = a % (unsigned)(g.C + 1);
        d.worker = sender;
        d.loss = b == 255 ? NAN : b / 16.0;
        if (a & 0x80) {
            d.has_compute_ms = d.has_fetch_wait_ms = d.has_push_wait_ms = 1;
            d.compute_ms = b;
            d.fetch_wait_ms = a & 0x40 ? -1.0 : 0.5;
            d.push_wait_ms = 0.25;
        }
        env.body_case = ZSHARD__ENVELOPE__BODY_CHUNK_DONE;
        env.chunk_done = &d;
        co_feed_env(s, &env, sender);
        break;
    }
    case CO_PARTIAL: {
        Zshard__ShardSumsq items[MAX_SHARDS + 1], *ptrs[MAX_SHARDS + 1];
        size_t n = 0;
        unsigned one = (a >> 1) % (unsigned)(g.n_shards + 1); /* n_shards: past the map */
        for (int k = 0; k <= g.n_shards; k++) {
            if (a & 1 ? k == g.n_shards || co.shard_owner[k] != sender || !sender
                      : (unsigned)k != one)
                continue;
            zshard__shard_sumsq__init(&items[n]);
            items[n].has_shard = items[n].has_sumsq = 1;
            items[n].shard = (uint32_t)k;
            items[n].sumsq = b == 255 ? INFINITY : b * 0.125 + k;
            ptrs[n] = &items[n];
            n++;
        }
        Zshard__GradNormPartial p = ZSHARD__GRAD_NORM_PARTIAL__INIT;
        p.has_step = p.has_server = p.has_has_nonfinite = 1;
        p.step = step;
        p.server = sender;
        p.n_partials = n;
        p.partials = ptrs;
        p.has_nonfinite = b == 255;
        env.body_case = ZSHARD__ENVELOPE__BODY_GRAD_NORM_PARTIAL;
        env.grad_norm_partial = &p;
        co_feed_env(s, &env, sender);
        break;
    }
    case CO_PUBLISHED: {
        Zshard__VersionPublished v = ZSHARD__VERSION_PUBLISHED__INIT;
        v.has_server = v.has_version = 1;
        v.server = sender;
        v.version = f & 0x40 ? step : step + 1;
        env.body_case = ZSHARD__ENVELOPE__BODY_VERSION_PUBLISHED;
        env.version_published = &v;
        co_feed_env(s, &env, sender);
        break;
    }
    case CO_LEAVE: {
        Zshard__Shutdown sd = ZSHARD__SHUTDOWN__INIT;
        Zshard__Error e = ZSHARD__ERROR__INIT;
        if (a & 1) {
            sd.has_kind = 1;
            sd.kind = ZSHARD__SHUTDOWN_KIND__SHUTDOWN_LEAVING;
            sd.reason = b & 1 ? (char *)"fuzz leaves" : NULL;
            env.body_case = ZSHARD__ENVELOPE__BODY_SHUTDOWN;
            env.shutdown = &sd;
        } else {
            e.has_code = 1;
            e.code = (Zshard__ErrorCode)(b % 8);
            e.text = (char *)"fuzz error";
            env.body_case = ZSHARD__ENVELOPE__BODY_ERROR;
            env.error = &e;
        }
        co_feed_env(s, &env, sender);
        break;
    }
    case CO_STATUS: {
        Zshard__StatusRequest sr = ZSHARD__STATUS_REQUEST__INIT;
        env.body_case = ZSHARD__ENVELOPE__BODY_STATUS_REQUEST;
        env.status_request = &sr;
        co_feed_env(s, &env, f & 0x80 || a & 1 ? sender : 0);
        break;
    }
    default:
        break;
    }
}

static void co_run(input *in, int finish_fails)
{
    memset(&co, 0, sizeof co);
    co.last_assign_step = -1;
    for (int s = 0; s < COORD_STEPS; s++)
        co.verdict_feed[s] = -1;
    co.clock_ms = 1000000;
    co.finish_fails = finish_fails;
    co.opts = (zs_coord_opts){.listen = NULL,
                              .config_path = g.config_path,
                              .data_path = g.data_path,
                              .out_dir = g.out_dir,
                              .servers = COORD_S,
                              .steps = COORD_STEPS};
    if (zs_coord_open(&co.opts, &co.co) != ZS_OK) {
        fprintf(stderr, "fuzz_handlers: %s\n", zs_last_error());
        abort();
    }
    zs_coord_hooks h = {.sent = co_sent, .now_ms = co_now, .finish = co_finish};
    zs_coord_set_hooks(co.co, &h);
    for (int r = 0; r < MAX_RECORDS && in->n && !zs_coord_done(co.co, NULL); r++) {
        conv.rec = in->p;
        co_record(in);
        conv_end_record(in);
    }
    zs_coord_close(co.co);
}

/* ======================================================================================== */
/* The partition server                                                                      */
/* ======================================================================================== */

enum {
    SV_RAW,      /* u16 length, bytes: a control message from the coordinator */
    SV_REPLY,    /* a: RegisterReply, id 1 + (a >> 1) % 3, a refusal if a & 1 */
    SV_JOB,      /* a: JobSpec (a & 1: another model) */
    SV_MAP,      /* a: ShardMap a % 3 */
    SV_ASSIGN,   /* f a b: StepAssign to worker 10 + (a & 3) of the chunks in bits of b */
    SV_VERDICT,  /* f a b: ClipVerdict, clip (a + 1) / 256, skip if b & 1 */
    SV_SHUTDOWN, /* a: Shutdown DONE or ABORT (a & 1), or an Error (a & 2) */
    SV_PUSH,     /* f a b d: a push (see sv_push) */
    SV_FETCH,    /* f a b: a fetch, or a frame that is no request (see sv_fetch) */
    SV_DATA_RAW, /* u16 length, bytes: onto the data-plane connection */
    SV_HANGUP,   /* a: the worker's connection closes (a & 1: in the middle of a push) */
    SV_PUMP,     /* turns of the server's loop */
    SV_CLOCK,    /* a: the server's clock moves a * 5 ms, then turns of its loop */
    SV_OPS
};

typedef struct {
    uint64_t id;
    int op;
    uint64_t step, offset, count;
    uint32_t chunk, sender;
    int dtype;
    int cut; /* a push whose payload breaks off: it can only be refused */
} sv_req;

static struct {
    zs_server *sv;
    zs_server_opts opts;
    int fd;          /* our end of the data-plane connection, -1: none */
    uint32_t member; /* the member that connection proved (the server's sender of its pushes) */
    unsigned connects;
    uint8_t *out;
    size_t out_len, out_cap; /* bytes waiting to be written to fd */
    uint8_t in[65536];
    size_t in_len;
    int raw_sent; /* raw bytes went out on this connection: replies to unknown ids are fine */
    uint64_t next_id;
    sv_req req[MAX_REQ];
    int n_req;
    uint32_t id;       /* the id the last RegisterReply gave */
    uint32_t setup_id; /* the id when the shards were set up (which shards are ours) */
    zs_shardmap map;   /* the first map the server could take, mirrored */
    int have_map;
    uint64_t clock_ms;
    long version;   /* zs_server_version after the last record */
    long published; /* the last VersionPublished */
    int ready_sent;
    int restored; /* a Restore was fed: the server went back; the input ends there (the
                     steps it replays are the integration tests' to check) */
    uint8_t partial_sent[SERVER_STEPS];
    uint8_t verdict_ok[SERVER_STEPS];     /* a ClipVerdict fed after the partials were out */
    uint8_t uncertain[SERVER_STEPS];      /* a push reply was lost with its connection */
    uint16_t owners[SERVER_STEPS][MAX_C]; /* bit w: a StepAssign gave the chunk to worker w */
    uint8_t *covered;                     /* [SERVER_STEPS][C][total]: elements accepted */
    int check_partial;                    /* partials went out: check once the replies are in */
    long partial_step;
    uint32_t partial_shards[MAX_SHARDS];
    size_t n_partial_shards;
} sh;

static uint64_t sv_now(void *user)
{
    (void)user;
    return sh.clock_ms;
}

static void sv_sent(void *user, const Zshard__Envelope *env)
{
    (void)user;
    trace_env("server sent", 0, env);
    zs_msg_ctx rx = {.self = ZS_MSG_COORDINATOR, .chunks = (uint32_t)g.C};
    check_sendable(env, &rx);
    if (sh.restored)
        return; /* what follows a Restore is checked by the integration tests */
    long v = zs_server_version(sh.sv);
    switch (env->body_case) {
    case ZSHARD__ENVELOPE__BODY_READY:
        REQUIRE(!sh.ready_sent && v == 0);
        REQUIRE(env->ready->what_case == ZSHARD__READY__WHAT_VERSION && env->ready->version == 0);
        sh.ready_sent = 1;
        sh.setup_id = sh.id;
        break;
    case ZSHARD__ENVELOPE__BODY_HEARTBEAT:
        REQUIRE((long)env->heartbeat->step == (v < 0 ? 0 : v));
        break;
    case ZSHARD__ENVELOPE__BODY_GRAD_NORM_PARTIAL: {
        const Zshard__GradNormPartial *p = env->grad_norm_partial;
        REQUIRE((long)p->step == v && p->server == sh.id);
        if (v >= SERVER_STEPS)
            break;
        REQUIRE(!sh.partial_sent[v]);
        sh.partial_sent[v] = 1;
        /* The replies of the pushes that completed the step may still be on their way. */
        REQUIRE(p->n_partials <= MAX_SHARDS);
        sh.check_partial = 1;
        sh.partial_step = v;
        sh.n_partial_shards = p->n_partials;
        for (size_t i = 0; i < p->n_partials; i++)
            sh.partial_shards[i] = p->partials[i]->shard;
        break;
    }
    case ZSHARD__ENVELOPE__BODY_VERSION_PUBLISHED: {
        long pv = (long)env->version_published->version;
        REQUIRE(pv == v && pv == sh.published + 1 && env->version_published->server == sh.id);
        REQUIRE(pv > SERVER_STEPS || sh.verdict_ok[pv - 1]);
        sh.published = pv;
        break;
    }
    default:
        REQUIRE(!"a server sends Ready, Heartbeat, GradNormPartial and VersionPublished only");
    }
}

static void sv_check_partials(void)
{
    if (!sh.check_partial)
        return;
    sh.check_partial = 0;
    long st = sh.partial_step;
    if (sh.uncertain[st])
        return;
    REQUIRE(sh.have_map);
    for (size_t i = 0; i < sh.n_partial_shards; i++) {
        uint32_t k = sh.partial_shards[i];
        REQUIRE((int)k < sh.map.n_shards);
        REQUIRE(sh.map.server_ids[sh.map.shards[k].server] == sh.setup_id);
        const zs_shard *sd = &sh.map.shards[k];
        for (int c = 0; c < g.C; c++) {
            const uint8_t *cov = sh.covered + ((size_t)st * (size_t)g.C + (size_t)c) * g.tt.total;
            REQUIRE(!memchr(cov + sd->begin, 0, sd->end - sd->begin));
        }
    }
}

/* Forgets the requests of a connection that closed: their replies are lost. */
static void sv_forget_requests(void)
{
    for (int i = 0; i < sh.n_req; i++)
        if (sh.req[i].op == ZS_OP_PUSH && !sh.req[i].cut && sh.req[i].step < SERVER_STEPS)
            sh.uncertain[sh.req[i].step] = 1;
    sh.n_req = 0;
}

static void sv_hangup(void)
{
    if (sh.fd < 0)
        return;
    close(sh.fd);
    sh.fd = -1;
    sh.out_len = sh.in_len = 0;
    sh.raw_sent = 0;
    sv_forget_requests();
}

static int sv_connect(void)
{
    if (sh.fd >= 0)
        return 1;
    int sp[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) == 0);
    REQUIRE(fcntl(sp[0], F_SETFL, fcntl(sp[0], F_GETFL) | O_NONBLOCK) == 0);
    /* Each connection is another of the workers 10..13; a push's sender is the connection's
     * member whatever its frame says (sv_push may spoof the field). */
    sh.member = WORKER0 + (sh.connects++ & 3);
    REQUIRE(zs_server_adopt(sh.sv, sp[1], "fuzz-worker", sh.member) == ZS_OK);
    sh.fd = sp[0];
    return 1;
}

static void sv_put(const void *p, size_t n)
{
    if (n == 0)
        return;
    if (sh.out_len + n > sh.out_cap) {
        sh.out_cap = (sh.out_len + n) * 2;
        sh.out = realloc(sh.out, sh.out_cap);
        REQUIRE(sh.out);
    }
    memcpy(sh.out + sh.out_len, p, n);
    sh.out_len += n;
}

static void sv_put_frame(const zs_frame *f, const void *payload)
{
    uint8_t h[ZS_FRAME_HEADER_BYTES];
    zs_frame_encode(f, h);
    sv_put(h, sizeof h);
    if (f->length)
        sv_put(payload, f->length);
}

static void sv_reply(const zs_frame *f)
{
    int i = 0;
    while (i < sh.n_req && sh.req[i].id != f->id)
        i++;
    if (i == sh.n_req) {
        REQUIRE(sh.raw_sent); /* replies only to what was asked */
        return;
    }
    sv_req r = sh.req[i];
    sh.req[i] = sh.req[--sh.n_req];
    long v = zs_server_version(sh.sv);
    if (f->op == ZS_OP_FETCH_REPLY) {
        REQUIRE(r.op == ZS_OP_FETCH);
        REQUIRE(f->step == r.step && (long)f->step <= v);
        REQUIRE(f->offset == r.offset && f->count == r.count && f->dtype == r.dtype);
        REQUIRE(f->status == ZS_FS_OK);
    } else if (f->op == ZS_OP_PUSH_REPLY) {
        REQUIRE(r.op == ZS_OP_PUSH && !r.cut);
        REQUIRE(f->status == ZS_FS_OK || f->status == ZS_FS_DUPLICATE);
        REQUIRE(f->step == r.step && f->chunk == r.chunk);
        REQUIRE(r.chunk < (uint32_t)g.C && r.sender >= 1 && r.sender < 16);
        if (r.step < SERVER_STEPS) {
            REQUIRE(sh.owners[r.step][r.chunk] & 1u << r.sender);
            uint8_t *cov = sh.covered + (r.step * (size_t)g.C + r.chunk) * g.tt.total;
            REQUIRE(r.offset + r.count <= g.tt.total);
            memset(cov + r.offset, 1, r.count);
        }
    } else {
        REQUIRE(f->op == ZS_OP_ERROR);
        /* A frame that is no request is refused as such (or, before the shards exist, as
         * every frame is). */
        REQUIRE(r.op != ZS_OP_PUSH_REPLY || f->status == ZS_FS_BAD_FRAME ||
                (f->status == ZS_FS_SHUTDOWN && !sh.ready_sent));
    }
}

/* Writes what waits, reads and checks what came; returns whether anything moved. */
static int sv_io(void)
{
    if (sh.fd < 0)
        return 0;
    int moved = 0;
    while (sh.out_len) {
        ssize_t k = send(sh.fd, sh.out, sh.out_len, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (k <= 0) {
            if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                break;
            sv_hangup(); /* the server closed the connection */
            return 1;
        }
        memmove(sh.out, sh.out + k, sh.out_len - (size_t)k);
        sh.out_len -= (size_t)k;
        moved = 1;
    }
    for (;;) {
        ssize_t k = recv(sh.fd, sh.in + sh.in_len, sizeof sh.in - sh.in_len, MSG_DONTWAIT);
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
            sv_hangup();
            return 1;
        }
        if (k < 0)
            break;
        sh.in_len += (size_t)k;
        moved = 1;
        size_t at = 0;
        while (sh.in_len - at >= ZS_FRAME_HEADER_BYTES) {
            zs_frame f;
            REQUIRE(zs_frame_decode(sh.in + at, &f) == ZS_OK); /* the server sends valid frames */
            REQUIRE(f.length <= sizeof sh.in - ZS_FRAME_HEADER_BYTES);
            if (sh.in_len - at < ZS_FRAME_HEADER_BYTES + f.length)
                break;
            sv_reply(&f);
            at += ZS_FRAME_HEADER_BYTES + f.length;
        }
        memmove(sh.in, sh.in + at, sh.in_len - at);
        sh.in_len -= at;
    }
    return moved;
}

/* Turns of the server's loop until neither side moves. */
static void sv_pump(void)
{
    for (int round = 0, idle = 0; round < 2000 && idle < 3 && !zs_server_done(sh.sv, NULL);
         round++) {
        REQUIRE(zs_server_turn(sh.sv, 0) == ZS_OK);
        idle = sv_io() ? 0 : idle + 1;
    }
    sv_check_partials();
}

/* The shadow of a fed control message: what the server could have taken from it. */
static void sv_shadow(const Zshard__Envelope *env)
{
    switch (env->body_case) {
    case ZSHARD__ENVELOPE__BODY_REGISTRATION_REPLY:
        if (env->registration_reply->outcome_case == ZSHARD__REGISTER_REPLY__OUTCOME_ASSIGNED_ID)
            sh.id = env->registration_reply->assigned_id;
        break;
    case ZSHARD__ENVELOPE__BODY_SHARD_MAP:
        if (!sh.have_map && zs_shardmap_from_msg(env->shard_map, &sh.map) == ZS_OK)
            sh.have_map = 1;
        break;
    case ZSHARD__ENVELOPE__BODY_STEP_ASSIGN: {
        const Zshard__StepAssign *a = env->step_assign;
        if (a->step < SERVER_STEPS && a->worker < 16)
            for (size_t i = 0; i < a->n_chunks; i++)
                if (a->chunks[i] < MAX_C)
                    sh.owners[a->step][a->chunks[i]] |= (uint16_t)(1u << a->worker);
        break;
    }
    case ZSHARD__ENVELOPE__BODY_CLIP_VERDICT: {
        uint64_t st = env->clip_verdict->step;
        if (st < SERVER_STEPS && sh.partial_sent[st])
            sh.verdict_ok[st] = 1;
        break;
    }
    default:
        break;
    }
}

static void sv_feed(const uint8_t *b, size_t n)
{
    zs_msg_ctx ctx = {.self = ZS_MSG_SERVER};
    Zshard__Envelope *env = NULL;
    int shutdown = 0;
    if (zs_msg_decode(b, n, &ctx, &env) == ZS_OK) {
        trace_env("server fed", 0, env);
        sv_shadow(env);
        shutdown = env->body_case == ZSHARD__ENVELOPE__BODY_SHUTDOWN;
        sh.restored |= env->body_case == ZSHARD__ENVELOPE__BODY_RESTORE;
        zs_msg_free(env);
    }
    zs_server_feed(sh.sv, b, n);
    if (shutdown)
        REQUIRE(zs_server_done(sh.sv, NULL));
}

static void sv_feed_env(Zshard__Envelope *env)
{
    size_t n;
    uint8_t *b = pack(env, 0, &n);
    conv_raw(SV_RAW, 0, b, n);
    sv_feed(b, n);
    free(b);
}

static uint64_t sv_step(unsigned f)
{
    long v = zs_server_version(sh.sv);
    return f & 0x40 ? (f >> 4) & 3 : (uint64_t)(v < 0 ? 0 : v);
}

/* A range: shard (b >> 1) % shards whole, or half of it (b & 0x40), or one across two shards
 * or past the vector (b & 0x80). */
static void sv_range(unsigned b, uint64_t *offset, uint64_t *count)
{
    int k = (int)((b >> 1) % (unsigned)g.n_shards);
    size_t begin = (size_t)k * g.shard_floats;
    size_t end = begin + g.shard_floats < g.tt.total ? begin + g.shard_floats : g.tt.total;
    *offset = begin;
    *count = end - begin;
    if (b & 0x40)
        *count = (*count + 1) / 2;
    if (b & 0x80)
        *offset = begin + *count / 2 + (b & 1 ? g.tt.total : 0);
}

/*
 * f a b d: a push of chunk (a >> 2) % (C + 1) by the connection's member, whose frames name
 * worker 10 + (a & 3) as the sender (f & 0x80: f & 15), rightly or not.  b & 1 with no bit 6 or 7:
 * every shard of this server (per the map it took), one frame each; else the range of sv_range(b).
 * d & 1: a NaN in it; d & 2: dtype BF16.  cut: only the first frame, and only half of its payload
 * (the connection is about to close).
 */
static void sv_push(unsigned f, unsigned a, unsigned b, unsigned d, int cut)
{
    uint64_t step = sv_step(f);
    uint32_t chunk = (a >> 2) % (unsigned)(g.C + 1);
    uint32_t sender = f & 0x80 ? f & 15 : WORKER0 + (a & 3);
    uint64_t ranges[MAX_SHARDS][2];
    int n = 0;
    int s = sh.have_map && sh.ready_sent ? zs_shardmap_server_index(&sh.map, sh.setup_id) : -1;
    if ((b & 0xc1) == 1 && s >= 0) {
        int count;
        const int *mine = zs_shardmap_server_shards(&sh.map, s, &count);
        for (int i = 0; i < count && n < MAX_SHARDS; i++, n++) {
            ranges[n][0] = sh.map.shards[mine[i]].begin;
            ranges[n][1] = sh.map.shards[mine[i]].end - ranges[n][0];
        }
    } else {
        sv_range(b, &ranges[0][0], &ranges[0][1]);
        n = 1;
    }
    if (cut)
        n = n > 0 ? 1 : 0;
    float *grad = malloc((g.shard_floats + 1) * sizeof *grad);
    REQUIRE(grad);
    for (int i = 0; i < n && sh.n_req < MAX_REQ; i++) {
        uint64_t cnt = ranges[i][1] <= g.shard_floats ? ranges[i][1] : g.shard_floats;
        uint64_t from = ranges[i][0] < g.tt.total ? ranges[i][0] : 0;
        uint64_t avail = g.tt.total - from < cnt ? g.tt.total - from : cnt;
        memset(grad, 0, cnt * sizeof *grad);
        memcpy(grad, g.grad + chunk * g.tt.total + from, avail * sizeof *grad);
        if (d & 1 && cnt)
            grad[cnt / 2] = NAN;
        zs_frame fr = {.op = ZS_OP_PUSH,
                       .dtype = d & 2 ? ZS_DTYPE_BF16 : ZS_DTYPE_F32,
                       .id = ++sh.next_id,
                       .step = step,
                       .chunk = chunk,
                       .sender = sender,
                       .offset = ranges[i][0],
                       .count = cnt,
                       .length = cnt * (d & 2 ? 2 : 4)};
        sh.req[sh.n_req++] = (sv_req){.id = fr.id,
                                      .op = ZS_OP_PUSH,
                                      .step = step,
                                      .offset = fr.offset,
                                      .count = cnt,
                                      .chunk = chunk,
                                      .sender = sh.member,
                                      .dtype = fr.dtype,
                                      .cut = cut};
        if (cut) {
            uint8_t h[ZS_FRAME_HEADER_BYTES];
            zs_frame_encode(&fr, h);
            sv_put(h, sizeof h);
            sv_put(grad, fr.length / 2);
            break;
        }
        sv_put_frame(&fr, grad);
    }
    free(grad);
}

/* f a b: a fetch of the current version + a % 3 (f & 0x40: version (f >> 4) & 3) of the range
 * of sv_range(b), dtype BF16 if a & 4; with a & 0x18 == 0x18 a PUSH_REPLY instead, which is no
 * request (the server answers BAD_FRAME and drops the connection). */
static void sv_fetch(unsigned f, unsigned a, unsigned b)
{
    if (sh.n_req >= MAX_REQ)
        return;
    uint64_t step = f & 0x40 ? (f >> 4) & 3 : sv_step(0) + a % 3;
    int op = (a & 0x18) == 0x18 ? ZS_OP_PUSH_REPLY : ZS_OP_FETCH;
    zs_frame fr = {.op = (uint16_t)op,
                   .dtype = a & 4 ? ZS_DTYPE_BF16 : ZS_DTYPE_F32,
                   .id = ++sh.next_id,
                   .step = step};
    sv_range(b, &fr.offset, &fr.count);
    if (op == ZS_OP_PUSH_REPLY)
        fr.count = 0;
    sh.req[sh.n_req++] = (sv_req){.id = fr.id,
                                  .op = op,
                                  .step = step,
                                  .offset = fr.offset,
                                  .count = fr.count,
                                  .dtype = fr.dtype};
    sv_put_frame(&fr, NULL);
}

static void sv_record(input *in)
{
    unsigned tag = take8(in);
    unsigned op = (tag >> 3) % SV_OPS;
    Zshard__Envelope env = ZSHARD__ENVELOPE__INIT;
    switch (op) {
    case SV_RAW: {
        const uint8_t *b;
        size_t n = take_bytes(in, take16(in) % (MAX_RAW + 1), &b);
        sv_feed(b, n);
        break;
    }
    case SV_REPLY: {
        unsigned a = take8(in);
        Zshard__RegisterReply r = ZSHARD__REGISTER_REPLY__INIT;
        if (a & 1) {
            r.outcome_case = ZSHARD__REGISTER_REPLY__OUTCOME_REFUSAL;
            r.refusal = (char *)"fuzz refuses";
            r.has_code = 1;
            r.code = ZSHARD__ERROR_CODE__ERROR_REFUSED;
        } else {
            static uint8_t key[ZS_TOKEN_BYTES]; /* the job's data key: zeros, as insecure */
            r.outcome_case = ZSHARD__REGISTER_REPLY__OUTCOME_ASSIGNED_ID;
            r.assigned_id = 1 + (a >> 1) % 3;
            r.has_data_token = r.has_data_key = 1;
            r.data_token = (ProtobufCBinaryData){.len = sizeof key, .data = key};
            r.data_key = (ProtobufCBinaryData){.len = sizeof key, .data = key};
        }
        env.body_case = ZSHARD__ENVELOPE__BODY_REGISTRATION_REPLY;
        env.registration_reply = &r;
        sv_feed_env(&env);
        break;
    }
    case SV_JOB:
    case SV_MAP: {
        unsigned a = take8(in);
        const uint8_t *b = op == SV_JOB ? g.job[a & 1] : g.map[a % 3];
        size_t n = op == SV_JOB ? g.job_len[a & 1] : g.map_len[a % 3];
        conv_raw(SV_RAW, 0, b, n);
        sv_feed(b, n);
        break;
    }
    case SV_ASSIGN: {
        unsigned f = take8(in), a = take8(in), b = take8(in);
        uint32_t chunks[MAX_C + 1];
        size_t n = 0;
        for (int c = 0; c <= g.C; c++)
            if (b >> c & 1)
                chunks[n++] = (uint32_t)c;
        Zshard__StepAssign sa = ZSHARD__STEP_ASSIGN__INIT;
        sa.has_step = sa.has_worker = sa.has_lr = 1;
        sa.step = sv_step(f);
        sa.worker = f & 0x80 ? f & 15 : WORKER0 + (a & 3);
        sa.n_chunks = n;
        sa.chunks = chunks;
        sa.lr = 0.001;
        env.body_case = ZSHARD__ENVELOPE__BODY_STEP_ASSIGN;
        env.step_assign = &sa;
        sv_feed_env(&env);
        break;
    }
    case SV_VERDICT: {
        unsigned f = take8(in), a = take8(in), b = take8(in);
        Zshard__ClipVerdict v = ZSHARD__CLIP_VERDICT__INIT;
        v.has_step = v.has_clip_factor = v.has_skip = v.has_grad_norm = 1;
        v.step = sv_step(f);
        v.clip_factor = (a + 1) / 256.0;
        v.skip = b & 1;
        v.grad_norm = b & 1 ? INFINITY : b / 8.0;
        env.body_case = ZSHARD__ENVELOPE__BODY_CLIP_VERDICT;
        env.clip_verdict = &v;
        sv_feed_env(&env);
        break;
    }
    case SV_SHUTDOWN: {
        unsigned a = take8(in);
        Zshard__Shutdown sd = ZSHARD__SHUTDOWN__INIT;
        Zshard__Error e = ZSHARD__ERROR__INIT;
        if (a & 2) {
            e.has_code = 1;
            e.code = ZSHARD__ERROR_CODE__ERROR_OUT_OF_ORDER;
            e.text = (char *)"fuzz error";
            env.body_case = ZSHARD__ENVELOPE__BODY_ERROR;
            env.error = &e;
        } else {
            sd.has_kind = 1;
            sd.kind = a & 1 ? ZSHARD__SHUTDOWN_KIND__SHUTDOWN_ABORT
                            : ZSHARD__SHUTDOWN_KIND__SHUTDOWN_DONE;
            sd.reason = (char *)"fuzz";
            env.body_case = ZSHARD__ENVELOPE__BODY_SHUTDOWN;
            env.shutdown = &sd;
        }
        sv_feed_env(&env);
        break;
    }
    case SV_PUSH: {
        unsigned f = take8(in), a = take8(in), b = take8(in), d = take8(in);
        if (sv_connect())
            sv_push(f, a, b, d, 0);
        break;
    }
    case SV_FETCH: {
        unsigned f = take8(in), a = take8(in), b = take8(in);
        if (sv_connect())
            sv_fetch(f, a, b);
        break;
    }
    case SV_DATA_RAW: {
        const uint8_t *b;
        size_t n = take_bytes(in, take16(in) % (MAX_RAW + 1), &b);
        if (sv_connect()) {
            sv_put(b, n);
            sh.raw_sent = 1;
        }
        break;
    }
    case SV_CLOCK:
        sh.clock_ms += 5 * (uint64_t)take8(in);
        break;
    case SV_HANGUP: {
        unsigned a = take8(in);
        if (a & 1 && sv_connect()) {
            /* Half a push of chunk (a >> 1) % (C + 1) from worker 10 + (a >> 3) % 4, then the
             * connection closes under it. */
            sv_push(0, ((a >> 3) & 3) | ((a >> 1) % (unsigned)(g.C + 1)) << 2, 1, 0, 1);
            sv_pump();
        }
        sv_hangup();
        break;
    }
    default:
        break;
    }
    sv_pump();
    if (sh.restored)
        return;
    long v = zs_server_version(sh.sv);
    REQUIRE(v == sh.version || v == sh.version + 1);
    REQUIRE(v <= 0 || v == sh.published);
    sh.version = v;
}

static void sv_run(input *in)
{
    uint8_t *covered = sh.covered;
    uint8_t *out = sh.out;
    size_t out_cap = sh.out_cap;
    memset(&sh, 0, sizeof sh);
    sh.covered = covered;
    sh.out = out;
    sh.out_cap = out_cap;
    memset(sh.covered, 0, (size_t)SERVER_STEPS * (size_t)g.C * g.tt.total);
    sh.fd = -1;
    sh.version = -1;
    sh.clock_ms = 1000000;
    sh.opts = (zs_server_opts){.coord = NULL, .listen = NULL, .init_dir = NULL, .threads = 1};
    REQUIRE(zs_server_open(&sh.opts, &sh.sv) == ZS_OK);
    zs_server_hooks h = {.sent = sv_sent, .now_ms = sv_now};
    zs_server_set_hooks(sh.sv, &h);
    for (int r = 0; r < MAX_RECORDS && in->n && !zs_server_done(sh.sv, NULL) && !sh.restored; r++) {
        conv.rec = in->p;
        sv_record(in);
        conv_end_record(in);
    }
    sv_hangup();
    zs_server_close(sh.sv);
    if (sh.have_map)
        zs_shardmap_free(&sh.map);
}

/* ======================================================================================== */

static void write_file(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    REQUIRE(f && fwrite(p, 1, n, f) == n && fclose(f) == 0);
}

static uint8_t *pack_job(const zs_config *cfg, size_t *len)
{
    zs_tensor_table tt;
    REQUIRE(zs_tensors_gpt2(&cfg->model, &tt) == ZS_OK);
    zs_msg_job job = {.data_fingerprint = g.data.fingerprint,
                      .data_ntokens = g.data.ntokens,
                      .steps = SERVER_STEPS};
    snprintf(job.data_path, sizeof job.data_path, "fuzz-data.bin"); /* a server never reads it */
    Zshard__JobSpec *js = NULL;
    REQUIRE(zs_msg_jobspec_from_config(cfg, &tt, &job, &js) == ZS_OK);
    Zshard__Envelope env = ZSHARD__ENVELOPE__INIT;
    env.body_case = ZSHARD__ENVELOPE__BODY_JOB_SPEC;
    env.job_spec = js;
    uint8_t *b = pack(&env, 0, len);
    zs_msg_jobspec_free(js);
    zs_tensors_free(&tt);
    return b;
}

static uint8_t *pack_map(int S, const uint32_t *ids, size_t *len)
{
    zs_shardmap m;
    REQUIRE(zs_shardmap_build(g.tt.total, g.cfg.cluster.shard_bytes, S, ids, &m) == ZS_OK);
    const char *eps[3] = {"127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"};
    Zshard__ShardMap *msg = NULL;
    REQUIRE(zs_shardmap_to_msg(&m, eps, &msg) == ZS_OK);
    Zshard__Envelope env = ZSHARD__ENVELOPE__INIT;
    env.body_case = ZSHARD__ENVELOPE__BODY_SHARD_MAP;
    env.shard_map = msg;
    uint8_t *b = pack(&env, 0, len);
    zshard__shard_map__free_unpacked(msg, NULL);
    zs_shardmap_free(&m);
    return b;
}

static void write_corpus(const char *dir);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    trace = getenv("ZS_FUZZ_TRACE") != NULL;
    if (!getenv("ZS_LOG"))
        zs_log_set_level(ZS_LOG_ERROR);
    /* AdamW runs on one thread here; OpenMP's idle threads would only spin. */
    setenv("OMP_NUM_THREADS", "1", 0);
    setenv("OMP_WAIT_POLICY", "passive", 0);
    snprintf(g.dir, sizeof g.dir, "%s/zs_fuzz_handlers.XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    REQUIRE(mkdtemp(g.dir));
    snprintf(g.config_path, sizeof g.config_path, "%s/config.json", g.dir);
    snprintf(g.data_path, sizeof g.data_path, "%s/data.bin", g.dir);
    snprintf(g.out_dir, sizeof g.out_dir, "%s/out", g.dir);
    write_file(g.config_path, config_text, strlen(config_text));
    uint16_t tokens[512];
    for (int i = 0; i < 512; i++)
        tokens[i] = (uint16_t)((i * 13 + 5) % 32);
    REQUIRE(zs_data_write_llmc(g.data_path, tokens, 512) == ZS_OK);
    REQUIRE(zs_config_load(g.config_path, &g.cfg) == ZS_OK);
    REQUIRE(zs_data_open(g.data_path, &g.data) == ZS_OK);
    REQUIRE(zs_tensors_gpt2(&g.cfg.model, &g.tt) == ZS_OK);
    g.C = g.cfg.chunks;
    g.shard_floats = g.cfg.cluster.shard_bytes / sizeof(float);
    g.n_shards = (int)((g.tt.total + g.shard_floats - 1) / g.shard_floats);
    REQUIRE(g.C <= MAX_C && g.n_shards <= MAX_SHARDS && g.n_shards >= 3);
    g.job[0] = pack_job(&g.cfg, &g.job_len[0]);
    zs_config other = g.cfg;
    other.model.n_layer = 2;
    g.job[1] = pack_job(&other, &g.job_len[1]);
    uint32_t ids[3][2] = {{1, 0}, {1, 2}, {2, 3}};
    for (int i = 0; i < 3; i++)
        g.map[i] = pack_map(i == 0 ? 1 : 2, ids[i], &g.map_len[i]);
    sh.covered = malloc((size_t)SERVER_STEPS * (size_t)g.C * g.tt.total);
    g.grad = malloc((size_t)(g.C + 1) * g.tt.total * sizeof *g.grad);
    REQUIRE(sh.covered && g.grad);
    for (size_t i = 0; i < (size_t)(g.C + 1) * g.tt.total; i++)
        g.grad[i] = (float)((int)(i * 7 % 17) - 8) * 1e-3f;
    const char *corpus = getenv("ZS_FUZZ_WRITE_CORPUS");
    if (corpus) {
        write_corpus(corpus);
        exit(0);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    input in = {data + 1, size - 1};
    if (data[0] & 1)
        sv_run(&in);
    else
        co_run(&in, data[0] & 2);
    return 0;
}

/* ---- seeds ---------------------------------------------------------------------------- */

typedef struct {
    uint8_t b[8192];
    size_t n;
} seed;

/* A record: tag (op, slot) and its operand bytes. */
static void rec(seed *s, unsigned op, int slot, int n, unsigned o0, unsigned o1, unsigned o2,
                unsigned o3)
{
    unsigned o[4] = {o0, o1, o2, o3};
    REQUIRE(s->n + 1 + (size_t)n <= sizeof s->b);
    s->b[s->n++] = (uint8_t)(op << 3 | (unsigned)slot);
    for (int i = 0; i < n; i++)
        s->b[s->n++] = (uint8_t)o[i];
}
#define R0(s, op, slot) rec(s, op, slot, 0, 0, 0, 0, 0)
#define R1(s, op, slot, a) rec(s, op, slot, 1, a, 0, 0, 0)
#define R3(s, op, slot, f, a, b) rec(s, op, slot, 3, f, a, b, 0)
#define R4(s, op, slot, f, a, b, d) rec(s, op, slot, 4, f, a, b, d)

/* Two servers (slots 0, 1) registered and ready. */
static void co_servers(seed *s)
{
    R3(s, CO_REGISTER, 0, 0, 4, 1);
    R3(s, CO_REGISTER, 1, 0, 4, 2);
    R3(s, CO_READY, 0, 0, 1, 0);
    R3(s, CO_READY, 1, 0, 1, 0);
}

/* The partials of both servers and their publication: the end of a step. */
static void co_finish_step(seed *s)
{
    R3(s, CO_PARTIAL, 0, 0, 1, 8);
    R3(s, CO_PARTIAL, 1, 0, 1, 8);
    R3(s, CO_PUBLISHED, 0, 0, 0, 0);
    R3(s, CO_PUBLISHED, 1, 0, 0, 0);
}

static void emit(const char *dir, const char *name, const seed *s)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    write_file(path, s->b, s->n);
    /* Its twin with every built message as raw bytes. */
    conv.on = 1;
    conv.len = 0;
    conv_put(s->b, 1);
    LLVMFuzzerTestOneInput(s->b, s->n);
    conv.on = 0;
    snprintf(path, sizeof path, "%s/%s-raw", dir, name);
    write_file(path, conv.buf, conv.len);
}

static void write_corpus(const char *dir)
{
    mkdir(dir, 0777);
    seed s;
    /* A whole job: 2 servers, 1 worker, 2 steps; and the same with a failing finish. */
    s.n = 0;
    s.b[s.n++] = 0;
    co_servers(&s);
    R3(&s, CO_STATUS, 5, 0, 0, 0);
    R3(&s, CO_REGISTER, 2, 0, 1, 3);
    R3(&s, CO_READY, 2, 0, 0, 0);
    for (int step = 0; step < COORD_STEPS; step++) {
        R3(&s, CO_STATUS, 2, 0, 1, 0);
        R3(&s, CO_HEARTBEAT, 2, 0, 0, 0);
        for (int c = 0; c < g.C; c++)
            R3(&s, CO_CHUNK, 2, 0, (unsigned)c | (c == 1 ? 0x80 : 0), 16);
        co_finish_step(&s);
    }
    emit(dir, "coord-job", &s);
    s.b[0] = 2;
    emit(dir, "coord-job-finish-fails", &s);

    /* Two workers; one stops heartbeating, its chunk goes to the other. */
    s.n = 0;
    s.b[s.n++] = 0;
    co_servers(&s);
    R3(&s, CO_REGISTER, 2, 0, 1, 3);
    R3(&s, CO_READY, 2, 0, 0, 0);
    R3(&s, CO_REGISTER, 3, 0, 1, 4);
    R3(&s, CO_READY, 3, 0, 0, 0);
    R3(&s, CO_CHUNK, 2, 0, 0, 16);
    R3(&s, CO_CHUNK, 2, 0, 2, 16);
    R1(&s, CO_CLOCK, 0, 60);
    R3(&s, CO_HEARTBEAT, 0, 0, 0, 0);
    R3(&s, CO_HEARTBEAT, 1, 0, 0, 0);
    R3(&s, CO_HEARTBEAT, 2, 0, 0, 0);
    R1(&s, CO_CLOCK, 0, 60);
    R3(&s, CO_CHUNK, 2, 0, 1, 255);
    co_finish_step(&s);
    for (int c = 0; c < g.C; c++)
        R3(&s, CO_CHUNK, 2, 0, (unsigned)c, 20);
    co_finish_step(&s);
    emit(dir, "coord-dead-worker", &s);

    /* Refusals: a third server, a worker with other data, a spoofed sender, a worker past
     * max_workers, a client tool, partials twice and for a shard past the map, then a server
     * leaves (the job is aborted). */
    s.n = 0;
    s.b[s.n++] = 0;
    co_servers(&s);
    R3(&s, CO_REGISTER, 4, 0, 4, 5);
    R3(&s, CO_REGISTER, 2, 0, 1, 3);
    R3(&s, CO_READY, 2, 0, 2, 9);
    for (int w = 3; w < 7; w++) {
        R3(&s, CO_REGISTER, w, 0, 1, (unsigned)w);
        R3(&s, CO_READY, w, 0, 0, 0);
    }
    R3(&s, CO_REGISTER, 7, 0, 2, 7);
    R3(&s, CO_CHUNK, 3, 0x80 | 1, 0, 16);
    R3(&s, CO_CHUNK, 3, 0x40 | 0x10, 0, 16);
    R3(&s, CO_PARTIAL, 0, 0, 1, 255);
    R3(&s, CO_PARTIAL, 0, 0, 1, 8);
    R3(&s, CO_PARTIAL, 1, 0, (unsigned)g.n_shards << 1, 8);
    R3(&s, CO_PUBLISHED, 3, 0, 0, 0);
    R3(&s, CO_LEAVE, 3, 0, 0, 3);
    R3(&s, CO_LEAVE, 0, 0, 1, 1);
    emit(dir, "coord-refusals", &s);

    /* Stopped by a signal mid-step. */
    s.n = 0;
    s.b[s.n++] = 0;
    co_servers(&s);
    R3(&s, CO_REGISTER, 2, 0, 1, 3);
    R3(&s, CO_READY, 2, 0, 0, 0);
    R1(&s, CO_TURN, 0, 0);
    R1(&s, CO_TURN, 0, 0xa5);
    emit(dir, "coord-stop", &s);

    /* The server side: a whole job on one server (map S = 1), fetches held for the next
     * version, then Shutdown DONE. */
    s.n = 0;
    s.b[s.n++] = 1;
    R1(&s, SV_REPLY, 0, 0);
    R1(&s, SV_JOB, 0, 0);
    R1(&s, SV_MAP, 0, 0);
    R3(&s, SV_FETCH, 0, 0, 0, 2);
    for (int step = 0; step < 2; step++) {
        R3(&s, SV_ASSIGN, 0, 0, 0, (1u << g.C) - 1);
        for (int c = 0; c < g.C; c++)
            R4(&s, SV_PUSH, 0, 0, (unsigned)c << 2, 1, 0);
        R3(&s, SV_FETCH, 0, 0, 1, 4);
        R3(&s, SV_VERDICT, 0, 0, 255, 2);
        R3(&s, SV_FETCH, 0, 0, 4, 2);
    }
    R1(&s, SV_SHUTDOWN, 0, 0);
    emit(dir, "server-job", &s);

    /* Two workers on a server that holds half the shards (S = 2): pushes before their
     * assignment, a duplicate, a chunk pushed by the wrong worker, stale and misplaced
     * ranges, a NaN (the verdict skips), then garbage on the connection and a new one. */
    s.n = 0;
    s.b[s.n++] = 1;
    R1(&s, SV_REPLY, 0, 0);
    R1(&s, SV_MAP, 0, 1);
    R1(&s, SV_JOB, 0, 0);
    R4(&s, SV_PUSH, 0, 0, 0, 1, 0);
    R3(&s, SV_ASSIGN, 0, 0, 0, 1);
    R3(&s, SV_ASSIGN, 0, 0, 1, 6);
    R4(&s, SV_PUSH, 0, 0, 0, 1, 0);
    R4(&s, SV_PUSH, 0, 0, 1 << 2, 1, 0);
    for (int k = 0; k < 4; k++) /* each refused frame first waits for a reassignment */
        R1(&s, SV_CLOCK, 0, 30);
    R4(&s, SV_PUSH, 0, 0, 1 | 1 << 2, 1, 1);
    R4(&s, SV_PUSH, 0, 0, 1 | 2 << 2, 1, 0);
    R4(&s, SV_PUSH, 0, 0, 1 | 2 << 2, 0x42, 0);
    R4(&s, SV_PUSH, 0, 0x40 | 0x20, 1, 2, 0);
    R4(&s, SV_PUSH, 0, 0, 1, 0x82, 2);
    R3(&s, SV_VERDICT, 0, 0, 99, 1);
    R3(&s, SV_FETCH, 0, 0, 0, 0x80);
    R1(&s, SV_HANGUP, 0, 0);
    R3(&s, SV_FETCH, 0, 0, 4, 2);
    s.b[s.n++] = SV_DATA_RAW << 3;
    s.b[s.n++] = 8;
    s.b[s.n++] = 0;
    memcpy(s.b + s.n, "ZSF1junk", 8);
    s.n += 8;
    R3(&s, SV_FETCH, 0, 0, 0, 2);
    R1(&s, SV_SHUTDOWN, 0, 1);
    emit(dir, "server-two-workers", &s);

    /* A step whose pushes break off: a connection closes in the middle of a push payload (of
     * an assigned chunk, and of one whose owner is not known yet), a frame that is no request;
     * then the step completes over a new connection. */
    s.n = 0;
    s.b[s.n++] = 1;
    R1(&s, SV_REPLY, 0, 0);
    R1(&s, SV_JOB, 0, 0);
    R1(&s, SV_MAP, 0, 0);
    R3(&s, SV_ASSIGN, 0, 0, 0, 3);
    R1(&s, SV_HANGUP, 0, 1);
    R1(&s, SV_HANGUP, 0, 1 | 2 << 1);
    R3(&s, SV_FETCH, 0, 0, 0x18, 2);
    R3(&s, SV_ASSIGN, 0, 0, 1, 4);
    for (int c = 0; c < g.C; c++)
        R4(&s, SV_PUSH, 0, 0, (unsigned)c << 2 | (c == 2), 1, 0);
    R3(&s, SV_VERDICT, 0, 0, 127, 0);
    emit(dir, "server-broken-pushes", &s);

    /* Setups that fail: an id the map does not name; a job whose model the map does not fit;
     * a refused registration. */
    s.n = 0;
    s.b[s.n++] = 1;
    R1(&s, SV_REPLY, 0, 0);
    R1(&s, SV_JOB, 0, 0);
    R1(&s, SV_MAP, 0, 2);
    emit(dir, "server-not-in-map", &s);
    s.n = 0;
    s.b[s.n++] = 1;
    R1(&s, SV_REPLY, 0, 0);
    R1(&s, SV_JOB, 0, 1);
    R1(&s, SV_MAP, 0, 0);
    emit(dir, "server-other-model", &s);
    s.n = 0;
    s.b[s.n++] = 1;
    R1(&s, SV_SHUTDOWN, 0, 2);
    R1(&s, SV_REPLY, 0, 1);
    emit(dir, "server-refused", &s);
}
