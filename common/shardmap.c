/*
 * shardmap: cutting the flat vector into fixed shards and spreading them over the servers.
 *
 * The assignment is shard i -> server i mod S.  That is exactly what "each shard, in vector
 * order, to the server holding the fewest floats so far, ties to the lowest index" gives when
 * all shards but the last have the same size (the loads are then always k or k + 1 shards,
 * and the first server with k is i mod S; the last, shorter shard goes to the next in turn,
 * which is the least loaded), so the rule costs O(1) per shard.  tests/unit/test_shardmap.c
 * checks it against the greedy rule written out.
 */
#include "common/shardmap.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/tensors.h"

void zs_shardmap_free(zs_shardmap *map)
{
    free(map->shards);
    free(map->server_ids);
    free(map->server_floats);
    free(map->server_first);
    free(map->by_server);
    free(map->replica);
    memset(map, 0, sizeof *map);
}

zs_err zs_shardmap_assemble(size_t total, size_t shard_floats, int n_shards, int n_servers,
                            const uint32_t *ids, const int *assign, zs_shardmap *map)
{
    memset(map, 0, sizeof *map);
    if (shard_floats == 0 || n_shards < 1 || n_servers < 1 ||
        (size_t)n_shards != (total + shard_floats - 1) / shard_floats)
        return zs_error(ZS_ERR_INVALID,
                        "shard map: %d shards of %zu floats do not cut a vector of %zu "
                        "over %d servers",
                        n_shards, shard_floats, total, n_servers);
    for (int i = 0; i < n_shards; i++)
        if (assign[i] < 0 || assign[i] >= n_servers)
            return zs_error(ZS_ERR_INVALID, "shard map: shard %d on server index %d of %d", i,
                            assign[i], n_servers);
    map->total = total;
    map->shard_floats = shard_floats;
    map->n_shards = n_shards;
    map->n_servers = n_servers;
    map->shards = malloc((size_t)n_shards * sizeof *map->shards);
    map->server_ids = malloc((size_t)n_servers * sizeof *map->server_ids);
    map->server_floats = calloc((size_t)n_servers, sizeof *map->server_floats);
    map->server_first = calloc((size_t)n_servers + 1, sizeof *map->server_first);
    map->by_server = malloc((size_t)n_shards * sizeof *map->by_server);
    map->replica = malloc((size_t)n_servers * sizeof *map->replica);
    if (!map->shards || !map->server_ids || !map->server_floats || !map->server_first ||
        !map->by_server || !map->replica) {
        zs_shardmap_free(map);
        return zs_error(ZS_ERR_NOMEM, "shard map: out of memory for %d shards", n_shards);
    }
    for (int s = 0; s < n_servers; s++) {
        map->server_ids[s] = ids ? ids[s] : (uint32_t)s + 1;
        map->replica[s] = -1;
    }
    for (int i = 0; i < n_shards; i++) {
        size_t b = (size_t)i * shard_floats;
        size_t e = total - b < shard_floats ? total : b + shard_floats;
        map->shards[i] = (zs_shard){.begin = b, .end = e, .server = assign[i]};
        map->server_floats[assign[i]] += e - b;
        map->server_first[assign[i] + 1]++;
    }
    for (int s = 0; s < n_servers; s++)
        map->server_first[s + 1] += map->server_first[s];
    /* Counting sort by server; shard order within a server is kept. */
    int *fill = malloc((size_t)n_servers * sizeof *fill);
    if (!fill) {
        zs_shardmap_free(map);
        return zs_error(ZS_ERR_NOMEM, "shard map: out of memory for %d servers", n_servers);
    }
    memcpy(fill, map->server_first, (size_t)n_servers * sizeof *fill);
    for (int i = 0; i < n_shards; i++)
        map->by_server[fill[assign[i]]++] = i;
    free(fill);
    return ZS_OK;
}

zs_err zs_shardmap_build(size_t total, size_t shard_bytes, int n_servers,
                         const uint32_t *server_ids, zs_shardmap *map)
{
    memset(map, 0, sizeof *map);
    const size_t align_bytes = ZS_TENSOR_ALIGN * sizeof(float);
    if (shard_bytes == 0 || shard_bytes % align_bytes != 0)
        return zs_error(ZS_ERR_INVALID,
                        "shard map: shard size %zu bytes is not a positive "
                        "multiple of %zu (%d floats)",
                        shard_bytes, align_bytes, ZS_TENSOR_ALIGN);
    if (total == 0 || total > ZS_SHARDMAP_MAX_FLOATS)
        return zs_error(ZS_ERR_INVALID, "shard map: vector of %zu floats, expected 1..%" PRIu64,
                        total, ZS_SHARDMAP_MAX_FLOATS);
    size_t shard_floats = shard_bytes / sizeof(float);
    size_t n = total / shard_floats + (total % shard_floats != 0);
    if (n > ZS_SHARDMAP_MAX_SHARDS)
        return zs_error(ZS_ERR_INVALID,
                        "shard map: %zu floats in shards of %zu bytes make %zu "
                        "shards, more than %d: raise cluster.shard_size",
                        total, shard_bytes, n, ZS_SHARDMAP_MAX_SHARDS);
    if (n_servers < 1 || n_servers > ZS_SHARDMAP_MAX_SERVERS)
        return zs_error(ZS_ERR_INVALID, "shard map: %d servers, expected 1..%d", n_servers,
                        ZS_SHARDMAP_MAX_SERVERS);
    if ((size_t)n_servers > n) {
        /* The largest shard size that gives every server a shard, if there is one. */
        size_t fit = total * sizeof(float) / (size_t)n_servers / align_bytes * align_bytes;
        if (fit == 0)
            return zs_error(ZS_ERR_INVALID,
                            "shard map: %d servers for %zu shard%s: a vector of "
                            "%zu floats cannot give every server a shard of at least %d floats; "
                            "use fewer servers",
                            n_servers, n, n == 1 ? "" : "s", total, ZS_TENSOR_ALIGN);
        return zs_error(ZS_ERR_INVALID,
                        "shard map: %d servers for %zu shard%s (%zu floats in "
                        "shards of %zu bytes): a server would hold nothing; set "
                        "cluster.shard_size to at most %zu bytes or use fewer servers",
                        n_servers, n, n == 1 ? "" : "s", total, shard_bytes, fit);
    }
    if (server_ids) {
        for (int s = 0; s < n_servers; s++) {
            if (server_ids[s] == 0)
                return zs_error(ZS_ERR_INVALID,
                                "shard map: server %d has id 0, the "
                                "coordinator's",
                                s);
            for (int t = 0; t < s; t++)
                if (server_ids[t] == server_ids[s])
                    return zs_error(ZS_ERR_INVALID,
                                    "shard map: servers %d and %d both have id "
                                    "%" PRIu32,
                                    t, s, server_ids[s]);
        }
    }
    int *assign = malloc(n * sizeof *assign);
    if (!assign)
        return zs_error(ZS_ERR_NOMEM, "shard map: out of memory for %zu shards", n);
    for (size_t i = 0; i < n; i++)
        assign[i] = (int)(i % (size_t)n_servers);
    zs_err res =
        zs_shardmap_assemble(total, shard_floats, (int)n, n_servers, server_ids, assign, map);
    free(assign);
    return res;
}

void zs_shardmap_set_replicas(zs_shardmap *map, int replicas)
{
    for (int s = 0; s < map->n_servers; s++)
        map->replica[s] = replicas > 0 && map->n_servers > 1 ? (s + 1) % map->n_servers : -1;
}

int zs_shardmap_replica(const zs_shardmap *map, int s)
{
    return s >= 0 && s < map->n_servers && map->replica ? map->replica[s] : -1;
}

int zs_shardmap_shard_of(const zs_shardmap *map, size_t x)
{
    if (x >= map->total)
        return -1;
    return (int)(x / map->shard_floats);
}

int zs_shardmap_count_pieces(const zs_shardmap *map, size_t begin, size_t end)
{
    if (begin >= end || end > map->total)
        return 0;
    return (int)((end - 1) / map->shard_floats - begin / map->shard_floats + 1);
}

zs_err zs_shardmap_split(const zs_shardmap *map, size_t begin, size_t end, zs_shard_piece *pieces,
                         int max, int *n)
{
    *n = 0;
    if (begin > end || end > map->total)
        return zs_error(ZS_ERR_INVALID, "shard map: range [%zu, %zu) is not inside [0, %zu)", begin,
                        end, map->total);
    int need = zs_shardmap_count_pieces(map, begin, end);
    if (need > max)
        return zs_error(ZS_ERR_INVALID, "shard map: range [%zu, %zu) has %d pieces, room for %d",
                        begin, end, need, max);
    size_t x = begin;
    for (int k = 0; k < need; k++) {
        int i = (int)(x / map->shard_floats);
        const zs_shard *sh = &map->shards[i];
        size_t e = sh->end < end ? sh->end : end;
        pieces[k] = (zs_shard_piece){.shard = i, .server = sh->server, .begin = x, .end = e};
        x = e;
    }
    *n = need;
    return ZS_OK;
}

const int *zs_shardmap_server_shards(const zs_shardmap *map, int s, int *count)
{
    if (s < 0 || s >= map->n_servers) {
        *count = 0;
        return NULL;
    }
    *count = map->server_first[s + 1] - map->server_first[s];
    return map->by_server + map->server_first[s];
}

int zs_shardmap_server_index(const zs_shardmap *map, uint32_t id)
{
    for (int s = 0; s < map->n_servers; s++)
        if (map->server_ids[s] == id)
            return s;
    return -1;
}
