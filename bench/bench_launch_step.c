/*
 * bench_launch_step: the step time of `zshard launch` with 1 partition server and 1 worker
 * against `zshard train` on the small model (deploy/configs/small-gpt.json: 6 x 384, byte
 * vocabulary, 2 chunks of 8 x 256 tokens), both with the same kernel threads, measured in the
 * same run.  The target is at most 1.25x.  It also prints where the worker's step went:
 * computing, waiting on fetches, waiting on pushes, and waiting on the step (the server's
 * AdamW, the coordinator's round trips), from the per-step split the coordinator writes to
 * metrics.jsonl.
 *
 * The runs alternate (train, launch, train, launch, ...) so that a slow spell of the machine
 * hits both alike; each figure is the median over all runs of the steps after the first (the
 * first step of a run pays for starting processes, connecting and faulting memory in).  The
 * two runs must end with the same weights (cmp), as the project promises.
 *
 * With DEVICE (cpu, cuda, cuda:N) both compute there (`--device`): on a GPU the split says how
 * much of a GPU worker's step is the GPU's and how much waits on the servers.
 *
 * usage: bench_launch_step ZSHARD CONFIG.json [steps=6 [rounds=2 [threads=2 [DEVICE=cpu]]]]
 */
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/benchutil.h"

#define MAX_STEPS 256
#define MAX_SAMPLES 4096

typedef struct {
    double step_ms[MAX_SAMPLES], compute[MAX_SAMPLES], fetch[MAX_SAMPLES], push[MAX_SAMPLES];
    int n;
} samples;

/* Adds steps 2.. of dir/metrics.jsonl to s; returns the steps read (-1: unreadable). */
static int read_metrics(const char *dir, samples *s)
{
    char path[512], line[1024];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    int steps = 0;
    while (fgets(line, sizeof line, f)) {
        steps++;
        if (zs_bench_field(line, "step") < 2 || s->n >= MAX_SAMPLES)
            continue;
        s->step_ms[s->n] = zs_bench_field(line, "step_ms");
        s->compute[s->n] = zs_bench_field(line, "compute_ms");
        s->fetch[s->n] = zs_bench_field(line, "fetch_wait_ms");
        s->push[s->n] = zs_bench_field(line, "push_wait_ms");
        s->n++;
    }
    fclose(f);
    return steps;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(
            stderr,
            "usage: bench_launch_step ZSHARD CONFIG.json [steps [rounds [threads [DEVICE]]]]\n");
        return 2;
    }
    char *zshard = argv[1], *cfg = argv[2];
    char *steps = argc > 3 ? argv[3] : "6";
    int rounds = argc > 4 ? atoi(argv[4]) : 2;
    char *threads = argc > 5 ? argv[5] : "2";
    char *device = argc > 6 ? argv[6] : "cpu";
    signal(SIGPIPE, SIG_IGN);
    char dir[] = "/tmp/zs_bench_launch_XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    char data[512];
    snprintf(data, sizeof data, "%s/data.txt", dir);
    if (zs_bench_write_corpus(data) != 0)
        return 1;

    samples tr = {0}, la = {0};
    int rc = 1, same = 1;
    for (int r = 0; r < rounds; r++) {
        char tdir[600], ldir[600], tlog[700], llog[700];
        snprintf(tdir, sizeof tdir, "%s/train%d", dir, r);
        snprintf(ldir, sizeof ldir, "%s/launch%d", dir, r);
        snprintf(tlog, sizeof tlog, "%s/train%d.log", dir, r);
        snprintf(llog, sizeof llog, "%s/launch%d.log", dir, r);
        char *targv[] = {zshard,      "train",   "--config", cfg,     "--data",
                         data,        "--steps", steps,      "--out", tdir,
                         "--threads", threads,   "--device", device,  NULL};
        char *largv[] = {zshard,      "launch",   "--config",  cfg,         "--data",
                         data,        "--steps",  steps,       "--servers", "1",
                         "--workers", "1",        "--threads", threads,     "--out",
                         ldir,        "--device", device,      NULL};
        if (zs_bench_run(targv, tlog) != 0 || read_metrics(tdir, &tr) < 2) {
            fprintf(stderr, "bench_launch_step: zshard train failed (log %s)\n", tlog);
            goto out;
        }
        if (zs_bench_run(largv, llog) != 0 || read_metrics(ldir, &la) < 2) {
            fprintf(stderr, "bench_launch_step: zshard launch failed (log %s)\n", llog);
            goto out;
        }
        same &= zs_bench_same_model(tdir, ldir);
    }
    double t_train = zs_bench_median(tr.step_ms, tr.n),
           t_launch = zs_bench_median(la.step_ms, la.n);
    double compute = zs_bench_median(la.compute, la.n), fetch = zs_bench_median(la.fetch, la.n);
    double push = zs_bench_median(la.push, la.n);
    double wait = t_launch - compute - fetch - push;
    printf("small model (%s), %s steps x %d rounds, %s kernel threads, compute on %s; medians of "
           "steps 2..%s\n",
           cfg, steps, rounds, threads, device, steps);
    printf("zshard train: %.0f ms/step; zshard launch (1 server, 1 worker): %.0f ms/step\n",
           t_train, t_launch);
    printf("worker's step: compute %.0f ms (%.0f%%), waiting on fetches %.0f ms (%.1f%%), on "
           "pushes %.0f ms (%.1f%%), on the step %.0f ms (%.1f%%)\n",
           compute, 100 * compute / t_launch, fetch, 100 * fetch / t_launch, push,
           100 * push / t_launch, wait, 100 * wait / t_launch);
    printf("final weights: %s\n", same ? "bitwise equal" : "DIFFERENT");
    printf("bench_launch_step: %.0f ms/step (launch 1+1), zshard train %.0f ms/step, ratio %.2f "
           "(target <= 1.25)\n",
           t_launch, t_train, t_launch / t_train);
    rc = same ? 0 : 1;
out:
    if (zs_bench_rmtree(dir) != 0)
        rc = 1;
    return rc;
}
