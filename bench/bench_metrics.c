/*
 * bench_metrics: what the Prometheus endpoints cost a step.  The step time of `zshard launch`
 * (1 server, 1 worker) with --metrics and a scraper that reads the coordinator's and the
 * server's /metrics every 100 ms (far more often than a Prometheus would: its example config
 * scrapes every 15 s), against the same launch without --metrics, measured in the same run.  The
 * runs alternate (without, with, without, ...) so that a slow spell of the machine hits both alike;
 * each figure is the median over all runs of the steps after the first.  Both must end with the
 * same weights.
 *
 * usage: bench_metrics ZSHARD CONFIG.json [steps=200 [rounds=3 [threads=1]]]
 */
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench/benchutil.h"

#define MAX_SAMPLES 100000

/* Adds step_ms of steps 2.. of dir/metrics.jsonl to v[*n]; returns the steps read. */
static int read_steps(const char *dir, double *v, int *n)
{
    char path[700], line[2048];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    int steps = 0;
    while (fgets(line, sizeof line, f)) {
        steps++;
        if (zs_bench_field(line, "step") >= 2 && *n < MAX_SAMPLES)
            v[(*n)++] = zs_bench_field(line, "step_ms");
    }
    fclose(f);
    return steps;
}

/* One GET /metrics of 127.0.0.1:port, read to the end; returns the bytes read or -1. */
static long scrape(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    long got = -1;
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
        static const char req[] = "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        if (send(fd, req, sizeof req - 1, MSG_NOSIGNAL) == (ssize_t)(sizeof req - 1)) {
            char buf[65536];
            ssize_t r;
            got = 0;
            while ((r = recv(fd, buf, sizeof buf, 0)) > 0)
                got += r;
        }
    }
    if (fd >= 0)
        close(fd);
    return got;
}

/* The ports of dir/metrics-targets.json's targets (at most 8). */
static int target_ports(const char *dir, int *ports)
{
    char path[700], buf[8192];
    snprintf(path, sizeof path, "%s/metrics-targets.json", dir);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    int k = 0;
    for (const char *p = buf; k < 8 && (p = strstr(p, "\"127.0.0.1:")); p++)
        ports[k++] = atoi(p + 11);
    return k;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bench_metrics ZSHARD CONFIG.json [steps [rounds [threads]]]\n");
        return 2;
    }
    char *zshard = argv[1], *cfg = argv[2];
    char *steps = argc > 3 ? argv[3] : "200";
    int rounds = argc > 4 ? atoi(argv[4]) : 3;
    char *threads = argc > 5 ? argv[5] : "1";
    signal(SIGPIPE, SIG_IGN);
    char dir[] = "/tmp/zs_bench_metrics_XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    char data[512], cmd[2048];
    snprintf(data, sizeof data, "%s/data.txt", dir);
    if (zs_bench_write_corpus(data) != 0)
        return 1;

    static double off[MAX_SAMPLES], on[MAX_SAMPLES];
    int n_off = 0, n_on = 0, rc = 1, same = 1;
    long scrapes = 0, scrape_bytes = 0, scrape_failed = 0;
    for (int r = 0; r < rounds; r++) {
        char odir[600], mdir[600], olog[700], mlog[700];
        snprintf(odir, sizeof odir, "%s/off%d", dir, r);
        snprintf(mdir, sizeof mdir, "%s/on%d", dir, r);
        snprintf(olog, sizeof olog, "%s/off%d.log", dir, r);
        snprintf(mlog, sizeof mlog, "%s/on%d.log", dir, r);
        char *oargv[] = {zshard,      "launch", "--config",  cfg,  "--data",    data,
                         "--steps",   steps,    "--servers", "1",  "--workers", "1",
                         "--threads", threads,  "--out",     odir, NULL};
        char *margv[] = {zshard,      "launch",    "--config",    cfg,         "--data",
                         data,        "--steps",   steps,         "--servers", "1",
                         "--workers", "1",         "--threads",   threads,     "--out",
                         mdir,        "--metrics", "127.0.0.1:0", NULL};
        int st = 0;
        pid_t p = zs_bench_spawn(oargv, olog);
        if (p < 0 || waitpid(p, &st, 0) != p || !WIFEXITED(st) || WEXITSTATUS(st) != 0 ||
            read_steps(odir, off, &n_off) < 2) {
            fprintf(stderr, "bench_metrics: zshard launch failed; the end of its log:\n");
            snprintf(cmd, sizeof cmd, "tail -n 20 %s >&2", olog);
            if (system(cmd) != 0)
                fprintf(stderr, "bench_metrics: cannot show %s\n", olog);
            goto out;
        }
        p = zs_bench_spawn(margv, mlog);
        if (p < 0)
            goto out;
        /* Scrape every target every 100 ms until the launch exits. */
        while (waitpid(p, &st, WNOHANG) == 0) {
            int ports[8];
            int k = target_ports(mdir, ports);
            for (int i = 0; i < k; i++) {
                long b = scrape(ports[i]);
                scrapes++;
                if (b > 0)
                    scrape_bytes += b;
                else
                    scrape_failed++; /* the process may be ending */
            }
            nanosleep(&(struct timespec){0, 100 * 1000 * 1000}, NULL);
        }
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || read_steps(mdir, on, &n_on) < 2) {
            fprintf(stderr, "bench_metrics: zshard launch --metrics failed; the end of its log:\n");
            snprintf(cmd, sizeof cmd, "tail -n 20 %s >&2", mlog);
            if (system(cmd) != 0)
                fprintf(stderr, "bench_metrics: cannot show %s\n", mlog);
            goto out;
        }
        same &= zs_bench_same_model(odir, mdir);
    }
    double t_off = zs_bench_median(off, n_off), t_on = zs_bench_median(on, n_on);
    printf("%s, %s steps x %d rounds, %s kernel threads; medians of steps 2..%s\n", cfg, steps,
           rounds, threads, steps);
    printf("scrapes: %ld (%ld failed: the process was ending), %.0f bytes each\n", scrapes,
           scrape_failed,
           scrapes > scrape_failed ? (double)scrape_bytes / (double)(scrapes - scrape_failed) : 0);
    printf("final weights: %s\n", same ? "bitwise equal" : "DIFFERENT");
    printf("bench_metrics: %.2f ms/step with --metrics and a scrape every 100 ms, %.2f ms/step "
           "without, ratio %.3f\n",
           t_on, t_off, t_on / t_off);
    rc = same ? 0 : 1;
out:
    if (zs_bench_rmtree(dir) != 0)
        rc = 1;
    return rc;
}
