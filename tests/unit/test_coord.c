/*
 * coord: a whole job over real processes on loopback -- `zshard coord`, S `zshard server`s,
 * and W workers played by this test (the control plane through proto/ctrl.h, the data plane
 * through transport/client.h) -- for (S, W) = (1, 1), (2, 2), (3, 2).  The coordinator's
 * metrics.jsonl (less timing fields) and model.safetensors must be bitwise those of
 * `zshard train` on the same config and data.  Also: a worker whose data differs is refused;
 * a register flood from 127.0.0.2 (300 Registers on one socket, then one per socket up to
 * cluster.max_members_per_address) is refused with the reasons, and the job's own members,
 * from 127.0.0.1, are let in after it;
 * peers without the job secret (a plain ZeroMQ socket, a CURVE client with another secret)
 * get nothing through, and the job is unaffected.  Every process runs with a secret made
 * here (ZSHARD_SECRET_FILE for the children).
 */
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "common/clock.h"
#include "common/data.h"
#include "common/secret.h"
#include "kernels/gpt2.h"
#include "proto/ctrl.h"
#include "proto/messages.h"
#include "tests/unit/netutil.h"
#include "tests/unit/test.h"
#include "transport/client.h"
#include "worker/session.h"

enum { MAXW = 2, STEPS = 4 };

static zs_secret job_secret;   /* what every member of the test's jobs holds */
static zs_secret other_secret; /* another job's */

/* metrics.jsonl fields that differ between runs (wall-clock, the worker count, and the
 * checkpoint a step committed: zshard train writes none). */
#define VOLATILE "tokens_per_sec|step_ms|compute_ms|fetch_wait_ms|push_wait_ms|workers|checkpoint"

/* A worker played by the test: a session and the model it computes with. */
typedef struct {
    zs_session *s;
    zs_gpt2 *model;
    float *params, *grads;
    int32_t *in, *tg;
    int ended;
    long lie_step;   /* at this step it reports its chunks done without pushing them (-1: never) */
    long stall_step; /* at this step it takes its chunks and never computes them (-1: never) */
} worker;

/* The run's last worker stalls at this step (-1: none): it keeps its heartbeats, so only the
 * chunk deadline moves its chunks to the other worker; the result is still zshard train's. */
static long stall_step = -1;

/* The run's last worker lies at this step (-1: no liar): the servers' heartbeats contradict it,
 * its chunks go to another worker, and the result is still zshard train's. */
static long liar_step = -1;

static void worker_open(worker *w, const char *ep)
{
    memset(w, 0, sizeof *w);
    CHECK_OK(zs_session_open(ep, &job_secret, NULL, 30000, NULL, &w->s));
    if (!w->s)
        return;
    const zs_config *cfg = zs_session_config(w->s);
    size_t N = zs_session_tensors(w->s)->total;
    w->params = malloc(N * 4);
    w->grads = malloc(N * 4);
    CHECK_OK(zs_client_register(zs_session_client(w->s), w->params, N * 4));
    CHECK_OK(zs_client_register(zs_session_client(w->s), w->grads, N * 4));
    int b = cfg->micro_batch, T = cfg->model.block_size;
    w->in = malloc((size_t)b * T * 4);
    w->tg = malloc((size_t)b * T * 4);
    CHECK_OK(zs_gpt2_create(&cfg->model, zs_session_tensors(w->s), b, T, 1, &w->model));
}

/* Fetches version `step`, computes the chunk, pushes its gradient, reports it. */
static void compute_chunk(worker *w, long step, int chunk)
{
    if (step == w->lie_step) { /* a ChunkDone with no pushes behind it, and a made-up loss */
        CHECK_OK(zs_session_chunk_done(w->s, step, chunk, 1.0f, NULL));
        return;
    }
    const zs_config *cfg = zs_session_config(w->s);
    zs_client *cl = zs_session_client(w->s);
    size_t N = zs_session_tensors(w->s)->total;
    zs_client_op *op;
    int done = 0;
    CHECK_OK(zs_client_fetch(cl, 0, N, step, ZS_DTYPE_F32, w->params, &op));
    CHECK_OK(zs_client_wait(cl, op, 30000, &done));
    int b = cfg->micro_batch, T = cfg->model.block_size;
    zs_data_chunk(zs_session_data(w->s), cfg->seed, step, chunk, b, T, w->in, w->tg);
    zs_gpt2_flat flat = {.params = w->params, .grads = w->grads};
    zs_gpt2_io io = zs_gpt2_flat_io(&flat);
    float loss;
    CHECK_OK(zs_gpt2_forward(w->model, &io, w->in, w->tg, b, T, &loss));
    CHECK_OK(zs_gpt2_backward(w->model, &io));
    CHECK_OK(zs_client_push(cl, 0, N, step, chunk, w->grads, &op));
    CHECK_OK(zs_client_wait(cl, op, 30000, &done));
    CHECK_OK(zs_session_chunk_done(w->s, step, chunk, loss, NULL));
}

/* Waits a little for chunks to compute: 1 if some came (in *a). */
static int worker_next(worker *w, zs_assignment *a)
{
    int got = 0;
    CHECK_OK(zs_session_next(w->s, 5, a, &got, &w->ended));
    return got;
}

static void worker_compute(worker *w, const zs_assignment *a)
{
    if (a->step == w->stall_step)
        return;
    for (int i = 0; i < a->n; i++)
        compute_chunk(w, a->step, a->chunks[i]);
}

static void worker_free(worker *w)
{
    zs_gpt2_free(w->model);
    zs_session_close(w->s);
    free(w->params);
    free(w->grads);
    free(w->in);
    free(w->tg);
}

/* A Register of the given role, protocol version and capabilities (0: none given), packed into
 * buf; its length. */
static size_t pack_register_caps(Zshard__Role role, uint32_t version, uint32_t caps, uint8_t *buf)
{
    Zshard__Register r = ZSHARD__REGISTER__INIT;
    r.has_role = r.has_protocol_version = 1;
    r.role = role;
    r.protocol_version = version;
    if (caps) { /* a whole Register of a member, as an older build sends it */
        r.has_capabilities = r.has_pid = 1;
        r.capabilities = caps;
        r.hostname = "localhost";
        r.pid = 1;
        r.build = "0.0-old";
    }
    char *endpoints[1] = {"127.0.0.1:1"};
    if (role == ZSHARD__ROLE__ROLE_SERVER) {
        r.n_endpoints = 1;
        r.endpoints = endpoints;
    }
    Zshard__Envelope env = ZSHARD__ENVELOPE__INIT;
    env.has_protocol_version = env.has_sender = 1;
    env.protocol_version = version;
    env.sender = 0;
    env.body_case = ZSHARD__ENVELOPE__BODY_REGISTRATION;
    env.registration = &r;
    return zshard__envelope__pack(&env, buf);
}

static size_t pack_register(Zshard__Role role, uint32_t version, uint8_t *buf)
{
    return pack_register_caps(role, version, 0, buf);
}

/* A member of another protocol version registers: refused with an Error that says so.  It
 * holds the secret, so this also shows that the coordinator answers members. */
static void check_version_refusal(const char *ep)
{
    zs_ctrl *c = NULL;
    CHECK_OK(zs_ctrl_connect(ep, &job_secret, &c));
    uint8_t buf[256];
    size_t n = pack_register(ZSHARD__ROLE__ROLE_WORKER, ZS_PROTOCOL_VERSION + 1, buf);
    CHECK_OK(zs_ctrl_send_raw(c, buf, n));
    Zshard__Envelope *e = NULL;
    uint64_t until = zs_now_ms() + 10000;
    while (!e && zs_now_ms() < until)
        zs_ctrl_recv(c, 100, NULL, NULL, &e);
    char want[64];
    snprintf(want, sizeof want, "protocol version %d", ZS_PROTOCOL_VERSION + 1);
    CHECK(e && e->body_case == ZSHARD__ENVELOPE__BODY_ERROR &&
          e->error->code == ZSHARD__ERROR_CODE__ERROR_PROTOCOL_VERSION &&
          strstr(e->error->text, want));
    zs_msg_free(e);
    zs_ctrl_close(c);
}

/* The hung run's cluster.max_members_per_address: the run's own members (2 servers and 2
 * workers) come from 127.0.0.1, the flood from 127.0.0.2. */
enum { PER_ADDRESS = 4 };

/* A worker's Register on socket c, and the coordinator's answer: 1 assigned, 0 refused (the
 * refusal's text in why), -1 no answer within 30 s. */
static int register_as(zs_ctrl *c, Zshard__Role role, const char *endpoint, uint32_t transports,
                       char *why, size_t cap)
{
    if (zs_ctrl_register(c, role, endpoint, transports) != ZS_OK)
        return -1;
    zs_msg_ctx ctx = {.self = ZS_MSG_WORKER};
    uint64_t until = zs_now_ms() + 30000;
    while (zs_now_ms() < until) {
        Zshard__Envelope *e = NULL;
        if (zs_ctrl_recv(c, 100, &ctx, NULL, &e) != ZS_OK || !e)
            continue;
        int got = -2;
        if (e->body_case == ZSHARD__ENVELOPE__BODY_REGISTRATION_REPLY) {
            const Zshard__RegisterReply *rr = e->registration_reply;
            got = rr->outcome_case == ZSHARD__REGISTER_REPLY__OUTCOME_ASSIGNED_ID;
            snprintf(why, cap, "%s", got ? "" : rr->refusal);
        }
        zs_msg_free(e);
        if (got != -2)
            return got;
    }
    return -1;
}

static int register_once(zs_ctrl *c, char *why, size_t cap)
{
    return register_as(c, ZSHARD__ROLE__ROLE_WORKER, NULL, ZSHARD__CAPABILITY__CAP_TRANSPORT_TCP,
                       why, cap);
}

/* Capability negotiation: a server must serve exactly one backend; offering two is refused
 * with the reason, and takes no place (the job's own servers register after it). */
static void check_transport_refusal(const char *ep)
{
    zs_ctrl *c = NULL;
    CHECK_OK(zs_ctrl_connect(ep, &job_secret, &c));
    char why[256] = "";
    int got =
        register_as(c, ZSHARD__ROLE__ROLE_SERVER, "127.0.0.1:9",
                    ZSHARD__CAPABILITY__CAP_TRANSPORT_TCP | ZSHARD__CAPABILITY__CAP_TRANSPORT_RDMA,
                    why, sizeof why);
    CHECK_EQ_INT(got, 0);
    CHECK(strstr(why, "exactly one data-plane backend") != NULL);
    zs_ctrl_close(c);
}

/*
 * A member floods the coordinator with Registers, from another loopback address (127.0.0.2)
 * than the job's own members.  On one socket: the first gets an id, every other one a refusal
 * that says why, and none takes a place in the table.  Then on sockets of their own: as many
 * as cluster.max_members_per_address allows are let in, the next is refused with that reason.
 * The job's servers and workers, all from 127.0.0.1, register after it and are let in (the
 * job's result shows that nothing else changed).
 */
static void check_register_flood(const char *ep)
{
    enum { FLOOD = 300 };
    char from2[300];
    snprintf(from2, sizeof from2, "tcp://127.0.0.2:0;%s", ep + strlen("tcp://"));
    zs_ctrl *c = NULL;
    CHECK_OK(zs_ctrl_connect(from2, &job_secret, &c));
    for (int i = 0; i < FLOOD && c; i++)
        CHECK_OK(zs_ctrl_register(c, ZSHARD__ROLE__ROLE_WORKER, NULL,
                                  ZSHARD__CAPABILITY__CAP_TRANSPORT_TCP));
    int assigned = 0, refused = 0, other = 0;
    zs_msg_ctx ctx = {.self = ZS_MSG_WORKER};
    uint64_t until = zs_now_ms() + 30000;
    while (c && assigned + refused + other < FLOOD && zs_now_ms() < until) {
        Zshard__Envelope *e = NULL;
        if (zs_ctrl_recv(c, 100, &ctx, NULL, &e) != ZS_OK) {
            fprintf(stderr, "register flood: %s\n", zs_last_error());
            other++;
            continue;
        }
        if (!e)
            continue;
        if (e->body_case != ZSHARD__ENVELOPE__BODY_REGISTRATION_REPLY)
            ; /* a job spec or map for the one that got in: not counted */
        else if (e->registration_reply->outcome_case == ZSHARD__REGISTER_REPLY__OUTCOME_ASSIGNED_ID)
            assigned++;
        else if (strstr(e->registration_reply->refusal, "registered already"))
            refused++;
        else
            other++;
        zs_msg_free(e);
    }
    CHECK_EQ_INT(assigned, 1);
    CHECK_EQ_INT(refused, FLOOD - 1);
    CHECK_EQ_INT(other, 0);
    /* One registration per socket, up to the bound for 127.0.0.2. */
    zs_ctrl *more[PER_ADDRESS] = {NULL};
    char why[400] = "";
    for (int i = 0; i < PER_ADDRESS; i++) {
        CHECK_OK(zs_ctrl_connect(from2, &job_secret, &more[i]));
        int got = more[i] ? register_once(more[i], why, sizeof why) : -1;
        if (i < PER_ADDRESS - 1) {
            if (got != 1)
                fprintf(stderr, "test_coord: flood registration %d: %d (%s)\n", i + 2, got, why);
            CHECK_EQ_INT(got, 1);
        } else {
            CHECK_EQ_INT(got, 0);
            CHECK(strstr(why, "members from 127.0.0.2 are registered already") != NULL);
        }
    }
    for (int i = 0; i < PER_ADDRESS; i++)
        zs_ctrl_close(more[i]);
    zs_ctrl_close(c);
}

/* Peers without the job secret register as a worker and as a server, and ask for the status:
 * a plain ZeroMQ socket (no CURVE), and a CURVE client with another job's secret.  None gets
 * an answer of any kind (CURVE's handshake or the ZAP handler stops them before a message
 * reaches the coordinator); check_version_refusal, run right after, shows that the
 * coordinator does answer a member meanwhile, and the job's result that they changed
 * nothing. */
static void check_strangers(const char *ep)
{
    uint8_t buf[3][256];
    size_t len[3];
    len[0] = pack_register(ZSHARD__ROLE__ROLE_WORKER, ZS_PROTOCOL_VERSION, buf[0]);
    len[1] = pack_register(ZSHARD__ROLE__ROLE_SERVER, ZS_PROTOCOL_VERSION, buf[1]);
    Zshard__StatusRequest q = ZSHARD__STATUS_REQUEST__INIT;
    Zshard__Envelope env = ZSHARD__ENVELOPE__INIT;
    env.has_protocol_version = 1;
    env.protocol_version = ZS_PROTOCOL_VERSION;
    env.body_case = ZSHARD__ENVELOPE__BODY_STATUS_REQUEST;
    env.status_request = &q;
    len[2] = zshard__envelope__pack(&env, buf[2]);

    void *ctx = zmq_ctx_new(), *plain = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(plain, ZMQ_LINGER, &linger, sizeof linger);
    CHECK(zmq_connect(plain, ep) == 0);
    zs_ctrl *other = NULL;
    CHECK_OK(zs_ctrl_connect(ep, &other_secret, &other));
    for (int i = 0; i < 3; i++) {
        zmq_send(plain, buf[i], len[i], ZMQ_DONTWAIT);
        CHECK_OK(zs_ctrl_send_raw(other, buf[i], len[i]));
    }
    zmq_pollitem_t item = {.socket = plain, .events = ZMQ_POLLIN};
    CHECK_EQ_INT(zmq_poll(&item, 1, 1500), 0);
    Zshard__Envelope *e = NULL;
    CHECK_OK(zs_ctrl_recv(other, 500, NULL, NULL, &e));
    CHECK(e == NULL);
    zs_msg_free(e);
    zs_ctrl_close(other);
    zmq_close(plain);
    zmq_ctx_term(ctx);
}

/* Asks the coordinator for its status (over c, which holds the job secret) and finds member
 * id there: 1 with its state and reason (copied into why), 0 if no StatusReply came within
 * 10 s or it does not list the member. */
static int member_status(zs_ctrl *c, uint32_t id, Zshard__MemberState *state, char *why, size_t cap)
{
    Zshard__StatusRequest q = ZSHARD__STATUS_REQUEST__INIT;
    Zshard__Envelope env = ZSHARD__ENVELOPE__INIT;
    env.body_case = ZSHARD__ENVELOPE__BODY_STATUS_REQUEST;
    env.status_request = &q;
    if (zs_ctrl_send_as(c, NULL, 0, &env) != ZS_OK) {
        fprintf(stderr, "test_coord: status request: %s\n", zs_last_error());
        return 0;
    }
    zs_msg_ctx ctx = {.self = ZS_MSG_WORKER};
    int found = 0;
    uint64_t until = zs_now_ms() + 10000;
    while (zs_now_ms() < until) {
        Zshard__Envelope *r = NULL;
        if (zs_ctrl_recv(c, 100, &ctx, NULL, &r) != ZS_OK || !r)
            continue;
        if (r->body_case == ZSHARD__ENVELOPE__BODY_STATUS_REPLY) {
            for (size_t i = 0; i < r->status_reply->n_members; i++) {
                const Zshard__MemberStatus *m = r->status_reply->members[i];
                if (m->id != id)
                    continue;
                *state = m->state;
                snprintf(why, cap, "%s", m->reason ? m->reason : "");
                found = 1;
            }
            zs_msg_free(r);
            if (!found)
                fprintf(stderr, "test_coord: the status lists no member %u\n", id);
            return found;
        }
        zs_msg_free(r);
    }
    fprintf(stderr, "test_coord: no StatusReply within 10 s\n");
    return 0;
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

/* hung: the last worker registers, takes its chunks and then stops (no heartbeats): the
 * coordinator must declare it dead after cluster.heartbeat_timeout_ms and give its chunks to
 * the others, with the same result.  That it did is read from the coordinator's status, asked
 * whenever a live worker gets chunks until the hung one shows as gone: the chunks the hung
 * worker held come to a live one only after that, and the job cannot end before they are
 * done, so the coordinator is still there to answer. */
static void run(const char *zshard, const char *work, int S, int W, int bad_worker, int hung)
{
    char *level = getenv("ZS_TEST_LOG") ? getenv("ZS_TEST_LOG") : "warn";
    char ep[64], out[512], ref[512], cmd[2048], servers[8];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", zs_test_free_port());
    snprintf(out, sizeof out, "%s/coord_%d_%d", work, S, W);
    snprintf(ref, sizeof ref, "%s/train", work);
    snprintf(servers, sizeof servers, "%d", S);
    char steps[8];
    snprintf(steps, sizeof steps, "%d", STEPS);
    /* Same model, data and math as tiny.json; a short heartbeat timeout for the hung case. */
    char config[600];
    snprintf(config, sizeof config, "%s/config_%d_%d.json", work, S, W);
    char cmd0[1400];
    snprintf(cmd0, sizeof cmd0,
             "sed 's/\"cluster\": {/\"cluster\": {\"heartbeat_interval_ms\": "
             "100, \"heartbeat_timeout_ms\": 1500, \"max_members_per_address\": %d, /' "
             "data/tiny.json > %s",
             hung ? PER_ADDRESS : 1024, config);
    CHECK(system(cmd0) == 0);
    char *cargv[] = {(char *)zshard, "coord",     "--listen", ep,       "--config",
                     config,         "--servers", servers,    "--data", "data/tiny.txt",
                     "--steps",      steps,       "--out",    out,      "--log-level",
                     level,          NULL};
    pid_t coord = spawn(cargv);
    /* Random bytes to the coordinator's port, once it listens: the connection is closed
     * (ZeroMQ may even frame some of them as messages, which the coordinator then refuses one
     * by one); the job goes on. */
    int listening = zs_test_wait_listening(zs_test_port_of(ep), 15000);
    if (!listening)
        fprintf(stderr, "test_coord: the coordinator does not listen on %s after 15 s\n", ep);
    CHECK(listening);
    int garbage = zs_test_send_garbage(zs_test_port_of(ep), (uint64_t)S, 30);
    if (garbage != 1)
        fprintf(stderr, "test_coord: random bytes to %s: %s\n", ep,
                garbage < 0 ? "no connection" : "not closed within 30 s");
    CHECK_EQ_INT(garbage, 1);
    if (S == 1)
        check_strangers(ep);
    check_version_refusal(ep);
    if (S == 1)
        check_transport_refusal(ep);
    if (S == 2 && !bad_worker && hung)
        check_register_flood(ep);
    pid_t srv[3];
    for (int s = 0; s < S; s++) {
        char *sargv[] = {(char *)zshard, "server", "--coord",     ep,    "--listen", "127.0.0.1:0",
                         "--threads",    "1",      "--log-level", level, NULL};
        srv[s] = spawn(sargv);
    }
    if (bad_worker) {
        /* A worker whose copy of the data is another text: refused with the reason; the job
         * goes on. */
        zs_session *bad = NULL;
        CHECK_OK(zs_session_open(ep, &job_secret, "data/tiny.json", 30000, NULL, &bad));
        zs_assignment a;
        int got = 0, ended = 0;
        zs_err e = ZS_OK;
        uint64_t until = zs_now_ms() + 30000;
        while (bad && !ended && zs_now_ms() < until)
            e = zs_session_next(bad, 20, &a, &got, &ended);
        CHECK(ended && e != ZS_OK && strstr(zs_last_error(), "differs from the job's"));
        zs_session_close(bad);
    }
    worker ws[MAXW];
    for (int i = 0; i < W; i++) {
        worker_open(&ws[i], ep);
        ws[i].lie_step = i == W - 1 ? liar_step : -1;
        ws[i].stall_step = i == W - 1 ? stall_step : -1;
    }
    zs_ctrl *status = NULL;
    if (hung)
        CHECK_OK(zs_ctrl_connect(ep, &job_secret, &status));
    uint32_t hung_id = hung && ws[W - 1].s ? zs_session_id(ws[W - 1].s) : 0;
    Zshard__MemberState hung_state = ZSHARD__MEMBER_STATE__MEMBER_STATE_UNSPECIFIED;
    char hung_why[400] = "";
    uint64_t deadline = zs_now_ms() + 120000;
    int all_ended = 0;
    while (!all_ended && zs_now_ms() < deadline) {
        all_ended = 1;
        for (int i = 0; i < W - hung; i++)
            if (ws[i].s && !ws[i].ended) {
                zs_assignment a;
                if (worker_next(&ws[i], &a)) {
                    if (status && hung_state != ZSHARD__MEMBER_STATE__MEMBER_GONE)
                        member_status(status, hung_id, &hung_state, hung_why, sizeof hung_why);
                    worker_compute(&ws[i], &a);
                }
                all_ended = 0;
            }
    }
    CHECK(all_ended);
    if (hung) { /* the job went on only once the coordinator had declared the hung worker dead */
        if (hung_state != ZSHARD__MEMBER_STATE__MEMBER_GONE ||
            !strstr(hung_why, "no heartbeat within the timeout"))
            fprintf(stderr,
                    "test_coord: hung worker %u: last state %d (%s), expected gone for "
                    "\"no heartbeat within the timeout\"\n",
                    hung_id, (int)hung_state, hung_why);
        CHECK_EQ_INT(hung_state, ZSHARD__MEMBER_STATE__MEMBER_GONE);
        CHECK(strstr(hung_why, "no heartbeat within the timeout") != NULL);
    }
    zs_ctrl_close(status);
    for (int i = 0; i < W; i++)
        worker_free(&ws[i]);
    CHECK_EQ_INT(wait_exit(coord, 30), 0);
    for (int s = 0; s < S; s++)
        CHECK_EQ_INT(wait_exit(srv[s], 30), 0);
    snprintf(cmd, sizeof cmd, "cmp %s/model.safetensors %s/model.safetensors", out, ref);
    CHECK(system(cmd) == 0);
    snprintf(cmd, sizeof cmd,
             "diff <(sed -E 's/, \"(%s)\": [^,}]*//g' %s/metrics.jsonl) "
             "<(sed -E 's/, \"(%s)\": [^,}]*//g' %s/metrics.jsonl)",
             VOLATILE, out, VOLATILE, ref);
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

/* An fp16 job's workers fetch fp16 copies: a server or worker that does not offer
 * CAP_FETCH_FP16 (a build from before them) is refused, naming the reason; one that does is let
 * in (a worker here: it gets its id). */
static void check_fp16_capability(const char *zshard, const char *work)
{
    char ep[64], config[600], out[600], cmd[1400];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", zs_test_free_port());
    snprintf(config, sizeof config, "%s/fp16.json", work);
    snprintf(out, sizeof out, "%s/fp16-coord", work);
    snprintf(cmd, sizeof cmd,
             "sed 's/\"cluster\": {/\"fp16\": {\"enabled\": true}, \"cluster\": {/' "
             "data/tiny.json > %s",
             config);
    CHECK(system(cmd) == 0);
    char *cargv[] = {(char *)zshard, "coord",     "--listen", ep,       "--config",
                     config,         "--servers", "1",        "--data", "data/tiny.txt",
                     "--steps",      "1",         "--out",    out,      "--log-level",
                     "error",        NULL};
    pid_t coord = spawn(cargv);
    CHECK(zs_test_wait_listening(zs_test_port_of(ep), 15000));
    const uint32_t old = ZSHARD__CAPABILITY__CAP_FETCH_FP32 | ZSHARD__CAPABILITY__CAP_FETCH_BF16 |
                         ZSHARD__CAPABILITY__CAP_TRANSPORT_TCP;
    const Zshard__Role roles[2] = {ZSHARD__ROLE__ROLE_WORKER, ZSHARD__ROLE__ROLE_SERVER};
    for (int k = 0; k < 2; k++) {
        zs_ctrl *c = NULL;
        CHECK_OK(zs_ctrl_connect(ep, &job_secret, &c));
        uint8_t buf[256];
        size_t n = pack_register_caps(roles[k], ZS_PROTOCOL_VERSION, old, buf);
        CHECK_OK(zs_ctrl_send_raw(c, buf, n));
        zs_msg_ctx ctx = {.self = ZS_MSG_WORKER};
        Zshard__Envelope *e = NULL;
        uint64_t until = zs_now_ms() + 10000;
        while (!e && zs_now_ms() < until)
            zs_ctrl_recv(c, 100, &ctx, NULL, &e);
        const char *want = k ? "this server (build 0.0-old) does not serve them"
                             : "this worker (build 0.0-old) does not fetch them";
        int ok = e && e->body_case == ZSHARD__ENVELOPE__BODY_REGISTRATION_REPLY &&
                 e->registration_reply->outcome_case == ZSHARD__REGISTER_REPLY__OUTCOME_REFUSAL &&
                 strstr(e->registration_reply->refusal, "this is an fp16 job") &&
                 strstr(e->registration_reply->refusal, want);
        if (!ok && e && e->body_case == ZSHARD__ENVELOPE__BODY_ERROR)
            fprintf(stderr, "test_coord: fp16 job: error %s\n", e->error->text);
        if (!ok)
            fprintf(stderr, "test_coord: fp16 job, %s without CAP_FETCH_FP16: %s\n",
                    k ? "server" : "worker",
                    e && e->body_case == ZSHARD__ENVELOPE__BODY_REGISTRATION_REPLY
                        ? e->registration_reply->refusal
                    : e ? "another message"
                        : "nothing");
        CHECK(ok);
        zs_msg_free(e);
        zs_ctrl_close(c);
    }
    /* This build's worker offers it: let in. */
    zs_ctrl *c = NULL;
    CHECK_OK(zs_ctrl_connect(ep, &job_secret, &c));
    char why[400] = "";
    CHECK_EQ_INT(register_once(c, why, sizeof why), 1);
    zs_ctrl_close(c);
    kill(coord, SIGTERM);
    wait_exit(coord, 30);
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
    char secret_path[600], other_path[600];
    snprintf(secret_path, sizeof secret_path, "%s/secret", work);
    snprintf(other_path, sizeof other_path, "%s/other-secret", work);
    CHECK_OK(zs_secret_generate(secret_path));
    CHECK_OK(zs_secret_generate(other_path));
    CHECK_OK(zs_secret_load(secret_path, &job_secret));
    CHECK_OK(zs_secret_load(other_path, &other_secret));
    setenv(ZS_SECRET_ENV, secret_path, 1); /* for the coordinator and servers we start */
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "%s train --config data/tiny.json --data data/tiny.txt --steps %d "
             "--out %s/train --threads 1 --log-level warn",
             zshard, STEPS, work);
    CHECK(system(cmd) == 0);
    const char *only = getenv("ZS_TEST_ONLY"); /* "S,W" runs one case (debugging) */
    if (!only || strcmp(only, "1,1") == 0)
        run(zshard, work, 1, 1, 0, 0);
    if (!only || strcmp(only, "2,2") == 0) {
        stall_step = 2;
        run(zshard, work, 2, 2, 1, 0);
        stall_step = -1;
    }
    if (!only || strcmp(only, "3,2") == 0) {
        liar_step = 1;
        run(zshard, work, 3, 2, 0, 0);
        liar_step = -1;
    }
    if (!only || strcmp(only, "hung") == 0)
        run(zshard, work, 2, 2, 0, 1);
    if (!only || strcmp(only, "fp16") == 0)
        check_fp16_capability(zshard, work);
    snprintf(cmd, sizeof cmd, "rm -rf %s", work);
    CHECK(system(cmd) == 0);
    return zs_test_result("test_coord");
}
