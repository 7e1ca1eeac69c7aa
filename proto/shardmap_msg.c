/*
 * shardmap_msg: see shardmap_msg.h.
 */
#include "proto/shardmap_msg.h"

#include <stdlib.h>
#include <string.h>

zs_err zs_shardmap_to_msg(const zs_shardmap *map, const char *const *endpoints,
                          Zshard__ShardMap **out)
{
    *out = NULL;
    Zshard__ShardMap *m = malloc(sizeof *m);
    if (!m)
        return zs_error(ZS_ERR_NOMEM, "ShardMap: out of memory");
    zshard__shard_map__init(m);
    m->has_total_floats = 1;
    m->total_floats = map->total;
    m->has_shard_floats = 1;
    m->shard_floats = map->shard_floats;
    m->shards = calloc((size_t)map->n_shards, sizeof *m->shards);
    m->servers = calloc((size_t)map->n_servers, sizeof *m->servers);
    if (!m->shards || !m->servers)
        goto nomem;
    for (int i = 0; i < map->n_shards; i++) {
        Zshard__Shard *sh = malloc(sizeof *sh);
        if (!sh)
            goto nomem;
        zshard__shard__init(sh);
        m->shards[m->n_shards++] = sh;
        sh->has_index = sh->has_begin = sh->has_end = sh->has_server = 1;
        sh->index = (uint32_t)i;
        sh->begin = map->shards[i].begin;
        sh->end = map->shards[i].end;
        sh->server = map->server_ids[map->shards[i].server];
    }
    for (int s = 0; s < map->n_servers; s++) {
        Zshard__ServerInfo *si = malloc(sizeof *si);
        if (!si)
            goto nomem;
        zshard__server_info__init(si);
        m->servers[m->n_servers++] = si;
        si->has_id = 1;
        si->id = map->server_ids[s];
        si->endpoint = strdup(endpoints[s] ? endpoints[s] : "");
        if (!si->endpoint)
            goto nomem;
        int r = zs_shardmap_replica(map, s);
        if (r >= 0) {
            si->has_replica = 1;
            si->replica = map->server_ids[r];
        }
    }
    zs_err res = zs_msg_check_shard_map(m, NULL);
    if (res != ZS_OK) {
        zshard__shard_map__free_unpacked(m, NULL);
        return zs_error_context(ZS_ERR_INVALID, "building a shard map");
    }
    *out = m;
    return ZS_OK;
nomem:
    zshard__shard_map__free_unpacked(m, NULL);
    return zs_error(ZS_ERR_NOMEM, "ShardMap: out of memory for %d shards", map->n_shards);
}

typedef struct {
    uint32_t id;
    int index;
} id_slot;

static int cmp_slot(const void *a, const void *b)
{
    const id_slot *x = a, *y = b;
    return x->id < y->id ? -1 : x->id > y->id;
}

zs_err zs_shardmap_from_msg(const Zshard__ShardMap *m, zs_shardmap *map)
{
    memset(map, 0, sizeof *map);
    ZS_CHECK(zs_msg_check_shard_map(m, NULL));
    int n = (int)m->n_shards, S = (int)m->n_servers;
    zs_err res = ZS_OK;
    uint32_t *ids = malloc((size_t)S * sizeof *ids);
    id_slot *slots = malloc((size_t)S * sizeof *slots);
    int *assign = malloc((size_t)n * sizeof *assign);
    if (!ids || !slots || !assign) {
        res = zs_error(ZS_ERR_NOMEM, "shard map: out of memory for %d shards", n);
        goto out;
    }
    for (int s = 0; s < S; s++) {
        ids[s] = m->servers[s]->id;
        slots[s] = (id_slot){ids[s], s};
    }
    qsort(slots, (size_t)S, sizeof *slots, cmp_slot);
    for (int i = 0; i < n; i++) {
        id_slot key = {m->shards[i]->server, 0};
        /* Present and unique: zs_msg_check_shard_map said so. */
        const id_slot *hit = bsearch(&key, slots, (size_t)S, sizeof *slots, cmp_slot);
        assign[i] = hit->index;
    }
    res = zs_shardmap_assemble((size_t)m->total_floats, (size_t)m->shard_floats, n, S, ids, assign,
                               map);
    for (int s = 0; res == ZS_OK && s < S; s++) {
        if (!m->servers[s]->has_replica)
            continue;
        id_slot key = {m->servers[s]->replica, 0};
        const id_slot *hit = bsearch(&key, slots, (size_t)S, sizeof *slots, cmp_slot);
        map->replica[s] = hit->index;
    }
out:
    free(assign);
    free(slots);
    free(ids);
    return res;
}
