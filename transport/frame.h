/*
 * frame: the fixed binary header of every data-plane message (fetch, push, their replies,
 * errors), the same for every transport backend.
 *
 * Wire layout, 64 bytes, little-endian, no padding between fields:
 *
 *   off size field
 *     0    4 magic     ZS_FRAME_MAGIC ("ZSF1")
 *     4    2 version   ZS_FRAME_VERSION
 *     6    2 op        zs_frame_op
 *     8    1 dtype     zs_frame_dtype of the payload (and of a fetch's requested data)
 *     9    1 flags     0, or ZS_FRAME_FLAG_STATE on a fetch
 *    10    2 reserved  0
 *    12    4 status    0, or a zs_frame_status in ZS_OP_ERROR and replies
 *    16    8 id        request id chosen by the client; replies carry the request's id
 *    24    8 step      push: the step the gradient belongs to; fetch: the version wanted
 *    32    4 chunk     push: the chunk index within the step; state fetch: the array; else 0
 *    36    4 sender    push: the worker's id (from registration); else 0
 *    40    8 offset    first element of the range in the flat vector
 *    48    8 count     elements in the range
 *    56    8 length    payload bytes that follow the header (count * dtype size, or 0)
 *
 * Invariant: zs_frame_decode() accepts a header only if magic, version, op, dtype, flags and
 * reserved are valid and length is consistent with op, dtype and count; it never reads past
 * the 64 bytes it is given.  Range checks against the vector (offset + count <= N) are the
 * receiver's, which knows N.
 *
 * The rules, in the order zs_frame_decode() checks them (the first broken one is reported):
 *   magic == ZS_FRAME_MAGIC; version == ZS_FRAME_VERSION; 1 <= op <= ZS_OP_RMA_ACK;
 *   dtype is a zs_frame_dtype, and ZS_DTYPE_TEXT only with ZS_OP_ERROR or ZS_OP_HELLO; the RMA
 * ops with ZS_DTYPE_BYTES and no other op with it; flags == 0, or ZS_FRAME_FLAG_STATE with op
 * FETCH, dtype F32 and chunk < ZS_FRAME_STATE_ARRAYS, or ZS_FRAME_FLAG_NOTIFY with op RMA_WRITE
 * or RMA_ACK;
 * reserved == 0; status == 0 in FETCH, PUSH, HELLO and the RMA ops, a zs_frame_status otherwise;
 * offset + count does not overflow 64 bits; length <= ZS_FRAME_MAX_PAYLOAD; FETCH_REPLY, PUSH:
 * length == count * dtype size (the product checked for overflow); FETCH: length == 0 and count *
 * dtype size <= ZS_FRAME_MAX_PAYLOAD (the reply must fit); PUSH_REPLY: length == 0; ERROR: length
 * <= ZS_FRAME_MAX_ERROR_TEXT, and dtype TEXT when length > 0 (offset and count may echo the
 * rejected request's range); HELLO: length <= ZS_FRAME_MAX_ERROR_TEXT, and dtype TEXT when length >
 * 0; RMA_READ, RMA_ACK: length
 * == 0; RMA_DATA, RMA_WRITE: length == count; RMA_READ: count <= ZS_FRAME_MAX_PAYLOAD.
 */
#ifndef ZS_FRAME_H
#define ZS_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define ZS_FRAME_MAGIC 0x3146535au /* "ZSF1" read as little-endian u32 */
#define ZS_FRAME_VERSION 1
#define ZS_FRAME_HEADER_BYTES 64
/* The largest payload one frame may carry; bigger ranges are split by the client. */
#define ZS_FRAME_MAX_PAYLOAD ((uint64_t)1 << 30)

typedef enum {
    ZS_OP_FETCH = 1,       /* client -> server: send me [offset, offset+count) at version step */
    ZS_OP_FETCH_REPLY = 2, /* server -> client: payload = the range, in dtype */
    ZS_OP_PUSH = 3,        /* client -> server: payload = gradient of the range, fp32 */
    ZS_OP_PUSH_REPLY = 4,  /* server -> client: status of a push (0 accepted or dropped dup) */
    ZS_OP_ERROR = 5,       /* either way: status says why; the payload, if any, is a UTF-8 text */
    ZS_OP_HELLO = 6,       /* backend set-up (rdma.c: queue pair data over the TCP stream that
                              authenticated the connection); consumed by the backend, never
                              handed to its callers; payload opaque bytes (dtype text) */
    /* One-sided operations where the backend has no NIC to do them (tcp.c; transport.h,
     * iread/iwrite): consumed by the peer's net, never handed to its callers.  dtype bytes;
     * step = the region's key, offset = the first byte's address in the peer's memory, count =
     * the bytes. */
    ZS_OP_RMA_READ = 7,  /* send me those bytes; length 0 */
    ZS_OP_RMA_DATA = 8,  /* the bytes read (the request's id); length == count */
    ZS_OP_RMA_WRITE = 9, /* put these bytes there; length == count, chunk = the immediate value
                            of a write with ZS_FRAME_FLAG_NOTIFY */
    ZS_OP_RMA_ACK = 10,  /* the write's bytes are in place (the request's id); length 0.  With
                            ZS_FRAME_FLAG_NOTIFY it goes the other way (rdma.c, where the NIC
                            wrote them): the writer tells the owner, chunk = the immediate */
} zs_frame_op;

/* bytes: the payload of one-sided operations, and only theirs */
typedef enum {
    ZS_DTYPE_F32 = 0,
    ZS_DTYPE_BF16 = 1,
    ZS_DTYPE_TEXT = 2,
    ZS_DTYPE_BYTES = 3,
    ZS_DTYPE_F16 = 4 /* IEEE binary16: the published copy of an fp16 job */
} zs_frame_dtype;

typedef enum {
    ZS_FS_OK = 0,
    ZS_FS_DUPLICATE = 1,    /* push already accepted for (step, chunk, shard): dropped */
    ZS_FS_BAD_FRAME = 2,    /* malformed header: the connection is closed after this reply */
    ZS_FS_BAD_RANGE = 3,    /* offset/count outside the vector or not on this server */
    ZS_FS_STALE = 4,        /* push for a step that is not current, or fetch of a dropped version */
    ZS_FS_NOT_ASSIGNED = 5, /* push for a chunk not assigned to the sender */
    ZS_FS_SHUTDOWN = 6,     /* the server is stopping */
    ZS_FS_BAD_KEY = 7,      /* a one-sided operation names no region of the peer's, bytes outside
                               it, or access it was not registered for */
} zs_frame_status;

typedef struct {
    uint16_t version;
    uint16_t op;
    uint8_t dtype;
    uint8_t flags;
    uint32_t status;
    uint64_t id;
    uint64_t step;
    uint32_t chunk;
    uint32_t sender;
    uint64_t offset;
    uint64_t count;
    uint64_t length;
} zs_frame;

/* A fetch of a server's optimizer state rather than its published weights: chunk names the
 * array (0: the fp32 master weights, 1: AdamW's exp_avg, 2: exp_avg_sq), at version `step`.  A
 * server that builds a replica after a failover fetches it from the shard's server; the reply
 * is an ordinary FETCH_REPLY. */
#define ZS_FRAME_FLAG_STATE 0x01
#define ZS_FRAME_STATE_ARRAYS 3
/* An RMA_WRITE whose arrival the peer's net reports (ZS_EV_WRITTEN, transport.h), or the
 * RMA_ACK that reports a write the NIC made (rdma). */
#define ZS_FRAME_FLAG_NOTIFY 0x02

/* The text of a push refused with ZS_FS_NOT_ASSIGNED: a worker that reads it in a failure
 * knows that its chunk went to another worker (a deadline), not that something broke. */
#define ZS_NOT_ASSIGNED_TEXT "chunk is not assigned to the sender"

/* The longest text a ZS_OP_ERROR frame may carry, in bytes. */
#define ZS_FRAME_MAX_ERROR_TEXT 4096

/* Bytes per element of a payload dtype (text: 1); 0 for a value that is not a dtype. */
size_t zs_frame_dtype_size(zs_frame_dtype dt);

/* Encodes f into exactly ZS_FRAME_HEADER_BYTES bytes (magic and version filled in). */
void zs_frame_encode(const zs_frame *f, uint8_t out[ZS_FRAME_HEADER_BYTES]);

/* Decodes and validates a header; ZS_ERR_FORMAT with a message naming the field and value. */
zs_err zs_frame_decode(const uint8_t in[ZS_FRAME_HEADER_BYTES], zs_frame *f);

/* Short constant names for logs ("fetch", "f32", "bad_range"); "?" for unknown values. */
const char *zs_frame_op_name(unsigned op);
const char *zs_frame_dtype_name(unsigned dtype);
const char *zs_frame_status_name(unsigned status);

#endif
