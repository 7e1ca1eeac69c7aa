/*
 * bench_elastic: what elasticity costs.  Two figures from one job (coordinator, one
 * partition server and workers as real processes on loopback, a 4 x 128 model with 8 chunks
 * per step, heartbeats every 100 ms, a worker declared dead after 1000 ms of silence):
 *
 *   1. Failover: the time from SIGKILL of a worker that holds chunks of the current step to
 *      the moment the coordinator has handed those chunks to the surviving worker (seen with
 *      StatusRequest polls every 2 ms), and to the end of that step.  The limit is the
 *      configured heartbeat timeout, what finding the dead worker by its silence alone would
 *      cost; its control connection closes with it, which lets the coordinator act after two
 *      heartbeat intervals instead.
 *   2. Join: the step time of the step a new worker first computes in, against the median
 *      step time with the same number of workers afterwards (the limit); the ratio is the
 *      cost of a join (registration, data check, its first fetches of every layer).
 * The final weights must equal `zshard train`'s (cmp).
 *
 * usage: bench_elastic ZSHARD [steps=40]
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/benchutil.h"
#include "common/clock.h"
#include "proto/ctrl.h"

/* One StatusReply (NULL if the coordinator did not answer within 1 s). */
static Zshard__Envelope *status(zs_ctrl *ctrl)
{
    Zshard__StatusRequest q = ZSHARD__STATUS_REQUEST__INIT;
    Zshard__Envelope env = ZSHARD__ENVELOPE__INIT;
    env.body_case = ZSHARD__ENVELOPE__BODY_STATUS_REQUEST;
    env.status_request = &q;
    if (zs_ctrl_send_as(ctrl, NULL, 0, &env) != ZS_OK)
        return NULL;
    zs_msg_ctx ctx = {.self = ZS_MSG_WORKER};
    uint64_t until = zs_now_ms() + 1000;
    while (zs_now_ms() < until) {
        Zshard__Envelope *r = NULL;
        if (zs_ctrl_recv(ctrl, 50, &ctx, NULL, &r) == ZS_OK && r) {
            if (r->body_case == ZSHARD__ENVELOPE__BODY_STATUS_REPLY)
                return r;
            zs_msg_free(r);
        }
    }
    return NULL;
}

static const Zshard__MemberStatus *member_by_pid(const Zshard__StatusReply *r, pid_t pid)
{
    for (size_t i = 0; i < r->n_members; i++)
        if (r->members[i]->role == ZSHARD__ROLE__ROLE_WORKER && r->members[i]->pid == (uint32_t)pid)
            return r->members[i];
    return NULL;
}

/* step_ms and workers of each step of dir/metrics.jsonl; returns the count. */
static int read_metrics(const char *dir, double *ms, int *workers, int max)
{
    char path[600], line[1024];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "r");
    int n = 0;
    while (f && n < max && fgets(line, sizeof line, f)) {
        const char *a = strstr(line, "\"step_ms\": "), *b = strstr(line, "\"workers\": ");
        ms[n] = a ? strtod(a + 11, NULL) : NAN;
        workers[n] = b ? atoi(b + 11) : 0;
        n++;
    }
    if (f)
        fclose(f);
    return n;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_elastic ZSHARD [steps]\n");
        return 2;
    }
    char *zshard = argv[1];
    char *steps = argc > 2 ? argv[2] : "40";
    int nsteps = atoi(steps);
    signal(SIGPIPE, SIG_IGN);
    char dir[] = "/tmp/zs_bench_elastic_XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    char cfg[256], data[256], ref[256], out[256], cmd[1024], logs[6][300];
    snprintf(cfg, sizeof cfg, "%s/cfg.json", dir);
    snprintf(data, sizeof data, "%s/data.txt", dir);
    snprintf(ref, sizeof ref, "%s/train", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    for (int i = 0; i < 6; i++)
        snprintf(logs[i], sizeof logs[i], "%s/log%d.txt", dir, i);
    const int timeout_ms = 1000;
    zs_secret secret; /* the job's, for the processes started here and this one */
    if (zs_bench_job_secret(dir, &secret) != 0)
        return 1;
    FILE *f = fopen(cfg, "w");
    if (!f)
        return 1;
    fprintf(f,
            "{\"seed\": 3, \"train_batch_size\": 16, \"train_micro_batch_size_per_gpu\": 2, "
            "\"model\": {\"n_layer\": 4, \"n_head\": 4, \"n_embd\": 128, \"vocab_size\": 256, "
            "\"block_size\": 64}, \"cluster\": {\"shard_size\": 65536, "
            "\"heartbeat_interval_ms\": 100, \"heartbeat_timeout_ms\": %d}, "
            "\"elasticity\": {\"enabled\": true}}\n",
            timeout_ms);
    fclose(f);
    if (!(f = fopen(data, "w")))
        return 1;
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 1 << 19; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        fputc("etaoin shrdlu\n"[x % 14], f);
    }
    fclose(f);

    int rc = 1;
    pid_t coord = 0, server = 0, wk[3] = {0};
    zs_ctrl *ctrl = NULL;
    char ep[64];
    /* The coordinator binds a port ZeroMQ picks; its log says which. */
    char *cargv[] = {zshard,     "coord", "--listen",  "tcp://127.0.0.1:*",
                     "--config", cfg,     "--servers", "1",
                     "--data",   data,    "--steps",   steps,
                     "--out",    out,     NULL};
    coord = zs_bench_spawn(cargv, logs[0]);
    ep[0] = '\0';
    for (int i = 0; i < 200 && !ep[0]; i++) {
        usleep(20000);
        FILE *l = fopen(logs[0], "r");
        char line[512];
        while (l && fgets(line, sizeof line, l)) {
            const char *p = strstr(line, "listening on tcp://");
            if (p && sscanf(p + 13, "%63s", ep) == 1)
                break;
        }
        if (l)
            fclose(l);
    }
    if (!ep[0] || zs_ctrl_connect(ep, &secret, &ctrl) != ZS_OK) {
        fprintf(stderr, "bench_elastic: no coordinator endpoint (log %s)\n", logs[0]);
        goto out;
    }
    char *sargv[] = {zshard,        "server",    "--coord", ep,  "--listen",
                     "127.0.0.1:0", "--threads", "1",       NULL};
    char *wargv[] = {zshard, "worker", "--coord", ep, "--threads", "1", NULL};
    server = zs_bench_spawn(sargv, logs[1]);
    wk[0] = zs_bench_spawn(wargv, logs[2]);
    wk[1] = zs_bench_spawn(wargv, logs[3]);

    /* 1. Failover: wait for step 5, then kill worker 0 while it holds chunks. */
    double t_kill = 0, t_reassigned = 0, t_step_end = 0;
    long kill_step = -1;
    uint32_t survivor_before = 0, reassigned_to = 0;
    for (;;) {
        Zshard__Envelope *e = status(ctrl);
        if (!e) {
            fprintf(stderr, "bench_elastic: the coordinator stopped answering\n");
            goto out;
        }
        const Zshard__StatusReply *r = e->status_reply;
        const Zshard__MemberStatus *a = member_by_pid(r, wk[0]), *b = member_by_pid(r, wk[1]);
        if (!t_kill && r->steps_done >= 5 && a && b && a->chunks_assigned > 0 &&
            strcmp(r->phase, "computing") == 0) {
            kill(wk[0], SIGKILL);
            t_kill = zs_now_s();
            kill_step = (long)r->steps_done;
            survivor_before = b->chunks_assigned;
        } else if (t_kill && !t_reassigned && a && a->state == ZSHARD__MEMBER_STATE__MEMBER_GONE) {
            /* The coordinator hands a member's unfinished chunks out in the same turn that
             * declares it gone (coordstate's leave), and sends the new assignment then. */
            t_reassigned = zs_now_s();
            reassigned_to = b ? b->chunks_assigned : 0;
        } else if (t_reassigned && (long)r->steps_done > kill_step) {
            t_step_end = zs_now_s();
        }
        zs_msg_free(e);
        if (t_step_end)
            break;
        usleep(2000);
    }
    waitpid(wk[0], NULL, 0);
    wk[0] = 0;

    /* 2. Join: a new worker after a few steps with one. */
    for (;;) {
        Zshard__Envelope *e = status(ctrl);
        if (!e)
            goto out;
        long done = (long)e->status_reply->steps_done;
        zs_msg_free(e);
        if (done >= kill_step + 6)
            break;
        usleep(10000);
    }
    wk[2] = zs_bench_spawn(wargv, logs[4]);
    int st = 0;
    if (waitpid(coord, &st, 0) != coord || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "bench_elastic: the coordinator failed (log %s)\n", logs[0]);
        coord = 0;
        goto out;
    }
    coord = 0;

    double ms[1024];
    int workers[1024];
    int n = read_metrics(out, ms, workers, 1024);
    int join = -1; /* the first step the new worker computed in: 2 workers again */
    for (int i = (int)kill_step + 1; i < n && join < 0; i++)
        if (workers[i] == 2)
            join = i;
    double after[1024];
    int na = 0;
    for (int i = join + 1; join >= 0 && i < n; i++)
        if (workers[i] == 2)
            after[na++] = ms[i];
    double steady = zs_bench_median(after, na);

    char *targv[] = {zshard, "train", "--config", cfg,         "--data", data, "--steps",
                     steps,  "--out", ref,        "--threads", "1",      NULL};
    pid_t t = zs_bench_spawn(targv, logs[5]);
    waitpid(t, NULL, 0);
    snprintf(cmd, sizeof cmd, "cmp -s %s/model.safetensors %s/model.safetensors", ref, out);
    int same = system(cmd) == 0;

    double failover = (t_reassigned - t_kill) * 1e3;
    printf("job: 4 x 128 model, 8 chunks per step, %d steps, 1 server, 2 workers; heartbeats "
           "every 100 ms, timeout %d ms\n",
           nsteps, timeout_ms);
    printf("failover: SIGKILL during step %ld (the survivor had %u chunks to do) -> declared "
           "dead and its chunks reassigned after %.0f ms (the survivor has %u to do) -> step "
           "done %.0f ms after the kill\n",
           kill_step + 1, survivor_before, failover, reassigned_to, (t_step_end - t_kill) * 1e3);
    if (join >= 0)
        printf("join: step %d (the new worker's first) took %.0f ms; median step with 2 workers "
               "afterwards %.0f ms over %d steps; ratio %.2f\n",
               join + 1, ms[join], steady, na, ms[join] / steady);
    else
        printf("join: the new worker computed in no step (the job ended first)\n");
    printf("final weights: %s\n", same ? "bitwise equal to zshard train" : "DIFFERENT");
    printf("bench_elastic: %.0f ms from SIGKILL to reassignment, heartbeat timeout %d ms, ratio "
           "%.2f\n",
           failover, timeout_ms, failover / timeout_ms);
    rc = same && join >= 0 ? 0 : 1;
out:
    zs_ctrl_close(ctrl);
    pid_t all[5] = {coord, server, wk[0], wk[1], wk[2]};
    for (int i = 0; i < 5; i++)
        if (all[i] > 0) {
            kill(all[i], SIGKILL);
            waitpid(all[i], NULL, 0);
        }
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        rc = 1;
    return rc;
}
