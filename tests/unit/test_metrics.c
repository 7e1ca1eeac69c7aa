/*
 * metrics: the exact text of a line, non-finite values as null, escaping (each line parses
 * with jansson), refused number formats, a resume that keeps the lines through a step and
 * drops later and cut ones, and failing writes: ENOSPC from /dev/full, and a write cut short
 * by RLIMIT_FSIZE on a regular file, which must leave only complete lines and let the next
 * line through once there is room again.
 */
#include <errno.h>
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/metrics.h"
#include "tests/unit/test.h"

static char dir[] = "/tmp/zs_test_metrics_XXXXXX";

static void path_of(char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", dir, name);
}

/* The whole file into a NUL-terminated buffer the caller frees, or NULL. */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t len = 0, cap = 0;
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (len + n + 1 > cap) {
            cap = (len + n + 1) * 2;
            char *p = realloc(buf, cap);
            if (!p) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = p;
        }
        memcpy(buf + len, chunk, n);
        len += n;
    }
    fclose(f);
    if (!buf)
        buf = calloc(1, 1);
    else
        buf[len] = '\0';
    return buf;
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f)
        return;
    CHECK(fputs(text, f) >= 0);
    CHECK(fclose(f) == 0);
}

static long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

/* Every line of the file ends in "\n" and parses as a JSON object; returns the line count,
 * or -1 (after a failed check) when one does not. */
static int check_lines(const char *path)
{
    char *text = slurp(path);
    CHECK(text != NULL);
    if (!text)
        return -1;
    int lines = 0, ok = 1;
    size_t len = strlen(text);
    CHECK(len == 0 || text[len - 1] == '\n');
    for (char *p = text; *p;) {
        char *nl = strchr(p, '\n');
        if (!nl) {
            ok = 0;
            break;
        }
        json_error_t jerr;
        json_t *o = json_loadb(p, (size_t)(nl - p), JSON_REJECT_DUPLICATES, &jerr);
        if (!o || !json_is_object(o)) {
            fprintf(stderr, "%s: line %d does not parse: %s: %.*s\n", path, lines + 1, jerr.text,
                    (int)(nl - p), p);
            ok = 0;
        }
        json_decref(o);
        lines++;
        p = nl + 1;
    }
    CHECK(ok);
    free(text);
    return ok ? lines : -1;
}

/* Line `index` (0-based) of the file parsed, or NULL; the caller json_decref()s it. */
static json_t *line_json(const char *path, int index)
{
    char *text = slurp(path);
    if (!text)
        return NULL;
    char *p = text;
    for (int i = 0; i < index && p; i++) {
        p = strchr(p, '\n');
        if (p)
            p++;
    }
    json_t *o = NULL;
    if (p && *p) {
        char *nl = strchr(p, '\n');
        json_error_t jerr;
        o = json_loadb(p, nl ? (size_t)(nl - p) : strlen(p), JSON_REJECT_DUPLICATES, &jerr);
    }
    free(text);
    return o;
}

static zs_err write_step(zs_metrics *m, long step, double loss)
{
    zs_metrics_begin(m);
    zs_metrics_int(m, "step", step);
    zs_metrics_num(m, "loss", loss, "%.9g");
    return zs_metrics_end(m);
}

static void test_lines(void)
{
    char path[256];
    path_of(path, sizeof path, "lines.jsonl");
    zs_metrics *m = NULL;
    CHECK_OK(zs_metrics_open(path, -1, &m));
    if (!m)
        return;
    /* The keys in the order added, with the formats asked for: what train wrote by fprintf. */
    zs_metrics_begin(m);
    zs_metrics_int(m, "step", 1);
    zs_metrics_num(m, "loss", 5.5, "%.9g");
    zs_metrics_num(m, "tokens_per_sec", 1234.56, "%.1f");
    zs_metrics_num(m, "fetch_wait_ms", 0.0, "%.1f");
    zs_metrics_int(m, "workers", -3);
    CHECK_OK(zs_metrics_end(m));
    char *text = slurp(path);
    CHECK(text && strcmp(text, "{\"step\": 1, \"loss\": 5.5, \"tokens_per_sec\": 1234.6, "
                               "\"fetch_wait_ms\": 0.0, \"workers\": -3}\n") == 0);
    free(text);

    /* Non-finite numbers are null, whatever the format. */
    zs_metrics_begin(m);
    zs_metrics_int(m, "step", 2);
    zs_metrics_num(m, "loss", NAN, "%.9g");
    zs_metrics_num(m, "grad_norm", INFINITY, "%.1f");
    zs_metrics_num(m, "clip", -INFINITY, "%e");
    zs_metrics_num(m, "lr", -0.0, "%.9g");
    zs_metrics_num(m, "big", DBL_MAX, "%.99f");
    zs_metrics_num(m, "tiny", DBL_TRUE_MIN, "%.99G");
    zs_metrics_num(m, "e", 1e-5, "%.0E");
    zs_metrics_num(m, "F", 2.25, "%F");
    CHECK_OK(zs_metrics_end(m));

    /* Strings and keys are escaped; invalid UTF-8 becomes U+FFFD. */
    const char *nasty = "a\"b\\c\nd\te\x01f\x7f";
    const char *utf8 = "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80";
    const char *broken = "x\xff"
                         "y\xc3"
                         "z\xed\xa0\x80"
                         "w\xe0\x80\xaf"; /* stray, cut, surrogate,
                                              overlong */
    zs_metrics_begin(m);
    zs_metrics_int(m, "step", 3);
    zs_metrics_str(m, "nasty", nasty);
    zs_metrics_str(m, "utf8", utf8);
    zs_metrics_str(m, "broken", broken);
    zs_metrics_str(m, "k\"ey", NULL);
    CHECK_OK(zs_metrics_end(m));

    /* A skipped step as `zshard train` writes it: a NaN loss, an infinite norm, a flag. */
    zs_metrics_begin(m);
    zs_metrics_int(m, "step", 4);
    zs_metrics_num(m, "loss", -NAN, "%.9g");
    zs_metrics_num(m, "grad_norm", INFINITY, "%.9g");
    zs_metrics_num(m, "clip", 0.0, "%.9g");
    zs_metrics_bool(m, "skipped", 1);
    zs_metrics_bool(m, "other", 0);
    CHECK_OK(zs_metrics_end(m));
    CHECK_OK(zs_metrics_close(m));

    CHECK_EQ_INT(check_lines(path), 4);
    text = slurp(path);
    const char *skipped_line = "{\"step\": 4, \"loss\": null, \"grad_norm\": null, \"clip\": 0, "
                               "\"skipped\": true, \"other\": false}\n";
    CHECK(text && strlen(text) > strlen(skipped_line) &&
          strcmp(text + strlen(text) - strlen(skipped_line), skipped_line) == 0);
    free(text);
    json_t *sk = line_json(path, 3);
    CHECK(sk != NULL);
    if (sk) {
        CHECK(json_is_null(json_object_get(sk, "loss")));
        CHECK(json_is_true(json_object_get(sk, "skipped")));
        CHECK(json_is_false(json_object_get(sk, "other")));
        json_decref(sk);
    }
    json_t *o = line_json(path, 1);
    CHECK(o != NULL);
    if (o) {
        CHECK(json_is_null(json_object_get(o, "loss")));
        CHECK(json_is_null(json_object_get(o, "grad_norm")));
        CHECK(json_is_null(json_object_get(o, "clip")));
        CHECK(json_is_number(json_object_get(o, "lr")));
        CHECK(json_number_value(json_object_get(o, "big")) == DBL_MAX);
        CHECK(json_is_number(json_object_get(o, "tiny")));
        CHECK_NEAR(json_number_value(json_object_get(o, "e")), 1e-5, 0);
        CHECK_NEAR(json_number_value(json_object_get(o, "F")), 2.25, 0);
        json_decref(o);
    }
    o = line_json(path, 2);
    CHECK(o != NULL);
    if (o) {
        const char *s = json_string_value(json_object_get(o, "nasty"));
        CHECK(s && strcmp(s, nasty) == 0);
        s = json_string_value(json_object_get(o, "utf8"));
        CHECK(s && strcmp(s, utf8) == 0);
        s = json_string_value(json_object_get(o, "broken"));
        const char *fffd = "\xef\xbf\xbd";
        char want[64];
        snprintf(want, sizeof want, "x%sy%sz%s%s%sw%s%s%s", fffd, fffd, fffd, fffd, fffd, fffd,
                 fffd, fffd);
        CHECK(s && strcmp(s, want) == 0);
        if (s && strcmp(s, want) != 0)
            fprintf(stderr, "broken: got \"%s\", want \"%s\"\n", s, want);
        CHECK(json_is_null(json_object_get(o, "k\"ey")));
        json_decref(o);
    }
}

static void test_refusals(void)
{
    char path[256];
    path_of(path, sizeof path, "refusals.jsonl");
    zs_metrics *m = NULL;
    CHECK_OK(zs_metrics_open(path, -1, &m));
    if (!m)
        return;
    CHECK_OK(write_step(m, 1, 1.0));
    long size = file_size(path);
    /* Formats whose output is not a JSON number, or not one double: the line is refused and
     * nothing reaches the file. */
    static const char *const bad[] = {"%a",     "%+g",   "%#g", "%5.1f", "%05.1f", "% g", "%d",
                                      "%.100f", "%g %g", "%s",  "g",     "%",      ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        zs_metrics_begin(m);
        zs_metrics_int(m, "step", 2);
        zs_metrics_num(m, "loss", 1.0, bad[i]);
        zs_metrics_int(m, "after", 1);
        CHECK_FAILS_WITH(zs_metrics_end(m), "number format");
        CHECK_EQ_INT(file_size(path), size);
    }
    zs_metrics_begin(m);
    zs_metrics_num(m, "loss", 1.0, NULL);
    CHECK_FAILS_WITH(zs_metrics_end(m), "(null)");
    /* end without begin, and a key outside a line. */
    CHECK_FAILS_WITH(zs_metrics_end(m), "not begun");
    zs_metrics_int(m, "orphan", 1);
    CHECK_FAILS_WITH(zs_metrics_end(m), "not begun");
    /* A line begun twice keeps only the second. */
    zs_metrics_begin(m);
    zs_metrics_int(m, "step", 99);
    zs_metrics_begin(m);
    zs_metrics_int(m, "step", 2);
    CHECK_OK(zs_metrics_end(m));
    CHECK_OK(zs_metrics_close(m));
    char *text = slurp(path);
    CHECK(text && strcmp(text, "{\"step\": 1, \"loss\": 1}\n{\"step\": 2}\n") == 0);
    free(text);

    CHECK_OK(zs_metrics_close(NULL));
    CHECK_FAILS_WITH(zs_metrics_open("/nonexistent/dir/metrics.jsonl", -1, &m),
                     "/nonexistent/dir/metrics.jsonl");
    CHECK(m == NULL);
    CHECK_FAILS_WITH(zs_metrics_open("/nonexistent/dir/metrics.jsonl", 5, &m),
                     "/nonexistent/dir/metrics.jsonl");
}

static void test_resume(void)
{
    char path[256], tmp[300];
    path_of(path, sizeof path, "resume.jsonl");
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    const char *old = "{\"step\": 1, \"loss\": 1}\n"
                      "{\"step\": 2, \"loss\": 2}\n"
                      "not json\n"
                      "{\"event\": \"no step\"}\n"
                      "{\"step\": 3, \"loss\": 3}\n"
                      "{\"step\": 4, \"loss\": 4}\n"
                      "{\"step\": 5, \"loss\": 5}\n"
                      "{\"step\": 6, \"lo";
    write_text(path, old);
    zs_metrics *m = NULL;
    CHECK_OK(zs_metrics_open(path, 3, &m));
    if (!m)
        return;
    CHECK(access(tmp, F_OK) != 0);
    char *text = slurp(path);
    CHECK(text && strcmp(text, "{\"step\": 1, \"loss\": 1}\n{\"step\": 2, \"loss\": 2}\n"
                               "{\"step\": 3, \"loss\": 3}\n") == 0);
    free(text);
    /* The run goes on from step 4: appended after the kept lines. */
    CHECK_OK(write_step(m, 4, 40.0));
    CHECK_OK(zs_metrics_sync(m));
    CHECK_OK(zs_metrics_close(m));
    text = slurp(path);
    CHECK(text && strcmp(text, "{\"step\": 1, \"loss\": 1}\n{\"step\": 2, \"loss\": 2}\n"
                               "{\"step\": 3, \"loss\": 3}\n{\"step\": 4, \"loss\": 40}\n") == 0);
    free(text);

    /* A resume past the end keeps every complete line and drops only the cut one. */
    write_text(path, old);
    CHECK_OK(zs_metrics_open(path, 1000, &m));
    CHECK_OK(zs_metrics_close(m));
    CHECK_EQ_INT(check_lines(path), 5);
    /* Step 0 (a checkpoint before any step) keeps nothing; a missing file is created. */
    CHECK_OK(zs_metrics_open(path, 0, &m));
    CHECK_OK(zs_metrics_close(m));
    CHECK_EQ_INT(file_size(path), 0);
    unlink(path);
    CHECK_OK(zs_metrics_open(path, 7, &m));
    CHECK_OK(write_step(m, 8, 8.0));
    CHECK_OK(zs_metrics_close(m));
    CHECK_EQ_INT(check_lines(path), 1);
    /* A new run (keep < 0) truncates. */
    write_text(path, old);
    CHECK_OK(zs_metrics_open(path, -1, &m));
    CHECK_OK(zs_metrics_close(m));
    CHECK_EQ_INT(file_size(path), 0);
    /* Only a regular file can be resumed. */
    CHECK_FAILS_WITH(zs_metrics_open("/dev/null", 3, &m), "not a regular file");
    unlink(path);
}

static void test_full_device(void)
{
    if (access("/dev/full", W_OK) != 0) {
        fprintf(stderr, "test_metrics: /dev/full is not writable here; ENOSPC case skipped\n");
        return;
    }
    zs_metrics *m = NULL;
    CHECK_OK(zs_metrics_open("/dev/full", -1, &m));
    if (!m)
        return;
    CHECK_FAILS_WITH(write_step(m, 1, 1.0), "No space left on device");
    CHECK_FAILS_WITH(write_step(m, 1, 1.0), "metrics /dev/full: writing a line of");
    CHECK_OK(zs_metrics_close(m));
}

/* A write cut short: RLIMIT_FSIZE lets the first bytes of a line in and refuses the rest
 * (EFBIG, with SIGXFSZ ignored), as a disk that fills mid-line does with ENOSPC. */
static void test_short_write(void)
{
    char path[256];
    path_of(path, sizeof path, "short.jsonl");
    zs_metrics *m = NULL;
    CHECK_OK(zs_metrics_open(path, -1, &m));
    if (!m)
        return;
    CHECK_OK(write_step(m, 1, 1.0));
    CHECK_OK(write_step(m, 2, 2.0));
    long size = file_size(path);
    struct rlimit old, lim;
    CHECK(getrlimit(RLIMIT_FSIZE, &old) == 0);
    if (old.rlim_cur != RLIM_INFINITY && old.rlim_cur < (rlim_t)size + 4096) {
        fprintf(stderr, "test_metrics: RLIMIT_FSIZE %llu too low; short-write case skipped\n",
                (unsigned long long)old.rlim_cur);
        zs_metrics_close(m);
        return;
    }
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    lim = old;
    lim.rlim_cur = (rlim_t)size + 10;
    CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    zs_metrics_begin(m);
    zs_metrics_int(m, "step", 3);
    zs_metrics_str(m, "note", "a line much longer than the ten bytes that still fit");
    zs_err res = zs_metrics_end(m);
    int fails = res == ZS_ERR_IO;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", zs_last_error());
    /* Once more while it cannot fit: nothing may pile up either. */
    zs_err res2 = write_step(m, 3, 3.0);
    long size_during = file_size(path);
    CHECK(setrlimit(RLIMIT_FSIZE, &old) == 0);
    signal(SIGXFSZ, prev);
    CHECK(fails);
    CHECK(strstr(msg, "File too large") != NULL);
    CHECK(strstr(msg, "(10 written)") != NULL);
    fprintf(stderr, "short write: %s\n", msg);
    CHECK_EQ_INT(res2, ZS_ERR_IO);
    CHECK_EQ_INT(size_during, size);
    CHECK_EQ_INT(check_lines(path), 2);
    /* Room again: the next line goes in after the last complete one. */
    CHECK_OK(write_step(m, 3, 3.0));
    CHECK_OK(zs_metrics_close(m));
    CHECK_EQ_INT(check_lines(path), 3);
    json_t *o = line_json(path, 2);
    CHECK(o && json_integer_value(json_object_get(o, "step")) == 3);
    json_decref(o);
    unlink(path);
}

int main(void)
{
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_lines();
    test_refusals();
    test_resume();
    test_full_device();
    test_short_write();
    char p[256];
    static const char *const names[] = {"lines.jsonl", "refusals.jsonl", NULL};
    for (const char *const *n = names; *n; n++) {
        path_of(p, sizeof p, *n);
        unlink(p);
    }
    rmdir(dir);
    return zs_test_result("test_metrics");
}
