/*
 * benchutil: what the benchmarks that run zshard processes share: starting a child with its
 * stderr in a log, a job run to its end and its steps' times, a job secret for the children, a
 * free loopback port, and medians.  Header-only
 * (each benchmark is one program); not part of any library.
 */
#ifndef ZS_BENCHUTIL_H
#define ZS_BENCHUTIL_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/config.h"
#include "common/secret.h"
#include "server/shardstore.h"

/* Starts argv[0] with argv; its stderr goes to log (NULL: inherited).  Returns the pid. */
/* A job secret for a benchmark that starts zshard roles by hand: written to dir/secret, loaded
 * into *out (may be NULL) and named in ZSHARD_SECRET_FILE for the processes it starts.
 * Returns 0, or -1 after printing why. */
static inline int zs_bench_job_secret(const char *dir, zs_secret *out)
{
    char path[512];
    zs_secret s;
    snprintf(path, sizeof path, "%s/secret", dir);
    if (zs_secret_generate(path) != ZS_OK || zs_secret_load(path, &s) != ZS_OK) {
        fprintf(stderr, "bench: %s\n", zs_last_error());
        return -1;
    }
    setenv(ZS_SECRET_ENV, path, 1);
    if (out)
        *out = s;
    zs_secret_wipe(&s);
    return 0;
}

/* Starts argv (argv[0] a path) with its stderr in log (NULL: ours) and its stdout on /dev/null:
 * a benchmark's stdout is its figures.  Returns the pid, or -1. */
static inline pid_t zs_bench_spawn(char *const argv[], const char *log)
{
    pid_t p = fork();
    if (p == 0) {
        if ((log && !freopen(log, "w", stderr)) || !freopen("/dev/null", "w", stdout))
            _exit(127);
        execv(argv[0], argv);
        _exit(127);
    }
    return p;
}

/* zs_bench_spawn to the end: the exit status, or -1 (not started, or killed by a signal). */
static inline int zs_bench_run(char *const argv[], const char *log)
{
    pid_t p = zs_bench_spawn(argv, log);
    int st = 0;
    if (p < 0 || waitpid(p, &st, 0) != p)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Whether dir_a/model.safetensors and dir_b/model.safetensors have the same bytes. */
static inline int zs_bench_same_model(const char *dir_a, const char *dir_b)
{
    char cmd[2200];
    snprintf(cmd, sizeof cmd, "cmp -s '%s/model.safetensors' '%s/model.safetensors'", dir_a, dir_b);
    return system(cmd) == 0;
}

/* Removes a benchmark's scratch directory; 0, or -1 when rm failed. */
static inline int zs_bench_rmtree(const char *dir)
{
    char cmd[1100];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Runs `zshard launch ...` (argv) to its end, its stderr in out.log, and appends the step_ms
 * of each step from `first` on in out/metrics.jsonl (--out out) to ms[*n] (room for all
 * of them).  Returns 0, or -1 after saying where the log is. */
static inline int zs_bench_launch(char *const argv[], const char *out, long first, double *ms,
                                  int *n)
{
    char log[4200], line[4096];
    snprintf(log, sizeof log, "%s.log", out);
    pid_t p = zs_bench_spawn(argv, log);
    int status = 0;
    waitpid(p, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "bench: zshard launch failed; see %s\n", log);
        return -1;
    }
    snprintf(log, sizeof log, "%s/metrics.jsonl", out);
    FILE *f = fopen(log, "r");
    while (f && fgets(line, sizeof line, f)) {
        long step = 0;
        const char *s = strstr(line, "\"step\": "), *m = strstr(line, "\"step_ms\": ");
        if (s && m && sscanf(s + 8, "%ld", &step) == 1 && step >= first)
            ms[(*n)++] = atof(m + 11);
    }
    if (f)
        fclose(f);
    return 0;
}

/* A port on 127.0.0.1 that was free a moment ago (-1 on failure). */
static inline int zs_bench_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

static inline int zs_bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[0..n) (sorts v); NaN for n == 0. */
static inline double zs_bench_median(double *v, int n)
{
    if (n <= 0)
        return 0.0 / 0.0;
    qsort(v, (size_t)n, sizeof *v, zs_bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The number after "key": in a JSON line (a metrics.jsonl line), or NaN. */
static inline double zs_bench_field(const char *line, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = strstr(line, pat);
    return p ? strtod(p + strlen(pat), NULL) : 0.0 / 0.0;
}

/* Writes 1 MB of varied text to path (a corpus: the speed does not depend on what it says).
 * Returns 0, or -1 when it cannot be written. */
static inline int zs_bench_write_corpus(const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < 1 << 20; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        fputc(" etaoinshrdlucmfwypvbgkqjxz\n.,"[x % 30], f);
    }
    return fclose(f);
}

/* GPT-2 124M's shape (124,439,808 parameters). */
#define ZS_BENCH_GPT2_124M                                                                         \
    ((zs_model_config){                                                                            \
        .n_layer = 12, .n_head = 12, .n_embd = 768, .vocab_size = 50257, .block_size = 1024})

/* A flat vector of `total` floats cut into shards of shard_floats (the last shorter), as one
 * server holding them all sees them: *n ranges, calloc'ed (NULL out of memory). */
static inline zs_shard_range *zs_bench_shards(size_t total, size_t shard_floats, int *n)
{
    *n = (int)((total + shard_floats - 1) / shard_floats);
    zs_shard_range *r = calloc((size_t)*n, sizeof *r);
    for (int i = 0; r && i < *n; i++) {
        size_t b = (size_t)i * shard_floats,
               e = b + shard_floats < total ? b + shard_floats : total;
        r[i] = (zs_shard_range){i, b, e};
    }
    return r;
}

#endif
