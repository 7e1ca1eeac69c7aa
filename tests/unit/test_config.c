/*
 * config: defaults, DeepSpeed keys, batch geometry, schedules, the checkpoint block, errors
 * that name the key, and the fingerprint of what decides the training bits.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/config.h"
#include "tests/unit/test.h"

static void test_full(void)
{
    const char *text =
        "{\"seed\": 7, \"train_batch_size\": 16, \"train_micro_batch_size_per_gpu\": 4,"
        " \"gradient_accumulation_steps\": 4,"
        " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"betas\": [0.8, 0.95],"
        "   \"eps\": 1e-6, \"weight_decay\": 0.1}},"
        " \"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": {\"warmup_min_lr\": 0,"
        "   \"warmup_max_lr\": 0.01, \"warmup_num_steps\": 10, \"total_num_steps\": 110,"
        "   \"warmup_type\": \"linear\"}},"
        " \"gradient_clipping\": 0.5, \"bf16\": {\"enabled\": true},"
        " \"fp16\": {\"enabled\": false},"
        " \"model\": {\"n_layer\": 2, \"n_head\": 4, \"n_embd\": 64, \"vocab_size\": 300,"
        "   \"block_size\": 32},"
        " \"cluster\": {\"shard_size\": 65536}}";
    zs_config c;
    CHECK_OK(zs_config_parse(text, "full", &c));
    CHECK_EQ_INT(c.seed, 7);
    CHECK_EQ_INT(c.train_batch_size, 16);
    CHECK_EQ_INT(c.micro_batch, 4);
    CHECK_EQ_INT(c.chunks, 4);
    CHECK_NEAR(c.adamw.lr, 0.01, 0);
    CHECK_NEAR(c.adamw.beta1, 0.8, 0);
    CHECK_NEAR(c.adamw.beta2, 0.95, 0);
    CHECK_NEAR(c.adamw.eps, 1e-6, 0);
    CHECK_NEAR(c.adamw.weight_decay, 0.1, 0);
    CHECK_EQ_INT(c.sched.type, ZS_SCHED_WARMUP_DECAY);
    CHECK_NEAR(c.gradient_clipping, 0.5, 0);
    CHECK_EQ_INT(c.bf16, 1);
    CHECK_EQ_INT(c.model.n_layer, 2);
    CHECK_EQ_INT(c.model.vocab_size, 300);
    CHECK_EQ_INT(c.cluster.shard_bytes, 65536);
    /* Linear warmup: step/10 of the max; then linear decay to 0 at step 110. */
    CHECK_NEAR(zs_config_lr(&c, 0), 0.0, 1e-15);
    CHECK_NEAR(zs_config_lr(&c, 5), 0.005, 1e-15);
    CHECK_NEAR(zs_config_lr(&c, 10), 0.01, 1e-15);
    CHECK_NEAR(zs_config_lr(&c, 60), 0.005, 1e-15);
    CHECK_NEAR(zs_config_lr(&c, 110), 0.0, 1e-15);
    CHECK_NEAR(zs_config_lr(&c, 200), 0.0, 1e-15);
}

static void test_defaults_and_geometry(void)
{
    zs_config c;
    CHECK_OK(zs_config_parse("{}", "empty", &c));
    CHECK_EQ_INT(c.micro_batch, 1);
    CHECK_EQ_INT(c.chunks, 1);
    CHECK_EQ_INT(c.train_batch_size, 1);
    CHECK_EQ_INT(c.sched.type, ZS_SCHED_CONSTANT);
    CHECK_NEAR(zs_config_lr(&c, 123), c.adamw.lr, 0);
    CHECK_EQ_INT(c.cluster.shard_bytes, 4 << 20);
    CHECK_OK(
        zs_config_parse("{\"train_batch_size\": 12, \"gradient_accumulation_steps\": 3}", "s", &c));
    CHECK_EQ_INT(c.micro_batch, 4);
    CHECK_EQ_INT(c.chunks, 3);
    CHECK_OK(zs_config_parse("{\"train_micro_batch_size_per_gpu\": 2, "
                             "\"gradient_accumulation_steps\": 5}",
                             "s", &c));
    CHECK_EQ_INT(c.train_batch_size, 10);
    CHECK_EQ_INT(c.chunks, 5);
    CHECK_OK(zs_config_parse("{\"train_batch_size\": 8}", "s", &c));
    CHECK_EQ_INT(c.micro_batch, 8);
    CHECK_EQ_INT(c.chunks, 1);
}

static void test_schedules(void)
{
    zs_config c;
    /* WarmupLR, log warmup (DeepSpeed's default): min + (max-min) * log(s+1)/log(n). */
    CHECK_OK(zs_config_parse("{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": "
                             "{\"warmup_min_lr\": 0.0, \"warmup_max_lr\": 0.002, "
                             "\"warmup_num_steps\": 100}}}",
                             "s", &c));
    CHECK_NEAR(zs_config_lr(&c, 0), 0.0, 1e-15);
    CHECK_NEAR(zs_config_lr(&c, 9), 0.002 * log(10.0) / log(100.0), 1e-15);
    CHECK_NEAR(zs_config_lr(&c, 100), 0.002, 1e-15);
    CHECK_NEAR(zs_config_lr(&c, 5000), 0.002, 1e-15);
    /* WarmupCosineLR: ratio of optimizer lr; cosine from 1 down to cos_min_ratio. */
    CHECK_OK(zs_config_parse("{\"optimizer\": {\"params\": {\"lr\": 0.1}}, \"scheduler\": "
                             "{\"type\": \"WarmupCosineLR\", \"params\": {\"total_num_steps\": "
                             "110, \"warmup_num_steps\": 10, \"warmup_type\": \"linear\", "
                             "\"cos_min_ratio\": 0.0}}}",
                             "s", &c));
    CHECK_NEAR(zs_config_lr(&c, 5), 0.05, 1e-15);
    CHECK_NEAR(zs_config_lr(&c, 59), 0.1 * 0.5, 1e-12);
    CHECK_NEAR(zs_config_lr(&c, 109), 0.0, 1e-15);
}

static void test_errors(void)
{
    zs_config c;
    CHECK_FAILS_WITH(zs_config_parse("{\"train_batch_sise\": 4}", "cfg.json", &c),
                     "unknown key \"train_batch_sise\"");
    CHECK_FAILS_WITH(
        zs_config_parse("{\"optimizer\": {\"params\": {\"betaz\": 1}}}", "cfg.json", &c),
        "unknown key \"optimizer.params.betaz\"");
    CHECK_FAILS_WITH(zs_config_parse("{\"model\": {\"n_layer\": \"six\"}}", "cfg.json", &c),
                     "\"model.n_layer\": expected an integer, got a string");
    CHECK_FAILS_WITH(zs_config_parse("{\"model\": {\"n_layer\": 2.5}}", "cfg.json", &c),
                     "model.n_layer");
    CHECK_FAILS_WITH(zs_config_parse("{\"gradient_clipping\": true}", "cfg.json", &c),
                     "\"gradient_clipping\": expected a number, got a boolean");
    CHECK_FAILS_WITH(zs_config_parse("{\"model\": 3}", "cfg.json", &c),
                     "\"model\": expected an object");
    CHECK_FAILS_WITH(
        zs_config_parse("{\"cluster\": {\"max_members_per_address\": 0}}", "cfg.json", &c),
        "cluster.max_members_per_address");
    CHECK_OK(zs_config_parse("{\"cluster\": {\"max_members_per_address\": 8}}", "cfg.json", &c));
    CHECK_EQ_INT(c.cluster.max_members_per_address, 8);
    /* cluster.transport and cluster.rdma (docs/transport.md). */
    CHECK_OK(zs_config_parse("{}", "cfg.json", &c));
    CHECK_EQ_INT(c.cluster.transport, ZS_TRANSPORT_AUTO);
    CHECK_EQ_INT(c.cluster.rdma_gid_index, -1);
    CHECK_OK(zs_config_parse("{\"cluster\": {\"transport\": \"rdma\", \"rdma\": {\"device\": "
                             "\"mlx5_0\", \"port\": 2, \"gid_index\": 3}}}",
                             "cfg.json", &c));
    CHECK_EQ_INT(c.cluster.transport, ZS_TRANSPORT_RDMA);
    CHECK(strcmp(c.cluster.rdma_device, "mlx5_0") == 0);
    CHECK_EQ_INT(c.cluster.rdma_port, 2);
    CHECK_EQ_INT(c.cluster.rdma_gid_index, 3);
    CHECK_OK(zs_config_parse("{\"cluster\": {\"transport\": \"tcp\"}}", "cfg.json", &c));
    CHECK_EQ_INT(c.cluster.transport, ZS_TRANSPORT_TCP);
    CHECK_FAILS_WITH(zs_config_parse("{\"cluster\": {\"transport\": \"udp\"}}", "cfg.json", &c),
                     "\"cluster.transport\": \"udp\" is not");
    CHECK_OK(zs_config_parse("{\"cluster\": {\"transport\": \"shm\"}}", "cfg.json", &c));
    CHECK_EQ_INT(c.cluster.transport, ZS_TRANSPORT_SHM);
    CHECK_FAILS_WITH(zs_config_parse("{\"cluster\": {\"rdma\": {\"port\": 0}}}", "cfg.json", &c),
                     "cluster.rdma.port");
    CHECK_FAILS_WITH(zs_config_parse("{\"cluster\": {\"rdma\": {\"gid\": 0}}}", "cfg.json", &c),
                     "unknown key \"cluster.rdma.gid\"");
    /* DeepSpeed's offload blocks, as its users write them. */
    CHECK_OK(zs_config_parse(
        "{\"zero_optimization\": {\"stage\": 3, \"overlap_comm\": true, "
        "\"stage3_max_live_parameters\": 1e9, \"offload_optimizer\": {\"device\": \"nvme\", "
        "\"nvme_path\": \"/local_nvme\", \"pin_memory\": true, \"buffer_count\": 4}}, "
        "\"aio\": {\"block_size\": 262144, \"queue_depth\": 16, \"thread_count\": 1}, "
        "\"cluster\": {\"server_memory_bytes\": 1000000000}}",
        "cfg.json", &c));
    CHECK_EQ_INT(c.zero.optimizer, ZS_OFFLOAD_NVME);
    CHECK(strcmp(c.zero.nvme_path, "/local_nvme") == 0);
    CHECK_EQ_INT((int)c.aio.block_size, 262144);
    CHECK_EQ_INT(c.aio.queue_depth, 16);
    CHECK(c.cluster.server_memory_bytes == 1000000000ull);
    CHECK_FAILS_WITH(zs_config_parse("{\"zero_optimization\": {\"offload_optimizer\": "
                                     "{\"device\": \"disk\"}}}",
                                     "cfg.json", &c),
                     "\"disk\"; expected \"none\", \"cpu\" or \"nvme\"");
    CHECK_FAILS_WITH(zs_config_parse("{\"zero_optimization\": {\"offload_optimizer\": "
                                     "{\"device\": \"nvme\"}}}",
                                     "cfg.json", &c),
                     "device \"nvme\" needs nvme_path");
    CHECK_FAILS_WITH(zs_config_parse("{\"zero_optimization\": {\"offload_optimizer\": "
                                     "{\"device\": \"nvme\", \"nvme_path\": \"nvme\"}}}",
                                     "cfg.json", &c),
                     "\"nvme\" is not an absolute path");
    CHECK_FAILS_WITH(zs_config_parse("{\"zero_optimization\": {\"offload_param\": "
                                     "{\"device\": \"nvme\", \"nvme_path\": \"/n\"}}}",
                                     "cfg.json", &c),
                     "needs offload_optimizer.device \"nvme\" too");
    CHECK_FAILS_WITH(zs_config_parse("{\"checkpoint\": {\"replicas\": 1}, \"zero_optimization\": "
                                     "{\"offload_optimizer\": {\"device\": \"nvme\", "
                                     "\"nvme_path\": \"/n\"}}}",
                                     "cfg.json", &c),
                     "\"checkpoint.replicas\": 1 with");
    CHECK_FAILS_WITH(zs_config_parse("{\"aio\": {\"block_size\": 1000}}", "cfg.json", &c),
                     "aio.block_size");
    CHECK_FAILS_WITH(
        zs_config_parse("{\"aio\": {\"block_size\": 8192, \"depth\": 2}}", "cfg.json", &c),
        "unknown key \"aio.depth\"");
    CHECK_FAILS_WITH(
        zs_config_parse("{\"model\": {\"n_embd\": 10, \"n_head\": 3}}", "cfg.json", &c),
        "not a multiple of model.n_head");
    CHECK_FAILS_WITH(zs_config_parse("{\"train_batch_size\": 10, "
                                     "\"train_micro_batch_size_per_gpu\": 4}",
                                     "cfg.json", &c),
                     "not a multiple of train_micro_batch_size_per_gpu");
    CHECK_FAILS_WITH(zs_config_parse("{\"train_batch_size\": 8, "
                                     "\"train_micro_batch_size_per_gpu\": 4, "
                                     "\"gradient_accumulation_steps\": 3}",
                                     "cfg.json", &c),
                     "gradient_accumulation_steps");
    CHECK_FAILS_WITH(zs_config_parse("{\"optimizer\": {\"type\": \"SGD\"}}", "cfg.json", &c),
                     "\"SGD\" is not supported");
    CHECK_FAILS_WITH(zs_config_parse("{\"scheduler\": {\"type\": \"OneCycle\"}}", "cfg.json", &c),
                     "\"OneCycle\" is not supported");
    CHECK_FAILS_WITH(
        zs_config_parse("{\"scheduler\": {\"type\": \"WarmupDecayLR\"}}", "cfg.json", &c),
        "total_num_steps\" is required");
    CHECK_FAILS_WITH(zs_config_parse("{\"fp16\": {\"enabled\": true}, \"bf16\": {\"enabled\": "
                                     "true}}",
                                     "cfg.json", &c),
                     "\"fp16.enabled\" and \"bf16.enabled\"");
    CHECK_FAILS_WITH(zs_config_parse("{\"fp16\": {\"loss_scale\": 3}}", "cfg.json", &c),
                     "key \"fp16.loss_scale\": 3 is not 0 or a power of two");
    CHECK_FAILS_WITH(zs_config_parse("{\"fp16\": {\"loss_scale\": -1}}", "cfg.json", &c),
                     "key \"fp16.loss_scale\": -1 is outside");
    CHECK_FAILS_WITH(zs_config_parse("{\"fp16\": {\"min_loss_scale\": 0}}", "cfg.json", &c),
                     "key \"fp16.min_loss_scale\": 0 is not a power of two");
    CHECK_FAILS_WITH(zs_config_parse("{\"fp16\": {\"initial_scale_power\": 65}}", "cfg.json", &c),
                     "key \"fp16.initial_scale_power\": 65 is outside [0, 64]");
    CHECK_FAILS_WITH(zs_config_parse("{\"fp16\": {\"loss_scale_window\": 0}}", "cfg.json", &c),
                     "key \"fp16.loss_scale_window\": 0 is outside");
    CHECK_FAILS_WITH(zs_config_parse("{\"fp16\": {\"hysteresis\": 0}}", "cfg.json", &c),
                     "key \"fp16.hysteresis\": 0 is outside");
    CHECK_FAILS_WITH(zs_config_parse("{\"fp16\": {\"consecutive_hysteresis\": 1}}", "cfg.json", &c),
                     "key \"fp16.consecutive_hysteresis\": expected true or false");
    CHECK_FAILS_WITH(zs_config_parse("{\"fp16\": {\"auto_cast\": true}}", "cfg.json", &c),
                     "unknown key \"fp16.auto_cast\"");
    CHECK_FAILS_WITH(zs_config_parse("{\"cluster\": {\"shard_size\": 1000}}", "cfg.json", &c),
                     "multiple of 256");
    CHECK_FAILS_WITH(zs_config_parse("{\"seed\": 1, \"seed\": 2}", "cfg.json", &c), "invalid JSON");
    CHECK_FAILS_WITH(zs_config_parse("{\"seed\": ", "cfg.json", &c), "cfg.json:1");
    CHECK_FAILS_WITH(zs_config_parse("[1, 2]", "cfg.json", &c), "must be a JSON object");
    CHECK_FAILS_WITH(
        zs_config_parse("{\"optimizer\": {\"params\": {\"betas\": [0.9]}}}", "cfg.json", &c),
        "optimizer.params.betas");
    CHECK_FAILS_WITH(zs_config_parse("{\"optimizer\": {\"params\": {\"lr\": -1}}}", "cfg.json", &c),
                     "optimizer.params.lr");
    CHECK_FAILS_WITH(zs_config_load("/nonexistent/zshard.json", &c), "/nonexistent/zshard.json");
}

static void test_checkpoint(void)
{
    zs_config c;
    CHECK_OK(zs_config_parse("{}", "empty", &c));
    CHECK(strcmp(c.checkpoint.dir, "") == 0);
    CHECK_EQ_INT(c.checkpoint.interval_steps, 0);
    CHECK_EQ_INT(c.checkpoint.keep, 2);
    CHECK_EQ_INT(c.checkpoint.replicas, 0);
    CHECK_OK(zs_config_parse("{\"checkpoint\": {\"dir\": \"/shared/ck\", \"interval_steps\": 50,"
                             " \"keep\": 3, \"replicas\": 0}}",
                             "ck", &c));
    CHECK(strcmp(c.checkpoint.dir, "/shared/ck") == 0);
    CHECK_EQ_INT(c.checkpoint.interval_steps, 50);
    CHECK_EQ_INT(c.checkpoint.keep, 3);
    CHECK_EQ_INT(c.checkpoint.replicas, 0);
    CHECK(zs_config_parse("{\"checkpoint\": {\"replicas\": 1}}", "cfg.json", &c) == ZS_OK);
    CHECK_EQ_INT(c.checkpoint.replicas, 1);
    /* Keys not given keep their defaults. */
    CHECK_OK(zs_config_parse("{\"checkpoint\": {\"keep\": 1}}", "ck", &c));
    CHECK_EQ_INT(c.checkpoint.keep, 1);
    CHECK_EQ_INT(c.checkpoint.interval_steps, 0);
    CHECK(strcmp(c.checkpoint.dir, "") == 0);
    CHECK_OK(zs_config_parse("{\"checkpoint\": {}}", "ck", &c));
    CHECK_EQ_INT(c.checkpoint.keep, 2);

    CHECK_FAILS_WITH(zs_config_parse("{\"checkpoint\": {\"intervall\": 5}}", "cfg.json", &c),
                     "cfg.json: unknown key \"checkpoint.intervall\"");
    CHECK_FAILS_WITH(zs_config_parse("{\"checkpoint\": 5}", "cfg.json", &c),
                     "\"checkpoint\": expected an object, got an integer");
    CHECK_FAILS_WITH(zs_config_parse("{\"checkpoint\": {\"dir\": 5}}", "cfg.json", &c),
                     "\"checkpoint.dir\": expected a string, got an integer");
    CHECK_FAILS_WITH(
        zs_config_parse("{\"checkpoint\": {\"interval_steps\": \"10\"}}", "cfg.json", &c),
        "\"checkpoint.interval_steps\": expected an integer, got a string");
    CHECK_FAILS_WITH(zs_config_parse("{\"checkpoint\": {\"keep\": 1.5}}", "cfg.json", &c),
                     "\"checkpoint.keep\": expected an integer, got a number");
    CHECK_FAILS_WITH(zs_config_parse("{\"checkpoint\": {\"replicas\": true}}", "cfg.json", &c),
                     "\"checkpoint.replicas\": expected an integer, got a boolean");
    CHECK_FAILS_WITH(zs_config_parse("{\"checkpoint\": {\"keep\": 0}}", "cfg.json", &c),
                     "\"checkpoint.keep\": 0 is outside [1, ");
    CHECK_FAILS_WITH(zs_config_parse("{\"checkpoint\": {\"replicas\": 2}}", "cfg.json", &c),
                     "\"checkpoint.replicas\": 2 is outside [0, 1]");
    CHECK_FAILS_WITH(zs_config_parse("{\"checkpoint\": {\"interval_steps\": -1}}", "cfg.json", &c),
                     "\"checkpoint.interval_steps\": -1 is outside [0, ");

    /* A dir of 4095 bytes fits the buffer with its terminator; 4096 does not. */
    size_t n = sizeof c.checkpoint.dir;
    char *text = malloc(n + 64);
    CHECK(text != NULL);
    if (!text)
        return;
    int pre = snprintf(text, n + 64, "{\"checkpoint\": {\"dir\": \"");
    memset(text + pre, 'd', n - 1);
    strcpy(text + pre + n - 1, "\"}}");
    CHECK_OK(zs_config_parse(text, "long", &c));
    CHECK_EQ_INT(strlen(c.checkpoint.dir), n - 1);
    memset(text + pre, 'd', n);
    strcpy(text + pre + n, "\"}}");
    CHECK_FAILS_WITH(zs_config_parse(text, "long", &c),
                     "\"checkpoint.dir\": a path of 4096 bytes is longer than the 4095");
    free(text);
}

/* The fingerprint of the config text, or 0 (and a failed check) when it does not parse. */
static uint64_t fingerprint(const char *text)
{
    zs_config c;
    zs_err res = zs_config_parse(text, "fp", &c);
    CHECK_OK(res);
    return res == ZS_OK ? zs_config_fingerprint(&c) : 0;
}

static void test_fingerprint(void)
{
    const char *base =
        "{\"seed\": 7, \"train_batch_size\": 8, \"model\": {\"n_layer\": 2,"
        " \"n_head\": 2, \"n_embd\": 32}, \"optimizer\": {\"params\": {\"lr\": 0.01}}}";
    uint64_t fb = fingerprint(base);
    CHECK(fb != 0);
    CHECK(fingerprint(base) == fb); /* a pure function of the values */
    zs_config d;
    zs_config_defaults(&d);
    CHECK(zs_config_fingerprint(&d) != fb);

    /* What may change at a resume leaves it alone. */
    static const char *const same[] = {
        "{\"seed\": 7, \"train_batch_size\": 8, \"model\": {\"n_layer\": 2, \"n_head\": 2,"
        " \"n_embd\": 32}, \"optimizer\": {\"params\": {\"lr\": 0.01}},"
        " \"cluster\": {\"heartbeat_interval_ms\": 100, \"heartbeat_timeout_ms\": 300},"
        " \"elasticity\": {\"enabled\": true, \"min_workers\": 2, \"max_workers\": 4},"
        " \"checkpoint\": {\"dir\": \"/x\", \"interval_steps\": 5, \"keep\": 9, \"replicas\": 0},"
        " \"steps_per_print\": 10, \"wall_clock_breakdown\": true}",
        /* The same values spelled otherwise: key order, 8 as 8.0, the default lr's peers. */
        "{\"optimizer\": {\"params\": {\"lr\": 1e-2, \"eps\": 1e-8}}, \"model\": {\"n_embd\": 32,"
        " \"n_head\": 2, \"n_layer\": 2}, \"train_batch_size\": 8.0, \"seed\": 7}",
    };
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++)
        CHECK(fingerprint(same[i]) == fb);

    /* What decides the bits changes it. */
    static const char *const differ[] = {
        /* lr */
        "{\"seed\": 7, \"train_batch_size\": 8, \"model\": {\"n_layer\": 2, \"n_head\": 2,"
        " \"n_embd\": 32}, \"optimizer\": {\"params\": {\"lr\": 0.010000000000000002}}}",
        /* seed */
        "{\"seed\": 8, \"train_batch_size\": 8, \"model\": {\"n_layer\": 2, \"n_head\": 2,"
        " \"n_embd\": 32}, \"optimizer\": {\"params\": {\"lr\": 0.01}}}",
        /* n_layer */
        "{\"seed\": 7, \"train_batch_size\": 8, \"model\": {\"n_layer\": 3, \"n_head\": 2,"
        " \"n_embd\": 32}, \"optimizer\": {\"params\": {\"lr\": 0.01}}}",
        /* the same batch cut into other chunks */
        "{\"seed\": 7, \"train_batch_size\": 8, \"gradient_accumulation_steps\": 2,"
        " \"model\": {\"n_layer\": 2, \"n_head\": 2, \"n_embd\": 32},"
        " \"optimizer\": {\"params\": {\"lr\": 0.01}}}",
        /* the schedule */
        "{\"seed\": 7, \"train_batch_size\": 8, \"model\": {\"n_layer\": 2, \"n_head\": 2,"
        " \"n_embd\": 32}, \"optimizer\": {\"params\": {\"lr\": 0.01}},"
        " \"scheduler\": {\"type\": \"WarmupLR\"}}",
        /* clipping, bf16 */
        "{\"seed\": 7, \"train_batch_size\": 8, \"model\": {\"n_layer\": 2, \"n_head\": 2,"
        " \"n_embd\": 32}, \"optimizer\": {\"params\": {\"lr\": 0.01}},"
        " \"gradient_clipping\": 0.5}",
        "{\"seed\": 7, \"train_batch_size\": 8, \"model\": {\"n_layer\": 2, \"n_head\": 2,"
        " \"n_embd\": 32}, \"optimizer\": {\"params\": {\"lr\": 0.01}}, \"bf16\": {\"enabled\": "
        "true}}",
        /* fp16, and each of its keys */
        "{\"seed\": 7, \"train_batch_size\": 8, \"model\": {\"n_layer\": 2, \"n_head\": 2,"
        " \"n_embd\": 32}, \"optimizer\": {\"params\": {\"lr\": 0.01}}, \"fp16\": {\"enabled\": "
        "true}}",
        "{\"seed\": 7, \"train_batch_size\": 8, \"model\": {\"n_layer\": 2, \"n_head\": 2,"
        " \"n_embd\": 32}, \"optimizer\": {\"params\": {\"lr\": 0.01}}, \"fp16\": {\"enabled\": "
        "true, \"hysteresis\": 1}}",
        /* the shard size decides how the gradient norm is summed */
        "{\"seed\": 7, \"train_batch_size\": 8, \"model\": {\"n_layer\": 2, \"n_head\": 2,"
        " \"n_embd\": 32}, \"optimizer\": {\"params\": {\"lr\": 0.01}},"
        " \"cluster\": {\"shard_size\": 65536}}",
    };
    for (size_t i = 0; i < sizeof differ / sizeof differ[0]; i++) {
        uint64_t f = fingerprint(differ[i]);
        if (f == fb)
            fprintf(stderr, "fingerprint: case %zu equals the base's %016llx\n", i,
                    (unsigned long long)fb);
        CHECK(f != fb);
    }
}

/* DeepSpeed's defaults, every key read, and an fp16 job without fp16 keys fingerprints as
 * before (checkpoints of earlier non-fp16 jobs still resume). */
static void test_fp16(void)
{
    zs_config c;
    CHECK_OK(zs_config_parse("{\"fp16\": {\"enabled\": true}}", "cfg.json", &c));
    CHECK_EQ_INT(c.fp16.enabled, 1);
    CHECK(c.fp16.loss_scale == 0);
    CHECK_EQ_INT(c.fp16.initial_scale_power, 16);
    CHECK_EQ_INT(c.fp16.loss_scale_window, 1000);
    CHECK_EQ_INT(c.fp16.hysteresis, 2);
    CHECK(c.fp16.min_loss_scale == 1);
    CHECK_EQ_INT(c.fp16.consecutive_hysteresis, 0);
    CHECK_OK(zs_config_parse("{\"fp16\": {\"enabled\": true, \"loss_scale\": 128, "
                             "\"initial_scale_power\": 30, \"loss_scale_window\": 7, "
                             "\"hysteresis\": 3, \"min_loss_scale\": 0.25, "
                             "\"consecutive_hysteresis\": true}}",
                             "cfg.json", &c));
    CHECK(c.fp16.loss_scale == 128);
    CHECK_EQ_INT(c.fp16.initial_scale_power, 30);
    CHECK_EQ_INT(c.fp16.loss_scale_window, 7);
    CHECK_EQ_INT(c.fp16.hysteresis, 3);
    CHECK(c.fp16.min_loss_scale == 0.25);
    CHECK_EQ_INT(c.fp16.consecutive_hysteresis, 1);
    zs_config a, b;
    CHECK_OK(zs_config_parse("{\"seed\": 3}", "cfg.json", &a));
    CHECK_OK(zs_config_parse("{\"seed\": 3, \"fp16\": {\"enabled\": false, \"hysteresis\": 5}}",
                             "cfg.json", &b));
    CHECK(zs_config_fingerprint(&a) == zs_config_fingerprint(&b));
}

static void test_hf_roundtrip(void)
{
    char dir[] = "/tmp/zs_test_config_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[256];
    snprintf(path, sizeof path, "%s/config.json", dir);
    zs_model_config m = {
        .n_layer = 3, .n_head = 2, .n_embd = 32, .vocab_size = 77, .block_size = 40};
    CHECK_OK(zs_config_write_hf(&m, path));
    zs_model_config r;
    CHECK_OK(zs_config_read_hf(path, &r));
    CHECK_EQ_INT(r.n_layer, 3);
    CHECK_EQ_INT(r.n_head, 2);
    CHECK_EQ_INT(r.n_embd, 32);
    CHECK_EQ_INT(r.vocab_size, 77);
    CHECK_EQ_INT(r.block_size, 40);
    FILE *f = fopen(path, "w");
    fputs("{\"n_layer\": 2, \"n_head\": 2, \"n_embd\": 8, \"vocab_size\": 5}", f);
    fclose(f);
    CHECK_FAILS_WITH(zs_config_read_hf(path, &r), "\"n_positions\" is missing");
    f = fopen(path, "w");
    fputs("{\"n_layer\": 2, \"n_head\": 2, \"n_embd\": 8, \"vocab_size\": 5, \"n_positions\": 4,"
          " \"activation_function\": \"relu\"}",
          f);
    fclose(f);
    CHECK_FAILS_WITH(zs_config_read_hf(path, &r), "relu");
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    test_full();
    test_defaults_and_geometry();
    test_schedules();
    test_errors();
    test_checkpoint();
    test_fingerprint();
    test_fp16();
    test_hf_roundtrip();
    return zs_test_result("test_config");
}
