/*
 * zshard worker: a stateless worker of a distributed job.  See worker/worker.h.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "worker/worker.h"

static const char worker_usage[] =
    "usage: zshard worker --coord tcp://HOST:PORT [--data PATH] [--threads T] [--device DEV]\n"
    "                     [--gpudirect auto|on|off] [--stats FILE] [--secret FILE | --insecure]\n"
    "                     [--metrics HOST:PORT] [--log-level LEVEL]\n"
    "\n"
    "Runs a worker: joins the coordinator's job, computes the chunks it is assigned with\n"
    "parameters fetched layer by layer from the partition servers, and pushes the gradients\n"
    "back.  It keeps no model state, so it may join and leave while the job runs.\n"
    "\n"
    "  --coord tcp://HOST:PORT  the coordinator's control endpoint\n"
    "  --data PATH              a local copy of the job's data (default: the job's path);\n"
    "                           its fingerprint must match the job's\n"
    "  --threads T              kernel threads (default: all CPUs available)\n"
    "  --device DEV             where forward and backward run: cpu (default), cuda or\n"
    "                           cuda:N\n"
    "  --gpudirect MODE         on a GPU with the rdma transport, fetch into and push from\n"
    "                           device memory the NIC reaches (GPUDirect RDMA, docs/gpu.md):\n"
    "                           auto (default: where it can, else page-locked host memory,\n"
    "                           logging why), on (or fail, saying why) or off\n"
    "  --stats FILE             at the end, write where the time went as one JSON "
    "object\n" ZS_CLI_SECRET_USAGE ZS_CLI_METRICS_USAGE
    "  --log-level LEVEL        error, warn, info (default) or debug\n"
    "  -h, --help               this text\n";

static int write_stats(const char *path, const zs_worker_stats *s)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "zshard worker: --stats %s: %s\n", path, strerror(errno));
        return 1;
    }
    fprintf(f,
            "{\"chunks\": %ld, \"steps\": %ld, \"compute_s\": %.6f, \"fetch_wait_s\": %.6f, "
            "\"push_wait_s\": %.6f, \"step_wait_s\": %.6f, \"fetched_bytes\": %llu, "
            "\"pushed_bytes\": %llu, \"buffer_bytes\": %zu}\n",
            s->chunks, s->steps, s->compute_s, s->fetch_wait_s, s->push_wait_s, s->step_wait_s,
            (unsigned long long)s->fetched_bytes, (unsigned long long)s->pushed_bytes,
            s->buffer_bytes);
    if (fclose(f) != 0) {
        fprintf(stderr, "zshard worker: --stats %s: %s\n", path, strerror(errno));
        return 1;
    }
    return 0;
}

int zs_cmd_worker(int argc, char **argv)
{
    static const struct option opts[] = {{"coord", required_argument, NULL, 'c'},
                                         {"data", required_argument, NULL, 'd'},
                                         {"threads", required_argument, NULL, 't'},
                                         {"device", required_argument, NULL, 'D'},
                                         {"gpudirect", required_argument, NULL, 'G'},
                                         {"stats", required_argument, NULL, 's'},
                                         {"metrics", required_argument, NULL, 'M'},
                                         {"log-level", required_argument, NULL, 'L'},
                                         {"help", no_argument, NULL, 'h'},
                                         ZS_CLI_SECRET_OPTIONS,
                                         {NULL, 0, NULL, 0}};
    zs_worker_opts o = {.threads = zs_cli_cpus()};
    const char *stats_path = NULL, *metrics = NULL;
    zs_cli_secret_args sa = {0};
    int c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        if (zs_cli_secret_opt(c, &sa))
            continue;
        switch (c) {
        case 'c':
            o.coord = optarg;
            break;
        case 'd':
            o.data = optarg;
            break;
        case 's':
            stats_path = optarg;
            break;
        case 'M':
            metrics = optarg;
            break;
        case 'D':
            if (zs_device_parse(optarg, &o.device) != ZS_OK)
                return zs_cli_usage_error("worker", "--device: %s", zs_last_error());
            break;
        case 'G':
            if (zs_gpudirect_parse(optarg, &o.gpudirect) != ZS_OK)
                return zs_cli_usage_error("worker", "--gpudirect: %s", zs_last_error());
            break;
        case 't': {
            long t = zs_cli_int("worker", "--threads", optarg, 1, 1024);
            if (t < 0)
                return 2;
            o.threads = (int)t;
            break;
        }
        case 'L':
            if (zs_cli_log_level("worker", optarg))
                return 2;
            break;
        case 'h':
            fputs(worker_usage, stdout);
            return 0;
        case ':':
            return zs_cli_usage_error("worker", "%s needs a value", argv[optind - 1]);
        default:
            return zs_cli_usage_error("worker", "unknown option \"%s\"", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return zs_cli_usage_error("worker", "unexpected argument \"%s\"", argv[optind]);
    if (!o.coord)
        return zs_cli_usage_error("worker", "missing --coord");
    zs_secret secret;
    if (zs_cli_secret("worker", sa.path, sa.insecure, &secret))
        return 2;
    o.secret = &secret;
    zs_cli_metrics m;
    if (zs_cli_metrics_start("worker", "worker", metrics, &m)) {
        zs_secret_wipe(&secret);
        return 1;
    }
    o.prom = m.reg;
    zs_cli_catch_signals();
    zs_worker_stats st;
    zs_err e = zs_worker_run(&o, &zs_cli_stop, &st);
    zs_cli_metrics_stop(&m);
    zs_secret_wipe(&secret);
    int rc = 0;
    if (e != ZS_OK) {
        fprintf(stderr, "zshard worker: %s\n", zs_last_error());
        rc = 1;
    }
    if (stats_path && write_stats(stats_path, &st) != 0 && rc == 0)
        rc = 1;
    return rc;
}
