/*
 * proto: the control-plane messages.  Round trips of every body type; every validation rule
 * refused with its message; another protocol version refused with a clear message; truncated,
 * random and bit-flipped bytes refused without a crash; JobSpec <-> config round trip.
 *
 * `test_proto --write-corpus DIR` writes one valid encoded envelope per body type (plus one
 * of another protocol version) into DIR: the fuzzer's seeds in tests/fuzz/corpus/proto/.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "common/shardmap.h"
#include "common/tensors.h"
#include "proto/messages.h"
#include "proto/shardmap_msg.h"
#include "tests/unit/test.h"

static const zs_msg_ctx ANY = {ZS_MSG_ANY, 0, 0, 0};
static const zs_msg_ctx COORD = {ZS_MSG_COORDINATOR, 4, 8, 100};
static const zs_msg_ctx SERVER = {ZS_MSG_SERVER, 4, 8, 100};
static const zs_msg_ctx WORKER = {ZS_MSG_WORKER, 4, 8, 100};

/* Packs env without validation: what a buggy or hostile peer could send. */
static uint8_t *raw_pack(const Zshard__Envelope *env, size_t *len)
{
    *len = zshard__envelope__get_packed_size(env);
    uint8_t *buf = malloc(*len ? *len : 1);
    zshard__envelope__pack(env, buf);
    return buf;
}

/* Decodes len bytes for ctx and frees what decoded. */
static zs_err decode_bytes(const uint8_t *buf, size_t len, const zs_msg_ctx *ctx)
{
    Zshard__Envelope *out = NULL;
    zs_err r = zs_msg_decode(buf, len, ctx, &out);
    if (r == ZS_OK && !out)
        r = zs_error(ZS_ERR_INTERNAL, "decode returned ZS_OK without an envelope");
    if (r != ZS_OK && out)
        r = zs_error(ZS_ERR_INTERNAL, "decode failed but left an envelope");
    zs_msg_free(out);
    return r;
}

/* Packs env as is and decodes it for ctx: the receiver's verdict. */
static zs_err decode_raw(const Zshard__Envelope *env, const zs_msg_ctx *ctx)
{
    size_t len;
    uint8_t *buf = raw_pack(env, &len);
    zs_err r = decode_bytes(buf, len, ctx);
    free(buf);
    return r;
}

/* Encodes (validating) and decodes for ctx; *out is the decoded copy. */
static zs_err roundtrip(const Zshard__Envelope *env, const zs_msg_ctx *ctx, Zshard__Envelope **out)
{
    uint8_t *buf;
    size_t len;
    *out = NULL;
    ZS_CHECK(zs_msg_encode(env, &buf, &len));
    zs_err r = zs_msg_decode(buf, len, ctx, out);
    free(buf);
    return r;
}

/* Encodes env into a file of the corpus (or does nothing when dir is NULL). */
static const char *corpus_dir;

static void write_seed(const Zshard__Envelope *env, const char *name, int validate)
{
    if (!corpus_dir)
        return;
    uint8_t *buf;
    size_t len;
    if (validate) {
        if (zs_msg_encode(env, &buf, &len) != ZS_OK) {
            fprintf(stderr, "seed %s: %s\n", name, zs_last_error());
            zs_test_failures++;
            return;
        }
    } else {
        buf = raw_pack(env, &len);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.bin", corpus_dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, len, f) != len) {
        fprintf(stderr, "seed %s: cannot write %s\n", name, path);
        zs_test_failures++;
    }
    if (f)
        fclose(f);
    free(buf);
}

#define REFUSED(env, ctx, needle) CHECK_FAILS_WITH(decode_raw((env), (ctx)), needle)

/* ---- Register ---- */

typedef struct {
    Zshard__Envelope env;
    Zshard__Register reg;
    char *eps[ZS_MSG_MAX_ENDPOINTS + 1];
} reg_msg;

static void make_register(reg_msg *m)
{
    memset(m, 0, sizeof *m);
    zs_msg_envelope_init(&m->env, 0);
    zshard__register__init(&m->reg);
    m->reg.has_role = 1;
    m->reg.role = ZSHARD__ROLE__ROLE_SERVER;
    m->eps[0] = "127.0.0.1:7001";
    m->eps[1] = "[::1]:7002";
    m->reg.n_endpoints = 2;
    m->reg.endpoints = m->eps;
    m->reg.has_protocol_version = 1;
    m->reg.protocol_version = ZS_PROTOCOL_VERSION;
    m->reg.has_capabilities = 1;
    m->reg.capabilities = ZSHARD__CAPABILITY__CAP_FETCH_FP32 | ZSHARD__CAPABILITY__CAP_FETCH_BF16 |
                          ZSHARD__CAPABILITY__CAP_TRANSPORT_TCP;
    m->reg.hostname = "node-1.example";
    m->reg.has_pid = 1;
    m->reg.pid = 4242;
    m->reg.build = ZS_VERSION;
    m->env.body_case = ZSHARD__ENVELOPE__BODY_REGISTRATION;
    m->env.registration = &m->reg;
}

static void test_register(void)
{
    reg_msg m;
    make_register(&m);
    Zshard__Envelope *out;
    CHECK_OK(roundtrip(&m.env, &COORD, &out));
    if (out) {
        CHECK_EQ_INT(out->body_case, ZSHARD__ENVELOPE__BODY_REGISTRATION);
        CHECK_EQ_INT(out->protocol_version, ZS_PROTOCOL_VERSION);
        CHECK_EQ_INT(out->sender, 0);
        const Zshard__Register *r = out->registration;
        CHECK_EQ_INT(r->role, ZSHARD__ROLE__ROLE_SERVER);
        CHECK_EQ_INT(r->n_endpoints, 2);
        CHECK(strcmp(r->endpoints[1], "[::1]:7002") == 0);
        CHECK_EQ_INT(r->capabilities, m.reg.capabilities);
        CHECK(strcmp(r->hostname, "node-1.example") == 0);
        CHECK_EQ_INT(r->pid, 4242);
        CHECK(strcmp(r->build, ZS_VERSION) == 0);
    }
    zs_msg_free(out);
    write_seed(&m.env, "register", 1);
    /* A worker needs no endpoint. */
    m.reg.role = ZSHARD__ROLE__ROLE_WORKER;
    m.reg.n_endpoints = 0;
    CHECK_OK(decode_raw(&m.env, &COORD));

    make_register(&m);
    m.reg.has_role = 0;
    REFUSED(&m.env, &COORD, "Register.role: missing");
    m.reg.has_role = 1;
    m.reg.role = 9;
    REFUSED(&m.env, &COORD, "Register.role: 9 is not a role");
    m.reg.role = 0;
    REFUSED(&m.env, &COORD, "Register.role: 0 is not a role");

    make_register(&m);
    m.reg.protocol_version = ZS_PROTOCOL_VERSION + 1;
    REFUSED(&m.env, &COORD,
            "Register.protocol_version: protocol version 8, this coordinator "
            "speaks 7");
    m.reg.has_protocol_version = 0;
    REFUSED(&m.env, &COORD, "Register.protocol_version: missing");

    make_register(&m);
    m.reg.has_capabilities = 0;
    REFUSED(&m.env, &COORD, "Register.capabilities: missing");
    m.reg.has_capabilities = 1;
    m.reg.capabilities |= 0x100;
    REFUSED(&m.env, &COORD, "unknown bits 0x100");
    m.reg.capabilities = ZSHARD__CAPABILITY__CAP_FETCH_FP32;
    REFUSED(&m.env, &COORD, "offers no data-plane transport");
    m.reg.capabilities = ZSHARD__CAPABILITY__CAP_TRANSPORT_RDMA;
    REFUSED(&m.env, &COORD, "offers no fetch dtype");

    make_register(&m);
    m.reg.n_endpoints = 0;
    REFUSED(&m.env, &COORD, "Register.endpoints: none, and a server must give");
    m.reg.n_endpoints = ZS_MSG_MAX_ENDPOINTS + 1;
    for (int i = 0; i <= ZS_MSG_MAX_ENDPOINTS; i++)
        m.eps[i] = "h:1";
    REFUSED(&m.env, &COORD, "Register.endpoints: 17, more than 16");
    static const struct {
        const char *ep, *needle;
    } bad_eps[] = {
        {"localhost", "is not HOST:PORT"},
        {":7001", "has no host"},
        {"host:0", "port \"0\" is not a number in 1..65535"},
        {"host:65536", "port \"65536\""},
        {"host:", "port \"\""},
        {"host:12a", "port \"12a\""},
        {"host:+80", "port \"+80\""},
        {"::1:80", "an IPv6 host goes in brackets"},
        {"[]:80", "an IPv6 host goes in brackets"},
        {"a b:80", "has character 0x20 at 1"},
        {"", "Register.endpoints[1]: empty"},
    };
    make_register(&m);
    for (size_t i = 0; i < sizeof bad_eps / sizeof *bad_eps; i++) {
        m.eps[1] = (char *)bad_eps[i].ep;
        REFUSED(&m.env, &COORD, bad_eps[i].needle);
        REFUSED(&m.env, &COORD, "Register.endpoints[1]");
    }
    m.eps[1] = "[fe80::1]:65535";
    CHECK_OK(decode_raw(&m.env, &COORD));

    make_register(&m);
    m.reg.hostname = NULL;
    REFUSED(&m.env, &COORD, "Register.hostname: missing");
    m.reg.hostname = "";
    REFUSED(&m.env, &COORD, "Register.hostname: empty");
    char longname[300];
    memset(longname, 'a', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    m.reg.hostname = longname;
    REFUSED(&m.env, &COORD, "Register.hostname: longer than 255 bytes");
    m.reg.hostname = "tab\there";
    REFUSED(&m.env, &COORD, "Register.hostname: \"tab\there\" has character 0x09 at 3");

    make_register(&m);
    m.reg.pid = 0;
    REFUSED(&m.env, &COORD, "Register.pid: 0 is not a process id");
    m.reg.has_pid = 0;
    REFUSED(&m.env, &COORD, "Register.pid: missing");
    make_register(&m);
    m.reg.build = longname;
    REFUSED(&m.env, &COORD, "Register.build: longer than 64 bytes");

    /* Direction and sender. */
    make_register(&m);
    m.env.sender = 5;
    REFUSED(&m.env, &COORD, "Envelope.sender: 5, but Register comes from a peer not registered");
    make_register(&m);
    REFUSED(&m.env, &WORKER, "Envelope: a worker does not take Register messages");
    REFUSED(&m.env, &SERVER, "Envelope: a server does not take Register messages");
    CHECK_OK(decode_raw(&m.env, &ANY));
    CHECK_OK(decode_raw(&m.env, NULL));

    /* An invalid message is refused at the sender too. */
    m.reg.pid = 0;
    uint8_t *buf = NULL;
    size_t len = 0;
    CHECK_FAILS_WITH(zs_msg_encode(&m.env, &buf, &len), "Register.pid");
    CHECK(buf == NULL);
}

/* ---- RegisterReply ---- */

typedef struct {
    Zshard__Envelope env;
    Zshard__RegisterReply rr;
} reply_msg;

static void make_reply(reply_msg *m, uint32_t id)
{
    zs_msg_envelope_init(&m->env, 0);
    zshard__register_reply__init(&m->rr);
    static uint8_t token[ZS_TOKEN_BYTES] = {7};
    m->rr.outcome_case = ZSHARD__REGISTER_REPLY__OUTCOME_ASSIGNED_ID;
    m->rr.assigned_id = id;
    m->rr.has_data_token = 1;
    m->rr.data_token = (ProtobufCBinaryData){.len = sizeof token, .data = token};
    m->env.body_case = ZSHARD__ENVELOPE__BODY_REGISTRATION_REPLY;
    m->env.registration_reply = &m->rr;
}

static void test_register_reply(void)
{
    reply_msg m;
    make_reply(&m, 7);
    Zshard__Envelope *out;
    CHECK_OK(roundtrip(&m.env, &WORKER, &out));
    if (out) {
        CHECK_EQ_INT(out->registration_reply->outcome_case,
                     ZSHARD__REGISTER_REPLY__OUTCOME_ASSIGNED_ID);
        CHECK_EQ_INT(out->registration_reply->assigned_id, 7);
    }
    zs_msg_free(out);
    write_seed(&m.env, "register_reply", 1);

    make_reply(&m, 0);
    m.rr.outcome_case = ZSHARD__REGISTER_REPLY__OUTCOME_REFUSAL;
    m.rr.has_data_token = 0; /* a refusal carries no keys */
    m.rr.refusal = "protocol version 8, this coordinator speaks 7";
    m.rr.has_code = 1;
    m.rr.code = ZSHARD__ERROR_CODE__ERROR_PROTOCOL_VERSION;
    CHECK_OK(roundtrip(&m.env, &SERVER, &out));
    if (out) {
        CHECK(strcmp(out->registration_reply->refusal, m.rr.refusal) == 0);
        CHECK_EQ_INT(out->registration_reply->code, ZSHARD__ERROR_CODE__ERROR_PROTOCOL_VERSION);
    }
    zs_msg_free(out);
    write_seed(&m.env, "register_refusal", 1);
    m.rr.has_code = 0;
    REFUSED(&m.env, &WORKER, "RegisterReply.code: missing");
    m.rr.has_code = 1;
    m.rr.code = 99;
    REFUSED(&m.env, &WORKER, "RegisterReply.code: 99 is not an error code");
    m.rr.code = ZSHARD__ERROR_CODE__ERROR_REFUSED;
    m.rr.refusal = "";
    REFUSED(&m.env, &WORKER, "RegisterReply.refusal: empty");

    make_reply(&m, 0);
    REFUSED(&m.env, &WORKER, "RegisterReply.assigned_id: 0 is the coordinator's id");
    make_reply(&m, 3);
    m.rr.has_code = 1;
    m.rr.code = ZSHARD__ERROR_CODE__ERROR_REFUSED;
    REFUSED(&m.env, &WORKER, "RegisterReply.code: 3 given with an accepted registration");
    make_reply(&m, 3);
    m.rr.outcome_case = ZSHARD__REGISTER_REPLY__OUTCOME__NOT_SET;
    REFUSED(&m.env, &WORKER, "RegisterReply: neither assigned_id nor refusal");
    make_reply(&m, 3);
    m.env.sender = 2;
    REFUSED(&m.env, &WORKER, "Envelope.sender: 2, but RegisterReply comes from the coordinator");
    /* The data plane's keys: a token of 32 bytes with every id, a data key to servers only. */
    make_reply(&m, 3);
    m.rr.has_data_token = 0;
    REFUSED(&m.env, &WORKER, "RegisterReply.data_token: 0 bytes, expected 32");
    make_reply(&m, 3);
    m.rr.data_token.len = 16;
    REFUSED(&m.env, &WORKER, "RegisterReply.data_token: 16 bytes, expected 32");
    make_reply(&m, 3);
    REFUSED(&m.env, &SERVER, "RegisterReply.data_key: missing in a server's registration");
    uint8_t key[ZS_TOKEN_BYTES] = {9};
    m.rr.has_data_key = 1;
    m.rr.data_key = (ProtobufCBinaryData){.len = sizeof key, .data = key};
    CHECK_OK(roundtrip(&m.env, &SERVER, &out));
    if (out)
        CHECK(out->registration_reply->data_key.len == sizeof key &&
              memcmp(out->registration_reply->data_key.data, key, sizeof key) == 0);
    zs_msg_free(out);
    m.rr.data_key.len = 31;
    REFUSED(&m.env, &SERVER, "RegisterReply.data_key: 31 bytes, expected 32");
    make_reply(&m, 3);
    m.rr.outcome_case = ZSHARD__REGISTER_REPLY__OUTCOME_REFUSAL;
    m.rr.refusal = "full";
    REFUSED(&m.env, &WORKER, "RegisterReply: data keys given with a refusal");
    /* MemberGone: coordinator to servers, a member id. */
    Zshard__MemberGone mg = ZSHARD__MEMBER_GONE__INIT;
    mg.has_member = 1;
    mg.member = 5;
    mg.reason = "left";
    Zshard__Envelope ge = ZSHARD__ENVELOPE__INIT;
    ge.has_protocol_version = ge.has_sender = 1;
    ge.protocol_version = ZS_PROTOCOL_VERSION;
    ge.body_case = ZSHARD__ENVELOPE__BODY_MEMBER_GONE;
    ge.member_gone = &mg;
    CHECK_OK(roundtrip(&ge, &SERVER, &out));
    if (out)
        CHECK_EQ_INT((int)out->member_gone->member, 5);
    zs_msg_free(out);
    REFUSED(&ge, &WORKER, "a worker does not take MemberGone messages");
    mg.member = 0;
    REFUSED(&ge, &SERVER, "MemberGone.member: 0 is the coordinator's id");
    make_reply(&m, 3);
    REFUSED(&m.env, &COORD, "a coordinator does not take RegisterReply messages");
}

/* ---- JobSpec ---- */

static const char *job_json =
    "{\"seed\": 77, \"train_batch_size\": 12, \"train_micro_batch_size_per_gpu\": 3,"
    " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.002, \"betas\": [0.8, 0.95],"
    "   \"eps\": 1e-7, \"weight_decay\": 0.1}},"
    " \"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {\"warmup_num_steps\": 5,"
    "   \"total_num_steps\": 50, \"warmup_min_ratio\": 0.1, \"cos_min_ratio\": 0.01,"
    "   \"warmup_type\": \"linear\"}},"
    " \"gradient_clipping\": 0.5, \"bf16\": {\"enabled\": true}, \"steps_per_print\": 3,"
    " \"model\": {\"n_layer\": 2, \"n_head\": 2, \"n_embd\": 32, \"vocab_size\": 256,"
    "   \"block_size\": 32},"
    " \"cluster\": {\"shard_size\": 4096, \"heartbeat_interval_ms\": 100,"
    "   \"heartbeat_timeout_ms\": 900},"
    " \"elasticity\": {\"enabled\": true, \"min_workers\": 2, \"max_workers\": 5}}";

static int config_equal(const zs_config *a, const zs_config *b)
{
    return a->model.n_layer == b->model.n_layer && a->model.n_head == b->model.n_head &&
           a->model.n_embd == b->model.n_embd && a->model.vocab_size == b->model.vocab_size &&
           a->model.block_size == b->model.block_size && a->seed == b->seed &&
           a->train_batch_size == b->train_batch_size && a->micro_batch == b->micro_batch &&
           a->chunks == b->chunks && a->adamw.lr == b->adamw.lr &&
           a->adamw.beta1 == b->adamw.beta1 && a->adamw.beta2 == b->adamw.beta2 &&
           a->adamw.eps == b->adamw.eps && a->adamw.weight_decay == b->adamw.weight_decay &&
           a->sched.type == b->sched.type && a->sched.warmup_min_lr == b->sched.warmup_min_lr &&
           a->sched.warmup_max_lr == b->sched.warmup_max_lr &&
           a->sched.warmup_num_steps == b->sched.warmup_num_steps &&
           a->sched.warmup_linear == b->sched.warmup_linear &&
           a->sched.total_num_steps == b->sched.total_num_steps &&
           a->sched.warmup_min_ratio == b->sched.warmup_min_ratio &&
           a->sched.cos_min_ratio == b->sched.cos_min_ratio &&
           a->gradient_clipping == b->gradient_clipping && a->bf16 == b->bf16 &&
           a->steps_per_print == b->steps_per_print &&
           a->cluster.shard_bytes == b->cluster.shard_bytes &&
           a->cluster.heartbeat_interval_ms == b->cluster.heartbeat_interval_ms &&
           a->cluster.heartbeat_timeout_ms == b->cluster.heartbeat_timeout_ms &&
           a->elasticity.enabled == b->elasticity.enabled &&
           a->elasticity.min_workers == b->elasticity.min_workers &&
           a->elasticity.max_workers == b->elasticity.max_workers &&
           a->fp16.enabled == b->fp16.enabled &&
           (!a->fp16.enabled || (a->fp16.loss_scale == b->fp16.loss_scale &&
                                 a->fp16.initial_scale_power == b->fp16.initial_scale_power &&
                                 a->fp16.loss_scale_window == b->fp16.loss_scale_window &&
                                 a->fp16.hysteresis == b->fp16.hysteresis &&
                                 a->fp16.min_loss_scale == b->fp16.min_loss_scale &&
                                 a->fp16.consecutive_hysteresis == b->fp16.consecutive_hysteresis));
}

static int tables_equal(const zs_tensor_table *a, const zs_tensor_table *b)
{
    if (a->count != b->count || a->n_layers != b->n_layers || a->total != b->total ||
        a->n_params != b->n_params)
        return 0;
    for (int l = 0; l <= a->n_layers; l++)
        if (a->layer_begin[l] != b->layer_begin[l])
            return 0;
    for (int i = 0; i < a->count; i++) {
        const zs_tensor *x = &a->tensors[i], *y = &b->tensors[i];
        if (strcmp(x->name, y->name) != 0 || x->kind != y->kind || x->layer != y->layer ||
            x->ndim != y->ndim || x->shape[0] != y->shape[0] || x->shape[1] != y->shape[1] ||
            x->numel != y->numel || x->offset != y->offset || x->decay != y->decay)
            return 0;
    }
    return 1;
}

typedef struct {
    zs_config cfg;
    zs_tensor_table tt;
    zs_msg_job job;
    Zshard__JobSpec *js;
    Zshard__Envelope env;
} job_msg;

static int make_job(job_msg *m, const char *json)
{
    memset(m, 0, sizeof *m);
    if (zs_config_parse(json, "<test>", &m->cfg) != ZS_OK ||
        zs_tensors_gpt2(&m->cfg.model, &m->tt) != ZS_OK) {
        fprintf(stderr, "make_job: %s\n", zs_last_error());
        zs_test_failures++;
        return 0;
    }
    snprintf(m->job.data_path, sizeof m->job.data_path, "/data/tiny shakespeare.txt");
    m->job.data_fingerprint = 0xfedcba9876543210ull;
    m->job.data_ntokens = 1000000;
    m->job.steps = 50;
    zs_err r = zs_msg_jobspec_from_config(&m->cfg, &m->tt, &m->job, &m->js);
    if (r != ZS_OK) {
        fprintf(stderr, "make_job: %s\n", zs_last_error());
        zs_test_failures++;
        zs_tensors_free(&m->tt);
        return 0;
    }
    zs_msg_envelope_init(&m->env, 0);
    m->env.body_case = ZSHARD__ENVELOPE__BODY_JOB_SPEC;
    m->env.job_spec = m->js;
    return 1;
}

static void free_job(job_msg *m)
{
    zs_msg_jobspec_free(m->js);
    zs_tensors_free(&m->tt);
}

static void test_jobspec_roundtrip(const char *json)
{
    job_msg m;
    if (!make_job(&m, json))
        return;
    Zshard__Envelope *out;
    CHECK_OK(roundtrip(&m.env, &WORKER, &out));
    if (out) {
        zs_config cfg;
        zs_tensor_table tt;
        zs_msg_job job;
        CHECK_OK(zs_msg_jobspec_to_config(out->job_spec, &cfg, &tt, &job));
        CHECK(config_equal(&cfg, &m.cfg));
        CHECK(tables_equal(&tt, &m.tt));
        CHECK(strcmp(job.data_path, m.job.data_path) == 0);
        CHECK(job.data_fingerprint == m.job.data_fingerprint);
        CHECK_EQ_INT(job.data_ntokens, m.job.data_ntokens);
        CHECK_EQ_INT(job.steps, m.job.steps);
        zs_tensors_free(&tt);
    }
    zs_msg_free(out);
    free_job(&m);
}

static void test_jobspec(void)
{
    test_jobspec_roundtrip(job_json);
    /* All defaults (constant lr, no clipping block, fp32). */
    test_jobspec_roundtrip("{\"model\": {\"n_layer\": 1, \"n_head\": 1, \"n_embd\": 8,"
                           " \"vocab_size\": 16, \"block_size\": 4}}");
    test_jobspec_roundtrip("{\"train_batch_size\": 4, \"scheduler\": {\"type\": \"WarmupDecayLR\","
                           " \"params\": {\"total_num_steps\": 9, \"warmup_max_lr\": 0.01}}}");
    test_jobspec_roundtrip("{\"scheduler\": {\"type\": \"WarmupLR\"}}");
    test_jobspec_roundtrip("{\"fp16\": {\"enabled\": true, \"loss_scale\": 0.5, "
                           "\"initial_scale_power\": 9, \"loss_scale_window\": 17, \"hysteresis\": "
                           "3, \"min_loss_scale\": 0.125, \"consecutive_hysteresis\": true}}");

    job_msg m;
    if (!make_job(&m, job_json))
        return;
    Zshard__JobSpec *js = m.js;
    CHECK_OK(decode_raw(&m.env, &SERVER));
    REFUSED(&m.env, &COORD, "a coordinator does not take JobSpec messages");
    m.env.sender = 1;
    REFUSED(&m.env, &WORKER, "Envelope.sender: 1, but JobSpec comes from the coordinator");
    m.env.sender = 0;

    /* The model. */
    js->model->n_head = 7;
    REFUSED(&m.env, &WORKER, "JobSpec.model.n_embd: 32 is not a multiple of n_head 7");
    js->model->n_head = 2;
    js->model->n_layer = 0;
    REFUSED(&m.env, &WORKER, "JobSpec.model.n_layer: 0 is outside [1, 1024]");
    js->model->n_layer = 2;
    js->model->has_vocab_size = 0;
    REFUSED(&m.env, &WORKER, "JobSpec.model.vocab_size: missing");
    js->model->has_vocab_size = 1;
    Zshard__ModelConfig *model = js->model;
    js->model = NULL;
    REFUSED(&m.env, &WORKER, "JobSpec.model: missing");
    js->model = model;

    /* The tensor table. */
    Zshard__TensorEntry *t3 = js->tensors[3];
    uint64_t off = t3->offset;
    t3->offset = off + 1;
    REFUSED(&m.env, &WORKER, "JobSpec.tensors[3].offset: ");
    REFUSED(&m.env, &WORKER, "is not a multiple of 64 floats");
    t3->offset = js->tensors[2]->offset;
    REFUSED(&m.env, &WORKER, "JobSpec.tensors[3].offset: ");
    REFUSED(&m.env, &WORKER, "overlaps tensors[2]");
    t3->offset = off;
    Zshard__TensorEntry *last = js->tensors[js->n_tensors - 1];
    uint64_t last_off = last->offset;
    last->offset = js->total_floats;
    REFUSED(&m.env, &WORKER, "extends past total_floats");
    last->offset = last_off;
    js->total_floats += 1;
    REFUSED(&m.env, &WORKER, "JobSpec.total_floats: ");
    js->total_floats -= 1;
    uint64_t d0 = t3->shape[0];
    t3->shape[0] = 0;
    REFUSED(&m.env, &WORKER, "JobSpec.tensors[3].shape[0]: 0 is not a dimension");
    t3->shape[0] = d0;
    size_t nd = t3->n_shape;
    t3->n_shape = 0;
    REFUSED(&m.env, &WORKER, "JobSpec.tensors[3].shape: 0 dims, expected 1..2");
    t3->n_shape = nd;
    char *name = t3->name;
    t3->name = "transformer.h.0/ln_1";
    REFUSED(&m.env, &WORKER,
            "JobSpec.tensors[3].name: \"transformer.h.0/ln_1\" has character 0x2f");
    t3->name = "";
    REFUSED(&m.env, &WORKER, "JobSpec.tensors[3].name: empty");
    t3->name = NULL;
    REFUSED(&m.env, &WORKER, "JobSpec.tensors[3].name: missing");
    t3->name = name;
    t3->has_decay = 0;
    REFUSED(&m.env, &WORKER, "JobSpec.tensors[3].decay: missing");
    t3->has_decay = 1;
    size_t nt = js->n_tensors;
    js->n_tensors = 0;
    REFUSED(&m.env, &WORKER, "JobSpec.tensors: none");
    js->n_tensors = nt;

    /* Optimizer and schedule. */
    js->adamw->beta1 = 1.0;
    REFUSED(&m.env, &WORKER, "JobSpec.adamw.beta1: 1 is outside [0, 1)");
    js->adamw->beta1 = 0.8;
    js->adamw->lr = NAN;
    REFUSED(&m.env, &WORKER, "JobSpec.adamw.lr: nan is outside [0, 10]");
    js->adamw->lr = 0.002;
    js->adamw->has_eps = 0;
    REFUSED(&m.env, &WORKER, "JobSpec.adamw.eps: missing");
    js->adamw->has_eps = 1;
    js->schedule->type = 9;
    REFUSED(&m.env, &WORKER, "JobSpec.schedule.type: 9 is not a schedule");
    js->schedule->type = ZSHARD__SCHEDULE_TYPE__SCHEDULE_UNSPECIFIED;
    REFUSED(&m.env, &WORKER, "JobSpec.schedule.type: 0 is not a schedule");
    js->schedule->type = ZSHARD__SCHEDULE_TYPE__SCHEDULE_WARMUP_COSINE;
    js->schedule->cos_min_ratio = 1.5;
    REFUSED(&m.env, &WORKER, "JobSpec.schedule.cos_min_ratio: 1.5 is outside [0, 1]");
    js->schedule->cos_min_ratio = 0.01;
    js->gradient_clipping = INFINITY;
    REFUSED(&m.env, &WORKER, "JobSpec.gradient_clipping: inf is outside");
    js->gradient_clipping = 0.5;

    /* Batch geometry, cluster, data, steps, elasticity. */
    js->batch->chunks = 5;
    REFUSED(&m.env, &WORKER, "JobSpec.batch: train_batch_size 12 != micro_batch 3 * chunks 5");
    js->batch->chunks = 4;
    js->cluster->shard_bytes = 1000;
    REFUSED(&m.env, &WORKER, "JobSpec.cluster.shard_bytes: 1000 is not a multiple of 256");
    js->cluster->shard_bytes = 4096;
    js->cluster->heartbeat_timeout_ms = 100;
    REFUSED(&m.env, &WORKER,
            "JobSpec.cluster.heartbeat_timeout_ms: 100 must exceed "
            "heartbeat_interval_ms 100");
    js->cluster->heartbeat_timeout_ms = 900;
    char *path = js->data->path;
    js->data->path = "";
    REFUSED(&m.env, &WORKER, "JobSpec.data.path: empty");
    js->data->path = path;
    js->data->ntokens = 32;
    REFUSED(&m.env, &WORKER,
            "JobSpec.data.ntokens: 32, fewer than one sequence of block_size + 1"
            " = 33 tokens");
    js->data->ntokens = 1000000;
    js->data->has_fingerprint = 0;
    REFUSED(&m.env, &WORKER, "JobSpec.data.fingerprint: missing");
    js->data->has_fingerprint = 1;
    js->steps = 0;
    REFUSED(&m.env, &WORKER, "JobSpec.steps: 0 is outside [1, ");
    js->steps = 50;
    js->elasticity->max_workers = 1;
    REFUSED(&m.env, &WORKER, "JobSpec.elasticity.max_workers: 1 is below min_workers 2");
    js->elasticity->max_workers = 5;
    js->has_seed = 0;
    REFUSED(&m.env, &WORKER, "JobSpec.seed: missing");
    js->has_seed = 1;
    /* Checkpoints, a resume, the run's identity. */
    char *dir = js->checkpoint->dir;
    js->checkpoint->dir = "ckpt";
    REFUSED(&m.env, &WORKER, "JobSpec.checkpoint.dir: \"ckpt\" is not an absolute path");
    js->checkpoint->dir = dir;
    js->checkpoint->replicas = 2;
    REFUSED(&m.env, &WORKER, "JobSpec.checkpoint.replicas: 2 is outside [0, 1]");
    js->checkpoint->replicas = 0;
    Zshard__ResumeSpec rs = ZSHARD__RESUME_SPEC__INIT;
    rs.has_step = 1;
    rs.step = 50;
    rs.step_dir = "/ckpt/step-00000050";
    js->resume = &rs;
    REFUSED(&m.env, &WORKER, "JobSpec.resume.step: 50 is outside [1, 49]");
    rs.step = 20;
    CHECK_OK(decode_raw(&m.env, &WORKER));
    js->resume = NULL;
    js->has_run_id = 0;
    REFUSED(&m.env, &WORKER, "JobSpec.run_id: missing");
    js->has_run_id = 1;
    js->cluster->coordinator_timeout_ms = js->cluster->heartbeat_interval_ms;
    REFUSED(&m.env, &WORKER, "JobSpec.cluster.coordinator_timeout_ms");
    js->cluster->coordinator_timeout_ms = 15000;
    CHECK_OK(decode_raw(&m.env, &WORKER));
    write_seed(&m.env, "job_spec", 1);

    /* A table that validates but is not this build's layout. */
    zs_config cfg;
    zs_tensor_table tt;
    t3->decay = !t3->decay;
    CHECK_FAILS_WITH(zs_msg_jobspec_to_config(js, &cfg, &tt, NULL), "JobSpec.tensors[3].decay");
    t3->decay = !t3->decay;
    uint64_t s0 = js->tensors[0]->shape[0], s1 = js->tensors[0]->shape[1];
    js->tensors[0]->shape[0] = s1;
    js->tensors[0]->shape[1] = s0;
    CHECK_FAILS_WITH(zs_msg_jobspec_to_config(js, &cfg, &tt, NULL), "JobSpec.tensors[0].shape");
    js->tensors[0]->shape[0] = s0;
    js->tensors[0]->shape[1] = s1;
    t3->name = "transformer.h.0.other";
    CHECK_FAILS_WITH(zs_msg_jobspec_to_config(js, &cfg, &tt, NULL),
                     "JobSpec.tensors[3].name: \"transformer.h.0.other\", this build has");
    t3->name = name;
    js->total_floats += 64;
    last->offset += 64;
    CHECK_FAILS_WITH(zs_msg_jobspec_to_config(js, &cfg, &tt, NULL),
                     "this build lays transformer.ln_f.bias out at");
    last->offset -= 64;
    CHECK_FAILS_WITH(zs_msg_jobspec_to_config(js, &cfg, &tt, NULL), "JobSpec.total_floats");
    js->total_floats -= 64;
    js->n_tensors--;
    CHECK_FAILS_WITH(zs_msg_jobspec_to_config(js, &cfg, &tt, NULL),
                     "entries, but this build lays the model out in");
    js->n_tensors++;
    CHECK_OK(zs_msg_jobspec_to_config(js, &cfg, &tt, NULL));
    zs_tensors_free(&tt);

    /* A config the message cannot carry is refused when building. */
    Zshard__JobSpec *bad = NULL;
    m.job.steps = 0;
    CHECK_FAILS_WITH(zs_msg_jobspec_from_config(&m.cfg, &m.tt, &m.job, &bad),
                     "building a job spec: JobSpec.steps");
    CHECK(bad == NULL);
    free_job(&m);
}

/* ---- ShardMap ---- */

static const char *const endpoints3[] = {"10.0.0.1:7001", "10.0.0.2:7001", "10.0.0.3:7001"};

typedef struct {
    zs_shardmap map;
    Zshard__ShardMap *sm;
    Zshard__Envelope env;
} map_msg;

static int make_map(map_msg *m, size_t total, size_t shard_bytes, int S)
{
    memset(m, 0, sizeof *m);
    static const uint32_t ids[] = {11, 12, 13};
    if (zs_shardmap_build(total, shard_bytes, S, ids, &m->map) != ZS_OK ||
        zs_shardmap_to_msg(&m->map, endpoints3, &m->sm) != ZS_OK) {
        fprintf(stderr, "make_map: %s\n", zs_last_error());
        zs_test_failures++;
        zs_shardmap_free(&m->map);
        return 0;
    }
    zs_msg_envelope_init(&m->env, 0);
    m->env.body_case = ZSHARD__ENVELOPE__BODY_SHARD_MAP;
    m->env.shard_map = m->sm;
    return 1;
}

static void free_map(map_msg *m)
{
    zshard__shard_map__free_unpacked(m->sm, NULL);
    zs_shardmap_free(&m->map);
}

static void test_shard_map(void)
{
    map_msg m;
    /* 7 shards of 1024 floats, the last of 200; 3 servers. */
    if (!make_map(&m, 6 * 1024 + 200, 4096, 3))
        return;
    Zshard__ShardMap *sm = m.sm;
    Zshard__Envelope *out;
    CHECK_OK(roundtrip(&m.env, &SERVER, &out));
    if (out) {
        zs_shardmap back;
        CHECK_OK(zs_shardmap_from_msg(out->shard_map, &back));
        CHECK_EQ_INT(back.n_shards, 7);
        CHECK_EQ_INT(back.n_servers, 3);
        CHECK_EQ_INT(back.total, m.map.total);
        for (int i = 0; i < back.n_shards && i < m.map.n_shards; i++) {
            CHECK_EQ_INT(back.shards[i].begin, m.map.shards[i].begin);
            CHECK_EQ_INT(back.shards[i].end, m.map.shards[i].end);
            CHECK_EQ_INT(back.shards[i].server, m.map.shards[i].server);
        }
        CHECK_EQ_INT(back.server_ids[2], 13);
        CHECK(strcmp(out->shard_map->servers[1]->endpoint, "10.0.0.2:7001") == 0);
        zs_shardmap_free(&back);
    }
    zs_msg_free(out);
    write_seed(&m.env, "shard_map", 1);
    REFUSED(&m.env, &COORD, "a coordinator does not take ShardMap messages");

    Zshard__Shard *s2 = sm->shards[2], *s3 = sm->shards[3];
    s2->index = 3;
    REFUSED(&m.env, &WORKER, "ShardMap.shards[2].index: 3, expected 2: shards must be sorted");
    s2->index = 2;
    s3->begin += 64;
    REFUSED(&m.env, &WORKER,
            "ShardMap.shards[3].begin: 3136, expected 3072 (the end of "
            "shards[2]): shards must be contiguous");
    s3->begin -= 64;
    sm->shards[0]->begin = 64;
    REFUSED(&m.env, &WORKER, "ShardMap.shards[0].begin: 64, expected 0: shards must cover");
    sm->shards[0]->begin = 0;
    s2->end = s2->begin;
    REFUSED(&m.env, &WORKER, "ShardMap.shards[2]: empty range [2048, 2048)");
    s2->end = s2->begin + 512;
    REFUSED(&m.env, &WORKER,
            "ShardMap.shards[2]: 512 floats, expected shard_floats 1024 (only "
            "the last shard may be shorter)");
    s2->end = s2->begin + 1024;
    Zshard__Shard *s6 = sm->shards[6];
    s6->end -= 8;
    REFUSED(&m.env, &WORKER, "ShardMap.shards: cover [0, 6336), expected [0, total_floats 6344)");
    s6->end += 16;
    REFUSED(&m.env, &WORKER, "ShardMap.shards[6].end: 6352 is past total_floats 6344");
    s6->end -= 8;
    sm->n_shards = 6;
    REFUSED(&m.env, &WORKER, "ShardMap.shards: cover [0, 6144), expected [0, total_floats 6344)");
    sm->n_shards = 7;
    s2->has_begin = 0;
    REFUSED(&m.env, &WORKER, "ShardMap.shards[2].begin: missing");
    s2->has_begin = 1;
    s2->server = 99;
    REFUSED(&m.env, &WORKER, "ShardMap.shards[2].server: 99 is not in ShardMap.servers");
    s2->server = 13;
    sm->servers[2]->id = 11;
    REFUSED(&m.env, &WORKER, "ShardMap.servers[2].id: 11 is also servers[0]'s");
    sm->servers[2]->id = 0;
    REFUSED(&m.env, &WORKER, "ShardMap.servers[2].id: 0 is the coordinator's id");
    sm->servers[2]->id = 14; /* shards still name 13 */
    REFUSED(&m.env, &WORKER, "ShardMap.shards[2].server: 13 is not in ShardMap.servers");
    for (size_t i = 0; i < sm->n_shards; i++)
        if (sm->shards[i]->server == 13)
            sm->shards[i]->server = 12;
    REFUSED(&m.env, &WORKER, "ShardMap.servers[2]: server 14 holds no shard");
    for (size_t i = 0; i < sm->n_shards; i++)
        if (sm->shards[i]->index % 3 == 2)
            sm->shards[i]->server = 14;
    CHECK_OK(decode_raw(&m.env, &WORKER));
    char *ep = sm->servers[1]->endpoint;
    sm->servers[1]->endpoint = "10.0.0.2";
    REFUSED(&m.env, &WORKER, "ShardMap.servers[1].endpoint: \"10.0.0.2\" is not HOST:PORT");
    sm->servers[1]->endpoint = ep;
    sm->shard_floats = 1000;
    REFUSED(&m.env, &WORKER, "ShardMap.shard_floats: 1000 is not a multiple of 64");
    sm->shard_floats = 1024;
    size_t ns = sm->n_servers;
    sm->n_servers = 0;
    REFUSED(&m.env, &WORKER, "ShardMap.servers: none");
    sm->n_servers = ns;
    sm->has_total_floats = 0;
    REFUSED(&m.env, &WORKER, "ShardMap.total_floats: missing");
    sm->has_total_floats = 1;
    CHECK_OK(decode_raw(&m.env, &WORKER));

    /* The receiver takes the coordinator's assignment as it is. */
    zs_shardmap back;
    CHECK_OK(zs_shardmap_from_msg(sm, &back));
    CHECK_EQ_INT(back.shards[2].server, 2);
    CHECK_EQ_INT(back.server_ids[2], 14);
    zs_shardmap_free(&back);
    sm->n_shards = 0;
    CHECK_FAILS_WITH(zs_shardmap_from_msg(sm, &back), "ShardMap.shards: none");
    sm->n_shards = 7;
    free_map(&m);
}

/* ---- the small bodies ---- */

typedef struct {
    Zshard__Envelope env;
    Zshard__Heartbeat hb;
    Zshard__HeartbeatStats st;
} hb_msg;

static void make_heartbeat(hb_msg *m)
{
    zs_msg_envelope_init(&m->env, 4);
    zshard__heartbeat__init(&m->hb);
    zshard__heartbeat_stats__init(&m->st);
    m->hb.has_sender = m->hb.has_step = 1;
    m->hb.sender = 4;
    m->hb.step = 17;
    m->st.has_bytes_sent = m->st.has_busy_seconds = m->st.has_rss_bytes = 1;
    m->st.bytes_sent = 1ull << 40;
    m->st.busy_seconds = 0.25;
    m->st.rss_bytes = 123456789;
    m->hb.stats = &m->st;
    m->env.body_case = ZSHARD__ENVELOPE__BODY_HEARTBEAT;
    m->env.heartbeat = &m->hb;
}

static void test_heartbeat_ready(void)
{
    hb_msg m;
    make_heartbeat(&m);
    Zshard__Envelope *out;
    CHECK_OK(roundtrip(&m.env, &COORD, &out));
    if (out) {
        CHECK_EQ_INT(out->sender, 4);
        CHECK_EQ_INT(out->heartbeat->step, 17);
        CHECK(out->heartbeat->stats && out->heartbeat->stats->bytes_sent == 1ull << 40);
        CHECK(out->heartbeat->stats && out->heartbeat->stats->busy_seconds == 0.25);
        CHECK(out->heartbeat->stats && !out->heartbeat->stats->has_fetches);
    }
    zs_msg_free(out);
    write_seed(&m.env, "heartbeat", 1);
    m.hb.stats = NULL; /* stats are optional */
    CHECK_OK(decode_raw(&m.env, &COORD));
    m.hb.stats = &m.st;
    m.st.busy_seconds = -1;
    REFUSED(&m.env, &COORD, "Heartbeat.stats.busy_seconds: -1 is not a finite time >= 0");
    m.st.busy_seconds = NAN;
    REFUSED(&m.env, &COORD, "Heartbeat.stats.busy_seconds: nan");
    make_heartbeat(&m);
    m.hb.sender = 5;
    REFUSED(&m.env, &COORD, "Heartbeat.sender: 5, but the envelope's sender is 4");
    m.hb.sender = 0;
    REFUSED(&m.env, &COORD, "Heartbeat.sender: 0 is the coordinator's id");
    make_heartbeat(&m);
    m.env.sender = 0;
    m.hb.sender = 0;
    REFUSED(&m.env, &COORD, "Heartbeat.sender: 0");
    m.hb.sender = 4;
    REFUSED(&m.env, &COORD, "Heartbeat.sender: 4, but the envelope's sender is 0");
    make_heartbeat(&m);
    m.hb.has_step = 0;
    REFUSED(&m.env, &COORD, "Heartbeat.step: missing");
    make_heartbeat(&m);
    REFUSED(&m.env, &WORKER,
            "Heartbeat.sender: 4: a worker takes heartbeats only from the "
            "coordinator");
    REFUSED(&m.env, &SERVER,
            "Heartbeat.sender: 4: a server takes heartbeats only from the "
            "coordinator");
    /* The coordinator's own heartbeat (sender 0), which members use to tell it lives. */
    m.env.sender = 0;
    m.hb.sender = 0;
    CHECK_OK(decode_raw(&m.env, &WORKER));
    CHECK_OK(decode_raw(&m.env, &SERVER));

    Zshard__Envelope env;
    Zshard__Ready rd;
    Zshard__DataCheck dc;
    zs_msg_envelope_init(&env, 9);
    zshard__ready__init(&rd);
    zshard__data_check__init(&dc);
    dc.has_fingerprint = dc.has_ntokens = 1;
    dc.fingerprint = 0x0123456789abcdefull;
    dc.ntokens = 4096;
    rd.what_case = ZSHARD__READY__WHAT_DATA;
    rd.data = &dc;
    env.body_case = ZSHARD__ENVELOPE__BODY_READY;
    env.ready = &rd;
    CHECK_OK(roundtrip(&env, &COORD, &out));
    if (out) {
        CHECK_EQ_INT(out->ready->what_case, ZSHARD__READY__WHAT_DATA);
        CHECK(out->ready->data->fingerprint == 0x0123456789abcdefull);
        CHECK_EQ_INT(out->ready->data->ntokens, 4096);
    }
    zs_msg_free(out);
    write_seed(&env, "ready_worker", 1);
    dc.has_ntokens = 0;
    REFUSED(&env, &COORD, "Ready.data.ntokens: missing");
    rd.what_case = ZSHARD__READY__WHAT_VERSION;
    rd.version = 0;
    CHECK_OK(roundtrip(&env, &COORD, &out));
    if (out) {
        CHECK_EQ_INT(out->ready->what_case, ZSHARD__READY__WHAT_VERSION);
        CHECK_EQ_INT(out->ready->version, 0);
    }
    zs_msg_free(out);
    write_seed(&env, "ready_server", 1);
    rd.what_case = ZSHARD__READY__WHAT__NOT_SET;
    REFUSED(&env, &COORD, "Ready: neither data nor version");
}

typedef struct {
    Zshard__Envelope env;
    Zshard__StepAssign sa;
    uint32_t chunks[8];
} step_msg;

static void make_step(step_msg *m)
{
    zs_msg_envelope_init(&m->env, 0);
    zshard__step_assign__init(&m->sa);
    m->sa.has_step = m->sa.has_worker = m->sa.has_lr = 1;
    m->sa.step = 12;
    m->sa.worker = 3;
    m->sa.lr = 3e-4;
    m->chunks[0] = 0;
    m->chunks[1] = 2;
    m->chunks[2] = 3;
    m->sa.n_chunks = 3;
    m->sa.chunks = m->chunks;
    m->env.body_case = ZSHARD__ENVELOPE__BODY_STEP_ASSIGN;
    m->env.step_assign = &m->sa;
}

static void test_step_assign_chunk_done(void)
{
    step_msg m;
    make_step(&m);
    Zshard__Envelope *out;
    CHECK_OK(roundtrip(&m.env, &WORKER, &out));
    if (out) {
        const Zshard__StepAssign *sa = out->step_assign;
        CHECK_EQ_INT(sa->step, 12);
        CHECK_EQ_INT(sa->worker, 3);
        CHECK_EQ_INT(sa->n_chunks, 3);
        CHECK_EQ_INT(sa->chunks[2], 3);
        CHECK(sa->lr == 3e-4);
    }
    zs_msg_free(out);
    CHECK_OK(decode_raw(&m.env, &SERVER));
    write_seed(&m.env, "step_assign", 1);
    m.chunks[2] = 4;
    REFUSED(&m.env, &WORKER, "StepAssign.chunks[2]: 4, a step has chunks 0..3");
    CHECK_OK(decode_raw(&m.env, &ANY)); /* the job's C unknown: only the structure */
    m.chunks[2] = 2;
    REFUSED(&m.env, &WORKER,
            "StepAssign.chunks[2]: 2 after 2: chunk indices must be unique and "
            "ascending");
    m.chunks[2] = 1;
    REFUSED(&m.env, &WORKER, "StepAssign.chunks[2]: 1 after 2");
    make_step(&m);
    m.sa.n_chunks = 0;
    REFUSED(&m.env, &WORKER, "StepAssign.chunks: none");
    m.sa.n_chunks = 5;
    m.chunks[3] = 4;
    m.chunks[4] = 5;
    REFUSED(&m.env, &WORKER, "StepAssign.chunks: 5, more than the 4 chunks of a step");
    make_step(&m);
    m.sa.lr = NAN;
    REFUSED(&m.env, &WORKER, "StepAssign.lr: nan is outside [0, 10]");
    m.sa.lr = -1e-3;
    REFUSED(&m.env, &WORKER, "StepAssign.lr: -0.001 is outside [0, 10]");
    make_step(&m);
    m.sa.has_loss_scale = 1; /* fp16 */
    m.sa.loss_scale = 0x1p-3;
    CHECK_OK(decode_raw(&m.env, &WORKER));
    m.sa.loss_scale = 1e30;
    REFUSED(&m.env, &WORKER, "StepAssign.loss_scale: 1e+30 is not a power of two");
    make_step(&m);
    m.sa.step = 100;
    REFUSED(&m.env, &WORKER, "StepAssign.step: 100, the job has 100 steps (0..99)");
    m.sa.has_step = 0;
    REFUSED(&m.env, &WORKER, "StepAssign.step: missing");
    make_step(&m);
    m.sa.worker = 0;
    REFUSED(&m.env, &WORKER, "StepAssign.worker: 0 is the coordinator's id");
    make_step(&m);
    m.env.sender = 3;
    REFUSED(&m.env, &WORKER, "Envelope.sender: 3, but StepAssign comes from the coordinator");

    Zshard__Envelope env;
    Zshard__ChunkDone cd;
    zs_msg_envelope_init(&env, 3);
    zshard__chunk_done__init(&cd);
    cd.has_step = cd.has_chunk = cd.has_worker = cd.has_loss = 1;
    cd.step = 12;
    cd.chunk = 2;
    cd.worker = 3;
    cd.loss = 5.25;
    env.body_case = ZSHARD__ENVELOPE__BODY_CHUNK_DONE;
    env.chunk_done = &cd;
    CHECK_OK(roundtrip(&env, &COORD, &out));
    if (out) {
        CHECK_EQ_INT(out->chunk_done->chunk, 2);
        CHECK(out->chunk_done->loss == 5.25);
    }
    zs_msg_free(out);
    write_seed(&env, "chunk_done", 1);
    cd.loss = NAN; /* divergence is news, not a malformed message */
    CHECK_OK(decode_raw(&env, &COORD));
    cd.has_loss = 0;
    REFUSED(&env, &COORD, "ChunkDone.loss: missing");
    cd.has_loss = 1;
    cd.chunk = 4;
    REFUSED(&env, &COORD, "ChunkDone.chunk: 4, a step has chunks 0..3");
    cd.chunk = 2;
    cd.worker = 8;
    REFUSED(&env, &COORD, "ChunkDone.worker: 8, but the envelope's sender is 3");
    cd.worker = 3;
    cd.has_compute_ms = cd.has_fetch_wait_ms = cd.has_push_wait_ms = 1;
    cd.compute_ms = 812.5;
    cd.fetch_wait_ms = 0;
    cd.push_wait_ms = 3.25;
    CHECK_OK(roundtrip(&env, &COORD, &out));
    if (out)
        CHECK(out->chunk_done->has_push_wait_ms && out->chunk_done->push_wait_ms == 3.25);
    zs_msg_free(out);
    cd.fetch_wait_ms = -1;
    REFUSED(&env, &COORD, "ChunkDone.fetch_wait_ms: -1 is outside [0, 1e+09]");
    cd.fetch_wait_ms = 0;
    cd.compute_ms = NAN;
    REFUSED(&env, &COORD, "ChunkDone.compute_ms: nan is outside [0, 1e+09]");
    cd.compute_ms = 1;
    cd.push_wait_ms = 2e9;
    REFUSED(&env, &COORD, "ChunkDone.push_wait_ms: 2e+09 is outside [0, 1e+09]");
    cd.has_compute_ms = cd.has_fetch_wait_ms = cd.has_push_wait_ms = 0;
    cd.step = 1000;
    REFUSED(&env, &COORD, "ChunkDone.step: 1000, the job has 100 steps");
    REFUSED(&env, &SERVER, "a server does not take ChunkDone messages");
}

typedef struct {
    Zshard__Envelope env;
    Zshard__GradNormPartial gp;
    Zshard__ShardSumsq ss[3];
    Zshard__ShardSumsq *pp[3];
} gnp_msg;

static void make_gnp(gnp_msg *m)
{
    zs_msg_envelope_init(&m->env, 2);
    zshard__grad_norm_partial__init(&m->gp);
    m->gp.has_step = m->gp.has_server = m->gp.has_has_nonfinite = 1;
    m->gp.step = 12;
    m->gp.server = 2;
    m->gp.has_nonfinite = 0;
    const uint32_t shards[3] = {1, 4, 7};
    for (int i = 0; i < 3; i++) {
        zshard__shard_sumsq__init(&m->ss[i]);
        m->ss[i].has_shard = m->ss[i].has_sumsq = 1;
        m->ss[i].shard = shards[i];
        m->ss[i].sumsq = 0.5 * (i + 1);
        m->pp[i] = &m->ss[i];
    }
    m->gp.n_partials = 3;
    m->gp.partials = m->pp;
    m->env.body_case = ZSHARD__ENVELOPE__BODY_GRAD_NORM_PARTIAL;
    m->env.grad_norm_partial = &m->gp;
}

static void test_grad_norm_clip(void)
{
    gnp_msg m;
    make_gnp(&m);
    Zshard__Envelope *out;
    CHECK_OK(roundtrip(&m.env, &COORD, &out));
    if (out) {
        const Zshard__GradNormPartial *gp = out->grad_norm_partial;
        CHECK_EQ_INT(gp->n_partials, 3);
        CHECK_EQ_INT(gp->partials[1]->shard, 4);
        CHECK(gp->partials[2]->sumsq == 1.5);
        CHECK(!gp->has_nonfinite);
    }
    zs_msg_free(out);
    write_seed(&m.env, "grad_norm_partial", 1);
    m.ss[2].shard = 8;
    REFUSED(&m.env, &COORD, "GradNormPartial.partials[2].shard: 8, the map has shards 0..7");
    m.ss[2].shard = 4;
    REFUSED(&m.env, &COORD, "GradNormPartial.partials[2].shard: 4 after 4: shards must be unique");
    m.ss[2].shard = 7;
    m.ss[1].sumsq = -0.5;
    REFUSED(&m.env, &COORD, "GradNormPartial.partials[1].sumsq: -0.5 is negative");
    m.ss[1].sumsq = INFINITY;
    REFUSED(&m.env, &COORD,
            "GradNormPartial.partials[1].sumsq: inf is not finite, but "
            "has_nonfinite is false");
    m.gp.has_nonfinite = 1;
    CHECK_OK(decode_raw(&m.env, &COORD));
    m.ss[1].sumsq = NAN;
    CHECK_OK(decode_raw(&m.env, &COORD));
    m.ss[1].sumsq = -1;
    REFUSED(&m.env, &COORD, "is negative");
    make_gnp(&m);
    m.gp.n_partials = 0;
    REFUSED(&m.env, &COORD, "GradNormPartial.partials: none");
    make_gnp(&m);
    m.gp.has_has_nonfinite = 0;
    REFUSED(&m.env, &COORD, "GradNormPartial.has_nonfinite: missing");
    make_gnp(&m);
    m.ss[0].has_sumsq = 0;
    REFUSED(&m.env, &COORD, "GradNormPartial.partials[0].sumsq: missing");
    make_gnp(&m);
    m.gp.server = 3;
    REFUSED(&m.env, &COORD, "GradNormPartial.server: 3, but the envelope's sender is 2");

    Zshard__Envelope env;
    Zshard__ClipVerdict cv;
    zs_msg_envelope_init(&env, 0);
    zshard__clip_verdict__init(&cv);
    cv.has_step = cv.has_clip_factor = cv.has_skip = cv.has_grad_norm = 1;
    cv.step = 12;
    cv.clip_factor = 0.25;
    cv.skip = 0;
    cv.grad_norm = 4.0;
    env.body_case = ZSHARD__ENVELOPE__BODY_CLIP_VERDICT;
    env.clip_verdict = &cv;
    CHECK_OK(roundtrip(&env, &SERVER, &out));
    if (out) {
        CHECK(out->clip_verdict->clip_factor == 0.25);
        CHECK(out->clip_verdict->grad_norm == 4.0);
        CHECK(!out->clip_verdict->skip);
    }
    zs_msg_free(out);
    write_seed(&env, "clip_verdict", 1);
    REFUSED(&env, &WORKER, "a worker does not take ClipVerdict messages");
    cv.clip_factor = 1.0;
    CHECK_OK(decode_raw(&env, &SERVER));
    cv.clip_factor = 0;
    REFUSED(&env, &SERVER, "ClipVerdict.clip_factor: 0 is outside (0, 1]");
    cv.clip_factor = 1.5;
    REFUSED(&env, &SERVER, "ClipVerdict.clip_factor: 1.5 is outside (0, 1]");
    cv.clip_factor = NAN;
    REFUSED(&env, &SERVER, "ClipVerdict.clip_factor: nan is outside (0, 1]");
    cv.clip_factor = 1;
    cv.grad_norm = INFINITY;
    REFUSED(&env, &SERVER, "ClipVerdict.grad_norm: inf is not finite, but skip is false");
    cv.skip = 1;
    CHECK_OK(decode_raw(&env, &SERVER));
    cv.grad_norm = -2;
    REFUSED(&env, &SERVER, "ClipVerdict.grad_norm: -2 is negative");
    cv.grad_norm = 1;
    cv.has_skip = 0;
    REFUSED(&env, &SERVER, "ClipVerdict.skip: missing");
    cv.has_skip = 1;
    cv.has_clip_factor = 0;
    REFUSED(&env, &SERVER, "ClipVerdict.clip_factor: missing");
    cv.has_clip_factor = 1;
    /* fp16: the loss scale and the optimizer step, together. */
    cv.has_loss_scale = cv.has_optimizer_step = 1;
    cv.loss_scale = 65536;
    cv.optimizer_step = 9;
    CHECK_OK(roundtrip(&env, &SERVER, &out));
    if (out)
        CHECK(out->clip_verdict->loss_scale == 65536 && out->clip_verdict->optimizer_step == 9);
    zs_msg_free(out);
    cv.loss_scale = 3;
    REFUSED(&env, &SERVER, "ClipVerdict.loss_scale: 3 is not a power of two");
    cv.loss_scale = 0;
    REFUSED(&env, &SERVER, "ClipVerdict.loss_scale: 0 is not a power of two");
    cv.loss_scale = 2;
    cv.optimizer_step = 13;
    REFUSED(&env, &SERVER, "ClipVerdict.optimizer_step: 13 is after step 12");
    cv.optimizer_step = 12;
    cv.has_optimizer_step = 0;
    REFUSED(&env, &SERVER, "ClipVerdict: loss_scale and optimizer_step come together");
}

static void test_version_error_shutdown(void)
{
    Zshard__Envelope env, *out;
    Zshard__VersionPublished vp;
    zs_msg_envelope_init(&env, 2);
    zshard__version_published__init(&vp);
    vp.has_server = vp.has_version = 1;
    vp.server = 2;
    vp.version = 13;
    env.body_case = ZSHARD__ENVELOPE__BODY_VERSION_PUBLISHED;
    env.version_published = &vp;
    CHECK_OK(roundtrip(&env, &COORD, &out));
    if (out)
        CHECK_EQ_INT(out->version_published->version, 13);
    zs_msg_free(out);
    write_seed(&env, "version_published", 1);
    vp.version = 100; /* the final version of a 100-step job */
    CHECK_OK(decode_raw(&env, &COORD));
    vp.version = 101;
    REFUSED(&env, &COORD, "VersionPublished.version: 101, the job has versions 0..100");
    vp.version = 1;
    vp.server = 1;
    REFUSED(&env, &COORD, "VersionPublished.server: 1, but the envelope's sender is 2");
    vp.server = 2;
    vp.has_version = 0;
    REFUSED(&env, &COORD, "VersionPublished.version: missing");

    Zshard__Error er;
    zs_msg_envelope_init(&env, 0);
    zshard__error__init(&er);
    er.has_code = 1;
    er.code = ZSHARD__ERROR_CODE__ERROR_DATA_MISMATCH;
    er.text = "data fingerprint 0x1234, the coordinator's is 0x5678";
    env.body_case = ZSHARD__ENVELOPE__BODY_ERROR;
    env.error = &er;
    CHECK_OK(roundtrip(&env, &WORKER, &out));
    if (out) {
        CHECK_EQ_INT(out->error->code, ZSHARD__ERROR_CODE__ERROR_DATA_MISMATCH);
        CHECK(strcmp(out->error->text, er.text) == 0);
    }
    zs_msg_free(out);
    write_seed(&env, "error", 1);
    env.sender = 6; /* from a peer, to the coordinator */
    CHECK_OK(decode_raw(&env, &COORD));
    er.code = ZSHARD__ERROR_CODE__ERROR_UNSPECIFIED;
    REFUSED(&env, &COORD, "Error.code: 0 is not an error code");
    er.code = 99;
    REFUSED(&env, &COORD, "Error.code: 99 is not an error code");
    er.code = ZSHARD__ERROR_CODE__ERROR_INTERNAL;
    er.text = "";
    REFUSED(&env, &COORD, "Error.text: empty");
    er.text = NULL;
    REFUSED(&env, &COORD, "Error.text: missing");
    /* An error text near the string limit makes the envelope bigger than a small body may be. */
    char *big = malloc(ZS_MSG_MAX_STRING + 2);
    memset(big, 'x', ZS_MSG_MAX_STRING + 1);
    big[ZS_MSG_MAX_STRING + 1] = '\0';
    er.text = big;
    REFUSED(&env, &COORD, "Error.text: string of 4097 bytes, more than 4096");
    CHECK_FAILS_WITH(zs_msg_check_error(&er, NULL), "Error.text: longer than 4096 bytes");
    free(big);

    Zshard__Shutdown sd;
    zs_msg_envelope_init(&env, 0);
    zshard__shutdown__init(&sd);
    sd.has_kind = 1;
    sd.kind = ZSHARD__SHUTDOWN_KIND__SHUTDOWN_DONE;
    sd.reason = "";
    env.body_case = ZSHARD__ENVELOPE__BODY_SHUTDOWN;
    env.shutdown = &sd;
    CHECK_OK(roundtrip(&env, &SERVER, &out));
    if (out)
        CHECK_EQ_INT(out->shutdown->kind, ZSHARD__SHUTDOWN_KIND__SHUTDOWN_DONE);
    zs_msg_free(out);
    write_seed(&env, "shutdown", 1);
    sd.kind = ZSHARD__SHUTDOWN_KIND__SHUTDOWN_LEAVING;
    REFUSED(&env, &SERVER,
            "Shutdown.kind: 3 from sender 0: peers send LEAVING, the coordinator "
            "DONE or ABORT");
    env.sender = 5;
    sd.reason = "SIGTERM";
    CHECK_OK(decode_raw(&env, &COORD));
    sd.kind = ZSHARD__SHUTDOWN_KIND__SHUTDOWN_ABORT;
    REFUSED(&env, &COORD, "Shutdown.kind: 2 from sender 5");
    sd.kind = 0;
    REFUSED(&env, &COORD, "Shutdown.kind: 0 is not a shutdown kind");
    sd.has_kind = 0;
    REFUSED(&env, &COORD, "Shutdown.kind: missing");
    sd.has_kind = 1;
    sd.kind = ZSHARD__SHUTDOWN_KIND__SHUTDOWN_LEAVING;
    sd.reason = NULL;
    REFUSED(&env, &COORD, "Shutdown.reason: missing");

    /* StatusRequest: from anyone, registered or not; StatusReply to the asker. */
    Zshard__StatusRequest sq;
    zs_msg_envelope_init(&env, 0);
    zshard__status_request__init(&sq);
    env.body_case = ZSHARD__ENVELOPE__BODY_STATUS_REQUEST;
    env.status_request = &sq;
    CHECK_OK(roundtrip(&env, &COORD, &out));
    zs_msg_free(out);
    write_seed(&env, "status_request", 1);
    env.sender = 7;
    CHECK_OK(decode_raw(&env, &COORD));
    REFUSED(&env, &SERVER, "a server does not take StatusRequest messages");

    Zshard__StatusReply sr;
    Zshard__MemberStatus m[2], *mp[2] = {&m[0], &m[1]};
    zs_msg_envelope_init(&env, 0);
    zshard__status_reply__init(&sr);
    sr.has_steps_done = sr.has_steps = 1;
    sr.steps_done = 3;
    sr.steps = 10;
    sr.phase = "computing";
    sr.n_members = 2;
    sr.members = mp;
    for (int i = 0; i < 2; i++) {
        zshard__member_status__init(&m[i]);
        m[i].has_id = m[i].has_role = m[i].has_state = 1;
        m[i].id = (uint32_t)(i + 1);
        m[i].role = i ? ZSHARD__ROLE__ROLE_WORKER : ZSHARD__ROLE__ROLE_SERVER;
        m[i].state = ZSHARD__MEMBER_STATE__MEMBER_ACTIVE;
    }
    m[1].has_tokens_per_sec = 1;
    m[1].tokens_per_sec = 1234.5;
    env.body_case = ZSHARD__ENVELOPE__BODY_STATUS_REPLY;
    env.status_reply = &sr;
    CHECK_OK(roundtrip(&env, &WORKER, &out));
    if (out)
        CHECK(out->status_reply->n_members == 2 &&
              out->status_reply->members[1]->tokens_per_sec == 1234.5);
    zs_msg_free(out);
    write_seed(&env, "status_reply", 1);
    REFUSED(&env, &COORD, "a coordinator does not take StatusReply messages");
    sr.steps_done = 11;
    REFUSED(&env, &WORKER, "StatusReply.steps_done: 11 of 10 steps");
    sr.steps_done = 3;
    sr.phase = NULL;
    REFUSED(&env, &WORKER, "StatusReply.phase: missing");
    sr.phase = "computing";
    m[1].state = 9;
    REFUSED(&env, &WORKER, "StatusReply.members[1].state: missing or not a state");
    m[1].state = ZSHARD__MEMBER_STATE__MEMBER_GONE;
    m[1].tokens_per_sec = -1;
    REFUSED(&env, &WORKER, "StatusReply.members[1].tokens_per_sec: -1");
    m[1].tokens_per_sec = 0;
    /* replica_of: a server's, naming another server; replica_current only with it. */
    m[0].has_replica_of = m[0].has_replica_current = 1;
    m[0].replica_of = 3;
    m[0].replica_current = 1;
    CHECK_OK(roundtrip(&env, &WORKER, &out));
    if (out)
        CHECK(out->status_reply->members[0]->has_replica_of &&
              out->status_reply->members[0]->replica_of == 3 &&
              out->status_reply->members[0]->replica_current);
    zs_msg_free(out);
    m[0].replica_of = 1;
    REFUSED(&env, &WORKER, "StatusReply.members[0].replica_of: 1 (a server holds another");
    m[0].replica_of = 0;
    REFUSED(&env, &WORKER, "StatusReply.members[0].replica_of: 0");
    m[0].has_replica_of = m[0].has_replica_current = 0;
    m[1].has_replica_of = 1;
    m[1].replica_of = 1;
    REFUSED(&env, &WORKER, "StatusReply.members[1].replica_of: 1");
    m[1].has_replica_of = 0;
    m[1].has_replica_current = 1;
    REFUSED(&env, &WORKER, "StatusReply.members[1].replica_current without replica_of");
    m[1].has_replica_current = 0;
    m[0].has_id = 0;
    REFUSED(&env, &WORKER, "StatusReply.members[].id: missing");
}

/* ---- the envelope and the wire ---- */

/* Appends a varint to buf at *n. */
static void put_varint(uint8_t *buf, size_t *n, uint64_t v)
{
    while (v >= 0x80) {
        buf[(*n)++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    buf[(*n)++] = (uint8_t)v;
}

/* CheckpointWritten (server -> coordinator), Restore (coordinator -> servers), Shutdown
 * REJOIN (coordinator -> workers): what a receiver takes and what it refuses. */
static void test_checkpoint_restore(void)
{
    Zshard__Envelope env, *out;
    Zshard__CheckpointWritten cw;
    Zshard__ShardFile f[2], *fp[2] = {&f[0], &f[1]};
    uint64_t sums[2][3] = {{1, 2, 3}, {4, 5, 6}};
    zs_msg_envelope_init(&env, 2);
    zshard__checkpoint_written__init(&cw);
    cw.has_step = cw.has_server = 1;
    cw.step = 12;
    cw.server = 2;
    for (int i = 0; i < 2; i++) {
        zshard__shard_file__init(&f[i]);
        f[i].has_shard = f[i].has_bytes = f[i].has_header_xxh3 = 1;
        f[i].shard = (uint32_t)(2 * i + 1);
        f[i].file = i ? "shard-000003.safetensors" : "shard-000001.safetensors";
        f[i].bytes = 12288 + 4096;
        f[i].header_xxh3 = 0xfeedull + (uint64_t)i;
        f[i].n_xxh3 = 3;
        f[i].xxh3 = sums[i];
    }
    cw.n_files = 2;
    cw.files = fp;
    env.body_case = ZSHARD__ENVELOPE__BODY_CHECKPOINT_WRITTEN;
    env.checkpoint_written = &cw;
    CHECK_OK(roundtrip(&env, &COORD, &out));
    if (out) {
        CHECK_EQ_INT(out->checkpoint_written->n_files, 2);
        CHECK_EQ_INT(out->checkpoint_written->files[1]->xxh3[2], 6);
    }
    zs_msg_free(out);
    write_seed(&env, "checkpoint_written", 1);
    REFUSED(&env, &SERVER, "a server does not take CheckpointWritten messages");
    f[1].shard = 1;
    REFUSED(&env, &COORD, "CheckpointWritten.files[1].shard: 1 after 1: not strictly ascending");
    f[1].shard = 8;
    REFUSED(&env, &COORD, "CheckpointWritten.files[].shard: 8 is outside [0, 7]");
    f[1].shard = 3;
    f[1].file = "../manifest.json";
    REFUSED(&env, &COORD, "CheckpointWritten.files[].file: \"../manifest.json\" has character");
    f[1].file = ".hidden";
    REFUSED(&env, &COORD, "CheckpointWritten.files[1].file: \".hidden\" starts with a dot");
    f[1].file = "shard-000003.safetensors";
    f[1].n_xxh3 = 2;
    REFUSED(&env, &COORD, "CheckpointWritten.files[1].xxh3: 2 checksums, expected 3");
    f[1].n_xxh3 = 3;
    cw.step = 101;
    REFUSED(&env, &COORD, "CheckpointWritten.step: 101 is not a version of this job");
    cw.step = 12;
    cw.server = 3;
    REFUSED(&env, &COORD, "CheckpointWritten.server: 3, but the envelope's sender is 2");
    cw.server = 2;
    cw.error = "shard-000001.safetensors.tmp: No space left on device";
    REFUSED(&env, &COORD, "CheckpointWritten: 2 files and an error");
    cw.n_files = 0;
    CHECK_OK(decode_raw(&env, &COORD));
    write_seed(&env, "checkpoint_failed", 1);
    cw.error = NULL;
    REFUSED(&env, &COORD, "CheckpointWritten.files: none, and no error");

    Zshard__Restore r;
    zs_msg_envelope_init(&env, 0);
    zshard__restore__init(&r);
    r.has_version = 1;
    r.version = 12;
    r.step_dir = "/ckpt/step-00000012";
    env.body_case = ZSHARD__ENVELOPE__BODY_RESTORE;
    env.restore = &r;
    CHECK_OK(roundtrip(&env, &SERVER, &out));
    if (out)
        CHECK(strcmp(out->restore->step_dir, "/ckpt/step-00000012") == 0);
    zs_msg_free(out);
    write_seed(&env, "restore", 1);
    REFUSED(&env, &WORKER, "a worker does not take Restore messages");
    r.step_dir = "";
    REFUSED(&env, &SERVER, "Restore: version 12 with step_dir \"\": a checkpoint names both");
    r.version = 0;
    CHECK_OK(decode_raw(&env, &SERVER)); /* back to the job's start */
    r.version = 100;
    r.step_dir = "/ckpt/step-00000100";
    REFUSED(&env, &SERVER, "Restore.version: 100 is not a version the job continues from");
    /* From memory (a failover): no checkpoint named; only then a checkpoint written again. */
    r.version = 12;
    r.step_dir = "";
    r.has_from_memory = r.from_memory = 1;
    r.has_checkpoint = r.checkpoint = 1;
    CHECK_OK(decode_raw(&env, &SERVER));
    r.step_dir = "/ckpt/step-00000012";
    REFUSED(&env, &SERVER, "a restore from memory reads no checkpoint");
    r.from_memory = 0;
    REFUSED(&env, &SERVER, "Restore.checkpoint: only a restore from memory writes a checkpoint");
    r.has_from_memory = r.has_checkpoint = r.checkpoint = 0;
    env.sender = 2;
    REFUSED(&env, &SERVER, "Envelope.sender: 2, but Restore comes from the coordinator");

    Zshard__Shutdown sd;
    zs_msg_envelope_init(&env, 0);
    zshard__shutdown__init(&sd);
    sd.has_kind = 1;
    sd.kind = ZSHARD__SHUTDOWN_KIND__SHUTDOWN_REJOIN;
    sd.reason = "server 3 was lost; the job goes back to checkpoint 12";
    env.body_case = ZSHARD__ENVELOPE__BODY_SHUTDOWN;
    env.shutdown = &sd;
    CHECK_OK(decode_raw(&env, &WORKER));
    write_seed(&env, "shutdown_rejoin", 1);
    REFUSED(&env, &SERVER, "Shutdown.kind: 4 (rejoin) is for workers");
    sd.kind = 5;
    REFUSED(&env, &WORKER, "Shutdown.kind: 5 is not a shutdown kind");
}

static void test_envelope(void)
{
    reg_msg m;
    make_register(&m);
    /* Another protocol version, refused with a message that says both. */
    m.env.protocol_version = ZS_PROTOCOL_VERSION + 1;
    REFUSED(&m.env, &COORD,
            "Envelope.protocol_version: protocol version 8, this coordinator "
            "speaks 7");
    REFUSED(&m.env, &WORKER, "protocol version 8, this worker speaks 7");
    REFUSED(&m.env, &SERVER, "protocol version 8, this server speaks 7");
    REFUSED(&m.env, NULL, "protocol version 8, this peer speaks 7");
    write_seed(&m.env, "other_version", 0);
    size_t len;
    uint8_t *buf = raw_pack(&m.env, &len);
    uint32_t v = 0;
    CHECK_EQ_INT(zs_msg_peek_version(buf, len, &v), 1);
    CHECK_EQ_INT(v, ZS_PROTOCOL_VERSION + 1);
    /* ... even when the rest of its message does not decode as ours. */
    uint8_t garbled[64];
    size_t n = 0;
    garbled[n++] = 0x08; /* field 1, varint */
    put_varint(garbled, &n, 9);
    garbled[n++] = 0x52; /* field 10, length 40, but only 3 bytes follow */
    garbled[n++] = 40;
    garbled[n++] = 1;
    garbled[n++] = 2;
    garbled[n++] = 3;
    CHECK_FAILS_WITH(decode_bytes(garbled, n, &COORD), "protocol version 9, this coordinator "
                                                       "speaks 7");
    free(buf);
    m.env.protocol_version = ZS_PROTOCOL_VERSION;
    m.env.has_protocol_version = 0;
    REFUSED(&m.env, &COORD, "Envelope.protocol_version: missing");
    buf = raw_pack(&m.env, &len);
    CHECK_EQ_INT(zs_msg_peek_version(buf, len, &v), 0);
    free(buf);
    m.env.has_protocol_version = 1;
    m.env.has_sender = 0;
    REFUSED(&m.env, &COORD, "Envelope.sender: missing");
    m.env.has_sender = 1;
    m.env.body_case = ZSHARD__ENVELOPE__BODY__NOT_SET;
    REFUSED(&m.env, &COORD, "Envelope: no body");
    uint8_t *out = NULL;
    CHECK_FAILS_WITH(zs_msg_encode(&m.env, &out, &len), "Envelope: no body");

    /* Two bodies: two envelopes back to back parse as one with both. */
    make_register(&m);
    buf = raw_pack(&m.env, &len);
    uint8_t *two = malloc(2 * len);
    memcpy(two, buf, len);
    memcpy(two + len, buf, len);
    CHECK_FAILS_WITH(decode_bytes(two, 2 * len, &COORD), "Envelope: 2 bodies (Register, ..., "
                                                         "Register), expected one");
    free(two);

    /* An unknown field, top level and nested. */
    uint8_t *more = malloc(len + 16);
    memcpy(more, buf, len);
    n = len;
    more[n++] = 0x98; /* field 99, varint: tag 99 << 3 = 792 */
    more[n++] = 0x06;
    more[n++] = 0x01;
    CHECK_FAILS_WITH(decode_bytes(more, n, &COORD), "Envelope: unknown field 99 (wire type 0)");
    free(more);
    size_t rlen = zshard__register__get_packed_size(&m.reg);
    uint8_t *body = malloc(rlen + 8);
    zshard__register__pack(&m.reg, body);
    body[rlen++] = 0xa8; /* field 37, varint */
    body[rlen++] = 0x02;
    body[rlen++] = 0x05;
    uint8_t *env2 = malloc(rlen + 16);
    n = 0;
    env2[n++] = 0x08;
    env2[n++] = ZS_PROTOCOL_VERSION;
    env2[n++] = 0x10;
    env2[n++] = 0;
    env2[n++] = 0x52; /* field 10 (registration), length-delimited */
    put_varint(env2, &n, rlen);
    memcpy(env2 + n, body, rlen);
    n += rlen;
    CHECK_FAILS_WITH(decode_bytes(env2, n, &COORD), "Register: unknown field 37");
    free(env2);
    free(body);

    /* A NUL inside a string: protobuf-c would hand it over truncated. */
    m.reg.hostname = "abXcd";
    free(buf);
    buf = raw_pack(&m.env, &len);
    uint8_t *x = memmem(buf, len, "abXcd", 5);
    CHECK(x != NULL);
    if (x)
        x[2] = 0;
    CHECK_FAILS_WITH(decode_bytes(buf, len, &COORD), "Register.hostname: string of 5 bytes has a "
                                                     "NUL byte at 2");
    if (x)
        x[2] = 'X';
    m.eps[1] = "h:1X";
    free(buf);
    buf = raw_pack(&m.env, &len);
    x = memmem(buf, len, "h:1X", 4);
    if (x)
        x[3] = 0;
    CHECK_FAILS_WITH(decode_bytes(buf, len, &COORD), "Register.endpoints[1]: string of 4 bytes "
                                                     "has a NUL byte at 3");
    free(buf);

    /* Size limits. */
    CHECK_FAILS_WITH(decode_bytes((const uint8_t *)"", 0, &COORD), "Envelope: empty message");
    CHECK_FAILS_WITH(decode_bytes(NULL, 5, &COORD), "Envelope: empty message");
    uint8_t *huge = calloc(ZS_MSG_MAX_BYTES + 1, 1);
    CHECK_FAILS_WITH(decode_bytes(huge, ZS_MSG_MAX_BYTES + 1, &COORD), "more than the limit of "
                                                                       "16777216");
    free(huge);
    Zshard__Envelope env;
    Zshard__Error er;
    zs_msg_envelope_init(&env, 0);
    zshard__error__init(&er);
    er.has_code = 1;
    er.code = ZSHARD__ERROR_CODE__ERROR_INTERNAL;
    char *filler = malloc(ZS_MSG_MAX_SMALL_BYTES + 1);
    memset(filler, 'y', ZS_MSG_MAX_SMALL_BYTES);
    filler[ZS_MSG_MAX_SMALL_BYTES] = '\0';
    er.text = filler;
    env.body_case = ZSHARD__ENVELOPE__BODY_ERROR;
    env.error = &er;
    REFUSED(&env, &WORKER, "Envelope: Error of ");
    REFUSED(&env, &WORKER, "bytes, more than the limit of 65536 for its type");
    free(filler);

    /* Garbage framing. */
    const uint8_t junk1[] = {0x08, 0x81}; /* varint cut short */
    const uint8_t junk2[] = {0x0b, 0x01}; /* a group */
    const uint8_t junk3[] = {0x00, 0x01}; /* field 0 */
    const uint8_t junk4[] = {0x08, ZS_PROTOCOL_VERSION, 0x52,
                             0x7f}; /* a body longer than the bytes */
    CHECK_FAILS_WITH(decode_bytes(junk1, sizeof junk1, &COORD), "malformed at byte 0");
    CHECK_FAILS_WITH(decode_bytes(junk2, sizeof junk2, &COORD), "malformed at byte 0");
    CHECK_FAILS_WITH(decode_bytes(junk3, sizeof junk3, &COORD), "malformed at byte 0");
    CHECK_FAILS_WITH(decode_bytes(junk4, sizeof junk4, &COORD), "malformed at byte 2");
    /* A body that is framed right but does not unpack (field 1 of Register as a string). */
    const uint8_t junk5[] = {0x08, ZS_PROTOCOL_VERSION, 0x10, 0x00, 0x52, 0x02, 0x0a, 0x00};
    CHECK_FAILS_WITH(decode_bytes(junk5, sizeof junk5, &COORD), "do not decode as a "
                                                                "zshard.Envelope with a Register");
    CHECK_EQ_INT(zs_msg_refusal_code(junk4, sizeof junk4), ZSHARD__ERROR_CODE__ERROR_MALFORMED);
    CHECK_EQ_INT(zs_msg_refusal_code(garbled, 7), ZSHARD__ERROR_CODE__ERROR_PROTOCOL_VERSION);
    CHECK_EQ_INT(zs_msg_refusal_code(NULL, 0), ZSHARD__ERROR_CODE__ERROR_MALFORMED);
    CHECK_EQ_INT(strcmp(zs_msg_body_name(ZSHARD__ENVELOPE__BODY_JOB_SPEC), "JobSpec"), 0);
    CHECK_EQ_INT(strcmp(zs_msg_body_name(ZSHARD__ENVELOPE__BODY__NOT_SET), "none"), 0);
}

/* The refusal a coordinator sends a peer of another version, and what that peer reads. */
static void test_refusal(void)
{
    reg_msg m;
    make_register(&m);
    m.env.protocol_version = ZS_PROTOCOL_VERSION + 1;
    m.reg.protocol_version = ZS_PROTOCOL_VERSION + 1;
    size_t len;
    uint8_t *buf = raw_pack(&m.env, &len);
    Zshard__Envelope *env = NULL;
    CHECK_FAILS_WITH(zs_msg_decode(buf, len, &COORD, &env), "protocol version 8, this "
                                                            "coordinator speaks 7");
    Zshard__ErrorCode code = zs_msg_refusal_code(buf, len);
    CHECK_EQ_INT(code, ZSHARD__ERROR_CODE__ERROR_PROTOCOL_VERSION);
    free(buf);
    char why[1024];
    snprintf(why, sizeof why, "%s", zs_last_error());
    uint8_t *reply;
    CHECK_OK(zs_msg_encode_error(0, code, why, &reply, &len));
    /* The peer of version 8 reads our version and the text from the frozen fields. */
    uint32_t v = 0;
    CHECK_EQ_INT(zs_msg_peek_version(reply, len, &v), 1);
    CHECK_EQ_INT(v, ZS_PROTOCOL_VERSION);
    Zshard__Envelope *got = zshard__envelope__unpack(NULL, len, reply);
    CHECK(got && got->body_case == ZSHARD__ENVELOPE__BODY_ERROR);
    if (got && got->error) {
        CHECK_EQ_INT(got->error->code, ZSHARD__ERROR_CODE__ERROR_PROTOCOL_VERSION);
        CHECK(strstr(got->error->text, "protocol version 8, this coordinator speaks 7") != NULL);
    }
    zs_msg_free(got);
    CHECK_OK(decode_bytes(reply, len, &WORKER));
    free(reply);
    /* Defaults and limits of the helper. */
    CHECK_OK(zs_msg_encode_error(3, ZSHARD__ERROR_CODE__ERROR_OUT_OF_ORDER, NULL, &reply, &len));
    got = zshard__envelope__unpack(NULL, len, reply);
    CHECK(got && got->error && strcmp(got->error->text, "ERROR_OUT_OF_ORDER") == 0);
    zs_msg_free(got);
    free(reply);
    char *big = malloc(3 * ZS_MSG_MAX_STRING);
    memset(big, 'z', 3 * ZS_MSG_MAX_STRING - 1);
    big[3 * ZS_MSG_MAX_STRING - 1] = '\0';
    CHECK_OK(zs_msg_encode_error(3, ZSHARD__ERROR_CODE__ERROR_INTERNAL, big, &reply, &len));
    CHECK_OK(decode_bytes(reply, len, &COORD));
    free(reply);
    free(big);
    CHECK_FAILS_WITH(zs_msg_encode_error(3, 42, "x", &reply, &len), "Error.code: 42");
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Whatever decodes must encode again and decode to the same verdict. */
static int consistent(const uint8_t *buf, size_t len, const zs_msg_ctx *ctx)
{
    Zshard__Envelope *env = NULL;
    if (zs_msg_decode(buf, len, ctx, &env) != ZS_OK)
        return env == NULL;
    uint8_t *again;
    size_t n;
    int ok = zs_msg_encode(env, &again, &n) == ZS_OK;
    if (ok) {
        ok = decode_bytes(again, n, ctx) == ZS_OK;
        free(again);
    }
    zs_msg_free(env);
    return ok;
}

static void test_bad_bytes(void)
{
    job_msg jm;
    if (!make_job(&jm, job_json))
        return;
    uint8_t *buf;
    size_t len;
    CHECK_OK(zs_msg_encode(&jm.env, &buf, &len));
    /* Every proper prefix is refused: the body is the last field and it is cut. */
    int refused = 0;
    for (size_t n = 0; n < len; n++)
        refused += decode_bytes(buf, n, &WORKER) != ZS_OK;
    CHECK_EQ_INT(refused, len);
    CHECK_OK(decode_bytes(buf, len, &WORKER));
    /* Single bit flips: refused or still a consistent message; never a crash. */
    int flips_ok = 1;
    for (size_t i = 0; i < len; i++) {
        for (int bit = 0; bit < 8; bit += 3) {
            buf[i] ^= (uint8_t)(1u << bit);
            flips_ok &= consistent(buf, len, &WORKER);
            buf[i] ^= (uint8_t)(1u << bit);
        }
    }
    CHECK(flips_ok);
    free(buf);
    free_job(&jm);

    map_msg mm;
    if (make_map(&mm, 5000, 4096, 2)) {
        CHECK_OK(zs_msg_encode(&mm.env, &buf, &len));
        int ok = 1;
        for (size_t i = 0; i < len; i++) {
            uint8_t keep = buf[i];
            for (int k = 0; k < 4; k++) {
                buf[i] = (uint8_t)rnd();
                ok &= consistent(buf, len, &SERVER);
            }
            buf[i] = keep;
        }
        CHECK(ok);
        free(buf);
        free_map(&mm);
    }

    /* Random bytes, half of them behind a valid-looking start. */
    uint8_t rb[300];
    int accepted = 0, sane = 1;
    for (int it = 0; it < 20000; it++) {
        size_t n = rnd() % sizeof rb;
        for (size_t i = 0; i < n; i++)
            rb[i] = (uint8_t)rnd();
        if (it % 2 && n > 6) {
            rb[0] = 0x08;
            rb[1] = ZS_PROTOCOL_VERSION;
            rb[2] = 0x10;
            rb[3] = 0x01;
            rb[4] = (uint8_t)((10 + rnd() % 13) << 3 | 2);
            rb[5] = (uint8_t)(n - 6 < 127 ? n - 6 : 127);
        }
        const zs_msg_ctx *ctxs[] = {&ANY, &COORD, &SERVER, &WORKER};
        for (int c = 0; c < 4; c++) {
            Zshard__Envelope *env = NULL;
            if (zs_msg_decode(rb, n, ctxs[c], &env) == ZS_OK)
                accepted++;
            sane &= consistent(rb, n, ctxs[c]);
            zs_msg_free(env);
        }
    }
    CHECK(sane);
    printf("random bytes: %d of 80000 decodes accepted\n", accepted);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--write-corpus") == 0)
        corpus_dir = argv[2];
    test_register();
    test_register_reply();
    test_jobspec();
    test_shard_map();
    test_heartbeat_ready();
    test_step_assign_chunk_done();
    test_grad_norm_clip();
    test_version_error_shutdown();
    test_checkpoint_restore();
    test_envelope();
    test_refusal();
    if (!corpus_dir)
        test_bad_bytes();
    return zs_test_result("test_proto");
}
