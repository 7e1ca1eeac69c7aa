/*
 * safetensors: round trip of several dtypes and shapes, then corrupt files, each refused
 * with a message that names the problem and never a crash.
 */
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/safetensors.h"
#include "tests/unit/test.h"

static char dir[] = "/tmp/zs_test_st_XXXXXX";
static char good[256];

static void write_raw(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f)
        return;
    CHECK(fwrite(p, 1, n, f) == n);
    fclose(f);
}

/* A file with the given header text and data bytes. */
static void write_with_header(const char *path, const char *header, size_t data_len)
{
    size_t h = strlen(header);
    uint8_t *buf = calloc(1, 8 + h + data_len);
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(buf + 8, header, h);
    write_raw(path, buf, 8 + h + data_len);
    free(buf);
}

static void test_roundtrip(void)
{
    float a[6] = {1, -2, 3.5f, 0, -0.0f, 1e-40f};
    uint16_t bf[4] = {0x3F80, 0xC000, 0x7F80, 0x0001};
    float scalar = 42.0f;
    zs_st_tensor ts[] = {
        {.name = "a", .dtype = ZS_DT_F32, .ndim = 2, .shape = {2, 3}, .data = a},
        {.name = "h.0.bf", .dtype = ZS_DT_BF16, .ndim = 1, .shape = {4}, .data = bf},
        {.name = "scalar", .dtype = ZS_DT_F32, .ndim = 0, .data = &scalar},
        {.name = "empty", .dtype = ZS_DT_F32, .ndim = 2, .shape = {0, 5}, .data = a},
    };
    const char *meta[] = {"format", "pt", "note", "zshard test"};
    snprintf(good, sizeof good, "%s/good.safetensors", dir);
    CHECK_OK(zs_st_write(good, ts, 4, meta, 2));
    CHECK(access(good, F_OK) == 0);
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp", good);
    CHECK(access(tmp, F_OK) != 0);
    zs_st_file f;
    CHECK_OK(zs_st_open(good, &f));
    CHECK_EQ_INT(f.count, 4);
    CHECK_EQ_INT(f.data_start % 8, 0);
    const zs_st_entry *e = zs_st_find(&f, "a");
    CHECK(e && e->dtype == ZS_DT_F32 && e->ndim == 2 && e->shape[0] == 2 && e->shape[1] == 3);
    float out[6];
    CHECK_OK(zs_st_read_f32(&f, e, out, 6));
    CHECK(memcmp(out, a, sizeof a) == 0);
    CHECK_FAILS_WITH(zs_st_read_f32(&f, e, out, 5), "6 elements, expected 5");
    e = zs_st_find(&f, "h.0.bf");
    CHECK(e && e->dtype == ZS_DT_BF16 && e->numel == 4);
    CHECK_OK(zs_st_read_f32(&f, e, out, 4));
    CHECK(out[0] == 1.0f && out[1] == -2.0f && out[2] == INFINITY);
    uint32_t bits;
    memcpy(&bits, &out[3], 4);
    CHECK_EQ_INT(bits, 0x00010000);
    e = zs_st_find(&f, "scalar");
    CHECK(e && e->ndim == 0 && e->numel == 1);
    CHECK_OK(zs_st_read_f32(&f, e, out, 1));
    CHECK(out[0] == 42.0f);
    e = zs_st_find(&f, "empty");
    CHECK(e && e->numel == 0 && e->begin == e->end);
    CHECK(zs_st_find(&f, "nope") == NULL);
    zs_st_close(&f);
}

static void test_f16(void)
{
    char p[300];
    snprintf(p, sizeof p, "%s/f16.safetensors", dir);
    uint16_t h[6] = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x7C00, 0x0400};
    zs_st_tensor t = {.name = "h", .dtype = ZS_DT_F16, .ndim = 1, .shape = {6}, .data = h};
    CHECK_OK(zs_st_write(p, &t, 1, NULL, 0));
    zs_st_file f;
    CHECK_OK(zs_st_open(p, &f));
    float out[6];
    CHECK_OK(zs_st_read_f32(&f, &f.entries[0], out, 6));
    CHECK(out[0] == 1.0f);
    CHECK(out[1] == -2.0f);
    CHECK(out[2] == 65504.0f);
    CHECK(out[3] == 0x1.0p-24f);
    CHECK(out[4] == INFINITY);
    CHECK(out[5] == 0x1.0p-14f);
    zs_st_close(&f);
    /* Integer data cannot be read as floats. */
    int32_t iv[2] = {1, 2};
    zs_st_tensor ti = {.name = "i", .dtype = ZS_DT_I32, .ndim = 1, .shape = {2}, .data = iv};
    CHECK_OK(zs_st_write(p, &ti, 1, NULL, 0));
    CHECK_OK(zs_st_open(p, &f));
    CHECK_FAILS_WITH(zs_st_read_f32(&f, &f.entries[0], out, 2), "dtype I32");
    zs_st_close(&f);
}

static void test_corrupt(void)
{
    char p[300];
    zs_st_file f;
    snprintf(p, sizeof p, "%s/bad.safetensors", dir);
    FILE *g = fopen(good, "rb");
    uint8_t buf[4096];
    size_t n = fread(buf, 1, sizeof buf, g);
    fclose(g);

    write_raw(p, buf, n - 3); /* cut in the data section */
    CHECK_FAILS_WITH(zs_st_open(p, &f), "outside the data section");
    write_raw(p, buf, 20); /* cut in the header */
    CHECK_FAILS_WITH(zs_st_open(p, &f), "does not fit the file");
    write_raw(p, buf, 5);
    CHECK_FAILS_WITH(zs_st_open(p, &f), "too short");
    write_raw(p, buf, 0);
    CHECK_FAILS_WITH(zs_st_open(p, &f), "0 bytes is too short");
    CHECK_FAILS_WITH(zs_st_open("/nonexistent/x.safetensors", &f), "/nonexistent/x.safetensors");

    write_with_header(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], ", 4);
    CHECK_FAILS_WITH(zs_st_open(p, &f), "header is not valid JSON");
    write_with_header(p, "[1, 2, 3]", 0);
    CHECK_FAILS_WITH(zs_st_open(p, &f), "header is not a JSON object");
    write_with_header(p, "{\"a\": {\"dtype\": \"F33\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 4);
    CHECK_FAILS_WITH(zs_st_open(p, &f), "tensor \"a\": unknown dtype \"F33\"");
    write_with_header(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 4);
    CHECK_FAILS_WITH(zs_st_open(p, &f), "data_offsets [0, 8] outside the data section of 4");
    write_with_header(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                         " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}",
                      12);
    CHECK_FAILS_WITH(zs_st_open(p, &f), "overlap");
    write_with_header(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 8]}}", 8);
    CHECK_FAILS_WITH(zs_st_open(p, &f), "tensor \"a\": 8 bytes of data, shape and dtype F32 need 12");
    write_with_header(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [-2], \"data_offsets\": [0, 8]}}", 8);
    CHECK_FAILS_WITH(zs_st_open(p, &f), "shape[0] is not a non-negative integer");
    write_with_header(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", 8);
    CHECK_FAILS_WITH(zs_st_open(p, &f), "belong to no tensor");
    write_with_header(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 4]}}", 8);
    CHECK_FAILS_WITH(zs_st_open(p, &f), "data_offsets [8, 4]");
    write_with_header(p, "{\"a\": 5}", 0);
    CHECK_FAILS_WITH(zs_st_open(p, &f), "entry is not an object");
    write_with_header(p, "{\"__metadata__\": {\"k\": 1}}", 0);
    CHECK_FAILS_WITH(zs_st_open(p, &f), "__metadata__ \"k\" is not a string");
    write_with_header(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
                         " \"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", 8);
    CHECK_FAILS_WITH(zs_st_open(p, &f), "not valid JSON");
    write_with_header(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [4611686018427387904, 4], "
                         "\"data_offsets\": [0, 4]}}", 4);
    CHECK_FAILS_WITH(zs_st_open(p, &f), "shape overflows");

    /* Random garbage of many sizes: refused, never a crash (ASan watches the reads). */
    uint64_t s = 99;
    for (int trial = 0; trial < 200; trial++) {
        size_t len = (size_t)(trial * 7 % 300);
        for (size_t i = 0; i < len; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            buf[i] = (uint8_t)(s >> 56);
        }
        if (len >= 8 && trial % 2) { /* a plausible length to reach the JSON parser */
            uint64_t h = len - 8 - trial % 5;
            for (int i = 0; i < 8; i++)
                buf[i] = (uint8_t)(h >> (8 * i));
        }
        write_raw(p, buf, len);
        int rc = zs_st_open(p, &f);
        CHECK(rc != 0);
        if (rc == 0)
            zs_st_close(&f);
    }
}

int main(void)
{
    CHECK(mkdtemp(dir) != NULL);
    test_roundtrip();
    test_f16();
    test_corrupt();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    return zs_test_result("test_safetensors");
}
