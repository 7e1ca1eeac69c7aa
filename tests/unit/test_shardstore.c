/*
 * shardstore: chunk gradients pushed in random order, in random pieces, with duplicates, to
 * 1, 2 or 3 stores (servers) give bitwise the weights `zshard train` computes; stale, foreign
 * and out-of-range pushes change nothing.  A step whose gradient is not finite is skipped alike
 * by the trainer and the stores (weights, moments, and the bias correction of the steps after).
 * The same with the moments of every shard but each store's first on NVMe (server/nvme.h, a
 * directory under /tmp), for S = 1 (the fp32 master weights on NVMe too) and 2, and with the
 * published copy on NVMe too (S = 2 fp32, S = 1 bf16, whose 16-bit copy has a file of its own):
 * the same bits, moments included; and a byte flipped in the state file makes the next apply
 * fail, naming the offset, with the version unchanged.
 */
#include <stdlib.h>
#include <unistd.h>

#include "common/data.h"
#include "common/fp16.h"
#include "common/rng.h"
#include "kernels/adamw.h"
#include "kernels/gpt2.h"
#include "kernels/reduce.h"
#include "server/shardstore.h"
#include "tests/unit/fdutil.h"
#include "tests/unit/test.h"
#include "worker/trainer.h"

enum { MAXS = 3, STEPS = 3 };

/* Where the stores put their NVMe tier (NULL: every moment in RAM), and what else it holds
 * (ZS_STORE_TIER_*). */
static const char *tier_dir;
static int tier_what;

static uint64_t rnd_state = 12345;
static uint64_t rnd(void)
{
    rnd_state = zs_rng_mix(rnd_state);
    return rnd_state;
}

typedef struct {
    zs_shard_range *all; /* every shard, in vector order */
    int nshards;
    int *owner; /* server of each shard */
    zs_store *stores[MAXS];
    int S;
} cluster;

static void cluster_init(cluster *cl, const zs_tensor_table *tt, const zs_config *cfg, int S)
{
    size_t sf = cfg->cluster.shard_bytes / 4;
    cl->nshards = (int)((tt->total + sf - 1) / sf);
    cl->all = calloc((size_t)cl->nshards, sizeof *cl->all);
    cl->owner = calloc((size_t)cl->nshards, sizeof *cl->owner);
    cl->S = S;
    for (int i = 0; i < cl->nshards; i++) {
        cl->all[i] =
            (zs_shard_range){i, i * sf, (i + 1) * sf < tt->total ? (i + 1) * sf : tt->total};
        cl->owner[i] = i % S;
    }
    for (int s = 0; s < S; s++) {
        zs_shard_range mine[256];
        int n = 0;
        for (int i = 0; i < cl->nshards; i++)
            if (cl->owner[i] == s)
                mine[n++] = cl->all[i];
        if (tier_dir) { /* the first shard's moments in RAM, the others' on NVMe */
            zs_nvme_opts o = {
                .dir = tier_dir, .block_bytes = 8192, .queue_depth = 3, .owner = "test store"};
            CHECK_OK(zs_store_create_tiered(tt, cfg, mine, n, 2, 1, tier_what, &o, &cl->stores[s]));
        } else {
            CHECK_OK(zs_store_create(tt, cfg, mine, n, 2, &cl->stores[s]));
        }
        CHECK_OK(zs_store_init_seed(cl->stores[s], cfg->seed));
    }
}

static void cluster_free(cluster *cl)
{
    for (int s = 0; s < cl->S; s++)
        zs_store_free(cl->stores[s]);
    free(cl->all);
    free(cl->owner);
}

static void gather(const cluster *cl, float *full, size_t total)
{
    memset(full, 0, total * sizeof *full);
    for (int s = 0; s < cl->S; s++)
        for (int i = 0; i < zs_store_shard_count(cl->stores[s]); i++) {
            zs_shard_range r;
            const float *p = zs_store_params(cl->stores[s], i, &r);
            if (p) {
                memcpy(full + r.begin, p, (r.end - r.begin) * sizeof *p);
            } else { /* on NVMe: read back, checked */
                CHECK(tier_dir != NULL);
                CHECK_OK(zs_store_read_params(cl->stores[s], i, full + r.begin));
            }
        }
}

/* Pushes chunk c's gradient g (whole vector) as random pieces of each shard; repeats some. */
static void push_chunk(cluster *cl, long step, int c, const float *g)
{
    for (int i = 0; i < cl->nshards; i++) {
        zs_shard_range r = cl->all[i];
        size_t cur = r.begin;
        while (cur < r.end) {
            size_t len = 1 + rnd() % (r.end - r.begin);
            if (cur + len > r.end)
                len = r.end - cur;
            const char *why = NULL;
            int st = zs_store_push(cl->stores[cl->owner[i]], step, c, cur, len, g + cur, &why);
            CHECK_EQ_INT(st, ZS_STORE_OK);
            if (rnd() % 4 == 0) { /* a retried chunk's piece, possibly overlapping new data */
                size_t db = r.begin + rnd() % (cur + len - r.begin);
                st = zs_store_push(cl->stores[cl->owner[i]], step, c, db, cur + len - db, g + db,
                                   &why);
                CHECK_EQ_INT(st, ZS_STORE_DUPLICATE);
            }
            cur += len;
        }
    }
}

/*
 * A failover's stores: servers 0 and 1 merged into one store by moving their shards' arrays
 * (no copy): the weights and both moments are the trainer's; a shard moved away cannot be moved
 * again; the gradients of the step in hand stay behind.
 */
static void merge_stores(cluster *cl, const zs_trainer *tr, const zs_config *cfg, const float *g)
{
    zs_shard_range u[256];
    int n = 0;
    for (int i = 0; i < cl->nshards; i++)
        if (cl->owner[i] < 2)
            u[n++] = cl->all[i];
    /* Part of a step in hand on the source stores, which the merged store must not carry. */
    const char *why;
    zs_store *src0 = cl->stores[cl->owner[u[0].index]];
    CHECK_EQ_INT(zs_store_push(src0, STEPS, 0, u[0].begin, 4, g + u[0].begin, &why), ZS_STORE_OK);
    CHECK_EQ_INT(zs_store_push(src0, STEPS, 0, u[0].begin, 4, g + u[0].begin, &why),
                 ZS_STORE_DUPLICATE);
    zs_store *m;
    CHECK_OK(zs_store_create_empty(&tr->tt, cfg, u, n, 2, &m));
    for (int k = 0; k < n; k++) {
        zs_store *from = cl->stores[cl->owner[u[k].index]];
        int j = zs_store_find(from, u[k].index);
        CHECK(j >= 0);
        CHECK_OK(zs_store_move(m, k, from, j));
        if (k == 0)
            CHECK_FAILS_WITH(zs_store_move(m, k, from, j), "it has no state");
    }
    CHECK_EQ_INT(zs_store_find(m, cl->nshards + 7), -1);
    zs_store_set_version(m, STEPS);
    CHECK_EQ_INT(zs_store_version(m), STEPS);
    int same = 1;
    for (int k = 0; k < n; k++) {
        zs_shard_range r;
        float *p, *mm, *v;
        zs_store_state(m, k, &r, &p, &mm, &v);
        size_t b = r.begin, len = r.end - r.begin;
        same &= memcmp(p, tr->params + b, len * 4) == 0 && memcmp(mm, tr->m + b, len * 4) == 0 &&
                memcmp(v, tr->v + b, len * 4) == 0;
    }
    CHECK(same);
    /* The step in hand is dropped: the piece the source had is new to the merged store. */
    CHECK_EQ_INT(zs_store_push(m, STEPS, 0, u[0].begin, 4, g + u[0].begin, &why), ZS_STORE_OK);
    CHECK_EQ_INT(zs_store_push(m, STEPS, 0, u[0].begin, 4, g + u[0].begin, &why),
                 ZS_STORE_DUPLICATE);
    CHECK(!zs_store_complete(m));
    zs_store_free(m);
}

/* Sets element k of the weights to x in whichever store holds it. */
static void store_set(cluster *cl, size_t k, float x)
{
    for (int i = 0; i < cl->nshards; i++)
        if (k >= cl->all[i].begin && k < cl->all[i].end) {
            zs_store *st = cl->stores[cl->owner[i]];
            zs_shard_range r;
            float *p, *m, *v;
            int local = zs_store_find(st, i);
            zs_store_state(st, local, &r, &p, &m, &v);
            if (p) {
                p[k - r.begin] = x;
                continue;
            }
            /* Weights on NVMe: read, changed, written back. */
            float *w = malloc((r.end - r.begin) * sizeof *w);
            CHECK_OK(zs_store_read_params(st, local, w));
            w[k - r.begin] = x;
            CHECK_OK(zs_store_write_params(st, local, w));
            free(w);
        }
}

/* The stores' moments equal the trainer's, bit for bit (read from NVMe where they are). */
static int same_moments(const cluster *cl, const zs_trainer *tr)
{
    int same = 1;
    for (int s = 0; s < cl->S; s++)
        for (int i = 0; i < zs_store_shard_count(cl->stores[s]); i++) {
            zs_shard_range r;
            float *p, *m, *v;
            zs_store_state(cl->stores[s], i, &r, &p, &m, &v);
            size_t len = r.end - r.begin;
            CHECK((m != NULL) == zs_store_moments_in_ram(cl->stores[s], i));
            float *mm = malloc(len * 4), *vv = malloc(len * 4);
            CHECK_OK(zs_store_read_moments(cl->stores[s], i, mm, vv));
            same &= memcmp(mm, tr->m + r.begin, len * 4) == 0 &&
                    memcmp(vv, tr->v + r.begin, len * 4) == 0;
            free(mm);
            free(vv);
        }
    return same;
}

/* Flips the byte at `at` in every unnamed state file in tier_dir (each store has one); returns
 * how many. */
static int flip_in_state_files(off_t at)
{
    int flipped = 0, fd;
    for (int k = 0; (fd = zs_test_open_unnamed(tier_dir, k)) >= 0; k++) {
        unsigned char c = 0;
        if (pread(fd, &c, 1, at) == 1) {
            c ^= 1;
            flipped += pwrite(fd, &c, 1, at) == 1 && fsync(fd) == 0;
        }
        close(fd);
    }
    return flipped;
}

/* A byte of the tier's file flipped: the store's next apply fails and names the block; the
 * version stays. */
static void check_tier_corruption(cluster *cl, long step, int C, int bf16)
{
    zs_store *st = cl->stores[0];
    if (zs_store_shard_count(st) < 2)
        return;
    /* Shards of 5376 bytes: unit 0's arrays lie as in a checkpoint's shard file, the moments
     * from byte 1280 of its first page (after the weights' 5376 bytes) or, with the weights in
     * the tier, from byte 0 after them; either way byte 10800 is in its exp_avg_sq, and in its
     * second block of 8192 bytes. */
    CHECK(flip_in_state_files(10800) >= 1);
    float *g = calloc(65536, sizeof *g);
    for (int s = 0; s < cl->S; s++)
        for (int i = 0; i < zs_store_shard_count(cl->stores[s]); i++) {
            zs_shard_range r;
            zs_store_params(cl->stores[s], i, &r);
            for (int k = 0; k < C; k++)
                zs_store_push(cl->stores[s], step, k, r.begin, r.end - r.begin, g, NULL);
        }
    free(g);
    if (bf16 && (tier_what & ZS_STORE_TIER_PUBLISHED) && zs_store_shard_count(st) > 3) {
        /* The 16-bit copy's own file (2688 bytes a shard, 4096 with their padding): byte 10800
         * is in the 3rd tiered shard's, and a fetch's read of it fails, naming it. */
        zs_shard_range r;
        zs_store_params(st, 3, &r);
        uint16_t *copy = malloc((r.end - r.begin + 1) * sizeof *copy);
        char want[96];
        snprintf(want, sizeof want, "at offset 8192 (shard %d 16-bit copy, elements 0..1344)",
                 r.index);
        CHECK_FAILS_WITH(zs_store_read_published(st, 3, ZS_STORE_HALF, copy), want);
        free(copy);
    }
    CHECK(zs_store_complete(st));
    zs_shard_range first_tiered;
    zs_store_params(st, 1, &first_tiered);
    char want[96];
    snprintf(want, sizeof want, "at offset 8192 (shard %d exp_avg", first_tiered.index);
    CHECK_FAILS_WITH(zs_store_apply(st, 1e-3, 1.0, 0), want);
    CHECK_EQ_INT(zs_store_version(st), step);
}

static void run(int S, int bf16)
{
    zs_config cfg;
    zs_config_defaults(&cfg);
    cfg.model = (zs_model_config){
        .n_layer = 2, .n_head = 2, .n_embd = 32, .vocab_size = 64, .block_size = 16};
    cfg.micro_batch = 2;
    cfg.chunks = 4;
    cfg.train_batch_size = 8;
    cfg.cluster.shard_bytes = 4096 * 4 / 3 / 256 * 256; /* 5376 bytes: splits tensors */
    cfg.gradient_clipping = 0.5;                        /* small: clipping happens */
    cfg.bf16 = bf16;
    cfg.seed = 99;
    zs_dataset ds = {0};
    ds.ntokens = 4000;
    ds.tokens = malloc(ds.ntokens * 2);
    for (size_t i = 0; i < ds.ntokens; i++)
        ds.tokens[i] = (uint16_t)(zs_rng_u64(5, 0, i) % 64);
    ds.max_token = 63;

    zs_trainer tr;
    CHECK_OK(zs_trainer_init(&tr, &cfg, &ds, 2, NULL));
    cluster cl;
    cluster_init(&cl, &tr.tt, &cfg, S);
    size_t N = tr.tt.total;
    float *full = malloc(N * 4), *compute = malloc(N * 4);
    float *grads[4];
    for (int c = 0; c < 4; c++)
        grads[c] = malloc(N * 4);
    zs_gpt2 *model;
    CHECK_OK(zs_gpt2_create(&cfg.model, &tr.tt, 2, 16, 2, &model));
    int32_t in[32], tg[32];

    gather(&cl, full, N);
    CHECK(memcmp(full, tr.params, N * 4) == 0); /* the same initialization */
    /* Step POISON computes with a NaN weight (position 0 of wpe, which every sequence reads):
     * its gradient is NaN, and both sides must skip the update. */
    enum { POISON = 1 };
    size_t poison = zs_tensors_get(&tr.tt, 0, ZS_T_WPE)->offset + 1;
    float kept = 0;
    for (long step = 0; step < STEPS; step++) {
        if (step == POISON) {
            kept = tr.params[poison];
            store_set(&cl, poison, NAN);
            tr.params[poison] = NAN;
            tr.compute[poison] = NAN; /* the same array unless bf16 */
        }
        /* The worker side: each chunk's gradient from the published weights. */
        gather(&cl, full, N);
        for (size_t i = 0; i < N; i++)
            compute[i] = bf16 ? zs_bf16_to_f32(zs_f32_to_bf16(full[i])) : full[i];
        for (int c = 0; c < 4; c++) {
            zs_gpt2_flat flat = {.params = compute, .grads = grads[c]};
            zs_gpt2_io io = zs_gpt2_flat_io(&flat);
            zs_data_chunk(&ds, cfg.seed, step, c, 2, 16, in, tg);
            float loss;
            CHECK_OK(zs_gpt2_forward(model, &io, in, tg, 2, 16, &loss));
            CHECK_OK(zs_gpt2_backward(model, &io));
        }
        /* Faults that must change nothing. */
        const char *why;
        CHECK_EQ_INT(zs_store_push(cl.stores[0], step + 1, 0, cl.all[0].begin, 4, grads[0], &why),
                     ZS_STORE_STALE);
        CHECK_EQ_INT(zs_store_push(cl.stores[0], step, 4, cl.all[0].begin, 4, grads[0], &why),
                     ZS_STORE_BAD_CHUNK);
        CHECK_EQ_INT(zs_store_push(cl.stores[0], step, 0, N, 4, grads[0], &why),
                     ZS_STORE_BAD_RANGE);
        if (cl.nshards > 1) /* across a shard boundary */
            CHECK_EQ_INT(zs_store_push(cl.stores[cl.owner[0]], step, 0, cl.all[1].begin - 2, 4,
                                       grads[0], &why),
                         ZS_STORE_BAD_RANGE);
        /* Chunks in a random order. */
        int order[4] = {0, 1, 2, 3};
        for (int i = 3; i > 0; i--) {
            int j = (int)(rnd() % (uint64_t)(i + 1)), t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        for (int k = 0; k < 4; k++) {
            int all_done = 1;
            for (int s = 0; s < S; s++)
                all_done &= zs_store_complete(cl.stores[s]);
            CHECK(!all_done);
            push_chunk(&cl, step, order[k], grads[order[k]]);
        }
        for (int s = 0; s < S; s++)
            CHECK(zs_store_complete(cl.stores[s]));
        /* A late retry after completion: dropped. */
        CHECK_EQ_INT(zs_store_push(cl.stores[cl.owner[0]], step, 2, cl.all[0].begin, 8,
                                   grads[2] + cl.all[0].begin, &why),
                     ZS_STORE_DUPLICATE);
        /* The coordinator: partials summed in shard order. */
        double *part = calloc((size_t)cl.nshards, sizeof *part);
        for (int s = 0; s < S; s++) {
            int idx[256];
            double v[256];
            zs_store_partials(cl.stores[s], idx, v);
            for (int i = 0; i < zs_store_shard_count(cl.stores[s]); i++)
                part[idx[i]] = v[i];
        }
        double sum = 0;
        for (int i = 0; i < cl.nshards; i++)
            sum += part[i];
        free(part);
        double norm = zs_grad_norm(sum, 4);
        double clip = zs_clip_factor(norm, cfg.gradient_clipping);
        double lr = zs_config_lr(&cfg, (int)step);
        /* The coordinator's verdict: skip when the norm is not finite (clip factor 1 then). */
        int skip = !isfinite(norm);
        CHECK_EQ_INT(skip, step == POISON);
        for (int s = 0; s < S; s++)
            CHECK_OK(zs_store_apply(cl.stores[s], lr, skip ? 1.0 : clip, skip));
        float *m_before = NULL;
        if (skip) {
            m_before = malloc(N * 4);
            memcpy(m_before, tr.m, N * 4);
        }
        zs_step_stats stats;
        CHECK_OK(zs_trainer_step(&tr, &stats));
        CHECK_EQ_INT(stats.skipped, skip);
        if (skip) {
            CHECK(!isfinite(stats.grad_norm));
            CHECK(memcmp(m_before, tr.m, N * 4) == 0); /* the moments did not move */
            free(m_before);
        } else {
            CHECK(stats.clip < 1.0);
            CHECK(stats.grad_norm == norm);
        }
        CHECK(same_moments(&cl, &tr));
        gather(&cl, full, N);
        size_t diff = 0;
        while (diff < N && memcmp(&full[diff], &tr.params[diff], 4) == 0)
            diff++;
        if (diff < N)
            fprintf(stderr, "S=%d step %ld: element %zu: store %.9g trainer %.9g\n", S, step, diff,
                    full[diff], tr.params[diff]);
        CHECK_EQ_INT(diff, N);
        CHECK_EQ_INT(zs_store_version(cl.stores[0]), step + 1);
        CHECK_EQ_INT(tr.step, step + 1);
        if (step == POISON) {
            /* The skipped update left the NaN where it was; put the weight back, and the next
             * step (AdamW's t = 3 on both sides) must again agree bit for bit. */
            CHECK(isnan(tr.params[poison]));
            store_set(&cl, poison, kept);
            tr.params[poison] = kept;
            tr.compute[poison] = bf16 ? zs_bf16_to_f32(tr.bf16[poison]) : kept;
        }
    }
    /* Fetch side: the published bf16 and fp32 of a range (read from NVMe where they are). */
    const void *p = NULL;
    zs_shard_range r0 = cl.all[cl.nshards - 1];
    zs_store *last = cl.stores[cl.owner[cl.nshards - 1]];
    int where = zs_store_locate(last, r0.begin, r0.end - r0.begin, ZS_STORE_HALF, &p);
    uint16_t *copy = malloc((r0.end - r0.begin + 1) * sizeof *copy);
    if (where == ZS_STORE_ON_NVME) {
        CHECK(tier_what & ZS_STORE_TIER_PUBLISHED);
        zs_err e =
            zs_store_read_published(last, zs_store_find(last, r0.index), ZS_STORE_HALF, copy);
        if (bf16) {
            CHECK_OK(e);
            p = copy;
        } else { /* an fp32 job on NVMe keeps no 16-bit copy */
            CHECK(e != ZS_OK && strstr(zs_last_error(), "has no 16-bit copy"));
            p = NULL;
        }
    } else {
        CHECK_EQ_INT(where, ZS_STORE_OK);
    }
    int same = 1;
    for (size_t i = 0; p && i < r0.end - r0.begin; i++)
        same &= ((const uint16_t *)p)[i] == zs_f32_to_bf16(tr.params[r0.begin + i]);
    CHECK(same);
    free(copy);
    CHECK_EQ_INT(zs_store_locate(cl.stores[0], N + 5, 1, ZS_STORE_F32, &p), ZS_STORE_BAD_RANGE);
    if (S >= 2 && !tier_dir)
        merge_stores(&cl, &tr, &cfg, grads[0]);
    if (tier_dir)
        check_tier_corruption(&cl, zs_store_version(cl.stores[0]), cfg.chunks, bf16);

    zs_gpt2_free(model);
    for (int c = 0; c < 4; c++)
        free(grads[c]);
    free(full);
    free(compute);
    cluster_free(&cl);
    zs_trainer_free(&tr);
    free(ds.tokens);
}

/* The fp16 stores' job: a 1-layer model, C chunks. */
static zs_config fp16_config(int C, uint64_t seed)
{
    zs_config cfg;
    zs_config_defaults(&cfg);
    cfg.model = (zs_model_config){
        .n_layer = 1, .n_head = 2, .n_embd = 32, .vocab_size = 64, .block_size = 16};
    cfg.chunks = C;
    cfg.fp16.enabled = 1;
    cfg.seed = seed;
    return cfg;
}

/* An fp16 job's 16-bit copy is IEEE fp16 (zs_f32_to_f16 of the weights) after the seed, after
 * an update, and on NVMe when the published copy is there; F16 is what its fetches serve. */
static void test_fp16_copy(const char *dir)
{
    zs_config cfg = fp16_config(1, 7);
    CHECK_EQ_INT(zs_store_fetched_copy(&cfg), ZS_STORE_HALF);
    zs_tensor_table tt;
    CHECK_OK(zs_tensors_gpt2(&cfg.model, &tt));
    size_t N = tt.total, half = N / 2;
    zs_shard_range r[2] = {{0, 0, half}, {1, half, N}};
    for (int tiered = 0; tiered < 2; tiered++) {
        zs_store *st = NULL;
        zs_nvme_opts o = {.dir = dir, .block_bytes = 8192, .queue_depth = 3, .owner = "fp16"};
        if (tiered) /* shard 1's moments, weights and published copy on NVMe */
            CHECK_OK(
                zs_store_create_tiered(&tt, &cfg, r, 2, 1, 1, ZS_STORE_TIER_PUBLISHED, &o, &st));
        else
            CHECK_OK(zs_store_create(&tt, &cfg, r, 2, 1, &st));
        if (!st)
            return;
        CHECK_OK(zs_store_init_seed(st, cfg.seed));
        float *p = malloc(N * sizeof *p), *g = malloc(N * sizeof *g);
        uint16_t *copy = malloc((N + 2) * sizeof *copy);
        for (int round = 0; p && g && copy && round < 2; round++) {
            if (round == 1) { /* an update: large gradients move weights by about lr */
                for (size_t i = 0; i < N; i++)
                    g[i] = (float)((int)(zs_rng_u64(3, 1, i) % 2001) - 1000);
                for (int k = 0; k < 2; k++)
                    CHECK_EQ_INT(zs_store_push(st, 0, 0, r[k].begin, r[k].end - r[k].begin,
                                               g + r[k].begin, NULL),
                                 ZS_STORE_OK);
                CHECK(zs_store_complete(st));
                CHECK_OK(zs_store_apply(st, 1e-2, 1.0, 0));
            }
            size_t bad = 0;
            for (int k = 0; k < 2; k++) {
                size_t len = r[k].end - r[k].begin;
                CHECK_OK(zs_store_read_params(st, k, p));
                const void *at = NULL;
                zs_store_result w = zs_store_locate(st, r[k].begin, len, ZS_STORE_HALF, &at);
                if (w == ZS_STORE_ON_NVME) {
                    CHECK(tiered && k == 1);
                    CHECK_OK(zs_store_read_published(st, k, ZS_STORE_HALF, copy));
                    at = copy;
                } else {
                    CHECK_EQ_INT(w, ZS_STORE_OK);
                }
                for (size_t i = 0; at && i < len; i++)
                    bad += ((const uint16_t *)at)[i] != zs_f32_to_f16(p[i]);
            }
            if (bad)
                fprintf(stderr, "fp16 copy (%s, round %d): %zu elements are not fp16(weight)\n",
                        tiered ? "tiered" : "RAM", round, bad);
            CHECK_EQ_INT(bad, 0);
        }
        free(p);
        free(g);
        free(copy);
        zs_store_free(st);
    }
    zs_tensors_free(&tt);
}

/* F16 pushes (an fp16 job's) give the bits F32 pushes of the widened values give: chunks out
 * of order (the later ones staged, in pieces that overlap: duplicates dropped) and in order,
 * compared through the sums of squares and the weights after the update. */
static void test_f16_push(void)
{
    zs_config cfg = fp16_config(3, 3);
    zs_tensor_table tt;
    CHECK_OK(zs_tensors_gpt2(&cfg.model, &tt));
    size_t N = tt.total;
    zs_shard_range r[1] = {{0, 0, N}};
    zs_store *st[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        CHECK_OK(zs_store_create(&tt, &cfg, r, 1, 2, &st[k]));
        CHECK_OK(zs_store_init_seed(st[k], cfg.seed));
    }
    uint16_t *h = malloc(3 * N * sizeof *h);
    float *w = malloc(3 * N * sizeof *w), *p[2] = {malloc(N * 4), malloc(N * 4)};
    for (size_t i = 0; h && w && i < 3 * N; i++) {
        /* Scaled fp16 gradients: mostly ordinary, some subnormal, no inf or NaN. */
        uint64_t u = zs_rng_u64(9, 0, i);
        h[i] = (uint16_t)((u & 0x8000u) |
                          (u % 7 ? 0x3000u + (u >> 20) % 0x1800u : (u >> 20) % 0x400u));
        w[i] = zs_f16_to_f32(h[i]);
    }
    const int order[3] = {2, 0, 1};
    int idx[2];
    double ss[2];
    for (long step = 0; step < 2; step++) { /* step 1's first chunk replaces step 0's sum */
        for (int j = 0; st[0] && st[1] && h && w && j < 3; j++) {
            int c = order[j];
            const float *wc = w + ((c + step) % 3) * N;
            const uint16_t *hc = h + ((c + step) % 3) * N;
            /* Two overlapping pieces: [0, 2N/3) and [N/3, N). */
            size_t a = N / 3, b = 2 * N / 3;
            CHECK_EQ_INT(zs_store_push(st[0], step, c, 0, b, wc, NULL), ZS_STORE_OK);
            CHECK_EQ_INT(zs_store_push(st[0], step, c, a, N - a, wc + a, NULL), ZS_STORE_OK);
            CHECK_EQ_INT(zs_store_push_f16(st[1], step, c, 0, b, hc, NULL), ZS_STORE_OK);
            CHECK_EQ_INT(zs_store_push_f16(st[1], step, c, a, N - a, hc + a, NULL), ZS_STORE_OK);
            CHECK_EQ_INT(zs_store_push_f16(st[1], step, c, a, 8, hc + a, NULL), ZS_STORE_DUPLICATE);
        }
        CHECK(st[0] && st[1] && zs_store_complete(st[0]) && zs_store_complete(st[1]));
        for (int k = 0; st[0] && st[1] && k < 2; k++) {
            zs_store_partials(st[k], &idx[k], &ss[k]);
            CHECK_OK(zs_store_apply(st[k], 1e-3, 1.0 / 1024, 0));
            CHECK_OK(zs_store_read_params(st[k], 0, p[k]));
        }
        CHECK(memcmp(&ss[0], &ss[1], sizeof ss[0]) == 0 && isfinite(ss[0]) && ss[0] > 0);
        CHECK(p[0] && p[1] && memcmp(p[0], p[1], N * 4) == 0);
    }
    free(h);
    free(w);
    free(p[0]);
    free(p[1]);
    zs_store_free(st[0]);
    zs_store_free(st[1]);
    zs_tensors_free(&tt);
}

int main(void)
{
    for (int S = 1; S <= 3; S++)
        run(S, 0);
    run(2, 1);
    char dir[] = "/tmp/zs_test_shardstore_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    tier_dir = dir;
    tier_what = ZS_STORE_TIER_MASTER;
    run(1, 0);
    tier_what = 0;
    run(2, 0);
    tier_what = ZS_STORE_TIER_PUBLISHED; /* fp32: the weights are the published copy */
    run(2, 0);
    run(1, 1); /* bf16: the 16-bit copy in a file of its own */
    test_fp16_copy(dir);
    test_f16_push();
    rmdir(dir);
    return zs_test_result("test_shardstore");
}
