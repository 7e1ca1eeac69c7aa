/*
 * bench_nvme: a partition server's optimizer step with its AdamW moments on NVMe (the shard
 * store's NVMe tier, server/nvme.h) against what the disk does with the same bytes, measured in
 * the same run on the same file system:
 *   1. raw: a file as large as the tier's, written once (so that no read is served from
 *      unwritten extents), then read whole, written whole, and each block read and then
 *      written in one pass (the tier's pattern), each with O_DIRECT through io_uring
 *      with a registered file and buffers, in requests of the same block size and queue depth
 *      as the tier's;
 *   2. the apply: zs_store_apply over a store whose every shard keeps its moments on NVMe. It
 *      reads and writes both moments of every parameter (16 bytes), so its rate is 16 bytes a
 *      parameter over its time.  The limit is the faster of "read, then write" and "both at
 *      once" in (1): an apply that ran at the disk's speed would match it, one that ran at the
 *      sum of read, compute and write would not;
 *   3. the server's part of a step (one chunk's pushes into every shard, then the apply) with
 *      the moments on NVMe against all of it in RAM.
 * Each figure is the best of `repeats` after a warm-up.  The model is GPT-2 124M's layout
 * (124,439,808 parameters), or --small (2 layers, n_embd 256, vocab 8192) for a quick look.
 *
 * With --job ZSHARD, instead: 4. a whole step.  `zshard launch` (1 server, 1 worker, 2 threads
 * each) trains GPT-2 124M with bf16 weights for `steps` steps, twice in each of three ways,
 * alternating, in `dir`: with all state in RAM; with the moments and fp32 master weights on
 * NVMe under a budget of 0.36 of the state's 18 bytes a parameter; and with the bf16 copy
 * workers fetch there too (offload_param) under a budget of a third.  The median step_ms of
 * steps 2.. of each, their ratios to RAM's, and whether the models are bitwise equal.  Then
 * 5. the bytes a checkpoint every step writes to the disk (ckpt_every_step).
 *
 * usage: bench_nvme [--small] [dir=/tmp] [repeats=3] [block-KiB=1024] [queue-depth=8]
 *                   [threads=2]
 *        bench_nvme --job ZSHARD [dir=/tmp] [steps=4]
 */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/benchutil.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/tensors.h"
#include "server/shardstore.h"

typedef struct {
    int fd;
    struct io_uring ring;
    uint8_t *buf; /* qd blocks */
    size_t block;
    int qd;
    uint64_t bytes;
} raw_file;

/* One pass over [0, bytes): reads (mode 0), writes (1), or every block read and then written
 * (2: read block k, write block k, read block k + 1, ..., with qd requests in flight: the
 * tier's pattern, which moves the file twice).  Seconds, or -1 on an error (printed). */
static double raw_pass(raw_file *r, int mode)
{
    uint64_t nblocks = (r->bytes + r->block - 1) / r->block;
    uint64_t nreq = mode == 2 ? 2 * nblocks : nblocks, next = 0, done = 0;
    int inflight = 0;
    double t0 = zs_now_s();
    while (done < nreq) {
        while (inflight < r->qd && next < nreq) {
            struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
            uint64_t blk = mode < 2 ? next : next / 2;
            int write = mode == 1 || (mode == 2 && next % 2 == 1);
            uint64_t off = blk * r->block;
            size_t len = off + r->block <= r->bytes ? r->block : (size_t)(r->bytes - off);
            uint8_t *b = r->buf + (size_t)(next % (uint64_t)r->qd) * r->block;
            int idx = (int)(next % (uint64_t)r->qd);
            if (write)
                io_uring_prep_write_fixed(sqe, 0, b, (unsigned)len, off, idx);
            else
                io_uring_prep_read_fixed(sqe, 0, b, (unsigned)len, off, idx);
            sqe->flags |= IOSQE_FIXED_FILE;
            io_uring_sqe_set_data64(sqe, len);
            next++;
            inflight++;
        }
        io_uring_submit(&r->ring);
        struct io_uring_cqe *cqe;
        if (io_uring_wait_cqe(&r->ring, &cqe) < 0)
            return -1;
        if (cqe->res < 0 || (uint64_t)cqe->res != io_uring_cqe_get_data64(cqe)) {
            fprintf(stderr, "bench_nvme: raw %s: %s\n", mode == 1 ? "write" : "read",
                    cqe->res < 0 ? strerror(-cqe->res) : "short");
            return -1;
        }
        io_uring_cqe_seen(&r->ring, cqe);
        inflight--;
        done++;
    }
    return zs_now_s() - t0;
}

static int raw_open(raw_file *r, const char *dir, uint64_t bytes, size_t block, int qd)
{
    *r = (raw_file){.block = block, .qd = qd, .bytes = bytes};
    r->fd = open(dir, O_TMPFILE | O_RDWR | O_DIRECT, 0600);
    if (r->fd < 0) {
        fprintf(stderr, "bench_nvme: %s: O_TMPFILE | O_DIRECT: %s\n", dir, strerror(errno));
        return -1;
    }
    if (fallocate(r->fd, 0, 0, (off_t)bytes) != 0 ||
        posix_memalign((void **)&r->buf, 4096, block * (size_t)qd) != 0 ||
        io_uring_queue_init((unsigned)qd, &r->ring, 0) != 0) {
        fprintf(stderr, "bench_nvme: cannot set up the raw file of %llu bytes in %s\n",
                (unsigned long long)bytes, dir);
        close(r->fd);
        return -1;
    }
    memset(r->buf, 0x5a, block * (size_t)qd);
    /* Registered file and buffers, as the tier uses where it can: the limit is the disk's,
     * not the cost of pinning pages per request. */
    struct iovec iov[4096];
    for (int i = 0; i < qd; i++)
        iov[i] = (struct iovec){.iov_base = r->buf + (size_t)i * block, .iov_len = block};
    if (io_uring_register_files(&r->ring, &r->fd, 1) != 0 ||
        io_uring_register_buffers(&r->ring, iov, (unsigned)qd) != 0) {
        fprintf(stderr, "bench_nvme: cannot register the raw file and buffers with io_uring\n");
        return -1;
    }
    return 0;
}

static void raw_close(raw_file *r)
{
    io_uring_queue_exit(&r->ring);
    close(r->fd);
    free(r->buf);
}

/* One chunk's gradient pushed into every shard of st at its version (C = 1). */
static void push_all(zs_store *st, const float *g)
{
    for (int i = 0; i < zs_store_shard_count(st); i++) {
        zs_shard_range r;
        zs_store_params(st, i, &r);
        zs_store_push(st, zs_store_version(st), 0, r.begin, r.end - r.begin, g + r.begin, NULL);
    }
}

/* ---- 4. a whole step ---- */

/* GPT-2 124M with bf16 weights, one sequence of 1024 a step; with budget > 0, its moments and
 * master weights on NVMe in dir/nvme under that RAM budget, and with param the bf16 copy too. */
static int write_job_config(const char *path, const char *dir, uint64_t budget, int param,
                            const char *ckpt_dir)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fprintf(f, "{\"seed\": 7, \"train_batch_size\": 1, \"train_micro_batch_size_per_gpu\": 1, "
               "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.0006}}, "
               "\"bf16\": {\"enabled\": true}, \"model\": {\"n_layer\": 12, \"n_head\": 12, "
               "\"n_embd\": 768, \"vocab_size\": 50257, \"block_size\": 1024}");
    if (budget)
        fprintf(f,
                ", \"cluster\": {\"server_memory_bytes\": %llu}, \"zero_optimization\": "
                "{\"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"%s/nvme\"}%s}",
                (unsigned long long)budget, dir,
                param ? ", \"offload_param\": {\"device\": \"nvme\"}" : "");
    if (ckpt_dir)
        fprintf(f, ", \"checkpoint\": {\"dir\": \"%s\", \"interval_steps\": 1, \"keep\": 2}",
                ckpt_dir);
    fprintf(f, "}\n");
    return fclose(f) == 0 ? 0 : -1;
}

/* `zshard launch` of config for steps steps into out; appends step_ms of steps 2.. to ms[*n]. */
static int launch_job(const char *zshard, const char *config, const char *data, const char *out,
                      int steps, double *ms, int *n)
{
    char steps_s[16];
    snprintf(steps_s, sizeof steps_s, "%d", steps);
    char *argv[] = {
        (char *)zshard, "launch",    "--config", (char *)config, "--data", (char *)data, "--steps",
        steps_s,        "--servers", "1",        "--workers",    "1",      "--threads",  "2",
        "--out",        (char *)out, NULL};
    return zs_bench_launch(argv, out, 2, ms, n);
}

/* Bytes written to the block device that holds path since boot (/sys/dev/block/M:m/stat,
 * sectors of 512 bytes); -1 where path is not on one (a tmpfs, an overlay). */
static long long disk_written(const char *path)
{
    struct stat st;
    char p[96];
    if (stat(path, &st) != 0)
        return -1;
    snprintf(p, sizeof p, "/sys/dev/block/%u:%u/stat", major(st.st_dev), minor(st.st_dev));
    FILE *f = fopen(p, "r");
    unsigned long long v[7];
    int got = f ? fscanf(f, "%llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4],
                         &v[5], &v[6])
                : 0;
    if (f)
        fclose(f);
    return got == 7 ? (long long)(v[6] * 512) : -1;
}

/* Bytes of the files in directory dir (one checkpoint's step directory). */
static long long dir_bytes(const char *dir)
{
    char cmd[700];
    snprintf(cmd, sizeof cmd, "du -sb '%s' 2>/dev/null", dir);
    FILE *p = popen(cmd, "r");
    long long b = -1;
    if (!p || fscanf(p, "%lld", &b) != 1)
        b = -1;
    if (p)
        pclose(p);
    return b;
}

/*
 * 5. A checkpoint every step with the state on NVMe (budget as in 4): with the checkpoint
 * directory on the tier's file system, where the step's output goes straight into the
 * checkpoint's files, and on a tmpfs (/dev/shm), where the checkpoint reads the state back and
 * writes it again.  The bytes each run wrote to the disk, per step; the tmpfs run's plus the
 * checkpoint bytes it wrote to the tmpfs is what that usual path writes to a disk.  Also the
 * step times, and that both models equal the RAM run's (ram_out).
 */
static int ckpt_every_step(const char *zshard, const char *work, const char *data, uint64_t budget,
                           int steps, const char *ram_out)
{
    char cfg[2][400], out[2][400], ck[2][400], last[600], cmd[1000];
    snprintf(ck[0], sizeof ck[0], "%s/ck_same_fs", work);
    snprintf(ck[1], sizeof ck[1], "/dev/shm/zs_bench_nvme_ck_%d", (int)getpid());
    struct stat a, b;
    if (stat("/dev/shm", &b) != 0 || stat(work, &a) != 0 || a.st_dev == b.st_dev ||
        disk_written(work) < 0) {
        printf("5. checkpoints every step: not measured (needs %s on a block device and a tmpfs "
               "at /dev/shm)\n",
               work);
        return 0;
    }
    double ms[2][256];
    int n[2] = {0, 0}, same = 1;
    long long disk[2], ckpt = 0;
    for (int k = 0; k < 2; k++) {
        snprintf(cfg[k], sizeof cfg[k], "%s/ckpt%d.json", work, k);
        snprintf(out[k], sizeof out[k], "%s/ckpt%d", work, k);
        if (write_job_config(cfg[k], work, budget, 0, ck[k]) != 0)
            return 1;
        sync();
        long long before = disk_written(work);
        if (launch_job(zshard, cfg[k], data, out[k], steps, ms[k], &n[k]) != 0)
            return 1;
        sync();
        disk[k] = disk_written(work) - before;
        snprintf(cmd, sizeof cmd, "cmp -s %s/model.safetensors %s/model.safetensors", ram_out,
                 out[k]);
        same &= system(cmd) == 0;
    }
    snprintf(last, sizeof last, "%s/step-%08d", ck[1], steps);
    ckpt = dir_bytes(last);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", ck[1]);
    if (system(cmd) != 0)
        fprintf(stderr, "bench_nvme: could not remove %s\n", ck[1]);
    if (ckpt < 0)
        return 1;
    double per[2] = {(double)disk[0] / steps, (double)(disk[1] + ckpt * steps) / steps};
    double m0 = zs_bench_median(ms[0], n[0]), m1 = zs_bench_median(ms[1], n[1]);
    printf("5. a checkpoint every step, state on NVMe (%d steps): written to the disk per step "
           "%.0f MiB with the checkpoint on the tier's file system (the step's output goes "
           "straight into its files); %.0f MiB to the disk + %.0f MiB of checkpoint with it on a "
           "tmpfs, %.0f MiB a step that the usual path writes; ratio %.2f.  Median step_ms %.0f "
           "and %.0f (the tmpfs takes its checkpoint at RAM's speed); models equal RAM's: %s\n",
           steps, per[0] / (1 << 20), (double)disk[1] / steps / (1 << 20), (double)ckpt / (1 << 20),
           per[1] / (1 << 20), per[0] / per[1], m0, m1, same ? "yes" : "NO");
    printf("bench_nvme: checkpoint every step: %.0f MiB written a step in place, %.0f MiB the "
           "usual way, ratio %.2f\n",
           per[0] / (1 << 20), per[1] / (1 << 20), per[0] / per[1]);
    return same ? 0 : 1;
}

static int whole_step(const char *zshard, const char *dir, int steps)
{
    char work[256], cfg[3][400], data[400], out[3][400], cmd[1000];
    snprintf(work, sizeof work, "%s/bench_nvme_job_XXXXXX", dir);
    if (!mkdtemp(work) || zs_bench_job_secret(work, NULL) != 0) {
        fprintf(stderr, "bench_nvme: cannot make a directory in %s\n", dir);
        return 1;
    }
    snprintf(cmd, sizeof cmd, "%s/nvme", work);
    mkdir(cmd, 0700);
    /* Text to train on: 64 KiB of pseudo-random lowercase letters and spaces. */
    snprintf(data, sizeof data, "%s/data.txt", work);
    FILE *f = fopen(data, "w");
    for (uint64_t i = 0, x = 1; f && i < 65536; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        fputc((int)(x >> 59) < 26 ? 'a' + (int)(x >> 59) : ' ', f);
    }
    if (f)
        fclose(f);
    /* The state in RAM: fp32 weights, moments, accumulator (16 bytes) and the bf16 copy (2). */
    zs_config c;
    zs_config_defaults(&c);
    c.model = ZS_BENCH_GPT2_124M;
    zs_tensor_table tt;
    if (zs_tensors_gpt2(&c.model, &tt) != ZS_OK)
        return 1;
    static const char *const name[3] = {"ram", "nvme", "nvme_param"};
    uint64_t budget[3] = {0, (uint64_t)(0.36 * 18.0 * (double)tt.total),
                          (uint64_t)(18.0 * (double)tt.total / 3.0)};
    for (int k = 0; k < 3; k++) {
        snprintf(cfg[k], sizeof cfg[k], "%s/%s.json", work, name[k]);
        if (write_job_config(cfg[k], work, budget[k], k == 2, NULL) != 0)
            return 1;
    }
    double ms[3][256];
    int n[3] = {0, 0, 0};
    for (int round = 0; round < 2; round++)
        for (int j = 0; j < 3; j++) {
            int k = round % 2 ? 2 - j : j; /* the order alternates */
            snprintf(out[k], sizeof out[k], "%s/%s%d", work, name[k], round);
            if (launch_job(zshard, cfg[k], data, out[k], steps, ms[k], &n[k]) != 0)
                return 1;
        }
    int same = 1;
    for (int k = 1; k < 3; k++) {
        snprintf(cmd, sizeof cmd, "cmp -s %s/model.safetensors %s/model.safetensors", out[0],
                 out[k]);
        same &= system(cmd) == 0;
    }
    double m[3];
    for (int k = 0; k < 3; k++)
        m[k] = zs_bench_median(ms[k], n[k]);
    printf("4. a whole step (zshard launch, GPT-2 124M, bf16, 1 server, 1 worker, %d steps x 2 "
           "rounds each, alternating), median step_ms: %.0f with all state in RAM; %.0f with the "
           "moments and master weights on NVMe under a budget of %.0f MiB (0.36 of the state), "
           "ratio %.2f; %.0f with the bf16 copy there too under %.0f MiB (a third), ratio %.2f; "
           "models bitwise equal: %s\n",
           steps, m[0], m[1], (double)budget[1] / (1 << 20), m[1] / m[0], m[2],
           (double)budget[2] / (1 << 20), m[2] / m[0], same ? "yes" : "NO");
    printf("bench_nvme: step on NVMe %.0f ms (with offload_param %.0f ms), in RAM %.0f ms, ratios "
           "%.2f and %.2f\n",
           m[1], m[2], m[0], m[1] / m[0], m[2] / m[0]);
    same &= ckpt_every_step(zshard, work, data, budget[1], steps, out[0]) == 0;
    snprintf(cmd, sizeof cmd, "rm -rf %s", work);
    if (system(cmd) != 0)
        fprintf(stderr, "bench_nvme: could not remove %s\n", work);
    return same ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc > 2 && strcmp(argv[1], "--job") == 0)
        return whole_step(argv[2], argc > 3 ? argv[3] : "/tmp", argc > 4 ? atoi(argv[4]) : 4);
    int small = argc > 1 && strcmp(argv[1], "--small") == 0;
    int a0 = small ? 2 : 1;
    const char *dir = argc > a0 ? argv[a0] : "/tmp";
    int repeats = argc > a0 + 1 ? atoi(argv[a0 + 1]) : 3;
    size_t block = (argc > a0 + 2 ? (size_t)atoi(argv[a0 + 2]) : 1024) << 10;
    int qd = argc > a0 + 3 ? atoi(argv[a0 + 3]) : 8;
    int threads = argc > a0 + 4 ? atoi(argv[a0 + 4]) : 2;
    if (repeats < 1 || block < 4096 || block % 4096 || qd < 1 || qd > 4096 || threads < 1) {
        fprintf(stderr, "usage: bench_nvme [--small] [dir=/tmp] [repeats=3] [block-KiB=1024] "
                        "[queue-depth=8] [threads=2]\n");
        return 2;
    }
    zs_config cfg;
    zs_config_defaults(&cfg);
    cfg.model = small ? (zs_model_config){.n_layer = 2,
                                          .n_head = 4,
                                          .n_embd = 256,
                                          .vocab_size = 8192,
                                          .block_size = 256}
                      : ZS_BENCH_GPT2_124M;
    cfg.chunks = 1;
    cfg.micro_batch = cfg.train_batch_size = 1;
    zs_tensor_table tt;
    if (zs_tensors_gpt2(&cfg.model, &tt) != ZS_OK) {
        fprintf(stderr, "bench_nvme: %s\n", zs_last_error());
        return 1;
    }
    size_t N = tt.total;
    int n;
    zs_shard_range *ranges = zs_bench_shards(N, cfg.cluster.shard_bytes / sizeof(float), &n);
    uint64_t state_bytes = 8ull * N;
    printf("bench_nvme: %zu parameters in %d shards of %zu, moments %.2f GiB, in %s; requests of "
           "%zu KiB, queue depth %d, %d threads\n",
           N, n, cfg.cluster.shard_bytes / sizeof(float), (double)state_bytes / (1u << 30), dir,
           block >> 10, qd, threads);

    /* 1. Raw. */
    raw_file raw;
    if (raw_open(&raw, dir, state_bytes, block, qd) != 0)
        return 1;
    double best[3] = {1e30, 1e30, 1e30};
    if (raw_pass(&raw, 1) < 0) /* written once: reads come from the disk, not unwritten extents */
        return 1;
    for (int r = 0; r < repeats; r++)
        for (int mode = 0; mode < 3; mode++) {
            double t = raw_pass(&raw, mode);
            if (t < 0)
                return 1;
            best[mode] = t < best[mode] ? t : best[mode];
        }
    raw_close(&raw);
    double gb = (double)state_bytes / 1e9;
    printf("1. raw O_DIRECT (io_uring) on %.2f GB: read %.2f GB/s, write %.2f GB/s, each block "
           "read then written %.2f GB/s (both directions counted)\n",
           gb, gb / best[0], gb / best[1], 2 * gb / best[2]);
    /* Moving each byte in and out: a read pass then a write pass, or each block read and then
     * written, whichever is faster. */
    double limit_s = best[0] + best[1] < best[2] ? best[0] + best[1] : best[2];

    /* 2 and 3. The apply and the server's step, NVMe and RAM. */
    float *g = malloc(N * sizeof *g);
    for (size_t i = 0; i < N; i++)
        g[i] = (float)((i * 2654435761u) % 2001) * 1e-4f - 0.1f;
    zs_nvme_opts o = {.dir = dir, .block_bytes = block, .queue_depth = qd, .threads = threads};
    o.owner = "bench";
    zs_store *st[2] = {NULL, NULL}; /* 0: moments on NVMe, 1: in RAM */
    if (zs_store_create_tiered(&tt, &cfg, ranges, n, threads, 0, 0, &o, &st[0]) != ZS_OK ||
        zs_store_create(&tt, &cfg, ranges, n, threads, &st[1]) != ZS_OK) {
        fprintf(stderr, "bench_nvme: %s\n", zs_last_error());
        return 1;
    }
    double apply[2] = {1e30, 1e30}, step[2] = {1e30, 1e30};
    for (int k = 0; k < 2; k++)
        zs_store_init_seed(st[k], 1);
    for (int r = 0; r <= repeats; r++)
        for (int k = 0; k < 2; k++) {
            double t0 = zs_now_s();
            push_all(st[k], g);
            double t1 = zs_now_s();
            if (zs_store_apply(st[k], 1e-4, 1.0, 0) != ZS_OK) {
                fprintf(stderr, "bench_nvme: %s\n", zs_last_error());
                return 1;
            }
            double t2 = zs_now_s();
            if (r == 0)
                continue; /* warm-up: the first apply reads unwritten extents */
            apply[k] = t2 - t1 < apply[k] ? t2 - t1 : apply[k];
            step[k] = t2 - t0 < step[k] ? t2 - t0 : step[k];
        }
    zs_nvme_stats ns = zs_nvme_get_stats(zs_store_nvme(st[0]));
    int same = 1;
    for (int i = 0; i < n && same; i++) {
        zs_shard_range r;
        const float *p0 = zs_store_params(st[0], i, &r), *p1 = zs_store_params(st[1], i, NULL);
        same = memcmp(p0, p1, (r.end - r.begin) * sizeof(float)) == 0;
    }
    double rate = 2.0 * gb / apply[0], limit = 2.0 * gb / limit_s;
    printf("2. apply with the moments on NVMe: %.1f ms, %.2f GB/s moved (16 B a parameter); the "
           "disk read then wrote them in %.1f ms, or read and wrote each block in %.1f ms: limit "
           "%.2f GB/s; "
           "ratio %.2f (target >= 0.8)\n",
           apply[0] * 1e3, rate, (best[0] + best[1]) * 1e3, best[2] * 1e3, limit, rate / limit);
    printf(
        "   since the tier opened: %.0f ms waiting for the disk, %.0f ms in AdamW, %.2f GB read, "
        "%.2f GB written; O_DIRECT %d, registered buffers %d\n",
        ns.wait_ms, ns.work_ms, (double)ns.bytes_read / 1e9, (double)ns.bytes_written / 1e9,
        zs_nvme_direct(zs_store_nvme(st[0])), zs_nvme_fixed_buffers(zs_store_nvme(st[0])));
    printf("3. the server's part of a step (pushes of one chunk, then the apply): moments on NVMe "
           "%.1f ms, in RAM %.1f ms (apply alone %.1f ms); ratio %.2f; weights bitwise equal: %s\n",
           step[0] * 1e3, step[1] * 1e3, apply[1] * 1e3, step[0] / step[1], same ? "yes" : "NO");
    printf("bench_nvme: apply %.2f GB/s, limit %.2f GB/s, ratio %.2f\n", rate, limit, rate / limit);
    zs_store_free(st[0]);
    zs_store_free(st[1]);
    free(g);
    free(ranges);
    return same ? 0 : 1;
}
