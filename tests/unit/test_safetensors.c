/*
 * safetensors: round trips of every shape kind, exact fp16/bf16 widening, and a corpus of
 * corrupt files (written by this test into a temporary directory) that must each be refused
 * with a message naming the problem, without crashing or leaking a descriptor.
 */
#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/safetensors.h"
#include "tests/unit/test.h"

static char tmpdir[64];

#define PATH_BUF 512

/* tmpdir/name into buf of PATH_BUF bytes; returns buf. */
static const char *tpath(char *buf, const char *name)
{
    snprintf(buf, PATH_BUF, "%s/%s", tmpdir, name);
    return buf;
}

/* Reads the named tensor; a missing name fails the check instead of crashing. */
static zs_err read_named(const zs_st_file *f, const char *name, float *dst, size_t numel)
{
    const zs_st_entry *e = zs_st_find(f, name);
    if (!e)
        return zs_error(ZS_ERR_NOTFOUND, "tensor \"%s\" not found", name);
    return zs_st_read_f32(f, e, dst, numel);
}

static int write_bytes(const char *path, const void *buf, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        return -1;
    ssize_t w = n ? write(fd, buf, n) : 0;
    close(fd);
    return w == (ssize_t)n ? 0 : -1;
}

/* A file of the 8-byte length (hlen, or strlen(json) if hlen is UINT64_MAX), the JSON and
 * n_data bytes of data 0, 1, 2, ...; returns its path, valid until the next call. */
static const char *write_raw(const char *name, const char *json, uint64_t hlen, size_t n_data)
{
    size_t jl = strlen(json);
    if (hlen == UINT64_MAX)
        hlen = jl;
    unsigned char *buf = malloc(8 + jl + n_data);
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)(hlen >> (8 * i));
    memcpy(buf + 8, json, jl);
    for (size_t i = 0; i < n_data; i++)
        buf[8 + jl + i] = (unsigned char)i;
    static char p[PATH_BUF];
    tpath(p, name);
    CHECK_EQ_INT(write_bytes(p, buf, 8 + jl + n_data), 0);
    free(buf);
    return p;
}

/* Opens path expecting failure with code and a message containing needle and the path; also
 * checks that the failed open left a struct that close accepts. */
static void expect_open_fails(const char *path, zs_err code, const char *needle)
{
    zs_st_file f;
    zs_err r = zs_st_open(path, &f);
    CHECK_EQ_INT(r, code);
    CHECK_FAILS_WITH(r, needle);
    CHECK_FAILS_WITH(r, path);
    CHECK_EQ_INT(f.count, 0);
    CHECK(f.entries == NULL);
    CHECK(f.path == NULL);
    CHECK_EQ_INT(f.fd, -1);
    zs_st_close(&f);
    zs_st_close(&f);
}

/* Opens a raw file expecting a format error with needle. */
static void expect_raw_fails(const char *name, const char *json, size_t n_data, const char *needle)
{
    expect_open_fails(write_raw(name, json, UINT64_MAX, n_data), ZS_ERR_FORMAT, needle);
}

static uint16_t bf16_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)(u >> 16);
}

static uint32_t bits_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static void test_round_trip(void)
{
    float a[6] = {1.5f, -2.25f, 0.0f, -0.0f, 3.0e-39f /* subnormal */, 65504.0f};
    uint16_t b[4] = {bf16_of(1.0f), bf16_of(-3.5f), bf16_of(1e30f), 0x7fc0 /* NaN */};
    float s = 42.125f;
    uint16_t h[3] = {0x3c00, 0xc000, 0x7bff};
    int32_t iv[2] = {7, -7};
    const zs_st_tensor ts[] = {
        {.name = "wte.weight", .dtype = ZS_DT_F32, .ndim = 2, .shape = {2, 3}, .data = a},
        {.name = "h.0.ln_1.bias", .dtype = ZS_DT_BF16, .ndim = 1, .shape = {4}, .data = b},
        {.name = "scalar", .dtype = ZS_DT_F32, .ndim = 0, .data = &s},
        {.name = "empty", .dtype = ZS_DT_F32, .ndim = 2, .shape = {0, 5}, .data = NULL},
        {.name = "half", .dtype = ZS_DT_F16, .ndim = 1, .shape = {3}, .data = h},
        {.name = "ints", .dtype = ZS_DT_I32, .ndim = 1, .shape = {2}, .data = iv},
    };
    const int n = (int)(sizeof ts / sizeof ts[0]);
    static const char *const meta[] = {"format", "pt", "producer", "zshard test \xc3\xa9"};
    char p[PATH_BUF];
    tpath(p, "rt.safetensors");
    CHECK_OK(zs_st_write(p, ts, n, meta, 2));
    char tmp[PATH_BUF + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    CHECK(access(tmp, F_OK) != 0);

    /* The raw layout: aligned data, space padding, metadata as written. */
    FILE *fp = fopen(p, "rb");
    CHECK(fp != NULL);
    if (!fp)
        return;
    unsigned char lenbuf[8];
    CHECK_EQ_INT(fread(lenbuf, 1, 8, fp), 8);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | lenbuf[i];
    CHECK_EQ_INT((8 + hlen) % 8, 0);
    char *hdr = calloc(1, hlen + 1);
    CHECK_EQ_INT(fread(hdr, 1, hlen, fp), hlen);
    fclose(fp);
    size_t jl = strlen(hdr);
    while (jl > 0 && hdr[jl - 1] == ' ')
        jl--;
    CHECK(hlen - jl < 8);
    CHECK_EQ_INT(hdr[0], '{');
    CHECK_EQ_INT(hdr[jl - 1], '}');
    json_error_t jerr;
    json_t *root = json_loadb(hdr, hlen, JSON_REJECT_DUPLICATES, &jerr);
    CHECK(root != NULL);
    json_t *m = json_object_get(root, "__metadata__");
    CHECK(json_is_object(m));
    CHECK_EQ_INT(json_object_size(m), 2);
    CHECK(strcmp(json_string_value(json_object_get(m, "format")), "pt") == 0);
    CHECK(strcmp(json_string_value(json_object_get(m, "producer")), meta[3]) == 0);
    CHECK_EQ_INT(json_object_size(root), n + 1);
    json_decref(root);
    free(hdr);

    zs_st_file f;
    CHECK_OK(zs_st_open(p, &f));
    CHECK_EQ_INT(f.count, n);
    CHECK_EQ_INT(f.data_start, 8 + hlen);
    CHECK_EQ_INT(f.data_start % 8, 0);
    CHECK_EQ_INT(f.data_len, 24 + 8 + 4 + 0 + 6 + 8);
    size_t off = 0;
    for (int i = 0; i < n && i < f.count; i++) {
        const zs_st_entry *e = &f.entries[i];
        CHECK(strcmp(e->name, ts[i].name) == 0); /* file order is the given order */
        CHECK(zs_st_find(&f, ts[i].name) == e);
        CHECK_EQ_INT(e->dtype, ts[i].dtype);
        CHECK_EQ_INT(e->ndim, ts[i].ndim);
        size_t numel = 1;
        for (int d = 0; d < e->ndim; d++) {
            CHECK_EQ_INT(e->shape[d], ts[i].shape[d]);
            numel *= ts[i].shape[d];
        }
        CHECK_EQ_INT(e->numel, numel);
        CHECK_EQ_INT(e->begin, off);
        CHECK_EQ_INT(e->end, off + numel * zs_dtype_size(ts[i].dtype));
        off = e->end;
    }
    CHECK(zs_st_find(&f, "nope") == NULL);
    CHECK(zs_st_find(&f, "__metadata__") == NULL);

    float got[6];
    CHECK_OK(read_named(&f, "wte.weight", got, 6));
    CHECK(memcmp(got, a, sizeof a) == 0);
    CHECK_OK(read_named(&f, "h.0.ln_1.bias", got, 4));
    for (int i = 0; i < 4; i++)
        CHECK_EQ_INT(bits_of(got[i]), (uint32_t)b[i] << 16);
    CHECK_EQ_INT(got[1], -3.5);
    float gs = 0;
    CHECK_OK(read_named(&f, "scalar", &gs, 1));
    CHECK_EQ_INT(bits_of(gs), bits_of(s));
    CHECK_OK(read_named(&f, "empty", NULL, 0));
    CHECK_OK(read_named(&f, "half", got, 3));
    CHECK(got[0] == 1.0f && got[1] == -2.0f && got[2] == 65504.0f);

    /* Misuse: wrong count, non-float dtype. */
    zs_err r = read_named(&f, "wte.weight", got, 5);
    CHECK_EQ_INT(r, ZS_ERR_INVALID);
    CHECK_FAILS_WITH(r, "expects 5 elements, the file has 6");
    CHECK_FAILS_WITH(r, "wte.weight");
    r = read_named(&f, "ints", got, 2);
    CHECK_EQ_INT(r, ZS_ERR_INVALID);
    CHECK_FAILS_WITH(r, "dtype I32 cannot be read");
    zs_st_close(&f);
    CHECK(f.path == NULL && f.entries == NULL && f.count == 0 && f.fd == -1);
    zs_st_close(&f); /* twice is harmless */

    /* A file without tensors or metadata is valid: "{}" padded. */
    char pe[PATH_BUF];
    tpath(pe, "none.safetensors");
    CHECK_OK(zs_st_write(pe, NULL, 0, NULL, 0));
    CHECK_OK(zs_st_open(pe, &f));
    CHECK_EQ_INT(f.count, 0);
    CHECK_EQ_INT(f.data_len, 0);
    CHECK_EQ_INT(f.data_start, 16);
    zs_st_close(&f);

    /* Truncation after open: the read fails, it does not crash or return garbage. */
    CHECK_OK(zs_st_open(p, &f));
    CHECK_EQ_INT(truncate(p, (off_t)(f.data_start + 10)), 0);
    r = read_named(&f, "wte.weight", got, 6);
    CHECK_EQ_INT(r, ZS_ERR_FORMAT);
    CHECK_FAILS_WITH(r, "file truncated: 14 bytes missing at offset");
    zs_st_close(&f);
}

/* Every fp16 bit pattern against the definition: (-1)^s * 2^(e-15) * 1.m, 2^-14 * 0.m. */
static void test_f16_bf16(void)
{
    const size_t n = 65536;
    uint16_t *h = malloc(n * 2);
    float *got = malloc(n * 4);
    for (size_t i = 0; i < n; i++)
        h[i] = (uint16_t)i;
    const zs_st_tensor ts[] = {
        {.name = "f16", .dtype = ZS_DT_F16, .ndim = 1, .shape = {n}, .data = h},
        {.name = "bf16", .dtype = ZS_DT_BF16, .ndim = 2, .shape = {256, 256}, .data = h},
    };
    char p[PATH_BUF];
    tpath(p, "all16.safetensors");
    CHECK_OK(zs_st_write(p, ts, 2, NULL, 0));
    zs_st_file f;
    CHECK_OK(zs_st_open(p, &f));
    CHECK_OK(read_named(&f, "f16", got, n));

    /* Known values first, so a failure is easy to read. */
    CHECK(got[0x3c00] == 1.0f);
    CHECK(got[0xc000] == -2.0f);
    CHECK(got[0x7bff] == 65504.0f);
    CHECK(got[0x0001] == ldexpf(1.0f, -24));
    CHECK(got[0x03ff] == ldexpf(1023.0f, -24));
    CHECK(got[0x0400] == ldexpf(1.0f, -14));
    CHECK(got[0x3555] == 0.333251953125f);
    CHECK(isinf(got[0x7c00]) && got[0x7c00] > 0);
    CHECK(isinf(got[0xfc00]) && got[0xfc00] < 0);
    CHECK(isnan(got[0x7e00]) && isnan(got[0x7c01]) && isnan(got[0xfe00]));
    CHECK(got[0x8000] == 0.0f && signbit(got[0x8000]));
    CHECK(got[0x0000] == 0.0f && !signbit(got[0x0000]));
    CHECK(got[0x8001] == -ldexpf(1.0f, -24));

    int wrong = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned sign = (unsigned)(i >> 15), e = (unsigned)(i >> 10) & 31, m = (unsigned)i & 1023;
        float want = e == 0   ? ldexpf((float)m, -24)
                     : e < 31 ? ldexpf((float)(1024 + m), (int)e - 25)
                     : m == 0 ? INFINITY
                              : NAN;
        if (sign)
            want = -want;
        int ok = isnan(want) ? isnan(got[i]) && !!signbit(got[i]) == !!sign
                             : bits_of(got[i]) == bits_of(want);
        if (!ok && wrong++ < 5)
            fprintf(stderr, "f16 0x%04zx: got %.9g (0x%08x), want %.9g (0x%08x)\n", i,
                    (double)got[i], bits_of(got[i]), (double)want, bits_of(want));
    }
    CHECK_EQ_INT(wrong, 0);

    CHECK_OK(read_named(&f, "bf16", got, n));
    wrong = 0;
    for (size_t i = 0; i < n; i++)
        wrong += bits_of(got[i]) != (uint32_t)i << 16;
    CHECK_EQ_INT(wrong, 0);
    zs_st_close(&f);
    free(got);
    free(h);
}

static void test_corrupt(void)
{
    /* The lowest free descriptor before and after: a leak would raise it. */
    int fd_before = dup(2);
    close(fd_before);

    /* A valid base file to cut. */
    float a[6] = {1, 2, 3, 4, 5, 6};
    const zs_st_tensor t = {.name = "w", .dtype = ZS_DT_F32, .ndim = 2, .shape = {2, 3}, .data = a};
    char cut[PATH_BUF];
    const char *p = tpath(cut, "cut.safetensors");
    CHECK_OK(zs_st_write(p, &t, 1, NULL, 0));
    struct stat st;
    CHECK_EQ_INT(stat(p, &st), 0);
    CHECK_EQ_INT(truncate(p, st.st_size - 4), 0); /* cut in the data section */
    expect_open_fails(p, ZS_ERR_FORMAT,
                      "tensor \"w\": data_offsets [0, 24] outside the data "
                      "section of 20 bytes");
    CHECK_EQ_INT(truncate(p, 20), 0); /* cut in the header */
    expect_open_fails(p, ZS_ERR_FORMAT, "does not fit the file of 20 bytes");
    CHECK_EQ_INT(truncate(p, 5), 0); /* cut in the length */
    expect_open_fails(p, ZS_ERR_FORMAT, "5 bytes is too short");
    CHECK_EQ_INT(truncate(p, 0), 0);
    expect_open_fails(p, ZS_ERR_FORMAT, "0 bytes is too short");

    const char *w = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}";
    expect_open_fails(write_raw("big", w, 1000, 24), ZS_ERR_FORMAT,
                      "header length 1000 does not fit the file of");
    expect_open_fails(write_raw("huge", w, UINT64_MAX - 7, 24), ZS_ERR_FORMAT,
                      "header length 18446744073709551608 does not fit");
    expect_open_fails(write_raw("zero", w, 0, 24), ZS_ERR_FORMAT, "header length 0 is too short");
    /* An absurd header length inside a (sparse) file that is even larger. */
    p = write_raw("absurd", w, 200u << 20, 0);
    CHECK_EQ_INT(truncate(p, (off_t)(300u << 20)), 0);
    expect_open_fails(p, ZS_ERR_FORMAT, "header length 209715200 exceeds the limit");
    unlink(p);

    /* The same header with its data is valid, so the cases below fail for their own reason. */
    zs_st_file ok;
    CHECK_OK(zs_st_open(write_raw("valid", w, UINT64_MAX, 24), &ok));
    zs_st_close(&ok);

    /* Header content. */
    expect_raw_fails("badjson", "{\"w\": {\"dtype\": ", 0, "header is not valid JSON");
    expect_raw_fails("dup", "{\"w\":{},\"w\":{}}", 0, "duplicate object key");
    expect_raw_fails("notutf8", "{\"\xff\xfe\":{}}", 0, "header is not valid JSON");
    expect_raw_fails("array", "[1, 2, 3]", 0, "header is an array, not a JSON object");
    expect_raw_fails("entry", "{\"w\": 3}", 0, "tensor \"w\": entry is 3, not an object");
    expect_raw_fails("nodtype", "{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                     "tensor \"w\": dtype is missing, not a string");
    expect_raw_fails("dtype", "{\"w\":{\"dtype\":\"F8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
                     "tensor \"w\": unknown dtype \"F8\"");
    expect_raw_fails("noshape", "{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4,
                     "shape is missing, not an array");
    expect_raw_fails("negshape",
                     "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,-3],\"data_offsets\":[0,24]}}", 24,
                     "tensor \"w\": shape[1] is -3, not a non-negative integer");
    expect_raw_fails("realshape",
                     "{\"w\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8,
                     "shape[0] is a real number");
    expect_raw_fails("ndims",
                     "{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],"
                     "\"data_offsets\":[0,4]}}",
                     4, "shape has 9 dimensions, at most 8");
    expect_raw_fails("overflow",
                     "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
                     "\"data_offsets\":[0,4]}}",
                     4, "shape [4294967296, 4294967296] of F32 overflows");
    expect_raw_fails("overflow2",
                     "{\"w\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904],"
                     "\"data_offsets\":[0,4]}}",
                     4, "of F64 overflows");
    expect_raw_fails("offs1", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4,
                     "data_offsets is an array of the wrong length");
    expect_raw_fails("offs2", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":\"0\"}}", 4,
                     "data_offsets is the string \"0\"");
    expect_raw_fails("offs3", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}",
                     4, "data_offsets[0] is -4");
    expect_raw_fails("backwards",
                     "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 8,
                     "data_offsets [8, 4] begin after they end");
    expect_raw_fails("range",
                     "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,1000]}}", 24,
                     "data_offsets [0, 1000] outside the data section of 24 bytes");
    expect_raw_fails("size", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}",
                     20, "hold 20 bytes, shape [2, 3] of F32 needs 24");
    expect_raw_fails("overlap",
                     "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                     "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}",
                     24, "tensor \"b\": data_offsets [8, 24] overlap tensor \"a\" at [0, 16]");
    expect_raw_fails("same",
                     "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                     "\"b\":{\"dtype\":\"I32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
                     16, "overlap");
    expect_raw_fails("gap",
                     "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,24]},"
                     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                     24, "data bytes [8, 16) belong to no tensor (gap before tensor \"a\")");
    expect_raw_fails("tail", w, 32, "data section has 32 bytes, tensors cover 24");
    expect_raw_fails("meta1", "{\"__metadata__\":[\"a\"]}", 0,
                     "__metadata__ is an array, not an object");
    expect_raw_fails("meta2", "{\"__metadata__\":{\"format\":\"pt\",\"step\":12}}", 0,
                     "__metadata__ \"step\" is 12, not a string");

    /* Random garbage: every seed is refused (almost always for its length). */
    uint64_t x = 0x9e3779b97f4a7c15u;
    unsigned char junk[4096];
    for (int seed = 0; seed < 64; seed++) {
        size_t len = 1 + (size_t)seed * 61;
        for (size_t i = 0; i < len; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            junk[i] = (unsigned char)(x >> 24);
        }
        if (seed % 2) /* a plausible length, so that the JSON parser sees the junk */
            for (int i = 0; i < 8; i++)
                junk[i] = (unsigned char)((len > 8 ? (len - 8) / 2 : 0) >> (8 * i));
        p = tpath(cut, "junk");
        CHECK_EQ_INT(write_bytes(p, junk, len), 0);
        zs_st_file f;
        zs_err r = zs_st_open(p, &f);
        CHECK_EQ_INT(r, ZS_ERR_FORMAT);
        CHECK_FAILS_WITH(r, p);
        zs_st_close(&f);
    }
    /* Junk inside a well-formed length prefix reaches the JSON parser. */
    memcpy(junk + 8, "\x01\x80garbage", 9);
    for (int i = 0; i < 8; i++)
        junk[i] = i == 0 ? 9 : 0;
    CHECK_EQ_INT(write_bytes(p, junk, 17), 0);
    expect_open_fails(p, ZS_ERR_FORMAT, "header is not valid JSON");

    /* Not files at all. */
    expect_open_fails(tpath(cut, "missing.safetensors"), ZS_ERR_NOTFOUND, "cannot open");
    expect_open_fails(tmpdir, ZS_ERR_IO, "not a regular file");

    int fd_after = dup(2);
    close(fd_after);
    CHECK_EQ_INT(fd_after, fd_before);
}

static void test_write_errors(void)
{
    float a[4] = {0};
    zs_st_tensor ts[2] = {
        {.name = "a", .dtype = ZS_DT_F32, .ndim = 1, .shape = {4}, .data = a},
        {.name = "a", .dtype = ZS_DT_F32, .ndim = 1, .shape = {4}, .data = a},
    };
    char p[PATH_BUF];
    tpath(p, "bad.safetensors");
    char tmp[PATH_BUF + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    zs_err r = zs_st_write(p, ts, 2, NULL, 0);
    CHECK_EQ_INT(r, ZS_ERR_INVALID);
    CHECK_FAILS_WITH(r, "tensor \"a\" given twice");
    ts[1].name = "__metadata__";
    CHECK_FAILS_WITH(zs_st_write(p, ts, 2, NULL, 0), "reserved");
    ts[1].name = "b";
    ts[1].ndim = 9;
    CHECK_FAILS_WITH(zs_st_write(p, ts, 2, NULL, 0), "tensor \"b\": 9 dimensions");
    ts[1].ndim = 1;
    ts[1].dtype = (zs_dtype)77;
    CHECK_FAILS_WITH(zs_st_write(p, ts, 2, NULL, 0), "unknown dtype 77");
    ts[1].dtype = ZS_DT_F32;
    ts[1].data = NULL;
    CHECK_FAILS_WITH(zs_st_write(p, ts, 2, NULL, 0), "tensor \"b\": shape [4] but no data");
    ts[1].data = a;
    ts[1].ndim = 2;
    ts[1].shape[0] = ts[1].shape[1] = (size_t)1 << 33;
    CHECK_FAILS_WITH(zs_st_write(p, ts, 2, NULL, 0), "shape [8589934592, 8589934592] overflows");
    ts[1].ndim = 1;
    ts[1].shape[0] = 4;
    static const char *const dupmeta[] = {"k", "1", "k", "2"};
    CHECK_FAILS_WITH(zs_st_write(p, ts, 2, dupmeta, 2), "metadata key \"k\" given twice");
    static const char *const badmeta[] = {"k", "\xff"};
    CHECK_FAILS_WITH(zs_st_write(p, ts, 2, badmeta, 1), "not valid UTF-8");
    CHECK_FAILS_WITH(zs_st_write(p, ts, -1, NULL, 0), "-1 tensors");
    /* None of the refused writes left a file behind. */
    CHECK(access(p, F_OK) != 0);
    CHECK(access(tmp, F_OK) != 0);

    r = zs_st_write("/nonexistent-dir/x.safetensors", ts, 2, NULL, 0);
    CHECK_EQ_INT(r, ZS_ERR_IO);
    CHECK_FAILS_WITH(r, "/nonexistent-dir/x.safetensors.tmp");

    /* An existing file is replaced whole. */
    CHECK_OK(zs_st_write(p, ts, 2, NULL, 0));
    CHECK_OK(zs_st_write(p, ts, 1, NULL, 0));
    zs_st_file f;
    CHECK_OK(zs_st_open(p, &f));
    CHECK_EQ_INT(f.count, 1);
    zs_st_close(&f);
}

static void test_close_zeroed(void)
{
    /* A zeroed struct (fd 0) owns nothing: closing it must leave stdin alone. */
    int open_before = fcntl(0, F_GETFD) != -1;
    zs_st_file f;
    memset(&f, 0, sizeof f);
    zs_st_close(&f);
    CHECK_EQ_INT(fcntl(0, F_GETFD) != -1, open_before);
    CHECK_EQ_INT(f.fd, -1);
}

static void remove_tmpdir(void)
{
    DIR *d = opendir(tmpdir);
    if (!d)
        return;
    struct dirent *de;
    char p[PATH_BUF];
    while ((de = readdir(d))) {
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
            unlink(tpath(p, de->d_name));
    }
    closedir(d);
    CHECK_EQ_INT(rmdir(tmpdir), 0);
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/zs_test_st_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_round_trip();
    test_f16_bf16();
    test_corrupt();
    test_write_errors();
    test_close_zeroed();
    remove_tmpdir();
    return zs_test_result("test_safetensors");
}
