/*
 * metrics: the metrics.jsonl writer (see metrics.h for the invariants).
 *
 * The line is assembled in a growing buffer and written with write(2), looping over short
 * writes and EINTR (zs_file_write, common/fileio.h).  The writer remembers where the last complete
 * line ends (committed): a write that fails part-way is undone by ftruncate(committed) and a seek
 * back there, so the next line starts at a line boundary.  Files that cannot be cut (a character
 * device such as /dev/full, a pipe) are written the same way; there is nothing to cut back in them.
 */
#include "common/metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "common/fileio.h"
#include "common/log.h"

struct zs_metrics {
    char *path;
    int fd;
    int regular;     /* a regular file: it can be cut back and fsynced */
    off_t committed; /* bytes: the end of the last complete line */
    int cut_pending; /* a failed write left bytes past committed that are still there */
    /* The line being built. */
    char *line;
    size_t len, cap;
    int begun;
    int nkeys;
    zs_err line_err;     /* the first problem of a builder call, returned by end() */
    char line_msg[4608]; /* its message (naming the path) */
};

/* Keeps the first problem of the line being built; later calls then do nothing. */
static void line_fail(zs_metrics *m, zs_err code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void line_fail(zs_metrics *m, zs_err code, const char *fmt, ...)
{
    if (m->line_err != ZS_OK)
        return;
    m->line_err = code;
    char what[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(m->line_msg, sizeof m->line_msg, "metrics %s: %s", m->path, what);
}

static void put(zs_metrics *m, const char *s, size_t n)
{
    if (m->line_err != ZS_OK)
        return;
    if (m->len + n > m->cap) {
        size_t cap = m->cap ? m->cap : 256;
        while (cap < m->len + n)
            cap *= 2;
        char *p = realloc(m->line, cap);
        if (!p) {
            line_fail(m, ZS_ERR_NOMEM, "out of memory for a line of %zu bytes", m->len + n);
            return;
        }
        m->line = p;
        m->cap = cap;
    }
    memcpy(m->line + m->len, s, n);
    m->len += n;
}

static void puts_(zs_metrics *m, const char *s)
{
    put(m, s, strlen(s));
}

/* The length of the valid UTF-8 sequence at s (1 to 4), or 0 when it is not one: overlong
 * forms, surrogates and code points above U+10FFFF are not. */
static int utf8_len(const unsigned char *s)
{
    unsigned char c = s[0];
    int n;
    unsigned char lo = 0x80, hi = 0xBF; /* the range of the second byte */
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    } else {
        return 0;
    }
    if (s[1] < lo || s[1] > hi)
        return 0;
    for (int i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xBF)
            return 0; /* also stops at the terminating NUL */
    return n;
}

/* s as a JSON string, quotes included. */
static void put_json_string(zs_metrics *m, const char *s)
{
    put(m, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        unsigned char c = *p;
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            put(m, e, 2);
            p++;
        } else if (c < 0x20) {
            char e[8];
            switch (c) {
            case '\n':
                puts_(m, "\\n");
                break;
            case '\t':
                puts_(m, "\\t");
                break;
            case '\r':
                puts_(m, "\\r");
                break;
            default:
                snprintf(e, sizeof e, "\\u%04x", c);
                puts_(m, e);
            }
            p++;
        } else if (c < 0x80) {
            put(m, (const char *)p, 1);
            p++;
        } else {
            int n = utf8_len(p);
            if (n) {
                put(m, (const char *)p, (size_t)n);
                p += n;
            } else {
                puts_(m, "\\ufffd"); /* one replacement per byte that starts no valid sequence */
                p++;
            }
        }
    }
    put(m, "\"", 1);
}

static void put_key(zs_metrics *m, const char *key)
{
    if (!m->begun) {
        line_fail(m, ZS_ERR_INVALID, "key \"%s\" added with no line begun", key);
        return;
    }
    if (m->nkeys++ > 0)
        put(m, ", ", 2);
    put_json_string(m, key);
    put(m, ": ", 2);
}

void zs_metrics_begin(zs_metrics *m)
{
    m->len = 0;
    m->nkeys = 0;
    m->line_err = ZS_OK;
    m->line_msg[0] = '\0';
    m->begun = 1;
    put(m, "{", 1);
}

void zs_metrics_int(zs_metrics *m, const char *key, long value)
{
    char num[32];
    put_key(m, key);
    snprintf(num, sizeof num, "%ld", value);
    puts_(m, num);
}

/* fmt is "%" [ "." digits (at most 2) ] one of e E f F g G: conversions whose output for a
 * finite double is a JSON number (no flags: "+" and "#" and zero-padding are not JSON). */
static int fmt_ok(const char *fmt)
{
    if (!fmt || fmt[0] != '%')
        return 0;
    const char *p = fmt + 1;
    if (*p == '.') {
        p++;
        int digits = 0;
        while (*p >= '0' && *p <= '9' && digits < 3) {
            p++;
            digits++;
        }
        if (digits > 2)
            return 0;
    }
    return *p && strchr("eEfFgG", *p) && p[1] == '\0';
}

void zs_metrics_num(zs_metrics *m, const char *key, double value, const char *fmt)
{
    put_key(m, key);
    if (!fmt_ok(fmt)) {
        line_fail(m, ZS_ERR_INVALID,
                  "number format \"%s\" is not one of %%[.P]e, E, f, F, g, G (P <= 99)",
                  fmt ? fmt : "(null)");
        return;
    }
    if (!isfinite(value)) {
        puts_(m, "null");
        return;
    }
    /* With at most 99 digits of precision, %f of 1.8e308 is about 410 characters. */
    char num[512];
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    int n = snprintf(num, sizeof num, fmt, value);
#pragma GCC diagnostic pop
    if (n < 0 || (size_t)n >= sizeof num) {
        line_fail(m, ZS_ERR_INTERNAL, "a number formatted with \"%s\" does not fit", fmt);
        return;
    }
    put(m, num, (size_t)n);
}

void zs_metrics_bool(zs_metrics *m, const char *key, int value)
{
    put_key(m, key);
    puts_(m, value ? "true" : "false");
}

void zs_metrics_str(zs_metrics *m, const char *key, const char *value)
{
    put_key(m, key);
    if (!value)
        puts_(m, "null");
    else
        put_json_string(m, value);
}

/* Removes what a failed write left past the last complete line and puts the file position
 * back there.  Returns 0, or -1 with errno set. */
static int cut_back(zs_metrics *m)
{
    if (!m->regular) {
        m->cut_pending = 0;
        return 0;
    }
    if (ftruncate(m->fd, m->committed) != 0 || lseek(m->fd, m->committed, SEEK_SET) < 0)
        return -1;
    m->cut_pending = 0;
    return 0;
}

zs_err zs_metrics_end(zs_metrics *m)
{
    if (!m->begun)
        return zs_error(ZS_ERR_INVALID, "metrics %s: a line ended that was not begun", m->path);
    m->begun = 0;
    put(m, "}\n", 2);
    if (m->line_err != ZS_OK)
        return zs_error(m->line_err, "%s", m->line_msg);
    if (m->cut_pending && cut_back(m) != 0)
        return zs_error(ZS_ERR_IO,
                        "metrics %s: a line of %zu bytes not written: the part of an earlier "
                        "line past byte %lld is still in the file and cutting it failed: %s",
                        m->path, m->len, (long long)m->committed, strerror(errno));
    size_t done;
    if (zs_file_write(m->fd, m->line, m->len, &done) != 0) {
        int e = errno;
        m->cut_pending = 1;
        if (cut_back(m) != 0)
            return zs_error(ZS_ERR_IO,
                            "metrics %s: writing a line of %zu bytes (%zu written): %s; cutting "
                            "the file back to %lld bytes failed too: %s",
                            m->path, m->len, done, strerror(e), (long long)m->committed,
                            strerror(errno));
        return zs_error(ZS_ERR_IO, "metrics %s: writing a line of %zu bytes (%zu written): %s",
                        m->path, m->len, done, strerror(e));
    }
    m->committed += (off_t)m->len;
    return ZS_OK;
}

/* fsync, where the file supports it: devices and pipes answer EINVAL (or EROFS, ENOTSUP),
 * which means there is nothing to make durable. */
static int sync_fd(int fd)
{
    if (fsync(fd) == 0 || errno == EINVAL || errno == EROFS || errno == ENOTSUP)
        return 0;
    return -1;
}

zs_err zs_metrics_sync(zs_metrics *m)
{
    if (sync_fd(m->fd) != 0)
        return zs_error(ZS_ERR_IO, "metrics %s: fsync: %s", m->path, strerror(errno));
    return ZS_OK;
}

zs_err zs_metrics_close(zs_metrics *m)
{
    if (!m)
        return ZS_OK;
    zs_err res = ZS_OK;
    if (m->cut_pending && cut_back(m) != 0)
        res = zs_error(ZS_ERR_IO,
                       "metrics %s: the part of a line past byte %lld is still in the file and "
                       "cutting it failed: %s",
                       m->path, (long long)m->committed, strerror(errno));
    if (sync_fd(m->fd) != 0 && res == ZS_OK)
        res = zs_error(ZS_ERR_IO, "metrics %s: fsync: %s", m->path, strerror(errno));
    if (close(m->fd) != 0 && res == ZS_OK)
        res = zs_error(ZS_ERR_IO, "metrics %s: close: %s", m->path, strerror(errno));
    free(m->line);
    free(m->path);
    free(m);
    return res;
}

/* The "step" of a complete line (its text without the newline), or -1 when the line is not a
 * JSON object with a non-negative integer "step". */
static long line_step(const char *text, size_t len)
{
    json_error_t jerr;
    json_t *o = json_loadb(text, len, 0, &jerr);
    long step = -1;
    if (o && json_is_object(o)) {
        json_t *s = json_object_get(o, "step");
        if (json_is_integer(s) && json_integer_value(s) >= 0)
            step = (long)json_integer_value(s);
    }
    json_decref(o);
    return step;
}

/*
 * Copies the complete lines of the file at path whose step is <= keep into the new file fd
 * (the temporary one); *kept is the bytes copied.  A missing file copies nothing.
 */
static zs_err copy_kept(const char *path, const char *tmp, int fd, long keep, off_t *kept)
{
    *kept = 0;
    FILE *in = fopen(path, "rb");
    if (!in) {
        if (errno == ENOENT)
            return ZS_OK;
        return zs_error(ZS_ERR_IO, "metrics %s: opening it to resume: %s", path, strerror(errno));
    }
    zs_err res = ZS_OK;
    char *line = NULL;
    size_t cap = 0;
    long n_kept = 0, n_later = 0, n_bad = 0, n_cut = 0;
    ssize_t len;
    errno = 0;
    while ((len = getline(&line, &cap, in)) > 0) {
        if (line[len - 1] != '\n') {
            n_cut++; /* the last line, cut by a crash: its step runs again */
            break;
        }
        long step = line_step(line, (size_t)len - 1);
        if (step < 0) {
            n_bad++;
            continue;
        }
        if (step > keep) {
            n_later++;
            continue;
        }
        if (zs_file_write(fd, line, (size_t)len, NULL) != 0) {
            res = zs_error(ZS_ERR_IO, "metrics %s: writing %s: %s", path, tmp, strerror(errno));
            goto out;
        }
        *kept += (off_t)len;
        n_kept++;
    }
    if (ferror(in)) {
        res = zs_error(ZS_ERR_IO, "metrics %s: reading it to resume: %s", path, strerror(errno));
        goto out;
    }
    if (n_bad)
        ZS_WARN("metrics %s: dropped %ld line%s without a JSON object with an integer \"step\"",
                path, n_bad, n_bad == 1 ? "" : "s");
    ZS_INFO("metrics %s: resuming after step %ld: kept %ld line%s, dropped %ld of later steps "
            "and %ld cut",
            path, keep, n_kept, n_kept == 1 ? "" : "s", n_later, n_cut);
out:
    free(line);
    fclose(in);
    return res;
}

/* The resume path of zs_metrics_open: rewrite the kept lines to path.tmp, fsync, rename. */
static zs_err open_resume(zs_metrics *m, long keep)
{
    struct stat st;
    if (stat(m->path, &st) == 0 && !S_ISREG(st.st_mode))
        return zs_error(ZS_ERR_INVALID,
                        "metrics %s: is not a regular file, so it cannot be resumed", m->path);
    size_t plen = strlen(m->path);
    char *tmp = malloc(plen + 5);
    if (!tmp)
        return zs_error(ZS_ERR_NOMEM, "metrics %s: out of memory", m->path);
    memcpy(tmp, m->path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    zs_err res = ZS_OK;
    int fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) {
        res = zs_error(ZS_ERR_IO, "metrics %s: creating %s: %s", m->path, tmp, strerror(errno));
        goto out_tmp;
    }
    off_t kept;
    ZS_CHECK_GOTO(copy_kept(m->path, tmp, fd, keep, &kept), res, fail_fd);
    if (sync_fd(fd) != 0) {
        res = zs_error(ZS_ERR_IO, "metrics %s: fsync of %s: %s", m->path, tmp, strerror(errno));
        goto fail_fd;
    }
    if (rename(tmp, m->path) != 0) {
        res = zs_error(ZS_ERR_IO, "metrics %s: renaming %s over it: %s", m->path, tmp,
                       strerror(errno));
        goto fail_fd;
    }
    res = zs_file_sync_parent(m->path);
    if (res != ZS_OK) {
        zs_error_context(res, "metrics %s", m->path);
        goto fail_renamed;
    }
    m->fd = fd;
    m->regular = 1;
    m->committed = kept;
    goto out_tmp;
fail_fd:
    unlink(tmp);
fail_renamed:
    close(fd);
out_tmp:
    free(tmp);
    return res;
}

zs_err zs_metrics_open(const char *path, long keep_through_step, zs_metrics **out)
{
    *out = NULL;
    zs_err res = ZS_OK;
    zs_metrics *m = calloc(1, sizeof *m);
    if (!m)
        return zs_error(ZS_ERR_NOMEM, "metrics %s: out of memory", path);
    m->fd = -1;
    if (!(m->path = strdup(path))) {
        res = zs_error(ZS_ERR_NOMEM, "metrics %s: out of memory", path);
        goto fail_m;
    }
    if (keep_through_step >= 0) {
        ZS_CHECK_GOTO(open_resume(m, keep_through_step), res, fail_path);
    } else {
        m->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
        if (m->fd < 0) {
            res = zs_error(errno == ENOENT ? ZS_ERR_NOTFOUND : ZS_ERR_IO, "metrics %s: %s", path,
                           strerror(errno));
            goto fail_path;
        }
        struct stat st;
        m->regular = fstat(m->fd, &st) == 0 && S_ISREG(st.st_mode);
        m->committed = 0;
    }
    *out = m;
    return ZS_OK;
fail_path:
    free(m->path);
fail_m:
    free(m);
    return res;
}
