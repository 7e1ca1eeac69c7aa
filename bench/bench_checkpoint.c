/*
 * bench_checkpoint: what checkpoints cost, in three figures (the targets in brackets).
 *
 *   1. Write throughput [>= 0.8].  A flat vector of M floats with its two AdamW moments (12
 *      bytes per float, about 1 GiB by default) cut into 4 MiB shards (1 Mi floats: the default
 *      cluster.shard_size), every shard written with zs_ckpt_write_shard one after another on
 *      one thread, as one partition server's checkpoint writer does: header, three arrays with
 *      their XXH3 checksums, fsync, rename, fsync of the directory.  The time covers every
 *      file's fsync.  The limit is `dd if=/dev/zero bs=4M oflag=direct conv=fsync` of the same
 *      bytes into the same directory, timed from outside (fork to exit) in the same run.
 *      Beside it, "plain": the same bytes from the same arrays into as many files with write(2)
 *      and fsync alone, which tells what zs_ckpt adds apart from what the page cache costs.
 *      Each is run three times and the best of each is taken (dropping the page cache needs root).
 *      The checkpoint and plain take turns at going first: the first buffered writer after dd
 *      gets page-cache memory the machine must find afresh, which on a VM that hands freed
 *      memory back to its host is up to 4x slower than the second, which reuses the pages the
 *      first one's files freed.
 *   2. Step time [<= 1.05].  `zshard launch` (2 partition servers, 2 workers) on the model of
 *      deploy/configs/small-gpt.json, with a checkpoint after every step
 *      (checkpoint.interval_steps 1) and with only the final one (interval_steps 0), in
 *      alternating rounds; the median of metrics.jsonl's step_ms over the steps after the
 *      first two of every round.  A server writes its shards of version s in the background
 *      while step s+1 computes, so the ratio is what that overlap fails to hide (on a machine
 *      with no spare core, the writer's CPU time too).  Every run must commit its final
 *      checkpoint (DIR/latest).  A third configuration in the same rounds, buddy replicas
 *      (checkpoint.replicas 1, final checkpoint only), gives what keeping a replica costs per
 *      step, against the same final-only runs (no target).
 *   3. Recovery: the time from a server's SIGKILL to a step finished again, without a replica
 *      (every server back to the newest checkpoint, the steps since run again) and with one
 *      (checkpoint.replicas 1: the replica's holder takes the lost server's shards from memory,
 *      no step runs again), each against the step time of the same run.
 *
 * Everything is written under a fresh directory inside --dir (default $TMPDIR, else /var/tmp;
 * never a tmpfs: statfs decides), removed at the end unless a run failed.
 *
 * usage: bench_checkpoint ZSHARD [--dir DIR] [--bytes N[K|M|G]] [--steps N] [--rounds R]
 *                        [--threads T]
 *   --bytes   bytes of param + exp_avg + exp_avg_sq to write in figure 1 (default 1G)
 *   --steps   steps of each `zshard launch` in figure 2 (default 12; 0 skips figure 2)
 *   --rounds  runs of each configuration in figure 2 (default 2)
 *   --threads kernel threads per worker in figure 2 (default 1: 2 workers on 2 cores)
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "bench/benchutil.h"
#include "common/ckpt.h"
#include "common/tensors.h"

#define SHARD_FLOATS (1u << 20) /* 4 MiB of fp32: the default cluster.shard_size */
#define DD_BLOCK (4u << 20)     /* dd bs=4M */
#define REPS 3                  /* runs of each writer in figure 1; the best one counts */
#define LAUNCH_LIMIT_S 600      /* a `zshard launch` still running after this is stopped */
#define MAX_SAMPLES 4096

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ------------------------------------------------------------------------------------------ */
/* The machine and the filesystem                                                             */
/* ------------------------------------------------------------------------------------------ */

#define MAGIC_TMPFS 0x01021994L
#define MAGIC_RAMFS 0x858458f6L

/* A name for statfs's f_type (the common ones), or NULL. */
static const char *fs_magic_name(long type)
{
    static const struct {
        long magic;
        const char *name;
    } names[] = {
        {0xEF53L, "ext2/3/4"},  {0x58465342L, "xfs"},   {0x9123683EL, "btrfs"},
        {MAGIC_TMPFS, "tmpfs"}, {MAGIC_RAMFS, "ramfs"}, {0x794C7630L, "overlayfs"},
        {0x6969L, "nfs"},       {0x2FC12FC1L, "zfs"},   {0xF2F52010L, "f2fs"},
        {0xFF534D42L, "cifs"},  {0x65735546L, "fuse"},  {0x01021997L, "9p"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].magic == type)
            return names[i].name;
    return NULL;
}

/* The filesystem type and source of the mount that holds path, from /proc/self/mountinfo
 * (the longest mount point that is a prefix of path's real path).  Returns 0 if found. */
static int mount_of(const char *path, char *type, size_t tn, char *src, size_t sn, char *mnt,
                    size_t mn)
{
    char real[PATH_MAX];
    if (!realpath(path, real))
        return -1;
    FILE *f = fopen("/proc/self/mountinfo", "r");
    if (!f)
        return -1;
    char line[4096];
    size_t best = 0;
    int found = -1;
    while (fgets(line, sizeof line, f)) {
        /* id parent maj:min root mountpoint options [optional...] - type source superopts */
        char mp[1024], ty[128], so[1024];
        if (sscanf(line, "%*s %*s %*s %*s %1023s", mp) != 1)
            continue;
        const char *dash = strstr(line, " - ");
        if (!dash || sscanf(dash + 3, "%127s %1023s", ty, so) != 2)
            continue;
        size_t l = strlen(mp);
        int prefix = strcmp(mp, "/") == 0 ||
                     (strncmp(real, mp, l) == 0 && (real[l] == '/' || real[l] == '\0'));
        if (prefix && l >= best) {
            best = l;
            snprintf(type, tn, "%s", ty);
            snprintf(src, sn, "%s", so);
            snprintf(mnt, mn, "%s", mp);
            found = 0;
        }
    }
    fclose(f);
    return found;
}

/* 1 if path is on a filesystem in memory (tmpfs, ramfs), 0 if not, -1 if statfs fails. */
static int in_memory(const char *path, long *type)
{
    struct statfs s;
    if (statfs(path, &s) != 0)
        return -1;
    *type = (long)s.f_type;
    return s.f_type == MAGIC_TMPFS || s.f_type == MAGIC_RAMFS;
}

/*
 * The CPU time other processes used: the machine's busy time (/proc/stat: user, nice, system,
 * irq, softirq of all cores) less this process's and its waited-for descendants' (getrusage;
 * a child's children count once the child has waited for them, as zshard launch does).  Other
 * work on the cores stretches every figure here, so each is printed with it.  The kernel's
 * own threads count as others, so the page cache being written back shows up there too.
 */
typedef struct {
    double busy_s, ours_s, wall_s;
} cpu_mark;

static cpu_mark cpu_now(void)
{
    cpu_mark c = {.wall_s = now_s()};
    unsigned long long u = 0, n = 0, sy = 0, idle = 0, io = 0, irq = 0, sirq = 0;
    FILE *f = fopen("/proc/stat", "r");
    if (f && fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu", &u, &n, &sy, &idle, &io, &irq,
                    &sirq) == 7)
        c.busy_s = (double)(u + n + sy + irq + sirq) / (double)sysconf(_SC_CLK_TCK);
    else
        c.busy_s = NAN;
    if (f)
        fclose(f);
    struct rusage self, kids;
    getrusage(RUSAGE_SELF, &self);
    getrusage(RUSAGE_CHILDREN, &kids);
    const struct timeval *t[4] = {&self.ru_utime, &self.ru_stime, &kids.ru_utime, &kids.ru_stime};
    for (int i = 0; i < 4; i++)
        c.ours_s += (double)t[i]->tv_sec + 1e-6 * (double)t[i]->tv_usec;
    return c;
}

/* "other processes: 1.2 CPU-s in 60.0 s (1% of 2 cores)" since a. */
static void print_others(const char *what, cpu_mark a)
{
    cpu_mark b = cpu_now();
    double others = (b.busy_s - a.busy_s) - (b.ours_s - a.ours_s), wall = b.wall_s - a.wall_s;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    printf("   %s: other processes used %.1f CPU-s in %.1f s (%.0f%% of %ld cores)%s\n", what,
           others, wall, 100 * others / (wall * (double)cores), cores,
           others > 0.1 * wall * (double)cores ? ": more than 10%, the figures above are disturbed"
                                               : "");
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

/* Removes path and everything under it (no symlink is followed). */
static int rm_tree(const char *path)
{
    return nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* Prints the last lines of a log file to stderr, indented. */
static void tail_log(const char *path, int lines)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    char ring[16][512];
    int n = 0;
    while (n < 1 << 30 && fgets(ring[n % 16], sizeof ring[0], f))
        n++;
    fclose(f);
    if (lines > 16)
        lines = 16;
    for (int i = n > lines ? n - lines : 0; i < n; i++)
        fprintf(stderr, "    | %s", ring[i % 16]);
}

/* ------------------------------------------------------------------------------------------ */
/* Figure 1: checkpoint write against dd oflag=direct                                         */
/* ------------------------------------------------------------------------------------------ */

/* Writes the n_shards shards of [0, M) as checkpoint step `step` under dir/ckpt; *bytes: the
 * files' sizes, *secs: from the first open to the last directory fsync.  Returns 0 or -1
 * (message printed). */
static int write_checkpoint(const char *dir, long step, size_t M, size_t shard, const float *p,
                            const float *m, const float *v, uint64_t *bytes, double *secs)
{
    char ckdir[4200], stepdir[4300];
    snprintf(ckdir, sizeof ckdir, "%s/ckpt", dir);
    zs_ckpt_info info = {
        .step = step,
        .steps_total = 1000,
        .run_id = 0x0123456789abcdefull,
        .total_floats = M,
        .shard_floats = shard,
    };
    if (zs_ckpt_step_dir(ckdir, step, 1, stepdir, sizeof stepdir) != ZS_OK) {
        fprintf(stderr, "bench_checkpoint: %s\n", zs_last_error());
        return -1;
    }
    uint64_t total = 0;
    double t0 = now_s();
    for (size_t begin = 0, i = 0; begin < M; begin += shard, i++) {
        size_t end = begin + shard < M ? begin + shard : M;
        zs_ckpt_shard sh;
        if (zs_ckpt_write_shard(stepdir, &info, (int)i, begin, end, p + begin, m + begin, v + begin,
                                &sh) != ZS_OK) {
            fprintf(stderr, "bench_checkpoint: %s\n", zs_last_error());
            return -1;
        }
        total += sh.bytes;
    }
    *secs = now_s() - t0;
    *bytes = total;
    return rm_tree(ckdir) == 0 ? 0 : -1;
}

/* The same files without zs_ckpt: per shard one file dir/plain-N of a 4 KiB header and the
 * three arrays, each in one write(2), then fsync; no checksum, no temporary name, no rename,
 * no directory fsync.  It tells the cost of the page cache and fsync on this machine apart
 * from what zs_ckpt_write_shard adds.  Returns 0 or -1. */
static int write_plain(const char *dir, size_t M, size_t shard, const float *p, const float *m,
                       const float *v, uint64_t *bytes, double *secs)
{
    static char header[4096];
    char path[4200];
    uint64_t total = 0;
    size_t n = 0;
    double t0 = now_s();
    for (size_t begin = 0; begin < M; begin += shard, n++) {
        size_t len = (begin + shard < M ? begin + shard : M) - begin;
        snprintf(path, sizeof path, "%s/plain-%06zu", dir, n);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) {
            fprintf(stderr, "bench_checkpoint: %s: %s\n", path, strerror(errno));
            return -1;
        }
        const void *parts[4] = {header, p + begin, m + begin, v + begin};
        size_t sizes[4] = {sizeof header, len * 4, len * 4, len * 4};
        for (int i = 0; i < 4; i++) {
            const char *b = parts[i];
            for (size_t left = sizes[i]; left;) {
                ssize_t w = write(fd, b, left);
                if (w <= 0) {
                    fprintf(stderr, "bench_checkpoint: %s: write: %s\n", path, strerror(errno));
                    close(fd);
                    return -1;
                }
                b += w, left -= (size_t)w, total += (uint64_t)w;
            }
        }
        if (fsync(fd) != 0 || close(fd) != 0) {
            fprintf(stderr, "bench_checkpoint: %s: fsync: %s\n", path, strerror(errno));
            return -1;
        }
    }
    *secs = now_s() - t0;
    *bytes = total;
    for (size_t i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/plain-%06zu", dir, i);
        unlink(path);
    }
    return 0;
}

/* The smallest of x[0..n). */
static double min_of(const double *x, int n)
{
    double m = x[0];
    for (int i = 1; i < n; i++)
        m = fmin(m, x[i]);
    return m;
}

/* Runs dd of count 4 MiB blocks of zeros into dir/dd.bin with O_DIRECT and a final fsync;
 * *secs from fork to exit.  Returns 0 or -1 (dd's own message printed). */
static int run_dd(const char *dir, uint64_t count, double *secs)
{
    char of[4200], cnt[32], log[4200];
    snprintf(of, sizeof of, "of=%s/dd.bin", dir);
    snprintf(cnt, sizeof cnt, "count=%llu", (unsigned long long)count);
    snprintf(log, sizeof log, "%s/dd.log", dir);
    fflush(NULL); /* or the child's freopen writes our buffered output again */
    double t0 = now_s();
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen(log, "w", stderr) || !freopen("/dev/null", "w", stdout))
            _exit(127);
        execlp("dd", "dd", "if=/dev/zero", of, "bs=4M", cnt, "oflag=direct", "conv=fsync",
               (char *)NULL);
        _exit(127);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid) {
        fprintf(stderr, "bench_checkpoint: cannot run dd: %s\n", strerror(errno));
        return -1;
    }
    *secs = now_s() - t0;
    int ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
    if (!ok) {
        fprintf(stderr,
                "bench_checkpoint: dd %s %s bs=4M oflag=direct conv=fsync failed "
                "(exit %d); its output:\n",
                of, cnt, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        tail_log(log, 5);
    }
    snprintf(of, sizeof of, "%s/dd.bin", dir);
    unlink(of);
    unlink(log);
    return ok ? 0 : -1;
}

/* ------------------------------------------------------------------------------------------ */
/* Figure 2: step time with a checkpoint every step against none                              */
/* ------------------------------------------------------------------------------------------ */

/* One configuration's runs: the samples of every round, the last run's details. */
typedef struct {
    const char *name;       /* "final", "every" or "replica" */
    int interval;           /* checkpoint.interval_steps */
    int replicas;           /* checkpoint.replicas */
    double ms[MAX_SAMPLES]; /* step_ms of steps 3.. of every run so far */
    int samples;            /* in ms */
    double run_median_ms;   /* of the last run's steps 3.. */
    int steps_read;         /* metrics.jsonl lines of the last run */
    int ckpt_lines;         /* of those, lines with a "checkpoint" field */
    char latest[64];        /* DIR/latest's content */
    uint64_t bytes;         /* files of the latest checkpoint */
    int files;
} launch_result;

/* The size and number of the files in dir. */
static void dir_size(const char *dir, uint64_t *bytes, int *files)
{
    *bytes = 0, *files = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char path[4700];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (e->d_name[0] != '.' && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
            *bytes += (uint64_t)st.st_size;
            (*files)++;
        }
    }
    if (d)
        closedir(d);
}

/* Starts `zshard launch` with 2 workers and `servers` servers on cfg and data, its output in
 * log; returns its pid, or -1 (said why). */
static pid_t start_launch(const char *zshard, const char *cfg, const char *data, const char *steps,
                          const char *servers, const char *threads, const char *out,
                          const char *log)
{
    char *argv[] = {(char *)zshard,  "launch",      (char *)"--config",
                    (char *)cfg,     "--data",      (char *)data,
                    "--steps",       (char *)steps, "--out",
                    (char *)out,     "--servers",   (char *)servers,
                    "--workers",     "2",           "--threads",
                    (char *)threads, NULL};
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen(log, "w", stderr) || dup2(fileno(stderr), STDOUT_FILENO) < 0)
            _exit(127);
        execv(argv[0], argv);
        fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
        fflush(stderr);
        _exit(127);
    }
    if (pid < 0)
        fprintf(stderr, "bench_checkpoint: fork: %s\n", strerror(errno));
    return pid;
}

/*
 * Runs `zshard launch` on dir/NAME.json (the small model, a checkpoint every r->interval
 * steps into dir/NAMEi-ckpt), adds its step times to r and reads its last checkpoint, which
 * it then removes.  Returns 0, or -1 with the reason and the end of the log printed.
 */
static int launch_run(const char *zshard, const char *dir, const char *data, const char *steps,
                      const char *threads, int round, launch_result *r)
{
    char cfg[4200], out[4200], ck[4200], log[4200], path[4400], line[4096];
    snprintf(cfg, sizeof cfg, "%s/%s.json", dir, r->name);
    snprintf(out, sizeof out, "%s/%s%d-out", dir, r->name, round);
    snprintf(ck, sizeof ck, "%s/%s%d-ckpt", dir, r->name, round);
    snprintf(log, sizeof log, "%s/%s%d.log", dir, r->name, round);
    FILE *f = fopen(cfg, "w");
    if (!f) {
        fprintf(stderr, "bench_checkpoint: %s: %s\n", cfg, strerror(errno));
        return -1;
    }
    /* deploy/configs/small-gpt.json, plus the checkpoint block. */
    fprintf(f,
            "{\"seed\": 1337, \"train_batch_size\": 16, \"train_micro_batch_size_per_gpu\": 8,\n"
            " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001, \"betas\": [0.9, "
            "0.95], \"eps\": 1e-8, \"weight_decay\": 0.1}},\n"
            " \"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {\"warmup_num_steps\": 10, "
            "\"warmup_type\": \"linear\", \"total_num_steps\": 60, \"cos_min_ratio\": 0.1}},\n"
            " \"gradient_clipping\": 1.0,\n"
            " \"model\": {\"n_layer\": 6, \"n_head\": 6, \"n_embd\": 384, \"vocab_size\": 256, "
            "\"block_size\": 256},\n"
            " \"checkpoint\": {\"dir\": \"%s\", \"interval_steps\": %d, \"replicas\": %d}}\n",
            ck, r->interval, r->replicas);
    if (fclose(f) != 0) {
        fprintf(stderr, "bench_checkpoint: %s: %s\n", cfg, strerror(errno));
        return -1;
    }
    pid_t pid = start_launch(zshard, cfg, data, steps, "2", threads, out, log);
    if (pid < 0)
        return -1;
    /* The launcher stops its children on SIGTERM; a run that hangs is stopped that way. */
    int st = 0, stopped = 0;
    double t0 = now_s();
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (!stopped && now_s() - t0 > LAUNCH_LIMIT_S) {
            kill(pid, SIGTERM);
            stopped = 1;
        }
        usleep(100000);
    }
    if (stopped || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr,
                "bench_checkpoint: zshard launch with checkpoint.interval_steps %d %s; the end "
                "of its log %s:\n",
                r->interval,
                stopped         ? "ran past the limit and was stopped"
                : WIFEXITED(st) ? "failed"
                                : "was killed by a signal",
                log);
        tail_log(log, 8);
        return -1;
    }

    /* Step times of steps 3.. (1 pays for starting processes, 2 for the first checkpoint's
     * directory and the servers' first writes racing the start). */
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    if (!(f = fopen(path, "r"))) {
        fprintf(stderr, "bench_checkpoint: %s: %s\n", path, strerror(errno));
        return -1;
    }
    double ms[MAX_SAMPLES];
    int n = 0;
    r->steps_read = r->ckpt_lines = 0;
    while (fgets(line, sizeof line, f)) {
        r->steps_read++;
        if (strstr(line, "\"checkpoint"))
            r->ckpt_lines++;
        double s = zs_bench_field(line, "step"), t = zs_bench_field(line, "step_ms");
        if (s >= 3 && isfinite(t) && n < MAX_SAMPLES && r->samples < MAX_SAMPLES)
            ms[n++] = r->ms[r->samples++] = t;
    }
    fclose(f);
    if (n < 1) {
        fprintf(stderr, "bench_checkpoint: %s: %d lines, none of step 3 or later with step_ms\n",
                path, r->steps_read);
        return -1;
    }
    r->run_median_ms = zs_bench_median(ms, n);

    /* The final checkpoint must have been committed: DIR/latest names step-<steps>. */
    char want[64];
    snprintf(want, sizeof want, "step-%08ld", atol(steps));
    snprintf(path, sizeof path, "%s/latest", ck);
    r->latest[0] = '\0';
    if ((f = fopen(path, "r"))) {
        if (fgets(r->latest, sizeof r->latest, f))
            r->latest[strcspn(r->latest, "\n")] = '\0';
        fclose(f);
    }
    if (strcmp(r->latest, want) != 0) {
        fprintf(stderr,
                "bench_checkpoint: zshard launch with checkpoint.interval_steps %d ran, but %s "
                "%s%s, not %s: no final checkpoint was committed (do the servers and the "
                "coordinator write checkpoints yet?)\n",
                r->interval, path, r->latest[0] ? "names " : "is missing", r->latest, want);
        return -1;
    }
    snprintf(path, sizeof path, "%s/%s", ck, r->latest);
    dir_size(path, &r->bytes, &r->files);
    return rm_tree(ck) == 0 && rm_tree(out) == 0 ? 0 : -1;
}

/* What part 3 saw: when each moment came, in seconds after the SIGKILL. */
typedef struct {
    double gone_s;      /* the coordinator declared the server gone */
    double recovered_s; /* the new map went out (every server restored) */
    double step_s;      /* the first step finished after the recovery */
    double back_s;      /* the step in hand at the kill finished (the run is back where it was) */
    double step_ms;     /* the median step time before the kill */
    long killed_at;     /* the step reported last before the kill */
    long resumed_from;  /* the checkpoint the servers went back to */
} recovery_result;

/* The first line of the file at path, from byte *off on, that contains needle; advances *off
 * past the complete lines read.  1 if found. */
static int log_has(const char *path, long *off, const char *needle, char *line, size_t n)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    int found = 0;
    if (fseek(f, *off, SEEK_SET) == 0)
        while (!found && fgets(line, (int)n, f)) {
            if (!strchr(line, '\n'))
                break; /* a line still being written: read it whole next time */
            *off = ftell(f);
            found = strstr(line, needle) != NULL;
        }
    fclose(f);
    return found;
}

/*
 * Part 3: `zshard launch` (3 servers, 2 workers, heartbeats every 100 ms, timeout 1000 ms,
 * a checkpoint every 4 steps, with or without replicas) until step `at` is reported; then
 * SIGKILL server 2 and time, from the launcher's log, when the coordinator declares it gone,
 * when the recovery (or failover) sends the new map, and when a step finishes again.  The job
 * must then end well.
 */
static int recovery_run(const char *zshard, const char *dir, const char *data, const char *threads,
                        long at, int replicas, recovery_result *r)
{
    char cfg[4200], out[4200], log[4200], line[4096], steps[32];
    /* Files of their own per run: a log left by the other run must never be read as this
     * one's (its "server 2 (pid" and step lines would be). */
    const char *tag = replicas ? "-replica" : "";
    snprintf(cfg, sizeof cfg, "%s/recovery%s.json", dir, tag);
    snprintf(out, sizeof out, "%s/recovery%s-out", dir, tag);
    snprintf(log, sizeof log, "%s/recovery%s.log", dir, tag);
    snprintf(steps, sizeof steps, "%ld", at + 4);
    FILE *f = fopen(cfg, "w");
    if (!f) {
        fprintf(stderr, "bench_checkpoint: %s: %s\n", cfg, strerror(errno));
        return -1;
    }
    fprintf(f,
            "{\"seed\": 1337, \"train_batch_size\": 16, \"train_micro_batch_size_per_gpu\": 8,\n"
            " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001}},\n"
            " \"model\": {\"n_layer\": 6, \"n_head\": 6, \"n_embd\": 384, \"vocab_size\": 256, "
            "\"block_size\": 256},\n"
            " \"cluster\": {\"heartbeat_interval_ms\": 100, \"heartbeat_timeout_ms\": 1000},\n"
            " \"checkpoint\": {\"dir\": \"%s/recovery%s-ckpt\", \"interval_steps\": 4, "
            "\"replicas\": %d}}\n",
            dir, tag, replicas);
    if (fclose(f) != 0)
        return -1;
    pid_t pid = start_launch(zshard, cfg, data, steps, "3", threads, out, log);
    if (pid < 0)
        return -1;
    long off = 0;
    char want[64];
    snprintf(want, sizeof want, "step %5ld/", at);
    double t0 = now_s(), kill_at = 0, ms[64];
    int n = 0, st = 0, phase = 0, ok = 0;
    pid_t server = 0;
    r->gone_s = r->recovered_s = r->step_s = r->back_s = NAN;
    char back[64];
    snprintf(back, sizeof back, "step %5ld/", at + 1);
    r->killed_at = at;
    const char *const needles[] = {"step ", "is gone",
                                   replicas ? "failed over:" : "recovered:", "step ", back};
    while (waitpid(pid, &st, WNOHANG) == 0 && now_s() - t0 < LAUNCH_LIMIT_S && phase < 5) {
        long zero = 0;
        if (!server && log_has(log, &zero, "server 2 (pid ", line, sizeof line))
            server = (pid_t)atol(strstr(line, "server 2 (pid ") + 14);
        while (phase < 5 && log_has(log, &off, needles[phase], line, sizeof line)) {
            double t = now_s();
            int progress = strncmp(line, "step ", 5) == 0;
            if (phase == 0 && progress) {
                if (n < 64)
                    ms[n++] = t * 1e3; /* progress lines carry no step time: their arrivals do */
                if (strstr(line, want) && server > 0) {
                    kill(server, SIGKILL);
                    kill_at = now_s();
                    phase = 1;
                }
            } else if (phase == 1) {
                r->gone_s = t - kill_at;
                phase = 2;
            } else if (phase == 2) {
                r->recovered_s = t - kill_at;
                phase = 3;
            } else if (phase == 3 && progress) {
                r->step_s = t - kill_at;
                phase = 4;
                if (strstr(line, back)) {
                    r->back_s = r->step_s;
                    phase = 5;
                }
            } else if (phase == 4) {
                r->back_s = t - kill_at;
                phase = 5;
            }
        }
        usleep(2000);
    }
    if (phase < 5 && waitpid(pid, &st, WNOHANG) == 0)
        kill(pid, SIGTERM);
    if (waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0 && phase == 5)
        ok = 1;
    if (!ok) {
        fprintf(stderr, "bench_checkpoint: the recovery run failed (phase %d); the end of %s:\n",
                phase, log);
        tail_log(log, 10);
        return -1;
    }
    /* Step time before the kill: the gaps between progress lines 2..at. */
    double gaps[64];
    int g = 0;
    for (int i = 2; i < n && g < 64; i++)
        gaps[g++] = ms[i] - ms[i - 1];
    r->step_ms = g ? zs_bench_median(gaps, g) : NAN;
    r->resumed_from = replicas ? at : at / 4 * 4;
    char ck[4200];
    snprintf(ck, sizeof ck, "%s/recovery%s-ckpt", dir, tag);
    return rm_tree(out) == 0 && rm_tree(ck) == 0 ? 0 : -1;
}

/* ------------------------------------------------------------------------------------------ */

/* "1G", "512M", "4096K", "1000000": bytes, or -1. */
static long long parse_bytes(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    long long mul = 1;
    if (*end == 'K' || *end == 'k')
        mul = 1LL << 10, end++;
    else if (*end == 'M' || *end == 'm')
        mul = 1LL << 20, end++;
    else if (*end == 'G' || *end == 'g')
        mul = 1LL << 30, end++;
    if (end == s || *end || !(v > 0))
        return -1;
    return (long long)(v * (double)mul);
}

static const char usage[] =
    "usage: bench_checkpoint ZSHARD [--dir DIR] [--bytes N[K|M|G]] [--steps N] [--rounds R]\n"
    "                        [--threads T]\n";

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"dir", required_argument, NULL, 'd'},    {"bytes", required_argument, NULL, 'b'},
        {"steps", required_argument, NULL, 's'},  {"threads", required_argument, NULL, 't'},
        {"rounds", required_argument, NULL, 'r'}, {NULL, 0, NULL, 0}};
    const char *base = NULL, *steps = "12", *threads = "1";
    int rounds = 2;
    long long want_bytes = 1LL << 30;
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'd':
            base = optarg;
            break;
        case 'b':
            if ((want_bytes = parse_bytes(optarg)) < 12 * ZS_TENSOR_ALIGN) {
                fprintf(stderr, "bench_checkpoint: --bytes %s: not a size of at least %d\n", optarg,
                        12 * ZS_TENSOR_ALIGN);
                return 2;
            }
            break;
        case 's':
            steps = optarg;
            if (atoi(steps) != 0 && atoi(steps) < 3) {
                fprintf(stderr, "bench_checkpoint: --steps %s: 0 (skip) or at least 3\n", steps);
                return 2;
            }
            break;
        case 't':
            threads = optarg;
            break;
        case 'r':
            if ((rounds = atoi(optarg)) < 1) {
                fprintf(stderr, "bench_checkpoint: --rounds %s: at least 1\n", optarg);
                return 2;
            }
            break;
        default:
            fputs(usage, stderr);
            return 2;
        }
    }
    if (optind != argc - 1) {
        fputs(usage, stderr);
        return 2;
    }
    const char *zshard = argv[optind];
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0); /* each figure as soon as it is measured */

    /* Where to write: --dir, else $TMPDIR, else /var/tmp; never a filesystem in memory. */
    long ftype = 0;
    if (base) {
        int mem = in_memory(base, &ftype);
        if (mem != 0) {
            fprintf(stderr,
                    mem < 0 ? "bench_checkpoint: --dir %s: %s\n"
                            : "bench_checkpoint: --dir %s is on %s (memory): it would measure "
                              "memory, not a disk, and dd oflag=direct cannot write there; give "
                              "a directory on a disk\n",
                    base, mem < 0 ? strerror(errno) : fs_magic_name(ftype));
            return 2;
        }
    } else {
        const char *cand[] = {getenv("TMPDIR"), "/var/tmp"};
        for (int i = 0; i < 2 && !base; i++)
            if (cand[i] && *cand[i] && in_memory(cand[i], &ftype) == 0)
                base = cand[i];
        if (!base) {
            fprintf(stderr, "bench_checkpoint: $TMPDIR and /var/tmp are missing or in memory; "
                            "give --dir on a disk\n");
            return 2;
        }
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/zs_bench_ckpt_XXXXXX", base);
    if (!mkdtemp(dir)) {
        fprintf(stderr, "bench_checkpoint: mkdtemp %s: %s\n", dir, strerror(errno));
        return 1;
    }
    if (strpbrk(dir, "\"\\")) {
        fprintf(stderr,
                "bench_checkpoint: %s: a path with '\"' or '\\' does not fit the JSON "
                "config\n",
                dir);
        rmdir(dir);
        return 2;
    }

    /* The vector: about want_bytes of param + m + v, in whole 4 MiB shards. */
    size_t shard = SHARD_FLOATS;
    size_t n_shards = (size_t)llround((double)want_bytes / (12.0 * (double)shard));
    if (n_shards < 1) {
        n_shards = 1;
        shard = (size_t)want_bytes / 12 / ZS_TENSOR_ALIGN * ZS_TENSOR_ALIGN;
    }
    size_t M = n_shards * shard;
    uint64_t state_bytes = (uint64_t)M * 12;

    struct statvfs vfs;
    char ftname[128] = "?", src[1024] = "?", mnt[1024] = "?";
    if (mount_of(dir, ftname, sizeof ftname, src, sizeof src, mnt, sizeof mnt) != 0 &&
        fs_magic_name(ftype))
        snprintf(ftname, sizeof ftname, "%s", fs_magic_name(ftype));
    double free_gib =
        statvfs(dir, &vfs) == 0 ? (double)vfs.f_bavail * (double)vfs.f_frsize / (1 << 30) : NAN;
    printf("machine: %ld cores online, %.1f GiB memory\n", sysconf(_SC_NPROCESSORS_ONLN),
           (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE) / (1 << 30));
    printf("directory %s: %s (statfs f_type 0x%lx%s%s), %s mounted at %s, %.1f GiB free\n", dir,
           ftname, ftype, fs_magic_name(ftype) ? ": " : "",
           fs_magic_name(ftype) ? fs_magic_name(ftype) : "", src, mnt, free_gib);
    if (!(free_gib * (1 << 30) > (double)state_bytes + (1u << 30))) {
        fprintf(stderr, "bench_checkpoint: %s: %.1f GiB free, need %.1f GiB\n", dir, free_gib,
                ((double)state_bytes + (1u << 30)) / (1 << 30));
        rmdir(dir);
        return 1;
    }

    int rc = 1, keep = 0;
    /* Page-aligned, as the shard store allocates them (server/shardstore.c): the checkpoint
     * writer then takes its O_DIRECT path, as on a server. */
    float *p = NULL, *m = NULL, *v = NULL;
    if (posix_memalign((void **)&p, 4096, M * sizeof *p) != 0 ||
        posix_memalign((void **)&m, 4096, M * sizeof *m) != 0 ||
        posix_memalign((void **)&v, 4096, M * sizeof *v) != 0) {
        fprintf(stderr, "bench_checkpoint: out of memory for 3 x %zu floats\n", M);
        goto out;
    }
    /* Every page touched before the clock starts, one array after the other, as the store
     * zeroes each array it allocates: the order of first touch decides which physical pages
     * an array gets, and an O_DIRECT write hands the disk one segment per physically
     * contiguous run.  Filling the three in one loop interleaves their pages, and on this VM
     * the same writes then take about a quarter longer.  Then values like a run's (not zeros). */
    memset(p, 0, M * sizeof *p);
    memset(m, 0, M * sizeof *m);
    memset(v, 0, M * sizeof *v);
    for (size_t i = 0; i < M; i++) {
        p[i] = 0.02f * (float)((int)(i % 2001) - 1000) / 1000.0f;
        m[i] = 1e-4f * p[i];
        v[i] = 1e-8f * (float)(i % 97);
    }

    /* ---- 1. checkpoint write against dd ---- */
    cpu_mark mark = cpu_now();
    double ck_s[REPS], pl_s[REPS], dd_s[REPS];
    uint64_t ck_bytes = 0, pl_bytes = 0, dd_count = 0;
    for (int r = 0; r < REPS; r++) {
        /* Whichever writes first after dd runs into page-cache memory the machine has to find
         * afresh (on this VM up to 4x slower; the second reuses the pages the first just
         * freed), so the two take turns at going first. */
        for (int k = 0; k < 2; k++)
            if ((k == r % 2 &&
                 write_checkpoint(dir, r + 1, M, shard, p, m, v, &ck_bytes, &ck_s[r]) != 0) ||
                (k != r % 2 && write_plain(dir, M, shard, p, m, v, &pl_bytes, &pl_s[r]) != 0))
                goto out;
        dd_count = (ck_bytes + DD_BLOCK / 2) / DD_BLOCK;
        if (dd_count < 1)
            dd_count = 1;
        if (run_dd(dir, dd_count, &dd_s[r]) != 0)
            goto out;
    }
    uint64_t dd_bytes = dd_count * DD_BLOCK;
    double ck_gbs = (double)ck_bytes / min_of(ck_s, REPS) / 1e9;
    double pl_gbs = (double)pl_bytes / min_of(pl_s, REPS) / 1e9;
    double dd_gbs = (double)dd_bytes / min_of(dd_s, REPS) / 1e9;
    printf("1. checkpoint write: %zu shard files of %zu floats (param + exp_avg + exp_avg_sq, "
           "%.1f MiB of state), %.3f GB in all, written by zs_ckpt_write_shard one after another "
           "on 1 thread (as one server's writer), XXH3 and fsync of each file included\n",
           n_shards, shard, (double)state_bytes / (1 << 20), (double)ck_bytes / 1e9);
    printf("   plain: the same bytes from the same arrays into as many files, write(2) and fsync "
           "only (no checksum, rename or directory fsync)\n");
    printf("   limit: dd if=/dev/zero bs=4M count=%llu oflag=direct conv=fsync into the same "
           "directory, %.3f GB, timed from fork to exit\n",
           (unsigned long long)dd_count, (double)dd_bytes / 1e9);
    for (int r = 0; r < REPS; r++)
        printf("   run %d: checkpoint %.3f s (%.2f GB/s), plain %.3f s (%.2f GB/s), dd %.3f s "
               "(%.2f GB/s)\n",
               r + 1, ck_s[r], (double)ck_bytes / ck_s[r] / 1e9, pl_s[r],
               (double)pl_bytes / pl_s[r] / 1e9, dd_s[r], (double)dd_bytes / dd_s[r] / 1e9);
    printf("   checkpoint against plain: %.2f GB/s, %.2f GB/s, ratio %.2f (what zs_ckpt adds to "
           "buffered writes and fsync)\n",
           ck_gbs, pl_gbs, ck_gbs / pl_gbs);
    /* What the hashing would add if it ran before the writes instead of beside them. */
    double h0 = now_s();
    uint64_t sink = XXH3_64bits(p, M * sizeof *p) ^ XXH3_64bits(m, M * sizeof *m) ^
                    XXH3_64bits(v, M * sizeof *v);
    double hash_s = now_s() - h0;
    printf("   XXH3 of the three arrays on one core: %.3f s (%.1f GB/s; the writer hashes on a "
           "thread of its own while it writes)\n",
           hash_s, (double)state_bytes / hash_s / 1e9);
    (void)sink;
    print_others("during figure 1", mark);
    printf("bench_checkpoint write: %.2f GB/s, dd oflag=direct %.2f GB/s, ratio %.2f (target >= "
           "0.8; the best of %d runs each)\n",
           ck_gbs, dd_gbs, ck_gbs / dd_gbs, REPS);
    free(p), free(m), free(v);
    p = m = v = NULL;

    /* ---- 2. step time with a checkpoint every step against only the final one ---- */
    static launch_result runs[3] = {{.name = "final", .interval = 0},
                                    {.name = "every", .interval = 1},
                                    {.name = "replica", .interval = 0, .replicas = 1}};
    char step_line[512] = "step time not measured (--steps 0)";
    int step_ok = atoi(steps) == 0;
    if (atoi(steps) > 0) {
        char data[4200];
        snprintf(data, sizeof data, "%s/data.txt", dir);
        if (zs_bench_write_corpus(data) != 0) {
            fprintf(stderr, "bench_checkpoint: %s: %s\n", data, strerror(errno));
            goto out;
        }
        mark = cpu_now();
        printf("2. step time: zshard launch, 2 servers, 2 workers, %s kernel thread(s) per "
               "worker, model of deploy/configs/small-gpt.json (6 x 384, vocab 256, 2 chunks of "
               "8 x 256 tokens), %s steps x %d rounds, alternating; medians of step_ms of steps "
               "3..%s of all rounds\n",
               threads, steps, rounds, steps);
        int ok = 1;
        for (int round = 0; round < rounds && ok; round++)
            for (int k = 0; k < 3 && ok; k++) {
                launch_result *r = &runs[round % 2 ? 2 - k : k];
                if (launch_run(zshard, dir, data, steps, threads, round, r) != 0) {
                    ok = 0;
                    break;
                }
                printf("   round %d, checkpoint.interval_steps %d, replicas %d: %.0f ms/step (%d "
                       "steps, %d with a \"checkpoint\" field); last checkpoint %s: %d files, "
                       "%.1f MiB\n",
                       round + 1, r->interval, r->replicas, r->run_median_ms, r->steps_read,
                       r->ckpt_lines, r->latest, r->files, (double)r->bytes / (1 << 20));
            }
        if (ok) {
            double every = zs_bench_median(runs[1].ms, runs[1].samples),
                   none = zs_bench_median(runs[0].ms, runs[0].samples);
            printf("   a checkpoint every step writes %.0f MB per %.0f ms step: %.2f GB/s of the "
                   "%.2f GB/s one writer reached above\n",
                   (double)runs[1].bytes / 1e6, every, (double)runs[1].bytes / (every / 1e3) / 1e9,
                   ck_gbs);
            snprintf(step_line, sizeof step_line,
                     "step with a checkpoint every step %.0f ms, without %.0f ms, ratio %.2f "
                     "(target <= 1.05)",
                     every, none, every / none);
            print_others("during figure 2", mark);
            printf("bench_checkpoint step: %.0f ms/step with a checkpoint every step, %.0f "
                   "ms/step with only the final one, ratio %.2f (target <= 1.05)\n",
                   every, none, every / none);
            double rep = zs_bench_median(runs[2].ms, runs[2].samples);
            printf("bench_checkpoint replicas: %.0f ms/step with buddy replicas "
                   "(checkpoint.replicas 1: every gradient pushed twice, AdamW twice per server), "
                   "%.0f ms/step without, ratio %.2f (no target)\n",
                   rep, none, rep / none);
            step_ok = 1;
        } else {
            snprintf(step_line, sizeof step_line, "step time not measured (a run failed)");
            keep = 1;
        }
    }

    /* ---- 3. recovery from a server's SIGKILL, without and with a replica ----
     * Without: every server goes back to the newest checkpoint and the steps since run again.
     * With checkpoint.replicas 1: the lost server's replica takes over from memory
     * (docs/checkpoints.md, "Losing a server"). */
    char rec_line[512] = "recovery not measured (--steps 0)";
    if (atoi(steps) > 0) {
        char data[4200];
        snprintf(data, sizeof data, "%s/data.txt", dir);
        recovery_result rr[2];
        int ok = 1;
        for (int rep = 0; rep < 2 && ok; rep++) {
            printf("3%c. recovery %s: zshard launch, 3 servers, 2 workers, heartbeat 100 ms / "
                   "timeout 1000 ms, a checkpoint every 4 steps%s; server 2 SIGKILLed once step "
                   "7 is reported\n",
                   rep ? 'b' : 'a', rep ? "with a replica" : "without a replica",
                   rep ? ", checkpoint.replicas 1" : "");
            ok = recovery_run(zshard, dir, data, threads, 7, rep, &rr[rep]) == 0;
            if (ok)
                printf("   declared gone %.2f s after the SIGKILL (2 heartbeat intervals: 0.20 s), "
                       "new map out %.2f s, first step done again %.2f s, step %ld (the one in "
                       "hand at the kill) done %.2f s (%ld steps run again; a step took %.0f ms "
                       "before)\n",
                       rr[rep].gone_s, rr[rep].recovered_s, rr[rep].step_s, rr[rep].killed_at + 1,
                       rr[rep].back_s, rr[rep].killed_at - rr[rep].resumed_from, rr[rep].step_ms);
        }
        if (ok) {
            snprintf(rec_line, sizeof rec_line,
                     "recovery %.2f s (%.1f step times) without a replica, %.2f s (%.1f step "
                     "times) with one",
                     rr[0].step_s, rr[0].step_s / (rr[0].step_ms / 1e3), rr[1].step_s,
                     rr[1].step_s / (rr[1].step_ms / 1e3));
            printf("bench_checkpoint recovery: SIGKILL to a step done again: without a replica "
                   "%.2f s against a step of %.0f ms (ratio %.1f); with a replica %.2f s against "
                   "a step of %.0f ms (ratio %.1f); SIGKILL to the step in hand done: %.2f s "
                   "(ratio %.1f) without, %.2f s (ratio %.1f) with\n",
                   rr[0].step_s, rr[0].step_ms, rr[0].step_s / (rr[0].step_ms / 1e3), rr[1].step_s,
                   rr[1].step_ms, rr[1].step_s / (rr[1].step_ms / 1e3), rr[0].back_s,
                   rr[0].back_s / (rr[0].step_ms / 1e3), rr[1].back_s,
                   rr[1].back_s / (rr[1].step_ms / 1e3));
        } else {
            snprintf(rec_line, sizeof rec_line, "recovery not measured (the run failed)");
            keep = 1;
            step_ok = 0;
        }
    }

    printf("bench_checkpoint: write %.2f GB/s, dd oflag=direct %.2f GB/s, ratio %.2f (target >= "
           "0.8); %s; %s\n",
           ck_gbs, dd_gbs, ck_gbs / dd_gbs, step_line, rec_line);
    rc = step_ok ? 0 : 1;
out:
    free(p), free(m), free(v);
    if (keep)
        fprintf(stderr, "bench_checkpoint: kept %s for inspection\n", dir);
    else if (rm_tree(dir) != 0) {
        fprintf(stderr, "bench_checkpoint: cannot remove %s: %s\n", dir, strerror(errno));
        rc = 1;
    }
    return rc;
}
