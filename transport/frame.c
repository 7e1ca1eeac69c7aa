/*
 * frame: encoding and validation of the 64-byte data-plane header (layout in frame.h).
 *
 * Fields are packed byte by byte in little-endian order, never by casting a struct onto the
 * buffer, so the wire layout does not depend on the compiler's padding or the host's byte
 * order.  zs_frame_decode() checks every field before it fills in the caller's zs_frame, so a
 * caller never sees a half-validated header.  Both functions cost a few dozen instructions.
 */
#include "transport/frame.h"

#include "transport/core.h"
#include "transport/transport.h"

#include <string.h>

size_t zs_frame_dtype_size(zs_frame_dtype dt)
{
    switch (dt) {
    case ZS_DTYPE_F32:
        return 4;
    case ZS_DTYPE_BF16:
    case ZS_DTYPE_F16:
        return 2;
    case ZS_DTYPE_TEXT:
    case ZS_DTYPE_BYTES:
        return 1;
    }
    return 0;
}

const char *zs_frame_op_name(unsigned op)
{
    switch (op) {
    case ZS_OP_FETCH:
        return "fetch";
    case ZS_OP_FETCH_REPLY:
        return "fetch_reply";
    case ZS_OP_PUSH:
        return "push";
    case ZS_OP_PUSH_REPLY:
        return "push_reply";
    case ZS_OP_ERROR:
        return "error";
    case ZS_OP_HELLO:
        return "hello";
    case ZS_OP_RMA_READ:
        return "rma_read";
    case ZS_OP_RMA_DATA:
        return "rma_data";
    case ZS_OP_RMA_WRITE:
        return "rma_write";
    case ZS_OP_RMA_ACK:
        return "rma_ack";
    }
    return "?";
}

const char *zs_frame_dtype_name(unsigned dtype)
{
    switch (dtype) {
    case ZS_DTYPE_F32:
        return "f32";
    case ZS_DTYPE_BF16:
        return "bf16";
    case ZS_DTYPE_F16:
        return "f16";
    case ZS_DTYPE_TEXT:
        return "text";
    case ZS_DTYPE_BYTES:
        return "bytes";
    }
    return "?";
}

const char *zs_frame_status_name(unsigned status)
{
    switch (status) {
    case ZS_FS_OK:
        return "ok";
    case ZS_FS_DUPLICATE:
        return "duplicate";
    case ZS_FS_BAD_FRAME:
        return "bad_frame";
    case ZS_FS_BAD_RANGE:
        return "bad_range";
    case ZS_FS_STALE:
        return "stale";
    case ZS_FS_NOT_ASSIGNED:
        return "not_assigned";
    case ZS_FS_SHUTDOWN:
        return "shutdown";
    case ZS_FS_BAD_KEY:
        return "bad_key";
    }
    return "?";
}

void zs_frame_encode(const zs_frame *f, uint8_t out[ZS_FRAME_HEADER_BYTES])
{
    zs_le_put32(out + 0, ZS_FRAME_MAGIC);
    zs_le_put16(out + 4, ZS_FRAME_VERSION);
    zs_le_put16(out + 6, f->op);
    out[8] = f->dtype;
    out[9] = f->flags;
    zs_le_put16(out + 10, 0);
    zs_le_put32(out + 12, f->status);
    zs_le_put64(out + 16, f->id);
    zs_le_put64(out + 24, f->step);
    zs_le_put32(out + 32, f->chunk);
    zs_le_put32(out + 36, f->sender);
    zs_le_put64(out + 40, f->offset);
    zs_le_put64(out + 48, f->count);
    zs_le_put64(out + 56, f->length);
}

zs_err zs_frame_decode(const uint8_t in[ZS_FRAME_HEADER_BYTES], zs_frame *out)
{
    uint32_t magic = zs_le_get32(in + 0);
    uint16_t reserved = zs_le_get16(in + 10);
    zs_frame f = {
        .version = zs_le_get16(in + 4),
        .op = zs_le_get16(in + 6),
        .dtype = in[8],
        .flags = in[9],
        .status = zs_le_get32(in + 12),
        .id = zs_le_get64(in + 16),
        .step = zs_le_get64(in + 24),
        .chunk = zs_le_get32(in + 32),
        .sender = zs_le_get32(in + 36),
        .offset = zs_le_get64(in + 40),
        .count = zs_le_get64(in + 48),
        .length = zs_le_get64(in + 56),
    };
    const char *opn = zs_frame_op_name(f.op);

    if (magic != ZS_FRAME_MAGIC)
        return zs_error(ZS_ERR_FORMAT, "frame: magic 0x%08x is not 0x%08x (\"ZSF1\")", magic,
                        ZS_FRAME_MAGIC);
    if (f.version != ZS_FRAME_VERSION)
        return zs_error(ZS_ERR_FORMAT, "frame: version %u is not %u", f.version, ZS_FRAME_VERSION);
    if (f.op < ZS_OP_FETCH || f.op > ZS_OP_RMA_ACK)
        return zs_error(ZS_ERR_FORMAT, "frame: op %u is not a known op", f.op);
    size_t esize = zs_frame_dtype_size((zs_frame_dtype)f.dtype);
    if (esize == 0)
        return zs_error(ZS_ERR_FORMAT, "frame: dtype %u is not a known dtype (op %s)", f.dtype,
                        opn);
    if (f.dtype == ZS_DTYPE_TEXT && f.op != ZS_OP_ERROR && f.op != ZS_OP_HELLO)
        return zs_error(ZS_ERR_FORMAT,
                        "frame: dtype %u (text) is only valid with op %u (error) or %u (hello), "
                        "not op %u (%s)",
                        f.dtype, ZS_OP_ERROR, ZS_OP_HELLO, f.op, opn);
    int rma = f.op >= ZS_OP_RMA_READ;
    if (rma != (f.dtype == ZS_DTYPE_BYTES))
        return zs_error(ZS_ERR_FORMAT,
                        "frame: dtype %u (%s) with op %u (%s): the one-sided ops (%u..%u) and only "
                        "they carry dtype %u (bytes)",
                        f.dtype, zs_frame_dtype_name(f.dtype), f.op, opn, ZS_OP_RMA_READ,
                        ZS_OP_RMA_ACK, ZS_DTYPE_BYTES);
    if (f.flags != 0 && f.flags != ZS_FRAME_FLAG_STATE && f.flags != ZS_FRAME_FLAG_NOTIFY)
        return zs_error(ZS_ERR_FORMAT, "frame: flags 0x%02x must be 0, 0x%02x or 0x%02x (op %s)",
                        f.flags, ZS_FRAME_FLAG_STATE, ZS_FRAME_FLAG_NOTIFY, opn);
    if (f.flags == ZS_FRAME_FLAG_NOTIFY && f.op != ZS_OP_RMA_WRITE && f.op != ZS_OP_RMA_ACK)
        return zs_error(ZS_ERR_FORMAT,
                        "frame: flag 0x%02x (notify) needs op %u (rma_write) or %u (rma_ack), not "
                        "%u (%s)",
                        ZS_FRAME_FLAG_NOTIFY, ZS_OP_RMA_WRITE, ZS_OP_RMA_ACK, f.op, opn);
    if (f.flags == ZS_FRAME_FLAG_STATE &&
        (f.op != ZS_OP_FETCH || f.dtype != ZS_DTYPE_F32 || f.chunk >= ZS_FRAME_STATE_ARRAYS))
        return zs_error(ZS_ERR_FORMAT,
                        "frame: flag 0x%02x (state) needs op %u (fetch), dtype f32 and an array "
                        "0..%d in chunk; got op %u (%s), dtype %u, chunk %u",
                        ZS_FRAME_FLAG_STATE, ZS_OP_FETCH, ZS_FRAME_STATE_ARRAYS - 1, f.op, opn,
                        f.dtype, f.chunk);
    if (reserved != 0)
        return zs_error(ZS_ERR_FORMAT, "frame: reserved 0x%04x must be 0 (op %s)", reserved, opn);
    if ((f.op == ZS_OP_FETCH || f.op == ZS_OP_PUSH || f.op == ZS_OP_HELLO || rma) && f.status != 0)
        return zs_error(ZS_ERR_FORMAT, "frame: status %u must be 0 in op %u (%s)", f.status, f.op,
                        opn);
    if (f.status > ZS_FS_BAD_KEY)
        return zs_error(ZS_ERR_FORMAT, "frame: status %u is not a known status (op %s)", f.status,
                        opn);
    if (f.offset + f.count < f.offset)
        return zs_error(ZS_ERR_FORMAT, "frame: offset %llu + count %llu overflows (op %s)",
                        (unsigned long long)f.offset, (unsigned long long)f.count, opn);
    if (f.length > ZS_FRAME_MAX_PAYLOAD)
        return zs_error(
            ZS_ERR_FORMAT, "frame: length %llu exceeds the largest payload %llu (op %s)",
            (unsigned long long)f.length, (unsigned long long)ZS_FRAME_MAX_PAYLOAD, opn);

    /* count * esize, checked: esize is 1, 2 or 4, so the product overflows exactly when count
     * exceeds UINT64_MAX / esize. */
    int bytes_ok = f.count <= UINT64_MAX / esize;
    uint64_t bytes = bytes_ok ? f.count * esize : 0;
    switch (f.op) {
    case ZS_OP_FETCH_REPLY:
    case ZS_OP_PUSH:
    case ZS_OP_RMA_DATA:
    case ZS_OP_RMA_WRITE:
        if (!bytes_ok)
            return zs_error(ZS_ERR_FORMAT, "frame: count %llu of %s overflows a byte count (op %s)",
                            (unsigned long long)f.count, zs_frame_dtype_name(f.dtype), opn);
        if (f.length != bytes)
            return zs_error(ZS_ERR_FORMAT,
                            "frame: length %llu does not match count %llu x %zu bytes (%s) = %llu "
                            "(op %s)",
                            (unsigned long long)f.length, (unsigned long long)f.count, esize,
                            zs_frame_dtype_name(f.dtype), (unsigned long long)bytes, opn);
        break;
    case ZS_OP_FETCH:
        if (f.length != 0)
            return zs_error(ZS_ERR_FORMAT, "frame: length %llu for op %u (fetch), expected 0",
                            (unsigned long long)f.length, f.op);
        if (!bytes_ok || bytes > ZS_FRAME_MAX_PAYLOAD)
            return zs_error(ZS_ERR_FORMAT,
                            "frame: count %llu of %s in a fetch exceeds the largest payload %llu",
                            (unsigned long long)f.count, zs_frame_dtype_name(f.dtype),
                            (unsigned long long)ZS_FRAME_MAX_PAYLOAD);
        break;
    case ZS_OP_RMA_READ:
        if (f.count > ZS_FRAME_MAX_PAYLOAD)
            return zs_error(ZS_ERR_FORMAT,
                            "frame: count %llu in an rma_read exceeds the largest payload %llu",
                            (unsigned long long)f.count, (unsigned long long)ZS_FRAME_MAX_PAYLOAD);
        if (f.length != 0)
            return zs_error(ZS_ERR_FORMAT, "frame: length %llu for op %u (%s), expected 0",
                            (unsigned long long)f.length, f.op, opn);
        break;
    case ZS_OP_RMA_ACK:
    case ZS_OP_PUSH_REPLY:
        if (f.length != 0)
            return zs_error(ZS_ERR_FORMAT, "frame: length %llu for op %u (%s), expected 0",
                            (unsigned long long)f.length, f.op, opn);
        break;
    case ZS_OP_ERROR:
    case ZS_OP_HELLO:
        if (f.length > ZS_FRAME_MAX_ERROR_TEXT)
            return zs_error(ZS_ERR_FORMAT, "frame: length %llu for op %u (%s) exceeds %d",
                            (unsigned long long)f.length, f.op, opn, ZS_FRAME_MAX_ERROR_TEXT);
        if (f.length > 0 && f.dtype != ZS_DTYPE_TEXT)
            return zs_error(ZS_ERR_FORMAT,
                            "frame: dtype %u (%s) for op %u (%s) with a payload, expected %u "
                            "(text)",
                            f.dtype, zs_frame_dtype_name(f.dtype), f.op, opn, ZS_DTYPE_TEXT);
        break;
    }
    *out = f;
    return ZS_OK;
}

void zs_mr_desc_encode(const zs_mr_desc *d, uint8_t out[ZS_MR_DESC_BYTES])
{
    zs_le_put64(out, d->addr);
    zs_le_put64(out + 8, d->len);
    zs_le_put32(out + 16, d->key);
    zs_le_put32(out + 20, d->access);
}

zs_err zs_mr_desc_decode(const uint8_t in[ZS_MR_DESC_BYTES], zs_mr_desc *d)
{
    zs_mr_desc t = {.addr = zs_le_get64(in),
                    .len = zs_le_get64(in + 8),
                    .key = zs_le_get32(in + 16),
                    .access = zs_le_get32(in + 20)};
    const uint32_t remote = ZS_MR_REMOTE_READ | ZS_MR_REMOTE_WRITE;
    if (t.access == 0 || (t.access & ~remote))
        return zs_error(ZS_ERR_FORMAT,
                        "region descriptor: access 0x%x must be remote read (0x%x), remote write "
                        "(0x%x) or both",
                        t.access, ZS_MR_REMOTE_READ, ZS_MR_REMOTE_WRITE);
    if (t.addr + t.len < t.addr)
        return zs_error(ZS_ERR_FORMAT, "region descriptor: address 0x%llx + %llu bytes wraps",
                        (unsigned long long)t.addr, (unsigned long long)t.len);
    *d = t;
    return ZS_OK;
}
