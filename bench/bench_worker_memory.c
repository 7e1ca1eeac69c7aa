/*
 * bench_worker_memory: a worker's peak resident memory against `zshard train`'s on GPT-2 124M
 * (12 x 768, 12 heads, vocabulary 50257, sequences of 64 tokens, 2 chunks of 4 per step),
 * measured in the same run.  The target is at most 40%: a worker holds two blocks plus the
 * embeddings (parameters and gradients) and one chunk's activations, where the trainer holds
 * the whole model five times over (weights, gradient, accumulator, AdamW m and v).
 *
 * It runs `zshard train` for `steps` steps, then `zshard coord` + one `zshard server` + one
 * `zshard worker` for the same steps, each as a child process, and reads each child's peak
 * RSS from wait4() (ru_maxrss).  The server's figure is printed too: it holds the training
 * state the worker does not.  Both runs must end with the same weights (checked with cmp).
 *
 * usage: bench_worker_memory ZSHARD [steps=1 [threads=2]]
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/benchutil.h"

/* Waits for pid; returns its exit status (-1 for a signal) and its peak RSS in MiB. */
static int reap(pid_t pid, double *rss_mib)
{
    int st = 0;
    struct rusage ru;
    if (wait4(pid, &st, 0, &ru) != pid)
        return -1;
    *rss_mib = (double)ru.ru_maxrss / 1024.0; /* ru_maxrss is in KiB on Linux */
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_worker_memory ZSHARD [steps [threads]]\n");
        return 2;
    }
    char *zshard = argv[1];
    const char *steps = argc > 2 ? argv[2] : "1";
    const char *threads = argc > 3 ? argv[3] : "2";
    signal(SIGPIPE, SIG_IGN);
    char dir[] = "/tmp/zs_bench_mem_XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    char cfg[256], data[256], ref[256], dist[256], ep[64];
    snprintf(cfg, sizeof cfg, "%s/cfg.json", dir);
    snprintf(data, sizeof data, "%s/data.txt", dir);
    snprintf(ref, sizeof ref, "%s/train", dir);
    snprintf(dist, sizeof dist, "%s/dist", dir);
    FILE *f = fopen(cfg, "w");
    if (!f)
        return 1;
    fprintf(f, "{\"train_batch_size\": 8, \"train_micro_batch_size_per_gpu\": 4, \"model\": "
               "{\"n_layer\": 12, \"n_head\": 12, \"n_embd\": 768, \"vocab_size\": 50257, "
               "\"block_size\": 64}}\n");
    fclose(f);
    /* Byte-level text: token ids below 256 are valid GPT-2 ids. */
    if (!(f = fopen(data, "w")))
        return 1;
    for (int i = 0; i < 200000; i++)
        fputc("the quick brown fox jumps over the lazy dog\n"[i % 44], f);
    fclose(f);

    if (zs_bench_job_secret(dir, NULL) != 0) /* for the coordinator, server and worker */
        return 1;
    int rc = 1;
    double train_rss = 0, worker_rss = 0, server_rss = 0, coord_rss = 0;
    char *targv[] = {zshard,      "train",         "--config",    cfg,     "--data",
                     data,        "--steps",       (char *)steps, "--out", ref,
                     "--threads", (char *)threads, "--log-level", "error", NULL};
    if (reap(zs_bench_spawn(targv, NULL), &train_rss) != 0) {
        fprintf(stderr, "bench_worker_memory: zshard train failed\n");
        goto out;
    }
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", zs_bench_free_port());
    char *cargv[] = {zshard,      "coord", "--listen",    ep,      "--config", cfg,
                     "--servers", "1",     "--data",      data,    "--steps",  (char *)steps,
                     "--out",     dist,    "--log-level", "error", NULL};
    char *sargv[] = {zshard,        "server",      "--coord",   ep,
                     "--listen",    "127.0.0.1:0", "--threads", (char *)threads,
                     "--log-level", "error",       NULL};
    char *wargv[] = {zshard,          "worker",      "--coord", ep,  "--threads",
                     (char *)threads, "--log-level", "error",   NULL};
    pid_t coord = zs_bench_spawn(cargv, NULL), server = zs_bench_spawn(sargv, NULL),
          worker = zs_bench_spawn(wargv, NULL);
    int wst = reap(worker, &worker_rss);
    int sst = reap(server, &server_rss);
    int cst = reap(coord, &coord_rss);
    if (wst != 0 || sst != 0 || cst != 0) {
        fprintf(stderr,
                "bench_worker_memory: the distributed run failed (coord %d, server %d, "
                "worker %d)\n",
                cst, sst, wst);
        goto out;
    }
    int same = zs_bench_same_model(ref, dist);
    printf("GPT-2 124M (12 x 768, V 50257, T 64, 2 chunks of 4), %s step(s), %s threads\n", steps,
           threads);
    printf("peak RSS: zshard train %.0f MiB; worker %.0f MiB, server %.0f MiB, coordinator "
           "%.0f MiB; final weights %s\n",
           train_rss, worker_rss, server_rss, coord_rss, same ? "bitwise equal" : "DIFFERENT");
    printf("bench_worker_memory: worker peak RSS %.0f MiB, zshard train %.0f MiB, ratio %.2f "
           "(target <= 0.40)\n",
           worker_rss, train_rss, worker_rss / train_rss);
    rc = same ? 0 : 1;
out:
    if (zs_bench_rmtree(dir) != 0)
        rc = 1;
    return rc;
}
