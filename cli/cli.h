/*
 * cli: the `zshard` command line.  main.c dispatches to one function per subcommand; each
 * parses its own flags with getopt_long, prints its usage for --help, and returns the process
 * exit status (0 success, 1 failure at run time, 2 bad usage).
 */
#ifndef ZS_CLI_H
#define ZS_CLI_H

int zs_cmd_train(int argc, char **argv);
int zs_cmd_eval(int argc, char **argv);
int zs_cmd_server(int argc, char **argv);
int zs_cmd_coord(int argc, char **argv);
int zs_cmd_worker(int argc, char **argv);
int zs_cmd_status(int argc, char **argv);
int zs_cmd_launch(int argc, char **argv);
int zs_cmd_export(int argc, char **argv);

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

/* The number of CPUs this process may run on. */
int zs_cli_cpus(void);

#endif
