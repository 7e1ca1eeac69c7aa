/*
 * shardmap_msg: a shard map (common/shardmap.h) as the control plane's ShardMap message and
 * back.  The coordinator builds the map and sends it; servers, workers and tools rebuild the
 * same map from the message, validated as every received message is (zs_msg_check_shard_map).
 */
#ifndef ZS_SHARDMAP_MSG_H
#define ZS_SHARDMAP_MSG_H

#include "common/err.h"
#include "common/shardmap.h"
#include "proto/messages.h"

/*
 * The ShardMap message of map (*out; free with zshard__shard_map__free_unpacked(*out, NULL)),
 * with endpoints[s] the data-plane HOST:PORT of server s.  Validated as a receiver would.
 */
zs_err zs_shardmap_to_msg(const zs_shardmap *map, const char *const *endpoints,
                          Zshard__ShardMap **out);

/*
 * The map of a ShardMap message: validates it (zs_msg_check_shard_map), then takes its
 * boundaries and assignment as they are (the coordinator's word; no rebalancing).
 */
zs_err zs_shardmap_from_msg(const Zshard__ShardMap *m, zs_shardmap *map);

#endif
