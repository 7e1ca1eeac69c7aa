/*
 * shardmap: the cut of the flat vector into shards and their spread over servers.  Coverage
 * and contiguity, balance within one shard's floats, the same boundaries for every server
 * count, range splitting on and inside shard boundaries, S = 1, 2, 3 with shard sizes that
 * split tensors, the greedy rule the assignment stands for, and the refusals.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/shardmap.h"
#include "common/tensors.h"
#include "proto/shardmap_msg.h"
#include "tests/unit/test.h"

/* Checks every invariant of a built map; returns the number of failed checks. */
static void check_map(const zs_shardmap *map, size_t total, size_t shard_floats, int S)
{
    size_t n = (total + shard_floats - 1) / shard_floats;
    CHECK_EQ_INT(map->total, total);
    CHECK_EQ_INT(map->shard_floats, shard_floats);
    CHECK_EQ_INT(map->n_shards, n);
    CHECK_EQ_INT(map->n_servers, S);
    int contiguous = 1, sized = 1, fixed = 1, ranged = 1;
    size_t end = 0;
    for (int i = 0; i < map->n_shards; i++) {
        const zs_shard *sh = &map->shards[i];
        contiguous &= sh->begin == end;
        sized &=
            sh->end > sh->begin && (sh->end - sh->begin == shard_floats ||
                                    (i == map->n_shards - 1 && sh->end - sh->begin < shard_floats));
        fixed &= sh->begin == (size_t)i * shard_floats; /* boundaries from the shard size alone */
        ranged &= sh->server >= 0 && sh->server < S;
        end = sh->end;
    }
    CHECK(contiguous);
    CHECK(sized);
    CHECK(fixed);
    CHECK(ranged);
    CHECK_EQ_INT(end, total);

    /* Balance: floats per server within one shard of each other, and adding up to total. */
    size_t sum = 0, lo = SIZE_MAX, hi = 0;
    for (int s = 0; s < S; s++) {
        sum += map->server_floats[s];
        lo = map->server_floats[s] < lo ? map->server_floats[s] : lo;
        hi = map->server_floats[s] > hi ? map->server_floats[s] : hi;
    }
    CHECK_EQ_INT(sum, total);
    CHECK(hi - lo <= shard_floats);
    CHECK(lo > 0);

    /* The per-server lists: every shard once, on its own server, ascending. */
    int *seen = calloc((size_t)map->n_shards, sizeof *seen);
    int lists_ok = 1, listed = 0;
    for (int s = 0; s < S; s++) {
        int count;
        const int *list = zs_shardmap_server_shards(map, s, &count);
        size_t floats = 0;
        for (int k = 0; k < count; k++) {
            int i = list[k];
            lists_ok &= i >= 0 && i < map->n_shards && map->shards[i].server == s && !seen[i];
            lists_ok &= k == 0 || list[k - 1] < i;
            if (i >= 0 && i < map->n_shards) {
                seen[i] = 1;
                floats += map->shards[i].end - map->shards[i].begin;
            }
        }
        lists_ok &= floats == map->server_floats[s];
        listed += count;
    }
    CHECK(lists_ok);
    CHECK_EQ_INT(listed, map->n_shards);
    free(seen);

    /* The greedy rule written out: each shard to the least-loaded server, ties lowest index. */
    size_t *load = calloc((size_t)S, sizeof *load);
    int greedy = 1;
    for (int i = 0; i < map->n_shards; i++) {
        int best = 0;
        for (int s = 1; s < S; s++)
            if (load[s] < load[best])
                best = s;
        greedy &= map->shards[i].server == best;
        load[best] += map->shards[i].end - map->shards[i].begin;
    }
    CHECK(greedy);
    free(load);
}

/* Splits [b, e) and checks the pieces tile it, each inside its shard and on its server. */
static int check_split(const zs_shardmap *map, size_t b, size_t e)
{
    int max = zs_shardmap_count_pieces(map, b, e);
    zs_shard_piece *p = malloc((size_t)(max > 0 ? max : 1) * sizeof *p);
    int n = -1, ok = 1;
    CHECK_OK(zs_shardmap_split(map, b, e, p, max, &n));
    ok &= n == max;
    size_t x = b;
    for (int k = 0; k < n; k++) {
        const zs_shard *sh = &map->shards[p[k].shard];
        ok &= p[k].begin == x && p[k].end > p[k].begin;
        ok &= p[k].begin >= sh->begin && p[k].end <= sh->end;
        ok &= p[k].server == sh->server;
        ok &= zs_shardmap_shard_of(map, p[k].begin) == p[k].shard;
        ok &= zs_shardmap_shard_of(map, p[k].end - 1) == p[k].shard;
        /* Only the first and last piece may be partial shards. */
        if (k > 0 && k < n - 1)
            ok &= p[k].begin == sh->begin && p[k].end == sh->end;
        x = p[k].end;
    }
    ok &= b == e ? n == 0 : x == e;
    free(p);
    return ok;
}

static void test_cut_and_balance(void)
{
    const size_t totals[] = {64, 1000, 4096, 4097, 65536 + 640, 1234567};
    const size_t shard_bytes[] = {256, 4096, 16384, 40960};
    for (size_t t = 0; t < sizeof totals / sizeof *totals; t++) {
        for (size_t b = 0; b < sizeof shard_bytes / sizeof *shard_bytes; b++) {
            size_t sf = shard_bytes[b] / 4;
            size_t n = (totals[t] + sf - 1) / sf;
            zs_shardmap ref;
            int have_ref = 0;
            for (int S = 1; S <= 7 && (size_t)S <= n; S++) {
                zs_shardmap map;
                zs_err r = zs_shardmap_build(totals[t], shard_bytes[b], S, NULL, &map);
                CHECK_OK(r);
                if (r != ZS_OK)
                    continue;
                check_map(&map, totals[t], sf, S);
                CHECK_EQ_INT(map.server_ids[S - 1], S); /* default ids 1..S */
                /* The same boundaries whatever S. */
                if (!have_ref) {
                    ref = map;
                    have_ref = 1;
                    continue;
                }
                int same = map.n_shards == ref.n_shards;
                for (int i = 0; same && i < map.n_shards; i++)
                    same = map.shards[i].begin == ref.shards[i].begin &&
                           map.shards[i].end == ref.shards[i].end;
                CHECK(same);
                zs_shardmap_free(&map);
            }
            if (have_ref)
                zs_shardmap_free(&ref);
        }
    }
}

static void test_lookup_and_split(void)
{
    /* 5 shards of 1024 floats and a last one of 100; 2 servers. */
    zs_shardmap map;
    CHECK_OK(zs_shardmap_build(5 * 1024 + 100, 4096, 2, NULL, &map));
    CHECK_EQ_INT(map.n_shards, 6);
    CHECK_EQ_INT(zs_shardmap_shard_of(&map, 0), 0);
    CHECK_EQ_INT(zs_shardmap_shard_of(&map, 1023), 0);
    CHECK_EQ_INT(zs_shardmap_shard_of(&map, 1024), 1);
    CHECK_EQ_INT(zs_shardmap_shard_of(&map, 5 * 1024 + 99), 5);
    CHECK_EQ_INT(zs_shardmap_shard_of(&map, 5 * 1024 + 100), -1);
    CHECK_EQ_INT(map.shards[5].end - map.shards[5].begin, 100);
    CHECK_EQ_INT(map.shards[5].server, 1);
    CHECK_EQ_INT(map.server_floats[0], 3 * 1024);
    CHECK_EQ_INT(map.server_floats[1], 2 * 1024 + 100);

    zs_shard_piece p[8];
    int n;
    /* On boundaries: exactly shards 1 and 2. */
    CHECK_OK(zs_shardmap_split(&map, 1024, 3072, p, 8, &n));
    CHECK_EQ_INT(n, 2);
    CHECK_EQ_INT(p[0].shard, 1);
    CHECK_EQ_INT(p[0].begin, 1024);
    CHECK_EQ_INT(p[0].end, 2048);
    CHECK_EQ_INT(p[0].server, 1);
    CHECK_EQ_INT(p[1].shard, 2);
    CHECK_EQ_INT(p[1].end, 3072);
    CHECK_EQ_INT(p[1].server, 0);
    /* Inside one shard. */
    CHECK_OK(zs_shardmap_split(&map, 2100, 2200, p, 8, &n));
    CHECK_EQ_INT(n, 1);
    CHECK_EQ_INT(p[0].shard, 2);
    CHECK_EQ_INT(p[0].begin, 2100);
    CHECK_EQ_INT(p[0].end, 2200);
    /* Across boundaries, partial at both ends. */
    CHECK_OK(zs_shardmap_split(&map, 1000, 4100, p, 8, &n));
    CHECK_EQ_INT(n, 5);
    CHECK_EQ_INT(p[0].begin, 1000);
    CHECK_EQ_INT(p[0].end, 1024);
    CHECK_EQ_INT(p[4].shard, 4);
    CHECK_EQ_INT(p[4].begin, 4096);
    CHECK_EQ_INT(p[4].end, 4100);
    /* The whole vector; the tail. */
    CHECK_OK(zs_shardmap_split(&map, 0, map.total, p, 8, &n));
    CHECK_EQ_INT(n, 6);
    CHECK_OK(zs_shardmap_split(&map, map.total - 1, map.total, p, 8, &n));
    CHECK_EQ_INT(n, 1);
    CHECK_EQ_INT(p[0].shard, 5);
    /* Empty, outside, too many pieces. */
    CHECK_OK(zs_shardmap_split(&map, 500, 500, p, 8, &n));
    CHECK_EQ_INT(n, 0);
    CHECK_EQ_INT(zs_shardmap_count_pieces(&map, 500, 500), 0);
    CHECK_FAILS_WITH(zs_shardmap_split(&map, 0, map.total + 1, p, 8, &n),
                     "range [0, 5221) is not inside [0, 5220)");
    CHECK_FAILS_WITH(zs_shardmap_split(&map, 10, 5, p, 8, &n), "range [10, 5)");
    CHECK_FAILS_WITH(zs_shardmap_split(&map, 0, map.total, p, 3, &n), "has 6 pieces, room for 3");
    CHECK_EQ_INT(n, 0);
    int ok = 1;
    for (size_t b = 0; b < map.total; b += 97)
        for (size_t e = b; e <= map.total; e += 331)
            ok &= check_split(&map, b, e);
    CHECK(ok);

    int count;
    const int *list = zs_shardmap_server_shards(&map, 1, &count);
    CHECK_EQ_INT(count, 3);
    CHECK(list && list[0] == 1 && list[1] == 3 && list[2] == 5);
    CHECK(zs_shardmap_server_shards(&map, 2, &count) == NULL);
    CHECK_EQ_INT(count, 0);
    CHECK(zs_shardmap_server_shards(&map, -1, &count) == NULL);
    CHECK_EQ_INT(zs_shardmap_server_index(&map, 2), 1);
    CHECK_EQ_INT(zs_shardmap_server_index(&map, 0), -1);
    CHECK_EQ_INT(zs_shardmap_server_index(&map, 3), -1);
    zs_shardmap_free(&map);
}

/* The tiny model's layer ranges fetched over 1, 2 and 3 servers with shard sizes that cut
 * through tensors. */
static void test_tensors_over_servers(void)
{
    zs_model_config m = {
        .n_layer = 2, .n_head = 2, .n_embd = 32, .vocab_size = 256, .block_size = 32};
    zs_tensor_table tt;
    CHECK_OK(zs_tensors_gpt2(&m, &tt));
    const size_t shard_bytes[] = {1280 * 4, 3000 * 4 / 256 * 256, 4096};
    for (size_t b = 0; b < sizeof shard_bytes / sizeof *shard_bytes; b++) {
        for (int S = 1; S <= 3; S++) {
            zs_shardmap map;
            CHECK_OK(zs_shardmap_build(tt.total, shard_bytes[b], S, NULL, &map));
            if (map.n_shards == 0)
                continue;
            check_map(&map, tt.total, shard_bytes[b] / 4, S);
            int ok = 1, split_tensor = 0, multi_server = 0;
            for (int l = 0; l < tt.n_layers; l++)
                ok &= check_split(&map, tt.layer_begin[l], tt.layer_begin[l + 1]);
            for (int i = 0; i < tt.count; i++) {
                const zs_tensor *t = &tt.tensors[i];
                ok &= check_split(&map, t->offset, t->offset + t->numel);
                int np = zs_shardmap_count_pieces(&map, t->offset, t->offset + t->numel);
                split_tensor |= np > 1;
                zs_shard_piece p[64];
                int n = 0;
                if (np <= 64 &&
                    zs_shardmap_split(&map, t->offset, t->offset + t->numel, p, 64, &n) == ZS_OK)
                    for (int k = 1; k < n; k++)
                        multi_server |= p[k].server != p[0].server;
            }
            CHECK(ok);
            CHECK(split_tensor); /* the shard sizes do cut tensors */
            if (S > 1)
                CHECK(multi_server);
            zs_shardmap_free(&map);
        }
    }
    zs_tensors_free(&tt);
}

static void test_refusals_and_messages(void)
{
    zs_shardmap map;
    CHECK_FAILS_WITH(zs_shardmap_build(1000, 100, 1, NULL, &map),
                     "shard size 100 bytes is not a positive multiple of 256");
    CHECK_FAILS_WITH(zs_shardmap_build(1000, 0, 1, NULL, &map), "shard size 0 bytes");
    CHECK_FAILS_WITH(zs_shardmap_build(0, 256, 1, NULL, &map), "vector of 0 floats");
    CHECK_FAILS_WITH(zs_shardmap_build(1000, 256, 0, NULL, &map), "0 servers, expected 1..");
    CHECK_FAILS_WITH(zs_shardmap_build(1000, 4096, 2, NULL, &map),
                     "2 servers for 1 shard (1000 floats in shards of 4096 bytes): a server would "
                     "hold nothing; set cluster.shard_size to at most 1792 bytes");
    CHECK_OK(zs_shardmap_build(1000, 1792, 2, NULL, &map));
    CHECK_EQ_INT(map.n_shards, 3);
    zs_shardmap_free(&map);
    CHECK_FAILS_WITH(zs_shardmap_build(64, 256, 2, NULL, &map), "use fewer servers");
    CHECK_FAILS_WITH(zs_shardmap_build((size_t)1 << 30, 256, 1, NULL, &map),
                     "more than 1048576: raise cluster.shard_size");
    const uint32_t zero[] = {3, 0};
    CHECK_FAILS_WITH(zs_shardmap_build(1000, 256, 2, zero, &map), "server 1 has id 0");
    const uint32_t dup[] = {3, 5, 3};
    CHECK_FAILS_WITH(zs_shardmap_build(1000, 256, 3, dup, &map), "servers 0 and 2 both have id 3");
    CHECK(map.shards == NULL);

    /* To and from the message. */
    const uint32_t ids[] = {21, 22, 23};
    const char *eps[] = {"h1:1", "h2:2", "h3:3"};
    CHECK_OK(zs_shardmap_build(10000, 4096, 3, ids, &map));
    Zshard__ShardMap *sm;
    CHECK_OK(zs_shardmap_to_msg(&map, eps, &sm));
    CHECK_EQ_INT(sm->n_shards, 10);
    CHECK_EQ_INT(sm->shards[4]->server, 22);
    CHECK_EQ_INT(sm->shards[9]->end, 10000);
    zs_shardmap back;
    CHECK_OK(zs_shardmap_from_msg(sm, &back));
    check_map(&back, 10000, 1024, 3);
    CHECK_EQ_INT(back.server_ids[1], 22);
    zs_shardmap_free(&back);
    zshard__shard_map__free_unpacked(sm, NULL);
    eps[1] = "nowhere";
    CHECK_FAILS_WITH(zs_shardmap_to_msg(&map, eps, &sm),
                     "building a shard map: ShardMap.servers[1].endpoint: \"nowhere\"");
    zs_shardmap_free(&map);
}

/* Replicas: a ring over the servers, none for one server; carried by the message, and a
 * message naming a replica that is no other server of the map, or a holder of two, refused. */
static void test_replicas(void)
{
    zs_shardmap map;
    CHECK_OK(zs_shardmap_build(10 * 64, 256, 3, NULL, &map));
    for (int s = 0; s < 3; s++)
        CHECK_EQ_INT(zs_shardmap_replica(&map, s), -1);
    zs_shardmap_set_replicas(&map, 1);
    for (int s = 0; s < 3; s++)
        CHECK_EQ_INT(zs_shardmap_replica(&map, s), (s + 1) % 3);
    CHECK_EQ_INT(zs_shardmap_replica(&map, 3), -1);
    const char *eps[3] = {"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"};
    Zshard__ShardMap *sm = NULL;
    CHECK_OK(zs_shardmap_to_msg(&map, eps, &sm));
    zs_shardmap back;
    CHECK_OK(zs_shardmap_from_msg(sm, &back));
    for (int s = 0; s < 3; s++)
        CHECK_EQ_INT(zs_shardmap_replica(&back, s), (s + 1) % 3);
    zs_shardmap_free(&back);
    sm->servers[0]->replica = sm->servers[0]->id;
    CHECK_FAILS_WITH(zs_shardmap_from_msg(sm, &back), "is not another server of the map");
    sm->servers[0]->replica = 99;
    CHECK_FAILS_WITH(zs_shardmap_from_msg(sm, &back), "replica: 99 is not another server");
    sm->servers[0]->replica = sm->servers[2]->id; /* server 2 holds server 1's already */
    sm->servers[1]->replica = sm->servers[2]->id;
    CHECK_FAILS_WITH(zs_shardmap_from_msg(sm, &back), "holds a replica already");
    zshard__shard_map__free_unpacked(sm, NULL);
    zs_shardmap_free(&map);
    CHECK_OK(zs_shardmap_build(10 * 64, 256, 1, NULL, &map));
    zs_shardmap_set_replicas(&map, 1);
    CHECK_EQ_INT(zs_shardmap_replica(&map, 0), -1);
    zs_shardmap_free(&map);
}

int main(void)
{
    test_replicas();
    test_cut_and_balance();
    test_lookup_and_split();
    test_tensors_over_servers();
    test_refusals_and_messages();
    return zs_test_result("test_shardmap");
}
