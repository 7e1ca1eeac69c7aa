/*
 * fuzz_proto: libFuzzer target for the control-plane message gate (proto/messages.c) and what
 * the handlers build on it.
 *
 * Each input is fed
 *   1. to zs_msg_decode() as every kind of receiver (any, coordinator, server, worker; with
 *      and without a known job geometry); what is accepted must encode again and decode to an
 *      accepted message (the gate is consistent with itself), and goes to the per-type
 *      "handler" below: JobSpec -> config + tensor table, ShardMap -> shard map + range
 *      splits, each checked against its invariants;
 *   2. to protobuf-c's unpack alone, and the body, whatever the envelope says, straight to
 *      its zs_msg_check_<type>(): the typed checks must be safe on any structure protobuf-c
 *      can produce, not only on what passes the earlier passes of the gate.
 * A broken invariant aborts (libFuzzer reports it); ASan and UBSan catch the rest.
 *
 * Seeds: tests/fuzz/corpus/proto/, one valid envelope per body type, written by
 * `test_proto --write-corpus DIR`.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "common/shardmap.h"
#include "common/tensors.h"
#include "proto/messages.h"
#include "proto/shardmap_msg.h"

#define REQUIRE(cond)                                                                              \
    do {                                                                                           \
        if (!(cond))                                                                               \
            abort();                                                                               \
    } while (0)

static const zs_msg_ctx ctxs[] = {
    {ZS_MSG_ANY, 0, 0, 0},         {ZS_MSG_ANY, 4, 8, 100},    {ZS_MSG_COORDINATOR, 4, 8, 100},
    {ZS_MSG_COORDINATOR, 0, 0, 0}, {ZS_MSG_SERVER, 4, 8, 100}, {ZS_MSG_WORKER, 2, 3, 10},
};
#define N_CTX (sizeof ctxs / sizeof *ctxs)

/* JobSpec handler: to a config and this build's tensor table, and back. */
static void handle_job_spec(const Zshard__JobSpec *js)
{
    zs_config cfg;
    zs_tensor_table tt;
    zs_msg_job job;
    if (zs_msg_jobspec_to_config(js, &cfg, &tt, &job) != ZS_OK)
        return;
    REQUIRE(tt.total == js->total_floats);
    REQUIRE((size_t)tt.count == js->n_tensors);
    REQUIRE(cfg.train_batch_size == cfg.micro_batch * cfg.chunks);
    Zshard__JobSpec *again = NULL;
    REQUIRE(zs_msg_jobspec_from_config(&cfg, &tt, &job, &again) == ZS_OK);
    REQUIRE(again->total_floats == js->total_floats && again->n_tensors == js->n_tensors);
    zs_msg_jobspec_free(again);
    zs_tensors_free(&tt);
}

/* ShardMap handler: to a map; its lookups and splits must tile what they cover. */
static void handle_shard_map(const Zshard__ShardMap *sm, const uint8_t *data, size_t size)
{
    zs_shardmap map;
    if (zs_shardmap_from_msg(sm, &map) != ZS_OK)
        return;
    REQUIRE(map.total == sm->total_floats && (size_t)map.n_shards == sm->n_shards);
    size_t sum = 0;
    for (int s = 0; s < map.n_servers; s++) {
        int count;
        const int *list = zs_shardmap_server_shards(&map, s, &count);
        REQUIRE(count > 0 && list);
        for (int k = 0; k < count; k++)
            REQUIRE(map.shards[list[k]].server == s);
        sum += map.server_floats[s];
    }
    REQUIRE(sum == map.total);
    /* A few ranges drawn from the input's bytes. */
    for (size_t k = 0; k + 8 <= size && k < 64; k += 8) {
        uint32_t a, b;
        memcpy(&a, data + k, 4);
        memcpy(&b, data + k + 4, 4);
        size_t lo = a % (map.total + 1), hi = b % (map.total + 1);
        if (lo > hi) {
            size_t t = lo;
            lo = hi;
            hi = t;
        }
        int need = zs_shardmap_count_pieces(&map, lo, hi);
        zs_shard_piece *p = malloc((size_t)(need > 0 ? need : 1) * sizeof *p);
        int n = -1;
        REQUIRE(p && zs_shardmap_split(&map, lo, hi, p, need, &n) == ZS_OK && n == need);
        size_t x = lo;
        for (int i = 0; i < n; i++) {
            REQUIRE(p[i].begin == x && p[i].end > p[i].begin);
            REQUIRE(zs_shardmap_shard_of(&map, p[i].begin) == p[i].shard);
            REQUIRE(p[i].end <= map.shards[p[i].shard].end);
            x = p[i].end;
        }
        REQUIRE(lo == hi ? n == 0 : x == hi);
        free(p);
    }
    zs_shardmap_free(&map);
}

/* An accepted message must survive encode + decode, then goes to its handler. */
static void handle(const Zshard__Envelope *env, const zs_msg_ctx *ctx, const uint8_t *data,
                   size_t size)
{
    uint8_t *buf;
    size_t len;
    REQUIRE(zs_msg_encode(env, &buf, &len) == ZS_OK);
    Zshard__Envelope *again = NULL;
    REQUIRE(zs_msg_decode(buf, len, ctx, &again) == ZS_OK);
    REQUIRE(again->body_case == env->body_case && again->sender == env->sender);
    zs_msg_free(again);
    free(buf);
    switch (env->body_case) {
    case ZSHARD__ENVELOPE__BODY_JOB_SPEC:
        handle_job_spec(env->job_spec);
        break;
    case ZSHARD__ENVELOPE__BODY_SHARD_MAP:
        handle_shard_map(env->shard_map, data, size);
        break;
    default: /* the other bodies have nothing to build beyond their check */
        break;
    }
}

/* Pass 2: the typed check of whatever body protobuf-c produced, with every context. */
static void check_unfiltered(const Zshard__Envelope *env, const uint8_t *data, size_t size)
{
    for (size_t c = 0; c < N_CTX; c++) {
        const zs_msg_ctx *ctx = &ctxs[c];
        (void)zs_msg_check(env, ctx);
        switch (env->body_case) {
        case ZSHARD__ENVELOPE__BODY_REGISTRATION:
            (void)zs_msg_check_register(env->registration, ctx);
            break;
        case ZSHARD__ENVELOPE__BODY_REGISTRATION_REPLY:
            (void)zs_msg_check_register_reply(env->registration_reply, ctx);
            break;
        case ZSHARD__ENVELOPE__BODY_JOB_SPEC:
            (void)zs_msg_check_job_spec(env->job_spec, ctx);
            break;
        case ZSHARD__ENVELOPE__BODY_SHARD_MAP:
            (void)zs_msg_check_shard_map(env->shard_map, ctx);
            break;
        case ZSHARD__ENVELOPE__BODY_HEARTBEAT:
            (void)zs_msg_check_heartbeat(env->heartbeat, ctx);
            break;
        case ZSHARD__ENVELOPE__BODY_READY:
            (void)zs_msg_check_ready(env->ready, ctx);
            break;
        case ZSHARD__ENVELOPE__BODY_STEP_ASSIGN:
            (void)zs_msg_check_step_assign(env->step_assign, ctx);
            break;
        case ZSHARD__ENVELOPE__BODY_CHUNK_DONE:
            (void)zs_msg_check_chunk_done(env->chunk_done, ctx);
            break;
        case ZSHARD__ENVELOPE__BODY_GRAD_NORM_PARTIAL:
            (void)zs_msg_check_grad_norm_partial(env->grad_norm_partial, ctx);
            break;
        case ZSHARD__ENVELOPE__BODY_CLIP_VERDICT:
            (void)zs_msg_check_clip_verdict(env->clip_verdict, ctx);
            break;
        case ZSHARD__ENVELOPE__BODY_VERSION_PUBLISHED:
            (void)zs_msg_check_version_published(env->version_published, ctx);
            break;
        case ZSHARD__ENVELOPE__BODY_ERROR:
            (void)zs_msg_check_error(env->error, ctx);
            break;
        case ZSHARD__ENVELOPE__BODY_SHUTDOWN:
            (void)zs_msg_check_shutdown(env->shutdown, ctx);
            break;
        case ZSHARD__ENVELOPE__BODY_STATUS_REQUEST:
            (void)zs_msg_check_status_request(env->status_request, ctx);
            break;
        case ZSHARD__ENVELOPE__BODY_STATUS_REPLY:
            (void)zs_msg_check_status_reply(env->status_reply, ctx);
            break;
        default:
            break;
        }
    }
    /* The handlers validate first, so they too must be safe on anything. */
    if (env->body_case == ZSHARD__ENVELOPE__BODY_JOB_SPEC)
        handle_job_spec(env->job_spec);
    if (env->body_case == ZSHARD__ENVELOPE__BODY_SHARD_MAP)
        handle_shard_map(env->shard_map, data, size);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint32_t version;
    (void)zs_msg_peek_version(data, size, &version);
    for (size_t c = 0; c < N_CTX; c++) {
        Zshard__Envelope *env = NULL;
        zs_err r = zs_msg_decode(data, size, &ctxs[c], &env);
        REQUIRE((r == ZS_OK) == (env != NULL));
        if (env)
            handle(env, &ctxs[c], data, size);
        zs_msg_free(env);
    }
    if (size <= ZS_MSG_MAX_BYTES) {
        Zshard__Envelope *raw = zshard__envelope__unpack(NULL, size, data);
        if (raw) {
            check_unfiltered(raw, data, size);
            zshard__envelope__free_unpacked(raw, NULL);
        }
    }
    return 0;
}
