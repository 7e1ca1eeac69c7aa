/*
 * zshard launch: a whole job on this host.  It starts the coordinator, S partition servers
 * and W workers as children (this same binary, /proc/self/exe), shows their output, and ends
 * them together.
 *
 * Start: the coordinator binds port "*" (a free port chosen by the kernel, so two jobs on one
 * host cannot race for the same number); the launcher reads which port from /proc, then
 * starts the servers (data plane on port 0, chosen the same way) and the workers.  Children
 * are named by their start order ("server 2"); the coordinator numbers peers by registration
 * order, which can differ.
 *
 * Threads: each worker gets --threads T, or the CPUs divided by W; each server (AdamW between
 * steps, while the workers wait) the CPUs divided by S.
 *
 * Output: the coordinator's progress lines ("step ...") pass through as they are; the other
 * lines of a child are shown with its name in front ("[server 2] WARN ..."), without the
 * timestamp and pid of the log format, from WARN up unless --log-level was given (then all
 * that the children print at that level).  Each child's whole output also goes to
 * OUT/logs/coord.log, server-<i>.log, worker-<i>.log.  At the end, a summary from
 * OUT/metrics.jsonl.
 *
 * End: the coordinator ends a job by telling servers and workers to exit, then exits; the
 * launcher collects everyone and exits 0 if all exited 0.  If a child fails (non-zero exit or
 * a signal), or the launcher gets SIGINT, SIGTERM or SIGHUP, it sends SIGTERM to the others,
 * SIGKILL to those still there STOP_GRACE_S later, collects them all, and exits non-zero
 * naming the failed child and its last lines.  A second signal sends SIGKILL at once.  A
 * launcher killed outright takes its children with it (PR_SET_PDEATHSIG, see procs.h).
 *
 * --metrics HOST:PORT: the coordinator serves Prometheus metrics at HOST:PORT, server i at
 * HOST:PORT+i and worker j at HOST:PORT+S+j, a worker the script starts included (port 0: each
 * a free one).  Each child prints "metrics: http://HOST:PORT/metrics";
 * the launcher writes those addresses to OUT/metrics-targets.json (Prometheus file_sd) as they
 * come, and looks for the coordinator's control port among its listening sockets only once it
 * knows which one is the metrics port.
 *
 * Elastic mode (the config's "elasticity": {"enabled": true}, or --elastic-script): a worker
 * that exits or dies is an event, not a failure: the coordinator gives its chunks to the
 * others, and with no worker left the job waits for one.  Coordinator and server failures stay
 * fatal.  The job ends when the coordinator exits; workers still running WORKER_END_S later
 * are stopped (SIGTERM and SIGCONT, SIGKILL STOP_GRACE_S later), and the exit status is 0 if
 * the coordinator and the servers exited 0.
 *
 * --elastic-script FILE: joins, leaves, kills and hangs on a schedule, for demos and tests.
 * The whole file is checked before anything starts (a bad line is refused with file:line);
 * its lines then fire one after the other, each when its condition holds and the previous
 * line has fired: "step K" when the coordinator's progress line for step K-1 has come (step K
 * began), "after MS" that many milliseconds after the previous line fired.  Workers started by
 * the script take the next numbers ("worker 4"), and all the children that can ever exist are
 * counted at parse time, so the table of children is allocated once.
 */
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "cli/cli.h"
#include "cli/procs.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/secret.h"
#include "kernels/model.h"
#include "worker/worker.h"

/* From SIGTERM to SIGKILL when stopping the children. */
#define STOP_GRACE_S 5.0
/* Once the job is ending (the coordinator or a server exited 0, or all workers did), the
 * others must have exited this much later; a straggler is a failure. */
#define END_GRACE_S 10.0
/* Pipes still open this long after every child was collected are abandoned. */
#define DRAIN_S 1.0
/* Elastic mode: workers still running this long after the coordinator exited are stopped. */
#define WORKER_END_S 2.0
/* The most workers one launch may start, from --workers and the script together. */
#define MAX_WORKERS 1024

static const char launch_usage[] =
    "usage: zshard launch --config CFG.json --data PATH --steps N --servers S --workers W\n"
    "                     --out DIR [--threads T] [--device DEV] [--gpudirect MODE]\n"
    "                     [--bind HOST] [--log-level LEVEL]\n"
    "                     [--elastic-script FILE] [--resume CKPT | --resume-if-any DIR]\n"
    "                     [--replacements N] [--secret FILE | --insecure] [--metrics HOST:PORT]\n"
    "\n"
    "Runs a whole job on this host: the coordinator, S partition servers and W workers, as\n"
    "child processes.  Writes what 'zshard train' writes (DIR/metrics.jsonl,\n"
    "DIR/model.safetensors, DIR/config.json), one progress line per step, and each process's\n"
    "log to DIR/logs/.  If one process fails, or on Ctrl-C, it stops all of them.\n"
    "\n"
    "  --config CFG.json  job configuration\n"
    "  --data PATH        training data\n"
    "  --steps N          optimizer steps of the whole run (also when it resumes)\n"
    "  --servers S        partition servers\n"
    "  --workers W        workers (0: attach them yourself with 'zshard worker --coord ...';\n"
    "                     the coordinator's endpoint is printed)\n"
    "  --out DIR          where metrics.jsonl, model.safetensors, config.json and logs/ go\n"
    "  --threads T        kernel threads per worker (default: the CPUs available divided by W)\n"
    "  --device DEV       where every worker computes: cpu (default), cuda or cuda:N\n"
    "  --gpudirect MODE   every worker's GPUDirect RDMA: auto (default), on or off (zshard\n"
    "                     worker --help)\n"
    "  --bind HOST        address to listen on and advertise (default 127.0.0.1); give this\n"
    "                     host's address to let workers on other hosts attach\n"
    "  --log-level LEVEL  error, warn, info (default) or debug, for every process; without\n"
    "                     it, only their warnings and errors are shown here (the logs have\n"
    "                     everything)\n"
    "  --elastic-script FILE\n"
    "                     start, stop and kill workers on a schedule (implies elastic mode)\n"
    "  --resume CKPT      continue a run from a checkpoint (a step-* directory, or a\n"
    "                     checkpoint directory: its newest valid one), on any number of\n"
    "                     servers; the result is bitwise that of the run never stopped\n"
    "  --resume-if-any DIR\n"
    "                     as --resume DIR when DIR holds a checkpoint, else a fresh start\n"
    "                     (a batch job that is requeued: deploy/slurm)\n"
    "  --replacements N   servers started over the run in place of lost ones (default S):\n"
    "                     each registers as a spare, which the coordinator takes in at its\n"
    "                     next recovery from a checkpoint; 0: the job goes on with the\n"
    "                     servers left\n"
    "  --secret FILE      the job secret every process proves (default: $ZSHARD_SECRET_FILE,\n"
    "                     else DIR/secret, made by the first run in DIR, mode 0600); workers\n"
    "                     attached by hand need it too\n"
    "  --insecure         no secret: anyone who reaches the job's ports is trusted\n"
    "  --metrics HOST:PORT\n"
    "                     Prometheus metrics of the coordinator at http://HOST:PORT/metrics,\n"
    "                     of server i at HOST:PORT+i and of worker j at HOST:PORT+S+j (port\n"
    "                     0: each a free port); where\n"
    "                     they are goes to DIR/metrics-targets.json, a file_sd_configs file\n"
    "                     for Prometheus, rewritten as they start (docs/observability.md)\n"
    "  -h, --help         this text\n"
    "\n"
    "Elastic mode (config \"elasticity\": {\"enabled\": true}, or --elastic-script): a worker\n"
    "that exits or dies does not stop the job; the coordinator gives its chunks to the others,\n"
    "and with no worker left the job waits for one.  A coordinator or server failure still\n"
    "stops everything.  The job ends when the coordinator exits; workers still running then\n"
    "are stopped.  The result is bitwise the same whatever the workers do.\n"
    "\n"
    "The elastic script has one action per line; '#' starts a comment, blank lines are\n"
    "ignored.  Lines fire in file order, each only after the previous one fired:\n"
    "  step K ACTION [TARGET]    when step K begins (the coordinator reported step K-1;\n"
    "                            step 1: at once)\n"
    "  after MS ACTION [TARGET]  MS milliseconds after the previous line fired (the first\n"
    "                            line: after the start), also while the job waits for workers\n"
    "ACTION: start (new workers; TARGET: how many, default 1), kill (SIGKILL), term (SIGTERM:\n"
    "the worker finishes its chunk and leaves), stop (SIGSTOP: a hang), cont (SIGCONT).\n"
    "TARGET for kill, term, stop, cont: a worker number (1, 2, ... in start order, counting\n"
    "those the script starts), any (the lowest-numbered one still running and not killed or\n"
    "terminated by the script; the default) or all.  Example:\n"
    "  step 3 start       # a second worker joins\n"
    "  step 7 kill 1      # SIGKILL worker 1 when step 7 begins\n"
    "  after 500 stop any # a hang\n"
    "  after 2000 cont 2\n";

/* One line of an elastic script. */
typedef enum { ACT_START, ACT_KILL, ACT_TERM, ACT_STOP, ACT_CONT } action_kind;
#define TARGET_ANY (-1)
#define TARGET_ALL (-2)

typedef struct {
    int line;      /* in the file, for messages */
    long step;     /* "step K": fires once step K began; 0 for "after" */
    long after_ms; /* "after MS": this long after the previous line fired */
    action_kind kind;
    int target; /* start: how many workers; signals: a worker number, TARGET_ANY or _ALL */
} script_line;

typedef struct {
    const char *config, *data, *out, *bind, *log_level, *script_path, *resume;
    const char *device;       /* --device for the workers, or NULL (the CPU) */
    const char *gpudirect;    /* --gpudirect for the workers, or NULL (auto) */
    const char *metrics_host; /* --metrics HOST:PORT, or NULL */
    long metrics_port;
    char (*metrics_at)[300]; /* [n_procs]: "HOST:PORT" each child said it serves metrics at */
    zs_secret secret;        /* the job's: its file (secret.path) goes to every child */
    long steps, servers, workers, threads; /* threads: 0 = divide the CPUs */
    int elastic;                           /* a worker's exit is an event, not a failure */
    int resume_if_any;                     /* resume: --resume-if-any, not --resume */
    zs_cluster_config cluster; /* the config's cluster block: the servers' transport options */

    zs_proc *procs;      /* [n_procs]: coord, servers 1..S, workers 1..W, then the script's */
    struct pollfd *pfds; /* [n_procs], rebuilt each turn */
    int *pfd_proc;       /* [n_procs]: the proc of each pfds entry */
    char *leaving;       /* [n_procs]: the script sent it SIGKILL or SIGTERM */
    int n_procs;         /* every child that can exist: 1 + S + W + the script's starts */
    int n_initial;       /* 1 + S + W: started at once */
    int started;         /* procs[0 .. started) were spawned */
    long server_threads, worker_threads;
    char endpoint[128];  /* the coordinator's control endpoint */
    int failed;          /* index of the child whose failure stops the job, or -1 */
    char failure[8192];  /* or what went wrong in the launcher itself ("" if nothing) */
    int stopping;        /* SIGTERM went out */
    double stop_at;      /* when it went out */
    int killed;          /* SIGKILL went out */
    double ending_at;    /* when the job started to end (0: not yet) */
    char ending_why[96]; /* who exited first: "coord exited" */

    long done_step;        /* the last step the coordinator reported finished */
    int servers_lost;      /* servers that died while the coordinator ran */
    int replacements;      /* servers started in place of lost ones */
    long max_replacements; /* --replacements: at most this many over the run (-1: S) */
    char *replace;         /* [n_procs]: a server slot whose replacement waits for its output's
                              end (the lost one's last lines go to its own log first) */
    int *generation;       /* [n_procs]: replacements started in a server slot */
    double coord_exit_at;  /* when the coordinator was collected (0: not yet) */
    int workers_ending;    /* elastic end: SIGTERM went to the workers left */
    double workers_end_at; /* when it went out */
    int workers_killed;    /* and SIGKILL, STOP_GRACE_S later */

    script_line *script; /* [n_script] */
    int n_script;
    int next_line;   /* the next line to fire */
    double fired_at; /* when the previous line fired (or the workers started) */
} launch;

static volatile sig_atomic_t got_signal, n_signals;

static void on_signal(int sig)
{
    got_signal = sig;
    n_signals++;
}

static void catch_signals(void)
{
    struct sigaction sa = {.sa_handler = on_signal}; /* no SA_RESTART: poll() wakes up */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

/* A child's command line, built in one buffer. */
typedef struct {
    char *v[24];
    int n;
    int overflow;
    size_t used;
    char buf[5 * 4096];
} arglist;

static void arg(arglist *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void arg(arglist *a, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t room = sizeof a->buf - a->used;
    int len = vsnprintf(a->buf + a->used, room, fmt, ap);
    va_end(ap);
    if (len < 0 || (size_t)len >= room || a->n + 1 >= (int)(sizeof a->v / sizeof a->v[0])) {
        a->overflow = 1;
        return;
    }
    a->v[a->n++] = a->buf + a->used;
    a->v[a->n] = NULL;
    a->used += (size_t)len + 1;
}

/* The length of the "2026-12-02T12:00:00.123Z zshard[1234] " that starts a log line, or 0. */
static int log_prefix_len(const char *line)
{
    int n = 0;
    sscanf(line, "%*4d-%*2d-%*2dT%*2d:%*2d:%*2d.%*3dZ zshard[%*d] %n", &n);
    return n;
}

/* Writes OUT/metrics-targets.json, Prometheus's file_sd_configs format, from the addresses the
 * children said they serve metrics at: into a temporary file renamed over the old one, so
 * that Prometheus, which watches the file, never reads half of it. */
static void write_metrics_targets(const launch *L)
{
    char path[4300], tmp[4400];
    snprintf(path, sizeof path, "%s/metrics-targets.json", L->out);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        fprintf(stderr, "zshard launch: cannot write %s: %s\n", tmp, strerror(errno));
        return;
    }
    fputs("[", f);
    int n = 0;
    for (int i = 0; i < L->n_procs; i++) {
        if (!L->metrics_at[i][0])
            continue;
        const char *role = i == 0 ? "coord" : i <= L->servers ? "server" : "worker";
        char proc[32];
        if (i == 0)
            snprintf(proc, sizeof proc, "coord");
        else
            snprintf(proc, sizeof proc, "%s-%d", role, i <= L->servers ? i : i - (int)L->servers);
        fprintf(f,
                "%s\n  {\"targets\": [\"%s\"], \"labels\": {\"zshard_role\": \"%s\", "
                "\"zshard_process\": \"%s\"}}",
                n++ ? "," : "", L->metrics_at[i], role, proc);
    }
    fputs("\n]\n", f);
    if (fclose(f) != 0 || rename(tmp, path) != 0)
        fprintf(stderr, "zshard launch: cannot write %s: %s\n", path, strerror(errno));
}

/* Shows one line of a child on our stderr. */
static void on_line(zs_proc *p, const char *line, void *user)
{
    launch *L = user;
    /* "metrics: http://HOST:PORT/metrics" (zs_cli_metrics_start): where that child serves. */
    char at[300];
    int idx = (int)(p - L->procs);
    if (L->metrics_host && idx >= 0 && idx < L->n_procs &&
        sscanf(line, "metrics: http://%299[^/ ]/metrics", at) == 1) {
        snprintf(L->metrics_at[idx], sizeof L->metrics_at[idx], "%s", at);
        write_metrics_targets(L);
    }
    if (p == &L->procs[0] && strncmp(line, "step ", 5) == 0) {
        /* "step     7/12 | loss ...": step 7 is finished, step 8 begins. */
        long step, total;
        if (sscanf(line, "step %ld/%ld", &step, &total) == 2 && step > L->done_step)
            L->done_step = step;
        fprintf(stderr, "%s\n", line);
        return;
    }
    /* "2026-12-02T12:00:00.123Z zshard[1234] INFO text" is shown as "INFO text", and only
     * from WARN up unless --log-level asked for more; the log file has every line. */
    int skip = log_prefix_len(line);
    if (skip && !L->log_level &&
        (strncmp(line + skip, "INFO ", 5) == 0 || strncmp(line + skip, "DEBUG ", 6) == 0))
        return;
    fprintf(stderr, "[%s] %s\n", p->name, line + skip);
}

static void log_path(const launch *L, const zs_proc *p, char *buf, size_t n)
{
    char file[32];
    snprintf(file, sizeof file, "%s", p->name);
    for (char *c = file; *c; c++)
        if (*c == ' ')
            *c = '-';
    snprintf(buf, n, "%s/logs/%s.log", L->out, file);
}

/* Spawns procs[i] (which must not be running) with the arguments a. */
static int spawn_at(launch *L, int i, arglist *a)
{
    zs_proc *p = &L->procs[i];
    if (a->overflow) {
        snprintf(L->failure, sizeof L->failure, "cannot start %s: its arguments are too long",
                 p->name);
        return -1;
    }
    char path[4200];
    log_path(L, p, path, sizeof path);
    int r = zs_proc_spawn(p, a->v, path);
    if (r < 0) {
        snprintf(L->failure, sizeof L->failure, "cannot start %s (log %s): %s", p->name, path,
                 strerror(-r));
        return -1;
    }
    return 0;
}

/* Spawns procs[i], the next one in order. */
static int spawn(launch *L, int i, arglist *a)
{
    if (spawn_at(L, i, a) != 0)
        return -1;
    L->started = i + 1;
    return 0;
}

/* What every child gets: the log level, and the job secret (or --insecure). */
static void role_args(const launch *L, arglist *a)
{
    if (L->log_level) {
        arg(a, "--log-level");
        arg(a, "%s", L->log_level);
    }
    if (L->secret.insecure) {
        arg(a, "--insecure");
    } else {
        arg(a, "--secret");
        arg(a, "%s", L->secret.path);
    }
}

/* The secret of the job: --secret FILE or $ZSHARD_SECRET_FILE, else DIR/secret (made unless it
 * exists: a resumed run in the same directory keeps its secret), or none with --insecure; then
 * resolved as every role resolves it (zs_cli_secret), so that a bad file is one message here,
 * not one per child.  Returns 0, or 2 after printing why. */
static int job_secret(launch *L, const zs_cli_secret_args *sa, char *made, size_t n)
{
    const char *env = getenv(ZS_SECRET_ENV), *given = sa->path;
    if (!given && !sa->insecure && !(env && *env)) {
        snprintf(made, n, "%s/secret", L->out);
        struct stat st;
        if (lstat(made, &st) != 0 && zs_secret_generate(made) != ZS_OK) {
            fprintf(stderr, "zshard launch: %s\n", zs_last_error());
            return 2;
        }
        given = made;
    }
    if (zs_cli_secret("launch", given, sa->insecure, &L->secret))
        return 2;
    zs_secret_wipe(&L->secret); /* the children read the file; the launcher needs its name */
    return 0;
}

static int start_coord(launch *L)
{
    arglist a = {.n = 0};
    arg(&a, "zshard");
    arg(&a, "coord");
    arg(&a, "--listen");
    arg(&a, "tcp://%s:*", L->bind);
    arg(&a, "--config");
    arg(&a, "%s", L->config);
    arg(&a, "--servers");
    arg(&a, "%ld", L->servers);
    arg(&a, "--data");
    arg(&a, "%s", L->data);
    arg(&a, "--steps");
    arg(&a, "%ld", L->steps);
    arg(&a, "--out");
    arg(&a, "%s", L->out);
    if (L->resume) {
        arg(&a, L->resume_if_any ? "--resume-if-any" : "--resume");
        arg(&a, "%s", L->resume);
    }
    if (L->metrics_host) {
        arg(&a, "--metrics");
        arg(&a, "%s:%ld", L->metrics_host, L->metrics_port);
    }
    role_args(L, &a);
    return spawn(L, 0, &a);
}

/* Lists "name (pid N)" for procs[from .. to), at most a few of them. */
static void list_pids(const launch *L, int from, int to, char *buf, size_t n)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = from; i < to && used < n; i++) {
        if (i - from == 6 && to - from > 8) {
            snprintf(buf + used, n - used, ", ... %s (pid %d)", L->procs[to - 1].name,
                     (int)L->procs[to - 1].pid);
            return;
        }
        used += (size_t)snprintf(buf + used, n - used, "%s%s (pid %d)", i > from ? ", " : "",
                                 L->procs[i].name, (int)L->procs[i].pid);
    }
}

/* Starts procs[L->started] as a server or a worker (by its index).  Returns 0 or -1 (with
 * L->failure set). */
static void server_args(const launch *L, int slot, arglist *a)
{
    arg(a, "server");
    if (L->metrics_host) {
        arg(a, "--metrics");
        arg(a, "%s:%ld", L->metrics_host, L->metrics_port ? L->metrics_port + slot : 0);
    }
    arg(a, "--coord");
    arg(a, "%s", L->endpoint);
    arg(a, "--listen");
    arg(a, "%s:0", L->bind);
    arg(a, "--threads");
    arg(a, "%ld", L->server_threads);
    /* cluster.transport and cluster.rdma: a server must know them before it registers. */
    arg(a, "--transport");
    arg(a, "%s", zs_transport_kind_name(L->cluster.transport));
    if (L->cluster.rdma_device[0]) {
        arg(a, "--rdma-device");
        arg(a, "%s", L->cluster.rdma_device);
    }
    if (L->cluster.rdma_port != 1) {
        arg(a, "--rdma-port");
        arg(a, "%d", L->cluster.rdma_port);
    }
    if (L->cluster.rdma_gid_index >= 0) {
        arg(a, "--rdma-gid-index");
        arg(a, "%d", L->cluster.rdma_gid_index);
    }
}

static int start_next(launch *L)
{
    int i = L->started;
    arglist a = {.n = 0};
    arg(&a, "zshard");
    if (i <= L->servers) {
        server_args(L, i, &a);
    } else {
        arg(&a, "worker");
        arg(&a, "--coord");
        arg(&a, "%s", L->endpoint);
        arg(&a, "--threads");
        arg(&a, "%ld", L->worker_threads);
        if (L->device) {
            arg(&a, "--device");
            arg(&a, "%s", L->device);
        }
        if (L->gpudirect) {
            arg(&a, "--gpudirect");
            arg(&a, "%s", L->gpudirect);
        }
        if (L->metrics_host) {
            arg(&a, "--metrics");
            arg(&a, "%s:%ld", L->metrics_host, L->metrics_port ? L->metrics_port + i : 0);
        }
    }
    role_args(L, &a);
    return spawn(L, i, &a);
}

/* The coordinator listens on port: start the servers and the workers. */
static int start_rest(launch *L, int port, double now)
{
    snprintf(L->endpoint, sizeof L->endpoint, "tcp://%s:%d", L->bind, port);
    fprintf(stderr, "zshard launch: coord (pid %d) listening on %s\n", (int)L->procs[0].pid,
            L->endpoint);
    long cpus = zs_cli_cpus();
    L->server_threads = cpus / L->servers > 0 ? cpus / L->servers : 1;
    /* Workers that a script starts later get as many as the first ones. */
    L->worker_threads = L->threads > 0                            ? L->threads
                        : L->workers > 0 && cpus / L->workers > 0 ? cpus / L->workers
                        : cpus > 0                                ? cpus
                                                                  : 1;
    while (L->started < L->n_initial)
        if (start_next(L) != 0)
            return -1;
    char list[1024];
    list_pids(L, 1, L->n_initial, list, sizeof list);
    fprintf(stderr, "zshard launch: started %s; logs in %s/logs/\n", list, L->out);
    if (L->elastic)
        fprintf(stderr,
                "zshard launch: elastic: a worker that leaves or dies does not stop the "
                "job%s%s\n",
                L->script_path ? "; script " : "", L->script_path ? L->script_path : "");
    if (L->workers == 0 && L->n_procs == L->n_initial)
        fprintf(stderr,
                "zshard launch: no workers started; attach them with: zshard worker "
                "--coord %s %s%s\n",
                L->endpoint, L->secret.insecure ? "--insecure" : "--secret ",
                L->secret.insecure ? "" : L->secret.path);
    L->fired_at = now;
    return 0;
}

static int is_worker(const launch *L, int i)
{
    return i > L->servers;
}

/* "worker 3" is procs[S + 3]. */
static int worker_number(const launch *L, int i)
{
    return i - (int)L->servers;
}

static int running_workers(const launch *L)
{
    int n = 0;
    for (int i = 1 + (int)L->servers; i < L->started; i++)
        n += L->procs[i].running;
    return n;
}

/* SIGTERM, then SIGCONT: a stopped process acts on SIGTERM only once it runs again. */
static void terminate(zs_proc *p)
{
    zs_proc_kill(p, SIGTERM);
    zs_proc_kill(p, SIGCONT);
}

static void stop_all(launch *L, double now)
{
    int alive = 0;
    for (int i = 0; i < L->started; i++)
        alive += L->procs[i].running;
    if (alive)
        fprintf(stderr, "zshard launch: stopping %d process%s (SIGTERM, SIGKILL after %.0f s)\n",
                alive, alive == 1 ? "" : "es", STOP_GRACE_S);
    for (int i = 0; i < L->started; i++)
        terminate(&L->procs[i]);
    L->stopping = 1;
    L->stop_at = now;
}

/* SIGKILL to the children from procs[from] on that are still running. */
static void kill_from(launch *L, int from)
{
    for (int i = from; i < L->started; i++) {
        if (!L->procs[i].running)
            continue;
        fprintf(stderr, "zshard launch: %s (pid %d) is still running; sending SIGKILL\n",
                L->procs[i].name, (int)L->procs[i].pid);
        zs_proc_kill(&L->procs[i], SIGKILL);
    }
}

static void kill_all(launch *L)
{
    kill_from(L, 0);
    L->killed = 1;
}

/* The coordinator exited WORKER_END_S ago (elastic mode), or finished the job: stop the workers
 * still there (one that registered after the end waits for a job that never comes).  What
 * they do then is not the job's failure. */
static void end_workers(launch *L, double now)
{
    for (int i = 1 + (int)L->servers; i < L->started; i++) {
        zs_proc *p = &L->procs[i];
        if (!p->running)
            continue;
        p->lost = 1;
        fprintf(stderr,
                "zshard launch: %s (pid %d) is still running %.0f s after the coordinator "
                "exited; stopping it (SIGTERM, SIGKILL after %.0f s)\n",
                p->name, (int)p->pid, WORKER_END_S, STOP_GRACE_S);
        terminate(p);
    }
    L->workers_ending = 1;
    L->workers_end_at = now;
}

/* Elastic mode: a worker left or died while the job runs. */
static void worker_event(launch *L, int i)
{
    const zs_proc *p = &L->procs[i];
    char how[128];
    zs_proc_describe_exit(p, how, sizeof how);
    /* Why it exited, if it said so, was shown already: its "zshard worker: ..." line. */
    fprintf(stderr,
            "zshard launch: %s (pid %d) %s; the job goes on: the coordinator gives its "
            "chunks to the others\n",
            p->name, (int)p->pid, how);
    if (running_workers(L) > 0)
        return;
    int starts_left = 0;
    for (int k = L->next_line; k < L->n_script; k++)
        starts_left |= L->script[k].kind == ACT_START;
    if (starts_left)
        fprintf(stderr, "zshard launch: no worker is running; the job waits for the script to "
                        "start one\n");
    else
        fprintf(stderr,
                "zshard launch: no worker is running; the job waits for one: zshard "
                "worker --coord %s %s%s\n",
                L->endpoint, L->secret.insecure ? "--insecure" : "--secret ",
                L->secret.insecure ? "" : L->secret.path);
}

/* procs[i] exited just now. */
static void on_exit_of(launch *L, int i, double now)
{
    zs_proc *p = &L->procs[i];
    if (i == 0)
        L->coord_exit_at = now;
    if (L->stopping)
        return; /* we asked for it; the cause was recorded already */
    if (p->lost && is_worker(L, i))
        return; /* end_workers stopped it after the job ended (say, one still registering when
                   a short job finished): how it exits is not the job's failure */
    if (L->elastic && is_worker(L, i)) {
        /* Once the last step is reported or the coordinator is gone, workers leave because
         * the job is over: nothing to tell. */
        if (L->done_step < L->steps && L->coord_exit_at == 0)
            worker_event(L, i);
        return;
    }
    if (i >= 1 && i <= L->servers && !zs_proc_succeeded(p) && L->coord_exit_at == 0 &&
        L->endpoint[0] != '\0') {
        /* A partition server lost while the coordinator runs is the coordinator's to recover
         * from (every server goes back to the newest checkpoint, the steps since run again on
         * the servers left); if it cannot, it exits and that stops the job. */
        char how[128];
        zs_proc_describe_exit(p, how, sizeof how);
        long most = L->max_replacements < 0 ? L->servers : L->max_replacements;
        int again = L->replacements < most && L->done_step < L->steps;
        fprintf(stderr,
                "zshard launch: %s (pid %d) %s; a lost server is the coordinator's to recover "
                "from (or it ends the job)%s\n",
                p->name, (int)p->pid, how,
                again ? "; a replacement server starts, to wait as a spare" : "");
        L->servers_lost++;
        p->lost = 1;
        if (again) {
            L->replacements++;
            L->replace[i] = 1;
        }
        return;
    }
    if (!zs_proc_succeeded(p) || (i == 0 && L->endpoint[0] == '\0')) {
        char how[128];
        zs_proc_describe_exit(p, how, sizeof how);
        fprintf(stderr, "zshard launch: %s (pid %d) %s%s\n", p->name, (int)p->pid, how,
                zs_proc_succeeded(p) ? " before it listened" : "");
        L->failed = i;
        stop_all(L, now);
        return;
    }
    /* A clean exit means the job is ending, except for a worker while others remain: a
     * worker may leave a running job. */
    if (L->ending_at == 0 && (i <= L->servers || running_workers(L) == 0)) {
        L->ending_at = now;
        snprintf(L->ending_why, sizeof L->ending_why, "%s exited",
                 i <= L->servers ? p->name : "the last worker");
    }
}

/*
 * Starts the replacements due: a new `zshard server` in the slot of a lost one, once the lost
 * one's output has ended.  It registers as a spare, which the coordinator takes into the map at
 * its next recovery from a checkpoint (a failover to a replica keeps the servers it has).
 */
static void start_replacements(launch *L)
{
    for (int i = 1; i <= L->servers && i < L->started; i++) {
        zs_proc *p = &L->procs[i];
        if (!L->replace[i] || p->fd >= 0 || p->running)
            continue;
        L->replace[i] = 0;
        if (L->stopping || L->coord_exit_at > 0 || L->done_step >= L->steps)
            continue;
        char was[32], name[32];
        snprintf(was, sizeof was, "%s", p->name);
        snprintf(name, sizeof name, "server %d.%d", i, ++L->generation[i]);
        zs_proc_close(p);
        zs_proc_init(p, name);
        arglist a = {.n = 0};
        arg(&a, "zshard");
        server_args(L, i, &a);
        role_args(L, &a);
        if (spawn_at(L, i, &a) != 0) {
            /* Not the job's failure: the coordinator goes on with the servers it has. */
            fprintf(stderr, "zshard launch: %s\n", L->failure);
            L->failure[0] = '\0';
            p->lost = 1;
            continue;
        }
        fprintf(stderr, "zshard launch: started %s (pid %d) in place of %s\n", p->name, (int)p->pid,
                was);
    }
}

/* ---- The elastic script ---- */

static const char *const action_names[] = {"start", "kill", "term", "stop", "cont"};
static const char *const action_signames[] = {"start", "SIGKILL", "SIGTERM", "SIGSTOP", "SIGCONT"};
static const int action_signals[] = {0, SIGKILL, SIGTERM, SIGSTOP, SIGCONT};

/* The whole token as a long in [lo, hi]: 0, or -1 if it is not one. */
static int parse_long(const char *tok, long lo, long hi, long *v)
{
    char *end;
    errno = 0;
    long x = strtol(tok, &end, 10);
    if (errno != 0 || end == tok || *end != '\0' || x < lo || x > hi)
        return -1;
    *v = x;
    return 0;
}

static void script_error(const char *path, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void script_error(const char *path, int line, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "zshard launch: %s:%d: ", path, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

/* Checks one line's tokens (tok[0 .. nt), nt <= 5: a fifth means "too many") against the
 * job; *workers counts the workers that exist once the lines above fired.  Returns 0 and
 * fills sl, or -1 after printing why. */
static int parse_script_line(const launch *L, int lineno, char **tok, int nt, long *workers,
                             script_line *sl)
{
    const char *path = L->script_path;
    *sl = (script_line){.line = lineno};
    if (strcmp(tok[0], "step") == 0) {
        if (nt < 2 || parse_long(tok[1], 1, L->steps, &sl->step) != 0) {
            script_error(path, lineno,
                         "step \"%s\": not a step of this job (1 to %ld, from "
                         "--steps)",
                         nt < 2 ? "" : tok[1], L->steps);
            return -1;
        }
    } else if (strcmp(tok[0], "after") == 0) {
        if (nt < 2 || parse_long(tok[1], 0, 86400000, &sl->after_ms) != 0) {
            script_error(path, lineno,
                         "after \"%s\": not a number of milliseconds (0 to "
                         "86400000)",
                         nt < 2 ? "" : tok[1]);
            return -1;
        }
    } else {
        script_error(path, lineno,
                     "\"%s\": a line is \"step K ACTION [TARGET]\" or \"after MS "
                     "ACTION [TARGET]\"",
                     tok[0]);
        return -1;
    }
    int k = 0;
    while (nt >= 3 && k < 5 && strcmp(tok[2], action_names[k]) != 0)
        k++;
    if (nt < 3 || k == 5) {
        script_error(path, lineno, "%s%s%s: the action is start, kill, term, stop or cont",
                     nt < 3 ? "no action after \"" : "\"", nt < 3 ? tok[0] : tok[2],
                     nt < 3 ? " ...\"" : "\"");
        return -1;
    }
    sl->kind = (action_kind)k;
    if (nt > 4) {
        script_error(path, lineno, "unexpected \"%s\" after the target", tok[4]);
        return -1;
    }
    const char *target = nt == 4 ? tok[3] : NULL;
    long v = 1;
    if (sl->kind == ACT_START) {
        if (target && parse_long(target, 1, MAX_WORKERS, &v) != 0) {
            script_error(path, lineno, "start \"%s\": not a number of workers (1 to %d)", target,
                         MAX_WORKERS);
            return -1;
        }
        if (*workers + v > MAX_WORKERS) {
            script_error(path, lineno,
                         "start %ld: more than %d workers in all (%ld before "
                         "this line)",
                         v, MAX_WORKERS, *workers);
            return -1;
        }
        *workers += v;
        sl->target = (int)v;
    } else if (!target || strcmp(target, "any") == 0) {
        sl->target = TARGET_ANY;
    } else if (strcmp(target, "all") == 0) {
        sl->target = TARGET_ALL;
    } else if (parse_long(target, 1, MAX_WORKERS, &v) != 0) {
        script_error(path, lineno, "%s \"%s\": the target is a worker number, any or all", tok[2],
                     target);
        return -1;
    } else if (v > *workers) {
        script_error(path, lineno,
                     "%s %ld: there is no worker %ld when this line fires (%ld "
                     "by then: %ld from --workers, %ld started by the lines above)",
                     tok[2], v, v, *workers, L->workers, *workers - L->workers);
        return -1;
    } else {
        sl->target = (int)v;
    }
    return 0;
}

/* Reads and checks the whole script into L->script; *starts gets how many workers it starts.
 * Returns 0, or -1 after printing why (nothing is left allocated then). */
static int load_script(launch *L, long *starts)
{
    FILE *f = fopen(L->script_path, "re");
    if (!f) {
        fprintf(stderr, "zshard launch: --elastic-script %s: %s\n", L->script_path,
                strerror(errno));
        return -1;
    }
    char *buf = NULL;
    size_t cap = 0;
    int lineno = 0, res = 0, room = 0;
    long workers = L->workers;
    while (res == 0 && getline(&buf, &cap, f) >= 0) {
        lineno++;
        char *hash = strchr(buf, '#');
        if (hash)
            *hash = '\0';
        char *tok[5], *save = NULL;
        int nt = 0;
        for (char *t = strtok_r(buf, " \t\r\n\v\f", &save); t && nt < 5;
             t = strtok_r(NULL, " \t\r\n\v\f", &save))
            tok[nt++] = t;
        if (nt == 0)
            continue;
        if (L->n_script == room) {
            room = room ? 2 * room : 16;
            script_line *v = realloc(L->script, (size_t)room * sizeof *v);
            if (!v) {
                script_error(L->script_path, lineno, "out of memory for %d lines", room);
                res = -1;
                break;
            }
            L->script = v;
        }
        res = parse_script_line(L, lineno, tok, nt, &workers, &L->script[L->n_script]);
        if (res == 0)
            L->n_script++;
    }
    if (res == 0 && ferror(f)) {
        fprintf(stderr, "zshard launch: --elastic-script %s: read error after line %d\n",
                L->script_path, lineno);
        res = -1;
    }
    free(buf);
    fclose(f);
    if (res != 0) {
        free(L->script);
        L->script = NULL;
        L->n_script = 0;
        return -1;
    }
    *starts = workers - L->workers;
    return 0;
}

/* Carries out one line.  Returns 0, or -1 if a worker could not be started (L->failure). */
static int fire(launch *L, const script_line *sl)
{
    char when[48];
    if (sl->step)
        snprintf(when, sizeof when, "step %ld", sl->step);
    else
        snprintf(when, sizeof when, "after %ld ms", sl->after_ms);
    if (sl->kind == ACT_START) {
        for (int k = 0; k < sl->target; k++) {
            if (start_next(L) != 0)
                return -1;
            const zs_proc *p = &L->procs[L->started - 1];
            fprintf(stderr, "zshard launch: %s: start %s (pid %d)\n", when, p->name, (int)p->pid);
        }
        return 0;
    }
    int sig = action_signals[sl->kind], hit = 0;
    for (int i = 1 + (int)L->servers; i < L->started; i++) {
        zs_proc *p = &L->procs[i];
        if (sl->target > 0 && worker_number(L, i) != sl->target)
            continue;
        if (sl->target == TARGET_ANY && (!p->running || L->leaving[i]))
            continue;
        if (!p->running) {
            if (sl->target > 0) {
                char how[128];
                zs_proc_describe_exit(p, how, sizeof how);
                fprintf(stderr, "zshard launch: %s: %s %s: not sent, it %s already\n", when,
                        action_signames[sl->kind], p->name, how);
                hit = 1;
            }
            continue;
        }
        zs_proc_kill(p, sig);
        if (sig == SIGKILL || sig == SIGTERM)
            L->leaving[i] = 1;
        fprintf(stderr, "zshard launch: %s: %s %s (pid %d)\n", when, action_signames[sl->kind],
                p->name, (int)p->pid);
        hit = 1;
        if (sl->target != TARGET_ALL)
            break;
    }
    if (!hit)
        fprintf(stderr, "zshard launch: %s: %s %s: no worker is running; nothing sent\n", when,
                action_names[sl->kind], sl->target == TARGET_ALL ? "all" : "any");
    return 0;
}

/* Fires the lines that are due, in order, while the job runs. */
static void run_script(launch *L, double now)
{
    while (L->next_line < L->n_script && L->endpoint[0] && !L->stopping && L->coord_exit_at == 0 &&
           L->done_step < L->steps) {
        const script_line *sl = &L->script[L->next_line];
        if (sl->step ? L->done_step < sl->step - 1 : now < L->fired_at + (double)sl->after_ms / 1e3)
            return;
        L->next_line++;
        L->fired_at = now;
        if (fire(L, sl) != 0) {
            fprintf(stderr, "zshard launch: %s\n", L->failure);
            stop_all(L, now);
        }
    }
}

/* How long pump() may wait: 100 ms, or less when an "after" line is due sooner. */
static int wait_ms(const launch *L, double now)
{
    if (L->next_line >= L->n_script || !L->endpoint[0] || L->script[L->next_line].step)
        return 100;
    double due = L->fired_at + (double)L->script[L->next_line].after_ms / 1e3 - now;
    return due <= 0 ? 0 : due >= 0.1 ? 100 : (int)(due * 1e3) + 1;
}

/* Waits up to timeout_ms for output and hands out the lines that came. */
static void pump(launch *L, int timeout_ms)
{
    int n = 0;
    for (int i = 0; i < L->started; i++) {
        if (L->procs[i].fd < 0)
            continue;
        L->pfds[n] = (struct pollfd){.fd = L->procs[i].fd, .events = POLLIN};
        L->pfd_proc[n++] = i;
    }
    if (poll(L->pfds, (nfds_t)n, timeout_ms) <= 0)
        return; /* timeout, or a signal: the caller looks at both */
    for (int k = 0; k < n; k++)
        if (L->pfds[k].revents)
            zs_proc_read(&L->procs[L->pfd_proc[k]], on_line, L);
}

/* Runs the job to its end: all children collected. */
static void run(launch *L)
{
    double all_reaped_at = 0;
    if (start_coord(L) != 0)
        return;
    for (;;) {
        pump(L, wait_ms(L, zs_now_s()));
        double now = zs_now_s();
        /* Signals first: Ctrl-C in a terminal reaches the children too, and their exits are
         * then its consequence, not the cause. */
        if (got_signal && !L->stopping) {
            snprintf(L->failure, sizeof L->failure, "interrupted by %s",
                     got_signal == SIGINT    ? "SIGINT"
                     : got_signal == SIGTERM ? "SIGTERM"
                                             : "SIGHUP");
            fprintf(stderr, "zshard launch: %s\n", L->failure);
            stop_all(L, now);
        }
        if (n_signals >= 2 && !L->killed)
            kill_all(L);
        for (int i = 0; i < L->started; i++)
            if (zs_proc_reap(&L->procs[i]))
                on_exit_of(L, i, now);
        /* No deadline for the coordinator to listen: it may check a large data set first. */
        /* With --metrics it listens twice: the control port is the one that is not the
         * metrics port, which it names (on_line) before it binds the control port. */
        int metrics_port = 0;
        const char *mcolon = L->metrics_host ? strrchr(L->metrics_at[0], ':') : NULL;
        if (mcolon)
            metrics_port = atoi(mcolon + 1);
        if (!L->stopping && L->started == 1 && L->procs[0].running &&
            (!L->metrics_host || metrics_port > 0)) {
            int port = zs_proc_listen_port(L->procs[0].pid, metrics_port);
            if (port < 0 && port != -ENOENT) /* ENOENT: it exited; the next reap sees it */
                snprintf(L->failure, sizeof L->failure,
                         "cannot find the coordinator's port in /proc/%d: %s", (int)L->procs[0].pid,
                         strerror(-port));
            if ((port < 0 && port != -ENOENT) || (port > 0 && start_rest(L, port, now) != 0)) {
                fprintf(stderr, "zshard launch: %s\n", L->failure);
                stop_all(L, now);
            }
        }
        run_script(L, now);
        start_replacements(L);
        /* A straggler once the job is ending is a failure; in elastic mode workers are not
         * waited for (they are stopped below). */
        int coord_done = L->coord_exit_at > 0 && zs_proc_succeeded(&L->procs[0]);
        int late = 0;
        while (late < L->started &&
               (!L->procs[late].running || ((L->elastic || coord_done) && is_worker(L, late))))
            late++;
        if (!L->stopping && L->ending_at > 0 && now - L->ending_at > END_GRACE_S &&
            late < L->started) {
            snprintf(L->failure, sizeof L->failure, "%s (pid %d) was still running %.0f s after %s",
                     L->procs[late].name, (int)L->procs[late].pid, END_GRACE_S, L->ending_why);
            fprintf(stderr, "zshard launch: %s\n", L->failure);
            stop_all(L, now);
        }
        if ((L->elastic || coord_done) && !L->stopping && !L->workers_ending &&
            L->coord_exit_at > 0 && now - L->coord_exit_at > WORKER_END_S)
            end_workers(L, now);
        if (L->workers_ending && !L->workers_killed && now - L->workers_end_at > STOP_GRACE_S) {
            kill_from(L, 1 + (int)L->servers);
            L->workers_killed = 1;
        }
        if (L->stopping && !L->killed && now - L->stop_at > STOP_GRACE_S)
            kill_all(L);
        int running = 0, open = 0;
        for (int i = 0; i < L->started; i++) {
            running += L->procs[i].running;
            open += L->procs[i].fd >= 0;
        }
        if (running)
            continue;
        if (all_reaped_at == 0)
            all_reaped_at = now;
        if (!open || now - all_reaped_at > DRAIN_S)
            break;
    }
    if (L->next_line < L->n_script)
        fprintf(stderr, "zshard launch: the job ended before %s:%d%s fired\n", L->script_path,
                L->script[L->next_line].line,
                L->next_line + 1 < L->n_script ? " and the lines after it" : "");
}

/* Prints why the job failed: the failed child and its last lines, or the launcher's reason. */
static void report_failure(const launch *L)
{
    if (L->failed < 0) {
        fprintf(stderr, "zshard launch: %s%s\n",
                L->failure[0] ? L->failure : "the job did not finish",
                L->started > 0 ? "; every process it started has exited" : "");
        return;
    }
    const zs_proc *p = &L->procs[L->failed];
    char how[128];
    if (p->running)
        snprintf(how, sizeof how, "did not exit");
    else
        zs_proc_describe_exit(p, how, sizeof how);
    const char *last = zs_proc_tail(p, 0);
    if (!p->running && WIFEXITED(p->status) && last && strncmp(last, "zshard ", 7) == 0) {
        fprintf(stderr, "zshard launch: %s (pid %d) %s: %s\n", p->name, (int)p->pid, how, last);
    } else if (!last) {
        fprintf(stderr, "zshard launch: %s (pid %d) %s; it printed nothing\n", p->name, (int)p->pid,
                how);
    } else {
        fprintf(stderr, "zshard launch: %s (pid %d) %s; its last lines:\n", p->name, (int)p->pid,
                how);
        int n = 0;
        while (n < 4 && zs_proc_tail(p, n))
            n++;
        for (int k = n - 1; k >= 0; k--) {
            const char *line = zs_proc_tail(p, k);
            fprintf(stderr, "  %s\n", line + log_prefix_len(line));
        }
    }
    char path[4200];
    log_path(L, p, path, sizeof path);
    fprintf(stderr, "zshard launch: its whole log: %s\n", path);
}

/* The value after "key": in one line of metrics.jsonl, or NAN. */
static double metric(const char *line, const char *key)
{
    char pat[40];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *at = strstr(line, pat);
    return at ? strtod(at + strlen(pat), NULL) : __builtin_nan("");
}

static void report_success(const launch *L)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", L->out);
    FILE *f = fopen(path, "re");
    long steps = 0;
    double loss = __builtin_nan(""), tokens = 0, seconds = 0;
    char *line = NULL;
    size_t cap = 0;
    while (f && getline(&line, &cap, f) > 0) {
        double tps = metric(line, "tokens_per_sec"), ms = metric(line, "step_ms");
        steps++;
        loss = metric(line, "loss");
        if (tps == tps && ms == ms) {
            tokens += tps * ms / 1e3;
            seconds += ms / 1e3;
        }
    }
    free(line);
    if (f)
        fclose(f);
    int workers = L->started - 1 - (int)L->servers;
    fprintf(stderr,
            "zshard launch: done: %ld steps, final loss %.4f, %.0f tok/s on average "
            "(%ld server%s, %d worker%s%s)\n",
            steps, loss, seconds > 0 ? tokens / seconds : 0.0, L->servers,
            L->servers == 1 ? "" : "s", workers, workers == 1 ? "" : "s",
            L->elastic ? " started over the run" : "");
    if (L->servers_lost)
        fprintf(stderr,
                "zshard launch: %d server%s lost on the way; the coordinator recovered each "
                "time, from a replica or the newest checkpoint (same bits as a run without a "
                "loss)\n",
                L->servers_lost, L->servers_lost == 1 ? " was" : "s were");
    fprintf(stderr,
            "zshard launch: model in %s/model.safetensors and %s/config.json, metrics in "
            "%s, logs in %s/logs/\n",
            L->out, L->out, path, L->out);
}

static int make_dir(const char *path)
{
    if (mkdir(path, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "zshard launch: %s: %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}

int zs_cmd_launch(int argc, char **argv)
{
    static const struct option opts[] = {{"config", required_argument, NULL, 'c'},
                                         {"data", required_argument, NULL, 'd'},
                                         {"steps", required_argument, NULL, 's'},
                                         {"servers", required_argument, NULL, 'S'},
                                         {"workers", required_argument, NULL, 'W'},
                                         {"out", required_argument, NULL, 'o'},
                                         {"threads", required_argument, NULL, 't'},
                                         {"device", required_argument, NULL, 'D'},
                                         {"gpudirect", required_argument, NULL, 'G'},
                                         {"bind", required_argument, NULL, 'b'},
                                         {"log-level", required_argument, NULL, 'L'},
                                         {"help", no_argument, NULL, 'h'},
                                         {"elastic-script", required_argument, NULL, 'e'},
                                         {"resume", required_argument, NULL, 'r'},
                                         {"resume-if-any", required_argument, NULL, 'A'},
                                         {"replacements", required_argument, NULL, 'R'},
                                         {"metrics", required_argument, NULL, 'M'},
                                         ZS_CLI_SECRET_OPTIONS,
                                         {NULL, 0, NULL, 0}};
    launch L = {.steps = -1,
                .servers = -1,
                .workers = -1,
                .max_replacements = -1,
                .bind = "127.0.0.1",
                .failed = -1};
    zs_cli_secret_args sa = {0};
    char secret_made[4200];
    char metrics_host[256];
    int c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        if (zs_cli_secret_opt(c, &sa))
            continue;
        switch (c) {
        case 'c':
            L.config = optarg;
            break;
        case 'd':
            L.data = optarg;
            break;
        case 'o':
            L.out = optarg;
            break;
        case 'b':
            L.bind = optarg;
            break;
        case 'e':
            L.script_path = optarg;
            break;
        case 'r':
        case 'A':
            L.resume = optarg;
            L.resume_if_any = c == 'A';
            break;
        case 'M': {
            /* HOST:PORT; the servers' ports follow the coordinator's, so all must fit. */
            const char *colon = strrchr(optarg, ':');
            size_t hl = colon ? (size_t)(colon - optarg) : 0;
            if (!colon || hl == 0 || hl >= sizeof metrics_host)
                return zs_cli_usage_error("launch", "--metrics: \"%s\" is not HOST:PORT", optarg);
            memcpy(metrics_host, optarg, hl);
            metrics_host[hl] = '\0';
            if ((L.metrics_port = zs_cli_int("launch", "--metrics port", colon + 1, 0, 65535)) < 0)
                return 2;
            L.metrics_host = metrics_host;
            break;
        }
        case 's':
            if ((L.steps = zs_cli_int("launch", "--steps", optarg, 1, 1L << 30)) < 0)
                return 2;
            break;
        case 'S':
            if ((L.servers = zs_cli_int("launch", "--servers", optarg, 1, 1024)) < 0)
                return 2;
            break;
        case 'W':
            if ((L.workers = zs_cli_int("launch", "--workers", optarg, 0, 1024)) < 0)
                return 2;
            break;
        case 'R':
            if ((L.max_replacements = zs_cli_int("launch", "--replacements", optarg, 0, 1024)) < 0)
                return 2;
            break;
        case 't':
            if ((L.threads = zs_cli_int("launch", "--threads", optarg, 1, 1024)) < 0)
                return 2;
            break;
        case 'G': {
            zs_gpudirect g;
            if (zs_gpudirect_parse(optarg, &g) != ZS_OK)
                return zs_cli_usage_error("launch", "--gpudirect: %s", zs_last_error());
            L.gpudirect = optarg;
            break;
        }
        case 'D': {
            zs_device dev;
            if (zs_device_parse(optarg, &dev) != ZS_OK)
                return zs_cli_usage_error("launch", "--device: %s", zs_last_error());
            L.device = optarg;
            break;
        }
        case 'L':
            if (zs_cli_log_level("launch", optarg))
                return 2;
            L.log_level = optarg;
            break;
        case 'h':
            fputs(launch_usage, stdout);
            return 0;
        case ':':
            return zs_cli_usage_error("launch", "%s needs a value", argv[optind - 1]);
        default:
            return zs_cli_usage_error("launch", "unknown option \"%s\"", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return zs_cli_usage_error("launch", "unexpected argument \"%s\"", argv[optind]);
    const char *missing = !L.config       ? "--config"
                          : !L.data       ? "--data"
                          : L.steps < 0   ? "--steps"
                          : L.servers < 0 ? "--servers"
                          : L.workers < 0 ? "--workers"
                          : !L.out        ? "--out"
                                          : NULL;
    if (missing)
        return zs_cli_usage_error("launch", "missing %s", missing);
    /* A server advertises the address it listens on; a wildcard would be advertised as
     * loopback, which workers elsewhere cannot reach. */
    if (!L.bind[0] || strchr(L.bind, ':') || strcmp(L.bind, "*") == 0 ||
        strcmp(L.bind, "0.0.0.0") == 0)
        return zs_cli_usage_error("launch",
                                  "--bind: \"%s\" is not an IPv4 address of this "
                                  "machine (a wildcard cannot be advertised to workers)",
                                  L.bind);

    /* Elastic mode from the config too.  A config that does not load is the coordinator's to
     * report (its own words, and the failure of the first child). */
    zs_config cfg;
    zs_config_defaults(&cfg);
    if (zs_config_load(L.config, &cfg) == ZS_OK && cfg.elasticity.enabled)
        L.elastic = 1;
    L.cluster = cfg.cluster;
    long script_starts = 0;
    if (L.script_path) {
        L.elastic = 1;
        if (load_script(&L, &script_starts) != 0)
            return 2;
    }
    /* Every process but the coordinator takes the next port: servers, workers, the script's. */
    long others = L.servers + L.workers + script_starts;
    if (L.metrics_host && L.metrics_port > 0 && L.metrics_port + others > 65535) {
        free(L.script);
        return zs_cli_usage_error("launch",
                                  "--metrics: port %ld + %ld servers and workers goes beyond 65535",
                                  L.metrics_port, others);
    }

    int rc = 1;
    char logs[4200];
    snprintf(logs, sizeof logs, "%s/logs", L.out);
    if (make_dir(L.out) != 0 || make_dir(logs) != 0)
        goto out_script;
    if (job_secret(&L, &sa, secret_made, sizeof secret_made) != 0) {
        rc = 2;
        goto out_script;
    }
    L.n_initial = 1 + (int)L.servers + (int)L.workers;
    L.n_procs = L.n_initial + (int)script_starts;
    L.procs = calloc((size_t)L.n_procs, sizeof *L.procs);
    L.pfds = calloc((size_t)L.n_procs, sizeof *L.pfds);
    L.pfd_proc = calloc((size_t)L.n_procs, sizeof *L.pfd_proc);
    L.leaving = calloc((size_t)L.n_procs, 1);
    L.replace = calloc((size_t)L.n_procs, 1);
    L.generation = calloc((size_t)L.n_procs, sizeof *L.generation);
    L.metrics_at = calloc((size_t)L.n_procs, sizeof *L.metrics_at);
    if (!L.procs || !L.pfds || !L.pfd_proc || !L.leaving || !L.replace || !L.generation ||
        !L.metrics_at) {
        fprintf(stderr, "zshard launch: out of memory for %d processes\n", L.n_procs);
        goto out_free;
    }
    for (int i = 0; i < L.n_procs; i++) {
        char name[32];
        if (i == 0)
            snprintf(name, sizeof name, "coord");
        else if (i <= L.servers)
            snprintf(name, sizeof name, "server %d", i);
        else
            snprintf(name, sizeof name, "worker %d", i - (int)L.servers);
        zs_proc_init(&L.procs[i], name);
    }
    catch_signals();
    run(&L);

    /* In elastic mode a worker's exit is never the job's failure, and a server lost while the
     * coordinator ran is never one: the coordinator recovered, or its own exit says why not. */
    int ok = L.failed < 0 && !L.failure[0] && !got_signal && L.started >= L.n_initial;
    for (int i = 0; i < L.started; i++)
        if ((!L.elastic || !is_worker(&L, i)) && !L.procs[i].lost)
            ok &= zs_proc_succeeded(&L.procs[i]);
    if (ok)
        report_success(&L);
    else
        report_failure(&L);
    for (int i = 0; i < L.n_procs; i++)
        zs_proc_close(&L.procs[i]);
    rc = ok ? 0 : got_signal ? 128 + got_signal : 1;
out_free:
    free(L.leaving);
    free(L.replace);
    free(L.generation);
    free(L.metrics_at);
    free(L.procs);
    free(L.pfds);
    free(L.pfd_proc);
out_script:
    free(L.script);
    return rc;
}
