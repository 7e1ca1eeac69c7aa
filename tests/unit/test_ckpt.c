/*
 * ckpt: a checkpoint written as shard files that cut through tensors opens, verifies and reads
 * back bit for bit over any ranges (resharding); its export equals zs_modelfile_save's files
 * byte for byte; every kind of damage (a flipped byte in each array and in a header, a
 * truncated or missing shard file, a flipped byte in the manifest, a manifest of another run)
 * is refused with a message naming the file; resolve falls back to an older valid checkpoint
 * and says so; prune keeps what it must; and a full disk (a 1 MiB tmpfs in a private mount
 * namespace, when running as root) fails with the OS's reason and leaves no file behind; shard
 * files whose arrays were written in place (zs_ckpt_finish_shard) complete to the same bytes.
 *
 * Set ZS_TEST_KEEP=1 to keep the temporary directory (its path is printed), e.g. to try
 * `zshard export` on the checkpoint it holds.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/ckpt.h"
#include "common/modelfile.h"
#include "common/safetensors.h"
#include "tests/unit/test.h"

#define PATH_BUF 4096

static char root[256];

/* A big enough model that one shard array spans several 1 MiB read chunks, and a tiny one
 * for the tests that write many checkpoints. */
static const zs_model_config big = {
    .n_layer = 2, .n_head = 4, .n_embd = 64, .vocab_size = 5003, .block_size = 32};
static const zs_model_config tiny = {
    .n_layer = 2, .n_head = 2, .n_embd = 8, .vocab_size = 13, .block_size = 6};

/* A run's training state: the tensor table, what the manifest records, the three arrays. */
typedef struct {
    zs_tensor_table tt;
    zs_ckpt_info info;
    float *a[ZS_CKPT_ARRAYS];
} state;

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void state_init(state *st, const zs_model_config *m, uint64_t seed, long step,
                       uint64_t run_id)
{
    CHECK_OK(zs_tensors_gpt2(m, &st->tt));
    st->info = (zs_ckpt_info){.step = step,
                              .steps_total = 100,
                              .run_id = run_id,
                              .config_fingerprint = 0x1111222233334444ull,
                              .data_fingerprint = 0x5555666677778888ull,
                              .data_ntokens = 123456,
                              .model = *m,
                              .total_floats = st->tt.total,
                              .shard_floats = 0};
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int a = 0; a < ZS_CKPT_ARRAYS; a++) {
        st->a[a] = malloc(st->tt.total * sizeof(float));
        for (size_t i = 0; i < st->tt.total; i++)
            st->a[a][i] = (float)((double)(int64_t)rng_next(&s) / 9.2e18);
    }
}

static void state_free(state *st)
{
    for (int a = 0; a < ZS_CKPT_ARRAYS; a++)
        free(st->a[a]);
    zs_tensors_free(&st->tt);
}

/* Writes st as a checkpoint under dir with shard boundaries cuts[0..n] (cuts[0] = 0,
 * cuts[n] = total); sets latest when asked.  The step directory's path goes to step_dir. */
static void write_ckpt(const char *dir, state *st, const size_t *cuts, int n, int latest,
                       char *step_dir)
{
    zs_ckpt_shard shards[16];
    st->info.shard_floats = cuts[1] - cuts[0];
    CHECK_OK(zs_ckpt_step_dir(dir, st->info.step, 1, step_dir, PATH_BUF));
    for (int i = 0; i < n; i++)
        CHECK_OK(zs_ckpt_write_shard(step_dir, &st->info, i, cuts[i], cuts[i + 1],
                                     st->a[0] + cuts[i], st->a[1] + cuts[i], st->a[2] + cuts[i],
                                     &shards[i]));
    CHECK_OK(zs_ckpt_write_manifest(step_dir, &st->info, &st->tt, shards, n));
    if (latest)
        CHECK_OK(zs_ckpt_set_latest(dir, strrchr(step_dir, '/') + 1));
}

/* Equal-size shards of k floats. */
static int even_cuts(size_t total, size_t k, size_t *cuts)
{
    int n = 0;
    cuts[0] = 0;
    while (cuts[n] < total) {
        cuts[n + 1] = cuts[n] + k < total ? cuts[n] + k : total;
        n++;
    }
    return n;
}

static char *read_whole(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    buf[got] = '\0';
    *len = got;
    return buf;
}

static void write_whole(const char *path, const void *buf, size_t n)
{
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f)
        return;
    CHECK(fwrite(buf, 1, n, f) == n);
    fclose(f);
}

static int files_equal(const char *a, const char *b)
{
    size_t na, nb;
    char *x = read_whole(a, &na), *y = read_whole(b, &nb);
    int same = x && y && na == nb && memcmp(x, y, na) == 0;
    if (!same)
        fprintf(stderr, "%s (%zu bytes) and %s (%zu bytes) differ\n", a, x ? na : 0, b, y ? nb : 0);
    free(x);
    free(y);
    return same;
}

static void flip_byte(const char *path, size_t off)
{
    int fd = open(path, O_RDWR);
    unsigned char c = 0;
    CHECK(fd >= 0 && pread(fd, &c, 1, (off_t)off) == 1);
    c ^= 0x01;
    CHECK(pwrite(fd, &c, 1, (off_t)off) == 1);
    close(fd);
}

static void set_byte(const char *path, size_t off, unsigned char c)
{
    int fd = open(path, O_RDWR);
    CHECK(fd >= 0 && pwrite(fd, &c, 1, (off_t)off) == 1);
    close(fd);
}

/* The data section's offset of a shard file, from its header. */
static size_t data_start_of(const char *path)
{
    zs_st_file f;
    CHECK_OK(zs_st_open(path, &f));
    size_t d = f.data_start;
    zs_st_close(&f);
    return d;
}

/* stderr goes to a file between capture_begin and capture_end, which returns what was
 * written (malloc'd). */
static int capture_fd = -1;
static char capture_path[PATH_BUF];

static void capture_begin(void)
{
    fflush(stderr);
    snprintf(capture_path, sizeof capture_path, "%s/stderr.txt", root);
    int fd = open(capture_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    capture_fd = dup(2);
    dup2(fd, 2);
    close(fd);
}

static char *capture_end(void)
{
    fflush(stderr);
    dup2(capture_fd, 2);
    close(capture_fd);
    size_t n;
    char *text = read_whole(capture_path, &n);
    fputs(text ? text : "", stderr); /* still shown in the test's log */
    return text;
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Open + verify of step_dir fails with code and a message containing each of two needles. */
static void expect_refused(const char *step_dir, zs_err code, const char *n1, const char *n2)
{
    zs_ckpt ck;
    zs_err res = zs_ckpt_open(step_dir, &ck);
    if (res == ZS_OK) {
        res = zs_ckpt_verify(&ck);
        zs_ckpt_close(&ck);
    }
    CHECK_EQ_INT(res, code);
    if (!strstr(zs_last_error(), n1) || (n2 && !strstr(zs_last_error(), n2))) {
        fprintf(stderr, "message \"%s\" lacks \"%s\" or \"%s\"\n", zs_last_error(), n1,
                n2 ? n2 : "");
        CHECK(0);
    }
}

static void progress_cb(void *user, uint64_t done, uint64_t total)
{
    uint64_t *p = user;
    CHECK(done > p[0] && done <= total);
    p[0] = done;
    p[1] = total;
    p[2]++;
}

/* Open, verify, ranges, resharded reads, export. */
/* An fp16 job's manifest carries the loss scaler's state; it reads back exactly (the scale as
 * a hexadecimal float, last_overflow -1 included). */
static void test_scaler(state *st)
{
    char dir[PATH_BUF], step_dir[PATH_BUF];
    snprintf(dir, sizeof dir, "%s/scaler", root);
    size_t cuts[3] = {0, 200000, st->tt.total};
    zs_ckpt_info saved = st->info;
    zs_lossscale cases[2] = {
        {.scale = 0x1p+18, .hysteresis = 1, .last_overflow = 2, .iter = 3, .skipped = 3},
        {.scale = 0x1p-20, .hysteresis = 7, .last_overflow = -1, .iter = 9, .skipped = 0}};
    for (int k = 0; k < 2; k++) {
        st->info.step = 3 + 6 * k;
        st->info.has_scaler = 1;
        st->info.scaler = cases[k];
        write_ckpt(dir, st, cuts, 2, 0, step_dir);
        zs_ckpt ck;
        CHECK_OK(zs_ckpt_open(step_dir, &ck));
        CHECK_EQ_INT(ck.info.has_scaler, 1);
        CHECK(ck.info.scaler.scale == cases[k].scale);
        CHECK_EQ_INT(ck.info.scaler.hysteresis, cases[k].hysteresis);
        CHECK_EQ_INT(ck.info.scaler.last_overflow, cases[k].last_overflow);
        CHECK_EQ_INT(ck.info.scaler.iter, cases[k].iter);
        CHECK_EQ_INT(ck.info.scaler.skipped, cases[k].skipped);
        zs_ckpt_close(&ck);
    }
    st->info = saved;
}

static void test_roundtrip(state *st, const char *step_dir)
{
    zs_ckpt ck;
    CHECK_OK(zs_ckpt_open(step_dir, &ck));
    CHECK_OK(zs_ckpt_verify(&ck));
    CHECK_EQ_INT(ck.info.step, st->info.step);
    CHECK_EQ_INT(ck.info.steps_total, st->info.steps_total);
    CHECK(ck.info.run_id == st->info.run_id);
    CHECK(ck.info.config_fingerprint == st->info.config_fingerprint);
    CHECK(ck.info.data_fingerprint == st->info.data_fingerprint);
    CHECK(ck.info.data_ntokens == st->info.data_ntokens);
    CHECK(memcmp(&ck.info.model, &st->info.model, sizeof ck.info.model) == 0);
    CHECK_EQ_INT(ck.info.total_floats, st->tt.total);
    CHECK_EQ_INT(ck.tt.count, st->tt.count);
    CHECK_EQ_INT(ck.n_shards, 4);
    CHECK_EQ_INT(ck.info.has_scaler, 0); /* a non-fp16 job's manifest has no loss_scaler */

    size_t total = st->tt.total;
    float *buf = malloc(total * sizeof *buf);
    for (int a = 0; a < ZS_CKPT_ARRAYS; a++) {
        memset(buf, 0, total * sizeof *buf);
        CHECK_OK(zs_ckpt_read(&ck, (zs_ckpt_array)a, 0, total, buf));
        CHECK(memcmp(buf, st->a[a], total * sizeof *buf) == 0);
        /* Ranges inside one shard, across one boundary, across three shards, at the ends. */
        static const size_t ranges[][2] = {{5, 6},           {269990, 270020}, {299999, 380038},
                                           {0, 1},           {100, 100},       {380037, 380038},
                                           {422300, 422336}, {1000, 269000}};
        for (size_t r = 0; r < sizeof ranges / sizeof ranges[0]; r++) {
            size_t b = ranges[r][0], e = ranges[r][1];
            CHECK_OK(zs_ckpt_read(&ck, (zs_ckpt_array)a, b, e, buf));
            CHECK(memcmp(buf, st->a[a] + b, (e - b) * sizeof *buf) == 0);
        }
        /* Another run's view of the same vector: shards of 65549 floats. */
        size_t k = 65549;
        int same = 1;
        for (size_t b = 0; b < total; b += k) {
            size_t e = b + k < total ? b + k : total;
            CHECK_OK(zs_ckpt_read(&ck, (zs_ckpt_array)a, b, e, buf));
            same &= memcmp(buf, st->a[a] + b, (e - b) * sizeof *buf) == 0;
        }
        CHECK(same);
    }
    CHECK_FAILS_WITH(zs_ckpt_read(&ck, ZS_CKPT_PARAM, 10, total + 1, buf), "outside the vector");
    CHECK_FAILS_WITH(zs_ckpt_read(&ck, (zs_ckpt_array)3, 0, 1, buf), "array 3");

    /* Export equals zs_modelfile_save of the same vector, byte for byte. */
    char out[PATH_BUF], ref[PATH_BUF], a[PATH_BUF + 32], b[PATH_BUF + 32];
    snprintf(out, sizeof out, "%s/export", root);
    snprintf(ref, sizeof ref, "%s/reference", root);
    uint64_t prog[3] = {0, 0, 0};
    CHECK_OK(zs_ckpt_export(&ck, out, progress_cb, prog));
    CHECK_EQ_INT(prog[2], ck.n_shards);
    CHECK(prog[0] == prog[1] && prog[1] == (uint64_t)total * 4);
    CHECK_OK(zs_modelfile_save(&st->tt, &st->info.model, st->a[ZS_CKPT_PARAM], ref));
    snprintf(a, sizeof a, "%s/model.safetensors", out);
    snprintf(b, sizeof b, "%s/model.safetensors", ref);
    CHECK(files_equal(a, b));
    snprintf(a, sizeof a, "%s/config.json", out);
    snprintf(b, sizeof b, "%s/config.json", ref);
    CHECK(files_equal(a, b));
    snprintf(a, sizeof a, "%s/model.safetensors.tmp", out);
    CHECK(!exists(a));
    /* And it loads as a model directory with the checkpoint's weights. */
    zs_model_config m;
    zs_tensor_table tt;
    float *params = NULL;
    CHECK_OK(zs_modelfile_load(out, &m, &tt, &params));
    int same = params != NULL;
    for (int i = 0; same && i < tt.count; i++)
        same = memcmp(params + tt.tensors[i].offset, st->a[0] + tt.tensors[i].offset,
                      tt.tensors[i].numel * sizeof(float)) == 0;
    CHECK(same);
    free(params);
    zs_tensors_free(&tt);

    /* Compatibility with the resuming run. */
    zs_ckpt_info info = st->info;
    CHECK_OK(zs_ckpt_check_compatible(&ck, &info));
    info.config_fingerprint ^= 1;
    CHECK_FAILS_WITH(zs_ckpt_check_compatible(&ck, &info), "config_fingerprint");
    CHECK_FAILS_WITH(zs_ckpt_check_compatible(&ck, &info), "manifest.json");
    info = st->info;
    info.data_fingerprint ^= 1;
    CHECK_FAILS_WITH(zs_ckpt_check_compatible(&ck, &info), "data_fingerprint");
    info = st->info;
    info.model.n_layer = 3;
    CHECK_FAILS_WITH(zs_ckpt_check_compatible(&ck, &info), "model");
    info = st->info;
    info.steps_total = st->info.step;
    CHECK_FAILS_WITH(zs_ckpt_check_compatible(&ck, &info), "steps_total");
    zs_ckpt_close(&ck);
    free(buf);
}

/* Each kind of damage is refused naming the file; the checkpoint is restored after each. */
static void test_refusals(state *st, const char *step_dir, const size_t *cuts)
{
    char shard[PATH_BUF + 64], manifest[PATH_BUF + 32], aside[PATH_BUF + 128];
    snprintf(shard, sizeof shard, "%s/shard-000001.safetensors", step_dir);
    snprintf(manifest, sizeof manifest, "%s/manifest.json", step_dir);
    size_t len = cuts[2] - cuts[1], ds = data_start_of(shard);
    CHECK_EQ_INT(ds % 4096, 0);
    static const char *const names[] = {"param data", "exp_avg data", "exp_avg_sq data"};
    float *buf = malloc(len * sizeof *buf);
    for (int a = 0; a < ZS_CKPT_ARRAYS; a++) {
        size_t off = ds + (size_t)a * len * 4 + 4 * 17 + 2;
        flip_byte(shard, off);
        expect_refused(step_dir, ZS_ERR_FORMAT, shard, names[a]);
        /* A read of that array through that file is refused too; other arrays still read. */
        zs_ckpt ck;
        CHECK_OK(zs_ckpt_open(step_dir, &ck));
        CHECK_FAILS_WITH(zs_ckpt_read(&ck, (zs_ckpt_array)a, cuts[1] + 100, cuts[1] + 101, buf),
                         shard);
        int other = (a + 1) % ZS_CKPT_ARRAYS;
        CHECK_OK(zs_ckpt_read(&ck, (zs_ckpt_array)other, cuts[1], cuts[2], buf));
        CHECK(memcmp(buf, st->a[other] + cuts[1], len * sizeof *buf) == 0);
        zs_ckpt_close(&ck);
        flip_byte(shard, off);
        expect_refused(step_dir, ZS_OK, "", NULL); /* restored */
    }
    free(buf);

    /* The header: a padding space turned into another whitespace keeps the JSON valid and
     * the metadata right, so only the header checksum catches it; a digit of the metadata's
     * begin is caught by name. */
    set_byte(shard, ds - 2, '\n');
    expect_refused(step_dir, ZS_ERR_FORMAT, shard, "header checksum");
    set_byte(shard, ds - 2, ' ');
    size_t n;
    char *text = read_whole(shard, &n);
    char needle[64];
    snprintf(needle, sizeof needle, "\"begin\":\"%zu\"", cuts[1]);
    char *p = text ? memmem(text, ds, needle, strlen(needle)) : NULL;
    CHECK(p != NULL);
    if (p) {
        size_t off = (size_t)(p - text) + strlen("\"begin\":\"");
        flip_byte(shard, off);
        expect_refused(step_dir, ZS_ERR_FORMAT, shard, "__metadata__.begin");
        flip_byte(shard, off);
    }

    /* Truncated by 4 bytes, then missing. */
    CHECK(truncate(shard, (off_t)(n - 4)) == 0);
    expect_refused(step_dir, ZS_ERR_FORMAT, shard, "truncated");
    write_whole(shard, text, n);
    free(text);
    snprintf(aside, sizeof aside, "%s.aside", shard);
    CHECK(rename(shard, aside) == 0);
    expect_refused(step_dir, ZS_ERR_NOTFOUND, shard, "No such file");
    CHECK(rename(aside, shard) == 0);
    expect_refused(step_dir, ZS_OK, "", NULL);

    /* The manifest: a flipped byte in a value, in a shard's checksum and in its own checksum. */
    text = read_whole(manifest, &n);
    const char *marks[] = {"\"step\": ", "\"header_xxh3\": \"", "\"checksum\": \"", "\"begin\": 2"};
    for (int i = 0; i < 4; i++) {
        p = text ? strstr(text, marks[i]) : NULL;
        CHECK(p != NULL);
        if (!p)
            continue;
        size_t off = (size_t)(p - text) + strlen(marks[i]);
        flip_byte(manifest, off);
        expect_refused(step_dir, ZS_ERR_FORMAT, manifest, NULL);
        flip_byte(manifest, off);
    }
    expect_refused(step_dir, ZS_OK, "", NULL);

    /* A manifest of another run (same model, step and shards) copied in. */
    state other;
    state_init(&other, &big, 99, st->info.step, 0xfeedfacecafebeefull);
    char odir[PATH_BUF], ostep[PATH_BUF], omanifest[PATH_BUF + 32];
    snprintf(odir, sizeof odir, "%s/other", root);
    write_ckpt(odir, &other, cuts, 4, 1, ostep);
    snprintf(omanifest, sizeof omanifest, "%s/manifest.json", ostep);
    size_t on;
    char *otext = read_whole(omanifest, &on);
    write_whole(manifest, otext, on);
    expect_refused(step_dir, ZS_ERR_FORMAT, "another run", "shard-000000.safetensors");
    write_whole(manifest, text, n);
    expect_refused(step_dir, ZS_OK, "", NULL);
    free(otext);
    free(text);
    state_free(&other);
}

/* Writer refusals: a shard list with a gap, a table of another model, a bad latest name, a
 * step directory that does not exist. */
static void test_writer_refusals(state *st)
{
    char dir[PATH_BUF], step_dir[PATH_BUF];
    snprintf(dir, sizeof dir, "%s/writer", root);
    CHECK_OK(zs_ckpt_step_dir(dir, 1, 1, step_dir, sizeof step_dir));
    zs_ckpt_shard sh[2];
    size_t half = st->tt.total / 2;
    CHECK_OK(
        zs_ckpt_write_shard(step_dir, &st->info, 0, 0, half, st->a[0], st->a[1], st->a[2], &sh[0]));
    CHECK_OK(zs_ckpt_write_shard(step_dir, &st->info, 1, half + 64, st->tt.total,
                                 st->a[0] + half + 64, st->a[1] + half + 64, st->a[2] + half + 64,
                                 &sh[1]));
    st->info.shard_floats = half;
    CHECK_FAILS_WITH(zs_ckpt_write_manifest(step_dir, &st->info, &st->tt, sh, 2), "a gap");
    zs_tensor_table other;
    CHECK_OK(zs_tensors_gpt2(&tiny, &other));
    CHECK_FAILS_WITH(zs_ckpt_write_manifest(step_dir, &st->info, &other, sh, 2), "tensor table");
    zs_tensors_free(&other);
    char manifest[PATH_BUF + 32];
    snprintf(manifest, sizeof manifest, "%s/manifest.json", step_dir);
    CHECK(!exists(manifest));
    CHECK_FAILS_WITH(zs_ckpt_set_latest(dir, "../step-00000001"), "not a step directory name");

    char missing[PATH_BUF];
    snprintf(missing, sizeof missing, "%s/no/such/dir", root);
    zs_ckpt_shard s;
    zs_err res =
        zs_ckpt_write_shard(missing, &st->info, 0, 0, 64, st->a[0], st->a[1], st->a[2], &s);
    CHECK_EQ_INT(res, ZS_ERR_IO);
    CHECK(strstr(zs_last_error(), missing) != NULL);
    CHECK(strstr(zs_last_error(), "No such file or directory") != NULL);
}

/* Shard files whose arrays another writer put in place (as the NVMe tier does): two shards,
 * the first with its weights there too, the second with them given to zs_ckpt_finish_shard;
 * each file a page longer than its data (the tier's last write rounds up) and with garbage
 * where the header goes.  The manifest then lists them, and the checkpoint verifies and reads
 * back bit for bit, the same files zs_ckpt_write_shard writes.  A file that is not there is
 * ZS_ERR_NOTFOUND, named. */
static void test_finish_in_place(state *st)
{
    char dir[PATH_BUF], step_dir[PATH_BUF], path[PATH_BUF + 64], ref[PATH_BUF + 64];
    snprintf(dir, sizeof dir, "%s/in_place", root);
    CHECK_OK(zs_ckpt_step_dir(dir, st->info.step, 1, step_dir, sizeof step_dir));
    size_t cuts[3] = {0, 100000, st->tt.total};
    zs_ckpt_shard sh[2];
    for (int i = 0; i < 2; i++) {
        size_t len = cuts[i + 1] - cuts[i];
        CHECK_OK(zs_ckpt_shard_path(step_dir, i, path, sizeof path));
        int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
        CHECK(fd >= 0);
        char junk[ZS_CKPT_DATA_OFFSET];
        memset(junk, 'x', sizeof junk);
        CHECK(pwrite(fd, junk, sizeof junk, 0) == (ssize_t)sizeof junk);
        uint64_t sums[ZS_CKPT_ARRAYS] = {0};
        for (int a = i; a < ZS_CKPT_ARRAYS; a++) { /* shard 1: the weights are not there */
            off_t at = ZS_CKPT_DATA_OFFSET + (off_t)(a * len * 4);
            CHECK(pwrite(fd, st->a[a] + cuts[i], len * 4, at) == (ssize_t)(len * 4));
            sums[a] = XXH3_64bits(st->a[a] + cuts[i], len * 4);
        }
        CHECK(pwrite(fd, junk, sizeof junk, ZS_CKPT_DATA_OFFSET + (off_t)(12 * len)) ==
              (ssize_t)sizeof junk);
        close(fd);
        CHECK_OK(zs_ckpt_finish_shard(step_dir, &st->info, i, cuts[i], cuts[i + 1],
                                      i ? st->a[0] + cuts[i] : NULL, sums, &sh[i]));
    }
    st->info.shard_floats = cuts[1];
    CHECK_OK(zs_ckpt_write_manifest(step_dir, &st->info, &st->tt, sh, 2));
    zs_ckpt ck;
    CHECK_OK(zs_ckpt_open(step_dir, &ck));
    CHECK_OK(zs_ckpt_verify(&ck));
    float *back = malloc(st->tt.total * sizeof(float));
    for (int a = 0; a < ZS_CKPT_ARRAYS; a++) {
        CHECK_OK(zs_ckpt_read(&ck, (zs_ckpt_array)a, 0, st->tt.total, back));
        CHECK(memcmp(back, st->a[a], st->tt.total * sizeof(float)) == 0);
    }
    zs_ckpt_close(&ck);
    free(back);
    /* The same bytes as the usual writer's. */
    char other[PATH_BUF];
    snprintf(other, sizeof other, "%s/usual", root);
    CHECK_OK(zs_ckpt_step_dir(other, st->info.step, 1, ref, PATH_BUF));
    zs_ckpt_shard u;
    CHECK_OK(zs_ckpt_write_shard(ref, &st->info, 1, cuts[1], cuts[2], st->a[0] + cuts[1],
                                 st->a[1] + cuts[1], st->a[2] + cuts[1], &u));
    CHECK(u.bytes == sh[1].bytes && u.header_xxh3 == sh[1].header_xxh3 &&
          memcmp(u.xxh3, sh[1].xxh3, sizeof u.xxh3) == 0);
    char ref_file[PATH_BUF + 64];
    CHECK_OK(zs_ckpt_shard_path(ref, 1, ref_file, sizeof ref_file));
    CHECK_OK(zs_ckpt_shard_path(step_dir, 1, path, sizeof path));
    CHECK(files_equal(path, ref_file));
    uint64_t none[ZS_CKPT_ARRAYS] = {0};
    CHECK_OK(zs_ckpt_shard_path(step_dir, 5, path, sizeof path));
    zs_err res = zs_ckpt_finish_shard(step_dir, &st->info, 5, 0, 64, NULL, none, &u);
    CHECK_EQ_INT(res, ZS_ERR_NOTFOUND);
    CHECK(strstr(zs_last_error(), path) != NULL);
}

/* Writes a tiny checkpoint at step under dir with three shards. */
static void tiny_ckpt(const char *dir, long step, int latest, char *step_dir)
{
    state st;
    state_init(&st, &tiny, (uint64_t)step, step, 0xabcdef0123456789ull);
    size_t cuts[8];
    int n = even_cuts(st.tt.total, st.tt.total / 3 + 1, cuts);
    write_ckpt(dir, &st, cuts, n, latest, step_dir);
    state_free(&st);
}

static void test_resolve(void)
{
    char dir[PATH_BUF], s3[PATH_BUF], s7[PATH_BUF], shard[PATH_BUF + 64];
    snprintf(dir, sizeof dir, "%s/resolve", root);
    tiny_ckpt(dir, 3, 1, s3);
    tiny_ckpt(dir, 7, 1, s7);
    /* A newer directory that was never committed (no manifest) is not considered. */
    char s9[PATH_BUF];
    CHECK_OK(zs_ckpt_step_dir(dir, 9, 1, s9, sizeof s9));

    zs_ckpt ck;
    CHECK_OK(zs_ckpt_resolve(dir, &ck));
    CHECK_EQ_INT(ck.info.step, 7);
    zs_ckpt_close(&ck);
    CHECK_OK(zs_ckpt_resolve(s3, &ck)); /* a step directory names that checkpoint */
    CHECK_EQ_INT(ck.info.step, 3);
    zs_ckpt_close(&ck);

    /* The newest is corrupt: resolve falls back to step 3 and says so, naming the file. */
    snprintf(shard, sizeof shard, "%s/shard-000001.safetensors", s7);
    size_t off = data_start_of(shard) + 8;
    flip_byte(shard, off);
    capture_begin();
    zs_err res = zs_ckpt_resolve(dir, &ck);
    char *log = capture_end();
    CHECK_OK(res);
    CHECK_EQ_INT(ck.info.step, 3);
    zs_ckpt_close(&ck);
    CHECK(log && strstr(log, "WARN") && strstr(log, shard) && strstr(log, "trying older"));
    CHECK(log && strstr(log, "resuming from") && strstr(log, "step-00000003"));
    free(log);
    /* A step directory given by name does not fall back. */
    CHECK_FAILS_WITH(zs_ckpt_resolve(s7, &ck), shard);

    /* latest naming a missing directory: the same fallback. */
    CHECK_OK(zs_ckpt_set_latest(dir, "step-00000008"));
    capture_begin();
    res = zs_ckpt_resolve(dir, &ck);
    log = capture_end();
    CHECK_OK(res);
    CHECK_EQ_INT(ck.info.step, 3);
    zs_ckpt_close(&ck);
    CHECK(log && strstr(log, "step-00000008"));
    free(log);
    CHECK_OK(zs_ckpt_set_latest(dir, "step-00000007"));

    /* Nothing valid: NOTFOUND naming why the newest failed. */
    char shard3[PATH_BUF + 64];
    snprintf(shard3, sizeof shard3, "%s/shard-000000.safetensors", s3);
    CHECK(truncate(shard3, 100) == 0);
    capture_begin();
    res = zs_ckpt_resolve(dir, &ck);
    free(capture_end());
    CHECK_EQ_INT(res, ZS_ERR_NOTFOUND);
    CHECK(strstr(zs_last_error(), "no valid checkpoint") && strstr(zs_last_error(), shard));

    char nothing[PATH_BUF];
    snprintf(nothing, sizeof nothing, "%s/empty", root);
    CHECK(mkdir(nothing, 0777) == 0);
    CHECK_EQ_INT(zs_ckpt_resolve(nothing, &ck), ZS_ERR_NOTFOUND);
    /* zs_ckpt_present: an empty or absent directory holds nothing (a fresh start); one whose
     * checkpoints are all damaged still holds some (the resume must fail, not start over). */
    int any = -1;
    CHECK_OK(zs_ckpt_present(nothing, &any));
    CHECK_EQ_INT(any, 0);
    CHECK_OK(zs_ckpt_present(dir, &any));
    CHECK_EQ_INT(any, 1);
    CHECK_OK(zs_ckpt_present(s3, &any)); /* a step directory */
    CHECK_EQ_INT(any, 1);
    char only[PATH_BUF], only_step[PATH_BUF];
    snprintf(only, sizeof only, "%s/only-a-step-dir", root);
    CHECK(mkdir(only, 0777) == 0);
    CHECK_OK(zs_ckpt_step_dir(only, 4, 1, only_step, sizeof only_step));
    CHECK_OK(zs_ckpt_present(only, &any)); /* an uncommitted step directory counts too */
    CHECK_EQ_INT(any, 1);
    snprintf(nothing, sizeof nothing, "%s/absent", root);
    CHECK_EQ_INT(zs_ckpt_resolve(nothing, &ck), ZS_ERR_NOTFOUND);
    CHECK_OK(zs_ckpt_present(nothing, &any));
    CHECK_EQ_INT(any, 0);
    CHECK_FAILS_WITH(zs_ckpt_present(shard3, &any), "not a directory");
}

/* zs_ckpt_discard removes a whole checkpoint, manifest included (a commit that failed after
 * its manifest was written): nothing of it is left, and the previous one is what a resume
 * finds. */
static void test_discard(void)
{
    char dir[PATH_BUF], s3[PATH_BUF], s5[PATH_BUF];
    snprintf(dir, sizeof dir, "%s/discard", root);
    tiny_ckpt(dir, 3, 1, s3);
    tiny_ckpt(dir, 5, 0, s5);
    zs_ckpt_discard(dir, 5);
    CHECK(!exists(s5));
    CHECK(exists(s3));
    zs_ckpt ck;
    CHECK_OK(zs_ckpt_resolve(dir, &ck));
    CHECK_EQ_INT(ck.info.step, 3);
    zs_ckpt_close(&ck);
    zs_ckpt_discard(dir, 9); /* nothing there: nothing to do */
    CHECK(exists(s3));
}

static int step_exists(const char *dir, long step)
{
    char path[PATH_BUF];
    CHECK_OK(zs_ckpt_step_dir(dir, step, 0, path, sizeof path));
    return exists(path);
}

static void test_prune(void)
{
    char dir[PATH_BUF], sd[PATH_BUF];
    snprintf(dir, sizeof dir, "%s/prune", root);
    for (long s = 1; s <= 6; s++)
        tiny_ckpt(dir, s, s != 2, sd);
    /* Step 2 abandoned (its manifest never written), step 8 being written. */
    char manifest[PATH_BUF + 32];
    CHECK_OK(zs_ckpt_step_dir(dir, 2, 0, sd, sizeof sd));
    snprintf(manifest, sizeof manifest, "%s/manifest.json", sd);
    CHECK(unlink(manifest) == 0);
    tiny_ckpt(dir, 8, 0, sd);
    snprintf(manifest, sizeof manifest, "%s/manifest.json", sd);
    CHECK(unlink(manifest) == 0);

    zs_ckpt_prune(dir, 6, 3);
    long kept[] = {4, 5, 6, 8}, gone[] = {1, 2, 3};
    for (int i = 0; i < 4; i++)
        CHECK(step_exists(dir, kept[i]));
    for (int i = 0; i < 3; i++)
        CHECK(!step_exists(dir, gone[i]));
    zs_ckpt_prune(dir, 6, 1);
    CHECK(step_exists(dir, 6) && step_exists(dir, 8));
    CHECK(!step_exists(dir, 4) && !step_exists(dir, 5));

    /* The newest committed one turns out corrupt: the newest valid (6) is still kept. */
    tiny_ckpt(dir, 9, 1, sd);
    snprintf(manifest, sizeof manifest, "%s/manifest.json", sd);
    flip_byte(manifest, 40);
    zs_ckpt_prune(dir, 9, 1);
    CHECK(step_exists(dir, 9) && step_exists(dir, 6));
    CHECK(!step_exists(dir, 8));
    zs_ckpt_prune(dir, 9, 0); /* keep 0 means 1 */
    CHECK(step_exists(dir, 6));
}

/* Lists dir's entries other than "." and ".." into names (space-separated). */
static int list_dir(const char *dir, char *names, size_t cap)
{
    DIR *d = opendir(dir);
    int n = 0;
    names[0] = '\0';
    if (!d)
        return -1;
    struct dirent *de;
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
            n++;
            snprintf(names + strlen(names), cap - strlen(names), "%s ", de->d_name);
        }
    closedir(d);
    return n;
}

/* In a child: a private mount namespace with a 1 MiB tmpfs; a shard write and an export that
 * do not fit fail with ENOSPC's message and leave nothing.  Exit 0 pass, 1 fail, 77 skip. */
static int disk_full_child(const char *step_dir)
{
    int failures_before = zs_test_failures;
    if (unshare(CLONE_NEWNS) != 0) {
        printf("disk-full part skipped: unshare(CLONE_NEWNS): %s\n", strerror(errno));
        return 77;
    }
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) {
        printf("disk-full part skipped: making / private: %s\n", strerror(errno));
        return 77;
    }
    char mnt[PATH_BUF];
    snprintf(mnt, sizeof mnt, "%s/full", root);
    if (mkdir(mnt, 0777) != 0 || mount("tmpfs", mnt, "tmpfs", 0, "size=1m") != 0) {
        printf("disk-full part skipped: mounting a tmpfs at %s: %s\n", mnt, strerror(errno));
        return 77;
    }
    state st;
    state_init(&st, &tiny, 5, 1, 42);
    size_t len = 200000; /* 2.4 MB of arrays: more than the 1 MiB filesystem */
    float *x = calloc(len, sizeof *x);
    st.info.total_floats = len;
    zs_ckpt_shard sh;
    zs_err res = zs_ckpt_write_shard(mnt, &st.info, 0, 0, len, x, x, x, &sh);
    CHECK_EQ_INT(res, ZS_ERR_IO);
    CHECK(strstr(zs_last_error(), "No space left on device") != NULL);
    CHECK(strstr(zs_last_error(), mnt) != NULL);
    printf("full disk, shard: %s\n", zs_last_error());
    char names[1024];
    CHECK_EQ_INT(list_dir(mnt, names, sizeof names), 0);

    /* Export of the big checkpoint (1.7 MB of weights) into the full filesystem. */
    zs_ckpt ck;
    CHECK_OK(zs_ckpt_open(step_dir, &ck));
    char out[PATH_BUF + 16];
    snprintf(out, sizeof out, "%s/model", mnt);
    res = zs_ckpt_export(&ck, out, NULL, NULL);
    CHECK_EQ_INT(res, ZS_ERR_IO);
    CHECK(strstr(zs_last_error(), "No space left on device") != NULL);
    printf("full disk, export: %s\n", zs_last_error());
    CHECK_EQ_INT(list_dir(out, names, sizeof names), 0);
    zs_ckpt_close(&ck);
    free(x);
    state_free(&st);
    umount(mnt);
    return zs_test_failures > failures_before ? 1 : 0;
}

static void test_disk_full(const char *step_dir)
{
    if (geteuid() != 0) {
        printf("disk-full part skipped: not root (a tmpfs needs a mount namespace)\n");
        return;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0)
        exit(disk_full_child(step_dir));
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    CHECK(code == 0 || code == 77);
}

int main(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(root, sizeof root, "%s/zs_test_ckpt_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(root)) {
        perror(root);
        return 1;
    }
    state st;
    state_init(&st, &big, 1, 7, 0x0123456789abcdefull);
    /* Four shards of unequal sizes cutting through tensors; the first is longer than a read
     * chunk (262144 floats). */
    size_t cuts[5] = {0, 270001, 300000, 380037, st.tt.total};
    CHECK_EQ_INT(st.tt.total, 422336);
    char dir[PATH_BUF], step_dir[PATH_BUF];
    snprintf(dir, sizeof dir, "%s/ckpt", root);
    write_ckpt(dir, &st, cuts, 4, 1, step_dir);

    test_roundtrip(&st, step_dir);
    test_scaler(&st);
    test_refusals(&st, step_dir, cuts);
    test_writer_refusals(&st);
    test_finish_in_place(&st);
    test_resolve();
    test_discard();
    test_prune();
    test_disk_full(step_dir);
    state_free(&st);

    if (getenv("ZS_TEST_KEEP")) {
        printf("kept %s (checkpoint: %s)\n", root, dir);
    } else {
        char cmd[PATH_BUF + 16];
        snprintf(cmd, sizeof cmd, "rm -rf %s", root);
        CHECK(system(cmd) == 0);
    }
    return zs_test_result("test_ckpt");
}
