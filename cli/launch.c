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

/* From SIGTERM to SIGKILL when stopping the children. */
#define STOP_GRACE_S 5.0
/* Once the job is ending (the coordinator or a server exited 0, or all workers did), the
 * others must have exited this much later; a straggler is a failure. */
#define END_GRACE_S 10.0
/* Pipes still open this long after every child was collected are abandoned. */
#define DRAIN_S 1.0

static const char launch_usage[] =
    "usage: zshard launch --config CFG.json --data PATH --steps N --servers S --workers W\n"
    "                     --out DIR [--threads T] [--bind HOST] [--log-level LEVEL]\n"
    "\n"
    "Runs a whole job on this host: the coordinator, S partition servers and W workers, as\n"
    "child processes.  Writes what 'zshard train' writes (DIR/metrics.jsonl,\n"
    "DIR/model.safetensors, DIR/config.json), one progress line per step, and each process's\n"
    "log to DIR/logs/.  If one process fails, or on Ctrl-C, it stops all of them.\n"
    "\n"
    "  --config CFG.json  job configuration\n"
    "  --data PATH        training data\n"
    "  --steps N          optimizer steps\n"
    "  --servers S        partition servers\n"
    "  --workers W        workers (0: attach them yourself with 'zshard worker --coord ...';\n"
    "                     the coordinator's endpoint is printed)\n"
    "  --out DIR          where metrics.jsonl, model.safetensors, config.json and logs/ go\n"
    "  --threads T        kernel threads per worker (default: the CPUs available divided by W)\n"
    "  --bind HOST        address to listen on and advertise (default 127.0.0.1); give this\n"
    "                     host's address to let workers on other hosts attach\n"
    "  --log-level LEVEL  error, warn, info (default) or debug, for every process; without\n"
    "                     it, only their warnings and errors are shown here (the logs have\n"
    "                     everything)\n"
    "  -h, --help         this text\n";

typedef struct {
    const char *config, *data, *out, *bind, *log_level;
    long steps, servers, workers, threads; /* threads: 0 = divide the CPUs */

    zs_proc *procs;      /* [n_procs]: coord, servers 1..S, workers 1..W */
    struct pollfd *pfds; /* [n_procs], rebuilt each turn */
    int *pfd_proc;       /* [n_procs]: the proc of each pfds entry */
    int n_procs;
    int started;         /* procs[0 .. started) were spawned */
    char endpoint[128];  /* the coordinator's control endpoint */
    int failed;          /* index of the child whose failure stops the job, or -1 */
    char failure[8192];  /* or what went wrong in the launcher itself ("" if nothing) */
    int stopping;        /* SIGTERM went out */
    double stop_at;      /* when it went out */
    int killed;          /* SIGKILL went out */
    double ending_at;    /* when the job started to end (0: not yet) */
    char ending_why[96]; /* who exited first: "coord exited" */
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

/* Shows one line of a child on our stderr. */
static void on_line(zs_proc *p, const char *line, void *user)
{
    launch *L = user;
    if (p == &L->procs[0] && strncmp(line, "step ", 5) == 0) {
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

static int spawn(launch *L, int i, arglist *a)
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
    L->started = i + 1;
    return 0;
}

static void log_level_args(const launch *L, arglist *a)
{
    if (L->log_level) {
        arg(a, "--log-level");
        arg(a, "%s", L->log_level);
    }
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
    log_level_args(L, &a);
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

/* The coordinator listens on port: start the servers and the workers. */
static int start_rest(launch *L, int port)
{
    snprintf(L->endpoint, sizeof L->endpoint, "tcp://%s:%d", L->bind, port);
    fprintf(stderr, "zshard launch: coord (pid %d) listening on %s\n", (int)L->procs[0].pid,
            L->endpoint);
    long cpus = zs_cli_cpus();
    long server_threads = cpus / L->servers > 0 ? cpus / L->servers : 1;
    long worker_threads = L->threads > 0                            ? L->threads
                          : L->workers > 0 && cpus / L->workers > 0 ? cpus / L->workers
                                                                    : 1;
    for (int i = 1; i < L->n_procs; i++) {
        arglist a = {.n = 0};
        arg(&a, "zshard");
        if (i <= L->servers) {
            arg(&a, "server");
            arg(&a, "--coord");
            arg(&a, "%s", L->endpoint);
            arg(&a, "--listen");
            arg(&a, "%s:0", L->bind);
            arg(&a, "--threads");
            arg(&a, "%ld", server_threads);
        } else {
            arg(&a, "worker");
            arg(&a, "--coord");
            arg(&a, "%s", L->endpoint);
            arg(&a, "--threads");
            arg(&a, "%ld", worker_threads);
        }
        log_level_args(L, &a);
        if (spawn(L, i, &a) != 0)
            return -1;
    }
    char list[1024];
    list_pids(L, 1, L->n_procs, list, sizeof list);
    fprintf(stderr, "zshard launch: started %s; logs in %s/logs/\n", list, L->out);
    if (L->workers == 0)
        fprintf(stderr, "zshard launch: no workers started; attach them with: zshard worker "
                        "--coord %s\n", L->endpoint);
    return 0;
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
        zs_proc_kill(&L->procs[i], SIGTERM);
    L->stopping = 1;
    L->stop_at = now;
}

static void kill_all(launch *L)
{
    for (int i = 0; i < L->started; i++) {
        if (!L->procs[i].running)
            continue;
        fprintf(stderr, "zshard launch: %s (pid %d) is still running; sending SIGKILL\n",
                L->procs[i].name, (int)L->procs[i].pid);
        zs_proc_kill(&L->procs[i], SIGKILL);
    }
    L->killed = 1;
}

/* procs[i] exited just now. */
static void on_exit_of(launch *L, int i, double now)
{
    zs_proc *p = &L->procs[i];
    if (L->stopping)
        return; /* we asked for it; the cause was recorded already */
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
    int workers_left = 0;
    for (int w = 1 + (int)L->servers; w < L->started; w++)
        workers_left += L->procs[w].running;
    if (L->ending_at == 0 && (i <= L->servers || workers_left == 0)) {
        L->ending_at = now;
        snprintf(L->ending_why, sizeof L->ending_why, "%s exited",
                 i <= L->servers ? p->name : "the last worker");
    }
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
        pump(L, 100);
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
        if (!L->stopping && L->started == 1 && L->procs[0].running) {
            int port = zs_proc_listen_port(L->procs[0].pid);
            if (port < 0 && port != -ENOENT) /* ENOENT: it exited; the next reap sees it */
                snprintf(L->failure, sizeof L->failure,
                         "cannot find the coordinator's port in /proc/%d: %s",
                         (int)L->procs[0].pid, strerror(-port));
            if ((port < 0 && port != -ENOENT) || (port > 0 && start_rest(L, port) != 0)) {
                fprintf(stderr, "zshard launch: %s\n", L->failure);
                stop_all(L, now);
            }
        }
        int late = 0;
        while (late < L->started && !L->procs[late].running)
            late++;
        if (!L->stopping && L->ending_at > 0 && now - L->ending_at > END_GRACE_S &&
            late < L->started) {
            snprintf(L->failure, sizeof L->failure, "%s (pid %d) was still running %.0f s after %s",
                     L->procs[late].name, (int)L->procs[late].pid, END_GRACE_S, L->ending_why);
            fprintf(stderr, "zshard launch: %s\n", L->failure);
            stop_all(L, now);
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
        fprintf(stderr, "zshard launch: %s (pid %d) %s; it printed nothing\n", p->name,
                (int)p->pid, how);
    } else {
        fprintf(stderr, "zshard launch: %s (pid %d) %s; its last lines:\n", p->name,
                (int)p->pid, how);
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
    char line[1024];
    while (f && fgets(line, sizeof line, f)) {
        double tps = metric(line, "tokens_per_sec"), ms = metric(line, "step_ms");
        steps++;
        loss = metric(line, "loss");
        if (tps == tps && ms == ms) {
            tokens += tps * ms / 1e3;
            seconds += ms / 1e3;
        }
    }
    if (f)
        fclose(f);
    fprintf(stderr,
            "zshard launch: done: %ld steps, final loss %.4f, %.0f tok/s on average "
            "(%ld server%s, %ld worker%s)\n",
            steps, loss, seconds > 0 ? tokens / seconds : 0.0, L->servers,
            L->servers == 1 ? "" : "s", L->workers, L->workers == 1 ? "" : "s");
    fprintf(stderr, "zshard launch: model in %s/model.safetensors and %s/config.json, metrics in "
                    "%s, logs in %s/logs/\n", L->out, L->out, path, L->out);
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
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},    {"data", required_argument, NULL, 'd'},
        {"steps", required_argument, NULL, 's'},     {"servers", required_argument, NULL, 'S'},
        {"workers", required_argument, NULL, 'W'},   {"out", required_argument, NULL, 'o'},
        {"threads", required_argument, NULL, 't'},   {"bind", required_argument, NULL, 'b'},
        {"log-level", required_argument, NULL, 'L'}, {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    launch L = {.steps = -1, .servers = -1, .workers = -1, .bind = "127.0.0.1", .failed = -1};
    int c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 'c': L.config = optarg; break;
        case 'd': L.data = optarg; break;
        case 'o': L.out = optarg; break;
        case 'b': L.bind = optarg; break;
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
        case 't':
            if ((L.threads = zs_cli_int("launch", "--threads", optarg, 1, 1024)) < 0)
                return 2;
            break;
        case 'L':
            if (zs_cli_log_level("launch", optarg))
                return 2;
            L.log_level = optarg;
            break;
        case 'h': fputs(launch_usage, stdout); return 0;
        case ':': return zs_cli_usage_error("launch", "%s needs a value", argv[optind - 1]);
        default: return zs_cli_usage_error("launch", "unknown option \"%s\"", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return zs_cli_usage_error("launch", "unexpected argument \"%s\"", argv[optind]);
    const char *missing = !L.config ? "--config" : !L.data ? "--data" : L.steps < 0 ? "--steps"
                        : L.servers < 0 ? "--servers" : L.workers < 0 ? "--workers"
                        : !L.out ? "--out" : NULL;
    if (missing)
        return zs_cli_usage_error("launch", "missing %s", missing);
    /* A server advertises the address it listens on; a wildcard would be advertised as
     * loopback, which workers elsewhere cannot reach. */
    if (!L.bind[0] || strchr(L.bind, ':') || strcmp(L.bind, "*") == 0 ||
        strcmp(L.bind, "0.0.0.0") == 0)
        return zs_cli_usage_error("launch", "--bind: \"%s\" is not an IPv4 address of this "
                                  "machine (a wildcard cannot be advertised to workers)",
                                  L.bind);

    char logs[4200];
    snprintf(logs, sizeof logs, "%s/logs", L.out);
    if (make_dir(L.out) != 0 || make_dir(logs) != 0)
        return 1;
    L.n_procs = 1 + (int)L.servers + (int)L.workers;
    L.procs = calloc((size_t)L.n_procs, sizeof *L.procs);
    L.pfds = calloc((size_t)L.n_procs, sizeof *L.pfds);
    L.pfd_proc = calloc((size_t)L.n_procs, sizeof *L.pfd_proc);
    if (!L.procs || !L.pfds || !L.pfd_proc) {
        fprintf(stderr, "zshard launch: out of memory for %d processes\n", L.n_procs);
        free(L.procs);
        free(L.pfds);
        free(L.pfd_proc);
        return 1;
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

    int ok = L.failed < 0 && !L.failure[0] && !got_signal;
    for (int i = 0; i < L.started; i++)
        ok &= zs_proc_succeeded(&L.procs[i]);
    ok &= L.started == L.n_procs;
    if (ok)
        report_success(&L);
    else
        report_failure(&L);
    for (int i = 0; i < L.n_procs; i++)
        zs_proc_close(&L.procs[i]);
    free(L.procs);
    free(L.pfds);
    free(L.pfd_proc);
    return ok ? 0 : got_signal ? 128 + got_signal : 1;
}
