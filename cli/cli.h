/*
 * cli: the `zshard` command line.  main.c dispatches to one function per subcommand; each
 * parses its own flags with getopt_long, prints its usage for --help, and returns the process
 * exit status (0 success, 1 failure at run time, 2 bad usage).
 */
#ifndef ZS_CLI_H
#define ZS_CLI_H

#include "common/prom.h"
#include "common/secret.h"
#include "server/metrics_http.h"

int zs_cmd_train(int argc, char **argv);
int zs_cmd_eval(int argc, char **argv);
int zs_cmd_server(int argc, char **argv);
int zs_cmd_coord(int argc, char **argv);
int zs_cmd_worker(int argc, char **argv);
int zs_cmd_status(int argc, char **argv);
int zs_cmd_launch(int argc, char **argv);
int zs_cmd_export(int argc, char **argv);
int zs_cmd_keygen(int argc, char **argv);

/* Parses a positive integer flag value; prints "zshard CMD: --FLAG: ..." and returns -1. */
long zs_cli_int(const char *cmd, const char *flag, const char *value, long lo, long hi);

/* Reports an unknown flag or a missing argument in getopt's terms ("zshard train: ..."). */
int zs_cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Set by SIGINT or SIGTERM once zs_cli_catch_signals() ran (which also ignores SIGPIPE):
 * long-running commands poll it and stop cleanly. */
extern volatile int zs_cli_stop;
void zs_cli_catch_signals(void);

/* Applies a --log-level value; returns 0, or 2 after printing the usage error. */
int zs_cli_log_level(const char *cmd, const char *value);

/* The options every role that talks to others takes: --secret FILE and --insecure (getopt_long
 * entries whose values are outside every short option's range). */
#define ZS_CLI_OPT_SECRET 1001
#define ZS_CLI_OPT_INSECURE 1002
#define ZS_CLI_SECRET_OPTIONS                                                                      \
    {"secret", required_argument, NULL, ZS_CLI_OPT_SECRET},                                        \
    {                                                                                              \
        "insecure", no_argument, NULL, ZS_CLI_OPT_INSECURE                                         \
    }
#define ZS_CLI_SECRET_USAGE                                                                        \
    "  --secret FILE            the job secret (zshard keygen FILE); default: "                    \
    "$ZSHARD_SECRET_FILE\n"                                                                        \
    "  --insecure               run without a secret: anyone who reaches the ports is trusted\n"

/* What --secret and --insecure said. */
typedef struct {
    const char *path; /* --secret FILE, or NULL */
    int insecure;     /* --insecure */
} zs_cli_secret_args;

/* Takes getopt_long's value c if it is --secret or --insecure (returns 1), else returns 0. */
int zs_cli_secret_opt(int c, zs_cli_secret_args *a);

/* Resolves the secret a role runs with (common/secret.h zs_secret_resolve) into *out and,
 * without one, logs that this process runs unauthenticated.  Returns 0, or 2 after printing
 * "zshard CMD: why". */
int zs_cli_secret(const char *cmd, const char *path, int insecure, zs_secret *out);

/* --metrics HOST:PORT of coord and server: the process's registry and its endpoint. */
typedef struct {
    zs_prom *reg; /* NULL: --metrics not given */
    zs_metrics_http *http;
} zs_cli_metrics;
#define ZS_CLI_METRICS_USAGE                                                                       \
    "  --metrics HOST:PORT      serve Prometheus metrics at http://HOST:PORT/metrics (port 0:\n"   \
    "                           a free one; the line 'metrics: http://...' on stderr names it)\n"

/* With addr NULL does nothing; else makes the registry with the process series of role and
 * starts the endpoint, then prints "metrics: http://HOST:PORT/metrics" on stderr (zshard
 * launch reads that line).  Returns 0, or 1 after printing "zshard CMD: why". */
int zs_cli_metrics_start(const char *cmd, const char *role, const char *addr, zs_cli_metrics *m);
/* Stops the endpoint and frees the registry; a zeroed m is fine. */
void zs_cli_metrics_stop(zs_cli_metrics *m);

/* The number of CPUs this process may run on. */
int zs_cli_cpus(void);

#endif
