/*
 * procs: child processes of `zshard launch`, each with its output captured.
 *
 * zs_proc_spawn() forks and runs this same binary (/proc/self/exe) with the given arguments.
 * The child's stdout and stderr both go into one pipe that the parent reads; its stdin is
 * /dev/null.  Before it execs, the child asks the kernel for SIGKILL when the parent dies
 * (PR_SET_PDEATHSIG), so no child outlives a launcher that is itself killed.
 *
 * zs_proc_read() cuts what arrived into lines: each line goes to the child's log file, to a
 * callback, and into a short ring of last lines kept for the failure message.
 *
 * Invariants: a proc is running from a successful spawn until zs_proc_reap() has seen it exit
 * (the zombie is collected then, never earlier, so its pid cannot be reused while the parent
 * may still signal it); its pipe stays open until EOF; only the parent's single thread calls
 * these functions (PR_SET_PDEATHSIG fires when the forking thread exits).
 */
#ifndef ZS_PROCS_H
#define ZS_PROCS_H

#include <stddef.h>
#include <sys/types.h>

#define ZS_PROC_TAIL 6    /* last lines kept per child */
#define ZS_PROC_LINE 1024 /* bytes of a line kept; longer lines are cut in pieces */

typedef struct zs_proc {
    char name[32];           /* "coord", "server 2", "worker 1": how messages name it */
    pid_t pid;               /* 0 before spawn */
    int fd;                  /* read end of the output pipe; -1 once at EOF or closed */
    int log_fd;              /* the child's whole output goes here; -1 for none */
    int running;             /* spawned and not yet reaped */
    int status;              /* wait status, valid once reaped */
    int lost;                /* its failure was the job's to recover from (zshard launch) */
    char part[ZS_PROC_LINE]; /* the line being read, not yet ended by '\n' */
    size_t part_len;
    char tail[ZS_PROC_TAIL][ZS_PROC_LINE]; /* ring of the last complete lines */
    int n_lines; /* lines seen in all; tail[(n_lines - 1) % ZS_PROC_TAIL] is the last */
} zs_proc;

/* Called with each complete line, without its '\n'. */
typedef void (*zs_proc_line_fn)(zs_proc *p, const char *line, void *arg);

/* Prepares p (name, no log) before spawn. */
void zs_proc_init(zs_proc *p, const char *name);

/* Starts argv (argv[0] is only the name the child sees; the program is /proc/self/exe) with
 * its output in a pipe, and opens log_path (truncated) for the log when it is not NULL.
 * Returns 0, or a negative errno (nothing is left open or running then). */
int zs_proc_spawn(zs_proc *p, char *const argv[], const char *log_path);

/* Reads what the pipe holds without blocking and hands out the complete lines.  Returns 1
 * while the pipe is open, 0 at EOF (the remaining partial line is handed out then). */
int zs_proc_read(zs_proc *p, zs_proc_line_fn fn, void *arg);

/* Collects the child if it has exited, without blocking.  Returns 1 if it exited just now,
 * 0 if it is still running (or was reaped before). */
int zs_proc_reap(zs_proc *p);

/* Sends sig to a running child; does nothing once it was reaped. */
void zs_proc_kill(zs_proc *p, int sig);

/* The i-th line from the end (0: the last one), or NULL when there is no such line kept. */
const char *zs_proc_tail(const zs_proc *p, int i);

/* Writes how a reaped child ended: "exited with status 1", "was killed by signal 9 (Killed)". */
void zs_proc_describe_exit(const zs_proc *p, char *buf, size_t n);

/* 1 if a reaped child exited with status 0. */
int zs_proc_succeeded(const zs_proc *p);

/* The port of the TCP socket that process pid listens on (the first one found in
 * /proc/PID/net/tcp and tcp6 whose inode is one of its file descriptors), other than port
 * except (its metrics endpoint; 0: none), 0 while it has none, or a negative errno.  Costs a
 * directory scan of /proc/PID/fd and a read of the namespace's socket tables. */
int zs_proc_listen_port(pid_t pid, int except);

/* Closes the pipe and the log; the child must have been reaped (or never started). */
void zs_proc_close(zs_proc *p);

#endif
