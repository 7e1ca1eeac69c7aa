/*
 * messages: decoding, validation and encoding of the control-plane messages (proto/zshard.proto)
 * and the conversion of a job's config and tensor table to and from a JobSpec.
 *
 * Every ZeroMQ message is one zshard.Envelope.  Invariant: an envelope that zs_msg_decode()
 * returned ZS_OK for has our protocol version, exactly one body that the receiver accepts,
 * no unknown fields, no string with a NUL byte, and passes the check of its body type below
 * (every field present, enums in range, counts and ranges consistent); a handler can use it
 * without further checks of its own shape.  What a message means for the receiver's state
 * (is this step current, does this sender exist) is the handler's to check.
 *
 * Each body type has its own zs_msg_check_<type>() so that handlers, tests and the fuzzer
 * (tests/fuzz/fuzz_proto.c) can run them one by one.  A failure returns ZS_ERR_FORMAT with a
 * message that names the message type, the field and the value:
 *   "ShardMap.shards[3].begin: 4096, expected 2048 (the end of shard 2): shards must be
 *    contiguous"
 *   "Envelope.protocol_version: protocol version 3, this coordinator speaks 2"
 *
 * Messages built here (zs_msg_jobspec_from_config) and messages decoded by protobuf-c are
 * both freed with the matching zs_msg_*_free(): everything is allocated with malloc.
 */
#ifndef ZS_MESSAGES_H
#define ZS_MESSAGES_H

#include <stddef.h>
#include <stdint.h>

#include "common/config.h"
#include "common/err.h"
#include "common/secret.h"
#include "common/shardmap.h"
#include "common/tensors.h"
#include "proto/zshard.pb-c.h"

/* The control-plane protocol version: peers must speak exactly this one. */
#define ZS_PROTOCOL_VERSION 7

/*
 * Size limits, checked before protobuf-c allocates anything.  JobSpec, ShardMap and
 * StepAssign grow with the model or the batch and may use the whole ZS_MSG_MAX_BYTES (only
 * the coordinator sends them, and a coordinator refuses them unread); GradNormPartial grows
 * with the shards of one server; every other body is small, and holding it to
 * ZS_MSG_MAX_SMALL_BYTES bounds what a stranger's bytes can make a receiver allocate.
 */
#define ZS_MSG_MAX_BYTES ((size_t)16 << 20)
#define ZS_MSG_MAX_PARTIAL_BYTES ((size_t)4 << 20)
#define ZS_MSG_MAX_SMALL_BYTES ((size_t)64 << 10)

#define ZS_MSG_MAX_STRING 4096  /* bytes: paths, error texts, refusals, reasons */
#define ZS_MSG_MAX_HOSTNAME 255 /* bytes, as a DNS name */
#define ZS_MSG_MAX_ENDPOINT 300 /* bytes of "HOST:PORT" */
#define ZS_MSG_MAX_BUILD 64     /* bytes of Register.build */
#define ZS_MSG_MAX_ENDPOINTS 16 /* per Register */
#define ZS_MSG_MAX_TENSORS (1 << 16)
#define ZS_MSG_MAX_SHARDS ZS_SHARDMAP_MAX_SHARDS
#define ZS_MSG_MAX_SERVERS ZS_SHARDMAP_MAX_SERVERS
#define ZS_MSG_MAX_CHUNKS (1 << 20) /* as the config's gradient_accumulation_steps */
#define ZS_MSG_MAX_STEPS (1 << 30)
#define ZS_MSG_MAX_FLOATS ZS_SHARDMAP_MAX_FLOATS

/* The Register.capabilities bits this version knows; any other bit is refused. */
#define ZS_MSG_CAPS_KNOWN                                                                          \
    (ZS_MSG_CAPS_FETCH | ZSHARD__CAPABILITY__CAP_TRANSPORT_TCP |                                   \
     ZSHARD__CAPABILITY__CAP_TRANSPORT_RDMA | ZSHARD__CAPABILITY__CAP_TRANSPORT_SHM)
#define ZS_MSG_CAPS_FETCH                                                                          \
    (ZSHARD__CAPABILITY__CAP_FETCH_FP32 | ZSHARD__CAPABILITY__CAP_FETCH_BF16 |                     \
     ZSHARD__CAPABILITY__CAP_FETCH_FP16)
#define ZS_MSG_CAPS_TRANSPORT                                                                      \
    (ZSHARD__CAPABILITY__CAP_TRANSPORT_TCP | ZSHARD__CAPABILITY__CAP_TRANSPORT_RDMA |              \
     ZSHARD__CAPABILITY__CAP_TRANSPORT_SHM)

/* Who receives a message: decides which body types are accepted (a coordinator takes no
 * JobSpec) and names the receiver in the version message ("this coordinator speaks 2"). */
typedef enum {
    ZS_MSG_ANY = 0,         /* tests, tools and the fuzzer: every body type */
    ZS_MSG_COORDINATOR = 1, /* peer -> coordinator bodies */
    ZS_MSG_SERVER = 2,      /* coordinator -> server bodies */
    ZS_MSG_WORKER = 3,      /* coordinator -> worker (and client tool) bodies */
} zs_msg_self;

/*
 * What the receiver knows of the job, for the checks that need it.  A zero means "not known
 * yet" and turns off that bound (the structural checks still run).  NULL = all zero.
 */
typedef struct {
    zs_msg_self self;
    uint32_t chunks;   /* C of the job: chunk indices must be below it */
    uint32_t n_shards; /* shards of the map: shard indices must be below it */
    uint32_t steps;    /* steps of the job: step numbers must be below it */
} zs_msg_ctx;

/* Where a worker's time on one chunk went (ChunkDone's optional timing fields), in ms. */
typedef struct {
    double compute_ms;    /* forward and backward, less the waits */
    double fetch_wait_ms; /* blocked on parameter fetches */
    double push_wait_ms;  /* blocked on gradient pushes */
} zs_msg_chunk_times;
#define ZS_MSG_MAX_CHUNK_MS 1e9 /* a timing field above this (11 days) is malformed */

/* Job facts of a JobSpec that are not in zs_config. */
typedef struct {
    char data_path[ZS_MSG_MAX_STRING + 1];
    uint64_t data_fingerprint; /* zs_dataset.fingerprint */
    uint64_t data_ntokens;
    uint32_t steps;
    uint64_t run_id;                        /* random per run, kept across resumes */
    uint64_t config_fingerprint;            /* zs_config_fingerprint */
    long resume_step;                       /* 0: a fresh start; else the checkpoint's version */
    char resume_dir[ZS_MSG_MAX_STRING + 1]; /* that checkpoint's step directory */
} zs_msg_job;

/* ---- envelopes ---- */

/* The body type's name as in the .proto ("JobSpec"; "none", "unknown"). */
const char *zs_msg_body_name(Zshard__Envelope__BodyCase body);

/*
 * Decodes len bytes into a new envelope (*out; free with zs_msg_free) and validates it for
 * the receiver ctx (NULL: ZS_MSG_ANY, nothing known).  On failure *out is NULL and the
 * message says why; a peer of another protocol version gets
 * "Envelope.protocol_version: protocol version 3, this coordinator speaks 2" even when the
 * rest of its message does not decode.  Cost: one pass over the bytes before and one after
 * protobuf-c's unpack, then the body check (linear in its counts).
 */
zs_err zs_msg_decode(const void *bytes, size_t len, const zs_msg_ctx *ctx, Zshard__Envelope **out);

/*
 * Reads Envelope.protocol_version from bytes without decoding the rest: 1 and *version when
 * the field is there, 0 when it is not or the bytes end first.  For a receiver that must
 * answer a refused message with the right Error code.
 */
int zs_msg_peek_version(const void *bytes, size_t len, uint32_t *version);

/* Validates a decoded or built envelope: version, sender, the body (as zs_msg_decode). */
zs_err zs_msg_check(const Zshard__Envelope *env, const zs_msg_ctx *ctx);

/* Sets env to an empty envelope from sender with ZS_PROTOCOL_VERSION (no body yet). */
void zs_msg_envelope_init(Zshard__Envelope *env, uint32_t sender);

/*
 * Validates env (ctx NULL: structure only, as any receiver would) and packs it into a new
 * malloc'd buffer *out of *len bytes.  An invalid message is refused here with the message
 * its receiver would give, so a sender's bug shows at the sender.
 */
zs_err zs_msg_encode(const Zshard__Envelope *env, uint8_t **out, size_t *len);

/* Frees an envelope from zs_msg_decode, or one built with malloc'd parts; NULL is fine. */
void zs_msg_free(Zshard__Envelope *env);

/*
 * The Error code to answer bytes that zs_msg_decode() refused with: ERROR_PROTOCOL_VERSION
 * when they carry another protocol version, else ERROR_MALFORMED.
 */
Zshard__ErrorCode zs_msg_refusal_code(const void *bytes, size_t len);

/*
 * Encodes an Error envelope from sender (*out malloc'd, *len bytes).  text is cut to
 * ZS_MSG_MAX_STRING bytes; an empty or NULL text becomes the code's name.  The fields an
 * Error uses are frozen across protocol versions (docs/protocol.md), so a peer of another
 * version can still read why it was refused.
 */
zs_err zs_msg_encode_error(uint32_t sender, Zshard__ErrorCode code, const char *text, uint8_t **out,
                           size_t *len);

/* ---- one check per body type (ctx may be NULL) ---- */

zs_err zs_msg_check_register(const Zshard__Register *m, const zs_msg_ctx *ctx);
zs_err zs_msg_check_register_reply(const Zshard__RegisterReply *m, const zs_msg_ctx *ctx);
zs_err zs_msg_check_job_spec(const Zshard__JobSpec *m, const zs_msg_ctx *ctx);
zs_err zs_msg_check_shard_map(const Zshard__ShardMap *m, const zs_msg_ctx *ctx);
zs_err zs_msg_check_heartbeat(const Zshard__Heartbeat *m, const zs_msg_ctx *ctx);
zs_err zs_msg_check_ready(const Zshard__Ready *m, const zs_msg_ctx *ctx);
zs_err zs_msg_check_step_assign(const Zshard__StepAssign *m, const zs_msg_ctx *ctx);
zs_err zs_msg_check_chunk_done(const Zshard__ChunkDone *m, const zs_msg_ctx *ctx);
zs_err zs_msg_check_grad_norm_partial(const Zshard__GradNormPartial *m, const zs_msg_ctx *ctx);
zs_err zs_msg_check_clip_verdict(const Zshard__ClipVerdict *m, const zs_msg_ctx *ctx);
zs_err zs_msg_check_version_published(const Zshard__VersionPublished *m, const zs_msg_ctx *ctx);
zs_err zs_msg_check_error(const Zshard__Error *m, const zs_msg_ctx *ctx);
zs_err zs_msg_check_shutdown(const Zshard__Shutdown *m, const zs_msg_ctx *ctx);
zs_err zs_msg_check_status_request(const Zshard__StatusRequest *m, const zs_msg_ctx *ctx);
zs_err zs_msg_check_status_reply(const Zshard__StatusReply *m, const zs_msg_ctx *ctx);
zs_err zs_msg_check_checkpoint_written(const Zshard__CheckpointWritten *m, const zs_msg_ctx *ctx);
zs_err zs_msg_check_restore(const Zshard__Restore *m, const zs_msg_ctx *ctx);
zs_err zs_msg_check_member_gone(const Zshard__MemberGone *m, const zs_msg_ctx *ctx);

/* "HOST:PORT" with a non-empty host of printable non-space ASCII (IPv6 in brackets) and a
 * decimal port 1..65535; ZS_OK or ZS_ERR_FORMAT naming `what`. */
zs_err zs_msg_check_endpoint(const char *what, const char *endpoint);

/* ---- the job spec ---- */

/*
 * Builds a JobSpec (*out, free with zs_msg_jobspec_free) from a parsed config, its tensor
 * table and the job facts; validates the result as a receiver would.
 */
zs_err zs_msg_jobspec_from_config(const zs_config *cfg, const zs_tensor_table *tt,
                                  const zs_msg_job *job, Zshard__JobSpec **out);

/*
 * The inverse: fills cfg, builds tt (free with zs_tensors_free) and job from a JobSpec.  m is
 * checked first (zs_msg_check_job_spec), then tt is built from the model config with
 * zs_tensors_gpt2() and compared with the message's table entry by entry: a peer whose layout
 * differs from this build's is refused with the first difference.  On failure nothing needs
 * freeing.  job may be NULL.
 */
zs_err zs_msg_jobspec_to_config(const Zshard__JobSpec *m, zs_config *cfg, zs_tensor_table *tt,
                                zs_msg_job *job);

void zs_msg_jobspec_free(Zshard__JobSpec *m);

#endif
