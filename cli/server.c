/*
 * zshard server: a partition server.  See server/server.h.
 */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "server/server.h"

static const char server_usage[] =
    "usage: zshard server --coord tcp://HOST:PORT --listen HOST:PORT [--init DIR]\n"
    "                     [--secret FILE | --insecure] [--threads T] [--log-level LEVEL]\n"
    "                     [--transport tcp|rdma|shm|auto] [--rdma-device DEV] [--rdma-port P]\n"
    "                     [--rdma-gid-index G] [--metrics HOST:PORT]\n"
    "\n"
    "Runs a partition server: holds shards of the training state, applies AdamW, serves\n"
    "fetches and pushes on the data plane.\n"
    "\n"
    "  --coord tcp://HOST:PORT  the coordinator's control endpoint\n"
    "  --listen HOST:PORT       data-plane address (port 0: any free port; HOST * for all,\n"
    "                           announced as this host's address towards the coordinator)\n"
    "  --init DIR               initialize from DIR/model.safetensors instead of the seed\n"
    "  --threads T              AdamW threads (default: all CPUs available)\n" ZS_CLI_SECRET_USAGE
        ZS_CLI_METRICS_USAGE "  --log-level LEVEL        error, warn, info (default) or debug\n"
    "  --transport KIND         the data plane's backend: tcp, rdma, shm (workers on this\n"
    "                           host only), or auto (default: rdma\n"
    "                           where this host has an RDMA device with an active port);\n"
    "                           the coordinator refuses one that cluster.transport does not name\n"
    "  --rdma-device DEV        the RDMA device (default: the one holding the --listen\n"
    "                           address, else the first active one); --rdma-port P (1),\n"
    "                           --rdma-gid-index G (default: the GID of the address in use)\n"
    "  -h, --help               this text\n";

int zs_cmd_server(int argc, char **argv)
{
    static const struct option opts[] = {{"coord", required_argument, NULL, 'c'},
                                         {"listen", required_argument, NULL, 'l'},
                                         {"init", required_argument, NULL, 'i'},
                                         {"threads", required_argument, NULL, 't'},
                                         {"log-level", required_argument, NULL, 'L'},
                                         {"transport", required_argument, NULL, 'T'},
                                         {"rdma-device", required_argument, NULL, 'D'},
                                         {"rdma-port", required_argument, NULL, 'P'},
                                         {"rdma-gid-index", required_argument, NULL, 'G'},
                                         {"metrics", required_argument, NULL, 'M'},
                                         ZS_CLI_SECRET_OPTIONS,
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    zs_server_opts o = {.threads = zs_cli_cpus()};
    const char *metrics = NULL;
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
        case 'l':
            o.listen = optarg;
            break;
        case 'i':
            o.init_dir = optarg;
            break;
        case 't': {
            long t = zs_cli_int("server", "--threads", optarg, 1, 1024);
            if (t < 0)
                return 2;
            o.threads = (int)t;
            break;
        }
        case 'L':
            if (zs_cli_log_level("server", optarg))
                return 2;
            break;
        case 'T':
            if (strcmp(optarg, "tcp") && strcmp(optarg, "rdma") && strcmp(optarg, "shm") &&
                strcmp(optarg, "auto"))
                return zs_cli_usage_error(
                    "server", "--transport: \"%s\" is not tcp, rdma, shm or auto", optarg);
            o.transport = optarg;
            break;
        case 'D':
            o.rdma_device = optarg;
            break;
        case 'M':
            metrics = optarg;
            break;
        case 'P': {
            long p = zs_cli_int("server", "--rdma-port", optarg, 1, 255);
            if (p < 0)
                return 2;
            o.rdma_port = (int)p;
            break;
        }
        case 'G': {
            long g = zs_cli_int("server", "--rdma-gid-index", optarg, 0, 65536);
            if (g < 0)
                return 2;
            o.rdma_gid_set = 1;
            o.rdma_gid_index = (int)g;
            break;
        }
        case 'h':
            fputs(server_usage, stdout);
            return 0;
        case ':':
            return zs_cli_usage_error("server", "%s needs a value", argv[optind - 1]);
        default:
            return zs_cli_usage_error("server", "unknown option \"%s\"", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return zs_cli_usage_error("server", "unexpected argument \"%s\"", argv[optind]);
    if (!o.coord || !o.listen)
        return zs_cli_usage_error("server", "missing %s", !o.coord ? "--coord" : "--listen");
    zs_secret secret;
    if (zs_cli_secret("server", sa.path, sa.insecure, &secret))
        return 2;
    o.secret = &secret;
    zs_cli_metrics m;
    if (zs_cli_metrics_start("server", "server", metrics, &m)) {
        zs_secret_wipe(&secret);
        return 1;
    }
    o.prom = m.reg;
    zs_cli_catch_signals();
    zs_err e = zs_server_run(&o, &zs_cli_stop);
    zs_cli_metrics_stop(&m);
    zs_secret_wipe(&secret);
    if (e != ZS_OK) {
        fprintf(stderr, "zshard server: %s\n", zs_last_error());
        return 1;
    }
    return 0;
}
