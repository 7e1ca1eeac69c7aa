/*
 * zshard status: asks a running coordinator what its job is doing (a StatusRequest, which
 * needs no registration and changes nothing) and prints the step, the phase, the newest
 * checkpoint and the latest checkpoint failure, and every member with its state, last
 * heartbeat and, for workers, chunks and throughput.  --json prints the same as one JSON
 * object, for scripts.
 */
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "common/clock.h"
#include "proto/ctrl.h"

static const char status_usage[] =
    "usage: zshard status --coord tcp://HOST:PORT [--json] [--timeout-ms MS]\n"
    "                     [--secret FILE | --insecure]\n"
    "\n"
    "Prints what a running job is doing: the step, the phase, the newest checkpoint (and why\n"
    "the latest one failed, if it did), and every server and worker that joined it (state,\n"
    "last heartbeat, chunks done and assigned, tokens/s over the last chunk).  Exits 1 if the\n"
    "coordinator does not answer within the timeout.\n"
    "\n"
    "  --coord tcp://HOST:PORT  the coordinator's control endpoint\n"
    "  --json                   one JSON object instead of the table\n"
    "  --timeout-ms MS          how long to wait for the answer (default "
    "3000)\n" ZS_CLI_SECRET_USAGE "  -h, --help               this text\n";

static const char *role_name(Zshard__Role r)
{
    return r == ZSHARD__ROLE__ROLE_SERVER   ? "server"
           : r == ZSHARD__ROLE__ROLE_WORKER ? "worker"
                                            : "tool";
}

static const char *state_name(Zshard__MemberState s)
{
    return s == ZSHARD__MEMBER_STATE__MEMBER_ACTIVE ? "active"
           : s == ZSHARD__MEMBER_STATE__MEMBER_GONE ? "gone"
                                                    : "joining";
}

/* The checkpoint lines of the table: the newest committed checkpoint (the one `latest` names,
 * what --resume DIR continues from) and, if the latest attempt failed, why. */
static void print_checkpoint(const Zshard__StatusReply *r)
{
    const char *dir = r->checkpoint_dir && *r->checkpoint_dir ? r->checkpoint_dir : NULL;
    if (r->has_last_checkpoint && r->last_checkpoint > 0)
        printf("checkpoint: step %llu in %s (latest)\n", (unsigned long long)r->last_checkpoint,
               dir ? dir : "?");
    else if (dir)
        printf("checkpoint: none yet in %s\n", dir);
    else
        printf("checkpoint: none (this job writes none)\n");
    if (r->checkpoint_error && *r->checkpoint_error)
        printf("checkpoint failed: %s\n", r->checkpoint_error);
}

static void print_table(const Zshard__StatusReply *r)
{
    printf("step %llu of %llu, %s; %u live workers", (unsigned long long)r->steps_done,
           (unsigned long long)r->steps, r->phase, r->live_workers);
    if (r->steps_done && isfinite(r->loss))
        printf("; last step: loss %.4f, %.0f tokens/s", r->loss, r->tokens_per_sec);
    printf("\n");
    print_checkpoint(r);
    printf("\n%4s  %-6s  %-7s  %-20s  %8s  %6s  %8s  %10s  %s\n", "id", "role", "state", "host",
           "pid", "hb ms", "chunks", "tokens/s", "endpoint / reason");
    for (size_t i = 0; i < r->n_members; i++) {
        const Zshard__MemberStatus *m = r->members[i];
        char hb[32] = "-", chunks[32] = "-", tps[32] = "-";
        if (m->has_heartbeat_age_ms && m->state != ZSHARD__MEMBER_STATE__MEMBER_GONE)
            snprintf(hb, sizeof hb, "%llu", (unsigned long long)m->heartbeat_age_ms);
        if (m->has_chunks_done)
            snprintf(chunks, sizeof chunks, "%u+%u", m->chunks_done, m->chunks_assigned);
        if (m->has_tokens_per_sec && m->tokens_per_sec > 0)
            snprintf(tps, sizeof tps, "%.0f", m->tokens_per_sec);
        const char *last = m->state == ZSHARD__MEMBER_STATE__MEMBER_GONE ? m->reason : m->endpoint;
        char replica[64] = "";
        if (m->has_replica_of)
            snprintf(replica, sizeof replica, " (replica of %u: %s)", m->replica_of,
                     m->replica_current ? "current" : "not current");
        printf("%4u  %-6s  %-7s  %-20.20s  %8u  %6s  %8s  %10s  %s%s\n", m->id, role_name(m->role),
               state_name(m->state), m->hostname && *m->hostname ? m->hostname : "?", m->pid, hb,
               chunks, tps, last ? last : "", replica);
    }
    printf("\n(chunks: done over the run + assigned in the current step; hb ms: since its last "
           "message)\n");
}

static int print_json(const Zshard__StatusReply *r)
{
    json_t *members = json_array();
    for (size_t i = 0; i < r->n_members; i++) {
        const Zshard__MemberStatus *m = r->members[i];
        json_t *o = json_pack("{s:i, s:s, s:s, s:s, s:s, s:i}", "id", (json_int_t)m->id, "role",
                              role_name(m->role), "state", state_name(m->state), "host",
                              m->hostname ? m->hostname : "", "endpoint",
                              m->endpoint ? m->endpoint : "", "pid", (json_int_t)m->pid);
        if (m->reason && *m->reason)
            json_object_set_new(o, "reason", json_string(m->reason));
        if (m->has_heartbeat_age_ms)
            json_object_set_new(o, "heartbeat_age_ms",
                                json_integer((json_int_t)m->heartbeat_age_ms));
        if (m->has_replica_of) {
            json_object_set_new(o, "replica_of", json_integer(m->replica_of));
            json_object_set_new(o, "replica_current", json_boolean(m->replica_current));
        }
        if (m->has_chunks_done) {
            json_object_set_new(o, "chunks_done", json_integer(m->chunks_done));
            json_object_set_new(o, "chunks_assigned", json_integer(m->chunks_assigned));
            json_object_set_new(o, "tokens_per_sec", json_real(m->tokens_per_sec));
        }
        json_array_append_new(members, o);
    }
    json_t *root = json_pack("{s:i, s:i, s:s, s:i, s:o}", "steps_done", (json_int_t)r->steps_done,
                             "steps", (json_int_t)r->steps, "phase", r->phase, "live_workers",
                             (json_int_t)r->live_workers, "members", members);
    /* The checkpoint keys are always there, for scripts: 0 and "" when there is none. */
    json_object_set_new(root, "last_checkpoint",
                        json_integer(r->has_last_checkpoint ? (json_int_t)r->last_checkpoint : 0));
    json_object_set_new(root, "checkpoint_dir",
                        json_string(r->checkpoint_dir ? r->checkpoint_dir : ""));
    json_object_set_new(root, "checkpoint_error",
                        json_string(r->checkpoint_error ? r->checkpoint_error : ""));
    if (r->steps_done && isfinite(r->loss)) {
        json_object_set_new(root, "loss", json_real(r->loss));
        json_object_set_new(root, "tokens_per_sec", json_real(r->tokens_per_sec));
    }
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!text)
        return 1;
    puts(text);
    free(text);
    return 0;
}

int zs_cmd_status(int argc, char **argv)
{
    static const struct option opts[] = {{"coord", required_argument, NULL, 'c'},
                                         {"json", no_argument, NULL, 'j'},
                                         {"timeout-ms", required_argument, NULL, 't'},
                                         {"help", no_argument, NULL, 'h'},
                                         ZS_CLI_SECRET_OPTIONS,
                                         {NULL, 0, NULL, 0}};
    const char *coord = NULL;
    zs_cli_secret_args sa = {0};
    int json = 0;
    long timeout = 3000;
    int c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        if (zs_cli_secret_opt(c, &sa))
            continue;
        switch (c) {
        case 'c':
            coord = optarg;
            break;
        case 'j':
            json = 1;
            break;
        case 't':
            if ((timeout = zs_cli_int("status", "--timeout-ms", optarg, 1, 3600000)) < 0)
                return 2;
            break;
        case 'h':
            fputs(status_usage, stdout);
            return 0;
        case ':':
            return zs_cli_usage_error("status", "%s needs a value", argv[optind - 1]);
        default:
            return zs_cli_usage_error("status", "unknown option \"%s\"", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return zs_cli_usage_error("status", "unexpected argument \"%s\"", argv[optind]);
    if (!coord)
        return zs_cli_usage_error("status", "missing --coord");
    zs_secret secret;
    if (zs_cli_secret("status", sa.path, sa.insecure, &secret))
        return 2;
    zs_ctrl *ctrl = NULL;
    int rc = 1;
    zs_err opened = zs_ctrl_connect(coord, &secret, &ctrl);
    zs_secret_wipe(&secret); /* the socket holds the keys it derived */
    if (opened != ZS_OK) {
        fprintf(stderr, "zshard status: %s\n", zs_last_error());
        return 1;
    }
    Zshard__StatusRequest q = ZSHARD__STATUS_REQUEST__INIT;
    Zshard__Envelope env = ZSHARD__ENVELOPE__INIT;
    env.body_case = ZSHARD__ENVELOPE__BODY_STATUS_REQUEST;
    env.status_request = &q;
    if (zs_ctrl_send_as(ctrl, NULL, 0, &env) != ZS_OK) {
        fprintf(stderr, "zshard status: %s\n", zs_last_error());
        goto out;
    }
    zs_msg_ctx ctx = {.self = ZS_MSG_WORKER};
    uint64_t until = zs_now_ms() + (uint64_t)timeout;
    while (zs_now_ms() < until) {
        Zshard__Envelope *r = NULL;
        if (zs_ctrl_recv(ctrl, 50, &ctx, NULL, &r) != ZS_OK) {
            fprintf(stderr, "zshard status: refused an answer: %s\n", zs_last_error());
            continue;
        }
        if (!r)
            continue;
        if (r->body_case == ZSHARD__ENVELOPE__BODY_STATUS_REPLY) {
            if (json)
                rc = print_json(r->status_reply);
            else {
                print_table(r->status_reply);
                rc = 0;
            }
            zs_msg_free(r);
            goto out;
        }
        if (r->body_case == ZSHARD__ENVELOPE__BODY_ERROR) {
            fprintf(stderr, "zshard status: the coordinator says: %s\n", r->error->text);
            zs_msg_free(r);
            goto out;
        }
        zs_msg_free(r);
    }
    fprintf(stderr,
            "zshard status: no answer from %s within %ld ms (is the coordinator running, and "
            "with this job's secret?)\n",
            coord, timeout);
out:
    zs_ctrl_close(ctrl);
    return rc;
}
