/*
 * bench_adamw: AdamW (zs_adamw, the fast path) in parameters/s and bytes/s against a
 * STREAM-style triad (a = b + s*c on doubles) measured in the same run on the same threads,
 * and, when a Python with them is given, against other CPU AdamW implementations.
 *
 * AdamW's traffic is counted as 30 bytes per parameter: reads of p, m, v, g (16) and writes
 * of p, m, v (12) and the bf16 copy (2).  The triad counts 24 bytes per element, as STREAM
 * does (it does not count the read-for-ownership of a), over arrays moving as many counted
 * bytes as AdamW's.  The ratio can exceed 1: AdamW's writes go to lines it has just read, and
 * its bf16 copy goes out with streaming stores, while every triad store first reads its line
 * (write-allocate); so per line fetched AdamW moves 120 counted bytes and the triad 64; where
 * a core's outstanding misses, not DRAM, limit bandwidth (few cores), the ratio approaches
 * that.  Each figure is the best of several timed repeats after a warm-up run.  Every array is
 * first touched by the thread that later works on it, with zs_adamw's split, so pages sit near
 * their thread where memory is NUMA.  Pin threads from the environment (OMP_PROC_BIND=close
 * OMP_PLACES=cores) for stable figures.
 *
 * Peers: with ZS_PEERS_PYTHON naming a Python (the venv of bench/peers/make_venv.sh), the
 * benchmark starts bench/peers/adamw_peers.py in serve mode on as many parameters and threads,
 * and times in each repeat, one after the other: zs_adamw, zs_adamw without the bf16 copy,
 * the triad, then each peer (PyTorch's fused and foreach AdamW, DeepSpeedCPUAdam).  The peers
 * read p, g, m, v and write p, m, v, so the same work is ours without bf16; the ratio with
 * bf16 is printed too.  A peer that cannot run is reported as skipped.  Both processes run
 * with OMP_WAIT_POLICY=passive (see main), so that neither spins on the cores while the other
 * measures; it costs zs_adamw nothing measurable on large vectors.  Without
 * ZS_PEERS_PYTHON the benchmark runs as it always did.
 *
 * usage: bench_adamw [threads [Mi-params [repeats]]]   (default 2 threads, 64 Mi, 10)
 */
#include <omp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "kernels/adamw.h"

/* This thread's range of [0, n) in zs_adamw's split: blocks of 64 elements, dealt out in
 * equal contiguous runs. */
static void thread_range(size_t n, size_t *lo, size_t *hi)
{
    size_t team = (size_t)omp_get_num_threads();
    size_t per = ((n + 63) / 64 + team - 1) / team * 64;
    *lo = (size_t)omp_get_thread_num() * per;
    *hi = *lo + per < n ? *lo + per : n;
    if (*lo > n)
        *lo = n;
}

enum { MAX_PEERS = 4 };

/* adamw_peers.py in serve mode: one line per request on `to`, one per answer on `from`. */
typedef struct {
    pid_t pid;
    FILE *to, *from;
    int count;
    char names[MAX_PEERS][32];
    double best[MAX_PEERS]; /* seconds */
} peers;

/* Reads one line from the peers into buf without its newline; 0 at end of file. */
static int peer_line(peers *ps, char *buf, size_t size)
{
    if (!fgets(buf, (int)size, ps->from))
        return 0;
    buf[strcspn(buf, "\n")] = '\0';
    return 1;
}

/* Starts `python adamw_peers.py --serve n threads` and reads its peer lines up to "ready",
 * printing the skipped ones.  Returns 0, or -1 after printing why there are no peers. */
static int peers_start(peers *ps, const char *python, size_t n, int threads)
{
    /* The script sits beside this file in the source tree; CMake compiles sources by absolute
     * path, so __FILE__ locates it from the build directory without an install step. */
    char script[4096], nbuf[32], tbuf[16];
    const char *slash = strrchr(__FILE__, '/');
    snprintf(script, sizeof script, "%.*s/peers/adamw_peers.py",
             slash ? (int)(slash - __FILE__) : 1, slash ? __FILE__ : ".");
    snprintf(nbuf, sizeof nbuf, "%zu", n);
    snprintf(tbuf, sizeof tbuf, "%d", threads);
    int in[2], out[2];
    if (pipe(in) != 0)
        goto fail;
    if (pipe(out) != 0)
        goto fail_in;
    ps->pid = fork();
    if (ps->pid < 0)
        goto fail_out;
    if (ps->pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[0]), close(in[1]), close(out[0]), close(out[1]);
        execl(python, python, script, "--serve", nbuf, tbuf, (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    ps->to = fdopen(in[1], "w");
    ps->from = fdopen(out[0], "r");
    ps->count = 0;
    char line[512];
    while (ps->to && ps->from && peer_line(ps, line, sizeof line)) {
        if (strcmp(line, "ready") == 0)
            return 0;
        char name[32];
        int end = 0;
        if (sscanf(line, "peer=%31[^ ] ready%n", name, &end) == 1 && end > 0 && !line[end] &&
            ps->count < MAX_PEERS) {
            snprintf(ps->names[ps->count], sizeof ps->names[0], "%s", name);
            ps->best[ps->count++] = 1e30;
        } else if (strncmp(line, "peer=", 5) == 0) {
            char *skip = strstr(line, " skipped=");
            if (skip)
                *skip = '\0';
            printf("peer %s: skipped (%s)\n", line + 5, skip ? skip + 9 : "not understood");
        }
    }
    if (ps->to)
        fclose(ps->to);
    if (ps->from)
        fclose(ps->from);
    ps->to = NULL; /* the write end closed: the script sees end of file and returns */
    int status = 0;
    waitpid(ps->pid, &status, 0);
    printf("peers: skipped (%s %s ended before it was ready, exit status %d; run "
           "bench/peers/make_venv.sh?)\n",
           python, script, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return -1;
fail_out:
    close(out[0]), close(out[1]);
fail_in:
    close(in[0]), close(in[1]);
fail:
    printf("peers: skipped (no pipe or process for %s)\n", python);
    return -1;
}

/* Times one step of peer k; its best improves unless this is the warm-up.  Returns 0, or -1
 * when the peer process is gone. */
static int peers_time(peers *ps, int k, int warmup)
{
    char line[128] = "", name[32];
    double s;
    fprintf(ps->to, "%s\n", ps->names[k]);
    fflush(ps->to);
    if (!peer_line(ps, line, sizeof line) || sscanf(line, "%31s %lf", name, &s) != 2 ||
        strcmp(name, ps->names[k]) != 0) {
        printf("peers: %s did not answer (\"%s\"); dropping the peers\n", ps->names[k], line);
        return -1;
    }
    if (!warmup && s < ps->best[k])
        ps->best[k] = s;
    return 0;
}

static void peers_stop(peers *ps)
{
    fclose(ps->to); /* end of its stdin: the script returns */
    fclose(ps->from);
    waitpid(ps->pid, NULL, 0);
}

int main(int argc, char **argv)
{
    /* Threads of an OpenMP runtime spin for a while after each parallel region (libgomp's
     * default); with the peers' process beside ours, the spinning team of one takes the cores
     * from the other, which then measures half its speed.  So both run with passive waiting.
     * libgomp reads the variable when it loads, before main, hence the exec. */
    const char *python = getenv("ZS_PEERS_PYTHON");
    const char *policy = getenv("OMP_WAIT_POLICY");
    if (python && *python && (!policy || strcmp(policy, "passive") != 0)) {
        setenv("OMP_WAIT_POLICY", "passive", 1);
        execv("/proc/self/exe", argv);
        fprintf(stderr, "bench_adamw: cannot exec /proc/self/exe with OMP_WAIT_POLICY=passive\n");
        return 1;
    }
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    double mi = argc > 2 ? atof(argv[2]) : 64;
    int reps = argc > 3 ? atoi(argv[3]) : 10;
    size_t n = (size_t)(mi * 1048576.0);
    if (threads < 1 || n < 65536 || reps < 1) {
        fprintf(stderr, "usage: bench_adamw [threads [Mi-params (>= 0.0625) [repeats]]]\n");
        return 2;
    }
    size_t nt = n * 30 / 24; /* triad elements moving as many counted bytes as AdamW */
    float *p = aligned_alloc(64, n * 4), *m = aligned_alloc(64, n * 4),
          *v = aligned_alloc(64, n * 4), *g = aligned_alloc(64, n * 4);
    uint16_t *b = aligned_alloc(64, n * 2);
    double *ta = aligned_alloc(64, nt * 8), *tb = aligned_alloc(64, nt * 8),
           *tc = aligned_alloc(64, nt * 8);
    if (!p || !m || !v || !g || !b || !ta || !tb || !tc) {
        fprintf(stderr, "bench_adamw: out of memory for %zu parameters\n", n);
        return 1;
    }
#pragma omp parallel num_threads(threads)
    {
        size_t lo, hi;
        thread_range(n, &lo, &hi);
        for (size_t i = lo; i < hi; i++) {
            p[i] = 0.01f * (float)(i % 100);
            m[i] = 0.0f;
            v[i] = 0.0f;
            g[i] = 0.001f * (float)(i % 37) - 0.018f;
            b[i] = 0;
        }
    }
#pragma omp parallel for schedule(static) num_threads(threads)
    for (size_t i = 0; i < nt; i++) {
        ta[i] = 0;
        tb[i] = 1.0 + (double)(i % 10);
        tc[i] = 2.0;
    }
    peers ps = {0};
    int with_peers = python && *python;
    if (with_peers) {
        signal(SIGPIPE, SIG_IGN); /* a peer process that dies shows as end of file */
        with_peers = peers_start(&ps, python, n, threads) == 0;
        if (with_peers)
            printf("peers: %d, run by %s with %d threads, OMP_WAIT_POLICY=passive in both "
                   "processes\n",
                   ps.count, python, threads);
    }
    /* Interleaved, so that all see the same machine state; repeat 0 is the warm-up. */
    double best_adamw = 1e30, best_nobf16 = 1e30, best_triad = 1e30;
    for (int r = 0; r <= reps; r++) {
        zs_adamw_hparams hp = zs_adamw_hparams_make(1e-3, 0.9, 0.999, 1e-8, 0.01, r + 1, 1.0f);
        double t0 = zs_now_s();
        zs_adamw(p, m, v, g, b, n, &hp, threads);
        double dt = zs_now_s() - t0;
        if (r > 0 && dt < best_adamw)
            best_adamw = dt;
        if (with_peers) {
            t0 = zs_now_s();
            zs_adamw(p, m, v, g, NULL, n, &hp, threads);
            dt = zs_now_s() - t0;
            if (r > 0 && dt < best_nobf16)
                best_nobf16 = dt;
        }
        double s = 3.0 + r;
        t0 = zs_now_s();
#pragma omp parallel for schedule(static) num_threads(threads)
        for (size_t i = 0; i < nt; i++)
            ta[i] = tb[i] + s * tc[i];
        dt = zs_now_s() - t0;
        if (r > 0 && dt < best_triad)
            best_triad = dt;
        for (int k = 0; with_peers && k < ps.count; k++)
            if (peers_time(&ps, k, r == 0) != 0)
                with_peers = 0, ps.count = 0;
    }
    double adamw_gbs = 30.0 * (double)n / best_adamw / 1e9;
    double triad_gbs = 24.0 * (double)nt / best_triad / 1e9;
    /* Use the results, so that nothing is optimized away. */
    volatile double sink = (double)p[n / 2] + ta[nt / 3] + b[n / 5];
    (void)sink;
    printf("adamw: %s, %d threads, %zu params (%.2f GiB), best of %d: %.2f ms\n", zs_adamw_isa(),
           threads, n, 18.0 * (double)n / 1073741824.0, reps, best_adamw * 1e3);
    if (best_nobf16 < 1e30)
        printf("adamw without bf16 (the peers' work): best of %d: %.2f ms, %.3g params/s\n", reps,
               best_nobf16 * 1e3, (double)n / best_nobf16);
    printf("triad: %d threads, %zu doubles x 3 (%.2f GiB), best of %d: %.2f ms\n", threads, nt,
           24.0 * (double)nt / 1073741824.0, reps, best_triad * 1e3);
    for (int k = 0; k < ps.count; k++)
        printf("peer %s: best of %d: %.2f ms, %.3g params/s; ours/peer %.2f without bf16, "
               "%.2f with\n",
               ps.names[k], reps, ps.best[k] * 1e3, (double)n / ps.best[k],
               ps.best[k] / best_nobf16, ps.best[k] / best_adamw);
    if (ps.to)
        peers_stop(&ps);
    printf("bench_adamw: %.3g params/s\n", (double)n / best_adamw);
    printf("bench_adamw: %.2f GB/s, triad %.2f GB/s, ratio %.2f\n", adamw_gbs, triad_gbs,
           adamw_gbs / triad_gbs);
    free(p), free(m), free(v), free(g), free(b), free(ta), free(tb), free(tc);
    return 0;
}
