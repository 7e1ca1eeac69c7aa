/*
 * zshard: one binary, one subcommand per role.
 */
#include <errno.h>
#include <getopt.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/log.h"

static const char usage[] =
    "usage: zshard [--help] [--version] COMMAND [ARGS]\n"
    "\n"
    "zshard trains GPT-2 models with ZeRO-style partitioning.\n"
    "\n"
    "commands:\n"
    "  train   train a model in one process (the reference for distributed runs)\n"
    "  eval    print the mean cross-entropy of a trained model on some data\n"
    "  coord   run the coordinator (membership, shard map, step state)\n"
    "  server  run a partition server (holds shards, applies AdamW)\n"
    "  worker  run a worker (computes chunks with fetched layers, pushes gradients)\n"
    "  status  print what a running job is doing (step, members, throughput)\n"
    "  launch  run a whole job on this host: coord, servers and workers\n"
    "  export  write a Hugging Face model directory from a checkpoint\n"
    "  keygen  write a new job secret (every process of a job proves it holds it)\n"
    "\n"
    "Run 'zshard COMMAND --help' for the options of a command.\n";

long zs_cli_int(const char *cmd, const char *flag, const char *value, long lo, long hi)
{
    char *end;
    errno = 0;
    long v = strtol(value, &end, 10);
    if (errno || end == value || *end || v < lo || v > hi) {
        fprintf(stderr, "zshard %s: %s: \"%s\" is not an integer in [%ld, %ld]\n", cmd, flag, value,
                lo, hi);
        return -1;
    }
    return v;
}

int zs_cli_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "zshard %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nRun 'zshard %s --help' for usage.\n", cmd);
    va_end(ap);
    return 2;
}

volatile int zs_cli_stop;

static void on_stop_signal(int sig)
{
    (void)sig;
    zs_cli_stop = 1;
}

void zs_cli_catch_signals(void)
{
    struct sigaction sa = {.sa_handler = on_stop_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

int zs_cli_secret_opt(int c, zs_cli_secret_args *a)
{
    if (c == ZS_CLI_OPT_SECRET)
        a->path = optarg;
    else if (c == ZS_CLI_OPT_INSECURE)
        a->insecure = 1;
    return c == ZS_CLI_OPT_SECRET || c == ZS_CLI_OPT_INSECURE;
}

int zs_cli_secret(const char *cmd, const char *path, int insecure, zs_secret *out)
{
    if (zs_secret_resolve(path, insecure, out) != ZS_OK) {
        fprintf(stderr, "zshard %s: %s\n", cmd, zs_last_error());
        return 2;
    }
    if (out->insecure)
        ZS_WARN("zshard %s: running without authentication (--insecure): any process that can "
                "reach this job's ports can read and change the model and stop the job",
                cmd);
    return 0;
}

int zs_cli_metrics_start(const char *cmd, const char *role, const char *addr, zs_cli_metrics *m)
{
    *m = (zs_cli_metrics){0};
    if (!addr)
        return 0;
    if (zs_prom_open(&m->reg) != ZS_OK || zs_prom_add_process(m->reg, role) != ZS_OK ||
        zs_metrics_http_start(addr, m->reg, &m->http) != ZS_OK) {
        fprintf(stderr, "zshard %s: --metrics: %s\n", cmd, zs_last_error());
        zs_cli_metrics_stop(m);
        return 1;
    }
    fprintf(stderr, "metrics: http://%s/metrics\n", zs_metrics_http_target(m->http));
    return 0;
}

void zs_cli_metrics_stop(zs_cli_metrics *m)
{
    zs_metrics_http_stop(m->http);
    zs_prom_free(m->reg);
    *m = (zs_cli_metrics){0};
}

int zs_cli_log_level(const char *cmd, const char *value)
{
    int lvl = zs_log_parse_level(value);
    if (lvl < 0)
        return zs_cli_usage_error(cmd, "--log-level: unknown level \"%s\"", value);
    zs_log_set_level((zs_log_level)lvl);
    return 0;
}

int zs_cli_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        return CPU_COUNT(&set) > 0 ? CPU_COUNT(&set) : 1;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fputs(usage, stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        fputs(usage, stdout);
        return 0;
    }
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "-V") == 0) {
        printf("zshard %s\n", ZS_VERSION);
        return 0;
    }
    if (strcmp(cmd, "train") == 0)
        return zs_cmd_train(argc - 1, argv + 1);
    if (strcmp(cmd, "eval") == 0)
        return zs_cmd_eval(argc - 1, argv + 1);
    if (strcmp(cmd, "coord") == 0)
        return zs_cmd_coord(argc - 1, argv + 1);
    if (strcmp(cmd, "server") == 0)
        return zs_cmd_server(argc - 1, argv + 1);
    if (strcmp(cmd, "worker") == 0)
        return zs_cmd_worker(argc - 1, argv + 1);
    if (strcmp(cmd, "status") == 0)
        return zs_cmd_status(argc - 1, argv + 1);
    if (strcmp(cmd, "launch") == 0)
        return zs_cmd_launch(argc - 1, argv + 1);
    if (strcmp(cmd, "export") == 0)
        return zs_cmd_export(argc - 1, argv + 1);
    if (strcmp(cmd, "keygen") == 0)
        return zs_cmd_keygen(argc - 1, argv + 1);
    fprintf(stderr, "zshard: unknown command \"%s\"\n\n%s", cmd, usage);
    return 2;
}
