/*
 * messages: the gate every control-plane message passes before a handler sees it.
 *
 * zs_msg_decode() works in four passes, cheapest first, so that a stranger's bytes cost little
 * and a peer of another version is told so even when its messages no longer decode:
 *
 *   1. a walk over the envelope's top-level fields (wire format only, no allocation) that
 *      reads protocol_version, finds the body and counts bodies: version mismatch, a missing
 *      or doubled body, a body this receiver never takes and a body over its size limit are
 *      refused here;
 *   2. protobuf-c's unpack;
 *   3. a second walk, through every nested message, guided by the generated descriptors:
 *      refuses unknown fields (a peer of another build) and strings with a NUL byte (which
 *      protobuf-c would hand over silently truncated);
 *   4. the typed check of the body (zs_msg_check_<type>), which knows what each field means.
 *
 * Every check reports the message type, the field and the value, as ZS_ERR_FORMAT.
 */
#include "proto/messages.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/lossscale.h"

#define FAIL(...) zs_error(ZS_ERR_FORMAT, __VA_ARGS__)

/* ------------------------------------------------------------------------------------------ */
/* Wire format walking.                                                                        */

enum { WT_VARINT = 0, WT_FIXED64 = 1, WT_LEN = 2, WT_FIXED32 = 5 };

typedef struct {
    const uint8_t *p, *end;
} wire;

typedef struct {
    uint32_t number;
    int type;
    uint64_t varint;     /* WT_VARINT */
    const uint8_t *data; /* WT_LEN */
    size_t len;          /* WT_LEN */
} wire_field;

static int wire_varint(wire *w, uint64_t *v)
{
    uint64_t x = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (w->p >= w->end)
            return 0;
        uint8_t b = *w->p++;
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return 1;
        }
    }
    return 0; /* more than 10 bytes */
}

/* Reads the next field; 0 when the bytes end inside it or it is not a valid field. */
static int wire_next(wire *w, wire_field *f)
{
    uint64_t tag;
    if (!wire_varint(w, &tag))
        return 0;
    f->number = (uint32_t)(tag >> 3);
    f->type = (int)(tag & 7);
    if (tag >> 3 == 0 || tag >> 3 > 0x1fffffff)
        return 0;
    switch (f->type) {
    case WT_VARINT:
        return wire_varint(w, &f->varint);
    case WT_FIXED64:
        if (w->end - w->p < 8)
            return 0;
        w->p += 8;
        return 1;
    case WT_FIXED32:
        if (w->end - w->p < 4)
            return 0;
        w->p += 4;
        return 1;
    case WT_LEN: {
        uint64_t n;
        if (!wire_varint(w, &n) || n > (uint64_t)(w->end - w->p))
            return 0;
        f->data = w->p;
        f->len = (size_t)n;
        w->p += n;
        return 1;
    }
    default: /* groups (3, 4) and the unassigned 6, 7 */
        return 0;
    }
}

#define BODY_FIRST ZSHARD__ENVELOPE__BODY_REGISTRATION
#define BODY_LAST ZSHARD__ENVELOPE__BODY_MEMBER_GONE

/* What pass 1 learns of an envelope. */
typedef struct {
    int complete;  /* the walk reached the end without a malformed field */
    size_t bad_at; /* where the walk stopped, if not complete */
    int has_version;
    uint64_t version;
    int bodies;          /* body fields seen */
    uint32_t body;       /* the last body field number */
    uint32_t first_body; /* the first one */
} envelope_peek;

static void peek(const uint8_t *bytes, size_t len, envelope_peek *pk)
{
    memset(pk, 0, sizeof *pk);
    wire w = {bytes, bytes + len};
    wire_field f;
    while (w.p < w.end) {
        const uint8_t *at = w.p;
        if (!wire_next(&w, &f)) {
            pk->bad_at = (size_t)(at - bytes);
            return;
        }
        if (f.number == 1 && f.type == WT_VARINT) {
            pk->has_version = 1;
            pk->version = f.varint;
        } else if (f.number >= BODY_FIRST && f.number <= BODY_LAST && f.type == WT_LEN) {
            if (!pk->bodies++)
                pk->first_body = f.number;
            pk->body = f.number;
        }
    }
    pk->complete = 1;
}

int zs_msg_peek_version(const void *bytes, size_t len, uint32_t *version)
{
    if (!bytes)
        return 0;
    envelope_peek pk;
    peek(bytes, len, &pk);
    if (pk.has_version && version)
        *version = (uint32_t)pk.version;
    return pk.has_version;
}

#define SCAN_MAX_DEPTH 8
#define SCAN_MAX_FIELDS 64

/*
 * Pass 3: every field of a message must be one its descriptor knows, every string NUL-free
 * and at most ZS_MSG_MAX_STRING bytes; nested messages are walked too.  path names the
 * message ("JobSpec.tensors[3]").
 */
static zs_err scan(const uint8_t *p, size_t len, const ProtobufCMessageDescriptor *d,
                   const char *path, int depth)
{
    if (depth > SCAN_MAX_DEPTH)
        return FAIL("%s: nested more than %d deep", path, SCAN_MAX_DEPTH);
    unsigned seen[SCAN_MAX_FIELDS] = {0};
    wire w = {p, p + len};
    wire_field f;
    while (w.p < w.end) {
        size_t at = (size_t)(w.p - p);
        if (!wire_next(&w, &f))
            return FAIL("%s: malformed field at byte %zu", path, at);
        const ProtobufCFieldDescriptor *fd = protobuf_c_message_descriptor_get_field(d, f.number);
        if (!fd)
            return FAIL("%s: unknown field %" PRIu32 " (wire type %d): the sender was built from "
                        "another zshard.proto",
                        path, f.number, f.type);
        size_t fi = (size_t)(fd - d->fields);
        unsigned idx = fi < SCAN_MAX_FIELDS ? seen[fi]++ : 0;
        if (f.type != WT_LEN)
            continue;
        char sub[256];
        if (fd->label == PROTOBUF_C_LABEL_REPEATED)
            snprintf(sub, sizeof sub, "%s.%s[%u]", path, fd->name, idx);
        else
            snprintf(sub, sizeof sub, "%s.%s", path, fd->name);
        if (fd->type == PROTOBUF_C_TYPE_STRING) {
            const void *nul = memchr(f.data, 0, f.len);
            if (nul)
                return FAIL("%s: string of %zu bytes has a NUL byte at %zu", sub, f.len,
                            (size_t)((const uint8_t *)nul - f.data));
            if (f.len > ZS_MSG_MAX_STRING)
                return FAIL("%s: string of %zu bytes, more than %d", sub, f.len, ZS_MSG_MAX_STRING);
        } else if (fd->type == PROTOBUF_C_TYPE_MESSAGE) {
            const ProtobufCMessageDescriptor *sd = fd->descriptor;
            /* A body is named by its type ("JobSpec"), everything below by its field path. */
            ZS_CHECK(scan(f.data, f.len, sd, depth == 0 ? sd->short_name : sub, depth + 1));
        }
    }
    return ZS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Field checks.                                                                               */

static zs_err need(int present, const char *path)
{
    return present ? ZS_OK : FAIL("%s: missing", path);
}

static zs_err u64_in(const char *path, int has, uint64_t v, uint64_t lo, uint64_t hi)
{
    if (!has)
        return FAIL("%s: missing", path);
    if (v < lo || v > hi)
        return FAIL("%s: %" PRIu64 " is outside [%" PRIu64 ", %" PRIu64 "]", path, v, lo, hi);
    return ZS_OK;
}

static zs_err dbl_in(const char *path, int has, double v, double lo, double hi)
{
    if (!has)
        return FAIL("%s: missing", path);
    if (!(v >= lo && v <= hi)) /* NaN fails too */
        return FAIL("%s: %g is outside [%g, %g]", path, v, lo, hi);
    return ZS_OK;
}

/* A loss scale (zs_lossscale_valid: a power of two in [2^-24, 2^64]), or 0 where zero_ok. */
static zs_err pow2_in(const char *path, int has, double v, int zero_ok)
{
    if (!has)
        return FAIL("%s: missing", path);
    if (zero_ok && v == 0)
        return ZS_OK;
    if (!zs_lossscale_valid(v))
        return FAIL("%s: %g is not %sa power of two in [2^-24, 2^64]", path, v,
                    zero_ok ? "0 or " : "");
    return ZS_OK;
}

enum {
    STR_EMPTY_OK = 1, /* "" is allowed */
    STR_TOKEN = 2,    /* printable ASCII without spaces */
    STR_NAME = 4,     /* [A-Za-z0-9._-]: tensor names */
};

static zs_err str_ok(const char *path, const char *s, size_t max, int flags)
{
    if (!s)
        return FAIL("%s: missing", path);
    size_t n = strnlen(s, max + 1);
    if (n > max)
        return FAIL("%s: longer than %zu bytes", path, max);
    if (n == 0 && !(flags & STR_EMPTY_OK))
        return FAIL("%s: empty", path);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        int ok = 1;
        if (flags & STR_NAME)
            ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '.' || c == '_' || c == '-';
        else if (flags & STR_TOKEN)
            ok = c > 0x20 && c < 0x7f;
        if (!ok)
            return FAIL("%s: \"%.*s\" has character 0x%02x at %zu", path, (int)(n < 80 ? n : 80), s,
                        c, i);
    }
    return ZS_OK;
}

zs_err zs_msg_check_endpoint(const char *what, const char *ep)
{
    ZS_CHECK(str_ok(what, ep, ZS_MSG_MAX_ENDPOINT, STR_TOKEN));
    const char *colon = strrchr(ep, ':');
    if (!colon)
        return FAIL("%s: \"%s\" is not HOST:PORT", what, ep);
    size_t hl = (size_t)(colon - ep);
    if (hl == 0)
        return FAIL("%s: \"%s\" has no host", what, ep);
    if (ep[0] == '[') {
        if (hl < 3 || ep[hl - 1] != ']')
            return FAIL("%s: \"%s\": an IPv6 host goes in brackets, [ADDR]:PORT", what, ep);
    } else if (memchr(ep, ':', hl)) {
        return FAIL("%s: \"%s\": an IPv6 host goes in brackets, [ADDR]:PORT", what, ep);
    }
    const char *port = colon + 1;
    size_t pl = strlen(port);
    long v = 0;
    for (size_t i = 0; i < pl && i < 6; i++) {
        if (port[i] < '0' || port[i] > '9') {
            v = -1;
            break;
        }
        v = v * 10 + (port[i] - '0');
    }
    if (pl == 0 || pl > 5 || v < 1 || v > 65535)
        return FAIL("%s: \"%s\": port \"%s\" is not a number in 1..65535", what, ep, port);
    return ZS_OK;
}

static zs_err error_code_ok(const char *path, int has, int code)
{
    if (!has)
        return FAIL("%s: missing", path);
    if (code < ZSHARD__ERROR_CODE__ERROR_MALFORMED || code > ZSHARD__ERROR_CODE__ERROR_INTERNAL)
        return FAIL("%s: %d is not an error code (1..%d)", path, code,
                    ZSHARD__ERROR_CODE__ERROR_INTERNAL);
    return ZS_OK;
}

static const char *self_name(const zs_msg_ctx *ctx)
{
    switch (ctx ? ctx->self : ZS_MSG_ANY) {
    case ZS_MSG_COORDINATOR:
        return "coordinator";
    case ZS_MSG_SERVER:
        return "server";
    case ZS_MSG_WORKER:
        return "worker";
    default:
        return "peer";
    }
}

static zs_err version_ok(const char *path, int has, uint64_t v, const zs_msg_ctx *ctx)
{
    if (!has)
        return FAIL("%s: missing", path);
    if (v != ZS_PROTOCOL_VERSION)
        return FAIL("%s: protocol version %" PRIu64 ", this %s speaks %d", path, v, self_name(ctx),
                    ZS_PROTOCOL_VERSION);
    return ZS_OK;
}

/* Step numbers: below the job's steps when known. */
static zs_err step_ok(const char *path, int has, uint64_t step, const zs_msg_ctx *ctx)
{
    if (!has)
        return FAIL("%s: missing", path);
    uint64_t steps = ctx && ctx->steps ? ctx->steps : ZS_MSG_MAX_STEPS;
    if (step >= steps)
        return FAIL("%s: %" PRIu64 ", the job has %" PRIu64 " steps (0..%" PRIu64 ")", path, step,
                    steps, steps - 1);
    return ZS_OK;
}

static zs_err id_ok(const char *path, int has, uint32_t id)
{
    if (!has)
        return FAIL("%s: missing", path);
    if (id == 0)
        return FAIL("%s: 0 is the coordinator's id, not a peer's", path);
    return ZS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* One check per body type.                                                                    */

zs_err zs_msg_check_register(const Zshard__Register *m, const zs_msg_ctx *ctx)
{
    if (!m)
        return FAIL("Register: missing");
    if (!m->has_role)
        return FAIL("Register.role: missing");
    if (m->role < ZSHARD__ROLE__ROLE_SERVER || m->role > ZSHARD__ROLE__ROLE_CLIENT_TOOL)
        return FAIL("Register.role: %d is not a role (1 server, 2 worker, 3 client tool)",
                    (int)m->role);
    ZS_CHECK(
        version_ok("Register.protocol_version", m->has_protocol_version, m->protocol_version, ctx));
    if (!m->has_capabilities)
        return FAIL("Register.capabilities: missing");
    uint32_t caps = m->capabilities;
    if (caps & ~(uint32_t)ZS_MSG_CAPS_KNOWN)
        return FAIL("Register.capabilities: 0x%" PRIx32 " has unknown bits 0x%" PRIx32, caps,
                    caps & ~(uint32_t)ZS_MSG_CAPS_KNOWN);
    if (!(caps & ZS_MSG_CAPS_TRANSPORT))
        return FAIL("Register.capabilities: 0x%" PRIx32 " offers no data-plane transport "
                    "(tcp, rdma or shm)",
                    caps);
    if (!(caps & ZS_MSG_CAPS_FETCH))
        return FAIL("Register.capabilities: 0x%" PRIx32 " offers no fetch dtype (fp32 or bf16)",
                    caps);
    if (m->n_endpoints > ZS_MSG_MAX_ENDPOINTS)
        return FAIL("Register.endpoints: %zu, more than %d", m->n_endpoints, ZS_MSG_MAX_ENDPOINTS);
    if (m->role == ZSHARD__ROLE__ROLE_SERVER && m->n_endpoints == 0)
        return FAIL("Register.endpoints: none, and a server must give its data-plane HOST:PORT");
    for (size_t i = 0; i < m->n_endpoints; i++) {
        char path[64];
        snprintf(path, sizeof path, "Register.endpoints[%zu]", i);
        ZS_CHECK(zs_msg_check_endpoint(path, m->endpoints[i]));
    }
    ZS_CHECK(str_ok("Register.hostname", m->hostname, ZS_MSG_MAX_HOSTNAME, STR_TOKEN));
    if (!m->has_pid)
        return FAIL("Register.pid: missing");
    if (m->pid == 0)
        return FAIL("Register.pid: 0 is not a process id");
    if (m->build)
        ZS_CHECK(str_ok("Register.build", m->build, ZS_MSG_MAX_BUILD, STR_TOKEN));
    return ZS_OK;
}

zs_err zs_msg_check_register_reply(const Zshard__RegisterReply *m, const zs_msg_ctx *ctx)
{
    (void)ctx;
    if (!m)
        return FAIL("RegisterReply: missing");
    switch (m->outcome_case) {
    case ZSHARD__REGISTER_REPLY__OUTCOME_ASSIGNED_ID:
        ZS_CHECK(id_ok("RegisterReply.assigned_id", 1, m->assigned_id));
        if (m->has_code)
            return FAIL("RegisterReply.code: %d given with an accepted registration", (int)m->code);
        if (!m->has_data_token || m->data_token.len != ZS_TOKEN_BYTES)
            return FAIL("RegisterReply.data_token: %zu bytes, expected %d",
                        m->has_data_token ? m->data_token.len : 0, ZS_TOKEN_BYTES);
        if (m->has_data_key && m->data_key.len != ZS_TOKEN_BYTES)
            return FAIL("RegisterReply.data_key: %zu bytes, expected %d", m->data_key.len,
                        ZS_TOKEN_BYTES);
        if (ctx && ctx->self == ZS_MSG_SERVER && !m->has_data_key)
            return FAIL("RegisterReply.data_key: missing in a server's registration");
        return ZS_OK;
    case ZSHARD__REGISTER_REPLY__OUTCOME_REFUSAL:
        if (m->has_data_token || m->has_data_key)
            return FAIL("RegisterReply: data keys given with a refusal");
        ZS_CHECK(str_ok("RegisterReply.refusal", m->refusal, ZS_MSG_MAX_STRING, 0));
        return error_code_ok("RegisterReply.code", m->has_code, (int)m->code);
    case ZSHARD__REGISTER_REPLY__OUTCOME__NOT_SET:
        return FAIL("RegisterReply: neither assigned_id nor refusal");
    default:
        return FAIL("RegisterReply.outcome: case %d is not known", (int)m->outcome_case);
    }
}

static zs_err check_model(const Zshard__ModelConfig *m)
{
    if (!m)
        return FAIL("JobSpec.model: missing");
    /* The same ranges as the config parser's (common/config.c). */
    ZS_CHECK(u64_in("JobSpec.model.n_layer", m->has_n_layer, m->n_layer, 1, 1024));
    ZS_CHECK(u64_in("JobSpec.model.n_head", m->has_n_head, m->n_head, 1, 1024));
    ZS_CHECK(u64_in("JobSpec.model.n_embd", m->has_n_embd, m->n_embd, 1, 65536));
    ZS_CHECK(u64_in("JobSpec.model.vocab_size", m->has_vocab_size, m->vocab_size, 1, 1 << 24));
    ZS_CHECK(u64_in("JobSpec.model.block_size", m->has_block_size, m->block_size, 1, 1 << 20));
    if (m->n_embd % m->n_head != 0)
        return FAIL("JobSpec.model.n_embd: %" PRIu32 " is not a multiple of n_head %" PRIu32,
                    m->n_embd, m->n_head);
    return ZS_OK;
}

static zs_err check_tensors(const Zshard__JobSpec *m)
{
    ZS_CHECK(
        u64_in("JobSpec.total_floats", m->has_total_floats, m->total_floats, 1, ZS_MSG_MAX_FLOATS));
    if (m->total_floats % ZS_TENSOR_ALIGN != 0)
        return FAIL("JobSpec.total_floats: %" PRIu64 " is not a multiple of %d floats",
                    m->total_floats, ZS_TENSOR_ALIGN);
    if (m->n_tensors == 0)
        return FAIL("JobSpec.tensors: none");
    if (m->n_tensors > ZS_MSG_MAX_TENSORS)
        return FAIL("JobSpec.tensors: %zu, more than %d", m->n_tensors, ZS_MSG_MAX_TENSORS);
    uint64_t prev_end = 0;
    for (size_t i = 0; i < m->n_tensors; i++) {
        const Zshard__TensorEntry *t = m->tensors[i];
        char path[96];
        snprintf(path, sizeof path, "JobSpec.tensors[%zu]", i);
        if (!t)
            return FAIL("%s: missing", path);
        char fp[128];
        snprintf(fp, sizeof fp, "%s.name", path);
        ZS_CHECK(str_ok(fp, t->name, ZS_TENSOR_NAME_MAX - 1, STR_NAME));
        if (!t->has_offset)
            return FAIL("%s.offset: missing", path);
        if (t->offset % ZS_TENSOR_ALIGN != 0)
            return FAIL("%s.offset: %" PRIu64 " is not a multiple of %d floats", path, t->offset,
                        ZS_TENSOR_ALIGN);
        if (t->n_shape < 1 || t->n_shape > ZS_TENSOR_MAX_DIMS)
            return FAIL("%s.shape: %zu dims, expected 1..%d", path, t->n_shape, ZS_TENSOR_MAX_DIMS);
        uint64_t numel = 1;
        for (size_t d = 0; d < t->n_shape; d++) {
            uint64_t x = t->shape[d];
            if (x == 0 || x > ZS_MSG_MAX_FLOATS / numel)
                return FAIL("%s.shape[%zu]: %" PRIu64 " is not a dimension in 1..%" PRIu64, path, d,
                            x, ZS_MSG_MAX_FLOATS / numel);
            numel *= x;
        }
        if (!t->has_decay)
            return FAIL("%s.decay: missing", path);
        if (t->offset < prev_end)
            return FAIL("%s.offset: %" PRIu64 " overlaps tensors[%zu], which ends at %" PRIu64
                        " (tensors must be in vector order without overlap)",
                        path, t->offset, i - 1, prev_end);
        if (t->offset > m->total_floats || numel > m->total_floats - t->offset)
            return FAIL("%s: [%" PRIu64 ", %" PRIu64 ") extends past total_floats %" PRIu64, path,
                        t->offset, t->offset + numel, m->total_floats);
        prev_end = t->offset + numel;
    }
    return ZS_OK;
}

zs_err zs_msg_check_job_spec(const Zshard__JobSpec *m, const zs_msg_ctx *ctx)
{
    (void)ctx;
    if (!m)
        return FAIL("JobSpec: missing");
    ZS_CHECK(check_model(m->model));
    ZS_CHECK(check_tensors(m));

    const Zshard__AdamW *a = m->adamw;
    if (!a)
        return FAIL("JobSpec.adamw: missing");
    ZS_CHECK(dbl_in("JobSpec.adamw.lr", a->has_lr, a->lr, 0, 10));
    ZS_CHECK(need(a->has_beta1, "JobSpec.adamw.beta1"));
    if (!(a->beta1 >= 0 && a->beta1 < 1))
        return FAIL("JobSpec.adamw.beta1: %g is outside [0, 1)", a->beta1);
    ZS_CHECK(need(a->has_beta2, "JobSpec.adamw.beta2"));
    if (!(a->beta2 >= 0 && a->beta2 < 1))
        return FAIL("JobSpec.adamw.beta2: %g is outside [0, 1)", a->beta2);
    ZS_CHECK(dbl_in("JobSpec.adamw.eps", a->has_eps, a->eps, 0, 1));
    ZS_CHECK(dbl_in("JobSpec.adamw.weight_decay", a->has_weight_decay, a->weight_decay, 0, 10));

    const Zshard__Schedule *s = m->schedule;
    if (!s)
        return FAIL("JobSpec.schedule: missing");
    if (!s->has_type)
        return FAIL("JobSpec.schedule.type: missing");
    if (s->type < ZSHARD__SCHEDULE_TYPE__SCHEDULE_CONSTANT ||
        s->type > ZSHARD__SCHEDULE_TYPE__SCHEDULE_WARMUP_COSINE)
        return FAIL("JobSpec.schedule.type: %d is not a schedule (1..%d)", (int)s->type,
                    ZSHARD__SCHEDULE_TYPE__SCHEDULE_WARMUP_COSINE);
    ZS_CHECK(
        dbl_in("JobSpec.schedule.warmup_min_lr", s->has_warmup_min_lr, s->warmup_min_lr, 0, 10));
    ZS_CHECK(
        dbl_in("JobSpec.schedule.warmup_max_lr", s->has_warmup_max_lr, s->warmup_max_lr, 0, 10));
    ZS_CHECK(u64_in("JobSpec.schedule.warmup_num_steps", s->has_warmup_num_steps,
                    s->warmup_num_steps, 0, 1 << 30));
    ZS_CHECK(need(s->has_warmup_linear, "JobSpec.schedule.warmup_linear"));
    ZS_CHECK(u64_in("JobSpec.schedule.total_num_steps", s->has_total_num_steps, s->total_num_steps,
                    0, 1 << 30));
    ZS_CHECK(dbl_in("JobSpec.schedule.warmup_min_ratio", s->has_warmup_min_ratio,
                    s->warmup_min_ratio, 0, 1));
    ZS_CHECK(
        dbl_in("JobSpec.schedule.cos_min_ratio", s->has_cos_min_ratio, s->cos_min_ratio, 0, 1));

    ZS_CHECK(dbl_in("JobSpec.gradient_clipping", m->has_gradient_clipping, m->gradient_clipping, 0,
                    1e30));
    ZS_CHECK(need(m->has_seed, "JobSpec.seed"));

    const Zshard__BatchGeometry *b = m->batch;
    if (!b)
        return FAIL("JobSpec.batch: missing");
    ZS_CHECK(u64_in("JobSpec.batch.train_batch_size", b->has_train_batch_size, b->train_batch_size,
                    1, 1 << 24));
    ZS_CHECK(u64_in("JobSpec.batch.micro_batch", b->has_micro_batch, b->micro_batch, 1, 1 << 20));
    ZS_CHECK(u64_in("JobSpec.batch.chunks", b->has_chunks, b->chunks, 1, ZS_MSG_MAX_CHUNKS));
    if ((uint64_t)b->micro_batch * b->chunks != b->train_batch_size)
        return FAIL("JobSpec.batch: train_batch_size %" PRIu32 " != micro_batch %" PRIu32
                    " * chunks %" PRIu32,
                    b->train_batch_size, b->micro_batch, b->chunks);
    ZS_CHECK(need(m->has_bf16, "JobSpec.bf16"));

    const Zshard__Cluster *c = m->cluster;
    if (!c)
        return FAIL("JobSpec.cluster: missing");
    ZS_CHECK(u64_in("JobSpec.cluster.shard_bytes", c->has_shard_bytes, c->shard_bytes,
                    ZS_TENSOR_ALIGN * sizeof(float), ZS_MSG_MAX_FLOATS * sizeof(float)));
    if (c->shard_bytes % (ZS_TENSOR_ALIGN * sizeof(float)) != 0)
        return FAIL("JobSpec.cluster.shard_bytes: %" PRIu64 " is not a multiple of %zu",
                    c->shard_bytes, ZS_TENSOR_ALIGN * sizeof(float));
    ZS_CHECK(u64_in("JobSpec.cluster.heartbeat_interval_ms", c->has_heartbeat_interval_ms,
                    c->heartbeat_interval_ms, 1, 3600000));
    ZS_CHECK(u64_in("JobSpec.cluster.heartbeat_timeout_ms", c->has_heartbeat_timeout_ms,
                    c->heartbeat_timeout_ms, 1, 3600000));
    if (c->heartbeat_timeout_ms <= c->heartbeat_interval_ms)
        return FAIL("JobSpec.cluster.heartbeat_timeout_ms: %" PRIu32 " must exceed "
                    "heartbeat_interval_ms %" PRIu32,
                    c->heartbeat_timeout_ms, c->heartbeat_interval_ms);
    ZS_CHECK(u64_in("JobSpec.cluster.coordinator_timeout_ms", c->has_coordinator_timeout_ms,
                    c->coordinator_timeout_ms, 2 * (uint64_t)c->heartbeat_interval_ms + 1,
                    3600000));
    if (c->has_transport && c->transport > ZS_TRANSPORT_SHM)
        return FAIL("JobSpec.cluster.transport: %" PRIu32
                    " is not 0 (auto), 1 (tcp), 2 (rdma) or 3 (shm)",
                    c->transport);
    if (c->rdma_device)
        ZS_CHECK(str_ok("JobSpec.cluster.rdma_device", c->rdma_device, 63, STR_EMPTY_OK));
    if (c->has_rdma_port && (c->rdma_port < 1 || c->rdma_port > 255))
        return FAIL("JobSpec.cluster.rdma_port: %" PRIu32 " is not 1..255", c->rdma_port);
    if (c->has_rdma_gid_index && (c->rdma_gid_index < -1 || c->rdma_gid_index > 65536))
        return FAIL("JobSpec.cluster.rdma_gid_index: %" PRId32 " is not -1..65536",
                    c->rdma_gid_index);

    const Zshard__DataSpec *d = m->data;
    if (!d)
        return FAIL("JobSpec.data: missing");
    ZS_CHECK(str_ok("JobSpec.data.path", d->path, ZS_MSG_MAX_STRING, 0));
    ZS_CHECK(need(d->has_fingerprint, "JobSpec.data.fingerprint"));
    ZS_CHECK(need(d->has_ntokens, "JobSpec.data.ntokens"));
    if (d->ntokens < (uint64_t)m->model->block_size + 1)
        return FAIL("JobSpec.data.ntokens: %" PRIu64 ", fewer than one sequence of block_size + 1 "
                    "= %" PRIu64 " tokens",
                    d->ntokens, (uint64_t)m->model->block_size + 1);

    ZS_CHECK(u64_in("JobSpec.steps", m->has_steps, m->steps, 1, ZS_MSG_MAX_STEPS));
    ZS_CHECK(
        u64_in("JobSpec.steps_per_print", m->has_steps_per_print, m->steps_per_print, 1, 1 << 30));

    const Zshard__Elasticity *e = m->elasticity;
    if (!e)
        return FAIL("JobSpec.elasticity: missing");
    ZS_CHECK(need(e->has_enabled, "JobSpec.elasticity.enabled"));
    ZS_CHECK(
        u64_in("JobSpec.elasticity.min_workers", e->has_min_workers, e->min_workers, 0, 1 << 20));
    ZS_CHECK(
        u64_in("JobSpec.elasticity.max_workers", e->has_max_workers, e->max_workers, 0, 1 << 20));
    if (e->max_workers && e->max_workers < e->min_workers)
        return FAIL("JobSpec.elasticity.max_workers: %" PRIu32 " is below min_workers %" PRIu32,
                    e->max_workers, e->min_workers);

    const Zshard__CheckpointSpec *k = m->checkpoint;
    if (!k)
        return FAIL("JobSpec.checkpoint: missing");
    /* Empty: the job writes no checkpoints (harnesses that drive servers without a
     * coordinator); `zshard coord` always names one. */
    ZS_CHECK(str_ok("JobSpec.checkpoint.dir", k->dir, ZS_MSG_MAX_STRING, STR_EMPTY_OK));
    if (k->dir[0] && k->dir[0] != '/')
        return FAIL("JobSpec.checkpoint.dir: \"%.80s\" is not an absolute path", k->dir);
    ZS_CHECK(u64_in("JobSpec.checkpoint.interval_steps", k->has_interval_steps, k->interval_steps,
                    0, 1 << 30));
    ZS_CHECK(u64_in("JobSpec.checkpoint.replicas", k->has_replicas, k->replicas, 0, 1));
    if (m->resume) {
        const Zshard__ResumeSpec *r = m->resume;
        ZS_CHECK(str_ok("JobSpec.resume.step_dir", r->step_dir, ZS_MSG_MAX_STRING, 0));
        ZS_CHECK(u64_in("JobSpec.resume.step", r->has_step, r->step, 1, (uint64_t)m->steps - 1));
    }
    ZS_CHECK(need(m->has_run_id, "JobSpec.run_id"));
    ZS_CHECK(need(m->has_config_fingerprint, "JobSpec.config_fingerprint"));
    const Zshard__Offload *o = m->offload;
    if (!o)
        return FAIL("JobSpec.offload: missing");
    ZS_CHECK(u64_in("JobSpec.offload.optimizer_device", o->has_optimizer_device,
                    o->optimizer_device, ZS_OFFLOAD_NONE, ZS_OFFLOAD_NVME));
    ZS_CHECK(str_ok("JobSpec.offload.nvme_path", o->nvme_path, ZS_MSG_MAX_STRING, STR_EMPTY_OK));
    if (o->optimizer_device == ZS_OFFLOAD_NVME && o->nvme_path[0] != '/')
        return FAIL("JobSpec.offload.nvme_path: \"%.80s\" is not an absolute path", o->nvme_path);
    ZS_CHECK(u64_in("JobSpec.offload.aio_block_size", o->has_aio_block_size, o->aio_block_size,
                    4096, 1u << 30));
    if (o->aio_block_size % 4096)
        return FAIL("JobSpec.offload.aio_block_size: %" PRIu64 " is not a multiple of 4096",
                    o->aio_block_size);
    ZS_CHECK(u64_in("JobSpec.offload.aio_queue_depth", o->has_aio_queue_depth, o->aio_queue_depth,
                    1, 4096));
    ZS_CHECK(u64_in("JobSpec.offload.server_memory_bytes", o->has_server_memory_bytes,
                    o->server_memory_bytes, 0, 1ull << 50));
    ZS_CHECK(need(o->has_param_on_nvme, "JobSpec.offload.param_on_nvme"));
    ZS_CHECK(
        u64_in("JobSpec.offload.param_buffers", o->has_param_buffers, o->param_buffers, 2, 1024));
    if (o->param_on_nvme && o->optimizer_device != ZS_OFFLOAD_NVME)
        return FAIL("JobSpec.offload.param_on_nvme: set without optimizer_device 2 (nvme)");
    if (o->optimizer_device == ZS_OFFLOAD_NVME && m->checkpoint->replicas > 0)
        return FAIL("JobSpec.offload: moments on NVMe with checkpoint.replicas 1 (not supported "
                    "yet)");
    return ZS_OK;
}

typedef struct {
    uint32_t id;
    uint32_t index;
} id_index;

static int cmp_id_index(const void *a, const void *b)
{
    const id_index *x = a, *y = b;
    return x->id < y->id ? -1 : x->id > y->id ? 1 : (x->index < y->index ? -1 : 1);
}

zs_err zs_msg_check_shard_map(const Zshard__ShardMap *m, const zs_msg_ctx *ctx)
{
    (void)ctx;
    if (!m)
        return FAIL("ShardMap: missing");
    ZS_CHECK(u64_in("ShardMap.total_floats", m->has_total_floats, m->total_floats, 1,
                    ZS_MSG_MAX_FLOATS));
    ZS_CHECK(u64_in("ShardMap.shard_floats", m->has_shard_floats, m->shard_floats, ZS_TENSOR_ALIGN,
                    ZS_MSG_MAX_FLOATS));
    if (m->shard_floats % ZS_TENSOR_ALIGN != 0)
        return FAIL("ShardMap.shard_floats: %" PRIu64 " is not a multiple of %d", m->shard_floats,
                    ZS_TENSOR_ALIGN);
    if (m->has_transport && m->transport != ZSHARD__CAPABILITY__CAP_TRANSPORT_TCP &&
        m->transport != ZSHARD__CAPABILITY__CAP_TRANSPORT_RDMA &&
        m->transport != ZSHARD__CAPABILITY__CAP_TRANSPORT_SHM)
        return FAIL("ShardMap.transport: %" PRIu32 " is not %d (tcp), %d (rdma) or %d (shm)",
                    m->transport, ZSHARD__CAPABILITY__CAP_TRANSPORT_TCP,
                    ZSHARD__CAPABILITY__CAP_TRANSPORT_RDMA, ZSHARD__CAPABILITY__CAP_TRANSPORT_SHM);
    if (m->n_servers == 0)
        return FAIL("ShardMap.servers: none");
    if (m->n_servers > ZS_MSG_MAX_SERVERS)
        return FAIL("ShardMap.servers: %zu, more than %d", m->n_servers, ZS_MSG_MAX_SERVERS);
    if (m->n_shards == 0)
        return FAIL("ShardMap.shards: none");
    if (m->n_shards > ZS_MSG_MAX_SHARDS)
        return FAIL("ShardMap.shards: %zu, more than %d", m->n_shards, ZS_MSG_MAX_SHARDS);

    zs_err res = ZS_OK;
    id_index *ids = malloc(m->n_servers * sizeof *ids);
    uint32_t *held = calloc(m->n_servers, sizeof *held);
    if (!ids || !held) {
        res = zs_error(ZS_ERR_NOMEM, "ShardMap: out of memory for %zu servers", m->n_servers);
        goto out;
    }
    for (size_t s = 0; s < m->n_servers; s++) {
        const Zshard__ServerInfo *si = m->servers[s];
        char path[64];
        snprintf(path, sizeof path, "ShardMap.servers[%zu]", s);
        if (!si) {
            res = FAIL("%s: missing", path);
            goto out;
        }
        char fp[80];
        snprintf(fp, sizeof fp, "%s.id", path);
        ZS_CHECK_GOTO(id_ok(fp, si->has_id, si->id), res, out);
        snprintf(fp, sizeof fp, "%s.endpoint", path);
        ZS_CHECK_GOTO(zs_msg_check_endpoint(fp, si->endpoint), res, out);
        ids[s] = (id_index){si->id, (uint32_t)s};
    }
    qsort(ids, m->n_servers, sizeof *ids, cmp_id_index);
    for (size_t s = 1; s < m->n_servers; s++)
        if (ids[s].id == ids[s - 1].id) {
            res =
                FAIL("ShardMap.servers[%" PRIu32 "].id: %" PRIu32 " is also servers[%" PRIu32 "]'s",
                     ids[s].index, ids[s].id, ids[s - 1].index);
            goto out;
        }

    uint64_t end = 0;
    for (size_t i = 0; i < m->n_shards; i++) {
        const Zshard__Shard *sh = m->shards[i];
        char path[64];
        snprintf(path, sizeof path, "ShardMap.shards[%zu]", i);
        if (!sh) {
            res = FAIL("%s: missing", path);
            goto out;
        }
        if (!sh->has_index || !sh->has_begin || !sh->has_end || !sh->has_server) {
            res = FAIL("%s.%s: missing", path,
                       !sh->has_index   ? "index"
                       : !sh->has_begin ? "begin"
                       : !sh->has_end   ? "end"
                                        : "server");
            goto out;
        }
        if (sh->index != i) {
            res = FAIL("%s.index: %" PRIu32 ", expected %zu: shards must be sorted by index", path,
                       sh->index, i);
            goto out;
        }
        if (sh->begin != end) {
            if (i == 0)
                res = FAIL("%s.begin: %" PRIu64 ", expected 0: shards must cover [0, total_floats)",
                           path, sh->begin);
            else
                res = FAIL("%s.begin: %" PRIu64 ", expected %" PRIu64 " (the end of shards[%zu]): "
                           "shards must be contiguous",
                           path, sh->begin, end, i - 1);
            goto out;
        }
        if (sh->end <= sh->begin) {
            res = FAIL("%s: empty range [%" PRIu64 ", %" PRIu64 ")", path, sh->begin, sh->end);
            goto out;
        }
        if (sh->end > m->total_floats) {
            res = FAIL("%s.end: %" PRIu64 " is past total_floats %" PRIu64, path, sh->end,
                       m->total_floats);
            goto out;
        }
        uint64_t n = sh->end - sh->begin;
        if (n > m->shard_floats || (n < m->shard_floats && i + 1 != m->n_shards)) {
            res = FAIL("%s: %" PRIu64 " floats, expected shard_floats %" PRIu64 " (only the last "
                       "shard may be shorter)",
                       path, n, m->shard_floats);
            goto out;
        }
        id_index key = {sh->server, 0};
        id_index *hit = NULL;
        size_t lo = 0, hi = m->n_servers;
        while (lo < hi) { /* the first entry with this id */
            size_t mid = lo + (hi - lo) / 2;
            if (ids[mid].id < key.id)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo < m->n_servers && ids[lo].id == key.id)
            hit = &ids[lo];
        if (!hit) {
            res = FAIL("%s.server: %" PRIu32 " is not in ShardMap.servers", path, sh->server);
            goto out;
        }
        held[hit->index]++;
        end = sh->end;
    }
    if (end != m->total_floats) {
        res =
            FAIL("ShardMap.shards: cover [0, %" PRIu64 "), expected [0, total_floats %" PRIu64 ")",
                 end, m->total_floats);
        goto out;
    }
    for (size_t s = 0; s < m->n_servers; s++)
        if (!held[s]) {
            res = FAIL("ShardMap.servers[%zu]: server %" PRIu32 " holds no shard", s,
                       m->servers[s]->id);
            goto out;
        }
    /* A replica lives on another server of the map, and no server holds two: losing one
     * server must never lose a state and its replica together, and a holder of two replicas
     * would carry three servers' memory. */
    for (size_t s = 0; s < m->n_servers; s++) {
        const Zshard__ServerInfo *si = m->servers[s];
        if (!si->has_replica)
            continue;
        size_t lo = 0, hi = m->n_servers;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (ids[mid].id < si->replica)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo == m->n_servers || ids[lo].id != si->replica || si->replica == si->id) {
            res = FAIL("ShardMap.servers[%zu].replica: %" PRIu32 " is not another server of the "
                       "map",
                       s, si->replica);
            goto out;
        }
        if (held[ids[lo].index] & 0x80000000u) {
            res = FAIL("ShardMap.servers[%zu].replica: server %" PRIu32 " holds a replica "
                       "already",
                       s, si->replica);
            goto out;
        }
        held[ids[lo].index] |= 0x80000000u;
    }
out:
    free(held);
    free(ids);
    return res;
}

zs_err zs_msg_check_heartbeat(const Zshard__Heartbeat *m, const zs_msg_ctx *ctx)
{
    (void)ctx;
    if (!m)
        return FAIL("Heartbeat: missing");
    /* Members send heartbeats to the coordinator, the coordinator (sender 0) to members;
     * zs_msg_check holds the field equal to the envelope's sender. */
    ZS_CHECK(need(m->has_sender, "Heartbeat.sender"));
    if (ctx && (ctx->self == ZS_MSG_SERVER || ctx->self == ZS_MSG_WORKER) && m->sender != 0)
        return FAIL("Heartbeat.sender: %" PRIu32 ": a %s takes heartbeats only from the "
                    "coordinator (0)",
                    m->sender, ctx->self == ZS_MSG_SERVER ? "server" : "worker");
    if (ctx && ctx->self == ZS_MSG_COORDINATOR)
        ZS_CHECK(id_ok("Heartbeat.sender", m->has_sender, m->sender));
    ZS_CHECK(need(m->has_step, "Heartbeat.step"));
    const Zshard__HeartbeatStats *s = m->stats;
    if (s && s->has_busy_seconds && !(s->busy_seconds >= 0 && isfinite(s->busy_seconds)))
        return FAIL("Heartbeat.stats.busy_seconds: %g is not a finite time >= 0", s->busy_seconds);
    for (size_t i = 0; i < m->n_chunks_in; i++) {
        if (ctx && ctx->chunks && m->chunks_in[i] >= ctx->chunks)
            return FAIL("Heartbeat.chunks_in[%zu]: %" PRIu32 " is not a chunk (the job has %" PRIu32
                        ")",
                        i, m->chunks_in[i], ctx->chunks);
        if (i > 0 && m->chunks_in[i] <= m->chunks_in[i - 1])
            return FAIL("Heartbeat.chunks_in: not strictly ascending at %zu", i);
    }
    return ZS_OK;
}

zs_err zs_msg_check_ready(const Zshard__Ready *m, const zs_msg_ctx *ctx)
{
    (void)ctx;
    if (!m)
        return FAIL("Ready: missing");
    switch (m->what_case) {
    case ZSHARD__READY__WHAT_DATA:
        if (!m->data)
            return FAIL("Ready.data: missing");
        ZS_CHECK(need(m->data->has_fingerprint, "Ready.data.fingerprint"));
        return need(m->data->has_ntokens, "Ready.data.ntokens");
    case ZSHARD__READY__WHAT_VERSION:
        return ZS_OK;
    case ZSHARD__READY__WHAT__NOT_SET:
        return FAIL("Ready: neither data nor version");
    default:
        return FAIL("Ready.what: case %d is not known", (int)m->what_case);
    }
}

zs_err zs_msg_check_step_assign(const Zshard__StepAssign *m, const zs_msg_ctx *ctx)
{
    if (!m)
        return FAIL("StepAssign: missing");
    ZS_CHECK(step_ok("StepAssign.step", m->has_step, m->step, ctx));
    ZS_CHECK(id_ok("StepAssign.worker", m->has_worker, m->worker));
    uint64_t chunks = ctx && ctx->chunks ? ctx->chunks : ZS_MSG_MAX_CHUNKS;
    if (m->n_chunks == 0)
        return FAIL("StepAssign.chunks: none");
    if (m->n_chunks > chunks)
        return FAIL("StepAssign.chunks: %zu, more than the %" PRIu64 " chunks of a step",
                    m->n_chunks, chunks);
    for (size_t i = 0; i < m->n_chunks; i++) {
        if (m->chunks[i] >= chunks)
            return FAIL("StepAssign.chunks[%zu]: %" PRIu32 ", a step has chunks 0..%" PRIu64, i,
                        m->chunks[i], chunks - 1);
        if (i > 0 && m->chunks[i] <= m->chunks[i - 1])
            return FAIL("StepAssign.chunks[%zu]: %" PRIu32 " after %" PRIu32 ": chunk indices "
                        "must be unique and ascending",
                        i, m->chunks[i], m->chunks[i - 1]);
    }
    ZS_CHECK(dbl_in("StepAssign.lr", m->has_lr, m->lr, 0, 10));
    return m->has_loss_scale ? pow2_in("StepAssign.loss_scale", 1, m->loss_scale, 0) : ZS_OK;
}

zs_err zs_msg_check_chunk_done(const Zshard__ChunkDone *m, const zs_msg_ctx *ctx)
{
    if (!m)
        return FAIL("ChunkDone: missing");
    ZS_CHECK(step_ok("ChunkDone.step", m->has_step, m->step, ctx));
    uint64_t chunks = ctx && ctx->chunks ? ctx->chunks : ZS_MSG_MAX_CHUNKS;
    if (!m->has_chunk)
        return FAIL("ChunkDone.chunk: missing");
    if (m->chunk >= chunks)
        return FAIL("ChunkDone.chunk: %" PRIu32 ", a step has chunks 0..%" PRIu64, m->chunk,
                    chunks - 1);
    ZS_CHECK(id_ok("ChunkDone.worker", m->has_worker, m->worker));
    /* Timings are optional; present, they are durations. */
    if (m->has_compute_ms)
        ZS_CHECK(dbl_in("ChunkDone.compute_ms", 1, m->compute_ms, 0, ZS_MSG_MAX_CHUNK_MS));
    if (m->has_fetch_wait_ms)
        ZS_CHECK(dbl_in("ChunkDone.fetch_wait_ms", 1, m->fetch_wait_ms, 0, ZS_MSG_MAX_CHUNK_MS));
    if (m->has_push_wait_ms)
        ZS_CHECK(dbl_in("ChunkDone.push_wait_ms", 1, m->push_wait_ms, 0, ZS_MSG_MAX_CHUNK_MS));
    /* Any value: a non-finite loss is news for the coordinator, not a malformed message. */
    return need(m->has_loss, "ChunkDone.loss");
}

zs_err zs_msg_check_grad_norm_partial(const Zshard__GradNormPartial *m, const zs_msg_ctx *ctx)
{
    if (!m)
        return FAIL("GradNormPartial: missing");
    ZS_CHECK(step_ok("GradNormPartial.step", m->has_step, m->step, ctx));
    ZS_CHECK(id_ok("GradNormPartial.server", m->has_server, m->server));
    ZS_CHECK(need(m->has_has_nonfinite, "GradNormPartial.has_nonfinite"));
    uint64_t shards = ctx && ctx->n_shards ? ctx->n_shards : ZS_MSG_MAX_SHARDS;
    if (m->n_partials == 0)
        return FAIL("GradNormPartial.partials: none (every server holds a shard)");
    if (m->n_partials > shards)
        return FAIL("GradNormPartial.partials: %zu, more than the %" PRIu64 " shards",
                    m->n_partials, shards);
    for (size_t i = 0; i < m->n_partials; i++) {
        const Zshard__ShardSumsq *p = m->partials[i];
        if (!p)
            return FAIL("GradNormPartial.partials[%zu]: missing", i);
        if (!p->has_shard)
            return FAIL("GradNormPartial.partials[%zu].shard: missing", i);
        if (p->shard >= shards)
            return FAIL("GradNormPartial.partials[%zu].shard: %" PRIu32 ", the map has shards "
                        "0..%" PRIu64,
                        i, p->shard, shards - 1);
        if (i > 0 && p->shard <= m->partials[i - 1]->shard)
            return FAIL("GradNormPartial.partials[%zu].shard: %" PRIu32 " after %" PRIu32
                        ": shards must be unique and in ascending order",
                        i, p->shard, m->partials[i - 1]->shard);
        if (!p->has_sumsq)
            return FAIL("GradNormPartial.partials[%zu].sumsq: missing", i);
        if (isfinite(p->sumsq) ? p->sumsq < 0 : !m->has_nonfinite)
            return FAIL("GradNormPartial.partials[%zu].sumsq: %g%s", i, p->sumsq,
                        isfinite(p->sumsq) ? " is negative"
                                           : " is not finite, but has_nonfinite is false");
    }
    return ZS_OK;
}

zs_err zs_msg_check_clip_verdict(const Zshard__ClipVerdict *m, const zs_msg_ctx *ctx)
{
    if (!m)
        return FAIL("ClipVerdict: missing");
    ZS_CHECK(step_ok("ClipVerdict.step", m->has_step, m->step, ctx));
    if (!m->has_clip_factor)
        return FAIL("ClipVerdict.clip_factor: missing");
    if (!(m->clip_factor > 0 && m->clip_factor <= 1))
        return FAIL("ClipVerdict.clip_factor: %g is outside (0, 1]", m->clip_factor);
    ZS_CHECK(need(m->has_skip, "ClipVerdict.skip"));
    if (!m->has_grad_norm)
        return FAIL("ClipVerdict.grad_norm: missing");
    if (isfinite(m->grad_norm) ? m->grad_norm < 0 : !m->skip)
        return FAIL("ClipVerdict.grad_norm: %g%s", m->grad_norm,
                    isfinite(m->grad_norm) ? " is negative" : " is not finite, but skip is false");
    if (m->has_loss_scale != m->has_optimizer_step)
        return FAIL("ClipVerdict: loss_scale and optimizer_step come together (fp16 jobs)");
    if (m->has_loss_scale) {
        ZS_CHECK(pow2_in("ClipVerdict.loss_scale", 1, m->loss_scale, 0));
        if (m->optimizer_step > m->step)
            return FAIL("ClipVerdict.optimizer_step: %" PRIu64 " is after step %" PRIu64,
                        m->optimizer_step, m->step);
    }
    return ZS_OK;
}

zs_err zs_msg_check_version_published(const Zshard__VersionPublished *m, const zs_msg_ctx *ctx)
{
    if (!m)
        return FAIL("VersionPublished: missing");
    ZS_CHECK(id_ok("VersionPublished.server", m->has_server, m->server));
    if (!m->has_version)
        return FAIL("VersionPublished.version: missing");
    if (ctx && ctx->steps && m->version > ctx->steps)
        return FAIL("VersionPublished.version: %" PRIu64 ", the job has versions 0..%" PRIu32,
                    m->version, ctx->steps);
    return ZS_OK;
}

zs_err zs_msg_check_error(const Zshard__Error *m, const zs_msg_ctx *ctx)
{
    (void)ctx;
    if (!m)
        return FAIL("Error: missing");
    ZS_CHECK(error_code_ok("Error.code", m->has_code, (int)m->code));
    return str_ok("Error.text", m->text, ZS_MSG_MAX_STRING, 0);
}

zs_err zs_msg_check_shutdown(const Zshard__Shutdown *m, const zs_msg_ctx *ctx)
{
    (void)ctx;
    if (!m)
        return FAIL("Shutdown: missing");
    if (!m->has_kind)
        return FAIL("Shutdown.kind: missing");
    if (m->kind < ZSHARD__SHUTDOWN_KIND__SHUTDOWN_DONE ||
        m->kind > ZSHARD__SHUTDOWN_KIND__SHUTDOWN_REJOIN)
        return FAIL("Shutdown.kind: %d is not a shutdown kind (1 done, 2 abort, 3 leaving, "
                    "4 rejoin)",
                    (int)m->kind);
    if (m->kind == ZSHARD__SHUTDOWN_KIND__SHUTDOWN_REJOIN && ctx && ctx->self == ZS_MSG_SERVER)
        return FAIL("Shutdown.kind: 4 (rejoin) is for workers");
    return str_ok("Shutdown.reason", m->reason, ZS_MSG_MAX_STRING, STR_EMPTY_OK);
}

zs_err zs_msg_check_checkpoint_written(const Zshard__CheckpointWritten *m, const zs_msg_ctx *ctx)
{
    if (!m)
        return FAIL("CheckpointWritten: missing");
    ZS_CHECK(need(m->has_step, "CheckpointWritten.step"));
    if (m->step < 1 || m->step > ZS_MSG_MAX_STEPS || (ctx && ctx->steps && m->step > ctx->steps))
        return FAIL("CheckpointWritten.step: %" PRIu64 " is not a version of this job", m->step);
    ZS_CHECK(id_ok("CheckpointWritten.server", m->has_server, m->server));
    if (m->error) {
        ZS_CHECK(str_ok("CheckpointWritten.error", m->error, ZS_MSG_MAX_STRING, 0));
        if (m->n_files)
            return FAIL("CheckpointWritten: %zu files and an error", m->n_files);
        return ZS_OK;
    }
    if (m->n_files < 1)
        return FAIL("CheckpointWritten.files: none, and no error");
    uint64_t shards = ctx && ctx->n_shards ? ctx->n_shards : ZS_MSG_MAX_SHARDS;
    if (m->n_files > shards)
        return FAIL("CheckpointWritten.files: %zu, more than the %" PRIu64 " shards", m->n_files,
                    shards);
    for (size_t i = 0; i < m->n_files; i++) {
        const Zshard__ShardFile *f = m->files[i];
        if (!f)
            return FAIL("CheckpointWritten.files[%zu]: missing", i);
        ZS_CHECK(u64_in("CheckpointWritten.files[].shard", f->has_shard, f->shard, 0, shards - 1));
        if (i > 0 && f->shard <= m->files[i - 1]->shard)
            return FAIL("CheckpointWritten.files[%zu].shard: %" PRIu32 " after %" PRIu32
                        ": not strictly ascending",
                        i, f->shard, m->files[i - 1]->shard);
        ZS_CHECK(str_ok("CheckpointWritten.files[].file", f->file, 63, STR_NAME));
        if (f->file[0] == '.')
            return FAIL("CheckpointWritten.files[%zu].file: \"%s\" starts with a dot", i, f->file);
        ZS_CHECK(need(f->has_bytes, "CheckpointWritten.files[].bytes"));
        ZS_CHECK(need(f->has_header_xxh3, "CheckpointWritten.files[].header_xxh3"));
        if (f->n_xxh3 != 3)
            return FAIL("CheckpointWritten.files[%zu].xxh3: %zu checksums, expected 3", i,
                        f->n_xxh3);
    }
    return ZS_OK;
}

zs_err zs_msg_check_member_gone(const Zshard__MemberGone *m, const zs_msg_ctx *ctx)
{
    (void)ctx;
    if (!m)
        return FAIL("MemberGone: missing");
    if (!m->has_member)
        return FAIL("MemberGone.member: missing");
    ZS_CHECK(id_ok("MemberGone.member", 1, m->member));
    return m->reason ? str_ok("MemberGone.reason", m->reason, ZS_MSG_MAX_STRING, STR_EMPTY_OK)
                     : ZS_OK;
}

zs_err zs_msg_check_restore(const Zshard__Restore *m, const zs_msg_ctx *ctx)
{
    if (!m)
        return FAIL("Restore: missing");
    ZS_CHECK(need(m->has_version, "Restore.version"));
    int memory = m->has_from_memory && m->from_memory;
    /* From memory the version may be the last (the final checkpoint written again); from a
     * checkpoint it is one the job continues from. */
    uint64_t last = ctx && ctx->steps ? ctx->steps - (memory ? 0 : 1) : ZS_MSG_MAX_STEPS;
    if (m->version > ZS_MSG_MAX_STEPS || m->version > last)
        return FAIL("Restore.version: %" PRIu64 " is not a version the job continues from",
                    m->version);
    ZS_CHECK(str_ok("Restore.step_dir", m->step_dir, ZS_MSG_MAX_STRING, STR_EMPTY_OK));
    if (memory && m->step_dir[0])
        return FAIL("Restore: from memory with step_dir \"%.80s\": a restore from memory reads "
                    "no checkpoint",
                    m->step_dir);
    if (!memory && (m->version == 0) != (m->step_dir[0] == '\0'))
        return FAIL("Restore: version %" PRIu64 " with step_dir \"%.80s\": a checkpoint names "
                    "both, the start neither",
                    m->version, m->step_dir);
    if (!memory && m->has_checkpoint && m->checkpoint)
        return FAIL("Restore.checkpoint: only a restore from memory writes a checkpoint again");
    return ZS_OK;
}

zs_err zs_msg_check_status_request(const Zshard__StatusRequest *m, const zs_msg_ctx *ctx)
{
    (void)ctx;
    return m ? ZS_OK : FAIL("StatusRequest: missing");
}

zs_err zs_msg_check_status_reply(const Zshard__StatusReply *m, const zs_msg_ctx *ctx)
{
    (void)ctx;
    if (!m)
        return FAIL("StatusReply: missing");
    ZS_CHECK(need(m->has_steps_done, "StatusReply.steps_done"));
    ZS_CHECK(need(m->has_steps, "StatusReply.steps"));
    if (m->steps > ZS_MSG_MAX_STEPS || m->steps_done > m->steps)
        return FAIL("StatusReply.steps_done: %" PRIu64 " of %" PRIu64 " steps", m->steps_done,
                    m->steps);
    ZS_CHECK(str_ok("StatusReply.phase", m->phase, 64, 0));
    if (m->has_tokens_per_sec && !(m->tokens_per_sec >= 0 && m->tokens_per_sec < 1e15))
        return FAIL("StatusReply.tokens_per_sec: %g", m->tokens_per_sec);
    if (m->n_members > 2 * (size_t)ZS_MSG_MAX_SERVERS + (1u << 16))
        return FAIL("StatusReply.members: %zu", m->n_members);
    for (size_t i = 0; i < m->n_members; i++) {
        const Zshard__MemberStatus *s = m->members[i];
        if (!s)
            return FAIL("StatusReply.members[%zu]: missing", i);
        ZS_CHECK(id_ok("StatusReply.members[].id", s->has_id, s->id));
        if (!s->has_role || s->role < ZSHARD__ROLE__ROLE_SERVER ||
            s->role > ZSHARD__ROLE__ROLE_CLIENT_TOOL)
            return FAIL("StatusReply.members[%zu].role: missing or not a role", i);
        if (!s->has_state || s->state < ZSHARD__MEMBER_STATE__MEMBER_JOINING ||
            s->state > ZSHARD__MEMBER_STATE__MEMBER_GONE)
            return FAIL("StatusReply.members[%zu].state: missing or not a state", i);
        if (s->reason)
            ZS_CHECK(
                str_ok("StatusReply.members[].reason", s->reason, ZS_MSG_MAX_STRING, STR_EMPTY_OK));
        if (s->endpoint)
            ZS_CHECK(str_ok("StatusReply.members[].endpoint", s->endpoint, ZS_MSG_MAX_ENDPOINT,
                            STR_EMPTY_OK));
        if (s->hostname)
            ZS_CHECK(str_ok("StatusReply.members[].hostname", s->hostname, ZS_MSG_MAX_HOSTNAME,
                            STR_EMPTY_OK));
        if (s->has_tokens_per_sec && !(s->tokens_per_sec >= 0 && s->tokens_per_sec < 1e15))
            return FAIL("StatusReply.members[%zu].tokens_per_sec: %g", i, s->tokens_per_sec);
        if (s->has_replica_of &&
            (s->role != ZSHARD__ROLE__ROLE_SERVER || s->replica_of == 0 || s->replica_of == s->id))
            return FAIL("StatusReply.members[%zu].replica_of: %u (a server holds another "
                        "server's replica)",
                        i, s->replica_of);
        if (s->has_replica_current && !s->has_replica_of)
            return FAIL("StatusReply.members[%zu].replica_current without replica_of", i);
    }
    if (m->has_last_checkpoint && m->last_checkpoint > m->steps)
        return FAIL("StatusReply.last_checkpoint: %" PRIu64 " of %" PRIu64 " steps",
                    m->last_checkpoint, m->steps);
    if (m->checkpoint_dir)
        ZS_CHECK(str_ok("StatusReply.checkpoint_dir", m->checkpoint_dir, ZS_MSG_MAX_STRING,
                        STR_EMPTY_OK));
    if (m->checkpoint_error)
        ZS_CHECK(str_ok("StatusReply.checkpoint_error", m->checkpoint_error, ZS_MSG_MAX_STRING,
                        STR_EMPTY_OK));
    return ZS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Envelopes.                                                                                  */

enum { TO_COORD = 1, TO_SERVER = 2, TO_WORKER = 4 };
enum { FROM_COORD = 1, FROM_PEER = 2, FROM_NEW = 4 }; /* FROM_NEW: sender 0, not registered */

/* Per body type: its name, who may receive it, who may send it, its size limit. */
static const struct {
    const char *name;
    int to, from;
    size_t max_bytes;
} bodies[BODY_LAST + 1] = {
    [ZSHARD__ENVELOPE__BODY_REGISTRATION] = {"Register", TO_COORD, FROM_NEW,
                                             ZS_MSG_MAX_SMALL_BYTES},
    [ZSHARD__ENVELOPE__BODY_REGISTRATION_REPLY] = {"RegisterReply", TO_SERVER | TO_WORKER,
                                                   FROM_COORD, ZS_MSG_MAX_SMALL_BYTES},
    [ZSHARD__ENVELOPE__BODY_JOB_SPEC] = {"JobSpec", TO_SERVER | TO_WORKER, FROM_COORD,
                                         ZS_MSG_MAX_BYTES},
    [ZSHARD__ENVELOPE__BODY_SHARD_MAP] = {"ShardMap", TO_SERVER | TO_WORKER, FROM_COORD,
                                          ZS_MSG_MAX_BYTES},
    [ZSHARD__ENVELOPE__BODY_HEARTBEAT] = {"Heartbeat", TO_COORD | TO_SERVER | TO_WORKER,
                                          FROM_PEER | FROM_COORD, ZS_MSG_MAX_SMALL_BYTES},
    [ZSHARD__ENVELOPE__BODY_READY] = {"Ready", TO_COORD, FROM_PEER, ZS_MSG_MAX_SMALL_BYTES},
    [ZSHARD__ENVELOPE__BODY_STEP_ASSIGN] = {"StepAssign", TO_SERVER | TO_WORKER, FROM_COORD,
                                            ZS_MSG_MAX_BYTES},
    [ZSHARD__ENVELOPE__BODY_CHUNK_DONE] = {"ChunkDone", TO_COORD, FROM_PEER,
                                           ZS_MSG_MAX_SMALL_BYTES},
    [ZSHARD__ENVELOPE__BODY_GRAD_NORM_PARTIAL] = {"GradNormPartial", TO_COORD, FROM_PEER,
                                                  ZS_MSG_MAX_PARTIAL_BYTES},
    [ZSHARD__ENVELOPE__BODY_CLIP_VERDICT] = {"ClipVerdict", TO_SERVER, FROM_COORD,
                                             ZS_MSG_MAX_SMALL_BYTES},
    [ZSHARD__ENVELOPE__BODY_VERSION_PUBLISHED] = {"VersionPublished", TO_COORD, FROM_PEER,
                                                  ZS_MSG_MAX_SMALL_BYTES},
    [ZSHARD__ENVELOPE__BODY_ERROR] = {"Error", TO_COORD | TO_SERVER | TO_WORKER,
                                      FROM_COORD | FROM_PEER | FROM_NEW, ZS_MSG_MAX_SMALL_BYTES},
    [ZSHARD__ENVELOPE__BODY_SHUTDOWN] = {"Shutdown", TO_COORD | TO_SERVER | TO_WORKER,
                                         FROM_COORD | FROM_PEER, ZS_MSG_MAX_SMALL_BYTES},
    [ZSHARD__ENVELOPE__BODY_STATUS_REQUEST] = {"StatusRequest", TO_COORD, FROM_NEW | FROM_PEER,
                                               ZS_MSG_MAX_SMALL_BYTES},
    [ZSHARD__ENVELOPE__BODY_STATUS_REPLY] = {"StatusReply", TO_WORKER, FROM_COORD,
                                             ZS_MSG_MAX_BYTES},
    [ZSHARD__ENVELOPE__BODY_CHECKPOINT_WRITTEN] = {"CheckpointWritten", TO_COORD, FROM_PEER,
                                                   ZS_MSG_MAX_PARTIAL_BYTES},
    [ZSHARD__ENVELOPE__BODY_RESTORE] = {"Restore", TO_SERVER, FROM_COORD, ZS_MSG_MAX_SMALL_BYTES},
    [ZSHARD__ENVELOPE__BODY_MEMBER_GONE] = {"MemberGone", TO_SERVER, FROM_COORD,
                                            ZS_MSG_MAX_SMALL_BYTES},
};

static int body_known(unsigned body)
{
    return body >= BODY_FIRST && body <= BODY_LAST;
}

const char *zs_msg_body_name(Zshard__Envelope__BodyCase body)
{
    if (body == ZSHARD__ENVELOPE__BODY__NOT_SET)
        return "none";
    return body_known((unsigned)body) ? bodies[body].name : "unknown";
}

/* Whether the receiver takes this body type; ZS_OK or the refusal. */
static zs_err body_accepted(unsigned body, const zs_msg_ctx *ctx)
{
    zs_msg_self self = ctx ? ctx->self : ZS_MSG_ANY;
    int to = self == ZS_MSG_COORDINATOR ? TO_COORD
             : self == ZS_MSG_SERVER    ? TO_SERVER
             : self == ZS_MSG_WORKER    ? TO_WORKER
                                        : 0;
    if (to && !(bodies[body].to & to))
        return FAIL("Envelope: a %s does not take %s messages", self_name(ctx), bodies[body].name);
    return ZS_OK;
}

/* The id a peer's body names as its sender, if the body has one. */
static int body_sender(const Zshard__Envelope *env, const char **field, uint32_t *id)
{
    switch (env->body_case) {
    case ZSHARD__ENVELOPE__BODY_HEARTBEAT:
        *field = "Heartbeat.sender";
        *id = env->heartbeat->sender;
        return 1;
    case ZSHARD__ENVELOPE__BODY_CHUNK_DONE:
        *field = "ChunkDone.worker";
        *id = env->chunk_done->worker;
        return 1;
    case ZSHARD__ENVELOPE__BODY_GRAD_NORM_PARTIAL:
        *field = "GradNormPartial.server";
        *id = env->grad_norm_partial->server;
        return 1;
    case ZSHARD__ENVELOPE__BODY_VERSION_PUBLISHED:
        *field = "VersionPublished.server";
        *id = env->version_published->server;
        return 1;
    case ZSHARD__ENVELOPE__BODY_CHECKPOINT_WRITTEN:
        *field = "CheckpointWritten.server";
        *id = env->checkpoint_written->server;
        return 1;
    default:
        return 0;
    }
}

static zs_err check_body(const Zshard__Envelope *env, const zs_msg_ctx *ctx)
{
    switch (env->body_case) {
    case ZSHARD__ENVELOPE__BODY_REGISTRATION:
        return zs_msg_check_register(env->registration, ctx);
    case ZSHARD__ENVELOPE__BODY_REGISTRATION_REPLY:
        return zs_msg_check_register_reply(env->registration_reply, ctx);
    case ZSHARD__ENVELOPE__BODY_JOB_SPEC:
        return zs_msg_check_job_spec(env->job_spec, ctx);
    case ZSHARD__ENVELOPE__BODY_SHARD_MAP:
        return zs_msg_check_shard_map(env->shard_map, ctx);
    case ZSHARD__ENVELOPE__BODY_HEARTBEAT:
        return zs_msg_check_heartbeat(env->heartbeat, ctx);
    case ZSHARD__ENVELOPE__BODY_READY:
        return zs_msg_check_ready(env->ready, ctx);
    case ZSHARD__ENVELOPE__BODY_STEP_ASSIGN:
        return zs_msg_check_step_assign(env->step_assign, ctx);
    case ZSHARD__ENVELOPE__BODY_CHUNK_DONE:
        return zs_msg_check_chunk_done(env->chunk_done, ctx);
    case ZSHARD__ENVELOPE__BODY_GRAD_NORM_PARTIAL:
        return zs_msg_check_grad_norm_partial(env->grad_norm_partial, ctx);
    case ZSHARD__ENVELOPE__BODY_CLIP_VERDICT:
        return zs_msg_check_clip_verdict(env->clip_verdict, ctx);
    case ZSHARD__ENVELOPE__BODY_VERSION_PUBLISHED:
        return zs_msg_check_version_published(env->version_published, ctx);
    case ZSHARD__ENVELOPE__BODY_ERROR:
        return zs_msg_check_error(env->error, ctx);
    case ZSHARD__ENVELOPE__BODY_SHUTDOWN:
        return zs_msg_check_shutdown(env->shutdown, ctx);
    case ZSHARD__ENVELOPE__BODY_STATUS_REQUEST:
        return zs_msg_check_status_request(env->status_request, ctx);
    case ZSHARD__ENVELOPE__BODY_STATUS_REPLY:
        return zs_msg_check_status_reply(env->status_reply, ctx);
    case ZSHARD__ENVELOPE__BODY_CHECKPOINT_WRITTEN:
        return zs_msg_check_checkpoint_written(env->checkpoint_written, ctx);
    case ZSHARD__ENVELOPE__BODY_RESTORE:
        return zs_msg_check_restore(env->restore, ctx);
    case ZSHARD__ENVELOPE__BODY_MEMBER_GONE:
        return zs_msg_check_member_gone(env->member_gone, ctx);
    default:
        return FAIL("Envelope: no body");
    }
}

zs_err zs_msg_check(const Zshard__Envelope *env, const zs_msg_ctx *ctx)
{
    if (!env)
        return FAIL("Envelope: missing");
    ZS_CHECK(version_ok("Envelope.protocol_version", env->has_protocol_version,
                        env->protocol_version, ctx));
    ZS_CHECK(need(env->has_sender, "Envelope.sender"));
    unsigned body = (unsigned)env->body_case;
    if (!body_known(body))
        return FAIL("Envelope: no body");
    ZS_CHECK(body_accepted(body, ctx));
    ZS_CHECK(check_body(env, ctx));

    const char *name = bodies[body].name;
    int from = bodies[body].from;
    uint32_t sender = env->sender;
    if (sender == 0 && !(from & (FROM_COORD | FROM_NEW)))
        return FAIL("Envelope.sender: 0, but %s comes from a registered peer", name);
    if (sender != 0 && !(from & FROM_PEER))
        return FAIL("Envelope.sender: %" PRIu32 ", but %s comes from %s (sender 0)", sender, name,
                    from & FROM_NEW ? "a peer not registered yet" : "the coordinator");
    if (env->body_case == ZSHARD__ENVELOPE__BODY_SHUTDOWN) {
        int leaving = env->shutdown->kind == ZSHARD__SHUTDOWN_KIND__SHUTDOWN_LEAVING;
        if (leaving == (sender == 0))
            return FAIL("Shutdown.kind: %d from sender %" PRIu32 ": peers send LEAVING, the "
                        "coordinator DONE or ABORT",
                        (int)env->shutdown->kind, sender);
    }
    const char *field;
    uint32_t id;
    if (body_sender(env, &field, &id) && id != sender)
        return FAIL("%s: %" PRIu32 ", but the envelope's sender is %" PRIu32, field, id, sender);
    return ZS_OK;
}

zs_err zs_msg_decode(const void *bytes, size_t len, const zs_msg_ctx *ctx, Zshard__Envelope **out)
{
    *out = NULL;
    if (!bytes || len == 0)
        return FAIL("Envelope: empty message");
    if (len > ZS_MSG_MAX_BYTES)
        return FAIL("Envelope: %zu bytes, more than the limit of %zu", len, ZS_MSG_MAX_BYTES);

    /* Pass 1: the version first, even from a message that goes on to be malformed. */
    envelope_peek pk;
    peek(bytes, len, &pk);
    if (pk.has_version && pk.version != ZS_PROTOCOL_VERSION)
        return version_ok("Envelope.protocol_version", 1, pk.version, ctx);
    if (!pk.complete)
        return FAIL("Envelope: %zu bytes, malformed at byte %zu: not a zshard message", len,
                    pk.bad_at);
    if (!pk.has_version)
        return FAIL("Envelope.protocol_version: missing");
    if (pk.bodies == 0)
        return FAIL("Envelope: no body");
    if (pk.bodies > 1)
        return FAIL("Envelope: %d bodies (%s, ..., %s), expected one", pk.bodies,
                    bodies[pk.first_body].name, bodies[pk.body].name);
    ZS_CHECK(body_accepted(pk.body, ctx));
    if (len > bodies[pk.body].max_bytes)
        return FAIL("Envelope: %s of %zu bytes, more than the limit of %zu for its type",
                    bodies[pk.body].name, len, bodies[pk.body].max_bytes);

    /* Pass 2. */
    Zshard__Envelope *env = zshard__envelope__unpack(NULL, len, bytes);
    if (!env)
        return FAIL("Envelope: %zu bytes do not decode as a zshard.Envelope with a %s body", len,
                    bodies[pk.body].name);
    /* Pass 3, then 4. */
    zs_err res = scan(bytes, len, &zshard__envelope__descriptor, "Envelope", 0);
    if (res == ZS_OK)
        res = zs_msg_check(env, ctx);
    if (res != ZS_OK) {
        zs_msg_free(env);
        return res;
    }
    *out = env;
    return ZS_OK;
}

void zs_msg_envelope_init(Zshard__Envelope *env, uint32_t sender)
{
    zshard__envelope__init(env);
    env->has_protocol_version = 1;
    env->protocol_version = ZS_PROTOCOL_VERSION;
    env->has_sender = 1;
    env->sender = sender;
}

zs_err zs_msg_encode(const Zshard__Envelope *env, uint8_t **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    ZS_CHECK(zs_msg_check(env, NULL));
    size_t n = zshard__envelope__get_packed_size(env);
    size_t limit = bodies[env->body_case].max_bytes;
    if (n > limit)
        return zs_error(ZS_ERR_INVALID,
                        "Envelope: %s of %zu bytes, more than the limit of %zu "
                        "for its type",
                        bodies[env->body_case].name, n, limit);
    uint8_t *buf = malloc(n);
    if (!buf)
        return zs_error(ZS_ERR_NOMEM, "Envelope: out of memory for %zu bytes", n);
    size_t packed = zshard__envelope__pack(env, buf);
    if (packed != n) {
        free(buf);
        return zs_error(ZS_ERR_INTERNAL, "Envelope: packed %zu bytes, expected %zu", packed, n);
    }
    *out = buf;
    *len = n;
    return ZS_OK;
}

void zs_msg_free(Zshard__Envelope *env)
{
    if (env)
        zshard__envelope__free_unpacked(env, NULL);
}

Zshard__ErrorCode zs_msg_refusal_code(const void *bytes, size_t len)
{
    uint32_t v;
    if (bytes && zs_msg_peek_version(bytes, len > ZS_MSG_MAX_BYTES ? ZS_MSG_MAX_BYTES : len, &v) &&
        v != ZS_PROTOCOL_VERSION)
        return ZSHARD__ERROR_CODE__ERROR_PROTOCOL_VERSION;
    return ZSHARD__ERROR_CODE__ERROR_MALFORMED;
}

zs_err zs_msg_encode_error(uint32_t sender, Zshard__ErrorCode code, const char *text, uint8_t **out,
                           size_t *len)
{
    *out = NULL;
    *len = 0;
    char buf[ZS_MSG_MAX_STRING + 1];
    if (!text || !*text) {
        const ProtobufCEnumValue *ev =
            protobuf_c_enum_descriptor_get_value(&zshard__error_code__descriptor, (int)code);
        text = ev ? ev->name : "error";
    }
    snprintf(buf, sizeof buf, "%s", text);
    Zshard__Envelope env;
    Zshard__Error er;
    zs_msg_envelope_init(&env, sender);
    zshard__error__init(&er);
    er.has_code = 1;
    er.code = code;
    er.text = buf;
    env.body_case = ZSHARD__ENVELOPE__BODY_ERROR;
    env.error = &er;
    return zs_msg_encode(&env, out, len);
}

/* ------------------------------------------------------------------------------------------ */
/* JobSpec <-> zs_config + zs_tensor_table.                                                    */

/* zs_sched_type <-> ScheduleType: the proto's values are ours + 1 (0 is UNSPECIFIED). */
static Zshard__ScheduleType sched_to_proto(zs_sched_type t)
{
    return (Zshard__ScheduleType)((int)t + 1);
}

static zs_sched_type sched_from_proto(Zshard__ScheduleType t)
{
    return (zs_sched_type)((int)t - 1);
}

zs_err zs_msg_jobspec_from_config(const zs_config *cfg, const zs_tensor_table *tt,
                                  const zs_msg_job *job, Zshard__JobSpec **out)
{
    *out = NULL;
    Zshard__JobSpec *m = malloc(sizeof *m);
    if (!m)
        return zs_error(ZS_ERR_NOMEM, "JobSpec: out of memory");
    zshard__job_spec__init(m);
    zs_err res = ZS_OK;

    Zshard__ModelConfig *mc = m->model = malloc(sizeof *mc);
    Zshard__AdamW *a = m->adamw = malloc(sizeof *a);
    Zshard__Schedule *s = m->schedule = malloc(sizeof *s);
    Zshard__BatchGeometry *b = m->batch = malloc(sizeof *b);
    Zshard__Cluster *c = m->cluster = malloc(sizeof *c);
    Zshard__DataSpec *d = m->data = malloc(sizeof *d);
    Zshard__Elasticity *e = m->elasticity = malloc(sizeof *e);
    Zshard__CheckpointSpec *k = m->checkpoint = malloc(sizeof *k);
    Zshard__Offload *o = m->offload = malloc(sizeof *o);
    if (k)
        zshard__checkpoint_spec__init(k);
    if (o)
        zshard__offload__init(o);
    if (mc)
        zshard__model_config__init(mc);
    if (a)
        zshard__adam_w__init(a);
    if (s)
        zshard__schedule__init(s);
    if (b)
        zshard__batch_geometry__init(b);
    if (c)
        zshard__cluster__init(c);
    if (d)
        zshard__data_spec__init(d);
    if (e)
        zshard__elasticity__init(e);
    if (!mc || !a || !s || !b || !c || !d || !e || !k || !o)
        goto nomem;
    o->nvme_path = strdup(cfg->zero.optimizer == ZS_OFFLOAD_NVME ? cfg->zero.nvme_path : "");
    if (!o->nvme_path)
        goto nomem;
    o->has_optimizer_device = o->has_aio_block_size = o->has_aio_queue_depth = 1;
    o->has_server_memory_bytes = o->has_param_on_nvme = o->has_param_buffers = 1;
    o->param_on_nvme = cfg->zero.param == ZS_OFFLOAD_NVME;
    o->param_buffers = (uint32_t)cfg->zero.param_buffers;
    o->optimizer_device = (uint32_t)cfg->zero.optimizer;
    o->aio_block_size = cfg->aio.block_size;
    o->aio_queue_depth = (uint32_t)cfg->aio.queue_depth;
    o->server_memory_bytes = cfg->cluster.server_memory_bytes;

    *mc = (Zshard__ModelConfig){
        .base = mc->base,
        .has_n_layer = 1,
        .n_layer = (uint32_t)cfg->model.n_layer,
        .has_n_head = 1,
        .n_head = (uint32_t)cfg->model.n_head,
        .has_n_embd = 1,
        .n_embd = (uint32_t)cfg->model.n_embd,
        .has_vocab_size = 1,
        .vocab_size = (uint32_t)cfg->model.vocab_size,
        .has_block_size = 1,
        .block_size = (uint32_t)cfg->model.block_size,
    };
    *a = (Zshard__AdamW){
        .base = a->base,
        .has_lr = 1,
        .lr = cfg->adamw.lr,
        .has_beta1 = 1,
        .beta1 = cfg->adamw.beta1,
        .has_beta2 = 1,
        .beta2 = cfg->adamw.beta2,
        .has_eps = 1,
        .eps = cfg->adamw.eps,
        .has_weight_decay = 1,
        .weight_decay = cfg->adamw.weight_decay,
    };
    *s = (Zshard__Schedule){
        .base = s->base,
        .has_type = 1,
        .type = sched_to_proto(cfg->sched.type),
        .has_warmup_min_lr = 1,
        .warmup_min_lr = cfg->sched.warmup_min_lr,
        .has_warmup_max_lr = 1,
        .warmup_max_lr = cfg->sched.warmup_max_lr,
        .has_warmup_num_steps = 1,
        .warmup_num_steps = (uint32_t)cfg->sched.warmup_num_steps,
        .has_warmup_linear = 1,
        .warmup_linear = cfg->sched.warmup_linear != 0,
        .has_total_num_steps = 1,
        .total_num_steps = (uint32_t)cfg->sched.total_num_steps,
        .has_warmup_min_ratio = 1,
        .warmup_min_ratio = cfg->sched.warmup_min_ratio,
        .has_cos_min_ratio = 1,
        .cos_min_ratio = cfg->sched.cos_min_ratio,
    };
    *b = (Zshard__BatchGeometry){
        .base = b->base,
        .has_train_batch_size = 1,
        .train_batch_size = (uint32_t)cfg->train_batch_size,
        .has_micro_batch = 1,
        .micro_batch = (uint32_t)cfg->micro_batch,
        .has_chunks = 1,
        .chunks = (uint32_t)cfg->chunks,
    };
    *c = (Zshard__Cluster){
        .base = c->base,
        .has_shard_bytes = 1,
        .shard_bytes = cfg->cluster.shard_bytes,
        .has_heartbeat_interval_ms = 1,
        .heartbeat_interval_ms = (uint32_t)cfg->cluster.heartbeat_interval_ms,
        .has_heartbeat_timeout_ms = 1,
        .heartbeat_timeout_ms = (uint32_t)cfg->cluster.heartbeat_timeout_ms,
        .has_coordinator_timeout_ms = 1,
        .coordinator_timeout_ms = (uint32_t)cfg->cluster.coordinator_timeout_ms,
        .has_transport = 1,
        .transport = (uint32_t)cfg->cluster.transport,
        .rdma_device = strdup(cfg->cluster.rdma_device),
        .has_rdma_port = 1,
        .rdma_port = (uint32_t)cfg->cluster.rdma_port,
        .has_rdma_gid_index = 1,
        .rdma_gid_index = cfg->cluster.rdma_gid_index,
    };
    if (!c->rdma_device)
        goto nomem;
    *e = (Zshard__Elasticity){
        .base = e->base,
        .has_enabled = 1,
        .enabled = cfg->elasticity.enabled != 0,
        .has_min_workers = 1,
        .min_workers = (uint32_t)cfg->elasticity.min_workers,
        .has_max_workers = 1,
        .max_workers = (uint32_t)cfg->elasticity.max_workers,
    };
    d->path = strdup(job->data_path);
    if (!d->path)
        goto nomem;
    d->has_fingerprint = 1;
    d->fingerprint = job->data_fingerprint;
    d->has_ntokens = 1;
    d->ntokens = job->data_ntokens;

    m->has_total_floats = 1;
    m->total_floats = tt->total;
    m->has_gradient_clipping = 1;
    m->gradient_clipping = cfg->gradient_clipping;
    m->has_seed = 1;
    m->seed = cfg->seed;
    m->has_bf16 = 1;
    m->bf16 = cfg->bf16 != 0;
    if (cfg->fp16.enabled) {
        Zshard__Fp16 *f = m->fp16 = malloc(sizeof *f);
        if (!f)
            goto nomem;
        zshard__fp16__init(f);
        const zs_fp16_config *fc = &cfg->fp16;
        f->has_loss_scale = f->has_initial_scale_power = f->has_loss_scale_window = 1;
        f->has_hysteresis = f->has_min_loss_scale = f->has_consecutive_hysteresis = 1;
        f->loss_scale = fc->loss_scale;
        f->initial_scale_power = (uint32_t)fc->initial_scale_power;
        f->loss_scale_window = (uint32_t)fc->loss_scale_window;
        f->hysteresis = (uint32_t)fc->hysteresis;
        f->min_loss_scale = fc->min_loss_scale;
        f->consecutive_hysteresis = fc->consecutive_hysteresis != 0;
    }
    m->has_steps = 1;
    m->steps = job->steps;
    m->has_steps_per_print = 1;
    m->steps_per_print = (uint32_t)cfg->steps_per_print;
    k->dir = strdup(cfg->checkpoint.dir);
    if (!k->dir)
        goto nomem;
    k->has_interval_steps = k->has_replicas = 1;
    k->interval_steps = (uint32_t)cfg->checkpoint.interval_steps;
    k->replicas = (uint32_t)cfg->checkpoint.replicas;
    m->has_run_id = m->has_config_fingerprint = 1;
    m->run_id = job->run_id;
    m->config_fingerprint = job->config_fingerprint;
    if (job->resume_step > 0) {
        Zshard__ResumeSpec *r = m->resume = malloc(sizeof *r);
        if (!r)
            goto nomem;
        zshard__resume_spec__init(r);
        r->has_step = 1;
        r->step = (uint64_t)job->resume_step;
        if (!(r->step_dir = strdup(job->resume_dir)))
            goto nomem;
    }

    if (tt->count > 0) {
        m->tensors = calloc((size_t)tt->count, sizeof *m->tensors);
        if (!m->tensors)
            goto nomem;
    }
    for (int i = 0; i < tt->count; i++) {
        const zs_tensor *t = &tt->tensors[i];
        Zshard__TensorEntry *te = malloc(sizeof *te);
        if (!te)
            goto nomem;
        zshard__tensor_entry__init(te);
        m->tensors[m->n_tensors++] = te;
        te->name = strdup(t->name);
        te->shape = malloc((size_t)t->ndim * sizeof *te->shape);
        if (!te->name || !te->shape)
            goto nomem;
        te->n_shape = (size_t)t->ndim;
        for (int k = 0; k < t->ndim; k++)
            te->shape[k] = t->shape[k];
        te->has_offset = 1;
        te->offset = t->offset;
        te->has_decay = 1;
        te->decay = t->decay != 0;
    }
    res = zs_msg_check_job_spec(m, NULL);
    if (res != ZS_OK) {
        zs_msg_jobspec_free(m);
        return zs_error_context(ZS_ERR_INVALID, "building a job spec");
    }
    *out = m;
    return ZS_OK;
nomem:
    zs_msg_jobspec_free(m);
    return zs_error(ZS_ERR_NOMEM, "JobSpec: out of memory for %d tensors", tt->count);
}

zs_err zs_msg_jobspec_to_config(const Zshard__JobSpec *m, zs_config *cfg, zs_tensor_table *tt,
                                zs_msg_job *job)
{
    memset(tt, 0, sizeof *tt);
    ZS_CHECK(zs_msg_check_job_spec(m, NULL));
    zs_config_defaults(cfg);
    cfg->model = (zs_model_config){
        .n_layer = (int)m->model->n_layer,
        .n_head = (int)m->model->n_head,
        .n_embd = (int)m->model->n_embd,
        .vocab_size = (int)m->model->vocab_size,
        .block_size = (int)m->model->block_size,
    };
    cfg->seed = m->seed;
    cfg->train_batch_size = (int)m->batch->train_batch_size;
    cfg->micro_batch = (int)m->batch->micro_batch;
    cfg->chunks = (int)m->batch->chunks;
    cfg->adamw = (zs_adamw_config){
        .lr = m->adamw->lr,
        .beta1 = m->adamw->beta1,
        .beta2 = m->adamw->beta2,
        .eps = m->adamw->eps,
        .weight_decay = m->adamw->weight_decay,
    };
    cfg->sched = (zs_schedule){
        .type = sched_from_proto(m->schedule->type),
        .warmup_min_lr = m->schedule->warmup_min_lr,
        .warmup_max_lr = m->schedule->warmup_max_lr,
        .warmup_num_steps = (int)m->schedule->warmup_num_steps,
        .warmup_linear = m->schedule->warmup_linear != 0,
        .total_num_steps = (int)m->schedule->total_num_steps,
        .warmup_min_ratio = m->schedule->warmup_min_ratio,
        .cos_min_ratio = m->schedule->cos_min_ratio,
    };
    cfg->gradient_clipping = m->gradient_clipping;
    cfg->bf16 = m->bf16 != 0;
    if (m->fp16)
        cfg->fp16 = (zs_fp16_config){
            .enabled = 1,
            .loss_scale = m->fp16->loss_scale,
            .initial_scale_power = (int)m->fp16->initial_scale_power,
            .loss_scale_window = (int)m->fp16->loss_scale_window,
            .hysteresis = (int)m->fp16->hysteresis,
            .min_loss_scale = m->fp16->min_loss_scale,
            .consecutive_hysteresis = m->fp16->consecutive_hysteresis != 0,
        };
    else
        cfg->fp16 = (zs_fp16_config){.enabled = 0};
    cfg->steps_per_print = (int)m->steps_per_print;
    cfg->cluster = (zs_cluster_config){
        .shard_bytes = (size_t)m->cluster->shard_bytes,
        .heartbeat_interval_ms = (int)m->cluster->heartbeat_interval_ms,
        .heartbeat_timeout_ms = (int)m->cluster->heartbeat_timeout_ms,
        .coordinator_timeout_ms = (int)m->cluster->coordinator_timeout_ms,
        .transport = m->cluster->has_transport ? (zs_transport_kind)m->cluster->transport
                                               : ZS_TRANSPORT_AUTO,
        .rdma_port = m->cluster->has_rdma_port ? (int)m->cluster->rdma_port : 1,
        .rdma_gid_index = m->cluster->has_rdma_gid_index ? m->cluster->rdma_gid_index : -1,
    };
    snprintf(cfg->cluster.rdma_device, sizeof cfg->cluster.rdma_device, "%s",
             m->cluster->rdma_device ? m->cluster->rdma_device : "");
    cfg->elasticity = (zs_elastic_config){
        .enabled = m->elasticity->enabled != 0,
        .min_workers = (int)m->elasticity->min_workers,
        .max_workers = (int)m->elasticity->max_workers,
    };
    snprintf(cfg->checkpoint.dir, sizeof cfg->checkpoint.dir, "%s", m->checkpoint->dir);
    cfg->checkpoint.interval_steps = (int)m->checkpoint->interval_steps;
    cfg->checkpoint.replicas = (int)m->checkpoint->replicas;
    cfg->zero.optimizer = (zs_offload_device)m->offload->optimizer_device;
    snprintf(cfg->zero.nvme_path, sizeof cfg->zero.nvme_path, "%s", m->offload->nvme_path);
    cfg->aio.block_size = (size_t)m->offload->aio_block_size;
    cfg->aio.queue_depth = (int)m->offload->aio_queue_depth;
    cfg->cluster.server_memory_bytes = m->offload->server_memory_bytes;
    cfg->zero.param = m->offload->param_on_nvme ? ZS_OFFLOAD_NVME : ZS_OFFLOAD_NONE;
    cfg->zero.param_buffers = (int)m->offload->param_buffers;

    /* The table is this build's layout for the model; the message's must be the same. */
    ZS_CHECK(zs_tensors_gpt2(&cfg->model, tt));
    zs_err res = ZS_OK;
    if ((size_t)tt->count != m->n_tensors) {
        res = FAIL("JobSpec.tensors: %zu entries, but this build lays the model out in %d",
                   m->n_tensors, tt->count);
        goto fail;
    }
    for (int i = 0; i < tt->count; i++) {
        const zs_tensor *t = &tt->tensors[i];
        const Zshard__TensorEntry *te = m->tensors[i];
        int same_shape = te->n_shape == (size_t)t->ndim;
        for (int k = 0; same_shape && k < t->ndim; k++)
            same_shape = te->shape[k] == t->shape[k];
        if (strcmp(te->name, t->name) != 0)
            res = FAIL("JobSpec.tensors[%d].name: \"%s\", this build has \"%s\" there", i, te->name,
                       t->name);
        else if (te->offset != t->offset)
            res = FAIL("JobSpec.tensors[%d].offset: %" PRIu64 ", this build lays %s out at %zu", i,
                       te->offset, t->name, t->offset);
        else if (!same_shape)
            res = FAIL("JobSpec.tensors[%d].shape: %zu dims [%" PRIu64 ", ...], this build's %s "
                       "is [%zu, %zu]",
                       i, te->n_shape, te->shape[0], t->name, t->shape[0], t->shape[1]);
        else if ((te->decay != 0) != (t->decay != 0))
            res = FAIL("JobSpec.tensors[%d].decay: %d, this build's %s has %d", i, (int)te->decay,
                       t->name, t->decay);
        if (res != ZS_OK)
            goto fail;
    }
    if (tt->total != m->total_floats) {
        res = FAIL("JobSpec.total_floats: %" PRIu64 ", this build's layout has %zu",
                   m->total_floats, tt->total);
        goto fail;
    }
    if (job) {
        memset(job, 0, sizeof *job);
        snprintf(job->data_path, sizeof job->data_path, "%s", m->data->path);
        job->data_fingerprint = m->data->fingerprint;
        job->data_ntokens = m->data->ntokens;
        job->steps = m->steps;
        job->run_id = m->run_id;
        job->config_fingerprint = m->config_fingerprint;
        if (m->resume) {
            job->resume_step = (long)m->resume->step;
            snprintf(job->resume_dir, sizeof job->resume_dir, "%s", m->resume->step_dir);
        }
    }
    return ZS_OK;
fail:
    zs_tensors_free(tt);
    return res;
}

void zs_msg_jobspec_free(Zshard__JobSpec *m)
{
    if (m)
        zshard__job_spec__free_unpacked(m, NULL);
}
