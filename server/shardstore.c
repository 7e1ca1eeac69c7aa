/*
 * shardstore: see shardstore.h for the invariants.  Bookkeeping per (shard, chunk) is the list
 * of element intervals received so far (sorted, merged): it tells duplicates from new data,
 * and when its total reaches the shard length the chunk is complete for that shard.
 */
#include "server/shardstore.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/ckpt.h"
#include "common/fp16.h"
#include "kernels/adamw.h"
#include "kernels/reduce.h"
#include "server/nvme.h"

typedef struct {
    size_t b, e; /* [b, e) relative to the shard's begin */
} interval;

typedef struct {
    interval *iv; /* received pieces, sorted by b, merged */
    int n, cap;
    size_t received; /* elements received */
    float *stage;    /* values of a chunk that is not yet next, [len]; NULL when not needed */
} chunk_state;

typedef struct {
    zs_shard_range r;
    size_t len;
    float *param, *m, *v, *acc; /* [len]; m and v NULL when the moments are on NVMe, param
                                   too when the master weights are */
    uint16_t *half;             /* [len] the 16-bit copy, in the store's half_fmt */
    int unit;                   /* its unit in the store's NVMe tier, -1: moments in RAM */
    int next;                   /* the chunk whose pieces go straight into acc */
    int in_ckpt;                /* its arrays on NVMe are in ck_dir's shard file (version
                                   ck_version), with their checksums ck_sums */
    uint64_t ck_sums[3];        /* zs_ckpt_array order */
    chunk_state *chunks;        /* [C] */
} shard;

struct zs_store {
    const zs_tensor_table *tt;
    zs_config cfg;
    int C;
    int threads;
    long version;
    int n;
    shard *shards;
    zs_nvme *nvme;     /* the moments of shards [resident, n); NULL when all are in RAM */
    int resident;      /* shards (from the first) whose moments are in RAM */
    int master;        /* the tier also holds those shards' fp32 master weights (array 2) */
    int published;     /* and the copy workers fetch: the weights (fp32 jobs) or, in ptier, the
                          16-bit copy */
    zs_nvme *ptier;    /* bf16 and fp16 jobs with the published copy on NVMe: that copy, one array a
                          shard of len / 2 floats (16-bit pairs) */
    uint16_t *scratch; /* [largest shard] the 16-bit copy of a shard on its way to ptier */
    char *ck_dir;      /* the checkpoint step directory zs_store_apply_into wrote to */
    long skipped;      /* fp16: updates skipped so far; AdamW's t is version + 1 - skipped */
    zs_half_format half_fmt; /* of the 16-bit copy: fp16 in fp16 jobs, else bf16 */
    long ck_version;         /* the version it holds */
};

static void *zalloc(size_t n)
{
    void *p = NULL;
    /* Page-aligned: a checkpoint writes the weights and moments straight from here with
     * O_DIRECT (common/ckpt.c), which wants aligned buffers. */
    if (posix_memalign(&p, 4096, n ? n : 64) != 0)
        return NULL;
    memset(p, 0, n);
    return p;
}

static void reset_chunk(chunk_state *cs)
{
    free(cs->iv);
    free(cs->stage);
    memset(cs, 0, sizeof *cs);
}

/* The arrays of one shard, zeroed; the moments only if they live in RAM. */
static int alloc_arrays(shard *s, int master_tiered, int published_tiered)
{
    if (s->unit < 0 || !master_tiered)
        s->param = zalloc(s->len * sizeof(float));
    if (s->unit < 0) {
        s->m = zalloc(s->len * sizeof(float));
        s->v = zalloc(s->len * sizeof(float));
    }
    s->acc = zalloc(s->len * sizeof(float));
    if (s->unit < 0 || !published_tiered)
        s->half = zalloc(s->len * sizeof(uint16_t));
    int param_ok = s->param || (s->unit >= 0 && master_tiered);
    int half_ok = s->half || (s->unit >= 0 && published_tiered);
    return param_ok && half_ok && (s->unit >= 0 || (s->m && s->v)) && s->acc ? 0 : -1;
}

static void free_arrays(shard *s)
{
    free(s->param);
    free(s->m);
    free(s->v);
    free(s->acc);
    free(s->half);
    s->param = s->m = s->v = s->acc = NULL;
    s->half = NULL;
}

/* A tier unit's own file is its shard file in a checkpoint (common/ckpt.h): the header, then
 * the weights, exp_avg and exp_avg_sq; the tier's arrays are exp_avg, exp_avg_sq and, with
 * master, the weights. */
static void ckpt_layout(zs_nvme_opts *o, int master)
{
    o->file_header = ZS_CKPT_DATA_OFFSET;
    o->file_lead = master ? 0 : 1;
    o->file_pos[0] = master ? ZS_CKPT_EXP_AVG : ZS_CKPT_EXP_AVG - 1;
    o->file_pos[1] = master ? ZS_CKPT_EXP_AVG_SQ : ZS_CKPT_EXP_AVG_SQ - 1;
    o->file_pos[2] = ZS_CKPT_PARAM;
}

uint64_t zs_store_tier_ram(const zs_shard_range *shards, int n, int what, int half)
{
    int published = (what & ZS_STORE_TIER_PUBLISHED) != 0;
    int master = (what & ZS_STORE_TIER_MASTER) || published;
    size_t *floats = malloc(((size_t)n + 1) * sizeof *floats), largest = 0;
    if (!floats)
        return UINT64_MAX;
    for (int i = 0; i < n; i++) {
        floats[i] = shards[i].end - shards[i].begin;
        largest = floats[i] > largest ? floats[i] : largest;
    }
    zs_nvme_opts o = {0};
    ckpt_layout(&o, master);
    uint64_t bytes = zs_nvme_slot_bytes(&o, master ? 3 : 2, floats, n);
    if (published && half) { /* the 16-bit copy's own tier (16-bit pairs), and its scratch */
        for (int i = 0; i < n; i++)
            floats[i] = (floats[i] + 1) / 2;
        zs_nvme_opts p = {0};
        bytes += zs_nvme_slot_bytes(&p, 1, floats, n) + ((uint64_t)largest + 1) * 2;
    }
    free(floats);
    return bytes;
}

static zs_err create(const zs_tensor_table *tt, const zs_config *cfg, const zs_shard_range *ranges,
                     int n, int threads, int arrays, int resident, int what,
                     const zs_nvme_opts *tier, zs_store **out)
{
    *out = NULL;
    for (int i = 0; i < n; i++) {
        const zs_shard_range *r = &ranges[i];
        if (r->begin >= r->end || r->end > tt->total || (i > 0 && r->begin < ranges[i - 1].end))
            return zs_error(ZS_ERR_INVALID,
                            "shard store: shard %d [%zu, %zu) is empty, overlaps "
                            "the previous one or exceeds the vector of %zu floats",
                            r->index, r->begin, r->end, tt->total);
    }
    zs_store *st = calloc(1, sizeof *st);
    if (!st)
        return zs_error(ZS_ERR_NOMEM, "shard store: out of memory");
    st->tt = tt;
    st->cfg = *cfg;
    st->half_fmt = cfg->fp16.enabled ? ZS_HALF_F16 : ZS_HALF_BF16;
    st->C = cfg->chunks;
    st->threads = threads > 0 ? threads : 1;
    st->n = n;
    st->resident = resident < n ? resident : n;
    st->published = (what & ZS_STORE_TIER_PUBLISHED) && st->resident < n;
    st->master = ((what & ZS_STORE_TIER_MASTER) || st->published) && st->resident < n;
    st->shards = calloc((size_t)(n ? n : 1), sizeof *st->shards);
    if (!st->shards)
        goto nomem;
    for (int i = 0; i < n; i++) {
        shard *s = &st->shards[i];
        s->r = ranges[i];
        s->len = s->r.end - s->r.begin;
        s->unit = i < st->resident ? -1 : i - st->resident;
        s->chunks = calloc((size_t)st->C, sizeof *s->chunks);
        if (!s->chunks || (arrays && alloc_arrays(s, st->master, st->published) != 0))
            goto nomem;
    }
    if (st->resident < n) {
        /* A fresh tier reads as zeros, as fresh moments are. */
        size_t *floats = malloc((size_t)(n - st->resident) * sizeof *floats);
        int *labels = malloc((size_t)(n - st->resident) * sizeof *labels);
        if (!floats || !labels) {
            free(floats);
            free(labels);
            goto nomem;
        }
        for (int i = st->resident; i < n; i++) {
            floats[i - st->resident] = st->shards[i].len;
            labels[i - st->resident] = st->shards[i].r.index;
        }
        zs_nvme_opts o = *tier;
        o.labels = labels;
        ckpt_layout(&o, st->master);
        zs_err e = zs_nvme_open(&o, n - st->resident, st->master ? 3 : 2, floats, &st->nvme);
        if (e == ZS_OK && st->published && zs_store_fetched_copy(cfg) == ZS_STORE_HALF) {
            /* The 16-bit copy in a file of its own: fetches read it while a checkpoint reads the
             * other, and each file has one reader at a time. */
            char owner[96];
            snprintf(owner, sizeof owner, "%s (16-bit copy)", tier->owner ? tier->owner : "nvme");
            size_t largest = 0;
            for (int i = st->resident; i < n; i++) {
                largest = st->shards[i].len > largest ? st->shards[i].len : largest;
                floats[i - st->resident] = (st->shards[i].len + 1) / 2;
            }
            o.owner = owner;
            o.file_header = 0; /* never in a checkpoint */
            o.file_lead = 0;
            memset(o.file_pos, 0, sizeof o.file_pos);
            o.names[0] = "16-bit copy";
            o.elem_bytes[0] = 2;
            e = zs_nvme_open(&o, n - st->resident, 1, floats, &st->ptier);
            st->scratch = e == ZS_OK ? zalloc((largest + 1) * sizeof(uint16_t)) : NULL;
            if (e == ZS_OK && !st->scratch)
                e = zs_error(ZS_ERR_NOMEM, "shard store: out of memory");
        }
        free(floats);
        free(labels);
        if (e != ZS_OK) {
            zs_store_free(st);
            return e;
        }
    }
    *out = st;
    return ZS_OK;
nomem:
    zs_store_free(st);
    {
        /* What the arrays needed: param, m, v, the accumulator (fp32) and the 16-bit copy. */
        size_t floats = 0;
        for (int i = 0; i < n; i++)
            floats += ranges[i].end - ranges[i].begin;
        double gib = arrays ? (double)floats * (4 * 4 + 2) / (double)(1u << 30) : 0.0;
        if (resident < n) /* the moments of the tiered shards are not in RAM */
            for (int i = resident; i < n; i++)
                gib -= (double)(ranges[i].end - ranges[i].begin) * 8 / (double)(1u << 30);
        return zs_error(ZS_ERR_NOMEM, "shard store: out of memory for %d shards (needs %.2f GiB)",
                        n, gib);
    }
}

zs_err zs_store_create(const zs_tensor_table *tt, const zs_config *cfg,
                       const zs_shard_range *ranges, int n, int threads, zs_store **out)
{
    return create(tt, cfg, ranges, n, threads, 1, n, 0, NULL, out);
}

zs_err zs_store_create_tiered(const zs_tensor_table *tt, const zs_config *cfg,
                              const zs_shard_range *ranges, int n, int threads, int resident,
                              int what, const zs_nvme_opts *tier, zs_store **out)
{
    if (resident < n && !tier)
        return zs_error(ZS_ERR_INVALID, "shard store: %d shards for NVMe, and no tier given",
                        n - resident);
    return create(tt, cfg, ranges, n, threads, 1, resident < 0 ? 0 : resident, what, tier, out);
}

zs_err zs_store_create_empty(const zs_tensor_table *tt, const zs_config *cfg,
                             const zs_shard_range *ranges, int n, int threads, zs_store **out)
{
    return create(tt, cfg, ranges, n, threads, 0, n, 0, NULL, out);
}

int zs_store_find(const zs_store *st, int index)
{
    int lo = 0, hi = st->n;
    while (lo < hi) { /* shards are sorted by begin, and so by index */
        int mid = lo + (hi - lo) / 2;
        if (st->shards[mid].r.index < index)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < st->n && st->shards[lo].r.index == index ? lo : -1;
}

zs_err zs_store_move(zs_store *dst, int i, zs_store *src, int j)
{
    shard *d = &dst->shards[i], *s = &src->shards[j];
    if (s->unit >= 0 || d->unit >= 0)
        return zs_error(ZS_ERR_INVALID,
                        "shard store: shard %d has its moments on NVMe and cannot move",
                        s->r.index);
    if (d->r.begin != s->r.begin || d->r.end != s->r.end || !s->param)
        return zs_error(ZS_ERR_INVALID,
                        "shard store: cannot move shard %d [%zu, %zu) into shard %d [%zu, %zu)%s",
                        s->r.index, s->r.begin, s->r.end, d->r.index, d->r.begin, d->r.end,
                        s->param ? "" : ": it has no state");
    free_arrays(d);
    d->param = s->param;
    d->m = s->m;
    d->v = s->v;
    d->acc = s->acc;
    d->half = s->half;
    s->param = s->m = s->v = s->acc = NULL;
    s->half = NULL;
    return ZS_OK;
}

zs_err zs_store_alloc(zs_store *st, int i)
{
    shard *s = &st->shards[i];
    if (s->param)
        return ZS_OK;
    if (alloc_arrays(s, 0, 0) != 0) {
        free_arrays(s);
        return zs_error(ZS_ERR_NOMEM, "shard store: out of memory for shard %d (%zu floats)",
                        s->r.index, s->len);
    }
    return ZS_OK;
}

void zs_store_set_version(zs_store *st, long version)
{
    st->version = version;
}

void zs_store_free(zs_store *st)
{
    if (!st)
        return;
    for (int i = 0; st->shards && i < st->n; i++) {
        shard *s = &st->shards[i];
        for (int c = 0; s->chunks && c < st->C; c++)
            reset_chunk(&s->chunks[c]);
        free(s->chunks);
        free_arrays(s);
    }
    zs_nvme_close(st->nvme);
    zs_nvme_close(st->ptier);
    free(st->scratch);
    free(st->ck_dir);
    free(st->shards);
    free(st);
}

/* Where shard s's 16-bit copy is made: in RAM, in the scratch on its way to ptier, or nowhere (an
 * fp32 job whose published copy, the weights, is on NVMe). */
static uint16_t *half_out(const zs_store *st, const shard *s)
{
    return s->half ? s->half : st->ptier ? st->scratch : NULL;
}

/* After half_out(st, s) was written: a copy bound for ptier goes there. */
static zs_err half_done(zs_store *st, const shard *s)
{
    if (s->half || !st->ptier)
        return ZS_OK;
    return zs_nvme_store(st->ptier, s->unit, 0, (const float *)st->scratch);
}

static zs_err half_from(zs_store *st, shard *s, const float *p)
{
    uint16_t *out = half_out(st, s);
    if (!out)
        return ZS_OK;
    for (size_t i = 0; i < s->len; i++)
        out[i] = st->half_fmt == ZS_HALF_F16 ? zs_f32_to_f16(p[i]) : zs_f32_to_bf16(p[i]);
    if (s->len % 2)
        out[s->len] = 0; /* the pad of the last 16-bit pair */
    return half_done(st, s);
}

static void refresh_half(zs_store *st, shard *s)
{
    if (s->param) /* weights on NVMe: their 16-bit copy was made when they were written there */
        half_from(st, s, s->param);
}

/* Shard i's master weights from p (len floats): into RAM, or into the NVMe tier; the 16-bit
 * copy follows. */
static zs_err set_params(zs_store *st, int i, const float *p)
{
    shard *s = &st->shards[i];
    s->in_ckpt = 0;
    ZS_CHECK(half_from(st, s, p));
    if (s->param) {
        if (s->param != p)
            memcpy(s->param, p, s->len * sizeof(float));
        return ZS_OK;
    }
    return zs_nvme_store(st->nvme, s->unit, 2, p);
}

zs_err zs_store_init_seed_shard(zs_store *st, int i, uint64_t seed)
{
    shard *s = &st->shards[i];
    if (s->param) {
        zs_tensors_init_gpt2(st->tt, seed, s->param, s->r.begin, s->r.end);
        refresh_half(st, s);
        return ZS_OK;
    }
    float *p = malloc(s->len * sizeof *p);
    if (!p)
        return zs_error(ZS_ERR_NOMEM, "shard store: out of memory for shard %d's weights",
                        s->r.index);
    zs_tensors_init_gpt2(st->tt, seed, p, s->r.begin, s->r.end);
    zs_err e = set_params(st, i, p);
    free(p);
    return e;
}

zs_err zs_store_init_seed(zs_store *st, uint64_t seed)
{
    for (int i = 0; i < st->n; i++)
        ZS_CHECK(zs_store_init_seed_shard(st, i, seed));
    return ZS_OK;
}

int zs_store_local_count(const zs_store *st)
{
    return st->n;
}

zs_err zs_store_load(zs_store *st, const float *full)
{
    for (int i = 0; i < st->n; i++)
        ZS_CHECK(set_params(st, i, full + st->shards[i].r.begin));
    return ZS_OK;
}

long zs_store_version(const zs_store *st)
{
    return st->version;
}

/* The shard holding [offset, offset + count) entirely, or NULL. */
static shard *find_shard(const zs_store *st, size_t offset, size_t count)
{
    int lo = 0, hi = st->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        shard *s = &st->shards[mid];
        if (offset < s->r.begin)
            hi = mid - 1;
        else if (offset >= s->r.end)
            lo = mid + 1;
        else
            return count <= s->r.end - offset ? s : NULL;
    }
    return NULL;
}

/* Adds [b, e) to the sorted, merged list (the caller made sure it overlaps nothing). */
static int add_interval(chunk_state *cs, size_t b, size_t e)
{
    int pos = 0;
    while (pos < cs->n && cs->iv[pos].b < b)
        pos++;
    if (cs->n == cs->cap) {
        int cap = cs->cap ? 2 * cs->cap : 8;
        interval *iv = realloc(cs->iv, (size_t)cap * sizeof *iv);
        if (!iv)
            return -1;
        cs->iv = iv;
        cs->cap = cap;
    }
    memmove(&cs->iv[pos + 1], &cs->iv[pos], (size_t)(cs->n - pos) * sizeof *cs->iv);
    cs->iv[pos] = (interval){b, e};
    cs->n++;
    /* Merge with neighbours that touch. */
    if (pos + 1 < cs->n && cs->iv[pos].e == cs->iv[pos + 1].b) {
        cs->iv[pos].e = cs->iv[pos + 1].e;
        memmove(&cs->iv[pos + 1], &cs->iv[pos + 2], (size_t)(cs->n - pos - 2) * sizeof *cs->iv);
        cs->n--;
    }
    if (pos > 0 && cs->iv[pos - 1].e == cs->iv[pos].b) {
        cs->iv[pos - 1].e = cs->iv[pos].e;
        memmove(&cs->iv[pos], &cs->iv[pos + 1], (size_t)(cs->n - pos - 1) * sizeof *cs->iv);
        cs->n--;
    }
    cs->received += e - b;
    return 0;
}

/* acc[b, e) = g (chunk 0) or += g (later chunks, on the store's threads): the one place a
 * gradient meets acc. */
static void accumulate(const zs_store *st, shard *s, int chunk, size_t b, size_t e, const float *g)
{
    if (chunk == 0)
        memcpy(s->acc + b, g, (e - b) * sizeof *g);
    else
        zs_accumulate(s->acc + b, g, e - b, st->threads);
}

/* Moves `next` past complete chunks, folding in what later chunks had staged. */
static void advance(const zs_store *st, shard *s, int C)
{
    while (s->next < C && s->chunks[s->next].received == s->len) {
        reset_chunk(&s->chunks[s->next]);
        s->next++;
        if (s->next == C)
            break;
        chunk_state *cs = &s->chunks[s->next];
        if (cs->stage) {
            for (int i = 0; i < cs->n; i++)
                accumulate(st, s, s->next, cs->iv[i].b, cs->iv[i].e, cs->stage + cs->iv[i].b);
            free(cs->stage);
            cs->stage = NULL;
        }
    }
}

/* Elements [b, e) of chunk `chunk` from an fp32 (f16 0) or fp16 piece g that starts at b: added
 * into the accumulator (chunk is next), or widened into the chunk's stage. */
static void put_piece(const zs_store *st, shard *s, int chunk, size_t b, size_t e, const void *g,
                      int f16)
{
    chunk_state *cs = &s->chunks[chunk];
    if (!f16 && chunk == s->next)
        accumulate(st, s, chunk, b, e, g);
    else if (!f16)
        memcpy(cs->stage + b, g, (e - b) * sizeof(float));
    else if (chunk == s->next)
        zs_accumulate_f16(s->acc + b, g, e - b, chunk == 0, st->threads);
    else
        zs_accumulate_f16(cs->stage + b, g, e - b, 1, st->threads);
}

static zs_store_result push(zs_store *st, long step, int chunk, size_t offset, size_t count,
                            const void *grad, int f16, const char **why)
{
    static const char *const reasons[] = {
        [ZS_STORE_OK] = "",
        [ZS_STORE_DUPLICATE] = "duplicate",
        [ZS_STORE_STALE] = "push for another step",
        [ZS_STORE_BAD_RANGE] = "range not inside one shard here",
        [ZS_STORE_BAD_CHUNK] = "chunk index out of range",
        [ZS_STORE_NOMEM] = "out of memory",
    };
    zs_store_result res = ZS_STORE_OK;
    shard *s = count ? find_shard(st, offset, count) : NULL;
    if (step != st->version)
        res = ZS_STORE_STALE;
    else if (chunk < 0 || chunk >= st->C)
        res = ZS_STORE_BAD_CHUNK;
    else if (!s)
        res = ZS_STORE_BAD_RANGE;
    if (res != ZS_STORE_OK) {
        if (why)
            *why = reasons[res];
        return res;
    }
    chunk_state *cs = &s->chunks[chunk];
    size_t b = offset - s->r.begin, e = b + count;
    if (chunk < s->next) {
        if (why)
            *why = reasons[ZS_STORE_DUPLICATE];
        return ZS_STORE_DUPLICATE;
    }
    /* Walk the gaps of [b, e) between received intervals: those elements are new. */
    size_t cur = b, fresh = 0;
    int i = 0;
    while (i < cs->n && cs->iv[i].e <= cur)
        i++;
    while (cur < e) {
        size_t gap_end = e;
        if (i < cs->n && cs->iv[i].b < e)
            gap_end = cs->iv[i].b > cur ? cs->iv[i].b : cur;
        if (gap_end > cur) {
            if (chunk != s->next && !cs->stage && !(cs->stage = malloc(s->len * sizeof(float)))) {
                if (why)
                    *why = "out of memory for a held chunk";
                return ZS_STORE_NOMEM;
            }
            put_piece(st, s, chunk, cur, gap_end,
                      (const char *)grad + (cur - b) * (f16 ? 2 : sizeof(float)), f16);
            if (add_interval(cs, cur, gap_end) != 0) {
                if (why)
                    *why = "out of memory for chunk bookkeeping";
                return ZS_STORE_NOMEM;
            }
            fresh += gap_end - cur;
            /* The list changed: find the first interval ending after gap_end again. */
            i = 0;
            while (i < cs->n && cs->iv[i].e <= gap_end)
                i++;
            cur = gap_end;
        } else {
            cur = cs->iv[i].e < e ? cs->iv[i].e : e;
            i++;
        }
    }
    if (fresh == 0) {
        if (why)
            *why = reasons[ZS_STORE_DUPLICATE];
        return ZS_STORE_DUPLICATE;
    }
    advance(st, s, st->C);
    return ZS_STORE_OK;
}

zs_store_result zs_store_push(zs_store *st, long step, int chunk, size_t offset, size_t count,
                              const float *grad, const char **why)
{
    return push(st, step, chunk, offset, count, grad, 0, why);
}

zs_store_result zs_store_push_f16(zs_store *st, long step, int chunk, size_t offset, size_t count,
                                  const uint16_t *grad, const char **why)
{
    return push(st, step, chunk, offset, count, grad, 1, why);
}

void zs_store_set_skipped(zs_store *st, long skipped)
{
    st->skipped = skipped;
}

int zs_store_complete(const zs_store *st)
{
    for (int i = 0; i < st->n; i++)
        if (st->shards[i].next < st->C)
            return 0;
    return 1;
}

int zs_store_chunk_complete(const zs_store *st, int chunk)
{
    for (int i = 0; i < st->n; i++) {
        const shard *s = &st->shards[i];
        if (chunk >= s->next && !(s->chunks && s->chunks[chunk].received == s->len))
            return 0;
    }
    return 1;
}

int zs_store_shard_count(const zs_store *st)
{
    return st->n;
}

void zs_store_partials(const zs_store *st, int *index, double *sumsq)
{
    for (int i = 0; i < st->n; i++) {
        index[i] = st->shards[i].r.index;
        sumsq[i] = zs_sumsq(st->shards[i].acc, st->shards[i].len, st->threads);
    }
}

typedef struct {
    zs_store *st;
    double lr;
    float scale;
} apply_ctx;

static void adamw_shard(const apply_ctx *c, shard *s, float *p, float *m, float *v)
{
    const zs_adamw_config *a = &c->st->cfg.adamw;
    zs_adamw_tensors(c->st->tt, s->r.begin, s->r.end, p, m, v, s->acc, half_out(c->st, s),
                     c->st->half_fmt, c->lr, a->beta1, a->beta2, a->eps, a->weight_decay,
                     c->st->version + 1 - c->st->skipped, c->scale, c->st->threads);
}

static zs_err apply_unit(void *ctx, int unit, float *const *arrays)
{
    apply_ctx *c = ctx;
    shard *s = &c->st->shards[c->st->resident + unit];
    /* AdamW leaves the padding between tensors alone: in the scratch that holds the previous
     * shard's copy, it must be zeros again, as it is in a shard's own 16-bit array. */
    if (!s->half && c->st->ptier)
        memset(c->st->scratch, 0, (s->len + 1) * sizeof *c->st->scratch);
    adamw_shard(c, s, s->param ? s->param : arrays[2], arrays[0], arrays[1]);
    /* The 16-bit copy of a shard whose published copy is on NVMe goes there now (its own file,
     * not the one the pipeline is moving). */
    return half_done(c->st, s);
}

/* The shard files of step_dir for the tier's units: to[u], or NULL when out of memory (then
 * the units go to the state file, and a checkpoint writes them the usual way). */
static char **ckpt_paths(const zs_store *st, const char *step_dir)
{
    int units = st->n - st->resident;
    char **to = calloc((size_t)units + 1, sizeof *to);
    char path[4096 + 64];
    for (int u = 0; to && u < units; u++) {
        if (zs_ckpt_shard_path(step_dir, st->shards[st->resident + u].r.index, path, sizeof path) !=
                ZS_OK ||
            !(to[u] = strdup(path))) {
            for (int k = 0; k < u; k++)
                free(to[k]);
            free(to);
            return NULL;
        }
    }
    return to;
}

static void free_paths(char **to, int n)
{
    for (int u = 0; to && u < n; u++)
        free(to[u]);
    free(to);
}

zs_err zs_store_apply(zs_store *st, double lr, double clip, int skip)
{
    return zs_store_apply_into(st, lr, clip, skip, NULL);
}

zs_err zs_store_apply_into(zs_store *st, double lr, double clip, int skip, const char *step_dir)
{
    if (!zs_store_complete(st))
        return zs_error(ZS_ERR_INVALID,
                        "shard store: apply at version %ld before all %d chunks "
                        "arrived",
                        st->version, st->C);
    apply_ctx ctx = {.st = st, .lr = lr, .scale = (float)(clip / st->C)};
    for (int i = 0; i < st->n; i++) {
        shard *s = &st->shards[i];
        s->next = 0;
        if (!skip && s->unit < 0)
            adamw_shard(&ctx, s, s->param, s->m, s->v);
    }
    /* The shards whose moments are on NVMe: read, updated and written back in a pipeline.
     * A failure there (a block that fails its checksum, EIO) leaves the version where it is,
     * and the shards not reached yet as they were. */
    for (int i = 0; i < st->n; i++)
        st->shards[i].in_ckpt = 0;
    if (!skip && st->nvme) {
        int units = st->n - st->resident;
        char **to = step_dir ? ckpt_paths(st, step_dir) : NULL;
        uint64_t(*sums)[ZS_NVME_MAX_ARRAYS] = to ? calloc((size_t)units, sizeof *sums) : NULL;
        int *written = to ? calloc((size_t)units, sizeof *written) : NULL;
        char *dir = to ? strdup(step_dir) : NULL;
        if (to && (!sums || !written || !dir)) {
            free_paths(to, units);
            to = NULL;
        }
        zs_err e = zs_nvme_run_to(st->nvme, apply_unit, &ctx, to, sums, written);
        for (int u = 0; e == ZS_OK && to && u < units; u++) {
            shard *s = &st->shards[st->resident + u];
            s->in_ckpt = written[u];
            s->ck_sums[ZS_CKPT_EXP_AVG] = sums[u][0];
            s->ck_sums[ZS_CKPT_EXP_AVG_SQ] = sums[u][1];
            s->ck_sums[ZS_CKPT_PARAM] = st->master ? sums[u][2] : 0;
        }
        if (e == ZS_OK && to) {
            free(st->ck_dir);
            st->ck_dir = dir;
            dir = NULL;
            st->ck_version = st->version + 1;
        }
        free(dir);
        free(written);
        free(sums);
        free_paths(to, units);
        ZS_CHECK(e);
    }
    st->version++;
    return ZS_OK;
}

zs_store_copy zs_store_fetched_copy(const zs_config *cfg)
{
    return cfg->bf16 || cfg->fp16.enabled ? ZS_STORE_HALF : ZS_STORE_F32;
}

zs_store_result zs_store_locate(const zs_store *st, size_t offset, size_t count, zs_store_copy copy,
                                const void **data)
{
    shard *s = count ? find_shard(st, offset, count) : NULL;
    if (!s || (copy != ZS_STORE_F32 && copy != ZS_STORE_HALF))
        return ZS_STORE_BAD_RANGE;
    size_t o = offset - s->r.begin;
    if ((copy == ZS_STORE_F32 && !s->param) || (copy == ZS_STORE_HALF && !s->half))
        return ZS_STORE_ON_NVME;
    *data = copy == ZS_STORE_F32 ? (const void *)(s->param + o) : (const void *)(s->half + o);
    return ZS_STORE_OK;
}

const float *zs_store_params(const zs_store *st, int i, zs_shard_range *range)
{
    if (i < 0 || i >= st->n)
        return NULL;
    if (range)
        *range = st->shards[i].r;
    return st->shards[i].param;
}

void zs_store_state(zs_store *st, int i, zs_shard_range *range, float **param, float **m, float **v)
{
    shard *s = &st->shards[i];
    *range = s->r;
    *param = s->param;
    *m = s->m;
    *v = s->v;
}

int zs_store_in_ckpt(const zs_store *st, int i, const char *step_dir, uint64_t xxh3[3],
                     int *param_in_file)
{
    const shard *s = &st->shards[i];
    if (!s->in_ckpt || !st->ck_dir || st->ck_version != st->version ||
        strcmp(st->ck_dir, step_dir) != 0)
        return 0;
    memcpy(xxh3, s->ck_sums, sizeof s->ck_sums);
    *param_in_file = st->master;
    return 1;
}

int zs_store_moments_in_ram(const zs_store *st, int i)
{
    return st->shards[i].unit < 0;
}

int zs_store_holds(const zs_store *st, size_t offset, size_t count)
{
    return count > 0 && find_shard(st, offset, count) != NULL;
}

zs_err zs_store_read_params(zs_store *st, int i, float *p)
{
    shard *s = &st->shards[i];
    if (s->param) {
        memcpy(p, s->param, s->len * sizeof(float));
        return ZS_OK;
    }
    return zs_nvme_load(st->nvme, s->unit, 2, 0, s->len, p);
}

zs_err zs_store_write_params(zs_store *st, int i, const float *p)
{
    return set_params(st, i, p);
}

zs_err zs_store_read_published(zs_store *st, int i, zs_store_copy copy, void *dst)
{
    shard *s = &st->shards[i];
    if (copy == ZS_STORE_F32)
        return zs_store_read_params(st, i, dst);
    if (s->half) {
        memcpy(dst, s->half, s->len * sizeof(uint16_t));
        return ZS_OK;
    }
    if (!st->ptier)
        return zs_error(ZS_ERR_INVALID,
                        "shard store: shard %d has no 16-bit copy (its fp32 weights are what this "
                        "job's workers fetch)",
                        s->r.index);
    /* Whole 16-bit pairs: dst must hold len rounded up to even. */
    return zs_nvme_load(st->ptier, s->unit, 0, 0, (s->len + 1) / 2, dst);
}

zs_nvme *zs_store_nvme(const zs_store *st)
{
    return st->nvme;
}

zs_err zs_store_read_moments(zs_store *st, int i, float *m, float *v)
{
    shard *s = &st->shards[i];
    if (s->unit < 0) {
        memcpy(m, s->m, s->len * sizeof(float));
        memcpy(v, s->v, s->len * sizeof(float));
        return ZS_OK;
    }
    ZS_CHECK(zs_nvme_load(st->nvme, s->unit, 0, 0, s->len, m));
    return zs_nvme_load(st->nvme, s->unit, 1, 0, s->len, v);
}

zs_err zs_store_write_state(zs_store *st, int i, const float *p, const float *m, const float *v)
{
    shard *s = &st->shards[i];
    if (s->unit < 0) {
        ZS_CHECK(zs_store_write_moments(st, i, m, v));
        return set_params(st, i, p);
    }
    s->in_ckpt = 0;
    ZS_CHECK(half_from(st, s, p));
    if (s->param && s->param != p)
        memcpy(s->param, p, s->len * sizeof(float));
    const float *arrays[ZS_NVME_MAX_ARRAYS] = {m, v, s->param ? NULL : p};
    return zs_nvme_store_arrays(st->nvme, s->unit, arrays);
}

zs_err zs_store_write_moments(zs_store *st, int i, const float *m, const float *v)
{
    shard *s = &st->shards[i];
    s->in_ckpt = 0;
    if (s->unit < 0) {
        memcpy(s->m, m, s->len * sizeof(float));
        memcpy(s->v, v, s->len * sizeof(float));
        return ZS_OK;
    }
    ZS_CHECK(zs_nvme_store(st->nvme, s->unit, 0, m));
    return zs_nvme_store(st->nvme, s->unit, 1, v);
}

void zs_store_restored(zs_store *st, long version)
{
    st->ck_version = -1;
    for (int i = 0; i < st->n; i++)
        refresh_half(st, &st->shards[i]);
    st->version = version;
}
