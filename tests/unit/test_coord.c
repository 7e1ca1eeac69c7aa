/*
 * coord: a whole job over real processes on loopback -- `zshard coord`, S `zshard server`s,
 * and W workers played by this test (the control plane through proto/ctrl.h, the data plane
 * through worker/client.h) -- for (S, W) = (1, 1), (2, 2), (3, 2).  The coordinator's
 * metrics.jsonl (less timing fields) and model.safetensors must be bitwise those of
 * `zshard train` on the same config and data.  Also: a worker whose data differs is refused.
 */
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/data.h"
#include "kernels/gpt2.h"
#include "proto/ctrl.h"
#include "server/shardmap.h"
#include "tests/unit/netutil.h"
#include "tests/unit/test.h"
#include "worker/client.h"

enum { MAXW = 2, STEPS = 4 };

typedef struct {
    zs_ctrl *ctrl;
    uint32_t id;
    zs_config cfg;
    zs_tensor_table tt;
    zs_msg_job job;
    int have_job;
    zs_shardmap map;
    int have_map;
    zs_dataset data;
    zs_client *client;
    zs_gpt2 *model;
    float *params, *grads;
    int32_t *in, *tg;
    long last_step_done;
    long done_step;     /* the step done_mask is about */
    uint64_t done_mask; /* chunks of done_step this worker computed */
    uint64_t last_hb;
    int shutdown, refused;
} worker;

static uint64_t ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void wsend(worker *w, Zshard__Envelope *env)
{
    env->has_protocol_version = env->has_sender = 1;
    env->protocol_version = ZS_PROTOCOL_VERSION;
    env->sender = w->id;
    CHECK_OK(zs_ctrl_send(w->ctrl, NULL, env));
}

static void worker_start(worker *w, const char *coord_ep)
{
    memset(w, 0, sizeof *w);
    w->last_step_done = -1;
    w->done_step = -1;
    CHECK_OK(zs_ctrl_connect(coord_ep, &w->ctrl));
    Zshard__Register r = ZSHARD__REGISTER__INIT;
    r.has_role = r.has_protocol_version = r.has_capabilities = r.has_pid = 1;
    r.role = ZSHARD__ROLE__ROLE_WORKER;
    r.protocol_version = ZS_PROTOCOL_VERSION;
    r.capabilities = ZSHARD__CAPABILITY__CAP_FETCH_FP32 | ZSHARD__CAPABILITY__CAP_TRANSPORT_TCP;
    r.hostname = (char *)"localhost";
    r.pid = (uint32_t)getpid();
    Zshard__Envelope env = ZSHARD__ENVELOPE__INIT;
    env.body_case = ZSHARD__ENVELOPE__BODY_REGISTRATION;
    env.registration = &r;
    wsend(w, &env);
}

/* Once the job and the map are in: load the data, say ready, connect the data plane. */
static void worker_setup(worker *w, const char *data_override)
{
    CHECK_OK(zs_data_open(data_override ? data_override : w->job.data_path, &w->data));
    Zshard__DataCheck dc = ZSHARD__DATA_CHECK__INIT;
    dc.has_fingerprint = dc.has_ntokens = 1;
    dc.fingerprint = w->data.fingerprint;
    dc.ntokens = w->data.ntokens;
    Zshard__Ready rd = ZSHARD__READY__INIT;
    rd.what_case = ZSHARD__READY__WHAT_DATA;
    rd.data = &dc;
    Zshard__Envelope env = ZSHARD__ENVELOPE__INIT;
    env.body_case = ZSHARD__ENVELOPE__BODY_READY;
    env.ready = &rd;
    wsend(w, &env);
    const char *eps[16];
    for (int s = 0; s < w->map.n_servers; s++)
        eps[s] = NULL;
    /* Endpoints come with the map message; kept by the caller in w->job's absence. */
    (void)eps;
}

static void compute_chunk(worker *w, long step, int chunk)
{
    size_t N = w->tt.total;
    zs_client_op *op;
    int done = 0;
    if (getenv("ZS_TEST_LOG"))
        fprintf(stderr, "test_coord: worker %u computes step %ld chunk %d\n", w->id, step, chunk);
    CHECK_OK(zs_client_fetch(w->client, 0, N, step, ZS_DTYPE_F32, w->params, &op));
    CHECK_OK(zs_client_wait(w->client, op, 30000, &done));
    if (getenv("ZS_TEST_LOG"))
        fprintf(stderr, "test_coord: fetched (done %d)\n", done);
    int b = w->cfg.micro_batch, T = w->cfg.model.block_size;
    zs_data_chunk(&w->data, w->cfg.seed, step, chunk, b, T, w->in, w->tg);
    zs_gpt2_flat flat = {.params = w->params, .grads = w->grads};
    zs_gpt2_io io = zs_gpt2_flat_io(&flat);
    float loss;
    CHECK_OK(zs_gpt2_forward(w->model, &io, w->in, w->tg, b, T, &loss));
    CHECK_OK(zs_gpt2_backward(w->model, &io));
    CHECK_OK(zs_client_push(w->client, 0, N, step, chunk, w->grads, &op));
    CHECK_OK(zs_client_wait(w->client, op, 30000, &done));
    Zshard__ChunkDone cd = ZSHARD__CHUNK_DONE__INIT;
    cd.has_step = cd.has_chunk = cd.has_worker = cd.has_loss = 1;
    cd.step = (uint64_t)step;
    cd.chunk = (uint32_t)chunk;
    cd.worker = w->id;
    cd.loss = loss;
    Zshard__Envelope env = ZSHARD__ENVELOPE__INIT;
    env.body_case = ZSHARD__ENVELOPE__BODY_CHUNK_DONE;
    env.chunk_done = &cd;
    wsend(w, &env);
}

/* Handles at most one control message; returns 1 if one was handled. */
static int worker_turn(worker *w, const char *data_override)
{
    if (w->id && ms() - w->last_hb > 300) {
        Zshard__Heartbeat h = ZSHARD__HEARTBEAT__INIT;
        h.has_sender = h.has_step = 1;
        h.sender = w->id;
        h.step = (uint64_t)(w->last_step_done + 1);
        Zshard__Envelope env = ZSHARD__ENVELOPE__INIT;
        env.body_case = ZSHARD__ENVELOPE__BODY_HEARTBEAT;
        env.heartbeat = &h;
        wsend(w, &env);
        w->last_hb = ms();
    }
    Zshard__Envelope *env = NULL;
    zs_msg_ctx ctx = {.self = ZS_MSG_WORKER};
    if (zs_ctrl_recv(w->ctrl, 5, &ctx, NULL, &env) != ZS_OK) {
        fprintf(stderr, "test_coord: worker %u refused a message: %s\n", w->id, zs_last_error());
        zs_test_failures++;
        return 0;
    }
    if (!env)
        return 0;
    switch (env->body_case) {
    case ZSHARD__ENVELOPE__BODY_REGISTRATION_REPLY:
        CHECK_EQ_INT(env->registration_reply->outcome_case,
                     ZSHARD__REGISTER_REPLY__OUTCOME_ASSIGNED_ID);
        w->id = env->registration_reply->assigned_id;
        break;
    case ZSHARD__ENVELOPE__BODY_JOB_SPEC:
        CHECK_OK(zs_msg_jobspec_to_config(env->job_spec, &w->cfg, &w->tt, &w->job));
        w->have_job = 1;
        break;
    case ZSHARD__ENVELOPE__BODY_SHARD_MAP: {
        CHECK_OK(zs_shardmap_from_msg(env->shard_map, &w->map));
        w->have_map = 1;
        const char *eps[16];
        for (size_t s = 0; s < env->shard_map->n_servers; s++)
            eps[s] = env->shard_map->servers[s]->endpoint;
        CHECK_OK(zs_client_open(&w->map, eps, w->id, 0, &w->client));
        size_t N = w->tt.total;
        w->params = malloc(N * 4);
        w->grads = malloc(N * 4);
        CHECK_OK(zs_client_register(w->client, w->params, N * 4));
        CHECK_OK(zs_client_register(w->client, w->grads, N * 4));
        int b = w->cfg.micro_batch, T = w->cfg.model.block_size;
        w->in = malloc((size_t)b * T * 4);
        w->tg = malloc((size_t)b * T * 4);
        CHECK_OK(zs_gpt2_create(&w->cfg.model, &w->tt, b, T, 1, &w->model));
        worker_setup(w, data_override);
        break;
    }
    case ZSHARD__ENVELOPE__BODY_STEP_ASSIGN: {
        const Zshard__StepAssign *a = env->step_assign;
        if (a->worker != w->id)
            break;
        if ((long)a->step != w->done_step) {
            w->done_step = (long)a->step;
            w->done_mask = 0;
        }
        for (size_t i = 0; i < a->n_chunks; i++) {
            if (w->done_mask >> a->chunks[i] & 1)
                continue; /* a repeated assignment: already computed */
            compute_chunk(w, (long)a->step, (int)a->chunks[i]);
            w->done_mask |= 1ull << a->chunks[i];
        }
        break;
    }
    case ZSHARD__ENVELOPE__BODY_ERROR:
        if (env->error->code == ZSHARD__ERROR_CODE__ERROR_DATA_MISMATCH)
            w->refused = 1;
        break;
    case ZSHARD__ENVELOPE__BODY_SHUTDOWN:
        w->shutdown = 1;
        break;
    default:
        break;
    }
    zs_msg_free(env);
    return 1;
}

static void worker_free(worker *w)
{
    zs_gpt2_free(w->model);
    zs_client_close(w->client);
    zs_ctrl_close(w->ctrl);
    if (w->have_map)
        zs_shardmap_free(&w->map);
    if (w->have_job)
        zs_tensors_free(&w->tt);
    zs_data_close(&w->data);
    free(w->params);
    free(w->grads);
    free(w->in);
    free(w->tg);
}

static pid_t spawn(char *const argv[])
{
    pid_t p = fork();
    if (p == 0) {
        execv(argv[0], argv);
        _exit(127);
    }
    return p;
}

static int wait_exit(pid_t p, int seconds)
{
    int status = -1;
    for (int t = 0; t < seconds * 10; t++) {
        if (waitpid(p, &status, WNOHANG) == p)
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        usleep(100000);
    }
    kill(p, SIGKILL);
    waitpid(p, &status, 0);
    return -1;
}

static void run(const char *zshard, const char *work, int S, int W, int bad_worker)
{
    char *level = getenv("ZS_TEST_LOG") ? getenv("ZS_TEST_LOG") : "warn";
    char ep[64], out[512], ref[512], cmd[2048], servers[8];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", zs_test_free_port());
    snprintf(out, sizeof out, "%s/coord_%d_%d", work, S, W);
    snprintf(ref, sizeof ref, "%s/train", work);
    snprintf(servers, sizeof servers, "%d", S);
    char steps[8];
    snprintf(steps, sizeof steps, "%d", STEPS);
    char *cargv[] = {(char *)zshard, "coord", "--listen", ep, "--config", "data/tiny.json",
                     "--servers", servers, "--data", "data/tiny.txt", "--steps", steps, "--out",
                     out, "--log-level", level, NULL};
    pid_t coord = spawn(cargv);
    /* Random bytes to the coordinator's port: ZeroMQ refuses the peer; the job goes on. */
    usleep(200000);
    zs_test_send_garbage(zs_test_port_of(ep), (uint64_t)S);
    pid_t srv[3];
    for (int s = 0; s < S; s++) {
        char *sargv[] = {(char *)zshard, "server", "--coord", ep, "--listen", "127.0.0.1:0",
                         "--threads", "1", "--log-level", level, NULL};
        srv[s] = spawn(sargv);
    }
    worker ws[MAXW + 1];
    int nw = 0;
    if (bad_worker) {
        /* A worker whose copy of the data is another text: refused; the job goes on. */
        worker_start(&ws[W], ep);
        uint64_t until = ms() + 30000;
        while (!ws[W].refused && ms() < until)
            worker_turn(&ws[W], "data/tiny.json");
        CHECK(ws[W].refused);
    }
    for (int i = 0; i < W; i++)
        worker_start(&ws[i], ep);
    nw = W;
    uint64_t deadline = ms() + 120000;
    int all_down = 0;
    while (!all_down && ms() < deadline) {
        all_down = 1;
        for (int i = 0; i < nw; i++) {
            if (ws[i].shutdown)
                continue;
            all_down = 0;
            worker_turn(&ws[i], NULL);
        }
    }
    CHECK(all_down);
    if (bad_worker)
        worker_free(&ws[W]);
    CHECK_EQ_INT(wait_exit(coord, 30), 0);
    for (int s = 0; s < S; s++)
        CHECK_EQ_INT(wait_exit(srv[s], 30), 0);
    for (int i = 0; i < nw; i++)
        worker_free(&ws[i]);
    snprintf(cmd, sizeof cmd, "cmp %s/model.safetensors %s/model.safetensors", out, ref);
    CHECK(system(cmd) == 0);
    snprintf(cmd, sizeof cmd,
             "diff <(sed -E 's/, \"tokens_per_sec\": [^,}]*//; s/, \"step_ms\": [^,}]*//; "
             "s/, \"workers\": [^,}]*//' %s/metrics.jsonl) "
             "<(sed -E 's/, \"tokens_per_sec\": [^,}]*//; s/, \"step_ms\": [^,}]*//; "
             "s/, \"workers\": [^,}]*//' %s/metrics.jsonl)", out, ref);
    char bash[2200];
    snprintf(bash, sizeof bash, "bash -c '%s'", cmd);
    /* The inner single quotes of sed would end bash -c's: write the command to a script. */
    char script[600];
    snprintf(script, sizeof script, "%s/diff_%d_%d.sh", work, S, W);
    FILE *f = fopen(script, "w");
    fprintf(f, "%s\n", cmd);
    fclose(f);
    snprintf(bash, sizeof bash, "bash %s", script);
    CHECK(system(bash) == 0);
}

int main(void)
{
    const char *zshard = getenv("ZSHARD");
    if (!zshard) {
        fprintf(stderr, "test_coord: set ZSHARD to the zshard binary (CTest does)\n");
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    char work[] = "/tmp/zs_test_coord_XXXXXX";
    CHECK(mkdtemp(work) != NULL);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s train --config data/tiny.json --data data/tiny.txt --steps %d "
             "--out %s/train --threads 1 --log-level warn", zshard, STEPS, work);
    CHECK(system(cmd) == 0);
    const char *only = getenv("ZS_TEST_ONLY"); /* "S,W" runs one case (debugging) */
    if (!only || strcmp(only, "1,1") == 0)
        run(zshard, work, 1, 1, 0);
    if (!only || strcmp(only, "2,2") == 0)
        run(zshard, work, 2, 2, 1);
    if (!only || strcmp(only, "3,2") == 0)
        run(zshard, work, 3, 2, 0);
    snprintf(cmd, sizeof cmd, "rm -rf %s", work);
    CHECK(system(cmd) == 0);
    return zs_test_result("test_coord");
}
