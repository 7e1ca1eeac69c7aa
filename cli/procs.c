/*
 * procs: child processes of `zshard launch`, each with its output captured.  See procs.h.
 */
#include "cli/procs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

void zs_proc_init(zs_proc *p, const char *name)
{
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->fd = -1;
    p->log_fd = -1;
}

/* Descriptors 0, 1 and 2 must be open before we create pipes, or a pipe could land on one of
 * them and the child's dup2() onto 1 and 2 would close it: fill any hole with /dev/null. */
static void keep_std_fds_open(void)
{
    for (int fd = 0; fd <= 2; fd++) {
        if (fcntl(fd, F_GETFD) >= 0 || errno != EBADF)
            continue;
        int nfd = open("/dev/null", O_RDWR);
        if (nfd >= 0 && nfd != fd) {
            dup2(nfd, fd);
            close(nfd);
        }
    }
}

/* Writes "zshard launch: exec /proc/self/exe: errno N" with async-signal-safe calls only. */
static void report_exec_failure(int err)
{
    char msg[80] = "zshard launch: exec /proc/self/exe failed: errno ";
    size_t len = strlen(msg);
    char digits[12];
    int nd = 0;
    do {
        digits[nd++] = (char)('0' + err % 10);
        err /= 10;
    } while (err > 0 && nd < (int)sizeof digits);
    while (nd > 0 && len < sizeof msg - 1)
        msg[len++] = digits[--nd];
    msg[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, msg, len);
    (void)w;
}

/* In the child, between fork and exec.  Never returns. */
static void run_child(char *const argv[], int in_fd, int out_fd, pid_t parent)
{
    /* Die with the parent.  If the parent died before prctl() took effect, we have been
     * reparented already and the signal will never come: check, and leave. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
        _exit(127);
    if (dup2(in_fd, STDIN_FILENO) < 0 || dup2(out_fd, STDOUT_FILENO) < 0 ||
        dup2(out_fd, STDERR_FILENO) < 0)
        _exit(127);
    /* Ignored signals stay ignored across exec, and a shell starts background jobs with
     * SIGINT and SIGQUIT ignored: give the child the defaults and an empty mask. */
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    static const int sigs[] = {SIGPIPE, SIGINT, SIGQUIT, SIGHUP, SIGTERM};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        sigaction(sigs[i], &dfl, NULL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    execv("/proc/self/exe", argv);
    report_exec_failure(errno);
    _exit(127);
}

int zs_proc_spawn(zs_proc *p, char *const argv[], const char *log_path)
{
    int res, pfd[2], devnull;
    keep_std_fds_open();
    if (log_path &&
        (p->log_fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666)) < 0)
        return -errno;
    if ((devnull = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0) {
        res = -errno;
        goto fail_log;
    }
    /* O_CLOEXEC: the other children must not inherit this pipe, or its EOF would wait for
     * all of them. */
    if (pipe2(pfd, O_CLOEXEC) != 0) {
        res = -errno;
        goto fail_devnull;
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        res = -errno;
        goto fail_pipe;
    }
    if (pid == 0)
        run_child(argv, devnull, pfd[1], parent);
    close(pfd[1]);
    close(devnull);
    fcntl(pfd[0], F_SETFL, fcntl(pfd[0], F_GETFL) | O_NONBLOCK);
    p->fd = pfd[0];
    p->pid = pid;
    p->running = 1;
    p->n_lines = 0;
    p->part_len = 0;
    return 0;

fail_pipe:
    close(pfd[0]);
    close(pfd[1]);
fail_devnull:
    close(devnull);
fail_log:
    if (p->log_fd >= 0)
        close(p->log_fd);
    p->log_fd = -1;
    return res;
}

/* One complete line: to the log, the ring, and the callback. */
static void emit_line(zs_proc *p, zs_proc_line_fn fn, void *arg)
{
    p->part[p->part_len] = '\0';
    if (p->log_fd >= 0) {
        /* The log is a copy for the user; a full disk must not stop the job, so a failed
         * write is dropped. */
        struct iovec iov[2] = {{p->part, p->part_len}, {"\n", 1}};
        ssize_t w = writev(p->log_fd, iov, 2);
        (void)w;
    }
    memcpy(p->tail[p->n_lines % ZS_PROC_TAIL], p->part, p->part_len + 1);
    p->n_lines++;
    p->part_len = 0;
    if (fn)
        fn(p, p->tail[(p->n_lines - 1) % ZS_PROC_TAIL], arg);
}

int zs_proc_read(zs_proc *p, zs_proc_line_fn fn, void *arg)
{
    char buf[16384];
    /* A few reads at most, so that one chatty child cannot starve the others. */
    for (int round = 0; round < 4 && p->fd >= 0; round++) {
        ssize_t n = read(p->fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 1;
        if (n <= 0) { /* EOF, or an error that ends the pipe all the same */
            if (p->part_len > 0)
                emit_line(p, fn, arg);
            close(p->fd);
            p->fd = -1;
            return 0;
        }
        for (ssize_t i = 0; i < n; i++) {
            if (buf[i] == '\n') {
                emit_line(p, fn, arg);
                continue;
            }
            p->part[p->part_len++] = buf[i];
            if (p->part_len == ZS_PROC_LINE - 1)
                emit_line(p, fn, arg);
        }
    }
    return p->fd >= 0;
}

int zs_proc_reap(zs_proc *p)
{
    if (!p->running)
        return 0;
    int st = 0;
    pid_t r;
    do
        r = waitpid(p->pid, &st, WNOHANG);
    while (r < 0 && errno == EINTR);
    if (r == 0)
        return 0;
    /* r < 0 (ECHILD) means someone else collected it; report it as a failure. */
    p->status = r < 0 ? -1 : st;
    p->running = 0;
    return 1;
}

void zs_proc_kill(zs_proc *p, int sig)
{
    if (p->running)
        kill(p->pid, sig);
}

const char *zs_proc_tail(const zs_proc *p, int i)
{
    int kept = p->n_lines < ZS_PROC_TAIL ? p->n_lines : ZS_PROC_TAIL;
    if (i < 0 || i >= kept)
        return NULL;
    return p->tail[(p->n_lines - 1 - i) % ZS_PROC_TAIL];
}

void zs_proc_describe_exit(const zs_proc *p, char *buf, size_t n)
{
    if (p->status == -1)
        snprintf(buf, n, "vanished (it was collected by someone else)");
    else if (WIFEXITED(p->status))
        snprintf(buf, n, "exited with status %d", WEXITSTATUS(p->status));
    else if (WIFSIGNALED(p->status))
        snprintf(buf, n, "was killed by signal %d (%s)%s", WTERMSIG(p->status),
                 strsignal(WTERMSIG(p->status)), WCOREDUMP(p->status) ? ", core dumped" : "");
    else
        snprintf(buf, n, "ended with wait status %#x", (unsigned)p->status);
}

int zs_proc_succeeded(const zs_proc *p)
{
    return !p->running && p->pid > 0 && p->status != -1 && WIFEXITED(p->status) &&
           WEXITSTATUS(p->status) == 0;
}

/* The port of a listening socket in a /proc/net/tcp{,6} table whose inode is in inodes. */
static int find_listener(const char *path, const unsigned long *inodes, int n, int except)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return errno == ENOENT ? 0 : -errno;
    char line[512];
    int port = 0;
    /* "sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ..." with
     * addresses as HEX:PORT (hex); st 0A is LISTEN.  The first line is a header. */
    while (port == 0 && fgets(line, sizeof line, f)) {
        unsigned lport, st;
        unsigned long inode;
        if (sscanf(line, " %*s %*[0-9A-Fa-f]:%x %*s %x %*s %*s %*s %*s %*s %lu", &lport, &st,
                   &inode) != 3 ||
            st != 0x0A || (int)lport == except)
            continue;
        for (int i = 0; i < n; i++)
            if (inodes[i] == inode)
                port = (int)lport;
    }
    fclose(f);
    return port;
}

int zs_proc_listen_port(pid_t pid, int except)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    if (!d)
        return -errno;
    unsigned long inodes[256];
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) && n < (int)(sizeof inodes / sizeof inodes[0])) {
        char link[64];
        ssize_t len = readlinkat(dirfd(d), de->d_name, link, sizeof link - 1);
        if (len <= 0)
            continue;
        link[len] = '\0';
        if (sscanf(link, "socket:[%lu]", &inodes[n]) == 1)
            n++;
    }
    closedir(d);
    if (n == 0)
        return 0;
    snprintf(path, sizeof path, "/proc/%d/net/tcp", (int)pid);
    int port = find_listener(path, inodes, n, except);
    if (port == 0) {
        snprintf(path, sizeof path, "/proc/%d/net/tcp6", (int)pid);
        port = find_listener(path, inodes, n, except);
    }
    return port;
}

void zs_proc_close(zs_proc *p)
{
    if (p->fd >= 0)
        close(p->fd);
    if (p->log_fd >= 0)
        close(p->log_fd);
    p->fd = -1;
    p->log_fd = -1;
}
