/*
 * test_frame: the 64-byte data-plane header.  Round trips of every op, the byte layout
 * against frame.h's table, every rule of zs_frame_decode() broken one at a time (each
 * rejected with a message that names the field), and garbage buffers.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "transport/frame.h"
#include "transport/transport.h"

/* A valid frame of each op. */
static zs_frame sample(zs_frame_op op)
{
    zs_frame f = {.op = op, .id = 0x1122334455667788ull, .offset = 1024, .count = 256};
    switch (op) {
    case ZS_OP_FETCH:
        f.dtype = ZS_DTYPE_BF16;
        f.step = 7;
        break;
    case ZS_OP_FETCH_REPLY:
        f.dtype = ZS_DTYPE_BF16;
        f.step = 7;
        f.length = 256 * 2;
        break;
    case ZS_OP_PUSH:
        f.dtype = ZS_DTYPE_F32;
        f.step = 9;
        f.chunk = 3;
        f.sender = 42;
        f.length = 256 * 4;
        break;
    case ZS_OP_PUSH_REPLY:
        f.status = ZS_FS_DUPLICATE;
        break;
    case ZS_OP_ERROR:
        f.dtype = ZS_DTYPE_TEXT;
        f.status = ZS_FS_BAD_RANGE;
        f.length = 17;
        break;
    case ZS_OP_HELLO:
        f.dtype = ZS_DTYPE_TEXT;
        f.length = 64;
        break;
    case ZS_OP_RMA_READ:
    case ZS_OP_RMA_ACK:
        f.dtype = ZS_DTYPE_BYTES;
        f.step = 0xdeadbeef; /* the region's key */
        f.offset = 0x7f0012345000ull;
        break;
    case ZS_OP_RMA_DATA:
    case ZS_OP_RMA_WRITE:
        f.dtype = ZS_DTYPE_BYTES;
        f.step = 0xdeadbeef;
        f.offset = 0x7f0012345000ull;
        f.length = 256;
        if (op == ZS_OP_RMA_WRITE) {
            f.flags = ZS_FRAME_FLAG_NOTIFY;
            f.chunk = 0xfeedu; /* the immediate value */
        }
        break;
    }
    return f;
}

static int same(const zs_frame *a, const zs_frame *b)
{
    return a->op == b->op && a->dtype == b->dtype && a->flags == b->flags &&
           a->status == b->status && a->id == b->id && a->step == b->step && a->chunk == b->chunk &&
           a->sender == b->sender && a->offset == b->offset && a->count == b->count &&
           a->length == b->length;
}

static uint64_t le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static void put_le(uint8_t *p, int n, uint64_t v)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void test_round_trips(void)
{
    for (int op = ZS_OP_FETCH; op <= ZS_OP_RMA_ACK; op++) {
        zs_frame f = sample((zs_frame_op)op), g;
        uint8_t buf[ZS_FRAME_HEADER_BYTES];
        memset(buf, 0xAB, sizeof buf);
        zs_frame_encode(&f, buf);
        CHECK_OK(zs_frame_decode(buf, &g));
        CHECK(same(&f, &g));
        CHECK_EQ_INT(g.version, ZS_FRAME_VERSION);
    }
    /* Extreme values survive. */
    zs_frame f = {.op = ZS_OP_PUSH_REPLY,
                  .status = ZS_FS_SHUTDOWN,
                  .id = UINT64_MAX,
                  .step = UINT64_MAX,
                  .chunk = UINT32_MAX,
                  .sender = UINT32_MAX,
                  .offset = UINT64_MAX,
                  .count = 0};
    zs_frame g;
    uint8_t buf[ZS_FRAME_HEADER_BYTES];
    zs_frame_encode(&f, buf);
    CHECK_OK(zs_frame_decode(buf, &g));
    CHECK(same(&f, &g));
    /* A payload of exactly the largest size is allowed. */
    f = (zs_frame){.op = ZS_OP_PUSH,
                   .dtype = ZS_DTYPE_F32,
                   .count = ZS_FRAME_MAX_PAYLOAD / 4,
                   .length = ZS_FRAME_MAX_PAYLOAD};
    zs_frame_encode(&f, buf);
    CHECK_OK(zs_frame_decode(buf, &g));
    /* An error without text may carry any dtype and echo the rejected range. */
    f = (zs_frame){.op = ZS_OP_ERROR,
                   .dtype = ZS_DTYPE_F32,
                   .status = ZS_FS_STALE,
                   .offset = 5,
                   .count = 1000};
    zs_frame_encode(&f, buf);
    CHECK_OK(zs_frame_decode(buf, &g));
    f.dtype = ZS_DTYPE_TEXT;
    f.length = ZS_FRAME_MAX_ERROR_TEXT;
    zs_frame_encode(&f, buf);
    CHECK_OK(zs_frame_decode(buf, &g));
}

/* The byte offsets of frame.h's table, little-endian. */
static void test_layout(void)
{
    zs_frame f = {.op = ZS_OP_PUSH,
                  .dtype = ZS_DTYPE_F32,
                  .flags = 0,
                  .status = 0,
                  .id = 0x0102030405060708ull,
                  .step = 0x1112131415161718ull,
                  .chunk = 0x21222324u,
                  .sender = 0x31323334u,
                  .offset = 0x4142434445464748ull,
                  .count = 3,
                  .length = 12};
    uint8_t b[ZS_FRAME_HEADER_BYTES];
    zs_frame_encode(&f, b);
    CHECK(memcmp(b, "ZSF1", 4) == 0);
    CHECK_EQ_INT(le(b + 0, 4), ZS_FRAME_MAGIC);
    CHECK_EQ_INT(le(b + 4, 2), ZS_FRAME_VERSION);
    CHECK_EQ_INT(le(b + 6, 2), ZS_OP_PUSH);
    CHECK_EQ_INT(b[8], ZS_DTYPE_F32);
    CHECK_EQ_INT(b[9], 0);
    CHECK_EQ_INT(le(b + 10, 2), 0);
    CHECK_EQ_INT(le(b + 12, 4), 0);
    CHECK(le(b + 16, 8) == 0x0102030405060708ull);
    CHECK(b[16] == 0x08 && b[23] == 0x01);
    CHECK(le(b + 24, 8) == 0x1112131415161718ull);
    CHECK_EQ_INT(le(b + 32, 4), 0x21222324);
    CHECK_EQ_INT(le(b + 36, 4), 0x31323334);
    CHECK(le(b + 40, 8) == 0x4142434445464748ull);
    CHECK_EQ_INT(le(b + 48, 8), 3);
    CHECK_EQ_INT(le(b + 56, 8), 12);
}

static void test_sizes_and_names(void)
{
    CHECK_EQ_INT(zs_frame_dtype_size(ZS_DTYPE_F32), 4);
    CHECK_EQ_INT(zs_frame_dtype_size(ZS_DTYPE_BF16), 2);
    CHECK_EQ_INT(zs_frame_dtype_size(ZS_DTYPE_TEXT), 1);
    CHECK_EQ_INT(zs_frame_dtype_size(ZS_DTYPE_BYTES), 1);
    CHECK_EQ_INT(zs_frame_dtype_size(ZS_DTYPE_F16), 2);
    CHECK_EQ_INT(zs_frame_dtype_size((zs_frame_dtype)5), 0);
    CHECK(!strcmp(zs_frame_op_name(ZS_OP_RMA_WRITE), "rma_write"));
    CHECK(!strcmp(zs_frame_status_name(ZS_FS_BAD_KEY), "bad_key"));
    CHECK(!strcmp(zs_frame_op_name(ZS_OP_PUSH), "push"));
    CHECK(!strcmp(zs_frame_op_name(0), "?"));
    CHECK(!strcmp(zs_frame_dtype_name(ZS_DTYPE_BF16), "bf16"));
    CHECK(!strcmp(zs_frame_dtype_name(ZS_DTYPE_F16), "f16"));
    CHECK(!strcmp(zs_frame_status_name(ZS_FS_NOT_ASSIGNED), "not_assigned"));
    CHECK(!strcmp(zs_frame_status_name(99), "?"));
}

/* Encodes f, applies a byte patch, decodes. */
static zs_err decode_patched(zs_frame f, int off, int n, uint64_t v)
{
    uint8_t b[ZS_FRAME_HEADER_BYTES];
    zs_frame g;
    zs_frame_encode(&f, b);
    if (n)
        put_le(b + off, n, v);
    return zs_frame_decode(b, &g);
}

static zs_err decode_frame(zs_frame f)
{
    return decode_patched(f, 0, 0, 0);
}

static void test_invalid_fields(void)
{
    zs_frame push = sample(ZS_OP_PUSH), f;
    CHECK_FAILS_WITH(decode_patched(push, 0, 4, 0x41414141), "magic 0x41414141");
    CHECK_FAILS_WITH(decode_patched(push, 0, 4, 0x3146535b), "magic");
    CHECK_FAILS_WITH(decode_patched(push, 4, 2, 2), "version 2 is not 1");
    CHECK_FAILS_WITH(decode_patched(push, 4, 2, 0), "version 0");
    CHECK_FAILS_WITH(decode_patched(push, 6, 2, 11), "frame: op 11 is not a known op");
    CHECK_FAILS_WITH(decode_patched(push, 6, 2, 0), "op 0 is not a known op");
    CHECK_FAILS_WITH(decode_patched(push, 6, 2, 0xffff), "op 65535");
    CHECK_FAILS_WITH(decode_patched(push, 8, 1, 5), "dtype 5 is not a known dtype");
    CHECK_FAILS_WITH(decode_patched(push, 8, 1, 0xff), "dtype 255");
    CHECK_FAILS_WITH(decode_patched(push, 9, 1, 4), "flags 0x04 must be 0, 0x01 or 0x02");
    CHECK_FAILS_WITH(decode_patched(push, 9, 1, 2),
                     "flag 0x02 (notify) needs op 9 (rma_write) or 10 (rma_ack)");
    /* Bytes are the one-sided ops' dtype, and only theirs. */
    CHECK_FAILS_WITH(decode_patched(push, 8, 1, ZS_DTYPE_BYTES),
                     "dtype 3 (bytes) with op 3 (push): the one-sided ops (7..10)");
    for (int op = ZS_OP_RMA_READ; op <= ZS_OP_RMA_ACK; op++) {
        f = sample((zs_frame_op)op);
        f.dtype = ZS_DTYPE_F32;
        CHECK_FAILS_WITH(decode_frame(f), "only they carry dtype 3 (bytes)");
        f = sample((zs_frame_op)op);
        f.status = ZS_FS_BAD_KEY;
        CHECK_FAILS_WITH(decode_frame(f), "status 7 must be 0 in op");
    }
    f = sample(ZS_OP_RMA_DATA);
    f.flags = ZS_FRAME_FLAG_NOTIFY;
    CHECK_FAILS_WITH(decode_frame(f),
                     "flag 0x02 (notify) needs op 9 (rma_write) or 10 (rma_ack), not 8");
    f = sample(ZS_OP_RMA_ACK);
    f.flags = ZS_FRAME_FLAG_NOTIFY;
    f.chunk = 99;
    CHECK_OK(decode_frame(f));
    f = sample(ZS_OP_RMA_READ);
    f.length = 8;
    CHECK_FAILS_WITH(decode_frame(f), "length 8 for op 7 (rma_read), expected 0");
    f = sample(ZS_OP_RMA_READ);
    f.count = ZS_FRAME_MAX_PAYLOAD + 1;
    CHECK_FAILS_WITH(decode_frame(f), "in an rma_read exceeds the largest payload");
    f = sample(ZS_OP_RMA_ACK);
    f.length = 1;
    CHECK_FAILS_WITH(decode_frame(f), "length 1 for op 10 (rma_ack), expected 0");
    f = sample(ZS_OP_RMA_WRITE);
    f.length = 255;
    CHECK_FAILS_WITH(decode_frame(f), "length 255 does not match count 256 x 1 bytes (bytes)");
    f = sample(ZS_OP_RMA_DATA);
    f.offset = UINT64_MAX - 100; /* the bytes would wrap the address space */
    CHECK_FAILS_WITH(decode_frame(f), "overflows");
    /* The state flag: only on an f32 fetch naming one of the three arrays. */
    CHECK_FAILS_WITH(decode_patched(push, 9, 1, 1), "flag 0x01 (state) needs op 1 (fetch)");
    {
        zs_frame sf = sample(ZS_OP_FETCH);
        sf.flags = ZS_FRAME_FLAG_STATE;
        sf.dtype = ZS_DTYPE_F32;
        sf.chunk = 2;
        uint8_t sb[ZS_FRAME_HEADER_BYTES];
        zs_frame back;
        zs_frame_encode(&sf, sb);
        CHECK(zs_frame_decode(sb, &back) == ZS_OK && back.flags == ZS_FRAME_FLAG_STATE &&
              back.chunk == 2);
        CHECK_FAILS_WITH(decode_patched(sf, 32, 4, 3), "an array 0..2 in chunk");
        CHECK_FAILS_WITH(decode_patched(sf, 8, 1, ZS_DTYPE_BF16), "needs op 1 (fetch), dtype f32");
    }
    CHECK_FAILS_WITH(decode_patched(push, 10, 2, 0x100), "reserved 0x0100 must be 0");
    CHECK_FAILS_WITH(decode_patched(push, 12, 4, 1), "status 1 must be 0");

    /* Text only with ERROR and HELLO; a HELLO's status is 0 and its length bounded. */
    f = sample(ZS_OP_HELLO);
    f.status = ZS_FS_BAD_FRAME;
    CHECK_FAILS_WITH(decode_frame(f), "status 2 must be 0 in op 6 (hello)");
    f = sample(ZS_OP_HELLO);
    f.length = ZS_FRAME_MAX_ERROR_TEXT + 1;
    CHECK_FAILS_WITH(decode_frame(f), "op 6 (hello) exceeds 4096");
    f = sample(ZS_OP_HELLO);
    f.dtype = ZS_DTYPE_F32;
    CHECK_FAILS_WITH(decode_frame(f), "for op 6 (hello) with a payload, expected 2 (text)");
    for (int op = ZS_OP_FETCH; op < ZS_OP_ERROR; op++) {
        f = sample((zs_frame_op)op);
        f.dtype = ZS_DTYPE_TEXT;
        f.length = op == ZS_OP_FETCH_REPLY || op == ZS_OP_PUSH ? f.count : 0;
        CHECK_FAILS_WITH(decode_frame(f), "dtype 2 (text) is only valid with op 5 (error) or 6");
    }
    f = sample(ZS_OP_FETCH);
    f.status = ZS_FS_BAD_FRAME;
    CHECK_FAILS_WITH(decode_frame(f), "status 2 must be 0 in op 1 (fetch)");
    f = sample(ZS_OP_PUSH_REPLY);
    f.status = 8;
    CHECK_FAILS_WITH(decode_frame(f), "status 8 is not a known status");
    f = sample(ZS_OP_ERROR);
    f.status = 0x80000000u;
    CHECK_FAILS_WITH(decode_frame(f), "status 2147483648");

    /* offset + count wraps. */
    f = sample(ZS_OP_FETCH);
    f.offset = UINT64_MAX - 10;
    f.count = 11;
    CHECK_FAILS_WITH(decode_frame(f), "offset 18446744073709551605 + count 11 overflows");

    /* Lengths. */
    f = sample(ZS_OP_PUSH);
    f.length += 4;
    CHECK_FAILS_WITH(decode_frame(f), "length 1028 does not match count 256 x 4 bytes (f32)");
    f = sample(ZS_OP_FETCH_REPLY);
    f.length = 256 * 4; /* as if f32, but the dtype is bf16 */
    CHECK_FAILS_WITH(decode_frame(f), "length 1024 does not match count 256 x 2 bytes (bf16)");
    f = sample(ZS_OP_PUSH);
    f.count = (UINT64_MAX / 4) + 1;
    f.offset = 0;
    f.length = 0; /* count * 4 wraps to 0 */
    CHECK_FAILS_WITH(decode_frame(f), "overflows a byte count");
    f = sample(ZS_OP_PUSH);
    f.count = ZS_FRAME_MAX_PAYLOAD / 4 + 1;
    f.length = f.count * 4;
    CHECK_FAILS_WITH(decode_frame(f), "exceeds the largest payload");
    f = sample(ZS_OP_FETCH);
    f.length = 5;
    CHECK_FAILS_WITH(decode_frame(f), "length 5 for op 1 (fetch), expected 0");
    f = sample(ZS_OP_FETCH);
    f.dtype = ZS_DTYPE_F32;
    f.count = ZS_FRAME_MAX_PAYLOAD / 4 + 1;
    CHECK_FAILS_WITH(decode_frame(f), "in a fetch exceeds the largest payload");
    f.count = UINT64_MAX / 2;
    CHECK_FAILS_WITH(decode_frame(f), "in a fetch exceeds");
    f = sample(ZS_OP_PUSH_REPLY);
    f.length = 1;
    CHECK_FAILS_WITH(decode_frame(f), "length 1 for op 4 (push_reply), expected 0");
    f = sample(ZS_OP_ERROR);
    f.length = ZS_FRAME_MAX_ERROR_TEXT + 1;
    CHECK_FAILS_WITH(decode_frame(f), "length 4097 for op 5 (error) exceeds 4096");
    f = sample(ZS_OP_ERROR);
    f.dtype = ZS_DTYPE_F32;
    CHECK_FAILS_WITH(decode_frame(f), "dtype 0 (f32) for op 5 (error) with a payload");
    f = sample(ZS_OP_ERROR);
    f.length = UINT64_MAX;
    CHECK_FAILS_WITH(decode_frame(f), "length 18446744073709551615 exceeds the largest payload");
}

/* Region descriptors: the wire layout, round trips, and what decode refuses. */
static void test_mr_desc(void)
{
    zs_mr_desc d = {.addr = 0x7f0012345000ull,
                    .len = 3u << 20,
                    .key = 0x89abcdefu,
                    .access = ZS_MR_REMOTE_READ | ZS_MR_REMOTE_WRITE},
               g;
    uint8_t b[ZS_MR_DESC_BYTES];
    zs_mr_desc_encode(&d, b);
    CHECK(le(b, 8) == d.addr && le(b + 8, 8) == d.len && le(b + 16, 4) == d.key &&
          le(b + 20, 4) == d.access);
    CHECK_OK(zs_mr_desc_decode(b, &g));
    CHECK(g.addr == d.addr && g.len == d.len && g.key == d.key && g.access == d.access);
    zs_mr_desc keep = g;
    put_le(b + 20, 4, 0);
    CHECK_FAILS_WITH(zs_mr_desc_decode(b, &g), "access 0x0 must be remote read");
    put_le(b + 20, 4, ZS_MR_SEND | ZS_MR_REMOTE_READ);
    CHECK_FAILS_WITH(zs_mr_desc_decode(b, &g), "access 0x5 must be");
    CHECK(g.addr == keep.addr && g.key == keep.key && g.access == keep.access);
    put_le(b + 20, 4, ZS_MR_REMOTE_READ);
    put_le(b, 8, UINT64_MAX - 10);
    CHECK_FAILS_WITH(zs_mr_desc_decode(b, &g), "wraps");
    put_le(b, 8, 4096);
    CHECK_OK(zs_mr_desc_decode(b, &g));
    CHECK(g.addr == 4096 && g.access == ZS_MR_REMOTE_READ);
}

/* The decoder leaves the output alone on failure. */
static void test_output_untouched(void)
{
    zs_frame f = sample(ZS_OP_PUSH), g = sample(ZS_OP_ERROR), keep = g;
    uint8_t b[ZS_FRAME_HEADER_BYTES];
    zs_frame_encode(&f, b);
    b[6] = 77;
    CHECK(zs_frame_decode(b, &g) == ZS_ERR_FORMAT);
    CHECK(same(&g, &keep));
}

/* Garbage: all-zero, all-ones, text, and random buffers never decode and never crash. A
 * truncated header is the 64-byte prefix of a buffer the receiver did not fill: the rest
 * is whatever was there (zeros here). */
static void test_garbage(void)
{
    uint8_t b[ZS_FRAME_HEADER_BYTES];
    zs_frame g;
    memset(b, 0, sizeof b);
    CHECK_FAILS_WITH(zs_frame_decode(b, &g), "magic 0x00000000");
    memset(b, 0xff, sizeof b);
    CHECK_FAILS_WITH(zs_frame_decode(b, &g), "magic 0xffffffff");
    memset(b, 0, sizeof b);
    memcpy(b, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 27);
    CHECK_FAILS_WITH(zs_frame_decode(b, &g), "magic");

    zs_frame f = sample(ZS_OP_PUSH);
    uint8_t full[ZS_FRAME_HEADER_BYTES];
    zs_frame_encode(&f, full);
    for (int keep = 0; keep < ZS_FRAME_HEADER_BYTES; keep++) {
        memset(b, 0, sizeof b);
        memcpy(b, full, (size_t)keep);
        /* Up to the op's low byte nothing decodes; a longer prefix may happen to be a consistent
         * header (a push of 0 elements), but never the frame that was cut.  The transport's
         * guard against truncation is that it reads exactly 64 bytes before decoding. */
        zs_err e = zs_frame_decode(b, &g);
        int cut_nonzero = 0;
        for (int k = keep; k < ZS_FRAME_HEADER_BYTES; k++)
            cut_nonzero |= full[k] != 0;
        if (keep < 7)
            CHECK(e != ZS_OK);
        else if (cut_nonzero)
            CHECK(e != ZS_OK || !same(&g, &f));
    }

    /* Random headers: fully random ones never pass the magic; with magic, version, flags and
     * reserved forced valid, whatever decodes must encode back to the same bytes. */
    uint64_t x = 0x9e3779b97f4a7c15ull;
    int accepted = 0, mismatched = 0;
    for (int i = 0; i < 200000; i++) {
        for (int k = 0; k < ZS_FRAME_HEADER_BYTES; k++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b[k] = (uint8_t)x;
        }
        if (i & 1) {
            put_le(b, 4, ZS_FRAME_MAGIC);
            put_le(b + 4, 2, ZS_FRAME_VERSION);
            put_le(b + 6, 2, 1 + (x >> 20) % 5);
            b[8] = (uint8_t)((x >> 30) % 3);
            b[9] = 0;
            put_le(b + 10, 2, 0);
            put_le(b + 12, 4, (x >> 40) % 8);
            if ((x >> 50) & 1) /* small counts and lengths, sometimes consistent */
                put_le(b + 48, 8, (x >> 52) % 4), put_le(b + 56, 8, ((x >> 52) % 4) * 4);
        }
        if (zs_frame_decode(b, &g) == ZS_OK) {
            uint8_t back[ZS_FRAME_HEADER_BYTES];
            accepted++;
            zs_frame_encode(&g, back);
            mismatched += memcmp(back, b, sizeof b) != 0;
        } else if (!(i & 1)) {
            CHECK(strstr(zs_last_error(), "magic") != NULL);
        }
    }
    CHECK(accepted > 0); /* the forced half reaches the deep rules and sometimes passes */
    CHECK_EQ_INT(mismatched, 0);
}

int main(void)
{
    test_round_trips();
    test_layout();
    test_sizes_and_names();
    test_invalid_fields();
    test_output_untouched();
    test_garbage();
    test_mr_desc();
    return zs_test_result("test_frame");
}
