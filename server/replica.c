/*
 * replica: see replica.h.  One thread at a time (apply or load), started by the server's
 * thread and reaped by it (zs_replica_poll); the thread's only output besides the store is
 * its result and error text, read after the join.
 */
#include "server/replica.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "transport/client.h"

#define RETRY_MS 100   /* between tries of a server that is not ready for a load yet */
#define CONNECT_MS 500 /* one attempt to reach a server (connect and handshake) */

typedef enum { JOB_NONE = 0, JOB_APPLY, JOB_LOAD } job_kind;

struct zs_replica {
    zs_store *st;
    int lost;

    pthread_t thread;
    job_kind running; /* the thread's job, JOB_NONE: no thread */
    atomic_int finished;
    zs_err result;
    char job_error[1024];

    double lr, clip; /* apply */
    int skip;

    const zs_shardmap *map; /* load */
    const char *const *endpoints;
    zs_auth auth; /* this server's data-plane identity, for the state fetches */
    long version;
    int *todo;
    int n_todo;
    int timeout_ms;
    atomic_int cancel; /* the server gives up on a load (zs_replica_release) */
    int wake_fd;       /* written when a thread finishes; -1: none */
    zs_conn_opts conn; /* the backend the servers serve, and its options */
};

void zs_replica_set_transport(zs_replica *r, const zs_conn_opts *o)
{
    r->conn = *o;
}

zs_err zs_replica_new(zs_store *st, zs_replica **out)
{
    *out = calloc(1, sizeof **out);
    if (!*out)
        return zs_error(ZS_ERR_NOMEM, "replica: out of memory");
    (*out)->st = st;
    (*out)->wake_fd = -1;
    return ZS_OK;
}

/* Joins the thread (cancel: telling a load to give up first). */
static void join(zs_replica *r, int cancel)
{
    if (r->running == JOB_NONE)
        return;
    if (cancel)
        atomic_store(&r->cancel, 1);
    pthread_join(r->thread, NULL);
    job_kind k = r->running;
    r->running = JOB_NONE;
    atomic_store(&r->cancel, 0);
    if (r->result != ZS_OK && cancel && k == JOB_LOAD) {
        r->lost = 1; /* given up on purpose: nothing to report */
    } else if (r->result != ZS_OK) {
        zs_replica_lose(r, r->job_error);
    } else if (k == JOB_LOAD) {
        ZS_INFO("replica: loaded %d shards at version %ld", r->n_todo, r->version);
    }
}

/* Joins the thread, frees the replica; the store goes to *st (NULL: freed too). */
static void dispose(zs_replica *r, zs_store **st)
{
    if (!r)
        return;
    join(r, 1);
    if (st)
        *st = r->st;
    else
        zs_store_free(r->st);
    free(r->todo);
    free(r);
}

zs_store *zs_replica_release(zs_replica *r)
{
    if (!r)
        return NULL;
    /* An apply is waited for; a load is cancelled (unless it just finished): what a cancelled
     * or failed one left is not a replica. */
    join(r, 1);
    zs_store *st = NULL;
    dispose(r, r->lost ? NULL : &st);
    return st;
}

void zs_replica_free(zs_replica *r)
{
    dispose(r, NULL);
}

zs_store *zs_replica_store(const zs_replica *r)
{
    return r->st;
}

void zs_replica_set_wake(zs_replica *r, int fd)
{
    r->wake_fd = fd;
}

/* A thread's last act: it is done, and the server's loop wakes to reap it. */
static void finished(zs_replica *r)
{
    atomic_store(&r->finished, 1);
    uint64_t one = 1;
    if (r->wake_fd >= 0 && write(r->wake_fd, &one, sizeof one) < 0)
        ZS_DEBUG("replica: waking the server: %s", strerror(errno));
}

static void *apply_main(void *arg)
{
    zs_replica *r = arg;
    r->result = zs_store_apply(r->st, r->lr, r->clip, r->skip);
    if (r->result != ZS_OK)
        snprintf(r->job_error, sizeof r->job_error, "%s", zs_last_error());
    finished(r);
    return NULL;
}

static zs_err start(zs_replica *r, job_kind kind, void *(*main)(void *))
{
    if (r->running != JOB_NONE)
        return zs_error(ZS_ERR_INVALID, "replica: a %s is still running",
                        r->running == JOB_APPLY ? "apply" : "load");
    r->result = ZS_OK;
    r->job_error[0] = '\0';
    atomic_store(&r->finished, 0);
    if (pthread_create(&r->thread, NULL, main, r) != 0)
        return zs_error(ZS_ERR_IO, "replica: cannot start a thread");
    r->running = kind;
    return ZS_OK;
}

zs_err zs_replica_apply(zs_replica *r, double lr, double clip, int skip)
{
    r->lr = lr;
    r->clip = clip;
    r->skip = skip;
    return start(r, JOB_APPLY, apply_main);
}

/* Fetches the three arrays of local shard i at r->version: ZS_OK, or the first failure. */
static zs_err load_shard(zs_replica *r, zs_client *cl, int i, uint64_t deadline)
{
    zs_shard_range rg;
    float *a[3];
    zs_store_state(r->st, i, &rg, &a[0], &a[1], &a[2]);
    zs_client_op *op[3] = {NULL, NULL, NULL};
    zs_err res = ZS_OK;
    for (int k = 0; k < 3 && res == ZS_OK; k++)
        res = zs_client_fetch_state(cl, rg.begin, rg.end, r->version, k, a[k], &op[k]);
    /* In slices, so that a server giving up on the load (a new failover) is not kept
     * waiting. */
    for (int k = 0; k < 3 && res == ZS_OK; k++) {
        int done = 0;
        while (res == ZS_OK && !done) {
            uint64_t now = zs_now_ms();
            if (now >= deadline || atomic_load(&r->cancel))
                res =
                    zs_error(ZS_ERR_IO, "%s", now >= deadline ? "no answer in time" : "cancelled");
            else
                res = zs_client_wait(cl, op[k], deadline - now < 200 ? (int)(deadline - now) : 200,
                                     &done);
        }
        if (done)
            op[k] = NULL;
    }
    for (int k = 0; k < 3; k++)
        if (op[k])
            zs_client_cancel(cl, op[k], 0);
    if (res != ZS_OK)
        return zs_error_context(res, "shard %d [%zu, %zu)", rg.index, rg.begin, rg.end);
    return ZS_OK;
}

static void *load_main(void *arg)
{
    zs_replica *r = arg;
    uint64_t deadline = zs_now_ms() + (uint64_t)r->timeout_ms;
    zs_client *cl = NULL;
    zs_err res = ZS_OK;
    int k = 0;
    while (k < r->n_todo) {
        if (!cl) {
            /* Short connect attempts, so that a cancel (the server shutting down, perhaps
             * while the peer does too and answers no handshake) is seen soon. */
            zs_conn_opts o = r->conn;
            o.conns = 1;
            o.connect_timeout_ms = CONNECT_MS;
            res = zs_client_open(r->map, r->endpoints, &r->auth, &o, &cl);
            for (int j = k; j < r->n_todo && res == ZS_OK; j++) {
                zs_shard_range rg;
                float *a[3];
                zs_store_state(r->st, r->todo[j], &rg, &a[0], &a[1], &a[2]);
                for (int x = 0; x < 3 && res == ZS_OK; x++)
                    res = zs_client_register(cl, a[x], (rg.end - rg.begin) * sizeof(float));
            }
        }
        if (res == ZS_OK)
            res = load_shard(r, cl, r->todo[k], deadline);
        if (res == ZS_OK) {
            k++;
            continue;
        }
        /* The shard's server may still be rebuilding its own stores: try again, from a new
         * connection, until the time is up. */
        zs_client_close(cl);
        cl = NULL;
        if (zs_now_ms() >= deadline || atomic_load(&r->cancel))
            break;
        ZS_DEBUG("replica: loading at version %ld: %s; trying again", r->version, zs_last_error());
        struct timespec ts = {0, RETRY_MS * 1000000L};
        nanosleep(&ts, NULL);
        res = ZS_OK;
    }
    zs_client_close(cl);
    if (res != ZS_OK) {
        snprintf(r->job_error, sizeof r->job_error,
                 "loading the replica at version %ld failed after %d ms: %s", r->version,
                 r->timeout_ms, zs_last_error());
        r->result = res;
    }
    finished(r);
    return NULL;
}

zs_err zs_replica_load(zs_replica *r, const zs_shardmap *map, const char *const *endpoints,
                       const zs_auth *auth, long version, const int *todo, int n, int timeout_ms)
{
    free(r->todo);
    r->todo = malloc((size_t)(n ? n : 1) * sizeof *r->todo);
    if (!r->todo)
        return zs_error(ZS_ERR_NOMEM, "replica: out of memory");
    memcpy(r->todo, todo, (size_t)n * sizeof *todo);
    r->n_todo = n;
    r->map = map;
    r->endpoints = endpoints;
    r->auth = *auth;
    r->version = version;
    r->timeout_ms = timeout_ms;
    return start(r, JOB_LOAD, load_main);
}

int zs_replica_poll(zs_replica *r)
{
    if (r->running == JOB_NONE || !atomic_load(&r->finished))
        return 0;
    join(r, 0);
    return 1;
}

int zs_replica_applying(const zs_replica *r)
{
    return r->running == JOB_APPLY;
}

int zs_replica_lost(const zs_replica *r)
{
    return r->lost;
}

void zs_replica_lose(zs_replica *r, const char *why)
{
    if (r->lost)
        return;
    r->lost = 1;
    ZS_ERROR("replica: lost: %s; losing its server now means going back to the last checkpoint",
             why);
}

int zs_replica_complete(const zs_replica *r)
{
    return !r->lost && r->running == JOB_NONE && zs_store_complete(r->st);
}
